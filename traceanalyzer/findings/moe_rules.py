"""MoE findings (docs/FINDINGS.md, docs/MOE.md): exposed expert-parallel dispatch / combine, expert-load imbalance
across ranks, routing overhead. Each reads the summary's MoE layers (``Summary.moe``, :mod:`..analysis.moe`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis.moe import DeviceMoe, MoeSummary
from ..analysis.results import DeviceSummary, Finding
from . import rule_ids as ids
from .context import FindingContext, ms, prediction, severity


def _moe(ctx: FindingContext) -> MoeSummary | None:
    moe = ctx.summary.moe
    return moe if isinstance(moe, MoeSummary) and moe.devices else None


def _device(ctx: FindingContext, d: DeviceMoe) -> DeviceSummary | None:
    return next((x for x in ctx.summary.devices if (x.trace, x.rank, x.device) == (d.trace, d.rank, d.device)),
                None)


def _where(d: DeviceMoe) -> str:
    """``rank r`` (``GPU d`` in a trace without distributed info)."""
    return f"rank {d.rank}" if d.rank >= 0 else f"GPU {d.device}"


def _median_per_step(d: DeviceMoe, columns: tuple[str, ...]) -> int:
    """Median over the device's steps holding MoE work of the per-step sum of ``columns``."""
    per = d.per_step()
    return int(np.median(per[list(columns)].to_numpy(np.int64).sum(axis=1))) if len(per) else 0


