"""Findings about communication: exposed time, serialization on the compute stream, small messages, stragglers,
bandwidth. The all-reduce fusion rule lives in :mod:`.fusion_rules`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..analysis.numeric.frames import array_of
from ..analysis.results import DeviceSummary, Finding
from ..classify.demangle import base_name
from ..model.communication import ALLREDUCE_KINDS, bus_factors, group_sizes, link_peak_gbps
from . import rule_ids as ids
from .context import (
    FindingContext,
    count_kinds_per_step,
    count_per_step,
    kinds_text,
    ms,
    per_step_median,
    prediction,
    severity,
    step_index,
    what_if_prediction,
    worst,
)


def _wait_by_rank(ctx: FindingContext) -> dict[str, dict[str, int]]:
    """Per rank: median per step of its wait inside matched collectives, and of the SM-idle part of that wait
    (computed once per context)."""
    if "wait_by_rank" in ctx.memo:
        cached: dict[str, dict[str, int]] = ctx.memo["wait_by_rank"]
        return cached
    out: dict[str, dict[str, int]] = {}
    for dev in ctx.summary.devices:
        start = ctx.collective_column(dev, "start_ns")
        if not len(start) or ctx.summary.cross_rank is None:
            continue
        idx = step_index(dev, start.astype(np.int64))
        out[str(dev.rank)] = {
            "wait_ns_per_step": per_step_median(ctx.steps(dev), idx, ctx.collective_column(dev, "wait_ns")),
            "exposed_wait_ns_per_step": per_step_median(ctx.steps(dev), idx,
                                                        ctx.collective_column(dev, "exposed_wait_ns"))}
    ctx.memo["wait_by_rank"] = out
    return out


def exposed_communication(ctx: FindingContext) -> list[Finding]:
    """Share of each step the SMs sit idle while collectives run (exposed communication), with its split into
    waiting for another rank and transfer."""
    waits = _wait_by_rank(ctx)
    # every device's figures, shared by the candidates
    devices = [{"rank": d.rank, "device": d.device, "comm_exposed_per_step_ns": d.comm_exposed_per_step_ns,
                "overlap_pct": d.overlap_pct} for d in ctx.summary.devices]
    # one finding, of the worst device (as ``worst`` picks it: the first of the largest impact), built only for it
    chosen: tuple[int, DeviceSummary, Any, float] | None = None
    for dev in ctx.summary.devices:
        per_step = dev.comm_exposed_per_step_ns if dev.comm_exposed_per_step_ns is not None else dev.comm_exposed_ns
        pct = ctx.pct_of_step(dev, per_step)
        if not per_step or pct is None or pct < ctx.thresholds.exposed_comm_min_pct:
            continue
        if chosen is None or int(per_step) > chosen[0]:
            chosen = (int(per_step), dev, per_step, pct)
    found = []
    if chosen is not None:
        _, dev, per_step, pct = chosen
        counts = count_kinds_per_step(ctx, dev, ctx.collective_column(dev, "start_ns").astype(np.int64),
                                      ctx.collective_column(dev, "kind").astype(str))
        wait = waits.get(str(dev.rank), {}).get("exposed_wait_ns_per_step")
        cr = ctx.summary.cross_rank
        waited_for = cr.straggler_rank if cr is not None and cr.straggler_rank != dev.rank else None
        whom = f"rank {waited_for}" if waited_for is not None else "another rank"
        wait_text = f"; {ms(wait)} of it is waiting for {whom}" if wait and wait >= 0.1 * per_step else ""
        found.append(Finding(
            id=ids.EXPOSED_COMMUNICATION,
            title=f"Rank {dev.rank}'s SMs sit idle in collectives for {ms(per_step)} of each step ({pct:.0f}%), "
                  f"across {kinds_text(counts)} per step{wait_text}",
            impact_ns_per_step=int(per_step), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Overlap communication with independent compute (separate stream, micro-batching), "
                           "fuse collectives with neighbouring kernels, or use a faster all-reduce; when most of "
                           "it is waiting, balance the ranks first (see straggler_wait).",
            evidence={"rank": dev.rank, "device": dev.device, "collectives_per_step": counts,
                      "steps": ctx.steps(dev), "step_ns_median": dev.step_ns_median,
                      "cross_rank_wait_by_rank": waits, "devices": devices,
                      **what_if_prediction(ctx, int(per_step))},
        ))
    return worst(found)


def _on_compute_stream(dev: DeviceSummary, c: pd.DataFrame) -> pd.DataFrame:
    return c[c["stream"].isin(dev.compute_streams)] if len(c) else c


def comm_serialized_with_compute(ctx: FindingContext) -> list[Finding]:
    """Collectives launched on a compute stream with (almost) no compute beside them: they block the stream.

    Impact: the what-if "communication free" saving when its basis is the GPU (``gpu_transfer`` / ``mixed``) —
    the exposed transfer time on the critical path, which overlapping would recover; otherwise (host-bound) the
    median per step of this device's exposed transfer time (exposed time capped at the cross-rank transfer)."""
    t = ctx.thresholds
    what_if = ctx.summary.what_if
    found = []
    for dev in ctx.summary.devices:
        if not dev.comm_serialized_with_compute or (dev.overlap_pct or 0.0) >= t.serialized_overlap_max_pct:
            continue
        c = _on_compute_stream(dev, ctx.collectives(dev))
        if not len(c):
            continue
        idx = step_index(dev, array_of(c, "start_ns", np.int64))
        exposed_transfer = per_step_median(ctx.steps(dev), idx, array_of(c, "exposed_transfer_ns"))
        impact, basis = exposed_transfer, "exposed transfer time of these collectives (median per step)"
        if what_if.comm_free_step_saving_ns is not None and what_if.basis in ("gpu_transfer", "mixed"):
            impact, basis = int(what_if.comm_free_step_saving_ns), f"what-if communication free ({what_if.basis})"
        if not ctx.worth_reporting(dev, impact):
            continue
        pct = ctx.pct_of_step(dev, impact)
        counts = count_per_step(ctx, dev, c)
        streams = sorted({int(s) for s in c["stream"]})
        names = c["name"].astype(str).value_counts().head(3)
        short = ", ".join(dict.fromkeys(base_name(str(n)) for n in names.index))
        found.append(Finding(
            id=ids.COMM_SERIALIZED_WITH_COMPUTE,
            title=f"{kinds_text(counts)} per step ({short}) run on the compute stream "
                  f"({'stream' if len(streams) == 1 else 'streams'} {', '.join(map(str, streams))}) with no compute "
                  f"beside them: {ms(impact)}/step ({pct:.0f}%) that overlapping could recover",
            impact_ns_per_step=int(impact), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Launch collectives on a dedicated communication stream and give them independent work "
                           "to hide behind (micro-batch overlap, async tensor parallelism), or fuse them.",
            evidence={"rank": dev.rank, "device": dev.device, "impact_basis": basis,
                      "collectives_per_step": counts, "kernels": {str(n): int(k) for n, k in names.items()},
                      "streams": streams, "compute_streams": dev.compute_streams,
                      "overlap_pct": dev.overlap_pct, "exposed_transfer_ns_per_step": exposed_transfer,
                      "comm_exposed_per_step_ns": dev.comm_exposed_per_step_ns, "steps": ctx.steps(dev),
                      "what_if_ns": what_if.comm_free_step_saving_ns, "what_if_basis": what_if.basis,
                      "cross_rank_wait_by_rank": _wait_by_rank(ctx),
                      **what_if_prediction(ctx, int(impact))},
        ))
    return worst(found)


