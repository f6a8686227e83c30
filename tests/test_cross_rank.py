"""Cross-rank matching: hand-built collectives with exact transfer/wait answers, plus the real 2×H200 traces."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from traceanalyzer.analysis.cross_rank import analyze_cross_rank
from traceanalyzer.analysis.results import DeviceSummary
from traceanalyzer.model.communication import bus_factor
from traceanalyzer.model.trace import Trace
from traceanalyzer.testing.synth import make_trace


def _device(rank: int, rows: list[tuple[int, int, int]], *, path: str, kind: str = "allreduce",
            sizes: list[int] | None = None, seq: list[int] | None = None) -> DeviceSummary:
    """A DeviceSummary whose ``collectives`` holds ``(start, duration, step)`` rows (other fields minimal)."""
    start = np.array([r[0] for r in rows], dtype=np.int64)
    dur = np.array([r[1] for r in rows], dtype=np.int64)
    coll = pd.DataFrame({
        "start_ns": start, "end_ns": start + dur, "duration_ns": dur, "kind": kind,
        "step": np.array([r[2] for r in rows], dtype=np.int64),
        "seq": np.array(seq if seq is not None else [-1] * len(rows), dtype=np.int64),
        "bytes": np.array(sizes if sizes is not None else [1_000_000] * len(rows), dtype=np.int64),
        "group_size": 2, "exposed_ns": dur, "correlation": np.arange(len(rows)),
    })
    return DeviceSummary(rank=rank, device=rank, name=None, trace=path, span_ns=0, busy_ns=0, idle_ns=0,
                         bucket_ns={}, bucket_exclusive_ns={}, comm_ns=int(dur.sum()), comm_hidden_ns=0,
                         comm_exposed_ns=int(dur.sum()), overlap_pct=0.0, steps=0, step_ns_median=None,
                         comm_exposed_per_step_ns=None, step_source="profiler_step", collectives=coll)


def _trace(path: str, base: int | None) -> Trace:
    return replace(make_trace(path=path), base_time_ns=base)


def test_fewer_than_two_ranks_gives_none() -> None:
    dev = _device(0, [(0, 100, 1)], path="r0")
    assert analyze_cross_rank([_trace("r0", 0)], [dev]) is None


def test_step_matching_transfer_wait_and_straggler() -> None:
    # step 1: rank 0 waits 50 for rank 1; step 2: rank 1 waits 30 for rank 0 (per-rank clocks: base differs)
    r0 = _device(0, [(1_000, 150, 1), (5_000, 100, 2)], path="r0")
    r1 = _device(1, [(1_050, 100, 1), (4_970, 130, 2)], path="r1")
    cr = analyze_cross_rank([_trace("r0", 10_000), _trace("r1", 10_000)], [r0, r1])
    assert cr is not None
    assert cr.match_method == "step+ordinal"
    assert cr.collectives_matched == 2
    per = cr.per_collective.sort_values("step")
    assert per["transfer_ns"].tolist() == [100, 100]
    assert per["wait_ns_r0"].tolist() == [50, 0]
    assert per["wait_ns_r1"].tolist() == [0, 30]
    assert per["least_wait_rank"].tolist() == [1, 0]
    assert per["last_arrival_rank"].tolist() == [1, 0]
    assert per["arrival_skew_ns"].tolist() == [50, 30]
    assert cr.wait_ns_by_rank == {0: 50, 1: 30}
    assert cr.transfer_ns_per_step == 100
    # 1 MB in 100 ns = 10_000 GB/s algbw; all-reduce over 2 ranks: busbw = algbw
    assert per["algbw_gbps"].tolist() == [10_000.0, 10_000.0]
    assert per["busbw_gbps"].tolist() == [10_000.0, 10_000.0]
    assert cr.detail is not None and cr.detail.clock_comparable is True
    # start gaps fully explained by waits: no apparent clock offset, arrivals agree with least wait
    assert cr.detail is not None and cr.detail.clock_offset_ns_by_rank == {1: 0}
    assert cr.detail is not None and cr.detail.arrival_agrees_with_least_wait_pct == 100.0


def test_rank_matches_reads_one_ranks_figures_from_the_table() -> None:
    r0 = _device(0, [(1_000, 150, 1), (5_000, 100, 2)], path="r0")
    r1 = _device(1, [(1_050, 100, 1), (4_970, 130, 2)], path="r1")
    cr = analyze_cross_rank([_trace("r0", 10_000), _trace("r1", 10_000)], [r0, r1])
    assert cr is not None and cr.ranks == [0, 1] and cr.rank_matches(7) is None
    one = cr.rank_matches(1)
    assert one is not None and sorted(zip(one.start_ns.tolist(), one.transfer_ns.tolist(), one.wait_ns.tolist(),
                                          strict=True)) == [(1_050, 100, 0), (4_970, 100, 30)]
    hit, transfer, wait = one.lookup(np.array([4_970, 4_971, 1_050]))
    assert hit.tolist() == [True, False, True] and transfer.tolist() == [100, 0, 100] and wait.tolist() == [30, 0, 0]
    # instances of a rank that start together: the first one in table order is the one a start finds
    doubled = replace(cr, per_collective=pd.concat([cr.per_collective, cr.per_collective.assign(transfer_ns=1)]))
    matches = doubled.rank_matches(0)
    assert matches is not None and len(matches) == 4 and len(matches.first_per_start()) == 2
    assert matches.first_per_start().transfer_ns.tolist() == cr.per_collective["transfer_ns"].tolist()
    assert matches.lookup(np.array([1_000]))[1].tolist() == [100]


def test_windows_starting_on_different_steps_match_by_step_number() -> None:
    r0 = _device(0, [(0, 100, 2), (1_000, 100, 3), (2_000, 40, 3)], path="r0")
    r1 = _device(1, [(1_000, 70, 3), (2_000, 90, 3), (3_000, 80, 4)], path="r1")
    cr = analyze_cross_rank([_trace("r0", None), _trace("r1", None)], [r0, r1])
    assert cr is not None and cr.collectives_matched == 2
    assert cr.per_collective["transfer_ns"].tolist() == [70, 40]
    assert cr.wait_ns_by_rank == {0: 30, 1: 50}
    # clocks of two files without an epoch origin do not compare: straggler by least wait only
    assert cr.detail is not None and cr.detail.clock_comparable is False
    assert cr.per_collective["last_arrival_rank"].tolist() == [-1, -1]
    assert cr.straggler_rank == 0 and cr.detail is not None and cr.detail.straggler_by_arrival is None


def test_ordinal_offset_alignment_without_steps() -> None:
    # rank 1's window starts one collective later; the (kind, bytes) sequence reveals the shift
    sizes0 = [10, 20, 30, 40]
    r0 = _device(0, [(i * 1_000, 100, -1) for i in range(4)], path="r0", sizes=sizes0)
    r1 = _device(1, [(i * 1_000, 60 + i, -1) for i in range(3)], path="r1", sizes=sizes0[1:])
    cr = analyze_cross_rank([_trace("r0", None), _trace("r1", None)], [r0, r1])
    assert cr is not None and cr.match_method == "ordinal+offset"
    assert cr.collectives_matched == 3
    assert cr.per_collective["bytes"].tolist() == [20, 30, 40]
    assert cr.per_collective["transfer_ns"].tolist() == [60, 61, 62]
    assert cr.transfer_ns_per_step is None  # no step windows


def test_seq_matching_when_every_row_knows_it() -> None:
    r0 = _device(0, [(0, 100, -1), (500, 100, -1)], path="r0", seq=[7, 8])
    r1 = _device(1, [(90, 10, -1)], path="r1", seq=[8])
    cr = analyze_cross_rank([_trace("r0", None), _trace("r1", None)], [r0, r1])
    assert cr is not None and cr.match_method == "seq"
    assert cr.collectives_matched == 1 and cr.per_collective["wait_ns_r0"].tolist() == [90]


def test_one_file_two_ranks_share_a_clock() -> None:
    r0 = _device(0, [(0, 100, 1)], path="both")
    r1 = _device(1, [(60, 40, 1)], path="both")
    cr = analyze_cross_rank([_trace("both", None)], [r0, r1])
    assert cr is not None and cr.detail is not None and cr.detail.clock_comparable is True
    assert cr.straggler_rank == 1 and cr.per_collective["arrival_skew_ns"].tolist() == [60]


@pytest.mark.parametrize(("kind", "n", "factor"), [("allreduce", 2, 1.0), ("all_reduce", 8, 1.75),
                                                   ("allgather", 4, 0.75), ("reduce_scatter", 2, 0.5),
                                                   ("sendrecv", 2, 1.0), ("allreduce", 1, 1.0)])
def test_bus_factor(kind: str, n: int, factor: float) -> None:
    assert bus_factor(kind, n) == pytest.approx(factor)


@pytest.fixture(scope="module")
def prefill_serial(shared_data):  # type: ignore[no-untyped-def]
    from traceanalyzer.pipeline.loading import load_many
    from traceanalyzer.pipeline.summarize import summarize

    k = shared_data / "h200" / "kineto"
    return summarize(load_many([k / "prefill_serial_rank0.json.gz", k / "prefill_serial_rank1.json.gz"]),
                     findings=False)


def test_real_prefill_serial_matches_every_step_collective(prefill_serial) -> None:  # type: ignore[no-untyped-def]
    cr = prefill_serial.cross_rank
    assert cr is not None and cr.match_method == "step+ordinal"
    assert cr.collectives_matched == 48  # 3 ProfilerSteps × 8 layers × 2 all-reduces
    assert cr.detail is not None and cr.detail.steps_matched == 3 and cr.detail.clock_comparable is True
    # transfer ≈ the shortest rank's NCCL time: 16 all-reduces of 32 MiB at ~134 µs each
    assert 1_900_000 < cr.transfer_ns_per_step < 2_400_000
    assert set(cr.wait_ns_by_rank) == {0, 1}
    busbw = cr.detail.busbw_gbps_median if cr.detail is not None else None
    assert busbw is not None and 150 < busbw < 450  # NVLink all-reduce, 2 ranks


def _synthetic_rank(rank: int, comm_start: int) -> Trace:
    """Two ProfilerSteps of gemm → all-reduce → gemm; rank 1 reaches the all-reduce later than rank 0."""
    kernels, api, ranges = [], [], []
    for step, t0 in ((1, 5_000), (2, 15_000)):
        corr = 10 * step
        kernels += [(t0, t0 + comm_start, rank, 7, "gemm_a", "gemm", None, corr),
                    (t0 + comm_start, t0 + 6_000, rank, 7, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                     "communication", "all_reduce", corr + 1),
                    (t0 + 6_000, t0 + 9_000, rank, 7, "gemm_b", "gemm", None, corr + 2)]
        api += [(t0 - 900, t0 - 890, corr), (t0 - 880, t0 - 870, corr + 1), (t0 - 860, t0 - 850, corr + 2)]
        ranges.append((t0 - 1_000, t0 + 9_500, "profiler_step", f"ProfilerStep#{step}"))
    return replace(make_trace(kernels, api_calls=api, ranges=ranges, rank=rank, path=f"rank{rank}.json"),
                   base_time_ns=1_000_000)


def test_summarize_wires_cross_rank_and_what_if() -> None:
    from traceanalyzer.pipeline.summarize import summarize

    s = summarize([_synthetic_rank(0, 4_000), _synthetic_rank(1, 5_000)], findings=False)
    cr = s.cross_rank
    assert cr is not None and cr.match_method == "step+ordinal" and cr.collectives_matched == 2
    assert cr.transfer_ns_per_step == 1_000 and cr.wait_ns_by_rank == {0: 2_000, 1: 0}
    assert cr.straggler_rank == 1 and cr.detail is not None and cr.detail.straggler_by_least_wait == 1
    assert s.what_if.comm_free_step_saving_ns == 1_000 and s.what_if.basis == "gpu_transfer"
    assert s.to_json()["what_if"]["comm_free_step_saving_ns"] == 1_000


def test_transfer_and_wait_invariants_on_random_ranks() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    durations = st.lists(st.integers(1, 10_000), min_size=3, max_size=3)

    @settings(max_examples=40, deadline=None)
    @given(st.lists(durations, min_size=1, max_size=6))
    def check(rows: list[list[int]]) -> None:
        devs = [_device(r, [(i * 100_000 + 7 * r, row[r], 1 + i // 2) for i, row in enumerate(rows)], path="one")
                for r in range(3)]
        cr = analyze_cross_rank([_trace("one", None)], devs)
        assert cr is not None and cr.collectives_matched == len(rows)
        per = cr.per_collective
        waits = per[["wait_ns_r0", "wait_ns_r1", "wait_ns_r2"]].to_numpy()
        assert (waits >= 0).all() and (waits.min(axis=1) == 0).all()
        assert per["transfer_ns"].tolist() == [min(row) for row in rows]
        assert sum(cr.wait_ns_by_rank.values()) == sum(sum(row) - 3 * min(row) for row in rows)

    check()
