"""What if communication were free: hand-built timelines with exact answers, and validation against real runs
timed with and without their all-reduces (data/h200/kineto/*truth*.json, read only here, never by the product)."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from traceanalyzer.analysis.cross_rank import analyze_cross_rank
from traceanalyzer.analysis.results import DeviceSummary
from traceanalyzer.analysis.what_if.comm_free import estimate_comm_free
from traceanalyzer.model.trace import Trace
from traceanalyzer.testing.synth import make_trace

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def _rank(rank: int, kernels: list[tuple[Any, ...]], colls: list[tuple[int, ...]], *,
          api: list[tuple[Any, ...]] = (), ranges: list[tuple[Any, ...]] = (),  # type: ignore[assignment]
          steps: tuple[tuple[int, int, int], ...] = ((1, 0, 1_000),)) -> tuple[Trace, DeviceSummary]:
    """One rank's classified trace plus its DeviceSummary; ``colls``: ``(start, duration, exposed, correlation[,
    bytes])`` of its communication kernels, each in the step that contains it."""
    path = f"rank{rank}.json"
    trace = replace(make_trace(kernels, api_calls=api, ranges=ranges, rank=rank, path=path), base_time_ns=0)
    win = pd.DataFrame(steps, columns=["step", "start_ns", "end_ns"])
    win["duration_ns"] = win["end_ns"] - win["start_ns"]
    win["idle_ns"] = 10**9  # GPU idle far beyond the profiler's time: no weighing (tests/test_what_if_range.py)
    start = np.array([c[0] for c in colls], dtype=np.int64)
    inside = [win.loc[(win["start_ns"] <= s) & (s < win["end_ns"]), "step"] for s in start]
    step_of = [int(w.iloc[0]) if len(w) else -1 for w in inside]
    coll = pd.DataFrame({
        "start_ns": start, "end_ns": start + [c[1] for c in colls], "duration_ns": [c[1] for c in colls],
        "kind": "allreduce", "step": step_of, "seq": -1,
        "bytes": [c[4] if len(c) > 4 else -1 for c in colls], "group_size": 2,
        "exposed_ns": [c[2] for c in colls], "correlation": [c[3] for c in colls],
    })
    dev = DeviceSummary(rank=rank, device=0, name=None, trace=path, span_ns=0, busy_ns=0, idle_ns=0,
                        bucket_ns={}, bucket_exclusive_ns={}, comm_ns=0, comm_hidden_ns=0, comm_exposed_ns=0,
                        overlap_pct=None, steps=len(win), step_ns_median=None, comm_exposed_per_step_ns=None,
                        per_step=win, collectives=coll)
    return trace, dev


def _estimate(*ranks: tuple[Trace, DeviceSummary]):  # type: ignore[no-untyped-def]
    traces, devs = [r[0] for r in ranks], [r[1] for r in ranks]
    return estimate_comm_free(traces, devs, analyze_cross_rank(traces, devs))


def _gpu_bound(rank: int, comm_start: int) -> tuple[Trace, DeviceSummary]:
    """gemm → all-reduce → gemm back to back on one stream; launches far ahead (queued: not launch-bound)."""
    kernels = [(0, comm_start, 0, 7, "gemm_a", "gemm", None, 1), (comm_start, 600, 0, 7, NCCL, "communication",
                                                                  "all_reduce", 2),
               (600, 1_000, 0, 7, "gemm_b", "gemm", None, 3)]
    api = [(-300, -290, 1), (-280, -270, 2, "cuLaunchKernelEx"), (-260, -250, 3)]
    return _rank(rank, kernels, [(comm_start, 600 - comm_start, 600 - comm_start, 2)], api=api)


def test_gpu_bound_saving_is_the_transfer_of_the_rank_others_wait_for() -> None:
    # rank 0's all-reduce lasts 200 (it waited 50 for rank 1), rank 1's lasts 150: transfer 150
    w = _estimate(_gpu_bound(0, 400), _gpu_bound(1, 450))
    assert w.comm_free_step_saving_ns == 150
    assert w.basis == "gpu_transfer"
    assert w.to_json()["limiting_rank_by_step"] == {"1": 1}
    assert w.to_json()["ranks"]["0"]["wait_ns"] == 50 and w.to_json()["ranks"]["0"]["exposed_ns"] == 200
    assert w.to_json()["ranks"]["1"]["bound"] == "gpu"


def test_single_rank_takes_transfer_from_its_fastest_instances() -> None:
    # one rank, two steps: the all-reduce takes 150 (it arrived last) then 400 (it waited); without other ranks
    # the transfer is the 10th percentile of the same collective's durations: 150 + 0.1 * 250 = 175
    kernels = [(0, 450, 0, 7, "gemm_a", "gemm", None, 1), (450, 600, 0, 7, NCCL, "communication", "all_reduce", 2),
               (1_000, 1_200, 0, 7, "gemm_a", "gemm", None, 3),
               (1_200, 1_600, 0, 7, NCCL, "communication", "all_reduce", 4)]
    api = [(-90_000, -80_000, i) for i in range(1, 5)]
    one = _rank(0, kernels, [(450, 150, 150, 2), (1_200, 400, 400, 4)], api=api,
                steps=((1, 0, 1_000), (2, 1_000, 2_000)))
    w = estimate_comm_free([one[0]], [one[1]], None)
    assert w.to_json()["saving_ns_by_step"] == {"1": 150, "2": 175}
    assert w.to_json()["ranks"]["0"]["wait_ns"] == (0 + 225) // 2
    assert "10th percentile" in w.to_json()["note"]


def _host_bound(rank: int, next_launch: int = 450) -> tuple[Trace, DeviceSummary]:
    """The GPU idles until the all-reduce is launched (its kernel starts 2 ns after the launch call returns), and
    again until gemm_b is launched at ``next_launch``."""
    kernels = [(0, 100, 0, 7, "gemm_a", "gemm", None, 1), (312, 322, 0, 7, NCCL, "communication", "all_reduce", 2),
               (next_launch + 12, next_launch + 110, 0, 7, "gemm_b", "gemm", None, 3)]
    api = [(-50, -40, 1), (300, 310, 2, "cuLaunchKernelEx"), (next_launch, next_launch + 10, 3)]
    ranges = [(250, 380, "cpu_op", "c10d::allreduce_"), (255, 375, "cpu_op", "record_param_comms"),
              (270, 360, "user_annotation", "nccl:all_reduce")]
    return _rank(rank, kernels, [(312, 10, 10, 2)], api=api, ranges=ranges)


def test_host_bound_saving_is_the_host_time_of_the_whole_call() -> None:
    w = _estimate(_host_bound(0), _host_bound(1))
    # the whole call, c10d::allreduce_ [250, 380); the GPU then waits 140 for gemm_b (> 130). NCCL's issue
    # alone, nccl:all_reduce [270, 360), is reported beside it
    assert w.comm_free_step_saving_ns == 130
    assert w.to_json()["issue_only_saving_ns"] == 90
    assert w.basis == "host_launch"
    r0 = w.to_json()["ranks"]["0"]
    assert r0["host_issue_critical_ns"] == 130 and r0["launch_bound_collectives_per_step"] == 1
    assert r0["host_issue_ns"] == 130 and r0["host_nccl_issue_ns"] == 90
    assert r0["issue_source"] == "cpu_op" and r0["comm_launch_bound_pct"] == 100.0


def test_one_call_making_two_collectives_counts_once_and_stays_capped() -> None:
    # one user range "allreduce" [240, 700) makes two all-reduces (each its own nccl:* range): the whole call
    # counts once (460), capped at the GPU waiting for launches after it (gemm_b: 862 − 622 = 240); NCCL's
    # issue alone is 2 × 90 (not widened to the CUDA calls of the user range, which span both)
    kernels = [(0, 100, 0, 7, "gemm_a", "gemm", None, 1), (312, 322, 0, 7, NCCL, "communication", "all_reduce", 2),
               (612, 622, 0, 7, NCCL, "communication", "all_reduce", 4),
               (862, 960, 0, 7, "gemm_b", "gemm", None, 3)]
    api = [(-50, -40, 1), (300, 310, 2, "cuLaunchKernelEx"), (600, 610, 4, "cuLaunchKernelEx"), (850, 860, 3)]
    ranges = [(240, 700, "user_annotation", "allreduce"), (270, 360, "user_annotation", "nccl:all_reduce"),
              (570, 660, "user_annotation", "nccl:all_reduce")]
    ranks = [_rank(r, kernels, [(312, 10, 10, 2), (612, 10, 10, 4)], api=api, ranges=ranges) for r in (0, 1)]
    w = _estimate(*ranks)
    assert w.comm_free_step_saving_ns == 240
    assert w.to_json()["issue_only_saving_ns"] == 180
    assert w.to_json()["ranks"]["1"]["host_issue_ns"] == 460


def test_cpu_ops_slowed_right_after_a_call_count_against_their_far_median() -> None:
    from traceanalyzer.analysis.activity import gather
    from traceanalyzer.analysis.host_issue import HOST_RECOVERY_NS, collective_calls, host_slowed_after_calls

    w = HOST_RECOVERY_NS
    kernels = [(0, 10, 0, 7, "gemm", "gemm", None, 1), (1_050, 1_060, 0, 7, NCCL, "communication", "all_reduce", 2)]
    api = [(-20, -10, 1), (1_040, 1_045, 2, "cuLaunchKernelEx")]
    ranges = [
        (1_000, 1_100, "user_annotation", "allreduce"), (1_010, 1_090, "cpu_op", "c10d::allreduce_"),
        (1_020, 1_030, "cpu_op", "aten::inside_the_call"),
        (1_120, 1_180, "cpu_op", "aten::add"),  # 20 after the call: 60 against its far median 30
        (1_125, 1_130, "cpu_op", "aten::empty"),  # nested: not counted on its own
        (1_200, 1_290, "cpu_op", "aten::mm"),  # no far baseline: not counted
        (1_100 + w - 1, 1_100 + w + 49, "cpu_op", "aten::add"),  # still inside the window: +20
        *[(10_000 + 1_000 * i + w, 10_030 + 1_000 * i + w, "cpu_op", "aten::add") for i in range(3)],
        (900, 950, "cpu_op", "aten::add"),  # before the call: far, part of the baseline
    ]
    trace = make_trace(kernels, api_calls=api, ranges=ranges)
    act = gather(trace, 0, 0)
    calls = collective_calls(trace, act)
    assert calls["name"].tolist() == ["allreduce"] and calls["launches_comm"].tolist() == [True]
    # far aten::add: 30, 30, 30, 50 → median 30; near: 60 − 30 + 50 − 30
    assert host_slowed_after_calls(trace, act, calls).tolist() == [50]


def test_nccl_only_range_is_widened_to_the_cuda_calls_of_the_issuing_call() -> None:
    # nsys-like: NCCL's NVTX range covers only the NCCL call [298, 312); the user's "allreduce" range around the
    # whole call also makes the stream-sync and work-end event calls: issue = first to last CUDA call, [250, 360)
    kernels = [(0, 100, 0, 7, "gemm_a", "gemm", None, 1), (312, 322, 0, 7, NCCL, "communication", "all_reduce", 2),
               (462, 560, 0, 7, "gemm_b", "gemm", None, 3)]
    api = [(-50, -40, 1), (250, 255, 90, "cudaEventRecord"), (300, 310, 2, "cuLaunchKernelEx"),
           (350, 360, 91, "cudaEventRecord"), (450, 460, 3)]
    ranges = [(240, 400, "user_annotation", "allreduce"), (298, 312, "user_annotation", "ncclAllReduce")]
    ranks = [_rank(r, kernels, [(312, 10, 10, 2)], api=api, ranges=ranges) for r in (0, 1)]
    w = _estimate(*ranks)
    assert w.to_json()["issue_only_saving_ns"] == 360 - 250
    # the whole call [240, 400) is 160, capped at the GPU waiting after it (gemm_b: 462 − 322)
    assert w.comm_free_step_saving_ns == 140
    assert w.basis == "host_launch"


def test_an_issuing_call_held_up_far_beyond_its_kind_counts_four_usual_calls() -> None:
    """Five host-bound all-reduces, 10 µs apart; one issuing range is 3.06 µs instead of 90 ns (a hiccup)."""
    kernels, api, ranges, colls = [], [], [], []
    for i in range(5):
        b, c = 10_000 * i, 10 * i
        kernels += [(b, b + 100, 0, 7, "gemm_a", "gemm", None, c + 1),
                    (b + 312, b + 322, 0, 7, NCCL, "communication", "all_reduce", c + 2),
                    (b + 462, b + 560, 0, 7, "gemm_b", "gemm", None, c + 3)]
        api += [(b - 50, b - 40, c + 1), (b + 300, b + 310, c + 2, "cuLaunchKernelEx"), (b + 450, b + 460, c + 3)]
        ranges.append((b + 270 - (2_970 if i == 2 else 0), b + 360, "user_annotation", "nccl:all_reduce"))
        colls.append((b + 312, 10, 10, c + 2))
    ranks = [_rank(r, kernels, colls, api=api, ranges=ranges, steps=((1, -100, 60_000),)) for r in (0, 1)]
    w = _estimate(*ranks)
    assert w.basis == "host_launch"
    assert w.comm_free_step_saving_ns == 4 * 90 + 4 * 90  # not 4 × 90 + 3_060
    assert w.to_json()["ranks"]["0"]["host_issue_ns"] == 720


def test_host_saving_is_capped_by_the_gpu_waiting_that_follows() -> None:
    # gemm_b is launched at [385, 395) and starts at 397: after the all-reduce (ends 322) the GPU waits 75 only
    w = _estimate(_host_bound(0, next_launch=385), _host_bound(1, next_launch=385))
    assert w.comm_free_step_saving_ns == 397 - 322


def test_host_bound_without_cpu_ops_uses_the_launch_call() -> None:
    trace, dev = _host_bound(0)
    bare = trace.with_table("ranges", make_trace().ranges)
    w = estimate_comm_free([bare], [dev], None)
    assert w.comm_free_step_saving_ns == 10  # cuLaunchKernelEx [300, 310) (ties with the 10 ns kernel)
    assert w.to_json()["ranks"]["0"]["issue_source"] == "launch_api"


def test_mixed_when_host_and_gpu_segments_share_the_saving() -> None:
    # segment 1 (host-bound): issue 100, GPU waits 140 afterwards; a host sync; segment 2 (GPU-bound): an
    # all-reduce queued behind gemm_c, exposed 100, no GPU waiting for the host after it
    kernels = [(0, 100, 0, 7, "gemm_a", "gemm", None, 1), (312, 322, 0, 7, NCCL, "communication", "all_reduce", 2),
               (462, 600, 0, 7, "gemm_b", "gemm", None, 3), (620, 800, 0, 7, "gemm_c", "gemm", None, 4),
               (800, 900, 0, 7, NCCL, "communication", "all_reduce", 5)]
    api = [(-50, -40, 1), (300, 310, 2), (450, 460, 3), (600, 610, 99, "cudaStreamSynchronize"),
           (611, 612, 4), (613, 614, 5)]
    ranges = [(280, 380, "user_annotation", "nccl:all_reduce"), (612, 615, "user_annotation", "nccl:all_reduce")]
    one = _rank(0, kernels, [(312, 10, 10, 2, 1 << 20), (800, 100, 100, 5, 8 << 20)], api=api, ranges=ranges)
    w = estimate_comm_free([one[0]], [one[1]], None)
    assert w.comm_free_step_saving_ns == 100 + 100
    assert w.basis == "mixed" and w.to_json()["host_share_pct"] == 50.0
    assert w.to_json()["ranks"]["0"]["host_syncs"] == 1


def test_contention_counts_compute_slowed_beside_communication() -> None:
    # gemm takes 100 alone, 160 while an all-reduce runs beside it on another stream (all comm hidden)
    kernels = [(0, 100, 0, 7, "gemm", "gemm", None, 1), (200, 300, 0, 7, "gemm", "gemm", None, 2),
               (400, 500, 0, 7, "gemm", "gemm", None, 3), (600, 760, 0, 7, "gemm", "gemm", None, 4),
               (600, 700, 0, 9, NCCL, "communication", "all_reduce", 5)]
    api = [(-90_000, -80_000, i) for i in range(1, 6)]  # launched long before: queued, not launch-bound
    one = _rank(0, kernels, [(600, 100, 0, 5)], api=api)
    w = estimate_comm_free([one[0]], [one[1]], None)
    assert w.comm_free_step_saving_ns == 60
    assert w.to_json()["ranks"]["0"]["contention_ns"] == 60


def test_dependency_latency_around_a_collective_counts_beyond_the_usual_gap() -> None:
    # kernels queued back to back with 4 ns gaps; the all-reduce [320, 400) opens after a 20 ns gap and the next
    # kernel follows after 10: 16 + 6 beyond the usual 4 ns gap, on top of the 80 ns transfer
    kernels = [(0, 100, 0, 7, "gemm", "gemm", None, 1), (104, 200, 0, 7, "gemm", "gemm", None, 2),
               (204, 300, 0, 7, "gemm", "gemm", None, 3), (320, 400, 0, 7, NCCL, "communication", "all_reduce", 4),
               (410, 500, 0, 7, "gemm", "gemm", None, 5)]
    api = [(-90_000, -80_000, i) for i in range(1, 6)]  # launched long before: queued, not launch-bound
    one = _rank(0, kernels, [(320, 80, 80, 4)], api=api)
    w = estimate_comm_free([one[0]], [one[1]], None)
    assert w.comm_free_step_saving_ns == 80 + 16 + 6
    assert w.to_json()["ranks"]["0"]["dependency_latency_ns"] == 22


def test_gap_before_a_launch_bound_collective_is_host_waiting_not_latency() -> None:
    w = _estimate(_host_bound(0), _host_bound(1))
    assert w.to_json()["ranks"]["0"]["dependency_latency_ns"] == 0


def test_no_communication_saves_nothing() -> None:
    trace, dev = _rank(0, [(0, 100, 0, 7, "gemm", "gemm")], [])
    w = estimate_comm_free([trace], [dev], None)
    assert w.comm_free_step_saving_ns == 0 and w.basis == "gpu_transfer"


# --- validation on real runs ---------------------------------------------------------------------------------

CASES = {  # trace stem → (truth file of the run, truth file of the same workload without all-reduces)
    "prefill_serial": ("prefill_serial_rank{}.truth.json", "truth_prefill_nocomm_rank{}.json"),
    "decode_serial": ("decode_serial_rank{}.truth.json", "truth_decode_nocomm_rank{}.json"),
    "nop2p_prefill_serial": ("nop2p_prefill_serial_rank{}.truth.json", "truth_nop2p_prefill_nocomm_rank{}.json"),
    "prefill_overlap": ("prefill_overlap_rank{}.truth.json", "truth_prefill_overlap_nocomm_rank{}.json"),
}


def truth_delta_ms(kineto: Path, case: str) -> tuple[float, float]:
    """Measured cost of communication per step (ms): (slowest rank with − slowest rank without, rank 0's)."""
    with_comm, without = CASES[case]
    w = [json.loads((kineto / with_comm.format(r)).read_text())["step_ms_median"] for r in (0, 1)]
    wo = [json.loads((kineto / without.format(r)).read_text())["step_ms_median"] for r in (0, 1)]
    return max(w) - max(wo), w[0] - wo[0]


_CACHE: dict[str, Any] = {}


def _summary(files: list[Path]):  # type: ignore[no-untyped-def]
    from traceanalyzer.pipeline.loading import load_many
    from traceanalyzer.pipeline.summarize import summarize

    key = "|".join(map(str, files))
    if key not in _CACHE:
        _CACHE[key] = summarize(load_many(files), findings=False)
    return _CACHE[key]


def _kineto_estimate_ms(kineto: Path, case: str):  # type: ignore[no-untyped-def]
    s = _summary([kineto / f"{case}_rank{r}.json.gz" for r in (0, 1)])
    return s.what_if.comm_free_step_saving_ns / 1e6, s.what_if


@pytest.mark.parametrize(("case", "basis"), [("prefill_serial", "gpu_transfer"),
                                             ("nop2p_prefill_serial", "gpu_transfer")])
def test_estimate_within_25_percent_of_measured_cost(shared_data: Path, case: str, basis: str) -> None:
    kineto = shared_data / "h200" / "kineto"
    slowest, rank0 = truth_delta_ms(kineto, case)
    est, what_if = _kineto_estimate_ms(kineto, case)
    assert what_if.basis == basis
    assert abs(est / slowest - 1) <= 0.25, (case, est, slowest)
    assert abs(est / rank0 - 1) <= 0.25, (case, est, rank0)


def test_shared_eager_decode_gets_a_host_bound_range_without_a_truth(shared_data: Path) -> None:
    """decode_serial's measured cost (2.08 ms/step, separate launches whose steps span 17–27 ms against 18–20 ms)
    is withdrawn: it cannot arbitrate (docs/METHOD_WHAT_IF.md). What remains checkable: the regime and a range
    that spans the whole calls up to the host work slowed around them, with NCCL's issue alone below it."""
    kineto = shared_data / "h200" / "kineto"
    est, what_if = _kineto_estimate_ms(kineto, "decode_serial")
    low, high = (v / 1e6 for v in what_if.to_json()["range_ns"])
    assert what_if.basis == "host_launch" and what_if.to_json()["range_basis"] == ["host_calls", "host_slowdown"]
    assert what_if.to_json()["issue_only_saving_ns"] / 1e6 < low <= est < high


def test_separate_launches_of_one_workload_disagree() -> None:
    """Why a separate-launch truth cannot judge a host-bound estimate: seven launch pairs of decode_hostsync on 2
    GPUs (5 warm-up + 10 timed steps each, as the shared decode truth was taken), slowest rank with − slowest
    without: −0.3 … 9.4 ms/step, while the same workload timed in one process costs 8.3 ms/step."""
    from conftest import FIXTURES

    sep = FIXTURES / "truth" / "separate"
    costs = []
    for launch in range(1, 8):
        med = [json.loads((sep / f"decode_hostsync_launch{launch}{tag}_rank{r}.json").read_text())["step_ms_median"]
               for tag in ("", "_nocomm") for r in (0, 1)]
        costs.append(max(med[:2]) - max(med[2:]))
    assert min(costs) < 0 and max(costs) > 9  # −0.32 … 9.39
    assert 3.5 < statistics.median(costs) < 4.5  # 4.01
    same_process, _ = _ab_truth_ms("decode_hostsync_d")
    assert 8 < same_process < 9  # 8.32 ms/step over 5 rounds of 30 steps each way


def test_cuda_graph_decode_is_gpu_bound(shared_data: Path) -> None:
    """decode_serial_graphs has no no-comm twin run; the estimate must be the GPU transfer plus the graph-node
    latency around each NCCL kernel (no host issue cost inside a graph), small next to its 13.9 ms step."""
    kineto = shared_data / "h200" / "kineto"
    s = _summary([kineto / f"decode_serial_graphs_rank{r}.json.gz" for r in (0, 1)])
    assert s.what_if.basis == "gpu_transfer"
    assert s.cross_rank is not None
    transfer = s.cross_rank.transfer_ns_per_step
    saving = s.what_if.comm_free_step_saving_ns
    limiting = s.what_if.to_json()["ranks"][str(s.what_if.to_json()["limiting_rank_by_step"]["3"])]
    # 32 all-reduces with ~1.9 µs of node latency each beyond the usual 0.4 µs gap between kernels
    assert 32 * 1_000 <= limiting["dependency_latency_ns"] <= 32 * 3_000
    assert abs(saving - transfer - limiting["dependency_latency_ns"]) <= 0.1 * transfer
    assert saving < 0.05 * s.devices[0].step_ns_median


def test_nsys_prefill_serial_agrees_with_the_kineto_truth(shared_data: Path) -> None:
    """Same workload profiled by nsys (both ranks in one file, one clock): same estimate within ±25%."""
    kineto = shared_data / "h200" / "kineto"
    slowest, _ = truth_delta_ms(kineto, "prefill_serial")
    s = _summary([shared_data / "h200" / "nsys" / "tp2_prefill_serial.sqlite"])
    assert s.cross_rank is not None and s.cross_rank.detail is not None and s.cross_rank.detail.clock_comparable is True
    assert s.what_if.basis == "gpu_transfer"
    assert abs(s.what_if.comm_free_step_saving_ns / 1e6 / slowest - 1) <= 0.25


def test_innermost_containing_range_per_thread() -> None:
    from traceanalyzer.analysis.host_issue import containing

    # thread 1: [0, 100) ⊃ [10, 90) ⊃ [20, 30), [40, 45); thread 2: [0, 1000)
    starts = np.array([0, 10, 20, 40, 0], dtype=np.int64)
    ends = np.array([100, 90, 30, 45, 1000], dtype=np.int64)
    threads = np.array([1, 1, 1, 1, 2], dtype=np.int64)
    t = np.array([25, 50, 95, 150, 150, 5, 42], dtype=np.int64)
    thread = np.array([1, 1, 1, 1, 2, 3, 1], dtype=np.int64)
    assert containing(starts, ends, threads, t, thread)[0].tolist() == [2, 1, 0, -1, 4, -1, 3]  # the innermost


def test_collectives_outside_every_step_do_not_break_the_estimate() -> None:
    kernels = [(0, 100, 0, 7, "gemm", "gemm", None, 1), (1_500, 1_600, 0, 7, NCCL, "communication", "all_reduce", 2)]
    outside = _rank(0, kernels, [(1_500, 100, 100, 2)])  # the only step is [0, 1000)
    w = estimate_comm_free([outside[0]], [outside[1]], None)
    assert w.comm_free_step_saving_ns is None and w.to_json()["steps_used"] == 0
    inside = _rank(1, [(0, 100, 0, 7, "gemm", "gemm", None, 1),
                       (500, 600, 0, 7, NCCL, "communication", "all_reduce", 2)], [(500, 100, 100, 2)])
    w = estimate_comm_free([outside[0], inside[0]], [outside[1], inside[1]], None)
    assert w.comm_free_step_saving_ns == 100 and "note" in w.to_json()["ranks"]["0"]


def test_project_fixture_prefill_serial_within_25_percent() -> None:
    """The project's own 2×H200 fixtures (another configuration of the same workload, fixtures/README.md):
    prefill_serial from Kineto and from nsys against its measured with/without-all-reduce step times."""
    from conftest import FIXTURES

    truth = FIXTURES / "truth"
    med = [json.loads((truth / f"prefill_serial{tag}_rank{r}.json").read_text())["step_ms_median"]
           for tag in ("", "_nocomm") for r in (0, 1)]
    slowest = max(med[:2]) - max(med[2:])
    kineto = _summary([FIXTURES / "kineto" / "tp2_prefill_serial" / f"rank{r}.json.gz" for r in (0, 1)])
    nsys = _summary([FIXTURES / "nsys" / "tp2_prefill_serial.sqlite"])
    for s in (kineto, nsys):
        assert s.what_if.basis == "gpu_transfer"
        assert abs(s.what_if.comm_free_step_saving_ns / 1e6 / slowest - 1) <= 0.25


def _fixture_truth_ms(mode: str) -> tuple[float, float]:
    """fixtures/truth: (slowest rank with − slowest rank without all-reduces, slowest no-comm step), ms."""
    from conftest import FIXTURES

    med = [json.loads((FIXTURES / "truth" / f"{mode}{tag}_rank{r}.json").read_text())["step_ms_median"]
           for tag in ("", "_nocomm") for r in (0, 1)]
    return max(med[:2]) - max(med[2:]), max(med[2:])


def _fixture_kineto(mode: str):  # type: ignore[no-untyped-def]
    from conftest import FIXTURES

    return _summary([FIXTURES / "kineto" / f"tp2_{mode}" / f"rank{r}.json.gz" for r in (0, 1)])


# Fixture cases the estimate misses against a separate-launch truth: the same kind of run timed with and without
# its all-reduces in one process (fixtures/truth/ab) is within ±25 %, its truth below the separate-launch one; the
# range holds the separate-launch truth (what each miss is made of: docs/METHOD_WHAT_IF.md).
_FIXTURE_MISSES = {"prefill_overlap": "prefill_overlap_a", "decode_eager": "decode_eager_a",
                   "decode_graphs": "decode_graphs_a"}


@pytest.mark.parametrize("mode", sorted(_FIXTURE_MISSES))
def test_project_fixture_misses_are_truth_spread_and_inside_the_range(mode: str) -> None:
    separate, _ = _fixture_truth_ms(mode)
    same_process, _ = _ab_truth_ms(_FIXTURE_MISSES[mode])
    w = _fixture_kineto(mode).what_if
    est = w.comm_free_step_saving_ns / 1e6
    assert abs(est / separate - 1) > 0.25  # the miss: −31 % / −46 % / −44 %
    low, high = (v / 1e6 for v in w.to_json()["range_ns"])
    assert low <= separate <= high and w.to_json()["confidence"] != "high"
    twin = _ab_kineto(_FIXTURE_MISSES[mode]).what_if.comm_free_step_saving_ns / 1e6
    assert abs(twin / same_process - 1) <= 0.25
    assert separate > same_process  # the separate-launch truth lies above the same-process one: 0.22 / 1.28 / 0.06


def _xfail_while_missed(case: str, est: float, truth: float, why: str, then: str) -> None:
    """xfail with the figures while the estimate misses ±25%; fail once it does not, so the case gets promoted."""
    if abs(est / truth - 1) > 0.25:
        pytest.xfail(f"{case}: estimate {est:.2f} vs measured {truth:.2f} ms ({why})")
    pytest.fail(f"{case} is now within ±25% ({est:.2f} vs {truth:.2f} ms): {then}")


def test_project_fixture_estimates_keep_their_direction_and_basis() -> None:
    """The misses err on the low side and keep their regime: host-bound eager decode, GPU-bound otherwise."""
    for mode, basis in (("prefill_overlap", "gpu_transfer"), ("decode_eager", "host_launch"),
                        ("decode_graphs", "gpu_transfer")):
        slowest, _ = _fixture_truth_ms(mode)
        w = _fixture_kineto(mode).what_if
        assert w.basis == basis, mode
        assert 0 < w.comm_free_step_saving_ns / 1e6 < slowest, mode


def _ab_truth_ms(run: str) -> tuple[float, list[float]]:
    """fixtures/truth/ab: rounds of timed steps with, then without the all-reduces in the same processes.
    (slowest rank's median with − slowest rank's median without, over all rounds; per-round differences), ms."""
    from conftest import FIXTURES

    if run.startswith("tp1_"):  # one GPU: truths under truth/ab/tp1/
        ranks = [json.loads((FIXTURES / "truth" / "ab" / "tp1" / f"{run[4:]}_rank0.json").read_text())["rounds"]]
    else:
        ranks = [json.loads((FIXTURES / "truth" / "ab" / f"{run}_rank{r}.json").read_text())["rounds"]
                 for r in (0, 1)]

    def slowest(key: str, rounds: slice = slice(None)) -> float:
        return max(statistics.median([t for rd in rr[rounds] for t in rd[key]]) for rr in ranks)

    per_round = [slowest("comm_step_ms", slice(i, i + 1)) - slowest("nocomm_step_ms", slice(i, i + 1))
                 for i in range(len(ranks[0]))]
    return slowest("comm_step_ms") - slowest("nocomm_step_ms"), per_round


def _ab_kineto(run: str):  # type: ignore[no-untyped-def]
    from conftest import FIXTURES

    if run.startswith("tp1_"):
        return _summary([FIXTURES / "kineto" / "ab" / run / "rank0.json.gz"])
    return _summary([FIXTURES / "kineto" / "ab" / f"tp2_{run}" / f"rank{r}.json.gz" for r in (0, 1)])


# Runs the estimate was never tuned on (made after it, examples/moe_tp.py --ab-rounds; fixtures/README.md). tp1_*:
# one GPU (world size 1), where the all-reduce calls launch no kernel and cost only host time.
AB_RUNS = {"prefill_serial_a": "gpu_transfer", "prefill_serial_b": "gpu_transfer",
           "prefill_overlap_a": "gpu_transfer", "decode_graphs_a": "gpu_transfer",
           "decode_eager_a": "host_launch", "decode_eager_b": "host_launch", "decode_eager_c": "host_launch",
           "decode_hostsync_d": "host_launch", "decode_hostsync_f": "host_launch",
           "tp1_decode_eager_c": "host_launch", "tp1_decode_hostsync_d": "host_launch",
           "tp1_decode_hostsync_e": "host_launch", "tp1_decode_hostsync_f": "host_launch"}
AB_MISSES = {  # strict: an improvement must move the run into AB_RUNS
    "decode_hostsync_e": "host work beyond the calls slows by 3.7 ms/step on rank 1, 0.45 ms of it right after them",
}
HOST_BOUND_RUNS = sorted(r for r, b in AB_RUNS.items() if b == "host_launch") + sorted(AB_MISSES)


@pytest.mark.parametrize("run", sorted(AB_RUNS))
def test_unseen_ab_runs_within_25_percent(run: str) -> None:
    truth, per_round = _ab_truth_ms(run)
    if AB_RUNS[run] == "gpu_transfer":
        assert max(per_round) - min(per_round) < 0.15 * truth  # the truth itself is steady for these
    w = _ab_kineto(run).what_if
    assert w.basis == AB_RUNS[run]
    assert abs(w.comm_free_step_saving_ns / 1e6 / truth - 1) <= 0.25, (w.comm_free_step_saving_ns, truth)


@pytest.mark.parametrize("run", sorted(AB_MISSES))
def test_unseen_ab_misses_stay_reported(run: str) -> None:
    truth, per_round = _ab_truth_ms(run)
    w = _ab_kineto(run).what_if
    assert w.basis == "host_launch" and 0 < w.comm_free_step_saving_ns / 1e6 < truth
    rounds = ", ".join(f"{d:.2f}" for d in per_round)
    _xfail_while_missed(run, w.comm_free_step_saving_ns / 1e6, truth, f"rounds {rounds}; {AB_MISSES[run]}",
                        "move it to AB_RUNS")


@pytest.mark.parametrize("run", HOST_BOUND_RUNS)
def test_nccl_issue_alone_reaches_a_fraction_of_the_host_bound_cost(run: str) -> None:
    """Counting only NCCL's own issue range of each call (``issue_only_saving_ns``, the estimate before the whole
    call was counted) gives 22–47 % of the measured cost on these runs."""
    truth, _ = _ab_truth_ms(run)
    w = _ab_kineto(run).what_if
    issue_only = w.to_json()["issue_only_saving_ns"] / 1e6
    assert issue_only < w.comm_free_step_saving_ns / 1e6
    assert 0.2 < issue_only / truth < 0.5, (issue_only, truth)


@pytest.mark.parametrize("run", [r for r in HOST_BOUND_RUNS if r.startswith("tp1_")])
def test_calls_without_kernels_count_as_host_time(run: str) -> None:
    """World size 1: NCCL launches nothing, yet each call holds the host ~0.12 ms (0.10–0.12 ms unprofiled)."""
    w = _ab_kineto(run).what_if
    r0 = w.to_json()["ranks"]["0"]
    assert r0["calls_without_kernels"] > 0 and r0["exposed_ns"] == 0
    assert r0["collectives_per_step"] == (8 if "eager" in run else 32)
    assert 0.1e6 < r0["host_issue_ns"] / r0["collectives_per_step"] < 0.16e6
    assert 0.03e6 < r0["host_nccl_issue_ns"] / r0["collectives_per_step"] < 0.05e6


def test_profiled_step_minus_estimate_is_the_measured_no_comm_step(shared_data: Path) -> None:
    """GPU-bound runs with little profiler overhead: profiled step − estimate must match the step measured without
    all-reduces (±5%). This holds even where the profiled run itself differs from the timed run with
    all-reduces (shared nsys prefill_overlap: profiled 28.5 ms, timed 30.6 ms), which is why that case misses
    the ±25% target on the with − without difference."""
    import lzma
    import shutil
    import tempfile

    from conftest import FIXTURES

    kineto = shared_data / "h200" / "kineto"
    shared_nocomm = {c: max(json.loads((kineto / CASES[c][1].format(r)).read_text())["step_ms_median"]
                            for r in (0, 1)) for c in ("prefill_overlap", "prefill_serial", "nop2p_prefill_serial")}
    with tempfile.TemporaryDirectory() as tmp:
        unpacked = Path(tmp) / "tp2_prefill_overlap.sqlite"
        with lzma.open(FIXTURES / "nsys" / "tp2_prefill_overlap.sqlite.xz") as src, unpacked.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        cases = [
            ([shared_data / "h200" / "nsys" / "tp2_prefill_overlap.sqlite"], shared_nocomm["prefill_overlap"]),
            ([shared_data / "h200" / "nsys" / "tp2_prefill_serial.sqlite"], shared_nocomm["prefill_serial"]),
            ([kineto / f"nop2p_prefill_serial_rank{r}.json.gz" for r in (0, 1)],
             shared_nocomm["nop2p_prefill_serial"]),
            ([FIXTURES / "kineto" / "tp2_prefill_overlap" / f"rank{r}.json.gz" for r in (0, 1)],
             _fixture_truth_ms("prefill_overlap")[1]),
            ([unpacked], _fixture_truth_ms("prefill_overlap")[1]),
            ([FIXTURES / "kineto" / "tp2_prefill_serial" / f"rank{r}.json.gz" for r in (0, 1)],
             _fixture_truth_ms("prefill_serial")[1]),
        ]
        for files, nocomm in cases:
            s = _summary(files)
            profiled = max(d.step_ns_median for d in s.devices if d.step_ns_median) / 1e6
            comm_free = profiled - s.what_if.comm_free_step_saving_ns / 1e6
            assert abs(comm_free / nocomm - 1) <= 0.05, (files[0].name, comm_free, nocomm)


def _validated_cases(shared: Path | None, unpacked: Path) -> list[tuple[str, list[Path], float]]:
    """Every run with a measured cost (ms/step): shared (when present), fixtures, fixtures/ab."""
    from conftest import FIXTURES

    cases = []
    if shared is not None:
        kineto = shared / "h200" / "kineto"
        for case in ("prefill_serial", "nop2p_prefill_serial", "prefill_overlap"):
            cases.append((case, [kineto / f"{case}_rank{r}.json.gz" for r in (0, 1)], truth_delta_ms(kineto, case)[0]))
        for case in ("prefill_serial", "prefill_overlap"):
            cases.append((f"nsys {case}", [shared / "h200" / "nsys" / f"tp2_{case}.sqlite"],
                          truth_delta_ms(kineto, case)[0]))
    for mode in ("prefill_serial", "prefill_overlap", "decode_eager", "decode_graphs"):
        cases.append((f"fixture {mode}", [FIXTURES / "kineto" / f"tp2_{mode}" / f"rank{r}.json.gz" for r in (0, 1)],
                      _fixture_truth_ms(mode)[0]))
    cases.append(("fixture nsys prefill_overlap", [unpacked], _fixture_truth_ms("prefill_overlap")[0]))
    for run in sorted(AB_RUNS) + sorted(AB_MISSES):
        files = [FIXTURES / "kineto" / "ab" / run / "rank0.json.gz"] if run.startswith("tp1_") else \
            [FIXTURES / "kineto" / "ab" / f"tp2_{run}" / f"rank{r}.json.gz" for r in (0, 1)]
        cases.append((f"ab {run}", files, _ab_truth_ms(run)[0]))
    return cases


def test_range_holds_the_measured_cost_on_every_validated_case(tmp_path: Path) -> None:
    """range_ns holds the measured cost of every run timed with and without its all-reduces (24 with ../shared,
    19 without), the estimate inside it, each end named."""
    import lzma
    import shutil

    from conftest import FIXTURES, SHARED

    shared = SHARED if SHARED.is_dir() else None
    readings = {"estimate", "gpu_transfer", "host_calls", "host_as_profiled", "host_slowdown", "gpu_not_computing"}
    unpacked = tmp_path / "tp2_prefill_overlap.sqlite"
    with lzma.open(FIXTURES / "nsys" / "tp2_prefill_overlap.sqlite.xz") as src, unpacked.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    for name, files, truth in _validated_cases(shared, unpacked):
        w = _summary(files).what_if
        low, high = w.to_json()["range_ns"]
        assert low <= truth * 1e6 <= high, (name, low, truth, high)
        assert low <= w.comm_free_step_saving_ns <= high and set(w.to_json()["range_basis"]) <= readings
        assert w.to_json()["confidence"] in ("high", "medium", "low")


def test_profiler_weighing_on_real_runs(shared_data: Path) -> None:
    """Shared Kineto prefill runs, profiled 26.7 / 37.7 ms against 24.8 / 30.6 ms unprofiled: ranks whose GPU idle
    time the profiler's recorded host events come close to explaining are weighed toward their GPU reading
    (prefill_serial 2.23 → 2.16, prefill_overlap 5.19 → 4.82 against 2.01 / 5.40 measured); host-bound eager
    decodes, idle ≥ 2.8 × the profiler's time, are not weighed."""
    kineto = shared_data / "h200" / "kineto"
    for case, basis in (("prefill_serial", "gpu_transfer"), ("prefill_overlap", "mixed")):
        truth, _ = truth_delta_ms(kineto, case)
        est, w = _kineto_estimate_ms(kineto, case)
        weighed = [r for r in w.to_json()["ranks"].values() if r["gpu_weight"] > 0]
        assert weighed and all(r["own_ns"] < r["as_profiled_ns"] for r in weighed)
        assert w.basis == basis and w.to_json()["confidence"] == "low" and w.to_json()["profiler_weighed_steps"] > 0
        assert abs(est / truth - 1) <= 0.25, (case, est, truth)
    for run in ("decode_eager_a", "decode_hostsync_d", "tp1_decode_hostsync_d"):
        assert _ab_kineto(run).what_if.to_json()["profiler_weighed_steps"] == 0