def _saving_per_step(ctx: FindingContext, dev: DeviceSummary, c: pd.DataFrame, ideal_ns: np.ndarray) -> int:
    """Median per step of Σ min(exposed transfer, transfer − ideal): SM-idle time a faster transfer removes."""
    gain = np.clip(np.minimum(array_of(c, "exposed_transfer_ns", np.float64),
                              array_of(c, "transfer_ns", np.float64) - ideal_ns), 0, None)
    return per_step_median(ctx.steps(dev), step_index(dev, array_of(c, "start_ns", np.int64)), gain)


def nccl_small_messages(ctx: FindingContext) -> list[Finding]:
    """NCCL all-reduces of small messages, where a one-shot / custom all-reduce is the usual choice."""
    t = ctx.thresholds
    found = []
    for dev in ctx.summary.devices:
        nbytes_all = ctx.collective_column(dev, "bytes")
        candidate = (nbytes_all > 0) & (nbytes_all <= t.small_message_max_bytes)  # cheap test first
        if candidate.any():
            candidate &= np.isin(ctx.collective_column(dev, "kind").astype(str), ALLREDUCE_KINDS)
            candidate &= np.char.find(np.char.lower(ctx.collective_column(dev, "name").astype(str)), "nccl") >= 0
        if not candidate.any():
            continue
        small = ctx.collectives(dev)[candidate]
        nbytes = array_of(small, "bytes", np.float64)
        peak = link_peak_gbps(dev.name)
        oneshot = t.oneshot_latency_ns + (nbytes / peak if peak else np.zeros(len(nbytes)))  # bytes/(GB/s) = ns
        saving = _saving_per_step(ctx, dev, small, oneshot)
        if not ctx.worth_reporting(dev, saving):
            continue
        expected = prediction(saving, _saving_per_step(ctx, dev, small, 2 * oneshot),
                              _saving_per_step(ctx, dev, small, np.zeros(len(nbytes))), {
                                  "point": "the one-shot model below", "low": "a one-shot all-reduce twice as slow",
                                  "high": "the messages' whole exposed transfer"})
        pct = ctx.pct_of_step(dev, saving)
        per_step = count_per_step(ctx, dev, small)
        found.append(Finding(
            id=ids.NCCL_SMALL_MESSAGES,
            title=f"{kinds_text(per_step)} per step of small messages (median {int(np.median(nbytes)) // 1024} KiB, "
                  f"{ms(float(small['transfer_ns'].median()))} each) go through NCCL where a one-shot all-reduce "
                  f"takes ~{ms(float(np.median(oneshot)))}: about {ms(saving)}/step",
            impact_ns_per_step=int(saving), impact_pct_of_step=pct, severity=severity(pct),
            recommendation="Use a custom / one-shot all-reduce for small messages (vLLM custom all-reduce, "
                           "FlashInfer/TRT-LLM Lamport one-shot, NCCL symmetric memory kernels).",
            evidence={"rank": dev.rank, "device": dev.device, "messages_per_step": per_step,
                      "median_bytes": int(np.median(nbytes)),
                      "median_transfer_ns": int(small["transfer_ns"].median()),
                      "median_duration_ns": int(small["duration_ns"].median()),
                      "model": f"one-shot ≈ {t.oneshot_latency_ns} ns + bytes / link peak ({peak} GB/s); saving = "
                               "min(exposed transfer, transfer − one-shot) per message", **expected},
        ))
    return worst(found)


