"""What if communication were free: the step-time reduction, from critical-path evidence in the trace.

With communication free, every rank runs its own compute critical path and the step lasts as long as the slowest
rank. The host timeline of a rank is cut into **segments** at host syncs (``cuda*Synchronize``: the host waits for
the GPU there, so host time saved before one is lost waiting in it). In each segment the saving is the larger of:

* **host**: the host time of its collective calls — each call's *whole* host time, the outermost issuing CPU range
  (the user's range named after the collective, else the ``c10d::*`` op; see ``host_issue``), collective calls
  that launch no kernel included; a call counts at most ``ISSUE_OUTLIER`` × the median call of its kind, so one
  held-up call does not count as communication — plus the CPU work slowed right after each call (the same ops by
  name run 40–50 % longer in the first 100 µs after an all-reduce call than far from one; counted up to
  ``host_issue.HOST_RECOVERY_NS`` after it, against their median far from calls; a segment's sum never below 0)
  — capped at the GPU time spent *waiting for the host* after the first of them in the segment (gaps before
  launch-bound kernels): issuing earlier only helps when the GPU is starved for launches afterwards. The same
  estimate counting only NCCL's own issue range (the innermost one) is ``details.issue_only_saving_ns``: on
  host-bound runs timed with and without communication it reaches a fifth to a half of the measured cost, this
  estimate 72–115 % (docs/METHOD_WHAT_IF.md);
* **GPU**: its collectives' *exposed* time (comm running, no compute kernel), each capped at the instance's
  cross-rank **transfer** time — waiting for a slower rank moves elsewhere when communication is free. With one
  rank only, the transfer is the 10th percentile of the same collective's (kind, size, kernel) durations. Plus
  the collective's **dependency latency**: idle time right before / after its kernel beyond the device's usual
  gap between kernels (stream-dependency and CUDA-graph-node latency; not where the GPU waited for the host).

The two overlap in time (a short kernel runs while the host is still issuing), hence the larger, not the sum.
Added per step: **contention** — how much longer compute kernels ran while communication ran beside them
(overlapped schedules), against the same kernel's (name, grid, block) median with no communication beside it,
times the share of the step's communication that was transfer rather than waiting.

The step is set by the rank the others wait for (least wait per step, from the cross-rank matching; without it,
the rank with the smallest cost), so a step's saving is that rank's cost; the estimate is the median over steps.
``basis``: ``host_launch`` when host issue time is ≥ 75 % of it, ``gpu_transfer`` when ≤ 25 %, else ``mixed``.
A rank whose GPU idle time the profiler's own host overhead explains is weighed toward its GPU reading, and
``details`` give ``range_ns`` [low, high], the reading each end comes from (``range_basis``) and a ``confidence``
(``what_if_range``). Method and validation against real runs with and without their all-reduces:
docs/METHOD_WHAT_IF.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..trace import Trace
from . import intervals as iv
from .activity import DeviceActivity, gather
from .host_issue import HostEvidence, collective_calls, host_evidence, host_only_in_steps, host_slowed_after_calls
from .results import CrossRankSummary, DeviceSummary, WhatIf
from .what_if_range import (
    step_range,
    upper_readings,
    weigh_profiler,
)

HOST_SHARE = 0.75  # host share of the saving at/above which basis is host_launch (gpu_transfer at/below 1 - it)
NEVER = np.iinfo(np.int64).max
OWN_TRANSFER_Q = 0.1  # quantile of a collective's durations taken as its transfer when other ranks are absent
#: One rank's what-if inputs: per step its own communication cost and parts (ns), and its evidence.
RankCosts = tuple[pd.DataFrame, dict[str, Any]]
ISSUE_OUTLIER = 4  # an issuing call counts at most this many times the median call of its kind on the rank



def _pct(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def _basis(host: int, total: int) -> str:
    if total <= 0:
        return "gpu_transfer"
    share = host / total
    return "host_launch" if share >= HOST_SHARE else "gpu_transfer" if share <= 1 - HOST_SHARE else "mixed"


def _contention(act: DeviceActivity, per_step: pd.DataFrame) -> pd.Series:
    """Per step: how much longer compute kernels ran while communication ran beside them (ns).

    Baseline: the median duration of the same kernel (name, grid, block) when nothing communicated beside it;
    only kernels with such a baseline count, and only the excess (never a speed-up)."""
    k = act.kernels
    compute = ~act.kernel_is_comm
    if not compute.any() or len(act.comm[0]) == 0 or len(per_step) == 0:
        return pd.Series(dtype=np.int64)
    s, e = k["start_ns"][compute], k["end_ns"][compute]
    beside = iv.measure_within(act.comm, s, e) > 0
    frame = pd.DataFrame({"name": k["name_id"][compute], "grid": k["grid"][compute],
                          "block": k["block"][compute], "dur": e - s, "beside": beside})
    keys = ["name", "grid", "block"]
    base = frame[~frame["beside"]].groupby(keys)["dur"].median().rename("base")
    frame = frame.join(base, on=keys)
    excess = (frame["dur"] - frame["base"]).clip(lower=0).where(frame["beside"] & frame["base"].notna(), 0)
    order = np.argsort(per_step["start_ns"].to_numpy(), kind="stable")
    win = iv.window_of(s, per_step["start_ns"].to_numpy()[order], per_step["end_ns"].to_numpy()[order])
    step = np.where(win >= 0, per_step["step"].to_numpy()[order][np.maximum(win, 0)], -1)
    out = excess.groupby(step).sum()
    return out[out.index >= 0].astype(np.int64)


def _dependency_latency(act: DeviceActivity, host: HostEvidence) -> np.ndarray:
    """Per kernel (ns, communication kernels only): idle time around it beyond the device's usual gap between
    kernels — the stream dependency / graph-node latency of a collective on a busy GPU (measured on the H200
    CUDA-graph decodes: ~2.3 µs before an NCCL kernel against ~0.4 µs between other kernels). Gaps before a
    launch-bound kernel are time waiting for the host and count there instead."""
    k = act.kernels
    out = np.zeros(len(k), dtype=np.int64)
    b_start, b_end = act.busy
    if len(b_start) < 2 or not act.kernel_is_comm.any():
        return out
    start, end = k["start_ns"], k["end_ns"]
    pos = np.searchsorted(b_start, start, side="right") - 1  # busy interval holding each kernel
    opens = (pos >= 1) & (b_start[np.maximum(pos, 0)] == start)
    before = np.where(opens, start - b_end[np.maximum(pos - 1, 0)], 0)
    typical = before[opens & ~act.kernel_is_comm & ~host.launch_bound]
    if len(typical) == 0:
        return out
    usual = int(np.median(typical))
    closes = (pos >= 0) & (pos + 1 < len(b_start)) & (b_end[np.clip(pos, 0, len(b_end) - 1)] == end)
    nxt_start = b_start[np.clip(pos + 1, 0, len(b_start) - 1)]
    nxt = np.minimum(np.searchsorted(start, nxt_start, side="left"), len(k) - 1)
    after = np.where(closes & ~host.launch_bound[nxt], nxt_start - end, 0)
    lat = np.where(opens & ~host.launch_bound, np.maximum(before - usual, 0), 0) + np.maximum(after - usual, 0)
    return np.where(act.kernel_is_comm, lat, 0).astype(np.int64)


def cross_rank_columns(cross_rank: CrossRankSummary | None, rank: int) -> pd.DataFrame | None:
    """``(start_ns, transfer_ns, wait_ns)`` of this rank's matched instances, or None without cross-rank data."""
    if cross_rank is None or f"start_ns_r{rank}" not in cross_rank.per_collective:
        return None
    per = cross_rank.per_collective
    return pd.DataFrame({"start_ns": per[f"start_ns_r{rank}"].to_numpy(np.int64),
                         "transfer_ns": per["transfer_ns"].to_numpy(np.int64),
                         "wait_ns": per[f"wait_ns_r{rank}"].to_numpy(np.int64)}).drop_duplicates("start_ns")


