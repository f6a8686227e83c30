"""The cross-rank critical path and the replay what-if (issue 31; docs/METHOD_WHATIF_SIM.md).

Hand-computed cases on synthetic two-rank traces; on every multi-rank trace of fixtures/ (and ../shared/data when
present): the unchanged replay gives back every traced step (within 2 %; it is exact by construction, so any
difference is a graph-ordering defect), and each step's critical path adds up to the step, by category, bucket,
rank and edge type. The validation against measured changes is tests/test_whatif_validation.py.
"""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

import traceanalyzer as ta
from traceanalyzer.analysis.what_if.replay import CATEGORIES
from traceanalyzer.cli import cli, main
from traceanalyzer.testing.synth import make_trace

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def _two_ranks(collective_bytes: int | None = None) -> list[ta.Trace]:
    """gemm_a → all-reduce → gemm_b on one stream per rank; rank 1's gemm_a is 50 ns longer, so rank 0's
    all-reduce waits for it: arrival 450, transfer 150 (rank 1's duration), both end at 600, steps end at 1000.
    With ``collective_bytes``, the all-reduce's host op (External id 7) says its size."""
    traces = []
    for rank, a_end in ((0, 400), (1, 450)):
        kernels = [(0, a_end, 0, 7, "gemm_a", "gemm", None, 1), (a_end, 600, 0, 7, NCCL, "communication",
                                                                "all_reduce", 2, 7),
                   (600, 1_000, 0, 7, "gemm_b", "gemm", None, 3)]
        sizes = [(7, "allreduce", collective_bytes, 0, 2)] if collective_bytes is not None else []
        t = make_trace(kernels, rank=rank, path=f"rank{rank}.json", collectives=sizes)
        traces.append(replace(t, base_time_ns=0, world_size=2))
    return traces


def test_comm_at_a_bandwidth_takes_bytes_times_the_bus_factor_over_it() -> None:
    """1 MB all-reduced by two ranks (bus factor 2(n−1)/n = 1) at 100 GB/s: 10 µs after the last arrival (450 ns)
    instead of 150 ns: the all-reduce ends at 10,450, gemm_b at 10,850 ns: +9,850 ns."""
    w = ta.whatif(_two_ranks(collective_bytes=1_000_000), comm="100GB/s")
    assert w.change_ns == 9_850 and w.changes == ["communication at 100 GB/s"]


def test_hand_computed_critical_path_crosses_to_the_rank_that_arrives_last() -> None:
    w = ta.whatif(_two_ranks())
    assert w.no_change_error_pct == 0.0
    path = w.paths[0]
    # gemm_b on rank 0 (400), the transfer after the last arrival (150), rank 1's gemm_a that arrives last (450)
    assert path.step_ns == 1_000
    assert path.by_category == {"compute": 850, "transfer": 150, "wait": 0, "launch": 0, "host_gap": 0}
    assert path.by_rank == {"0": 550, "1": 450}
    assert path.by_bucket == {"gemm": 850, "communication": 150}
    assert [(s.start_ns, s.end_ns, s.rank) for s in path.segments] == [(0, 450, 1), (450, 600, 0), (600, 1000, 0)]


@pytest.mark.parametrize(("change", "expected"), [
    ({"scale": ["gemm=0.5"]}, -425),  # gemm_a 200 / 225: arrival 225, + 150, gemm_b 200: 575
    ({"scale": ["gemm_.=0.5"]}, -425),  # the same kernels by a name regex
    ({"comm": "free"}, -150),  # no all-reduce, no waiting: rank 1 alone, 450 + 400
    ({"rank_like_median": 1}, -50),  # rank 1's gemm_a as rank 0's (400): arrival 400, 550, 950
    ({"scale": ["communication=2"]}, 150),  # transfer 300 after the last arrival
])
def test_hand_computed_changes(change: dict[str, object], expected: int) -> None:
    w = ta.whatif(_two_ranks(), **change)  # type: ignore[arg-type]
    assert w.change_ns == expected
    assert w.assumptions and w.changes


