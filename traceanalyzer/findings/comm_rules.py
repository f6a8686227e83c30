"""Findings about communication: exposed time, serialization, fusion, message sizes, stragglers, bandwidth."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..analysis.results import DeviceSummary, Finding
from .context import FindingContext, kernel_mask, ms, severity

#: Collective kinds that are all-reduces (sub-buckets / kinds from the classifier and collectives analysis).
ALLREDUCE_KINDS = ("allreduce", "all_reduce", "custom_allreduce")
#: Sub-buckets of kernels a fused all-reduce (+ residual add + RMSNorm (+ quant)) kernel would absorb.
FUSABLE_SUBBUCKETS = ("norm", "elementwise", "quantize")

#: Peak unidirectional bandwidth per GPU of the scale-up link, GB/s (vendor figures), matched in name order.
LINK_PEAK_GBPS = (("GB300", 900.0), ("GB200", 900.0), ("B300", 900.0), ("B200", 900.0), ("H200", 450.0),
                  ("H100 PCIe", 64.0), ("H100", 450.0), ("H800", 200.0), ("A100-PCIE", 32.0), ("A100", 300.0),
                  ("A800", 200.0), ("V100", 150.0))


def _worst(devs: list[DeviceSummary], key) -> DeviceSummary | None:
    return max(devs, key=key) if devs else None


def exposed_communication(ctx: FindingContext) -> list[Finding]:
    """Share of each step the SMs sit idle while collectives run (exposed communication)."""
    devs = [d for d in ctx.summary.devices if d.comm_exposed_ns > 0]
    dev = _worst(devs, lambda d: ctx.pct_of_step(d, d.comm_exposed_per_step_ns or 0) or 0)
    if dev is None:
        return []
    per_step = dev.comm_exposed_per_step_ns or dev.comm_exposed_ns // ctx.steps(dev)
    pct = ctx.pct_of_step(dev, per_step)
    if pct is None or pct < ctx.thresholds.exposed_comm_min_pct:
        return []
    n_coll = len(dev.collectives) // ctx.steps(dev) if len(dev.collectives) else None
    return [Finding(
        id="exposed_communication",
        title=f"{pct:.0f}% of each step is SM-idle during collectives ({ms(per_step)}/step of exposed "
              f"communication on rank {dev.rank} GPU {dev.device})",
        impact_ns_per_step=int(per_step), impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Overlap communication with independent compute (separate stream, micro-batching), "
                       "fuse collectives with neighbouring kernels, or use a faster all-reduce.",
        evidence={"devices": [{"rank": d.rank, "device": d.device, "comm_ns": d.comm_ns,
                               "comm_exposed_ns": d.comm_exposed_ns, "overlap_pct": d.overlap_pct,
                               "comm_exposed_per_step_ns": d.comm_exposed_per_step_ns,
                               "step_ns_median": d.step_ns_median} for d in ctx.summary.devices],
                  "collectives_per_step": n_coll},
    )]


def comm_serialized_with_compute(ctx: FindingContext) -> list[Finding]:
    """Collectives launched on the compute stream: they cannot overlap with compute as launched."""
    t = ctx.thresholds
    devs = [d for d in ctx.summary.devices if d.comm_serialized_with_compute and d.comm_ns > 0
            and (d.overlap_pct or 0.0) < t.serialized_overlap_max_pct]
    if not devs:
        return []
    dev = _worst(devs, lambda d: d.comm_exposed_per_step_ns or 0)
    exposed = int(dev.comm_exposed_per_step_ns or dev.comm_exposed_ns // ctx.steps(dev))
    what_if = ctx.summary.what_if
    impact, basis = exposed, "exposed communication per step"
    if what_if.comm_free_step_saving_ns is not None and what_if.basis in ("gpu_transfer", "mixed"):
        impact, basis = int(what_if.comm_free_step_saving_ns), f"what-if ({what_if.basis})"
    if not ctx.worth_reporting(dev, impact):
        return []
    pct = ctx.pct_of_step(dev, impact)
    kinds = _kinds_per_step(dev)
    kinds_text = ", ".join(f"{n} {k}" for k, n in kinds.items()) or "collectives"
    return [Finding(
        id="comm_serialized_with_compute",
        title=f"{kinds_text} per step run on the compute stream with nothing beside them: "
              f"{ms(impact)}/step ({pct:.0f}%) could be recovered by overlapping",
        impact_ns_per_step=impact, impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Launch collectives on a dedicated communication stream and give them independent work "
                       "to hide behind (micro-batch overlap, async tensor parallelism), or fuse them.",
        evidence={"impact_basis": basis, "collectives_per_step": kinds,
                  "devices": [{"rank": d.rank, "device": d.device, "comm_streams": d.comm_streams,
                               "compute_streams": d.compute_streams, "overlap_pct": d.overlap_pct,
                               "comm_exposed_per_step_ns": d.comm_exposed_per_step_ns} for d in devs]},
    )]


def _kinds_per_step(dev: DeviceSummary) -> dict[str, int]:
    c = dev.collectives
    if not len(c) or "kind" not in c:
        return {}
    counts = c["kind"].astype(str).value_counts()
    steps = max(int(dev.steps or 0), 1)
    return {str(k): round(v / steps) for k, v in counts.items()}


def allreduce_not_fused(ctx: FindingContext) -> list[Finding]:
    """All-reduce followed on its stream by residual-add / RMSNorm (/ quantize) kernels a fused kernel would absorb."""
    best: Finding | None = None
    for dev in ctx.summary.devices:
        trace = ctx.trace_of(dev)
        if trace is None or "subbucket_id" not in trace.kernels:
            continue
        found = _unfused_after_allreduce(trace, dev)
        if found is None:
            continue
        pairs, impact_total, followers = found
        per_step = impact_total // ctx.steps(dev)
        if not ctx.worth_reporting(dev, per_step):
            continue
        pct = ctx.pct_of_step(dev, per_step)
        finding = Finding(
            id="allreduce_not_fused",
            title=f"{pairs // ctx.steps(dev)} all-reduces per step are followed by separate add/RMSNorm kernels "
                  f"({ms(per_step)}/step incl. launch gaps) that an all-reduce+RMSNorm fusion would absorb",
            impact_ns_per_step=int(per_step), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Enable the fused all-reduce + residual + RMSNorm (+quant) kernel (e.g. FlashInfer / "
                           "TRT-LLM allreduce_fusion, vLLM's AllReduceFusionPass) for this GPU and world size.",
            evidence={"rank": dev.rank, "device": dev.device, "pairs": pairs,
                      "following_kernels": followers},
        )
        if best is None or (finding.impact_ns_per_step or 0) > (best.impact_ns_per_step or 0):
            best = finding
    return [best] if best else []


def _unfused_after_allreduce(trace, dev: DeviceSummary) -> tuple[int, int, dict[str, int]] | None:
    """(number of all-reduces followed by fusable kernels, ns from all-reduce end to the last fusable end,
    names of those kernels with counts), per stream in start order."""
    k = trace.kernels
    mask = kernel_mask(trace, dev)
    if not mask.any():
        return None
    idx = np.flatnonzero(mask)
    idx = idx[np.lexsort((k["start_ns"][idx], k["stream"][idx]))]
    sub = trace.names(k["subbucket_id"][idx]).astype(str)
    bucket = trace.names(k["bucket_id"][idx]).astype(str)
    stream = k["stream"][idx]
    is_ar = (bucket == "communication") & np.isin(sub, ALLREDUCE_KINDS)
    fusable = (bucket == "other") & np.isin(sub, FUSABLE_SUBBUCKETS)
    total, pairs, names = 0, 0, pd.Series(dtype=int)
    ar_pos = np.flatnonzero(is_ar)
    if not len(ar_pos):
        return None
    end_ns = k["end_ns"][idx]
    chain_end = np.full(len(ar_pos), -1, dtype=np.int64)
    followers: list[np.ndarray] = []
    for offset in (1, 2, 3):  # a fused kernel absorbs up to add + norm + quant
        nxt = ar_pos + offset
        ok = nxt < len(idx)
        ok[ok] &= (stream[nxt[ok]] == stream[ar_pos[ok]]) & fusable[nxt[ok]]
        if offset > 1:
            ok &= chain_end >= 0  # the chain must be unbroken
        chain_end = np.where(ok, end_ns[np.clip(nxt, 0, len(idx) - 1)], chain_end if offset > 1 else -1)
        followers.append(idx[nxt[ok]])
        if offset == 1:
            first_ok = ok.copy()
    if not first_ok.any():
        return None
    pairs = int(first_ok.sum())
    total = int((chain_end[first_ok] - end_ns[ar_pos[first_ok]]).sum())
    all_followers = np.concatenate(followers)
    names = pd.Series(trace.names(k["name_id"][all_followers]).astype(str)).value_counts().head(5)
    return pairs, total, {str(n): int(c) for n, c in names.items()}


def nccl_small_messages(ctx: FindingContext) -> list[Finding]:
    """NCCL all-reduces of small messages, where a one-shot / custom all-reduce is the usual choice."""
    t = ctx.thresholds
    best: Finding | None = None
    for dev in ctx.summary.devices:
        c = dev.collectives
        if not len(c) or "bytes" not in c or "kind" not in c:
            continue
        names = c["name"].astype(str) if "name" in c else pd.Series([""] * len(c))
        small = (c["kind"].astype(str).isin(ALLREDUCE_KINDS) & names.str.contains("nccl", case=False)
                 & (c["bytes"] > 0) & (c["bytes"] <= t.small_message_max_bytes)).to_numpy()
        if not small.any():
            continue
        dur = c["duration_ns"].to_numpy()[small]
        nbytes = c["bytes"].to_numpy()[small]
        peak = link_peak_gbps(dev.name)
        oneshot = t.oneshot_latency_ns + (nbytes / (peak * 1e9) * 1e9 if peak else 0)
        # Transfer part only: waiting for a peer is not removed by a faster algorithm.
        transfer = np.minimum(dur, _transfer_estimate(c, small))
        saving = np.clip(transfer - oneshot, 0, None).sum() // ctx.steps(dev)
        if not ctx.worth_reporting(dev, saving):
            continue
        pct = ctx.pct_of_step(dev, saving)
        finding = Finding(
            id="nccl_small_messages",
            title=f"NCCL all-reduce used for {int(small.sum()) // ctx.steps(dev)} small messages per step "
                  f"(median {int(np.median(nbytes)) // 1024} KiB) where a one-shot all-reduce would fit: "
                  f"about {ms(saving)}/step",
            impact_ns_per_step=int(saving), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Use a custom / one-shot all-reduce for small messages (vLLM custom all-reduce, "
                           "FlashInfer/TRT-LLM Lamport one-shot, NCCL symmetric memory kernels).",
            evidence={"rank": dev.rank, "device": dev.device, "messages": int(small.sum()),
                      "median_bytes": int(np.median(nbytes)), "median_duration_ns": int(np.median(dur)),
                      "model": f"one-shot ≈ {t.oneshot_latency_ns} ns + bytes / link peak ({peak} GB/s)"},
        )
        if best is None or (finding.impact_ns_per_step or 0) > (best.impact_ns_per_step or 0):
            best = finding
    return [best] if best else []


def _transfer_estimate(c: pd.DataFrame, mask: np.ndarray) -> np.ndarray:
    """Per-collective transfer time: the cross-rank shortest duration when known, else the duration."""
    col = "transfer_ns" if "transfer_ns" in c else "duration_ns"
    return c[col].to_numpy()[mask].astype(np.int64)


def link_peak_gbps(gpu_name: str | None) -> float | None:
    """Vendor peak unidirectional scale-up bandwidth for a GPU name, GB/s (None when unknown)."""
    if not gpu_name:
        return None
    for key, peak in LINK_PEAK_GBPS:
        if key.lower() in gpu_name.lower():
            return peak
    return None


def straggler_wait(ctx: FindingContext) -> list[Finding]:
    """Ranks waiting inside collectives for a slower rank."""
    cr = ctx.summary.cross_rank
    if cr is None or not cr.wait_ns_by_rank:
        return []
    devs = {d.rank: d for d in ctx.summary.devices}
    any_dev = next(iter(ctx.summary.devices), None)
    if any_dev is None:
        return []
    steps = max((ctx.steps(d) for d in ctx.summary.devices), default=1)
    per_step = {int(r): int(w) // steps for r, w in cr.wait_ns_by_rank.items()}
    waiting_rank = max(per_step, key=per_step.get)
    dev = devs.get(waiting_rank, any_dev)
    wait = per_step[waiting_rank]
    pct = ctx.pct_of_step(dev, wait)
    if pct is None or pct < ctx.thresholds.straggler_wait_min_pct:
        return []
    straggler = cr.straggler_rank
    who = f"rank {straggler}" if straggler is not None else "a slower rank"
    return [Finding(
        id="straggler_wait",
        title=f"Rank {waiting_rank} waits {ms(wait)}/step ({pct:.0f}%) inside collectives for {who}",
        impact_ns_per_step=wait, impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Balance the work before the collectives (load imbalance, host-side delays on the "
                       "straggler: data loading, Python overhead, launch queue).",
        evidence={"wait_ns_per_step_by_rank": {str(r): w for r, w in per_step.items()},
                  "straggler_rank": straggler, "collectives_matched": cr.collectives_matched,
                  "match_method": cr.match_method},
    )]


def low_comm_bandwidth(ctx: FindingContext) -> list[Finding]:
    """Collectives whose bus bandwidth is far below the link's peak (sizes known, large messages)."""
    t = ctx.thresholds
    best: Finding | None = None
    for dev in ctx.summary.devices:
        c = dev.collectives
        peak = link_peak_gbps(dev.name)
        if peak is None or not len(c) or "bytes" not in c or "kind" not in c:
            continue
        big = (c["bytes"] >= t.bandwidth_min_bytes).to_numpy()
        if not big.any():
            continue
        n = int(c["group_size"].max()) if "group_size" in c and c["group_size"].max() > 1 else 2
        nbytes = c["bytes"].to_numpy()[big].astype(float)
        transfer = _transfer_estimate(c, big).astype(float)
        factor = np.where(c["kind"].astype(str).to_numpy()[big] == "allreduce", 2 * (n - 1) / n, (n - 1) / n)
        busbw = nbytes * factor / np.maximum(transfer, 1)  # bytes/ns == GB/s
        median_bw = float(np.median(busbw))
        if median_bw >= t.bandwidth_min_fraction * peak:
            continue
        ideal = nbytes * factor / peak
        saving = int(np.clip(transfer - ideal, 0, None).sum()) // ctx.steps(dev)
        if not ctx.worth_reporting(dev, saving):
            continue
        pct = ctx.pct_of_step(dev, saving)
        finding = Finding(
            id="low_comm_bandwidth",
            title=f"Collectives reach {median_bw:.0f} GB/s bus bandwidth, {100 * median_bw / peak:.0f}% of the "
                  f"{peak:.0f} GB/s link peak ({ms(saving)}/step above the peak-bandwidth time)",
            impact_ns_per_step=saving, impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Check the transport (P2P/NVLink enabled? NCCL_P2P_DISABLE, PCIe through host "
                           "memory), NCCL algorithm/protocol and channel count.",
            evidence={"rank": dev.rank, "device": dev.device, "messages": int(big.sum()),
                      "median_busbw_gbps": median_bw, "link_peak_gbps": peak, "group_size": n},
        )
        if best is None or (finding.impact_ns_per_step or 0) > (best.impact_ns_per_step or 0):
            best = finding
    return [best] if best else []