def _instances(dev: DeviceSummary, act: DeviceActivity, host: HostEvidence,
               matched: pd.DataFrame | None) -> pd.DataFrame:
    """The device's collectives with their host evidence, transfer and wait (one row per instance)."""
    comm = act.kernel_is_comm
    k = act.kernels
    ev = pd.DataFrame({
        "start_ns": k["start_ns"][comm], "correlation": k["correlation"][comm],
        "launch_bound": host.launch_bound[comm], "latency_ns": _dependency_latency(act, host)[comm],
        "issue_start_ns": host.issue_start_ns, "issue_end_ns": host.issue_end_ns, "op": host.issue_op,
        "source": host.issue_source, "call_start_ns": host.call_start_ns, "call_end_ns": host.call_end_ns,
        "call_op": host.call_op,
    }).drop_duplicates(["start_ns", "correlation"])
    coll = dev.collectives
    rows = coll[["start_ns", "correlation", "step", "exposed_ns"]].merge(
        ev, on=["start_ns", "correlation"], how="left")
    rows["kind"] = coll["kind"].astype(str).to_numpy() if "kind" in coll else ""
    rows["exposed_ns"] = rows["exposed_ns"].astype(np.int64)
    own = _own_transfer(coll)
    if matched is not None:
        rows = rows.merge(matched, on="start_ns", how="left")
        unmatched = rows["transfer_ns"].isna().to_numpy()
        rows["transfer_ns"] = np.where(unmatched, own, rows["transfer_ns"].fillna(0)).astype(np.int64)
        rows["wait_ns"] = np.where(unmatched, coll["duration_ns"].to_numpy(np.int64) - own,
                                   rows["wait_ns"].fillna(0)).astype(np.int64)
    else:
        rows["transfer_ns"] = own
        rows["wait_ns"] = coll["duration_ns"].to_numpy(np.int64) - own
    rows["op"] = rows["op"].fillna(-1).astype(np.int64)
    rows["call_op"] = rows["call_op"].fillna(-1).astype(np.int64)
    rows["launch_bound"] = rows["launch_bound"].fillna(False).astype(bool)
    rows["latency_ns"] = rows["latency_ns"].fillna(0).astype(np.int64)
    rows["source"] = rows["source"].fillna("none")
    return rows


