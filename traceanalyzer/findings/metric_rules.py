"""Findings from GPU metric samples (nsys GPU_METRICS) and nvidia-smi power logs.

Neither rule has a time impact (``impact_ns_per_step`` is None): a low Tensor Active share or a low power draw
says the SMs are underfed, not how much faster the step would run. Their evidence carries the time at stake.
"""

from __future__ import annotations

import numpy as np

from ..analysis.results import DeviceSummary, Finding
from ..model.buckets import GEMM_BUCKETS
from . import rule_ids as ids
from .context import FindingContext, ms, per_step_median

GEMM_PHASES = GEMM_BUCKETS  # integer ns summed over them: their order does not matter


def _tensor_active_in_gemms(ctx: FindingContext, dev: DeviceSummary) -> tuple[float, int, dict[str, float]] | None:
    """(mean Tensor Active % over samples taken inside steps while a GEMM bucket ran, samples, mean by bucket)."""
    ev = ctx.evidence_of(dev)
    return None if ev is None else ev.tensor_active


def low_tensor_activity(ctx: FindingContext) -> list[Finding]:
    """Tensor cores mostly idle while GEMM kernels run (needs nsys --gpu-metrics-devices samples)."""
    found = []
    for dev in ctx.summary.devices:
        result = _tensor_active_in_gemms(ctx, dev)
        if result is None or result[0] >= ctx.thresholds.tensor_active_min_pct:
            continue
        value, samples, by_phase = result
        gemm_ns = _gemm_ns_per_step(dev)
        gemm_pct = ctx.pct_of_step(dev, gemm_ns)
        found.append(Finding(
            id=ids.LOW_TENSOR_ACTIVITY,
            title=f"Tensor cores active only {value:.0f}% of the time while GEMM kernels run on rank {dev.rank} "
                  f"({ms(gemm_ns)}/step, {gemm_pct or 0:.0f}% of the step, in GEMMs)",
            impact_ns_per_step=None, severity="medium",
            recommendation="GEMMs are memory- or launch-bound (small M in decode, skinny shapes): batch more tokens, "
                           "use grouped/fused GEMMs, check tile shapes and precision (FP8/FP4 paths).",
            evidence={"rank": dev.rank, "device": dev.device, "tensor_active_mean_pct": round(value, 1),
                      "tensor_active_by_bucket": by_phase, "samples": samples,
                      "gemm_ns_per_step": gemm_ns, "gemm_pct_of_step": gemm_pct,
                      "threshold_pct": ctx.thresholds.tensor_active_min_pct},
        ))
    return [min(found, key=lambda f: f.evidence["tensor_active_mean_pct"])] if found else []


def _gemm_ns_per_step(dev: DeviceSummary) -> int:
    """Median per step of the GEMM buckets' union time (from the per-step table; buckets may overlap slightly)."""
    ps = dev.per_step
    cols = [f"{b}_ns" for b in GEMM_PHASES if f"{b}_ns" in ps]
    if not len(ps) or not cols:
        return sum(dev.bucket_ns.get(b, 0) for b in GEMM_PHASES)
    return per_step_median(len(ps), np.arange(len(ps)), ps[cols].sum(axis=1).to_numpy())


def gpu_power_underuse(ctx: FindingContext) -> list[Finding]:
    """GPUs drawing a small share of their power limit during the traced window (needs ``--gpu-log``)."""
    power = ctx.summary.power
    if not power or not power.get("gpus"):
        return []
    low = [g for g in power["gpus"] if g.get("power_mean_pct_of_limit") is not None
           and g["power_mean_pct_of_limit"] < ctx.thresholds.power_min_pct_of_limit]
    if not low:
        return []
    worst = min(low, key=lambda g: g["power_mean_pct_of_limit"])
    samples = f"{worst['samples']} nvidia-smi sample{'s' if worst['samples'] != 1 else ''}"
    busy = {f"rank {d.rank} GPU {d.device}": round(100.0 * d.busy_ns / d.span_ns, 1)
            for d in ctx.summary.devices if d.span_ns}
    return [Finding(
        id=ids.GPU_POWER_UNDERUSE,
        title=f"GPU {worst['gpu']} draws {worst['power_mean_w']:.0f} W on average, "
              f"{worst['power_mean_pct_of_limit']:.0f}% of its {worst.get('power_limit_w', 0):.0f} W limit, "
              f"during the trace ({samples}): the SMs are underfed",
        impact_ns_per_step=None, severity="medium",
        recommendation="Low power with high 'utilization' means kernels are resident but SMs idle or memory-bound "
                       "(communication, waiting, launch gaps, small GEMMs): see the other findings.",
        evidence={"gpus": low, "busy_pct_by_device": busy, "log": power.get("log"),
                  "threshold_pct_of_limit": ctx.thresholds.power_min_pct_of_limit},
    )]
