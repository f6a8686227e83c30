"""Findings from GPU metric samples (nsys GPU_METRICS) and nvidia-smi power logs."""

from __future__ import annotations

from ..analysis.results import Finding
from .context import FindingContext

GEMM_PHASES = ("gemm", "moe_gemm", "moe_fp4_gemm")


def low_tensor_activity(ctx: FindingContext) -> list[Finding]:
    """Tensor cores mostly idle while GEMM kernels run (GPU metrics present)."""
    gm = ctx.summary.gpu_metrics
    if gm is None or not len(gm) or "metric" not in gm:
        return []
    rows = gm[gm["metric"].astype(str).str.startswith("Tensor Active") & gm["phase"].isin(GEMM_PHASES)]
    if not len(rows):
        return []
    weighted = (rows["mean"] * rows["samples"]).groupby(rows["device"]).sum() / rows.groupby("device")["samples"].sum()
    device = int(weighted.idxmin())
    value = float(weighted.min())
    if value >= ctx.thresholds.tensor_active_min_pct:
        return []
    return [Finding(
        id="low_tensor_activity",
        title=f"Tensor cores active only {value:.0f}% of the time while GEMM kernels run on GPU {device}",
        impact_ns_per_step=None, severity="medium",
        recommendation="GEMMs are memory- or launch-bound (small M in decode, skinny shapes): batch more tokens, "
                       "use grouped/fused GEMMs, check tile shapes and precision (FP8/FP4 paths).",
        evidence={"device": device, "tensor_active_mean_pct": value,
                  "samples": int(rows[rows["device"] == device]["samples"].sum())},
    )]


def gpu_power_underuse(ctx: FindingContext) -> list[Finding]:
    """GPUs drawing a small share of their power limit during the traced window."""
    power = ctx.summary.power
    if not power or not power.get("gpus"):
        return []
    low = [g for g in power["gpus"] if g.get("power_mean_pct_of_limit") is not None
           and g["power_mean_pct_of_limit"] < ctx.thresholds.power_min_pct_of_limit]
    if not low:
        return []
    worst = min(low, key=lambda g: g["power_mean_pct_of_limit"])
    busy = {f"{d.rank}:{d.device}": round(100.0 * d.busy_ns / d.span_ns, 1)
            for d in ctx.summary.devices if d.span_ns}
    return [Finding(
        id="gpu_power_underuse",
        title=f"GPUs draw {worst['power_mean_w']:.0f} W, {worst['power_mean_pct_of_limit']:.0f}% of their "
              f"{worst.get('power_limit_w', 0):.0f} W limit, during the trace: the SMs are underfed",
        impact_ns_per_step=None, severity="medium",
        recommendation="Low power with high 'utilization' means kernels are resident but SMs idle (communication, "
                       "waiting, launch gaps): see the communication and host findings.",
        evidence={"gpus": low, "busy_pct_by_rank_device": busy},
    )]