def _host_only_rows(calls: pd.DataFrame, first_id: int) -> pd.DataFrame:
    """Rows like :func:`_instances`' for collective calls that launched no kernel (CPU-side collectives): host time
    only — the issue reading is the shortest issuing range inside the call, the whole call its outermost range."""
    n = len(calls)
    ids = first_id + np.arange(n, dtype=np.int64)
    end = calls["end_ns"].to_numpy(np.int64)
    zero = np.zeros(n, dtype=np.int64)
    return pd.DataFrame({
        "start_ns": calls["start_ns"].to_numpy(np.int64), "step": calls["step"].to_numpy(np.int64),
        "exposed_ns": zero, "launch_bound": np.zeros(n, dtype=bool), "latency_ns": zero,
        "issue_start_ns": end - calls["issue_ns"].to_numpy(np.int64), "issue_end_ns": end, "op": ids,
        "source": "cpu_op", "call_start_ns": calls["start_ns"].to_numpy(np.int64), "call_end_ns": end,
        "call_op": ids, "kind": calls["kind"].astype(str).to_numpy(), "transfer_ns": zero, "wait_ns": zero})


def _own_transfer(coll: pd.DataFrame) -> np.ndarray:
    """Transfer time of each instance from this rank alone: the 10th percentile of the durations of the same
    collective (kind, size, kernel) — its fastest instances are those where this rank arrived last."""
    if len(coll) == 0:
        return np.zeros(0, dtype=np.int64)
    keys = [c for c in ("kind", "bytes", "name") if c in coll]
    dur = coll["duration_ns"].astype(np.int64)
    fast = dur.groupby([coll[k].astype(str) for k in keys]).transform(lambda d: d.quantile(OWN_TRANSFER_Q))
    return np.minimum(fast.to_numpy(), dur.to_numpy()).astype(np.int64)


def _issue_capped(issue: np.ndarray, counted: np.ndarray, kind: pd.Series) -> np.ndarray:
    """Issue time of each call, at most ``ISSUE_OUTLIER`` × the median counted call of the same collective kind:
    a call far longer than its kind's usual one was held up (preemption, the profiler flushing a buffer), and
    that time would have been lost wherever it fell."""
    usual = pd.Series(np.where(counted, issue, np.nan)).groupby(kind.to_numpy()).transform("median")
    cap = usual.fillna(np.inf).to_numpy() * ISSUE_OUTLIER
    return np.minimum(issue, cap).astype(np.int64)


