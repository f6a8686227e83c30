"""Findings about the host side: launch-bound GPUs without CUDA graphs, idle gaps caused by synchronization."""

from __future__ import annotations

import numpy as np

from ..analysis.numeric.frames import array_of
from ..analysis.results import DeviceSummary, Finding, Summary
from . import rule_ids as ids
from .context import (
    FindingContext,
    count_per_step,
    kinds_text,
    ms,
    per_step_median,
    prediction,
    severity,
    step_index,
    worst,
)
from .evidence import gaps_with_cause, graph_launched_fraction


def host_bound_no_cuda_graphs(ctx: FindingContext) -> list[Finding]:
    """GPU idle between short kernels while the host launches them one by one (no CUDA graphs).

    Impact: what CUDA graphs would save unprofiled — the median per step of the GPU idle time in gaps shorter than
    ``long_gap_min_ns`` (launch gaps; longer gaps are host stalls, see idle_gaps_host_cause) less the host time
    the profiler itself added per step (its recorded host events × their measured cost, ``profiler_cost``): the
    profiled host is slower than the unprofiled one, and only the unprofiled launch gaps are removed. The range
    takes the largest and smallest measured per-event costs (docs/METHOD_IMPACTS.md)."""
    t = ctx.thresholds
    found = []
    for dev in ctx.summary.devices:
        ev = ctx.evidence_of(dev)
        if ev is None or dev.span_ns <= 0:
            continue
        idle_per_step, idle_pct = ev.launch_idle
        if idle_pct < t.host_bound_idle_min_pct:  # the other figures only where this one passes
            continue
        median_kernel, kernels_per_step = ev.kernels_in_steps
        graphs = ev.graph_launched_fraction
        if (median_kernel > t.host_bound_kernel_max_ns
                or kernels_per_step < t.host_bound_min_kernels_per_step
                or graphs > t.graph_launched_max_fraction or not ctx.worth_reporting(dev, idle_per_step)):
            continue
        (prof_low, prof_point, prof_high), prof_events = ev.profiler_host
        saving = max(idle_per_step - prof_point, 0)
        low, high = max(idle_per_step - prof_high, 0), max(idle_per_step - prof_low, 0)
        if not ctx.worth_reporting(dev, saving):
            continue
        found.append(Finding(
            id=ids.HOST_BOUND_NO_CUDA_GRAPHS,
            title=f"GPU is host-bound on rank {dev.rank}: idle {ms(idle_per_step)} ({idle_pct:.0f}%) of each step in "
                  f"launch gaps between {kernels_per_step} short kernels (median {ms(median_kernel)}) launched one "
                  f"by one without CUDA graphs; unprofiled, graphs would save about {ms(saving)}/step "
                  f"({ms(low)}–{ms(high)})",
            impact_ns_per_step=int(saving), impact_pct_of_step=ctx.pct_of_step(dev, saving),
            severity=severity(idle_pct),
            recommendation="Capture the step in CUDA graphs (torch.cuda.graphs / torch.compile mode="
                           "'reduce-overhead', vLLM/SGLang cuda graph capture), fuse small kernels, cut Python "
                           "overhead on the launch path.",
            evidence={"rank": dev.rank, "device": dev.device, "idle_pct_of_step": round(idle_pct, 1),
                      "kernels_per_step": kernels_per_step, "median_kernel_ns": median_kernel,
                      "graph_launched_fraction": round(graphs, 3), "steps": ctx.steps(dev),
                      **prediction(saving, low, high, {
                          "point": "launch idle per step − the profiler's host events × their median measured cost",
                          "low": "− their largest measured cost", "high": "− their smallest measured cost"}),
                      "profiled_launch_idle_ns": int(idle_per_step), "profiler_host_ns_per_step": prof_point,
                      "profiler_events_per_step": prof_events},
        ))
    return worst(found)


