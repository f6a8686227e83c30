"""Findings: add / RMSNorm (/ quantize) run as separate kernels, after all-reduces or on one GPU.

A *chain* is the unbroken run of fusable kernels right after a kernel that is not fusable on its stream (at most
``MAX_CHAIN``): after an all-reduce holding a norm, after any other kernel holding a norm computed by several kernels
(``evidence.DECOMPOSED_NORM_NAME``). The norm: one fused kernel (FlashInfer ``FusedAddRMSNormKernel``, vLLM / SGLang
``fused_add_rms_norm``, PyTorch's ``rms_norm``, Inductor's ``triton_*_fused_*rsqrt*``…) or eager PyTorch's decomposed
add → float copy → pow → mean → add eps → rsqrt → mul → copy → mul. Per chain, with kernel durations d₁…dₙ and the
idle gap before each g₁…gₙ (capped at ``fusion_gap_max_ns``; g₁ is right after the kernel before the chain):

* ``chain`` = Σd + Σg, what the chain occupies on the stream;
* ``fused_norm`` = the chain's longest kernel: the time one fused add + RMSNorm kernel is assumed to take (it still
  reads the input and residual and writes both outputs: one pass over the activations); the measured ratios, and
  the range they give (``evidence.FUSED_NORM_RATIO``), are in docs/FINDINGS.md;
* **norm fusion alone** (``norm_not_fused``) = chain − g₁ − fused_norm: what collapsing the chain into one fused
  norm kernel saves, without touching the all-reduce (0 for a one-kernel chain);
* **all-reduce fusion** (``allreduce_not_fused``) ≤ g₁ + fused_norm: what folding that fused norm into the
  all-reduce's epilogue can add at most — the launch gap and the norm's own pass; an upper bound, since the fused
  kernel's epilogue is not free (measuring it needs two GPUs).

The two add up to the chain's own time, never more.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..analysis.numeric.frames import array_of
from ..analysis.results import DeviceSummary, Finding
from . import rule_ids as ids
from .context import FindingContext, ms, per_step_median, prediction, severity, step_index, worst
from .evidence import (
    FUSABLE_SUBBUCKETS,
    FUSED_NORM_RATIO,
    MAX_CHAIN,
    NORM_NAME,
    NORM_SUBBUCKETS,
    DeviceEvidence,
    unfused_chains,
)


def _reportable(ctx: FindingContext, column: str, after_allreduce: bool
                ) -> list[tuple[DeviceSummary, int, float | None, dict[str, Any], pd.DataFrame]]:
    """Per device with unfused chains (``after_allreduce``: only those right after an all-reduce) whose median
    per step of ``column`` is worth reporting: (device, that figure, its % of the step, the finding's evidence,
    the chains)."""
    out = []
    for dev in ctx.summary.devices:
        device_ev = ctx.evidence_of(dev)
        chains = None if device_ev is None else device_ev.chains
        if chains is not None and after_allreduce:
            chains = chains[array_of(chains, "after_allreduce", bool)]
        if device_ev is None or chains is None or not len(chains):
            continue
        value = _per_step(ctx, dev, chains, column)
        if ctx.worth_reporting(dev, value):
            out.append((dev, value, ctx.pct_of_step(dev, value), _evidence(ctx, dev, device_ev, chains), chains))
    return out


def _per_step(ctx: FindingContext, dev: DeviceSummary, chains: pd.DataFrame, column: str) -> int:
    step_idx = step_index(dev, array_of(chains, "start_ns", np.int64))
    return per_step_median(ctx.steps(dev), step_idx, array_of(chains, column, np.int64))


def _evidence(ctx: FindingContext, dev: DeviceSummary, device_ev: DeviceEvidence, chains: pd.DataFrame
              ) -> dict[str, Any]:
    """The finding's evidence; with ``ctx.lean_evidence`` only the figures the titles read (rank, device, chains
    per step, median kernels per chain, norm fusion alone per step)."""
    step_idx = step_index(dev, array_of(chains, "start_ns", np.int64))

    def per_step(column: str) -> int:
        return per_step_median(ctx.steps(dev), step_idx, array_of(chains, column, np.int64))

    count = per_step_median(ctx.steps(dev), step_idx, np.ones(len(chains), dtype=np.int64))
    followed = per_step_median(ctx.steps(dev), step_idx, array_of(chains, "after_allreduce", np.int64))
    kernels = int(np.median(array_of(chains, "kernels", np.float64)))
    if ctx.lean_evidence:
        return {"rank": dev.rank, "device": dev.device, "chains_per_step": count,
                "allreduces_followed_per_step": followed,
                "median_chain_kernels": kernels, "per_step_ns": {"norm_fusion_alone": per_step("norm_alone_ns")}}
    med = chains.drop(columns=["start_ns", "after_allreduce", "norm_alone_low_ns", "norm_alone_high_ns"]).median()
    return {
        "rank": dev.rank, "device": dev.device, "steps": ctx.steps(dev), "chains_per_step": count,
        "allreduces_followed_per_step": followed,
        "following_kernels": dict(device_ev.following_kernels),
        "median_chain_kernels": kernels,
        "per_chain_ns": {"chain": int(med["chain_ns"]), "gap_after_allreduce": int(med["gap_ns"]),
                         "fused_norm_estimate": int(med["fused_norm_ns"]),
                         "norm_fusion_alone": int(med["norm_alone_ns"]),
                         "allreduce_fusion_at_most": int(med["allreduce_bound_ns"])},
        "per_step_ns": {"chain": per_step("chain_ns"), "norm_fusion_alone": per_step("norm_alone_ns"),
                        "allreduce_fusion_at_most": per_step("allreduce_bound_ns")},
        "basis": "fused norm = the chain's longest kernel; norm fusion alone = chain − gap after the kernel before "
                 "it − fused norm; all-reduce fusion ≤ gap after the all-reduce + fused norm (docs/FINDINGS.md)",
    }


def allreduce_not_fused(ctx: FindingContext) -> list[Finding]:
    """All-reduces followed by a separate add / RMSNorm chain: impact = median per step of Σ (gap after the
    all-reduce + the fused norm's time), an upper bound of what folding the norm into the all-reduce saves on top
    of a fused norm kernel (module doc). Fires for a one-kernel chain (a fused norm already) too."""
    found = []
    for dev, bound, pct, ev, chains in _reportable(ctx, "allreduce_bound_ns", after_allreduce=True):
        ev = {**ev, **prediction(bound, _per_step(ctx, dev, chains, "gap_ns"), bound, {
            "point": "at most: the launch gap after each all-reduce + one fused norm pass",
            "low": "the launch gaps alone (the fused epilogue as slow as the norm kernel)",
            "high": "the gaps + the fused norm's pass"}, "low")}
        n = ev["median_chain_kernels"]
        alone = ev["per_step_ns"]["norm_fusion_alone"]
        more = (f"; collapsing the {n} kernels into one fused norm kernel is a separate saving of about "
                f"{ms(alone)}/step (norm_not_fused)") if alone > 0 and n > 1 else ""
        found.append(Finding(
            id=ids.ALLREDUCE_NOT_FUSED,
            title=f"{ev['allreduces_followed_per_step']} all-reduces per step are each followed by {n} separate "
                  f"add/RMSNorm kernel{'s' if n > 1 else ''}: fusing the norm into the all-reduce would save at most "
                  f"{ms(bound)}/step ({pct:.0f}%), one fused norm pass and one launch gap per all-reduce{more}",
            impact_ns_per_step=int(bound), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Enable the fused all-reduce + residual + RMSNorm (+quant) kernel (e.g. FlashInfer / "
                           "TRT-LLM allreduce_fusion, vLLM's AllReduceFusionPass, SGLang's "
                           "--enable-flashinfer-allreduce-fusion) where the architecture supports it (SM90 / SM100 "
                           "in SGLang and vLLM; a cause_* finding says so when the trace records the GPU).",
            evidence=ev,
        ))
    return worst(found)


def norm_not_fused(ctx: FindingContext) -> list[Finding]:
    """The add + RMSNorm runs as several kernels (eager PyTorch's decomposed ops), after an all-reduce or after
    any other kernel: impact = median per step of Σ (chain − gap after the kernel before it − one fused norm
    kernel), what one fused add + RMSNorm kernel saves without touching an all-reduce."""
    found = []
    for dev, saving, pct, ev, chains in _reportable(ctx, "norm_alone_ns", after_allreduce=False):
        low, high = (_per_step(ctx, dev, chains, c) for c in ("norm_alone_low_ns", "norm_alone_high_ns"))
        ev = {**ev, **prediction(saving, low, high, {
            "point": "Σ per step (chain − the gap before it − its longest kernel): one fused kernel as long as that",
            "low": f"the fused kernel {FUSED_NORM_RATIO[1]:g} × the longest (the slowest measured)",
            "high": f"the fused kernel {FUSED_NORM_RATIO[0]:g} × the longest (the fastest measured)"})}
        after = ev["allreduces_followed_per_step"]
        where = (" after each all-reduce" if after == ev["chains_per_step"] else f", {after} of them after an "
                 "all-reduce") if after else ""
        found.append(Finding(
            id=ids.NORM_NOT_FUSED,
            title=f"The add + RMSNorm runs {ev['chains_per_step']} times per step{where} as "
                  f"{ev['median_chain_kernels']} separate kernels: one fused add + RMSNorm kernel would save about "
                  f"{ms(saving)}/step ({pct:.0f}%)",
            impact_ns_per_step=int(saving), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Use a fused add + RMSNorm kernel (torch.compile, vLLM / SGLang / FlashInfer "
                           "fused_add_rmsnorm, F.rms_norm after the add) instead of eager pow / mean / rsqrt / mul.",
            evidence=ev,
        ))
    return worst(found)


__all__ = ["FUSABLE_SUBBUCKETS", "MAX_CHAIN", "NORM_NAME", "NORM_SUBBUCKETS",
           "allreduce_not_fused", "norm_not_fused", "unfused_chains"]