def _segment_savings(rows: pd.DataFrame, host: HostEvidence, whole_call: bool = False) -> pd.DataFrame:
    """Per step (ns): saving, host and GPU parts, exposed, wait, issue time, counts (see the module doc). With
    ``whole_call``, a collective's host time is its whole call (outermost issuing range) plus the CPU work slowed
    right after it (``slowed_ns``), instead of NCCL's issue alone."""
    op, start, end = ("call_op", "call_start_ns", "call_end_ns") if whole_call else \
        ("op", "issue_start_ns", "issue_end_ns")
    linked = rows[op].to_numpy() >= 0
    b = np.where(linked, rows[end].fillna(-1).to_numpy(np.int64), -1)
    a = np.where(linked, rows[start].fillna(-1).to_numpy(np.int64), -1)
    sync = host.sync_start_ns
    seg = np.where(linked, np.searchsorted(sync, b, side="right"), -1)
    seg_end = np.where(linked & (seg < len(sync)), sync[np.minimum(seg, max(len(sync) - 1, 0))]
                       if len(sync) else NEVER, NEVER)
    first_of_op = linked & ~rows[op].duplicated().to_numpy()
    slowed = rows["slowed_ns"].to_numpy(np.int64) if whole_call and "slowed_ns" in rows else 0
    parts = pd.DataFrame({
        "step": rows["step"].to_numpy(np.int64), "seg": seg,
        "issue_ns": np.where(first_of_op, _issue_capped(b - a, first_of_op, rows["kind"]), 0),
        "slowed_ns": np.where(first_of_op, slowed, 0),
        "first_b": np.where(linked, b, NEVER), "seg_end": seg_end,
        "gpu_ns": (np.minimum(rows["exposed_ns"], rows["transfer_ns"]) + rows["latency_ns"]).to_numpy(np.int64),
        "latency_ns": rows["latency_ns"].to_numpy(np.int64),
        "transfer_ns": rows["transfer_ns"].to_numpy(np.int64),
        "exposed_ns": rows["exposed_ns"].to_numpy(np.int64), "wait_ns": rows["wait_ns"].to_numpy(np.int64),
        "launch_bound": rows["launch_bound"].to_numpy(np.int64), "collectives": 1,
    })
    parts = parts[parts["step"] >= 0]
    segs = parts.groupby(["step", "seg"]).agg(
        issue_ns=("issue_ns", "sum"), slowed_ns=("slowed_ns", "sum"), first_b=("first_b", "min"),
        seg_end=("seg_end", "first"),
        gpu_ns=("gpu_ns", "sum"), latency_ns=("latency_ns", "sum"), exposed_ns=("exposed_ns", "sum"),
        wait_ns=("wait_ns", "sum"),
        transfer_ns=("transfer_ns", "sum"), launch_bound=("launch_bound", "sum"),
        collectives=("collectives", "sum"))
    has_host = segs.index.get_level_values("seg") >= 0
    slack = np.where(has_host, host.waiting_between(segs["first_b"].to_numpy(), segs["seg_end"].to_numpy()), 0)
    # a segment's ops after its calls may run faster than far ones on a noisy host: never a negative cost
    segs["slowed_ns"] = np.maximum(segs["slowed_ns"].to_numpy(), 0)
    segs["host_part_ns"] = np.minimum(segs["issue_ns"].to_numpy() + segs["slowed_ns"].to_numpy(), slack)
    segs["gpu_reading_ns"] = segs["gpu_ns"]  # the GPU reading alone, whichever wins the segment
    segs["host_chosen"] = segs["host_part_ns"] > segs["gpu_ns"]
    segs["saving_ns"] = np.maximum(segs["host_part_ns"], segs["gpu_ns"])
    segs["host_part_ns"] = np.where(segs["host_chosen"], segs["host_part_ns"], 0)
    segs["gpu_part_ns"] = np.where(segs["host_chosen"], 0, segs["gpu_ns"])
    segs["latency_ns"] = np.where(segs["host_chosen"], 0, segs["latency_ns"])
    cols = ["saving_ns", "host_part_ns", "gpu_part_ns", "latency_ns", "exposed_ns", "wait_ns", "transfer_ns",
            "issue_ns", "slowed_ns", "gpu_reading_ns",
            "launch_bound", "collectives"]
    return segs[cols].groupby(level="step").sum().rename(columns={"issue_ns": "host_issue_ns"})


