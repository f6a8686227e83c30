"""Findings about the host side: launch-bound GPUs without CUDA graphs, idle gaps caused by synchronization."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..analysis.activity import DeviceActivity, gather
from ..analysis.host_issue import host_only_in_steps
from ..analysis.intervals import clip_to_windows, gaps, union
from ..analysis.results import DeviceSummary, Finding
from ..api_names import GRAPH_LAUNCH, HOST_BLOCKING
from ..trace import Trace
from .context import (
    FindingContext,
    count_per_step,
    kernel_mask,
    kinds_text,
    ms,
    per_step_median,
    severity,
    step_index,
    step_windows,
)


def _names_matching(trace: Trace, ids: np.ndarray, pattern: re.Pattern[str]) -> np.ndarray:
    """Boolean mask of rows whose string id matches ``pattern`` (regex run once per unique id)."""
    if not len(ids):
        return np.zeros(0, dtype=bool)
    valid = ids >= 0
    distinct = np.unique(ids[valid])  # no inverse: a lookup table by id replaces it (no sort of all rows)
    hit = np.zeros(int(distinct[-1]) + 1 if len(distinct) else 1, dtype=bool)
    hit[distinct] = [bool(pattern.search(trace.strings[u])) for u in distinct.tolist()]
    return valid & hit[np.where(valid, ids, 0)]


def graph_launched_fraction(trace: Trace, dev: DeviceSummary) -> float:
    """Share of the device's kernels that came from CUDA graphs (graph id, or launched by cudaGraphLaunch)."""
    k = trace.kernels
    mask = kernel_mask(trace, dev)
    n = int(mask.sum())
    if n == 0:
        return 0.0
    from_graph = k["graph_id"][mask] >= 0
    a = trace.api_calls
    if len(a):
        launches = _names_matching(trace, a["name_id"], GRAPH_LAUNCH)
        if launches.any():
            graph_corr = np.unique(a["correlation"][launches & (a["pid"] == _pid_of(trace, dev))])
            from_graph |= np.isin(k["correlation"][mask], graph_corr)
    g = trace.graph_launches
    graph_time = 0 if not len(g) else int((g["end_ns"] - g["start_ns"])[g["device"] == dev.device].sum())
    kernel_time = int((k["end_ns"] - k["start_ns"])[mask].sum())
    frac = float(from_graph.mean())
    if graph_time:
        frac = max(frac, graph_time / max(graph_time + kernel_time, 1))
    return frac


def _pid_of(trace: Trace, dev: DeviceSummary) -> int:
    k = trace.kernels
    pids = k["pid"][kernel_mask(trace, dev)]
    return int(np.bincount(pids - pids.min()).argmax() + pids.min()) if len(pids) else -1


def host_bound_no_cuda_graphs(ctx: FindingContext) -> list[Finding]:
    """GPU idle between short kernels while the host launches them one by one (no CUDA graphs).

    Impact: the median per step of the GPU idle time in gaps shorter than ``long_gap_min_ns`` (launch gaps; longer
    gaps are host stalls, see idle_gaps_host_cause) — an upper bound of what CUDA graphs recover."""
    t = ctx.thresholds
    found = []
    for dev in ctx.summary.devices:
        trace = ctx.trace_of(dev)
        if trace is None or dev.span_ns <= 0:
            continue
        idle_per_step, idle_pct = _launch_idle_per_step(ctx, trace, dev)
        k = trace.kernels
        mask = kernel_mask(trace, dev, in_steps=True)
        durations = (k["end_ns"] - k["start_ns"])[mask]
        median_kernel = int(np.median(durations)) if len(durations) else 0
        graphs = graph_launched_fraction(trace, dev)
        kernels_per_step = per_step_median(ctx.steps(dev), step_index(dev, k["start_ns"][mask]),
                                           np.ones(int(mask.sum())))
        if (idle_pct < t.host_bound_idle_min_pct or median_kernel > t.host_bound_kernel_max_ns
                or kernels_per_step < t.host_bound_min_kernels_per_step
                or graphs > t.graph_launched_max_fraction or not ctx.worth_reporting(dev, idle_per_step)):
            continue
        found.append(Finding(
            id="host_bound_no_cuda_graphs",
            title=f"GPU is host-bound on rank {dev.rank}: idle {ms(idle_per_step)} ({idle_pct:.0f}%) of each step in "
                  f"launch gaps between {kernels_per_step} short kernels (median {ms(median_kernel)}) launched one "
                  "by one without CUDA graphs",
            impact_ns_per_step=int(idle_per_step), impact_pct_of_step=idle_pct, severity=severity(idle_pct),
            recommendation="Capture the step in CUDA graphs (torch.cuda.graphs / torch.compile mode="
                           "'reduce-overhead', vLLM/SGLang cuda graph capture), fuse small kernels, cut Python "
                           "overhead on the launch path.",
            evidence={"rank": dev.rank, "device": dev.device, "idle_pct_of_step": round(idle_pct, 1),
                      "kernels_per_step": kernels_per_step, "median_kernel_ns": median_kernel,
                      "graph_launched_fraction": round(graphs, 3), "steps": ctx.steps(dev)},
        ))
    return [max(found, key=lambda f: f.impact_ns_per_step or 0)] if found else []