def exposed_dispatch_combine(ctx: FindingContext) -> list[Finding]:
    """Expert-parallel dispatch / combine with no compute beside them, on the rank where most is exposed."""
    moe = _moe(ctx)
    if moe is None:
        return []
    scored = [(d, _median_per_step(d, ("dispatch_exposed_ns", "combine_exposed_ns"))) for d in moe.devices]
    d, exposed = max(scored, key=lambda x: x[1])
    dev = _device(ctx, d)
    pct = ctx.pct_of_step(dev, exposed) if dev is not None else None
    if dev is None or pct is None or exposed <= 0 or pct < ctx.thresholds.exposed_comm_min_pct \
            or not ctx.worth_reporting(dev, exposed):
        return []
    parts = {s: _median_per_step(d, (f"{s}_comm_ns",)) for s in ("dispatch", "combine")}
    shown = {s: _median_per_step(d, (f"{s}_exposed_ns",)) for s in ("dispatch", "combine")}
    comm = sum(parts.values())
    hidden_pct = 100.0 * (comm - exposed) / comm if comm else 0.0
    wait = _wait_per_step(moe, d.rank)
    wait_text = f"; {ms(wait)}/step of the combine / dispatch time is waiting for a slower rank" if wait else ""
    return [Finding(
        id=ids.MOE_EXPOSED_DISPATCH_COMBINE,
        title=f"Expert-parallel dispatch / combine leave {ms(exposed)}/step ({pct:.0f}%) with no compute beside "
              f"them on {_where(d)} (dispatch {ms(shown['dispatch'])}, combine {ms(shown['combine'])}; "
              f"{hidden_pct:.0f}% of {ms(comm)} hidden){wait_text}: overlapping them with compute would recover "
              "up to that",
        impact_ns_per_step=int(exposed), impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Overlap dispatch / combine with compute: two-batch overlap (one micro-batch's all-to-all "
                       "beside the other's attention / experts), the shared expert on the compute stream while "
                       "they run, or DeepEP's low-latency hook mode; balance the expert load where the time is "
                       "waiting for another rank.",
        evidence={"rank": d.rank, "device": d.device, "exposed_ns_per_step": int(exposed),
                  "exposed_by_stage_ns_per_step": shown, "comm_by_stage_ns_per_step": parts,
                  "hidden_pct": round(hidden_pct, 1), "wait_ns_per_step": wait,
                  "layers_per_step": d.step_median().get("layers", 0),
                  **prediction(exposed, max(exposed - wait, 0), exposed, {
                      "point": "the exposed dispatch / combine, overlapped with compute",
                      "low": "less the part that is waiting for a slower rank (overlap does not recover it)",
                      "high": "the exposed dispatch / combine"}, "low")},
    )]


def _wait_per_step(moe: MoeSummary, rank: int) -> int:
    """The rank's median per step of its dispatch + combine time over the least rank's, from the layers matched
    across ranks (0 with one rank)."""
    per = _per_rank_layers(moe)
    mine = per.get(rank)
    if mine is None or len(per) < 2:
        return 0
    steps: dict[int, int] = {}
    least: dict[tuple[int, int], int] = {}
    for table in per.values():
        for key, value in table.items():
            least[key] = min(least.get(key, value), value)
    for key, value in mine.items():
        steps[key[0]] = steps.get(key[0], 0) + value - least[key]
    return int(np.median(list(steps.values()))) if steps else 0


def _per_rank_layers(moe: MoeSummary) -> dict[int, dict[tuple[int, int], int]]:
    """Per rank (its first device), (step ordinal, layer) → dispatch + combine comm time."""
    out: dict[int, dict[tuple[int, int], int]] = {}
    for d in moe.devices:
        if d.rank in out or d.rank not in moe.ranks or not len(d.layers):
            continue
        ordinal = np.unique(d.layers["step"].to_numpy(np.int64), return_inverse=True)[1].ravel()
        comm = (d.layers["dispatch_comm_ns"] + d.layers["combine_comm_ns"]).to_numpy(np.int64)
        out[d.rank] = {(int(o), int(layer)): int(c) for o, layer, c in
                       zip(ordinal, d.layers["layer"].to_numpy(np.int64), comm, strict=True)}
    return out


def expert_imbalance(ctx: FindingContext) -> list[Finding]:
    """One rank's expert GEMMs take longer than the median rank's in the same layers: the others wait for it."""
    moe = _moe(ctx)
    if moe is None or not len(moe.imbalance):
        return []
    t = moe.imbalance
    extra = t.groupby("step_ordinal")["extra_ns"].sum().to_numpy(np.int64)
    median_expert = t.groupby("step_ordinal")["expert_median_ns"].sum().to_numpy(np.int64)
    extra_ns, base = int(np.median(extra)), int(np.median(median_expert))
    hot_counts = t["hot_rank"].value_counts()
    hot = int(hot_counts.index[0])
    share = 100.0 * extra_ns / base if base else 0.0
    d = next((x for x in moe.devices if x.rank == hot), None)
    dev = _device(ctx, d) if d is not None else None
    pct = ctx.pct_of_step(dev, extra_ns) if dev is not None else None
    if dev is None or pct is None or share < ctx.thresholds.moe_imbalance_min_pct \
            or not ctx.worth_reporting(dev, extra_ns):
        return []
    waits = {s: int(np.median(t.groupby("step_ordinal")[f"{s}_wait_ns"].sum().to_numpy(np.int64)))
             for s in ("dispatch", "combine")}
    per_rank: dict[str, Any] = {str(x.rank): _median_per_step(x, ("expert_ns",)) for x in moe.devices
                                if x.rank in moe.ranks}
    return [Finding(
        id=ids.MOE_EXPERT_IMBALANCE,
        title=f"Expert load is imbalanced: rank {hot}'s expert GEMMs take {ms(extra_ns)}/step ({share:.0f}%) longer "
              f"than the median rank's (hot in {int(hot_counts.iloc[0])} of {len(t)} MoE layers); the other "
              f"ranks wait {ms(waits['combine'] + waits['dispatch'])}/step for it in combine / dispatch",
        impact_ns_per_step=extra_ns, impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Balance the tokens per expert across ranks: an auxiliary-loss-free bias or a capacity "
                       "factor in the router, redundant copies of the hot experts (EPLB), or a different "
                       "expert placement.",
        evidence={"hot_rank": hot, "extra_ns_per_step": extra_ns, "median_expert_ns_per_step": base,
                  "extra_pct_of_expert": round(share, 1), "hot_layers": int(hot_counts.iloc[0]),
                  "layers_matched": len(t), "ranks": moe.ranks, "wait_ns_per_step": waits,
                  "expert_ns_per_step_by_rank": per_rank,
                  **prediction(extra_ns, min(extra_ns, waits["combine"] + waits["dispatch"]), extra_ns, {
                      "point": "the hot rank's extra expert time over the median rank's",
                      "low": "the others' wait for it in combine / dispatch (at most the extra)",
                      "high": "the extra expert time"}, "low")},
    )]


def routing_overhead(ctx: FindingContext) -> list[Finding]:
    """Routing (router, permutation, un-permutation kernels) takes a large share of the MoE time."""
    moe = _moe(ctx)
    if moe is None:
        return []
    best: tuple[float, DeviceMoe, int, int] | None = None
    for d in moe.devices:
        routing = _median_per_step(d, ("router_ns", "permute_ns", "unpermute_ns"))
        total = _median_per_step(d, ("moe_ns",))
        share = 100.0 * routing / total if total else 0.0
        if best is None or share > best[0]:
            best = (share, d, routing, total)
    if best is None:
        return []
    share, d, routing, total = best
    dev = _device(ctx, d)
    pct = ctx.pct_of_step(dev, routing) if dev is not None else None
    if dev is None or pct is None or share < ctx.thresholds.moe_routing_min_pct or not ctx.worth_reporting(dev,
                                                                                                         routing):
        return []
    parts = {c[:-3]: _median_per_step(d, (c,)) for c in ("router_ns", "permute_ns", "unpermute_ns")}
    return [Finding(
        id=ids.MOE_ROUTING_OVERHEAD,
        title=f"MoE routing takes {share:.0f}% of the MoE time on {_where(d)}: {ms(routing)}/step in the router "
              f"({ms(parts['router'])}), token permutation ({ms(parts['permute'])}) and un-permutation "
              f"({ms(parts['unpermute'])}) kernels; fused routing kernels would save at most that",
        impact_ns_per_step=routing, impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Use a fused MoE path whose routing, permutation and finalize are single kernels (vLLM / "
                       "SGLang fused_moe, FlashInfer / TensorRT-LLM MoE, DeepEP's fused layout) instead of eager "
                       "top-k, sort, gather and index_add.",
        evidence={"rank": d.rank, "device": d.device, "routing_ns_per_step": routing, "moe_ns_per_step": total,
                  "share_pct": round(share, 1), "by_part_ns_per_step": parts,
                  **prediction(routing, 0, routing, {
                      "point": "at most: the routing kernels' time",
                      "low": "none: fused routing kernels still take time (not measured)",
                      "high": "the routing kernels' time"}, "low")},
    )]