def _rank_steps(trace: Trace, dev: DeviceSummary, matched: pd.DataFrame | None, with_range: bool = True
                ) -> RankCosts | None:
    """Per step of one rank (ns): its own communication cost (``own_ns``) and parts; plus its evidence. None when
    the device has neither collectives nor collective calls without kernels. Without ``with_range``, the readings
    only the range uses (``calls_only_ns``, ``ceiling_ns``, ``slowdown_high_ns``) are left out."""
    act = dev.activity if isinstance(dev.activity, DeviceActivity) and dev.activity.trace is trace \
        else gather(trace, dev.rank, dev.device)
    calls = collective_calls(trace, act)
    cpu_side = host_only_in_steps(trace, act, dev.per_step, calls)
    if len(dev.collectives) == 0 and len(cpu_side) == 0:
        return None
    host = host_evidence(trace, act)
    rows = _instances(dev, act, host, matched)
    if len(cpu_side):
        first = int(max(rows["op"].max(), rows["call_op"].max(), -1)) + 1 if len(rows) else 0
        rows = pd.concat([rows, _host_only_rows(cpu_side, first)], ignore_index=True) if len(rows) else \
            _host_only_rows(cpu_side, first)
    # host work slowed right after each call, counted with the call's own host time
    slowed = pd.Series(host_slowed_after_calls(trace, act, calls), index=calls["start_ns"].to_numpy(np.int64))
    slowed = slowed[~slowed.index.duplicated()]
    rows["slowed_ns"] = rows["call_start_ns"].map(slowed).fillna(0).astype(np.int64)
    steps = _segment_savings(rows, host, whole_call=True)
    idx = steps.index
    issue_only = _segment_savings(rows, host).reindex(idx).fillna(0)
    # compute slowed beside communication, the share of it that was transfer (a waiting rank's spinning kernel
    # would not slow it once communication is free, and that rank is not the one setting the step)
    slowed = _contention(act, dev.per_step).reindex(idx).fillna(0).to_numpy()
    busy = (steps["transfer_ns"] + steps["wait_ns"]).to_numpy()
    share = np.where(busy > 0, steps["transfer_ns"].to_numpy() / np.maximum(busy, 1), 1.0)
    contention = (slowed * np.minimum(share, 1.0)).astype(np.int64)
    steps["contention_ns"] = contention
    steps["as_profiled_ns"] = steps["saving_ns"] + contention
    if with_range:
        calls_only = _segment_savings(rows.assign(slowed_ns=0), host, whole_call=True).reindex(idx).fillna(0)
        steps["calls_only_ns"] = (calls_only["saving_ns"] + contention).astype(np.int64)
    steps["gpu_reading_ns"] = steps["gpu_reading_ns"] + contention
    steps["nccl_issue_ns"] = issue_only["host_issue_ns"].astype(np.int64)
    steps["issue_only_own_ns"] = (issue_only["saving_ns"] + contention).astype(np.int64)
    # a rank the profiler made launch-bound: weigh the GPU reading by how much of its idle time the profiler
    # explains (all of it → the GPU reading; half of it or less → the host reading as profiled)
    weigh_profiler(steps, trace, dev)
    if with_range:
        upper_readings(steps, dev.per_step)
    linked = act.launch_row >= 0
    comm = act.kernel_is_comm
    evidence: dict[str, Any] = {
        "kernels_linked_pct": _pct(int(linked.sum()), len(linked)),
        "launch_bound_kernel_pct": _pct(int(host.launch_bound.sum()), int(linked.sum())),
        "comm_launch_bound_pct": _pct(int(host.launch_bound[comm].sum()), int(comm.sum())),
        "host_syncs": len(host.sync_start_ns),
        "issue_source": rows["source"].mode().iat[0] if len(rows) else "none",
        "calls_without_kernels": len(cpu_side),
    }
    per_step = dev.per_step
    if len(per_step) and {"duration_ns", "idle_ns"} <= set(per_step.columns):
        idle = per_step["idle_ns"] / per_step["duration_ns"].where(per_step["duration_ns"] > 0)
        evidence["gpu_idle_pct"] = round(100.0 * float(idle.median()), 1) if idle.notna().any() else None
        evidence["step_ns"] = int(per_step["duration_ns"].median())
    return steps, evidence