def _device_gaps(trace: Trace, dev: DeviceSummary) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPU idle gaps of the device (between kernels / memory operations) cut to the step windows:
    (starts, ends, step window index)."""
    k, m = trace.kernels, trace.memops
    kmask = kernel_mask(trace, dev)
    mmask = m["device"] == dev.device
    if dev.rank >= 0:
        mmask &= m["rank"] == dev.rank
    s, e = union(np.concatenate([k["start_ns"][kmask], m["start_ns"][mmask]]),
                 np.concatenate([k["end_ns"][kmask], m["end_ns"][mmask]]))
    ws, we = step_windows(dev)
    order = np.argsort(ws, kind="stable")
    lo, hi = (int(s[0]), int(e[-1])) if len(s) else (0, 0)
    gs, ge = gaps((s, e), min(lo, int(ws.min())), max(hi, int(we.max())))
    gap_start, gap_end, window, _ = clip_to_windows(gs, ge, ws[order], we[order])
    return gap_start, gap_end, order[window]


def _launch_idle_per_step(ctx: FindingContext, trace: Trace, dev: DeviceSummary) -> tuple[int, float]:
    """(median per step of the idle time in gaps shorter than ``long_gap_min_ns``, its % of the step): the launch
    gaps between kernels; longer gaps are the host blocked or busy elsewhere (see idle_gaps_host_cause)."""
    gs, ge, window = _device_gaps(trace, dev)
    short = (ge - gs) < ctx.thresholds.long_gap_min_ns
    idle = per_step_median(ctx.steps(dev), window[short], (ge - gs)[short])
    return idle, ctx.pct_of_step(dev, idle) or 0.0


def idle_gaps_host_cause(ctx: FindingContext) -> list[Finding]:
    """Long GPU idle gaps inside steps during which the host was blocked in a synchronization / blocking call.

    Impact: the gap time inside step windows, summed over the steps and divided by their number (mean per step:
    a host sync may hit only some steps)."""
    found = []
    min_gap = ctx.thresholds.long_gap_min_ns
    for dev in ctx.summary.devices:
        trace = ctx.trace_of(dev)
        if trace is None:
            continue
        result = _gaps_with_cause(trace, dev, min_gap)
        if result is None:
            continue
        total, count, causes = result
        per_step = total // ctx.steps(dev)
        if not ctx.worth_reporting(dev, per_step):
            continue
        pct = ctx.pct_of_step(dev, per_step)
        top = ", ".join(list(causes)[:3])
        found.append(Finding(
            id="idle_gaps_host_cause",
            title=f"{count} GPU idle gap{'s' if count != 1 else ''} ≥ {ms(min_gap)} in {ctx.steps(dev)} "
                  f"step{'s' if ctx.steps(dev) != 1 else ''} on rank {dev.rank} "
                  f"({ms(per_step)}/step, {pct:.0f}%) while the host was blocked in {top}",
            impact_ns_per_step=int(per_step), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Remove host synchronizations from the step (.item(), .cpu(), blocking copies, "
                           "allocator calls); use pinned memory and non_blocking copies.",
            evidence={"rank": dev.rank, "device": dev.device, "gaps": count, "gap_ns_total": total,
                      "steps": ctx.steps(dev), "host_calls": causes},
        ))
    return [max(found, key=lambda f: f.impact_ns_per_step or 0)] if found else []


def _gaps_with_cause(trace: Trace, dev: DeviceSummary, min_gap_ns: int) -> tuple[int, int, dict[str, int]] | None:
    """Total ns and count of long idle gaps (inside step windows) overlapped by a blocking host call of the same
    process, with the names of those calls."""
    gap_start, gap_end, _ = _device_gaps(trace, dev)  # only time inside steps
    long_gap = (gap_end - gap_start) >= min_gap_ns
    if not long_gap.any():
        return None
    gap_start, gap_end = gap_start[long_gap], gap_end[long_gap]
    a = trace.api_calls
    blocking = _names_matching(trace, a["name_id"], HOST_BLOCKING) & (a["pid"] == _pid_of(trace, dev))
    if not blocking.any():
        return None
    c_start, c_end, c_name = a["start_ns"][blocking], a["end_ns"][blocking], a["name_id"][blocking]
    order = np.argsort(c_start, kind="stable")
    c_start, c_end, c_name = c_start[order], c_end[order], c_name[order]
    # For each gap, the calls starting before its end; any of those ending after its start overlaps it.
    hi = np.searchsorted(c_start, gap_end, side="left")
    running_max_end = np.maximum.accumulate(c_end)
    overlapped = (hi > 0) & (running_max_end[np.clip(hi - 1, 0, None)] > gap_start)
    if not overlapped.any():
        return None
    total = int((gap_end - gap_start)[overlapped].sum())
    last_call = np.clip(hi[overlapped] - 1, 0, None)
    names = pd.Series(trace.names(c_name[last_call]).astype(str)).value_counts()
    return total, int(overlapped.sum()), {str(n): int(c) for n, c in names.items()}


def collectives_without_kernels(ctx: FindingContext) -> list[Finding]:
    """Collective calls inside steps that launch no communication kernel — done on the CPU side (a process group
    of one rank, gloo on CPU tensors) — while the GPU idles: the host time they take delays every later launch.

    Impact: median per step of their whole host calls (outermost issuing range), at most the device's median idle
    time per step. Which calls count in which step: :func:`~traceanalyzer.analysis.host_issue.host_only_in_steps`
    (calls during warm-up or CUDA-graph capture do not)."""
    found = []
    counted = ctx.summary.what_if.details.get("ranks") or {}
    for dev in ctx.summary.devices:
        trace = ctx.trace_of(dev)
        # the what-if has already looked for these calls on its ranks: skip the ones where it found none
        if trace is None or not len(dev.per_step) or counted.get(str(dev.rank), {}).get("calls_without_kernels") == 0:
            continue
        act = dev.activity if isinstance(dev.activity, DeviceActivity) and dev.activity.trace is trace \
            else gather(trace, dev.rank, dev.device)
        calls = host_only_in_steps(trace, act, dev.per_step)
        if not len(calls):
            continue
        step = step_index(dev, calls["after_ns"].to_numpy(np.int64))
        took = (calls["end_ns"] - calls["start_ns"]).to_numpy(np.int64)
        host = per_step_median(ctx.steps(dev), step, took)
        idle = int(dev.per_step["idle_ns"].median()) if "idle_ns" in dev.per_step else host
        impact = min(host, idle)
        if not ctx.worth_reporting(dev, impact):
            continue
        # counted in the step of the kernel launched after each call
        counts = count_per_step(ctx, dev, calls.assign(start_ns=calls["after_ns"]))
        n = max(sum(counts.values()), 1)
        pct = ctx.pct_of_step(dev, impact)
        found.append(Finding(
            id="collectives_without_kernels",
            title=f"{kinds_text(counts)} per step on rank {dev.rank} launch no communication kernel (done on the "
                  f"CPU side: a process group of one rank, or gloo) yet hold the host {ms(host)} ({ms(host // n)} "
                  f"per call) while the GPU idles {ms(idle)} of the step",
            impact_ns_per_step=impact, impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Skip collectives on single-rank groups (guard them with world_size > 1, as vLLM and "
                           "SGLang do), and keep CPU-side (gloo) collectives out of the step or batch them.",
            evidence={"rank": dev.rank, "device": dev.device, "collectives_per_step": counts,
                      "host_ns_per_step": host, "gpu_idle_ns_per_step": idle,
                      "median_call_ns": int(np.median(took)),
                      "names": calls["name"].value_counts().head(5).to_dict(), "steps": ctx.steps(dev)},
        ))
    return [max(found, key=lambda f: f.impact_ns_per_step or 0)] if found else []
