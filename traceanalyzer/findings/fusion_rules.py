"""Findings: all-reduces followed on their stream by separate add / RMSNorm (/ quantize) kernels.

A *chain* is the unbroken run of fusable kernels right after an all-reduce kernel on its stream (at most
``MAX_CHAIN``), holding a norm: one fused kernel (FlashInfer ``FusedAddRMSNormKernel``, vLLM / SGLang
``fused_add_rms_norm``, PyTorch's ``rms_norm``, Inductor's ``triton_*_fused_*rsqrt*``…) or eager PyTorch's decomposed
add → float copy → pow → mean → add eps → rsqrt → mul → copy → mul. Per chain, with kernel durations d₁…dₙ and the
idle gap before each g₁…gₙ (capped at ``fusion_gap_max_ns``; g₁ is right after the all-reduce):

* ``chain`` = Σd + Σg, what the chain occupies on the stream;
* ``fused_norm`` = the chain's longest kernel: the time one fused add + RMSNorm kernel is assumed to take (it still
  reads the input and residual and writes both outputs: one pass over the activations). On H200, hidden 4096,
  bf16, a fused add + RMSNorm kernel measured 0.19 / 0.70 / 0.66 × the longest kernel of eager PyTorch's chain at
  64 / 4096 / 16384 tokens (``fixtures/truth/rmsnorm_fusion_h200.json``), so this errs on the high side;
* **norm fusion alone** (``norm_not_fused``) = chain − g₁ − fused_norm: what collapsing the chain into one fused
  norm kernel saves, without touching the all-reduce (0 for a one-kernel chain);
* **all-reduce fusion** (``allreduce_not_fused``) ≤ g₁ + fused_norm: what folding that fused norm into the
  all-reduce's epilogue can add at most — the launch gap and the norm's own pass; an upper bound, since the fused
  kernel's epilogue is not free (measuring it needs two GPUs).

The two add up to the chain's own time, never more.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.results import DeviceSummary, Finding
from ..trace import Trace
from .context import FindingContext, kernel_mask, ms, per_step_median, severity, step_index

#: Sub-buckets of all-reduce kernels (classifier) that a fusion would replace. Already-fused all-reduce + norm
#: kernels are ``allreduce_fusion`` and start no chain.
ALLREDUCE_SUBBUCKETS = ("allreduce", "all_reduce", "custom_allreduce")
#: Sub-buckets of kernels a fused all-reduce (+ residual add + RMSNorm (+ quant)) kernel would absorb.
FUSABLE_SUBBUCKETS = ("norm", "elementwise", "quantize", "reduction")
#: A chain is an all-reduce + RMSNorm fusion candidate when it holds a norm kernel or, for an RMSNorm decomposed
#: into eager ops (pow → mean → add → rsqrt → mul), a reduction.
NORM_SUBBUCKETS = ("norm", "reduction")
#: Kernels of another sub-bucket that also do the norm (e.g. vLLM's ``fused_add_rms_norm_static_fp8_quant``).
NORM_NAME = re.compile(r"rms_?norm|layer_?norm", re.IGNORECASE)
MAX_CHAIN = 10  # add + a decomposed RMSNorm (+ dtype copies) + quantize


def _id(trace: Trace, value: str) -> int:
    """String-pool id of ``value``; -2 (matching no row, unlike -1 = missing) when the trace never uses it."""
    found = trace.strings.get(value)
    return found if found >= 0 else -2


def _ids(trace: Trace, values: tuple[str, ...]) -> np.ndarray:
    return np.array([_id(trace, v) for v in values], dtype=np.int64)


def _names_match(trace: Trace, name_ids: np.ndarray, pattern: re.Pattern[str]) -> np.ndarray:
    """Per row: whether the kernel name (by string id) matches ``pattern``; each distinct name is tested once."""
    uniq, inverse = np.unique(name_ids, return_inverse=True)
    hits = np.array([bool(pattern.search(str(n))) for n in trace.names(uniq)], dtype=bool)
    return hits[inverse] if len(uniq) else np.zeros(len(name_ids), dtype=bool)


def unfused_chains(trace: Trace, dev: DeviceSummary, gap_cap_ns: int) -> pd.DataFrame | None:
    """One row per all-reduce inside a step followed on its stream by a chain that holds a norm (module doc):
    ``start_ns`` (of the all-reduce), ``kernels``, ``chain_ns``, ``gap_ns`` (g₁), ``fused_norm_ns``,
    ``norm_alone_ns``, ``allreduce_bound_ns``; ``followers`` (attribute ``attrs["followers"]``) holds the kernel
    indices of the chains. None when there is none."""
    k = trace.kernels
    idx = np.flatnonzero(kernel_mask(trace, dev))
    if not len(idx):
        return None
    idx = idx[np.lexsort((k["start_ns"][idx], k["stream"][idx]))]
    sub, bucket = k["subbucket_id"][idx], k["bucket_id"][idx]
    stream, start_ns, end_ns = k["stream"][idx], k["start_ns"][idx], k["end_ns"][idx]
    is_ar = (bucket == _id(trace, "communication")) & np.isin(sub, _ids(trace, ALLREDUCE_SUBBUCKETS))
    fusable = (bucket == _id(trace, "other")) & np.isin(sub, _ids(trace, FUSABLE_SUBBUCKETS))
    is_norm = fusable & (np.isin(sub, _ids(trace, NORM_SUBBUCKETS)) |
                         _names_match(trace, k["name_id"][idx], NORM_NAME))
    ar_pos = np.flatnonzero(is_ar)
    ar_pos = ar_pos[step_index(dev, start_ns[ar_pos]) >= 0]
    if not len(ar_pos):
        return None
    busy = np.zeros(len(ar_pos), dtype=np.int64)
    gaps = np.zeros(len(ar_pos), dtype=np.int64)
    first_gap = np.zeros(len(ar_pos), dtype=np.int64)
    length = np.zeros(len(ar_pos), dtype=np.int64)
    longest = np.zeros(len(ar_pos), dtype=np.int64)
    has_norm = np.zeros(len(ar_pos), dtype=bool)
    alive = np.ones(len(ar_pos), dtype=bool)
    chain: list[tuple[np.ndarray, np.ndarray]] = []
    for offset in range(1, MAX_CHAIN + 1):
        nxt = np.minimum(ar_pos + offset, len(idx) - 1)
        alive &= (ar_pos + offset < len(idx)) & (stream[nxt] == stream[ar_pos]) & fusable[nxt]
        gap = np.where(alive, np.clip(start_ns[nxt] - end_ns[nxt - 1], 0, gap_cap_ns), 0)
        dur = np.where(alive, end_ns[nxt] - start_ns[nxt], 0)
        busy += dur
        gaps += gap
        if offset == 1:
            first_gap = gap
        length += alive
        longest = np.maximum(longest, dur)
        has_norm |= alive & is_norm[nxt]
        chain.append((nxt, alive.copy()))
    found = (length > 0) & has_norm  # an all-reduce + RMSNorm fusion needs the norm in the chain
    if not found.any():
        return None
    chain_ns = busy + gaps
    out = pd.DataFrame({
        "start_ns": start_ns[ar_pos], "kernels": length, "chain_ns": chain_ns, "gap_ns": first_gap,
        "fused_norm_ns": longest, "norm_alone_ns": chain_ns - first_gap - longest,
        "allreduce_bound_ns": first_gap + longest,
    })[found].reset_index(drop=True)
    out.attrs["followers"] = np.concatenate([idx[nxt[ok & found]] for nxt, ok in chain])
    return out


def _chains_by_device(ctx: FindingContext) -> list[tuple[DeviceSummary, Trace, pd.DataFrame]]:
    out = []
    for dev in ctx.summary.devices:
        trace = ctx.trace_of(dev)
        if trace is None or "subbucket_id" not in trace.kernels:
            continue
        chains = unfused_chains(trace, dev, ctx.thresholds.fusion_gap_max_ns)
        if chains is not None:
            out.append((dev, trace, chains))
    return out


def _per_step(ctx: FindingContext, dev: DeviceSummary, chains: pd.DataFrame, column: str) -> int:
    step_idx = step_index(dev, chains["start_ns"].to_numpy(np.int64))
    return per_step_median(ctx.steps(dev), step_idx, chains[column].to_numpy(np.int64))


def _evidence(ctx: FindingContext, dev: DeviceSummary, trace: Trace, chains: pd.DataFrame) -> dict[str, Any]:
    followers = chains.attrs["followers"]
    names = pd.Series(trace.names(trace.kernels["name_id"][followers]).astype(str)).value_counts().head(5)
    med = chains.drop(columns="start_ns").median()
    return {
        "rank": dev.rank, "device": dev.device, "steps": ctx.steps(dev),
        "allreduces_followed_per_step": _per_step(ctx, dev, chains.assign(one=1), "one"),
        "following_kernels": {str(n): int(c) for n, c in names.items()},
        "median_chain_kernels": int(med["kernels"]),
        "per_chain_ns": {"chain": int(med["chain_ns"]), "gap_after_allreduce": int(med["gap_ns"]),
                         "fused_norm_estimate": int(med["fused_norm_ns"]),
                         "norm_fusion_alone": int(med["norm_alone_ns"]),
                         "allreduce_fusion_at_most": int(med["allreduce_bound_ns"])},
        "per_step_ns": {"chain": _per_step(ctx, dev, chains, "chain_ns"),
                        "norm_fusion_alone": _per_step(ctx, dev, chains, "norm_alone_ns"),
                        "allreduce_fusion_at_most": _per_step(ctx, dev, chains, "allreduce_bound_ns")},
        "basis": "fused norm = the chain's longest kernel; norm fusion alone = chain − gap after the all-reduce − "
                 "fused norm; all-reduce fusion ≤ gap after the all-reduce + fused norm (docs/FINDINGS.md)",
    }


def allreduce_not_fused(ctx: FindingContext) -> list[Finding]:
    """All-reduces followed by a separate add / RMSNorm chain: impact = median per step of Σ (gap after the
    all-reduce + the fused norm's time), an upper bound of what folding the norm into the all-reduce saves on top
    of a fused norm kernel (module doc). Fires for a one-kernel chain (a fused norm already) too."""
    found = []
    for dev, trace, chains in _chains_by_device(ctx):
        bound = _per_step(ctx, dev, chains, "allreduce_bound_ns")
        if not ctx.worth_reporting(dev, bound):
            continue
        ev = _evidence(ctx, dev, trace, chains)
        pct = ctx.pct_of_step(dev, bound)
        n = ev["median_chain_kernels"]
        alone = ev["per_step_ns"]["norm_fusion_alone"]
        more = (f"; collapsing the {n} kernels into one fused norm kernel is a separate saving of about "
                f"{ms(alone)}/step (norm_not_fused)") if alone > 0 and n > 1 else ""
        found.append(Finding(
            id="allreduce_not_fused",
            title=f"{ev['allreduces_followed_per_step']} all-reduces per step are each followed by {n} separate "
                  f"add/RMSNorm kernel{'s' if n > 1 else ''}: fusing the norm into the all-reduce would save at most "
                  f"{ms(bound)}/step ({pct:.0f}%), one fused norm pass and one launch gap per all-reduce{more}",
            impact_ns_per_step=int(bound), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Enable the fused all-reduce + residual + RMSNorm (+quant) kernel (e.g. FlashInfer / "
                           "TRT-LLM allreduce_fusion, vLLM's AllReduceFusionPass, SGLang's "
                           "--enable-flashinfer-allreduce-fusion) for this GPU and world size.",
            evidence=ev,
        ))
    return [max(found, key=lambda f: f.impact_ns_per_step or 0)] if found else []


def norm_not_fused(ctx: FindingContext) -> list[Finding]:
    """The add + RMSNorm after all-reduces runs as several kernels (eager PyTorch's decomposed ops): impact =
    median per step of Σ (chain − gap after the all-reduce − one fused norm kernel), what one fused add + RMSNorm
    kernel saves without touching the all-reduce."""
    found = []
    for dev, trace, chains in _chains_by_device(ctx):
        saving = _per_step(ctx, dev, chains, "norm_alone_ns")
        if not ctx.worth_reporting(dev, saving):
            continue
        ev = _evidence(ctx, dev, trace, chains)
        pct = ctx.pct_of_step(dev, saving)
        found.append(Finding(
            id="norm_not_fused",
            title=f"The add + RMSNorm after each of {ev['allreduces_followed_per_step']} all-reduces per step runs as "
                  f"{ev['median_chain_kernels']} separate kernels: one fused add + RMSNorm kernel would save about "
                  f"{ms(saving)}/step ({pct:.0f}%)",
            impact_ns_per_step=int(saving), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Use a fused add + RMSNorm kernel (torch.compile, vLLM / SGLang / FlashInfer "
                           "fused_add_rmsnorm, F.rms_norm after the add) instead of eager pow / mean / rsqrt / mul.",
            evidence=ev,
        ))
    return [max(found, key=lambda f: f.impact_ns_per_step or 0)] if found else []
