"""Hand-made results and synthetic traces for the report tests (names include hostile HTML on purpose)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from traceanalyzer.analysis.results import (
    CrossRankSummary,
    DeviceSummary,
    Finding,
    Summary,
    TraceMeta,
    WhatIf,
)
from traceanalyzer.model.trace import Trace
from traceanalyzer.testing.synth import make_trace

HOSTILE = ("<script>alert(1)</script>", "\"><img src=x onerror=alert(1)>", "</script><script>alert(2)</script>")
STEP_NS = 10_000
N_STEPS = 3


def step_kernels(device: int, hostile: bool = False) -> list[tuple]:
    """Three 10 µs steps: gemm 0-4 µs, comm 4-7 µs (1 µs hidden under attention 4-5 µs), other 7-8 µs."""
    gemm = HOSTILE[0] if hostile else "sm90_xmma_gemm_bf16"
    attn = HOSTILE[1] if hostile else "flash_fwd_kernel"
    comm = HOSTILE[2] if hostile else "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    rows = []
    for s in range(N_STEPS):
        t0 = s * STEP_NS
        rows += [(t0, t0 + 4000, device, 7, gemm, "gemm"),
                 (t0 + 4000, t0 + 5000, device, 7, attn, "attention"),
                 (t0 + 4000, t0 + 7000, device, 20, comm, "communication"),
                 (t0 + 7000, t0 + 8000, device, 7, "rms_norm_kernel", "other")]
    return rows


def make_traces(hostile: bool = False) -> list[Trace]:
    """Two ranks, one GPU each, with ProfilerStep and layer ranges."""
    traces = []
    for rank in (0, 1):
        ranges = [(s * STEP_NS, (s + 1) * STEP_NS, "profiler_step", f"ProfilerStep#{s}") for s in range(N_STEPS)]
        ranges += [(s * STEP_NS, s * STEP_NS + 8000, "nvtx", HOSTILE[0] if hostile else "layer_0")
                   for s in range(N_STEPS)]
        name = f"{HOSTILE[1]}_rank{rank}.json" if hostile else f"run_rank{rank}.json"
        traces.append(make_trace(step_kernels(rank, hostile), ranges=ranges, rank=rank, path=name,
                                 device_names={rank: "NVIDIA H200"}))
    return traces


def _device(trace: Trace, rank: int, hostile: bool) -> DeviceSummary:
    layer = HOSTILE[0] if hostile else "layer_0"
    starts = np.arange(N_STEPS) * STEP_NS
    per_step = pd.DataFrame({"step": np.arange(N_STEPS), "start_ns": starts, "end_ns": starts + STEP_NS,
                             "duration_ns": STEP_NS, "busy_ns": 8000, "idle_ns": 2000, "comm_ns": 3000,
                             "comm_hidden_ns": 1000, "comm_exposed_ns": 2000})
    per_layer = pd.DataFrame({"step": np.arange(N_STEPS), "layer": 0, "name": layer, "start_ns": starts,
                              "end_ns": starts + 8000, "duration_ns": 8000, "comm_ns": 3000,
                              "comm_exposed_ns": 2000, "compute_ns": 6000})
    coll_name = HOSTILE[2] if hostile else "allreduce"
    collectives = pd.DataFrame({"name": [coll_name] * N_STEPS, "start_ns": starts + 4000,
                                "end_ns": starts + 7000, "duration_ns": 3000, "exposed_ns": 2000,
                                "hidden_ns": 1000})
    gaps = pd.DataFrame({"start_ns": starts + 5000, "end_ns": starts + 7000, "duration_ns": 2000,
                         "step": np.arange(N_STEPS), "layer": 0})
    kernel_name = HOSTILE[0] if hostile else "sm90_xmma_gemm_bf16"
    top = pd.DataFrame({"bucket": ["gemm", "communication"], "subbucket": ["dense", "allreduce"],
                        "name": [kernel_name, "ncclDevKernel_AllReduce"],
                        "rule": ["cublas", "nccl"], "count": [3, 3], "total_ns": [12000, 9000],
                        "mean_ns": [4000.0, 3000.0], "p50_ns": [4000.0, 3000.0], "p99_ns": [4000.0, 3000.0]})
    return DeviceSummary(
        rank=rank, device=rank, name="NVIDIA H200", trace=trace.path, span_ns=28000, busy_ns=24000,
        idle_ns=4000, bucket_ns={"gemm": 12000, "attention": 3000, "communication": 9000, "other": 3000},
        bucket_exclusive_ns={"gemm": 12000, "attention": 3000, "communication": 6000, "other": 3000},
        comm_ns=9000, comm_hidden_ns=3000, comm_exposed_ns=6000, overlap_pct=100 * 3000 / 9000, steps=N_STEPS,
        step_ns_median=STEP_NS, comm_exposed_per_step_ns=2000, step_source="profiler_step",
        layer_source="nvtx:layer ranges", comm_streams=[20], compute_streams=[7], per_step=per_step,
        per_layer=per_layer, collectives=collectives, top_kernels=top, comm_idle_gaps_ns=gaps)


def make_summary(traces: list[Trace], hostile: bool = False) -> Summary:
    """A Summary consistent with :func:`make_traces` (numbers worked out by hand)."""
    metas = [TraceMeta(path=t.path, format=t.format, tool_version="2.11.0", schema_version=None, ranks=[i],
                       devices=[{"device": i, "name": "NVIDIA H200", "rank": i}], window_ns=(0, 28000),
                       warnings=[HOSTILE[1]] if hostile else [])
             for i, t in enumerate(traces)]
    devices = [_device(t, i, hostile) for i, t in enumerate(traces)]
    title = HOSTILE[0] if hostile else "All-reduce blocks compute"
    findings = [
        Finding(id="small", title="Launch gaps", impact_ns_per_step=500, evidence={"gaps": 3}),
        Finding(id="exposed_comm", title=title, impact_ns_per_step=2000,
                evidence={"kernel": HOSTILE[2] if hostile else "nccl"}, severity="high",
                recommendation="Overlap the all-reduce with the next layer's compute."),
    ]
    cross = CrossRankSummary(collectives_matched=3, wait_ns_by_rank={0: 1500, 1: 300}, transfer_ns_per_step=1500,
                             straggler_rank=1, match_method="order per process group")
    power = {"log": "power_log.csv", "assumed_timezone": "UTC", "matched": True,
             "gpus": [{"gpu": 0, "samples": 5, "power_mean_w": 301.5, "power_max_w": 340.0,
                       "power_limit_w": 700.0, "power_mean_pct_of_limit": 43.07}]}
    metrics = pd.DataFrame({"device": [0, 0], "metric": ["SMs Active [Throughput %]"] * 2,
                            "phase": ["all", "comm_exposed"], "mean": [61.0, 3.5]})
    return Summary(traces=metas, devices=devices, cross_rank=cross,
                   what_if=WhatIf(comm_free_step_saving_ns=2000, basis="gpu_transfer"), findings=findings,
                   gpu_metrics=metrics, power=power, warnings=["synthetic data"])
