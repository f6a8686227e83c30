"""``export --format perfetto``: the file read back with the perfetto package's protos (tests/_perfetto_read.py)
and compared with the raw trace (JSON decoded as exact decimals, SQL on the export) to the nanosecond, and with the
summary's results for the analysis tracks."""

from __future__ import annotations

import gzip
import json
import sqlite3
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from _perfetto_read import ReadTrace, read
from click.testing import CliRunner

import traceanalyzer as ta
from traceanalyzer.cli import cli
from traceanalyzer.commands.export import PerfettoResult
from traceanalyzer.render import perfetto as pf
from traceanalyzer.testing.synth_nsys import write_nsys_export

pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

ROOT = Path(__file__).resolve().parents[1]
KINETO = ROOT / "fixtures" / "kineto" / "tp2_prefill_serial"  # the quick start: real 2×H200 Kineto traces
NSYS = ROOT / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"  # the same workload, both ranks in one export


def _group(r: ReadTrace, rank: int, gpu: int) -> int:
    found = [t.uuid for t in r.tracks.values() if t.parent is None and t.name.startswith(f"rank {rank} · GPU {gpu}")]
    assert len(found) == 1
    return found[0]


def _stream_slices(r: ReadTrace, group: int) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    for t in r.children(group):
        if t.name.startswith("stream "):
            stream = int(t.name.split()[1])
            out.setdefault(stream, []).extend((s.start_ns, s.end_ns) for s in t.slices)
    return {k: sorted(v) for k, v in out.items()}


