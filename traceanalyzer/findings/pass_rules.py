"""Findings about the time between forward passes: the GPU idle at the boundary of two steps while the host
schedules the next batch, samples, synchronizes or runs Python."""

from __future__ import annotations

from ..analysis.results import Finding
from . import rule_ids as ids
from .context import FindingContext, ms, prediction, severity, worst

_SERVING = {"SGLang", "vLLM", "FlashInfer", "TensorRT-LLM"}


def host_gap_between_passes(ctx: FindingContext) -> list[Finding]:
    """The median per step of the GPU idle gap touching a step window's start or end (``DeviceEvidence.pass_gap``),
    when it is at least ``pass_gap_min_pct`` of the step and the steps are more than one: impact = that gap."""
    found = []
    platform = ctx.summary.platform
    serving = platform is not None and bool({f["name"] for f in platform.frameworks} & _SERVING)
    for dev in ctx.summary.devices:
        if dev.steps < 2:
            continue
        ev = ctx.evidence_of(dev)
        if ev is None:
            continue
        gap, steps_with_gap = ev.pass_gap
        pct = ctx.pct_of_step(dev, gap)
        if not gap or pct is None or pct < ctx.thresholds.pass_gap_min_pct or not ctx.worth_reporting(dev, gap):
            continue
        advice = ("Overlap the host's work between passes with the GPU's: schedule the next batch while this one "
                  "runs, keep sampled tokens on the GPU instead of synchronizing on them, and move Python work "
                  "(detokenization, logging) off the launching thread")
        if serving:
            advice += ("; SGLang's overlap scheduler does this (on unless --disable-overlap-schedule), vLLM's "
                       "--async-scheduling likewise")
        found.append(Finding(
            id=ids.HOST_GAP_BETWEEN_PASSES,
            title=f"Rank {dev.rank}'s GPU idles {ms(gap)} ({pct:.0f}%) of each step between one pass and the next "
                  f"({steps_with_gap} of {dev.steps} steps): the host's time between forward passes",
            impact_ns_per_step=int(gap), impact_pct_of_step=pct, severity=severity(pct),
            recommendation=advice + ".",
            evidence={"rank": dev.rank, "device": dev.device, "steps": dev.steps, "steps_with_gap": steps_with_gap,
                      "gap_ns_per_step": int(gap), "step_ns_median": dev.step_ns_median,
                      "basis": "median per step of the GPU idle gaps touching the step window's start or end",
                      **prediction(gap, max(gap - ev.profiler_host[0][2], 0), gap, {
                          "point": "the gap: the host's work between passes overlapped with the GPU's",
                          "low": "less the profiler's own host time per step at its largest measured cost",
                          "high": "the gap"})},
        ))
    return worst(found)


__all__ = ["host_gap_between_passes"]