def _rank_details(steps: pd.DataFrame, evidence: dict[str, Any]) -> dict[str, Any]:
    if len(steps) == 0:
        return {**evidence, "note": "no collective inside a step window"}
    med = steps.median()
    return {
        **evidence,
        "own_ns": int(med["own_ns"]), "exposed_ns": int(med["exposed_ns"]), "wait_ns": int(med["wait_ns"]),
        "host_issue_ns": int(med["host_issue_ns"]), "host_issue_critical_ns": int(med["host_part_ns"]),
        "host_nccl_issue_ns": int(med["nccl_issue_ns"]), "issue_only_own_ns": int(med["issue_only_own_ns"]),
        "host_slowed_after_calls_ns": int(med["slowed_ns"]),
        "gpu_transfer_critical_ns": int(med["gpu_part_ns"]), "contention_ns": int(med["contention_ns"]),
        "dependency_latency_ns": int(med["latency_ns"]),
        "as_profiled_ns": int(med["as_profiled_ns"]), "gpu_reading_ns": int(med["gpu_reading_ns"]),
        "profiler_ns": int(med["profiler_ns"]), "idle_ns": int(med["idle_ns"]),
        "gpu_weight": round(float(med["gpu_weight"]), 2),
        "collectives_per_step": int(med["collectives"]),
        "launch_bound_collectives_per_step": float(med["launch_bound"]),
        "bound": {"host_launch": "host", "gpu_transfer": "gpu", "mixed": "mixed"}[
            _basis(int(steps["host_part_ns"].sum()), int(steps["own_ns"].sum()))],
    }


def estimate_comm_free(traces: list[Trace], devices: list[DeviceSummary],
                       cross_rank: CrossRankSummary | None, *, with_range: bool = True) -> WhatIf:
    """Step-time saving if communication were free (see the module doc for the method): each rank's costs
    (:func:`rank_comm_costs`, the first of its devices that has any) combined by :func:`combine_comm_free`;
    without ``with_range``, ``details`` leave out the range and its confidence (``what_if_range.step_range``)."""
    ranks: dict[int, RankCosts] = {}
    by_path: dict[str, Trace] = {}
    for t in traces:  # the first trace of each path, looked up once per device (not a scan per device)
        by_path.setdefault(t.path, t)
    for dev in devices:
        trace = by_path.get(dev.trace, traces[0] if len(traces) == 1 else None)
        if trace is None or dev.rank in ranks:
            continue
        steps = rank_comm_costs(trace, dev, cross_rank, with_range=with_range)
        if steps is not None:
            ranks[dev.rank] = steps
    return combine_comm_free(ranks, devices, cross_rank, with_range=with_range)


def trace_comm_costs(trace: Trace, devices: list[DeviceSummary], cross_rank: CrossRankSummary | None,
                     columns: dict[int, pd.DataFrame | None] | None = None, *, with_range: bool = True
                     ) -> dict[int, RankCosts]:
    """:func:`rank_comm_costs` of each rank of one trace: its first device (in order) that has any. Where the
    trace lives (a Dask worker), with the cross-rank ``columns`` of its ranks (:func:`cross_rank_columns`) instead
    of the whole cross-rank table; :func:`estimate_comm_free` takes the first trace's costs of each rank."""
    out: dict[int, RankCosts] = {}
    for dev in devices:
        if dev.rank in out:
            continue
        matched = columns.get(dev.rank) if columns is not None else cross_rank_columns(cross_rank, dev.rank)
        steps = _rank_steps(trace, dev, matched, with_range)
        if steps is not None:
            out[dev.rank] = steps
    return out