def _raw_kineto(path: Path) -> dict[int, list[tuple[int, int]]]:
    """GPU activity per stream (tid) of a Kineto file: kernels and memcpy/memset, ts and dur as written (µs with
    ns decimals), as exact ns."""
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    out: dict[int, list[tuple[int, int]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            start = Decimal(e["ts"]) * 1000
            out.setdefault(int(e["tid"]), []).append((int(start), int(start + Decimal(e["dur"]) * 1000)))
    return {k: sorted(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def kineto_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[PerfettoResult, ReadTrace]:
    if not KINETO.is_dir():
        pytest.skip("fixtures/kineto/tp2_prefill_serial is absent")
    out = tmp_path_factory.mktemp("pf") / "analysis.pftrace"
    result = ta.export([KINETO], out, format="perfetto")
    assert isinstance(result, PerfettoResult)
    return result, read(out)


def test_kineto_streams_equal_the_raw_json_to_the_ns(kineto_export: tuple[PerfettoResult, ReadTrace]):
    _, r = kineto_export
    assert r.errors == []
    for rank in (0, 1):
        raw = _raw_kineto(KINETO / f"rank{rank}.json.gz")
        # the raw file: 684 kernels + 168 memcpy/memset on stream 7 per rank (counted from the JSON above)
        assert sum(len(v) for v in raw.values()) == 852
        assert _stream_slices(r, _group(r, rank, rank)) == raw


def test_analysis_tracks_are_the_summary(kineto_export: tuple[PerfettoResult, ReadTrace]):
    result, r = kineto_export
    s = result.summary
    assert s is not None and s.cross_rank is not None
    for d in s.devices:
        g = _group(r, d.rank, d.device)
        steps = r.slices(g, pf.STEPS)
        assert [(x.start_ns, x.end_ns) for x in steps] == \
            list(zip(d.per_step["start_ns"].tolist(), d.per_step["end_ns"].tolist(), strict=True))
        assert len(steps) == 3  # ProfilerStep#2..#4 in the JSON
        layers = r.slices(g, pf.LAYERS)
        assert len(layers) == 12 and {x.name for x in layers} == {"layer_0", "layer_1", "layer_2", "layer_3"}
        gaps = d.comm_idle_gaps_ns
        exposed = r.slices(g, pf.EXPOSED)
        assert [(x.start_ns, x.end_ns) for x in exposed] == \
            list(zip(gaps["start_ns"].tolist(), gaps["end_ns"].tolist(), strict=True))
        assert sum(x.end_ns - x.start_ns for x in exposed) == d.comm_exposed_ns
        # SM idle: the holes of the union of the device's kernels and copies, from the raw stream slices
        busy = sorted(iv for v in _stream_slices(r, g).values() for iv in v)
        holes, reach = [], busy[0][1]
        for a, b in busy[1:]:
            if a > reach:
                holes.append((reach, a))
            reach = max(reach, b)
        assert [(x.start_ns, x.end_ns) for x in r.slices(g, pf.SM_IDLE)] == holes
        assert sum(b - a for a, b in holes) == d.idle_ns
        coll = r.slices(g, pf.COLLECTIVES)
        parents = [x for x in coll if x.depth == 0]
        assert len(parents) == len(d.collectives) == 24  # 8 all-reduces × 3 steps
        for p in parents:
            inside = [x for x in coll if x.depth == 1 and p.start_ns <= x.start_ns and x.end_ns <= p.end_ns]
            assert sum(x.end_ns - x.start_ns for x in inside) == p.end_ns - p.start_ns  # wait + transfer tile it
            assert p.args["wait_ns"] + p.args["transfer_ns"] == p.end_ns - p.start_ns
        waits = sum(x.end_ns - x.start_ns for x in coll if x.name == pf.WAIT)
        assert waits == s.cross_rank.wait_ns_by_rank[d.rank]
        straggler = r.slices(g, pf.STRAGGLER)
        assert len(straggler) == (1 if d.rank == s.cross_rank.straggler_rank else 0)


def test_findings_carry_their_impact(kineto_export: tuple[PerfettoResult, ReadTrace]):
    result, r = kineto_export
    s = result.summary
    assert s is not None and s.findings
    drawn = [x for t in r.tracks.values() if t.name == pf.FINDINGS for x in t.slices]
    assert sorted(x.name for x in drawn) == sorted(f.title for f in s.findings)
    for f in s.findings:
        x = next(x for x in drawn if x.name == f.title)
        assert x.args["id"] == f.id and x.args["severity"] == f.severity
        assert x.args.get("impact_ns_per_step") == f.impact_ns_per_step


def test_host_annotation_ranges(kineto_export: tuple[PerfettoResult, ReadTrace]):
    _, r = kineto_export
    doc = json.loads(gzip.decompress((KINETO / "rank0.json.gz").read_bytes()), parse_float=Decimal)
    raw = sorted((int(Decimal(e["ts"]) * 1000), e["name"]) for e in doc["traceEvents"]
                 if e.get("ph") == "X" and e.get("cat") == "user_annotation")
    host = [t for t in r.tracks.values() if t.parent is None and t.name.startswith("rank 0 · host")]
    assert len(host) == 1
    drawn = sorted((x.start_ns, x.name) for t in r.children(host[0].uuid) for x in t.slices)
    assert drawn == raw  # ProfilerStep#N and the layer/attention/moe/allreduce annotations, as written


def test_nsys_kernels_equal_sql_to_the_ns(tmp_path: Path):
    if not NSYS.is_file():
        pytest.skip("fixtures/nsys/tp2_prefill_serial.sqlite is absent")
    out = tmp_path / "nsys.pftrace"
    ta.export(NSYS, out)  # .pftrace: Perfetto without naming the format
    r = read(out)
    assert r.errors == []
    with sqlite3.connect(f"file:{NSYS}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT deviceId, streamId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
        rows += db.execute("SELECT deviceId, streamId, start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
        rows += db.execute("SELECT deviceId, streamId, start, end FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchall()
    for gpu in (0, 1):
        want: dict[int, list[tuple[int, int]]] = {}
        for dev, stream, a, b in rows:
            if dev == gpu:
                want.setdefault(stream, []).append((a, b))
        groups = [t.uuid for t in r.tracks.values() if t.parent is None and f"GPU {gpu}" in t.name]
        assert len(groups) == 1
        assert _stream_slices(r, groups[0]) == {k: sorted(v) for k, v in want.items()}


def test_eight_ranks(tmp_path: Path):
    """An 8-rank export (synthetic, rank 5 late at every all-reduce by construction): 8 device groups with their
    analysis tracks, the straggler on rank 5."""
    ar = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    kernels, t = [], 1_000_000
    for _ in range(3):  # 3 passes of 4 layers: gemm, all-reduce; a host gap between passes
        for _layer in range(4):
            for rank in range(8):
                late = 20_000 if rank == 5 else 0
                kernels.append((t, t + 50_000 + late, rank, 7, "nvjet_gemm", 1000 + rank))
                kernels.append((t + 50_000 + late, t + 100_000, rank, 7, ar, 1000 + rank))
            t += 100_500
        t += 2_000_000
    path = write_nsys_export(tmp_path / "eight.sqlite", kernels, mpi_ranks={1000 + r: r for r in range(8)})
    out = tmp_path / "eight.pftrace"
    result = ta.export(path, out, format="perfetto")
    assert isinstance(result, PerfettoResult) and result.summary is not None
    r = read(out)
    assert r.errors == []
    assert result.summary.cross_rank is not None and result.summary.cross_rank.straggler_rank == 5
    for rank in range(8):
        g = _group(r, rank, rank)  # rank r drives GPU r
        assert len(r.slices(g, "stream 7")) == 24
        assert r.slices(g, pf.COLLECTIVES)
        assert len(r.slices(g, pf.STRAGGLER)) == (1 if rank == 5 else 0)
        waits = [x for x in r.slices(g, pf.COLLECTIVES) if x.name == pf.WAIT]
        if rank == 5:
            assert waits == []  # the last to arrive waits for no one
        else:
            assert waits and all(x.end_ns - x.start_ns == 20_000 for x in waits)
    # one flow per matched all-reduce (12: 3 passes × 4 layers) links the 8 ranks' slices of that instance
    flows: dict[int, list[int]] = {}
    for rank in range(8):
        for x in r.slices(_group(r, rank, rank), pf.COLLECTIVES):
            for f in x.flows:
                flows.setdefault(f, []).append(rank)
    assert result.summary.cross_rank.collectives_matched == 12
    assert len(flows) == 12 and all(sorted(v) == list(range(8)) for v in flows.values())


def test_lanes_nest_or_split():
    # [0,10) holds [2,5); [8,12) overlaps [0,10) without nesting: a second lane
    order, lane = pf.lanes(np.array([0, 2, 8]), np.array([10, 5, 12]))
    assert dict(zip(order.tolist(), lane.tolist(), strict=True)) == {0: 0, 1: 0, 2: 1}
    order, lane = pf.lanes(np.array([0, 10, 20]), np.array([10, 20, 30]))
    assert lane.tolist() == [0, 0, 0]


def test_cli(tmp_path: Path):
    if not KINETO.is_dir():
        pytest.skip("fixtures/kineto/tp2_prefill_serial is absent")
    runner = CliRunner()
    out = tmp_path / "cli.pftrace"
    res = runner.invoke(cli, ["export", str(KINETO / "rank0.json.gz"), "--format", "perfetto", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "Perfetto trace" in res.output and out.stat().st_size > 0
    from traceanalyzer.cli import main

    assert main(["export", str(KINETO / "rank0.json.gz"), "-o", str(out), "--append"]) == 2


def test_negative_timestamps_are_refused_and_nothing_written(tmp_path: Path):
    from traceanalyzer.model.errors import BadInputError
    from traceanalyzer.testing.synth import make_trace

    trace = make_trace(kernels=[(-5_000, -1_000, 0, 7, "gemm_a", "gemm"), (0, 4_000, 0, 7, "gemm_b", "gemm")])
    out = tmp_path / "neg.pftrace"
    with pytest.raises(BadInputError, match="before 0"):
        ta.export(trace, out, format="perfetto")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_trace_processor_sql(kineto_export: tuple[PerfettoResult, ReadTrace]):
    """Where a trace processor binary is installed (``TRACE_PROCESSOR_SHELL`` or ``trace_processor_shell`` on PATH;
    the perfetto package would download one, which a test never does): the steps and exposed communication by SQL."""
    import os
    import shutil

    binary = os.environ.get("TRACE_PROCESSOR_SHELL") or shutil.which("trace_processor_shell")
    if not binary:
        pytest.skip("no trace_processor_shell binary installed")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    result, _ = kineto_export
    s = result.summary
    assert s is not None
    d = next(d for d in s.devices if d.rank == 0)
    with TraceProcessor(trace=str(result.path), config=TraceProcessorConfig(bin_path=binary)) as tp:
        rows = tp.query("SELECT s.ts, s.dur, t.name AS track FROM slice s JOIN track t ON s.track_id = t.id "
                        "WHERE t.name IN ('steps', 'exposed communication (SM idle during collectives)') "
                        "ORDER BY s.ts").as_pandas_dataframe()
    steps = rows[rows["track"] == "steps"]
    assert len(steps) == 2 * len(d.per_step)  # both ranks' steps tracks
    assert set(d.per_step["start_ns"].tolist()) <= set(steps["ts"].tolist())
    exposed = rows[rows["track"] != "steps"]
    assert int(exposed["dur"].sum()) == sum(x.comm_exposed_ns for x in s.devices)


def test_gpu_metrics_as_counter_tracks(tmp_path: Path):
    """nsys GPU_METRICS samples become one counter track per metric under their GPU, values and times unchanged."""
    kernels = [(1_000, 9_000, 0, 7, "nvjet_gemm"), (11_000, 19_000, 0, 7, "nvjet_gemm")]
    metrics = [(t, 0, "SMs Active [Throughput %]", v) for t, v in ((2_000, 40.0), (12_000, 95.5), (22_000, 0.0))]
    metrics += [(t, 0, "DRAM Read Bandwidth [Throughput %]", 10.0) for t in (2_000, 12_000)]
    path = write_nsys_export(tmp_path / "metrics.sqlite", kernels, gpu_metrics=metrics)
    out = tmp_path / "metrics.pftrace"
    ta.export(path, out)
    r = read(out)
    assert r.errors == []
    counters = {t.name: t.samples for t in r.tracks.values() if t.counter}
    assert counters == {"GPU metric: SMs Active [Throughput %]": [(2_000, 40.0), (12_000, 95.5), (22_000, 0.0)],
                        "GPU metric: DRAM Read Bandwidth [Throughput %]": [(2_000, 10.0), (12_000, 10.0)]}
