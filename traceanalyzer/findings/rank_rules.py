"""Findings about one rank: the slow rank and the kernel classes that make it slow (``analysis.straggler``)."""

from __future__ import annotations

from ..analysis.results import Finding
from ..analysis.straggler import slow_rank_classes
from ..model.units import fmt_ns
from . import rule_ids as ids
from .context import FindingContext, ms, prediction, severity


def slow_rank(ctx: FindingContext) -> list[Finding]:
    """The rank the others wait for (``cross_rank.straggler_rank``), with the kernel classes it spends more time
    per step in than the other ranks do, by role. Impact: the sum of those classes' extra time per step. Fires
    when that sum is worth reporting, however small the wait it causes."""
    cr = ctx.summary.cross_rank
    if cr is None or cr.straggler_rank is None:
        return []
    straggler = int(cr.straggler_rank)
    dev = next((d for d in ctx.summary.devices if d.rank == straggler), None)
    if dev is None:
        return []
    floor = int(0.001 * (dev.step_ns_median or 0))  # classes below 0.1 % of the step are noise
    classes = slow_rank_classes(ctx.summary.devices, straggler, floor)
    extra = sum(c.extra_ns_per_step for c in classes)
    if not classes or not ctx.worth_reporting(dev, extra):
        return []
    pct = ctx.pct_of_step(dev, extra)
    waits = cr.detail.wait_ns_per_step_by_rank if cr.detail is not None else {}
    others = [v for r, v in waits.items() if r != straggler]
    wait = sorted(others)[len(others) // 2] if others else None
    parts = [f"{c.label} kernels +{c.pct:.0f}% ({fmt_ns(c.straggler_median_ns)} vs "
             f"{fmt_ns(c.others_median_ns)}), +{ms(c.extra_ns_per_step)}/step" for c in classes[:3]]
    wait_text = f"; the other ranks wait {ms(wait)}/step for it (median) in collectives" if wait else ""
    return [Finding(
        id=ids.SLOW_RANK,
        title=f"Rank {straggler} is the slow rank: {'; '.join(parts)}{wait_text}",
        impact_ns_per_step=int(extra), impact_pct_of_step=pct, severity=severity(pct),
        recommendation=f"Find why rank {straggler}'s {classes[0].label} kernels are slower than the same kernels "
                       "on the other ranks: a slower or throttled GPU (clocks, power, temperature), a different "
                       "kernel configuration or input split on that rank, or another process sharing the GPU.",
        evidence={"straggler_rank": straggler, "waited_for_rank": straggler, "classes": [c.to_json() for c in classes],
                  "extra_ns_per_step": int(extra), "others_wait_ns_per_step_median": wait,
                  **prediction(extra, min(extra, wait or 0), extra, {
                      "point": "the slow rank's extra kernel time per step",
                      "low": "the others' median wait for it (what the step loses to it, at most the extra)",
                      "high": "the extra kernel time"}, "low"),
                  "straggler_by_arrival": cr.detail.straggler_by_arrival if cr.detail is not None else None,
                  "straggler_by_least_wait": cr.detail.straggler_by_least_wait if cr.detail is not None else None,
                  "basis": "kernels inside steps matched by name and class across ranks; extra = the slow rank's "
                           "time per step minus the other ranks' median (docs/FINDINGS.md)"},
    )]


__all__ = ["slow_rank"]