def rank_comm_costs(trace: Trace, dev: DeviceSummary, cross_rank: CrossRankSummary | None, *,
                    with_range: bool = True) -> RankCosts | None:
    """Per step of one rank: its own communication cost and its parts, with its evidence (None when the device
    has neither collectives nor collective calls without kernels)."""
    return _rank_steps(trace, dev, cross_rank_columns(cross_rank, dev.rank), with_range)


def combine_comm_free(ranks: dict[int, RankCosts], devices: list[DeviceSummary],
                      cross_rank: CrossRankSummary | None, *, with_range: bool = True) -> WhatIf:
    """The what-if from each rank's costs (:func:`rank_comm_costs`): per step, the cost of the rank the others
    wait for; the median over steps."""
    if not ranks:
        has_steps = any(d.steps for d in devices)
        return WhatIf(0 if has_steps else None, "gpu_transfer", {"note": "no communication in the trace"})
    stepped = {r: s for r, (s, _) in ranks.items() if len(s)}  # ranks with collectives inside step windows
    own = pd.concat({r: s["own_ns"] for r, s in stepped.items()}, axis=1).dropna() if stepped else pd.DataFrame()
    wait = pd.concat({r: s["wait_ns"] for r, s in stepped.items()}, axis=1).reindex(own.index) if stepped \
        else pd.DataFrame()
    host = pd.concat({r: s["host_part_ns"] * (1 - s["gpu_weight"]) for r, s in stepped.items()}, axis=1
                     ).reindex(own.index) if stepped else pd.DataFrame()
    issue_only = pd.concat({r: s["issue_only_own_ns"] for r, s in stepped.items()}, axis=1).reindex(own.index) \
        if stepped else pd.DataFrame()
    details: dict[str, Any] = {
        "method": "per host-sync segment max(host time of the collective calls GPU waited for, exposed transfer) "
                  "+ contention, of the rank that waits least; median over steps",
        "ranks": {str(r): _rank_details(s, e) for r, (s, e) in ranks.items()}, "steps_used": len(own)}
    if cross_rank is not None:
        details["transfer_ns"] = cross_rank.transfer_ns_per_step
    else:
        details["note"] = ("one rank: transfer = 10th percentile of the same collective's durations (kind, size, "
                           "kernel); the rest counts as waiting for other ranks")
    if len(own) == 0:
        details["note"] = "no step holds communication on every rank"
        return WhatIf(None, "gpu_transfer", details)
    # the rank the others wait for sets the step; without cross-rank data, the smallest own cost
    key = wait.to_numpy() if cross_rank is not None else own.to_numpy()
    pick = key.argmin(axis=1)
    rows = np.arange(len(own))
    step_saving = own.to_numpy()[rows, pick]
    step_host = host.to_numpy()[rows, pick]
    details["limiting_rank_by_step"] = {str(int(s)): int(own.columns[c]) for s, c in zip(own.index, pick,
                                                                                        strict=True)}
    details["saving_ns_by_step"] = {str(int(s)): int(v) for s, v in zip(own.index, step_saving, strict=True)}
    details["host_share_pct"] = _pct(int(step_host.sum()), int(step_saving.sum()))
    details["issue_only_saving_ns"] = int(np.median(issue_only.to_numpy()[rows, pick]))
    basis = _basis(int(step_host.sum()), int(step_saving.sum()))
    if with_range:
        limiting = pd.DataFrame([stepped[int(own.columns[c])].loc[step] for step, c in zip(own.index, pick,
                                                                                            strict=True)])
        details.update(step_range(limiting, int(np.median(step_saving)), basis))
    details.update(_partial_run(cross_rank))
    return WhatIf(int(np.median(step_saving)), basis, details)


def _partial_run(cross_rank: CrossRankSummary | None) -> dict[str, Any]:
    """Confidence low when ranks of the job are missing (``cross_rank.extra["partial"]``, from run identity):
    the given ranks' collectives include waiting for ranks not in the trace, so transfer and wait blur."""
    if cross_rank is None or not cross_rank.extra.get("partial"):
        return {}
    missing, world = cross_rank.extra.get("ranks_missing"), cross_rank.extra.get("world_size")
    return {"partial": True, "ranks_missing": missing, "confidence": "low",
            "partial_note": f"{missing} of {world} ranks missing: the given ranks' collectives include waiting "
                            "for ranks not in the trace"}

