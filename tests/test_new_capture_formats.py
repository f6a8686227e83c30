"""Newer capture formats: collective metadata on Kineto kernel rows (name, sizes, dtype, group, sequence number —
the keys torch 2.11 writes on NCCL kernel rows, seen in fixtures/kineto/tp2_prefill_serial, plus ``Seq``), read from
a GPU-only capture that has no ``record_param_comms`` op, and matched across ranks by sequence number; CUDA-graph
ids kept on nsys kernels and carried into the Perfetto export."""

from __future__ import annotations

import json
from pathlib import Path

import traceanalyzer as ta
from traceanalyzer.testing.synth_nsys import write_nsys_export

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NELEMS = 1 << 20  # bf16: 2 MiB per all-reduce
LATE_NS = 30_000  # rank 1 reaches every all-reduce 30 µs after rank 0


def _kineto_rank(path: Path, rank: int, seqs: list[int]) -> Path:
    """A CUDA-only capture: per collective, a GEMM then the all-reduce kernel carrying torch's metadata."""
    events: list[dict[str, object]] = []
    corr = 100
    for seq in seqs:
        t0 = 1_000_000 + seq * 500_000  # ns from the base time; the same instant on both ranks
        gemm_end = t0 + 100_000 + (LATE_NS if rank == 1 else 0)
        for name, start, end, extra in (
                ("nvjet_tst_gemm", t0, gemm_end, {}),
                (AR, gemm_end, t0 + 200_000, {"Collective name": "allreduce", "In msg nelems": NELEMS,
                                              "Out msg nelems": NELEMS, "Group size": 2, "dtype": "BFloat16",
                                              "Process Group Name": "0", "Process Group Description": "default_pg",
                                              "Process Group Ranks": "[0, 1]", "Seq": seq})):
            corr += 1
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7,
                           "ts": start / 1000, "dur": (end - start) / 1000,
                           "args": {"device": 0, "stream": 7, "correlation": corr, **extra}})
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,
                                                     "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
           "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
           "baseTimeNanoseconds": 1790857026000000000, "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def test_kernel_row_metadata_matched_by_sequence(tmp_path: Path):
    # rank 1's capture began after the first all-reduce: it has seq 1, 2, 3 and rank 0 has 0, 1, 2, 3. In order,
    # rank 0's first would pair with rank 1's first (seq 0 with seq 1); by sequence number seq 1..3 pair up.
    r0 = _kineto_rank(tmp_path / "rank0.json", 0, [0, 1, 2, 3])
    r1 = _kineto_rank(tmp_path / "rank1.json", 1, [1, 2, 3])
    t0 = ta.load(r0)
    coll = t0.df("collectives")
    assert coll["seq"].tolist() == [0, 1, 2, 3] and (coll["bytes"] == 2 * NELEMS).all()
    assert (coll["group_size"] == 2).all() and coll["name"].astype(str).tolist() == ["allreduce"] * 4
    s = ta.summary([r0, r1], findings=False)
    d0 = next(d for d in s.devices if d.rank == 0)
    assert d0.collectives["bytes"].tolist() == [2 * NELEMS] * 4  # linked to its kernel by correlation
    cr = s.cross_rank
    assert cr is not None and cr.match_method == "seq" and cr.collectives_matched == 3
    assert cr.wait_ns_by_rank == {0: 3 * LATE_NS, 1: 0}
    assert cr.straggler_rank == 1


def test_old_path_without_sequence_still_matches_in_order(tmp_path: Path):
    """Kernel-row metadata without ``Seq`` (torch 2.11): sizes known, matched in order."""
    paths = []
    for rank in (0, 1):
        p = _kineto_rank(tmp_path / f"rank{rank}.json", rank, [0, 1, 2])
        doc = json.loads(p.read_text())
        for e in doc["traceEvents"]:
            e["args"].pop("Seq", None)
        p.write_text(json.dumps(doc))
        paths.append(p)
    s = ta.summary(paths, findings=False)
    cr = s.cross_rank
    assert cr is not None and cr.match_method != "seq" and cr.collectives_matched == 3
    assert cr.wait_ns_by_rank == {0: 3 * LATE_NS, 1: 0}
    assert all((d.collectives["bytes"] == 2 * NELEMS).all() for d in s.devices)


def test_cuda_graph_ids_kept_on_kernels(tmp_path: Path):
    """nsys node-level graph trace: graphId on each kernel row, kept on the Trace's kernels (``graph_id``)."""
    kernels = [(1000 + i * 1000, 1800 + i * 1000, 0, 7, "nvjet_gemm", 100, 10 + i, None, (1, 1, 1), (1, 1, 1),
                5 if i < 3 else -1) for i in range(5)]
    kernels = [k[:-1] + ((k[-1],) if k[-1] >= 0 else (None,)) for k in kernels]
    path = write_nsys_export(tmp_path / "graphs.sqlite", kernels)
    t = ta.load(path)
    assert t.kernels["graph_id"].tolist() == [5, 5, 5, -1, -1]
    from _perfetto_read import read

    out = tmp_path / "graphs.pftrace"
    ta.export(path, out)
    r = read(out)
    stream = [x for tr in r.tracks.values() if tr.name == "stream 7" for x in tr.slices]
    assert [x.args.get("cuda_graph_id") for x in sorted(stream, key=lambda x: x.start_ns)] == [5, 5, 5, None, None]


def test_kineto_graph_replay_as_torch_211_writes_it():
    """A real Kineto capture of CUDA-graph replays (fixtures/kineto/graph_replay, torch 2.11 on an H200): the JSON
    gives graph kernels no graph or node id, only the correlation of their cudaGraphLaunch — 3 replays × (gemm,
    relu) share correlations 7, 30, 53; the 3 eager matmuls have their own launches (20, 43, 66)."""
    path = Path(__file__).resolve().parents[1] / "fixtures" / "kineto" / "graph_replay" / \
        "torch211_graph_replay.json.gz"
    t = ta.load(path)
    k = t.kernels
    assert len(k) == 9 and (k["graph_id"] == -1).all()
    assert sorted(k["correlation"].tolist()) == [7, 7, 20, 30, 30, 43, 53, 53, 66]
    launches = t.df("api_calls")
    graph_calls = launches[launches["name"].astype(str) == "cudaGraphLaunch"]["correlation"].tolist()
    assert graph_calls == [7, 30, 53]