def straggler_wait(ctx: FindingContext) -> list[Finding]:
    """Ranks idling inside collectives while they wait for a slower rank (the SM-idle part of the wait)."""
    cr = ctx.summary.cross_rank
    waits = _wait_by_rank(ctx)
    if cr is None or len(waits) < 2:
        return []
    devs = {str(d.rank): d for d in ctx.summary.devices}
    waiting = max(waits, key=lambda r: waits[r]["exposed_wait_ns_per_step"])
    waited_for = str(cr.straggler_rank) if cr.straggler_rank is not None and str(cr.straggler_rank) != waiting \
        and str(cr.straggler_rank) in waits else \
        min((r for r in waits if r != waiting), key=lambda r: waits[r]["wait_ns_per_step"])
    dev = devs[waiting]
    wait = waits[waiting]["exposed_wait_ns_per_step"]
    pct = ctx.pct_of_step(dev, wait)
    if pct is None or pct < ctx.thresholds.straggler_wait_min_pct:
        return []
    arrivals = cr.per_collective["last_arrival_rank"] if "last_arrival_rank" in cr.per_collective else pd.Series()
    last = int((arrivals.astype(str) == waited_for).sum()) if len(arrivals) and (arrivals >= 0).any() else None
    arrival_text = f", which arrives last at {last} of {len(arrivals)} collectives" if last else ""
    return [Finding(
        id=ids.STRAGGLER_WAIT,
        title=f"Rank {waiting} idles {ms(wait)}/step ({pct:.0f}%) inside collectives waiting for rank "
              f"{waited_for}{arrival_text}",
        impact_ns_per_step=int(wait), impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Balance the work before the collectives (load imbalance, host-side delays on the slower "
                       "rank: Python overhead, launch queue, data loading, CPU contention).",
        evidence={"wait_by_rank": waits, "waiting_rank": int(waiting), "waited_for_rank": int(waited_for),
                  "straggler_rank": cr.straggler_rank, "collectives_matched": cr.collectives_matched,
                  "match_method": cr.match_method, "last_arrival_counts": _arrival_counts(arrivals),
                  **prediction(wait, 0, wait, {
                      "point": "the wait: the slower rank's lateness removed",
                      "low": "none: work moved off the slower rank may make another rank wait as long",
                      "high": "the wait"}, "low")},
    )]


def _norm_follows(ctx: FindingContext, dev: DeviceSummary) -> bool:
    """Whether an add + RMSNorm chain follows this device's all-reduces (the fusion rules' chains): only then is
    fusing the all-reduce with the norm advice that applies."""
    ev = ctx.evidence_of(dev)
    chains = None if ev is None else ev.chains
    return chains is not None and bool(chains["after_allreduce"].any())


def _arrival_counts(arrivals: pd.Series) -> dict[str, int]:
    if not len(arrivals):
        return {}
    counts = arrivals[arrivals >= 0].value_counts()
    return {str(k): int(v) for k, v in counts.items()}


def low_comm_bandwidth(ctx: FindingContext) -> list[Finding]:
    """Large collectives whose bus bandwidth (from the cross-rank transfer time) is far below the link peak."""
    t = ctx.thresholds
    found = []
    for dev in ctx.summary.devices:
        peak = link_peak_gbps(dev.name)
        big_rows = ctx.collective_column(dev, "bytes") >= t.bandwidth_min_bytes
        if peak is None or not big_rows.any():
            continue
        big = ctx.collectives(dev)[big_rows]
        # the bus factor of each instance, as the report and the export compute it
        ranks = len(ctx.summary.cross_rank.ranks) if ctx.summary.cross_rank is not None else 0
        group = group_sizes(array_of(big, "group_size", np.int64), ranks)
        n = int(group.max())
        nbytes = array_of(big, "bytes", np.float64)
        factor = bus_factors(big["kind"].astype(str).to_numpy(), group, ranks)
        busbw = nbytes * factor / np.maximum(array_of(big, "transfer_ns", np.float64), 1)  # bytes/ns == GB/s
        median_bw = float(np.median(busbw))
        if median_bw >= t.bandwidth_min_fraction * peak:
            continue
        saving = _saving_per_step(ctx, dev, big, nbytes * factor / peak)
        if not ctx.worth_reporting(dev, saving):
            continue
        pct = ctx.pct_of_step(dev, saving)
        found.append(_bandwidth_finding(dev, big, median_bw, peak, n, saving, pct, count_per_step(ctx, dev, big)))
    return worst(found)


def _bandwidth_finding(dev: DeviceSummary, big: pd.DataFrame, median_bw: float, peak: float, n: int, saving: int,
                       pct: float | None, per_step: dict[str, int]) -> Finding:
    evidence: dict[str, Any] = {
        "rank": dev.rank, "device": dev.device, "messages_per_step": per_step,
        "median_bytes": int(big["bytes"].median()), "median_transfer_ns": int(big["transfer_ns"].median()),
        "median_busbw_gbps": round(median_bw, 1), "link_peak_gbps": peak, "group_size": n,
        "model": "saving = min(exposed transfer, transfer − bytes·busfactor / link peak) per message",
        **prediction(saving, 0, saving, {"point": "the transfer at the link's peak bus bandwidth",
                                         "low": "none: the peak may not be reachable on this path",
                                         "high": "the transfer at the link's peak"}, "low")}
    return Finding(
        id=ids.LOW_COMM_BANDWIDTH,
        title=f"{kinds_text(per_step)} per step of {int(big['bytes'].median()) >> 20} MiB reach "
              f"{median_bw:.0f} GB/s bus bandwidth, {100 * median_bw / peak:.0f}% of the {peak:.0f} GB/s link "
              f"peak: {ms(saving)}/step of exposed transfer above the peak-bandwidth time",
        impact_ns_per_step=int(saving), impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Check the transport (P2P/NVLink enabled? NCCL_P2P_DISABLE, PCIe through host memory), "
                       "NCCL algorithm/protocol and channel count; with overlap, SM contention slows NCCL too.",
        evidence=evidence)


def comm_compute_contention(ctx: FindingContext) -> list[Finding]:
    """Overlapped collectives that slow down the compute kernels running beside them (NCCL shares the SMs and
    memory bandwidth): overlap hides the transfer but is not free.

    Impact: the what-if estimate's ``contention_ns`` (compute kernels' extra time while communication runs beside
    them, against the same kernel's median with nothing beside it) of the rank that limits the step most often."""
    t = ctx.thresholds
    details = ctx.summary.what_if.details
    ranks = details.ranks
    limiting = list(details.steps.limiting_rank_by_step.values()) if details.steps is not None else []
    if not ranks or not limiting:
        return []
    rank = str(max(set(limiting), key=limiting.count))
    figures = ranks[rank].figures if rank in ranks else None
    contention = figures.contention_ns if figures is not None else 0
    dev = next((d for d in ctx.summary.devices if str(d.rank) == rank), None)
    if dev is None or (dev.overlap_pct or 0.0) < t.contention_overlap_min_pct or not ctx.worth_reporting(dev,
                                                                                                        contention):
        return []
    pct = ctx.pct_of_step(dev, contention)
    counts = count_per_step(ctx, dev, ctx.collectives(dev))
    return [Finding(
        id=ids.COMM_COMPUTE_CONTENTION,
        title=f"{kinds_text(counts)} per step overlap compute on rank {dev.rank} ({dev.overlap_pct:.0f}% hidden) but "
              f"slow the kernels beside them: {ms(contention)}/step ({pct:.0f}%) of extra compute time",
        impact_ns_per_step=contention, impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Give NCCL fewer SMs (NCCL_MAX_NCHANNELS / NCCL_MIN_CTAS), use copy-engine or symmetric-"
                       "memory collectives, or overlap communication with memory-bound rather than compute-bound "
                       "kernels.",
        evidence={"rank": dev.rank, "device": dev.device, "overlap_pct": dev.overlap_pct,
                  "collectives_per_step": counts,
                  "contention_ns_by_rank": {r: v.figures.contention_ns if v.figures is not None else None
                                            for r, v in ranks.items()},
                  "what_if_ns": ctx.summary.what_if.comm_free_step_saving_ns, "source": "what_if.details",
                  **prediction(contention, 0, contention, {
                      "point": "the compute kernels' extra time beside communication",
                      "low": "none: fewer NCCL SMs can lengthen the transfer by as much",
                      "high": "the extra compute time"}, "low")},
    )]


def collective_host_cost(ctx: FindingContext) -> list[Finding]:
    """Host-bound steps in which issuing the collectives on the host delays the launches the GPU waits for
    (eager decode: the GPU idles between launches while the host runs each collective call).

    Impact: the what-if's host part on the rank that sets the step most often (``host_issue_critical_ns``: the
    whole collective calls' host time the GPU waited for). The title also gives NCCL's own share of each call
    and the what-if counting that alone (``issue_only_saving_ns``)."""
    what_if = ctx.summary.what_if
    details = what_if.details
    ranks = details.ranks
    limiting = list(details.steps.limiting_rank_by_step.values()) if details.steps is not None else []
    if what_if.basis == "gpu_transfer" or not ranks or not limiting:
        return []
    rank = str(max(set(limiting), key=limiting.count))
    figures = ranks[rank].figures if rank in ranks else None
    if figures is None:
        return []
    evidence = ranks[rank].evidence
    impact = figures.host_issue_critical_ns
    calls = figures.collectives_per_step
    dev = next((d for d in ctx.summary.devices if str(d.rank) == rank), None)
    # collective calls that launch no kernel at all are collectives_without_kernels' finding
    if dev is None or calls <= 0 or not len(dev.collectives) or not ctx.worth_reporting(dev, impact):
        return []
    pct = ctx.pct_of_step(dev, impact)
    call, nccl = figures.host_issue_ns, figures.host_nccl_issue_ns
    slowed = figures.host_slowed_after_calls_ns
    issue_only = details.steps.issue_only_saving_ns if details.steps is not None else 0
    counts = count_per_step(ctx, dev, ctx.collectives(dev))
    return [Finding(
        id=ids.COLLECTIVE_HOST_COST,
        title=f"Rank {dev.rank}'s GPU waits for the host, and its {kinds_text(counts)} per step hold the host "
              f"{ms(call)} ({ms(call // calls)} per call, of which NCCL's issue {ms(nccl // calls)})"
              + (f" and slow the CPU work right after them by {ms(slowed)}" if slowed > 0 else "")
              + f": issuing them costs {ms(impact)}/step ({pct:.0f}%)"
              + (f", {ms(issue_only)} counting NCCL's issue alone" if 0 < issue_only < impact else ""),
        impact_ns_per_step=impact, impact_pct_of_step=pct, severity=severity(pct),
        recommendation="Issue fewer collectives from the host: capture the step with its collectives in a CUDA "
                       "graph" + (", fuse each all-reduce with the residual add + RMSNorm that follows it (one call)"
                                  if _norm_follows(ctx, dev) else "") +
                       ", or use a lighter all-reduce path (custom / symmetric-memory all-reduce) than "
                       "ProcessGroupNCCL's.",
        evidence={"rank": dev.rank, "device": dev.device, "collectives_per_step": counts,
                  "host_call_ns_per_step": call, "host_nccl_issue_ns_per_step": nccl,
                  "host_slowed_after_calls_ns_per_step": slowed,
                  "host_issue_critical_ns": impact, "issue_only_saving_ns": issue_only or None,
                  "gpu_idle_pct": evidence.gpu_idle_pct, "host_syncs": evidence.host_syncs,
                  "launch_bound_collectives_per_step": figures.launch_bound_collectives_per_step,
                  "what_if_ns": what_if.comm_free_step_saving_ns, "what_if_basis": what_if.basis,
                  "source": "what_if.details",
                  **prediction(impact, issue_only if 0 < issue_only < impact else impact, impact, {
                      "point": "the collective calls' host time the GPU waited for",
                      "low": "NCCL's own issue alone (a lighter call that keeps the rest)",
                      "high": "the whole calls' host time the GPU waited for"})},
    )]
