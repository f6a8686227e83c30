"""Finding rules on hand-built summaries and synthetic traces with hand-computable answers."""

from __future__ import annotations

import pandas as pd

from traceanalyzer.analysis.results import CrossRankSummary, DeviceSummary, Summary, WhatIf
from traceanalyzer.findings import FindingOptions, run_findings
from traceanalyzer.findings.context import FindingThresholds
from traceanalyzer.testing.synth import make_trace

MS = 1_000_000


def _dev(trace_path: str = "synthetic.json", **kw) -> DeviceSummary:
    base = dict(rank=0, device=0, name="NVIDIA H200", trace=trace_path, span_ns=100 * MS, busy_ns=90 * MS,
                idle_ns=10 * MS, bucket_ns={}, bucket_exclusive_ns={}, comm_ns=20 * MS, comm_hidden_ns=0,
                comm_exposed_ns=20 * MS, overlap_pct=0.0, steps=4, step_ns_median=25 * MS,
                comm_exposed_per_step_ns=5 * MS)
    base.update(kw)
    return DeviceSummary(**base)


def _summary(devs, traces=(), cross=None, what_if=None, power=None) -> Summary:
    return Summary(traces=[], devices=list(devs), cross_rank=cross,
                   what_if=what_if or WhatIf(None, "gpu_transfer"), power=power)


def _ids(findings) -> list[str]:
    return [f.id for f in findings]


def test_serialized_comm_fires_with_what_if_impact_and_not_when_overlapped():
    dev = _dev(comm_serialized_with_compute=True, comm_streams=[7], compute_streams=[7],
               collectives=pd.DataFrame({"kind": ["allreduce"] * 8}))
    found = run_findings([], _summary([dev], what_if=WhatIf(2_300_000, "gpu_transfer")))
    serial = next(f for f in found if f.id == "comm_serialized_with_compute")
    assert serial.impact_ns_per_step == 2_300_000
    assert serial.evidence["collectives_per_step"] == {"allreduce": 2}
    overlapped = _dev(comm_serialized_with_compute=False, comm_hidden_ns=15 * MS, comm_exposed_ns=5 * MS,
                      overlap_pct=75.0, comm_exposed_per_step_ns=1_250_000)
    assert "comm_serialized_with_compute" not in _ids(run_findings([], _summary([overlapped])))


def test_exposed_comm_threshold_and_sorting():
    dev = _dev(comm_exposed_per_step_ns=5 * MS)  # 20% of a 25 ms step
    found = run_findings([], _summary([dev]))
    assert found[0].id == "exposed_communication"
    assert found[0].impact_ns_per_step == 5 * MS and round(found[0].impact_pct_of_step) == 20
    quiet = _dev(comm_exposed_per_step_ns=100_000)  # 0.4% of a step
    assert "exposed_communication" not in _ids(run_findings([], _summary([quiet])))


def test_allreduce_followed_by_norm_is_reported_unfused():
    kernels = []
    for step in range(2):
        t0 = step * 1000
        kernels += [(t0, t0 + 100, 0, 7, "nvjet_gemm", "gemm", "dense"),
                    (t0 + 100, t0 + 300, 0, 7, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication",
                     "allreduce"),
                    (t0 + 310, t0 + 330, 0, 7, "vectorized_elementwise_kernel<add>", "other", "elementwise"),
                    (t0 + 335, t0 + 360, 0, 7, "rms_norm_kernel", "other", "norm"),
                    (t0 + 360, t0 + 900, 0, 7, "nvjet_gemm", "gemm", "dense")]
    trace = make_trace(kernels)
    dev = _dev(trace_path=trace.path, steps=2, step_ns_median=1000, span_ns=2000, comm_exposed_per_step_ns=200)
    finding = next(f for f in run_findings([trace], _summary([dev])) if f.id == "allreduce_not_fused")
    assert finding.evidence["pairs"] == 2
    assert finding.impact_ns_per_step == 60  # all-reduce end 300 → norm end 360, per step
    fused = make_trace([k for k in kernels if k[5] != "other"])
    assert "allreduce_not_fused" not in _ids(run_findings([fused], _summary([dev])))


def test_host_bound_fires_without_graphs_and_not_with_graphs():
    kernels = [(i * 100, i * 100 + 20, 0, 7, "small_kernel", "other", "elementwise", i) for i in range(40)]
    eager = make_trace(kernels, api_calls=[(i * 100 - 50, i * 100 - 40, i, "cudaLaunchKernel") for i in range(40)])
    dev = _dev(trace_path=eager.path, span_ns=3920, busy_ns=800, idle_ns=3120, steps=1, step_ns_median=3920,
               comm_ns=0, comm_exposed_ns=0, comm_exposed_per_step_ns=0)
    found = run_findings([eager], _summary([dev]))
    host = next(f for f in found if f.id == "host_bound_no_cuda_graphs")
    assert host.impact_ns_per_step == 3120
    graphs = make_trace(kernels, api_calls=[(i * 100 - 50, i * 100 - 40, i, "cudaGraphLaunch") for i in range(40)])
    assert "host_bound_no_cuda_graphs" not in _ids(run_findings([graphs], _summary([dev])))


def test_idle_gap_with_host_sync_is_attributed():
    kernels = [(0, 1_000, 0, 7, "k", "gemm", "dense", 1), (3_000_000, 3_001_000, 0, 7, "k", "gemm", "dense", 2)]
    trace = make_trace(kernels, api_calls=[(1_500, 2_900_000, 99, "cudaStreamSynchronize")])
    dev = _dev(trace_path=trace.path, span_ns=3_001_000, steps=1, step_ns_median=3_001_000, comm_ns=0,
               comm_exposed_ns=0, comm_exposed_per_step_ns=0)
    finding = next(f for f in run_findings([trace], _summary([dev])) if f.id == "idle_gaps_host_cause")
    assert finding.impact_ns_per_step == 2_999_000
    assert finding.evidence["host_calls"] == {"cudaStreamSynchronize": 1}


def test_straggler_wait_reports_waiting_rank():
    devs = [_dev(rank=0), _dev(rank=1)]
    cross = CrossRankSummary(collectives_matched=8, wait_ns_by_rank={0: 8 * MS, 1: 0}, transfer_ns_per_step=MS,
                             straggler_rank=1)
    finding = next(f for f in run_findings([], _summary(devs, cross=cross)) if f.id == "straggler_wait")
    assert finding.impact_ns_per_step == 2 * MS and "Rank 0" in finding.title and "rank 1" in finding.title


def test_power_underuse_and_disabled_rules():
    power = {"gpus": [{"gpu": 0, "power_mean_w": 175.0, "power_limit_w": 700.0,
                       "power_mean_pct_of_limit": 25.0}]}
    found = run_findings([], _summary([_dev()], power=power))
    assert "gpu_power_underuse" in _ids(found)
    opts = FindingOptions(thresholds=FindingThresholds(), disabled=frozenset({"gpu_power_underuse"}))
    assert "gpu_power_underuse" not in _ids(run_findings([], _summary([_dev()], power=power), opts))
