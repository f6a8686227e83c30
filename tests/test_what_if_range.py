"""The what-if's range and confidence, and the weighing of a rank the profiler made launch-bound: a hand-built
timeline with exact answers (how much of its GPU idle time the profiler's recorded host events explain)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from traceanalyzer.analysis.results import DeviceSummary
from traceanalyzer.analysis.what_if import range as what_if
from traceanalyzer.analysis.what_if.comm_free import estimate_comm_free
from traceanalyzer.testing.synth import make_trace

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
US = 1_000


def _rank(extra_ops: int, rank: int = 0):  # type: ignore[no-untyped-def]
    """One 100 µs step. gemm_a [0, 20) queued long before; the all-reduce [32, 42) µs, launched at 30–31 µs inside
    the whole call c10d::allreduce_ [20, 45) (25 µs); gemm_b [62, 100), launched at 60–61. The GPU idles 12 µs
    before the all-reduce and 20 µs after it (both waiting for launches): idle 32 µs. As profiled the host reading
    wins: min(25, 20 µs waited after the call) = 20 µs against the GPU's 10 µs exposed transfer. Host events the
    profiler records in the step: 2 launches + the call + ``extra_ops`` aten ops, each ``PROFILER_NS_PER_EVENT``."""
    kernels = [(0, 20 * US, 0, 7, "gemm_a", "gemm", None, 1),
               (32 * US, 42 * US, 0, 7, NCCL, "communication", "all_reduce", 2),
               (62 * US, 100 * US, 0, 7, "gemm_b", "gemm", None, 3)]
    api = [(-90 * US, -89 * US, 1), (30 * US, 31 * US, 2, "cuLaunchKernelEx"), (60 * US, 61 * US, 3)]
    ranges = [(20 * US, 45 * US, "cpu_op", "c10d::allreduce_")]
    ranges += [(46 * US + 500 * i, 46 * US + 500 * i + 100, "cpu_op", f"aten::op{i}") for i in range(extra_ops)]
    path = f"rank{rank}.json"
    trace = replace(make_trace(kernels, api_calls=api, ranges=ranges, rank=rank, path=path), base_time_ns=0)
    win = pd.DataFrame({"step": [1], "start_ns": [0], "end_ns": [100 * US], "duration_ns": [100 * US],
                        "idle_ns": [32 * US], "comm_exposed_ns": [10 * US]})
    coll = pd.DataFrame({"start_ns": [32 * US], "end_ns": [42 * US], "duration_ns": [10 * US], "kind": "allreduce",
                         "step": [1], "seq": -1, "bytes": -1, "group_size": 2, "exposed_ns": [10 * US],
                         "correlation": [2]})
    dev = DeviceSummary(rank=rank, device=0, name=None, trace=path, span_ns=0, busy_ns=0, idle_ns=0,
                        bucket_ns={}, bucket_exclusive_ns={}, comm_ns=0, comm_hidden_ns=0, comm_exposed_ns=0,
                        overlap_pct=None, steps=1, step_ns_median=None, comm_exposed_per_step_ns=None,
                        per_step=win, collectives=coll)
    return trace, dev


def _what_if(extra_ops: int):  # type: ignore[no-untyped-def]
    trace, dev = _rank(extra_ops)
    return estimate_comm_free([trace], [dev], None)


def test_idle_explained_by_the_profiler_takes_the_gpu_reading() -> None:
    # 16 events × 2 µs = 32 µs: the profiler explains all 32 µs of idle → the GPU reading alone
    assert what_if.PROFILER_NS_PER_EVENT == 2 * US and what_if.MARGINAL_RATIO == (1.0, 1.5)
    w = _what_if(13)
    r0 = w.to_json()["ranks"]["0"]
    assert r0["profiler_ns"] == 32 * US and r0["idle_ns"] == 32 * US and r0["gpu_weight"] == 1.0
    assert r0["as_profiled_ns"] == 20 * US and r0["gpu_reading_ns"] == 10 * US
    assert w.comm_free_step_saving_ns == 10 * US and w.basis == "gpu_transfer"
    # low: the GPU reading −10 %; high: the host reading as profiled +10 % (no idle left for a slowdown)
    assert w.to_json()["range_ns"] == [9 * US, 22 * US]
    assert w.to_json()["range_basis"] == ["gpu_transfer", "host_as_profiled"]
    assert w.to_json()["confidence"] == "low" and w.to_json()["profiler_weighed_steps"] == 1


def test_idle_well_beyond_the_profiler_keeps_the_host_reading() -> None:
    # 9 events: 18 µs of profiler time against 32 µs idle (ratio 1.8 ≥ 1.5) → the host reading as profiled
    w = _what_if(6)
    assert w.to_json()["ranks"]["0"]["gpu_weight"] == 0.0
    assert w.comm_free_step_saving_ns == 20 * US and w.basis == "host_launch"
    assert w.to_json()["range_ns"] == [18 * US, 22 * US]
    assert w.to_json()["range_basis"] == ["host_calls", "host_as_profiled"]
    assert w.to_json()["confidence"] == "high" and w.to_json()["profiler_weighed_steps"] == 0


def test_partly_explained_idle_weighs_the_two_readings_linearly() -> None:
    # 13 events: 26 µs → ratio 32/26 = 1.231 → GPU weight (1.5 − 1.231) / 0.5 = 0.538 → 20 − 0.538 × 10 µs
    w = _what_if(10)
    weight = (what_if.MARGINAL_RATIO[1] - 32 / 26) / (what_if.MARGINAL_RATIO[1] - what_if.MARGINAL_RATIO[0])
    assert w.to_json()["ranks"]["0"]["gpu_weight"] == round(weight, 2)
    assert w.comm_free_step_saving_ns == round(20 * US - weight * 10 * US)
    low, high = w.to_json()["range_ns"]
    assert low == int(10 * US * (1 - what_if.RESOLUTION_SHARE)) and high == pytest.approx(22 * US)
    assert low <= w.comm_free_step_saving_ns <= high and w.to_json()["confidence"] == "low"


def test_gpu_bound_range_reaches_the_time_not_spent_computing() -> None:
    # gemm | all-reduce 200 | gemm, all queued: transfer 200 exposed; the step's idle + exposed is the ceiling
    kernels = [(0, 400, 0, 7, "gemm_a", "gemm", None, 1), (400, 600, 0, 7, NCCL, "communication", "all_reduce", 2),
               (650, 1_000, 0, 7, "gemm_b", "gemm", None, 3)]
    api = [(-90_000, -89_000, i) for i in (1, 2, 3)]
    trace = replace(make_trace(kernels, api_calls=api, path="r.json"), base_time_ns=0)
    win = pd.DataFrame({"step": [1], "start_ns": [0], "end_ns": [1_000], "duration_ns": [1_000], "idle_ns": [50],
                        "comm_exposed_ns": [200]})
    coll = pd.DataFrame({"start_ns": [400], "end_ns": [600], "duration_ns": [200], "kind": "allreduce", "step": [1],
                         "seq": -1, "bytes": -1, "group_size": 2, "exposed_ns": [200], "correlation": [2]})
    dev = DeviceSummary(rank=0, device=0, name=None, trace="r.json", span_ns=0, busy_ns=0, idle_ns=0,
                        bucket_ns={}, bucket_exclusive_ns={}, comm_ns=0, comm_hidden_ns=0, comm_exposed_ns=0,
                        overlap_pct=None, steps=1, step_ns_median=None, comm_exposed_per_step_ns=None,
                        per_step=win, collectives=coll)
    w = estimate_comm_free([trace], [dev], None)
    # the 200 ns transfer (the 50 ns gap after it is the device's usual gap: no dependency latency); high: idle 50
    # + exposed 200
    assert w.basis == "gpu_transfer" and w.comm_free_step_saving_ns == 200
    assert w.to_json()["range_basis"] == ["estimate", "gpu_not_computing"]
    assert w.to_json()["range_ns"] == [180, int(np.ceil(250 * 1.1))]
    assert w.to_json()["confidence"] == "medium"  # 275 > 1.5 × 180


def test_summary_json_carries_the_range(capsys: pytest.CaptureFixture[str]) -> None:
    import json
    from pathlib import Path

    from traceanalyzer.cli import main

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "kineto" / "tp2_decode_graphs"
    assert main(["summary", str(fixture), "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    low, high = w["range_ns"]
    assert isinstance(low, int) and isinstance(high, int) and low <= w["comm_free_step_saving_ns"] <= high
    assert len(w["range_basis"]) == 2 and w["confidence"] in ("high", "medium", "low")