@pytest.mark.parametrize(("argv", "problem"), [
    (["--scale", "attention"], "--scale 'attention'"),
    (["--comm", "fast"], "--comm 'fast'"),
    (["--fuse", "(unclosed"], "--fuse '(unclosed'"),
    (["--rank-like-median", "5"], "ranks [0, 1]"),
])
def test_bad_change_is_bad_input_in_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                             problem: str) -> None:
    code = main(["whatif", str(FIX / "kineto" / "tp2_prefill_serial"), *argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("Error: ") and problem in err[0], err


def test_cli_json_and_terminal() -> None:
    runner = CliRunner()
    got = runner.invoke(cli, ["whatif", str(FIX / "kineto" / "tp2_prefill_serial"), "--comm", "free", "--json"])
    assert got.exit_code == 0, got.output
    doc = json.loads(got.output)
    assert doc["changes"] == ["communication free"] and doc["change_ns"] < 0
    assert set(doc["critical_path"][0]["by_category_ns"]) == set(CATEGORIES)
    got = runner.invoke(cli, ["whatif", str(FIX / "kineto" / "tp2_prefill_serial")])
    assert got.exit_code == 0 and "What limits the step:" in got.output and "No-change replay" in got.output


def test_collectives_join_the_ranks_as_matched_in_the_raw_trace() -> None:
    """fixtures/kineto/tp2_prefill_serial: each rank file has 24 NCCL kernels (8 all-reduces × 3 profiled steps,
    counted in the raw JSON below); each instance joins both ranks: 24 instance nodes, 48 arrival and 48 transfer
    edges."""
    per_rank = []
    for r in (0, 1):
        with gzip.open(FIX / "kineto" / "tp2_prefill_serial" / f"rank{r}.json.gz") as f:
            doc = json.load(f)
        per_rank.append(sum(1 for e in doc["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"]))
    assert per_rank == [24, 24]
    w = ta.whatif(str(FIX / "kineto" / "tp2_prefill_serial"))
    edges = w.graph["edges_by_type"]
    assert edges["arrival"] == 48 and edges["transfer"] == 48


def _multi_rank_traces(tmp: Path) -> list[list[str]]:
    """Every multi-rank trace of fixtures/ (and ../shared/data when present), as the path lists of one run."""
    runs = [[str(p)] for p in sorted((FIX / "kineto").glob("tp2_*"))]
    runs += [[str(p)] for p in sorted((FIX / "kineto" / "ab").glob("tp2_*"))]
    runs.append([str(FIX / "nsys" / "tp2_prefill_serial.sqlite")])
    unpacked = tmp / "tp2_prefill_overlap.sqlite"
    with lzma.open(FIX / "nsys" / "tp2_prefill_overlap.sqlite.xz") as src, unpacked.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    runs.append([str(unpacked)])
    shared = ROOT.parent / "shared" / "data"
    if shared.is_dir():
        k = shared / "h200" / "kineto"
        for stem in ("prefill_serial", "prefill_overlap", "decode_serial", "decode_serial_graphs",
                     "nop2p_prefill_serial"):
            runs.append([str(k / f"{stem}_rank{r}.json.gz") for r in (0, 1)])
        runs += [[str(shared / "h200" / "nsys" / f"tp2_{m}.sqlite")] for m in ("prefill_serial", "prefill_overlap")]
        runs.append([str(p) for p in sorted((shared / "foreign").glob("dlrm_torchrec_v100_8rank_rank*.json.gz"))])
        runs.append([str(p) for p in sorted((shared / "hta" / "tests" / "data" / "trace_filter").glob(
            "sampled_rank-*.json.gz"))])
        runs += [[str(p)] for p in sorted((shared / "nsys-public").glob("*2xh100*.sqlite"))]
    return [r for r in runs if r]


def test_every_multi_rank_trace_replays_unchanged_and_its_paths_add_up(tmp_path: Path) -> None:
    checked = 0
    for run in _multi_rank_traces(tmp_path):
        try:
            w = ta.whatif(run)
        except ta.BadInputError as exc:  # a capture without steps of GPU work (e.g. an export with no kernels)
            assert "no step" in str(exc) or "kernel" in str(exc), (run, exc)
            continue
        assert w.no_change_error_pct is not None and w.no_change_error_pct <= 2.0, run
        assert w.graph["dropped_edges"] == 0, run
        for p in w.paths:
            for parts in (p.by_category, p.by_bucket, p.by_rank, p.by_edge):
                assert sum(parts.values()) == p.step_ns, (run, p.step, parts)
        traced = {s.ordinal: s.traced_ns for s in w.steps}
        assert [p.step_ns for p in w.paths] == [traced[k] for k in sorted(traced)], run
        checked += 1
    assert checked >= (28 if (ROOT.parent / "shared" / "data").is_dir() else 17)


def test_export_writes_each_step_path_adding_up_to_the_step(tmp_path: Path) -> None:
    import sqlite3

    result = ta.export(str(FIX / "kineto" / "tp2_prefill_serial"), tmp_path / "a.db")
    assert result.rows["critical_path"] > 0
    with sqlite3.connect(tmp_path / "a.db") as db:
        sums = dict(db.execute("SELECT step_ordinal, sum(duration_ns) FROM critical_path GROUP BY 1").fetchall())
    traced = {s.ordinal: s.traced_ns for s in ta.whatif(str(FIX / "kineto" / "tp2_prefill_serial")).steps}
    assert sums == traced


def test_nsys_recorded_waits_become_event_edges_and_replace_inferred_ones() -> None:
    """fixtures/nsys/tp2_prefill_serial.sqlite: 317 stream-wait syncs (CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, syncType
    2), 170 of them joined to their CUDA event record on (eventId, eventSyncId, globalPid, contextId), all between
    two different streams (sqlite3, see docs/METHOD_WHATIF_SIM.md). Pairs of ops they join are edges once; a device
    whose waits are recorded gets no inferred ones."""
    trace = ta.load(FIX / "nsys" / "tp2_prefill_serial.sqlite")
    waits = trace.tables["stream_waits"]
    assert len(waits) == 170
    assert bool((waits["wait_stream"] != waits["record_stream"]).all())
    edges = ta.whatif(str(FIX / "nsys" / "tp2_prefill_serial.sqlite")).graph["edges_by_type"]
    assert 0 < edges["event"] <= 170 and edges["wait"] == 0


def test_kineto_cuda_sync_stream_waits_become_event_edges(shared_data: Path) -> None:
    """HTA's cuda_event_sync_multi_stream trace (recorded with cuda sync events): counted in the raw JSON, its
    cuda_sync events that are stream waits naming their event record; each joins the last kernel submitted to the
    recording stream before the record to the first one submitted to the waiting stream after the wait."""
    path = shared_data / "hta" / "tests" / "data" / "critical_path" / "cuda_event_sync_multi_stream" / \
        "event_sync_trace.json.gz"
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    raw = [e for e in events if e.get("cat") == "cuda_sync" and e["args"].get("cuda_sync_kind") == "Stream Wait Event"
           and e["args"].get("wait_on_cuda_event_record_corr_id", -1) >= 0]
    assert len(raw) == 1
    waits = ta.load(path).tables["stream_waits"]
    assert len(waits) == 1 and int(waits["wait_stream"][0]) == raw[0]["args"]["stream"]
    assert int(waits["record_stream"][0]) == raw[0]["args"]["wait_on_stream"]
    edges = ta.whatif(str(path)).graph["edges_by_type"]
    assert edges["event"] == 1 and edges["wait"] == 0


def test_rank_like_median_takes_the_other_ranks_host_gap_at_the_same_place() -> None:
    """Two launch-bound kernels per rank (µs): rank 1's host waits 490 µs between its two launches, rank 0's 190 µs:
    rank 1's step (15 → 600 µs) sets the run's; with rank 1's gap as rank 0's, its second launch is at 200 µs and its
    kernel starts 15 µs later, as traced: 15 → 300 µs, the run's step 285 µs (rank 0's too)."""
    us = 1_000
    traces = []
    for rank, second in ((0, 200), (1, 500)):
        kernels = [(15 * us, 100 * us, 0, 7, "gemm_a", "gemm", None, 1),
                   ((second + 15) * us, (second + 100) * us, 0, 7, "gemm_b", "gemm", None, 2)]
        api = [(0, 10 * us, 1), (second * us, (second + 10) * us, 2)]
        traces.append(replace(make_trace(kernels, api_calls=api, rank=rank, path=f"rank{rank}.json"),
                              base_time_ns=0, world_size=2))
    w = ta.whatif(traces, rank_like_median=1)
    assert [s.traced_ns for s in w.steps] == [585 * us] and w.change_ns == -300 * us
    # the path: the host gap from the step's start (its first kernel, 15 µs) to the second launch (500), the launch
    # (15), the second kernel (85)
    assert {k: v // us for k, v in w.paths[0].by_category.items() if v} == {"host_gap": 485, "launch": 15,
                                                                           "compute": 85}


def test_graphs_launch_the_segment_at_once_and_run_kernels_back_to_back() -> None:
    """Three 10 µs kernels launched 105 µs apart (launch-bound: each starts 15 µs after its launch), a device sync
    after the last. With CUDA graphs the step's launches happen with the first: the kernels follow each other at
    the stream latency's cap (1 µs): 15 → 25, 26 → 36, 37 → 47 µs; the step 32 µs instead of 220."""
    us = 1_000
    kernels = [((15 + 105 * i) * us, (25 + 105 * i) * us, 0, 7, f"k{i}", "gemm", None, i + 1) for i in range(3)]
    api = [(105 * i * us, (105 * i + 5) * us, i + 1) for i in range(3)] + [(220 * us, 240 * us, 9,
                                                                           "cudaDeviceSynchronize")]
    trace = replace(make_trace(kernels, api_calls=api), base_time_ns=0)
    w = ta.whatif([trace], graphs=True)
    assert [s.traced_ns for s in w.steps] == [220 * us] and w.change_ns == -188 * us


def test_fuse_makes_a_run_of_matching_kernels_one_as_long_as_its_longest() -> None:
    """norm_a (20 µs) and norm_b (30 µs) back to back (1 µs apart) before a 100 µs GEMM, all launched far ahead:
    fused, the pair is one 30 µs kernel and the GEMM follows it 1 µs later: 100 → 231 µs instead of 100 → 252."""
    us = 1_000
    kernels = [(100 * us, 120 * us, 0, 7, "norm_a", "other", None, 1), (121 * us, 151 * us, 0, 7, "norm_b", "other",
                                                                      None, 2),
               (152 * us, 252 * us, 0, 7, "gemm", "gemm", None, 3)]
    api = [(i * us, i * us + 500, i + 1) for i in range(3)]
    trace = replace(make_trace(kernels, api_calls=api), base_time_ns=0)
    w = ta.whatif([trace], fuse=["^norm_"])
    assert [s.traced_ns for s in w.steps] == [152 * us] and w.change_ns == -21 * us


def test_html_is_one_offline_file_with_trace_strings_escaped(tmp_path: Path) -> None:
    from traceanalyzer.render.whatif import whatif_html

    traces = _two_ranks()
    traces[0] = replace(traces[0], tables=dict(traces[0].tables))
    w = ta.whatif(traces)
    w.paths[0].segments[0].bucket = "<script>alert(1)</script>"  # a hostile string where a trace string goes
    page = whatif_html(w)
    assert "<script" not in page and "&lt;script&gt;" in page and "http" not in page
    assert page.count("<rect") == len(w.paths[len(w.paths) // 2].segments)
    out = tmp_path / "w.html"
    assert main(["whatif", str(FIX / "kineto" / "tp2_prefill_serial"), "--html", str(out)]) == 0 and out.is_file()
