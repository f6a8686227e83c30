"""Finding: all-reduces followed on their stream by add / RMSNorm (/ quantize) kernels a fused kernel absorbs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..analysis.results import DeviceSummary, Finding
from ..trace import Trace
from .context import FindingContext, kernel_mask, ms, per_step_median, severity, step_index

#: Sub-buckets of all-reduce kernels (classifier) that a fusion would replace.
ALLREDUCE_SUBBUCKETS = ("allreduce", "all_reduce", "custom_allreduce")
#: Sub-buckets of kernels a fused all-reduce (+ residual add + RMSNorm (+ quant)) kernel would absorb.
FUSABLE_SUBBUCKETS = ("norm", "elementwise", "quantize")
MAX_CHAIN = 3  # add + norm + quant


def _unfused_chains(trace: Trace, dev: DeviceSummary) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """For each all-reduce inside a step followed on its stream by fusable kernels: (all-reduce start,
    ns from its end to the end of the last fusable kernel of the unbroken chain, kernel indices of the chain)."""
    k = trace.kernels
    idx = np.flatnonzero(kernel_mask(trace, dev))
    if not len(idx):
        return None
    idx = idx[np.lexsort((k["start_ns"][idx], k["stream"][idx]))]
    sub = trace.names(k["subbucket_id"][idx]).astype(str)
    bucket = trace.names(k["bucket_id"][idx]).astype(str)
    stream, end_ns = k["stream"][idx], k["end_ns"][idx]
    is_ar = (bucket == "communication") & np.isin(sub, ALLREDUCE_SUBBUCKETS)
    fusable = (bucket == "other") & np.isin(sub, FUSABLE_SUBBUCKETS)
    ar_pos = np.flatnonzero(is_ar)
    ar_pos = ar_pos[step_index(dev, k["start_ns"][idx[ar_pos]]) >= 0]
    if not len(ar_pos):
        return None
    chain_end = np.full(len(ar_pos), -1, dtype=np.int64)
    alive = np.ones(len(ar_pos), dtype=bool)
    followers: list[np.ndarray] = []
    for offset in range(1, MAX_CHAIN + 1):
        nxt = np.minimum(ar_pos + offset, len(idx) - 1)
        alive &= (ar_pos + offset < len(idx)) & (stream[nxt] == stream[ar_pos]) & fusable[nxt]
        chain_end = np.where(alive, end_ns[nxt], chain_end)
        followers.append(idx[nxt[alive]])
    fused = chain_end >= 0
    if not fused.any():
        return None
    return (k["start_ns"][idx[ar_pos[fused]]], chain_end[fused] - end_ns[ar_pos[fused]],
            np.concatenate(followers))


def allreduce_not_fused(ctx: FindingContext) -> list[Finding]:
    """All-reduces followed by separate add / RMSNorm kernels: impact = median per step of the time from each
    all-reduce's end to the end of its add/norm chain (those kernels plus the launch gaps before them), which a
    fused all-reduce + residual + RMSNorm kernel removes (its own extra time is not modelled)."""
    found = []
    for dev in ctx.summary.devices:
        trace = ctx.trace_of(dev)
        if trace is None or "subbucket_id" not in trace.kernels:
            continue
        chains = _unfused_chains(trace, dev)
        if chains is None:
            continue
        starts, cost, followers = chains
        step_idx = step_index(dev, starts)
        per_step = per_step_median(ctx.steps(dev), step_idx, cost)
        pairs = per_step_median(ctx.steps(dev), step_idx, np.ones(len(starts)))
        if not ctx.worth_reporting(dev, per_step):
            continue
        pct = ctx.pct_of_step(dev, per_step)
        names = pd.Series(trace.names(trace.kernels["name_id"][followers]).astype(str)).value_counts().head(5)
        found.append(Finding(
            id="allreduce_not_fused",
            title=f"{pairs} all-reduces per step are followed by separate add/RMSNorm kernels: {ms(per_step)}/step "
                  f"({pct:.0f}%) incl. launch gaps that an all-reduce + RMSNorm fusion would absorb",
            impact_ns_per_step=int(per_step), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Enable the fused all-reduce + residual + RMSNorm (+quant) kernel (e.g. FlashInfer / "
                           "TRT-LLM allreduce_fusion, vLLM's AllReduceFusionPass) for this GPU and world size.",
            evidence={"rank": dev.rank, "device": dev.device, "allreduces_followed_per_step": pairs,
                      "steps": ctx.steps(dev), "following_kernels": {str(n): int(c) for n, c in names.items()},
                      "median_chain_ns": int(np.median(cost))},
        ))
    return [max(found, key=lambda f: f.impact_ns_per_step or 0)] if found else []