def idle_gaps_host_cause(ctx: FindingContext) -> list[Finding]:
    """Long GPU idle gaps inside steps during which the host was blocked in a synchronization / blocking call.

    Impact: the gap time inside step windows, summed over the steps and divided by their number (mean per step:
    a host sync may hit only some steps) — an upper bound. Predicted unprofiled change (``predicted_change_ns``):
    the smaller of that and the step's GPU busy time, what moving the host's work beside the GPU's can save."""
    found = []
    min_gap = ctx.thresholds.long_gap_min_ns
    for dev in ctx.summary.devices:
        ev = ctx.evidence_of(dev)
        result = None if ev is None else ev.gaps_with_cause
        if result is None:
            continue
        total, count, causes = result
        per_step = gap = total // ctx.steps(dev)
        # predicted: the host's work moved off the GPU's path runs beside the step's GPU work, saving at most that
        busy = _busy_per_step(dev)
        saving = min(gap, busy) if busy else gap
        if not ctx.worth_reporting(dev, per_step):
            continue
        pct = ctx.pct_of_step(dev, per_step)
        top = ", ".join(list(causes)[:3])
        found.append(Finding(
            id=ids.IDLE_GAPS_HOST_CAUSE,
            title=f"{count} GPU idle gap{'s' if count != 1 else ''} ≥ {ms(min_gap)} in {ctx.steps(dev)} "
                  f"step{'s' if ctx.steps(dev) != 1 else ''} on rank {dev.rank} "
                  f"({ms(per_step)}/step, {pct:.0f}%) while the host was blocked in {top}",
            impact_ns_per_step=int(per_step), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Remove host synchronizations from the step (.item(), .cpu(), blocking copies, "
                           "allocator calls); use pinned memory and non_blocking copies.",
            evidence={"rank": dev.rank, "device": dev.device, "gaps": count, "gap_ns_total": total,
                      "steps": ctx.steps(dev), "host_calls": causes, "gap_ns_per_step": int(gap),
                      "gpu_busy_ns_per_step": int(busy),
                      **prediction(saving, int(saving * 0.8), gap, {
                          "point": "min(the gaps per step, the step's GPU busy time): the host's work overlapped "
                                   "with the GPU's instead of after it",
                          "low": "80 % of it: the host's work may not all move",
                          "high": "the whole gap per step"})},
        ))
    return worst(found)


def _busy_per_step(dev: DeviceSummary) -> int:
    """Median GPU busy time per step (duration − idle), 0 without those columns."""
    per = dev.per_step
    if not len(per) or not {"duration_ns", "idle_ns"} <= set(per.columns):
        return 0
    return int(np.median(array_of(per, "duration_ns") - array_of(per, "idle_ns")))


def wants_host_only_calls(dev: DeviceSummary, summary: Summary) -> bool:
    """Whether :func:`collectives_without_kernels` looks for the device's CPU-side collective calls: it has steps,
    and the what-if, which has already looked on its ranks, did not find none on its rank."""
    counted = summary.what_if.details.ranks.get(str(dev.rank))
    return bool(len(dev.per_step)) and (counted is None or counted.evidence.calls_without_kernels != 0)


def collectives_without_kernels(ctx: FindingContext) -> list[Finding]:
    """Collective calls inside steps that launch no communication kernel — done on the CPU side (a process group
    of one rank, gloo on CPU tensors) — while the GPU idles: the host time they take delays every later launch.

    Impact: median per step of their whole host calls (outermost issuing range), at most the device's median idle
    time per step. Which calls count in which step: :func:`~traceanalyzer.analysis.host_issue.host_only_in_steps`
    (calls during warm-up or CUDA-graph capture do not)."""
    found = []
    for dev in ctx.summary.devices:
        ev = ctx.evidence_of(dev) if wants_host_only_calls(dev, ctx.summary) else None
        if ev is None:
            continue
        calls = ev.host_only_calls
        if not len(calls):
            continue
        step = step_index(dev, array_of(calls, "after_ns", np.int64))
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
            id=ids.COLLECTIVES_WITHOUT_KERNELS,
            title=f"{kinds_text(counts)} per step on rank {dev.rank} launch no communication kernel (done on the "
                  f"CPU side: a process group of one rank, or gloo) yet hold the host {ms(host)} ({ms(host // n)} "
                  f"per call) while the GPU idles {ms(idle)} of the step",
            impact_ns_per_step=impact, impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Skip collectives on single-rank groups (guard them with world_size > 1, as vLLM and "
                           "SGLang do), and keep CPU-side (gloo) collectives out of the step or batch them.",
            evidence={"rank": dev.rank, "device": dev.device, "collectives_per_step": counts,
                      "host_ns_per_step": host, "gpu_idle_ns_per_step": idle,
                      "median_call_ns": int(np.median(took)),
                      "names": calls["name"].value_counts().head(5).to_dict(), "steps": ctx.steps(dev),
                      **prediction(impact, 0, impact, {
                          "point": "the calls' host time, at most the GPU's idle time",
                          "low": "none: the host work may still run on the launching thread",
                          "high": "the calls' host time"}, "low")},
        ))
    return worst(found)


__all__ = ["collectives_without_kernels", "gaps_with_cause", "graph_launched_fraction", "host_bound_no_cuda_graphs",
           "idle_gaps_host_cause"]
