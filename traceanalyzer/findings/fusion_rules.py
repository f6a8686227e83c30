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
FUSABLE_SUBBUCKETS = ("norm", "elementwise", "quantize", "reduction")
#: A chain is an all-reduce + RMSNorm fusion candidate when it holds a norm kernel or, for an RMSNorm decomposed
#: into eager ops (pow → mean → add → rsqrt → mul), a reduction.
NORM_SUBBUCKETS = ("norm", "reduction")
MAX_CHAIN = 10  # add + a decomposed RMSNorm (+ dtype copies) + quantize


def _id(trace: Trace, value: str) -> int:
    """String-pool id of ``value``; -2 (matching no row, unlike -1 = missing) when the trace never uses it."""
    found = trace.strings.get(value)
    return found if found >= 0 else -2


def _ids(trace: Trace, values: tuple[str, ...]) -> np.ndarray:
    return np.array([_id(trace, v) for v in values], dtype=np.int64)


def _unfused_chains(trace: Trace, dev: DeviceSummary, gap_cap_ns: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """For each all-reduce inside a step followed on its stream by an unbroken chain of fusable kernels that holds a
    norm: (all-reduce start, saving, kernels in the chain, kernel indices of the chains). The saving of a chain is
    its kernels' durations plus the gap before each, capped at ``gap_cap_ns`` (a longer gap is the host issuing
    late, which a fusion shortens only by the launch it removes), minus its longest kernel (the fused epilogue
    still makes one pass over the activations)."""
    k = trace.kernels
    idx = np.flatnonzero(kernel_mask(trace, dev))
    if not len(idx):
        return None
    idx = idx[np.lexsort((k["start_ns"][idx], k["stream"][idx]))]
    sub, bucket = k["subbucket_id"][idx], k["bucket_id"][idx]
    stream, start_ns, end_ns = k["stream"][idx], k["start_ns"][idx], k["end_ns"][idx]
    is_ar = (bucket == _id(trace, "communication")) & np.isin(sub, _ids(trace, ALLREDUCE_SUBBUCKETS))
    fusable = (bucket == _id(trace, "other")) & np.isin(sub, _ids(trace, FUSABLE_SUBBUCKETS))
    ar_pos = np.flatnonzero(is_ar)
    ar_pos = ar_pos[step_index(dev, start_ns[ar_pos]) >= 0]
    if not len(ar_pos):
        return None
    cost = np.zeros(len(ar_pos), dtype=np.int64)
    length = np.zeros(len(ar_pos), dtype=np.int64)
    longest = np.zeros(len(ar_pos), dtype=np.int64)
    has_norm = np.zeros(len(ar_pos), dtype=bool)
    alive = np.ones(len(ar_pos), dtype=bool)
    chain: list[tuple[np.ndarray, np.ndarray]] = []
    for offset in range(1, MAX_CHAIN + 1):
        nxt = np.minimum(ar_pos + offset, len(idx) - 1)
        alive &= (ar_pos + offset < len(idx)) & (stream[nxt] == stream[ar_pos]) & fusable[nxt]
        gap = np.clip(start_ns[nxt] - end_ns[nxt - 1], 0, gap_cap_ns)
        cost += np.where(alive, end_ns[nxt] - start_ns[nxt] + gap, 0)
        length += alive
        longest = np.maximum(longest, np.where(alive, end_ns[nxt] - start_ns[nxt], 0))
        has_norm |= alive & np.isin(sub[nxt], _ids(trace, NORM_SUBBUCKETS))
        chain.append((nxt, alive.copy()))
    fused = (cost > 0) & has_norm  # an all-reduce + RMSNorm fusion needs the norm in the chain
    if not fused.any():
        return None
    followers = np.concatenate([idx[nxt[ok & fused]] for nxt, ok in chain])
    saving = cost - longest  # the fused kernel still makes one pass over the data: as long as the longest one
    return start_ns[ar_pos[fused]], saving[fused], length[fused], followers


def allreduce_not_fused(ctx: FindingContext) -> list[Finding]:
    """All-reduces followed by separate add / RMSNorm kernels: impact = median per step of the chains' saving (their
    kernels plus the capped gaps before them, minus the longest kernel, which the fused all-reduce + residual +
    RMSNorm kernel's one pass over the data is assumed to cost)."""
    found = []
    for dev in ctx.summary.devices:
        trace = ctx.trace_of(dev)
        if trace is None or "subbucket_id" not in trace.kernels:
            continue
        chains = _unfused_chains(trace, dev, ctx.thresholds.fusion_gap_max_ns)
        if chains is None:
            continue
        starts, cost, length, followers = chains
        step_idx = step_index(dev, starts)
        per_step = per_step_median(ctx.steps(dev), step_idx, cost)
        pairs = per_step_median(ctx.steps(dev), step_idx, np.ones(len(starts)))
        if not ctx.worth_reporting(dev, per_step):
            continue
        pct = ctx.pct_of_step(dev, per_step)
        names = pd.Series(trace.names(trace.kernels["name_id"][followers]).astype(str)).value_counts().head(5)
        found.append(Finding(
            id="allreduce_not_fused",
            title=f"{pairs} all-reduces per step are each followed by {int(np.median(length))} separate add/RMSNorm "
                  f"kernels: an all-reduce + RMSNorm fusion would save about {ms(per_step)}/step ({pct:.0f}%)",
            impact_ns_per_step=int(per_step), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Enable the fused all-reduce + residual + RMSNorm (+quant) kernel (e.g. FlashInfer / "
                           "TRT-LLM allreduce_fusion, vLLM's AllReduceFusionPass) for this GPU and world size.",
            evidence={"rank": dev.rank, "device": dev.device, "allreduces_followed_per_step": pairs,
                      "steps": ctx.steps(dev), "following_kernels": {str(n): int(c) for n, c in names.items()},
                      "median_saving_per_chain_ns": int(np.median(cost)),
                      "median_chain_kernels": int(np.median(length))},
        ))
    return [max(found, key=lambda f: f.impact_ns_per_step or 0)] if found else []
