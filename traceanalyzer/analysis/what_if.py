"""What if communication were free: the step-time reduction, from per-collective critical-path evidence.

With communication free, every rank runs its own compute critical path and the step lasts as long as the slowest
rank. Per rank and step, the communication cost that would disappear (``own``) is the sum over its collectives of:

* **host-bound collective** (its kernel started within ``LAUNCH_SLACK_NS`` of its launch call, on an idle device:
  the GPU was waiting for the host): the host time of issuing it — the outermost CPU op that issued it
  (``c10d::allreduce_`` / ``record_param_comms`` / ``nccl:*`` / NCCL NVTX ranges), else the launch API call;
* **GPU-bound collective** (queued behind other GPU work): its *exposed* time (comm running, no compute kernel),
  capped at the instance's cross-rank **transfer** time — waiting for a slower rank moves elsewhere when
  communication is free, it does not disappear;
* plus **contention**: how much longer compute kernels ran while communication ran beside them (overlapped
  schedules), against the same kernel's (name, grid, block) median duration with no communication beside it.

The step is set by the rank the others wait for (least wait per step, from the cross-rank matching; without it,
the rank with the smallest ``own``), so the saving of a step is that rank's ``own``; the estimate is the median
over steps. ``basis`` says which evidence carries it: ``host_launch`` when host issue time is ≥ 75 % of it,
``gpu_transfer`` when ≤ 25 %, else ``mixed``. Method and validation against real runs with and without
all-reduces: docs/METHOD_WHAT_IF.md.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ..trace import Trace
from . import intervals as iv
from .activity import DeviceActivity, gather
from .results import CrossRankSummary, DeviceSummary, WhatIf

LAUNCH_SLACK_NS = 20_000  # a kernel starting this soon after its launch call, on an idle device, waited for it
# CPU ranges that issue a collective: PyTorch's c10d op and profiler record, ProcessGroupNCCL's nccl:* range,
# NCCL's own NVTX ranges, and user annotations named after the collective (e.g. an NVTX "allreduce" range)
ISSUE_OP = re.compile(r"^(c10d::|record_param_comms$|nccl:|ncclGroup|nccl[A-Z][A-Za-z]+$)|"
                      r"^(?i:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all)$")
HOST_SHARE = 0.75  # host share of the saving at/above which basis is host_launch (gpu_transfer at/below 1 - it)


def _lift(times: np.ndarray, lane: np.ndarray, t0: int, span: int) -> np.ndarray:
    """Times of several lanes (dense ids) laid end to end on one axis, so one sorted search serves all lanes."""
    return (times - t0) + lane * span


def _outermost(starts: np.ndarray, ends: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """Mask of ranges not nested in an earlier range of the same lane (inputs sorted by lane, start, -length)."""
    if len(starts) == 0:
        return np.ones(0, dtype=bool)
    t0, span = int(starts.min()), int(ends.max() - starts.min()) + 1
    reach = np.maximum.accumulate(_lift(ends, lane, t0, span))
    lifted = _lift(starts, lane, t0, span)
    return np.r_[True, lifted[1:] >= reach[:-1]]


def _issue_ops(trace: Trace, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Outermost collective-issuing CPU ranges of the given processes: ``(start, end, thread key)``, sorted by
    thread key then start."""
    r = trace.ranges
    empty = np.empty(0, dtype=np.int64)
    if len(r) == 0:
        return empty, empty, empty
    distinct = np.unique(r["name_id"][r["name_id"] >= 0])
    wanted = np.array([i for i in distinct.tolist() if ISSUE_OP.search(trace.strings[i])], dtype=np.int64)
    sel = np.isin(r["name_id"], wanted) & np.isin(r["pid"], pids) & (r["device"] < 0) & (r["end_ns"] > r["start_ns"])
    s, e = r["start_ns"][sel], r["end_ns"][sel]
    thread = _thread_key(r["pid"][sel], r["tid"][sel])
    order = np.lexsort((-(e - s), s, thread))
    s, e, thread = s[order], e[order], thread[order]
    keep = _outermost(s, e, np.unique(thread, return_inverse=True)[1].ravel())
    return s[keep], e[keep], thread[keep]


def _thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return np.asarray(pid, dtype=np.int64) * (1 << 32) + (np.asarray(tid, dtype=np.int64) & 0xFFFFFFFF)


def _containing_op(o_s: np.ndarray, o_e: np.ndarray, o_thread: np.ndarray, t: np.ndarray,
                   thread: np.ndarray) -> np.ndarray:
    """Index of the op (outermost, same thread) containing each time ``t``, -1 if none."""
    if len(o_s) == 0 or len(t) == 0:
        return np.full(len(t), -1, dtype=np.int64)
    _, inverse = np.unique(np.r_[o_thread, thread], return_inverse=True)
    inverse = inverse.ravel()
    t0 = int(min(o_s.min(), t.min()))
    span = int(max(o_e.max(), t.max()) - t0) + 1
    key = _lift(o_s, inverse[: len(o_s)], t0, span)  # sorted: ops are ordered by thread key, then start
    probe = _lift(t, inverse[len(o_s):], t0, span)
    idx = np.searchsorted(key, probe, side="right") - 1
    ok = (idx >= 0) & (o_thread[np.maximum(idx, 0)] == thread) & (o_e[np.maximum(idx, 0)] > t)
    return np.where(ok, idx, -1)


def _comm_kernel_evidence(trace: Trace, dev: DeviceSummary) -> tuple[pd.DataFrame, dict[str, Any], DeviceActivity]:
    """Per communication kernel of the device: launch-bound flag and host issue time; plus device-wide evidence."""
    act = gather(trace, dev.rank, dev.device)
    k = act.kernels
    api = trace.api_calls
    linked = act.launch_row >= 0
    api_end = np.where(linked, api["end_ns"][np.maximum(act.launch_row, 0)], -1) if len(api) else \
        np.full(len(k), -1, dtype=np.int64)
    api_start = np.where(linked, act.launch_ns, -1)
    busy_starts = act.busy[0]
    pos = np.searchsorted(busy_starts, k["start_ns"], side="right") - 1
    idle_before = (pos >= 0) & (busy_starts[np.maximum(pos, 0)] == k["start_ns"])
    delay = k["start_ns"] - api_end
    launch_bound = linked & idle_before & (delay <= LAUNCH_SLACK_NS)
    comm = act.kernel_is_comm
    # the outermost issuing op on the launching thread that contains the launch call
    o_s, o_e, o_thread = _issue_ops(trace, act.pids)
    op = _containing_op(o_s, o_e, o_thread, api_start, _thread_key(act.launch_pid, act.launch_tid))
    op = np.where(linked & comm, op, -1)
    op_len = (o_e - o_s)[np.maximum(op, 0)] if len(o_s) else np.zeros(len(k), dtype=np.int64)
    issue = np.where(op >= 0, op_len, np.where(linked, api_end - api_start, 0))
    # an op (or a launch call: a CUDA graph) that issued several kernels is counted once, split evenly
    owner = np.where(op >= 0, op, np.where(linked, len(o_s) + act.launch_row, -1))
    shared = np.ones(len(k), dtype=np.int64)
    if (owner >= 0).any():
        _, inverse, counts = np.unique(owner[owner >= 0], return_inverse=True, return_counts=True)
        shared[owner >= 0] = counts[inverse.ravel()]
    frame = pd.DataFrame({
        "start_ns": k["start_ns"][comm], "correlation": k["correlation"][comm],
        "launch_bound": launch_bound[comm], "issue_ns": (issue // shared)[comm],
        "issue_source": np.where(op[comm] >= 0, "cpu_op", np.where(linked[comm], "launch_api", "none")),
    })
    evidence = {
        "kernels_linked_pct": _pct(int(linked.sum()), len(k)),
        "launch_bound_kernel_pct": _pct(int(launch_bound.sum()), int(linked.sum())),
        "comm_launch_bound_pct": _pct(int(launch_bound[comm].sum()), int(comm.sum())),
    }
    return frame, evidence, act


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


def _pct(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def _cross_rank_columns(cross_rank: CrossRankSummary | None, rank: int) -> pd.DataFrame | None:
    """``(start_ns, transfer_ns, wait_ns)`` of this rank's matched instances, or None without cross-rank data."""
    if cross_rank is None or f"start_ns_r{rank}" not in cross_rank.per_collective:
        return None
    per = cross_rank.per_collective
    return pd.DataFrame({"start_ns": per[f"start_ns_r{rank}"].to_numpy(np.int64),
                         "transfer_ns": per["transfer_ns"].to_numpy(np.int64),
                         "wait_ns": per[f"wait_ns_r{rank}"].to_numpy(np.int64)}).drop_duplicates("start_ns")


def _rank_steps(trace: Trace, dev: DeviceSummary, matched: pd.DataFrame | None
                ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per step of one rank (ns): ``own`` comm cost (host part + GPU part), wait for other ranks, evidence."""
    coll = dev.collectives
    evidence_k, evidence, act = _comm_kernel_evidence(trace, dev)
    merged = coll[["start_ns", "correlation", "step", "exposed_ns"]].merge(
        evidence_k.drop_duplicates(["start_ns", "correlation"]), on=["start_ns", "correlation"], how="left")
    exposed = merged["exposed_ns"].to_numpy(np.int64)
    transfer, wait = exposed, np.zeros(len(merged), dtype=np.int64)
    if matched is not None:
        merged = merged.merge(matched, on="start_ns", how="left")
        transfer = merged["transfer_ns"].fillna(-1).to_numpy(np.int64)
        transfer = np.where(transfer >= 0, transfer, exposed)  # unmatched: exposed as it is
        wait = merged["wait_ns"].fillna(0).to_numpy(np.int64)
    lb = merged["launch_bound"].fillna(False).to_numpy(bool)
    issue = merged["issue_ns"].fillna(0).to_numpy(np.int64)
    parts = pd.DataFrame({
        "step": merged["step"].to_numpy(np.int64),
        "host_part_ns": np.where(lb, issue, 0),
        "gpu_part_ns": np.where(lb, 0, np.minimum(exposed, transfer)),  # waiting moves elsewhere, not away
        "exposed_ns": exposed, "wait_ns": wait, "host_issue_ns": issue,
        "launch_bound": lb.astype(np.int64), "collectives": 1,
    })
    steps = parts[parts["step"] >= 0].groupby("step").sum()
    steps["contention_ns"] = _contention(act, dev.per_step).reindex(steps.index).fillna(0).astype(np.int64)
    steps["own_ns"] = steps["host_part_ns"] + steps["gpu_part_ns"] + steps["contention_ns"]
    evidence["issue_source"] = merged["issue_source"].fillna("none").mode().iat[0] if len(merged) else "none"
    per_step = dev.per_step
    if len(per_step) and {"duration_ns", "idle_ns"} <= set(per_step.columns):
        idle = per_step["idle_ns"] / per_step["duration_ns"].where(per_step["duration_ns"] > 0)
        evidence["gpu_idle_pct"] = round(100.0 * float(idle.median()), 1) if idle.notna().any() else None
        evidence["step_ns"] = int(per_step["duration_ns"].median())
    return steps, evidence


def _basis(host: int, total: int) -> str:
    if total <= 0:
        return "gpu_transfer"
    share = host / total
    return "host_launch" if share >= HOST_SHARE else "gpu_transfer" if share <= 1 - HOST_SHARE else "mixed"


def _trace_of(traces: list[Trace], dev: DeviceSummary) -> Trace | None:
    return next((t for t in traces if t.path == dev.trace), traces[0] if len(traces) == 1 else None)


def _rank_details(steps: pd.DataFrame, evidence: dict[str, Any]) -> dict[str, Any]:
    med = steps.median()
    return {
        **evidence,
        "own_ns": int(med["own_ns"]), "exposed_ns": int(med["exposed_ns"]), "wait_ns": int(med["wait_ns"]),
        "host_issue_ns": int(med["host_issue_ns"]), "host_issue_critical_ns": int(med["host_part_ns"]),
        "gpu_transfer_critical_ns": int(med["gpu_part_ns"]), "contention_ns": int(med["contention_ns"]),
        "collectives_per_step": int(med["collectives"]),
        "launch_bound_collectives_per_step": float(med["launch_bound"]),
        "bound": {"host_launch": "host", "gpu_transfer": "gpu", "mixed": "mixed"}[
            _basis(int(steps["host_part_ns"].sum()), int(steps["own_ns"].sum()))],
    }


def estimate_comm_free(traces: list[Trace], devices: list[DeviceSummary],
                       cross_rank: CrossRankSummary | None) -> WhatIf:
    """Step-time saving if communication were free (see the module doc for the method)."""
    ranks: dict[int, tuple[pd.DataFrame, dict[str, Any]]] = {}
    for dev in devices:
        trace = _trace_of(traces, dev)
        if trace is None or len(dev.collectives) == 0 or dev.rank in ranks:
            continue
        ranks[dev.rank] = _rank_steps(trace, dev, _cross_rank_columns(cross_rank, dev.rank))
    if not ranks:
        has_steps = any(d.steps for d in devices)
        return WhatIf(0 if has_steps else None, "gpu_transfer", {"note": "no communication in the trace"})
    own = pd.concat({r: s["own_ns"] for r, (s, _) in ranks.items()}, axis=1).dropna()
    wait = pd.concat({r: s["wait_ns"] for r, (s, _) in ranks.items()}, axis=1).reindex(own.index)
    host = pd.concat({r: s["host_part_ns"] for r, (s, _) in ranks.items()}, axis=1).reindex(own.index)
    details: dict[str, Any] = {
        "method": "own comm cost (host issue if launch-bound, else exposed transfer) of the rank that waits "
                  "least, median over steps",
        "ranks": {str(r): _rank_details(s, e) for r, (s, e) in ranks.items()}, "steps_used": len(own)}
    if cross_rank is not None:
        details["transfer_ns"] = cross_rank.transfer_ns_per_step
    else:
        details["note"] = "one rank: exposed time may include waiting for other ranks (an upper bound)"
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
    return WhatIf(int(np.median(step_saving)), _basis(int(step_host.sum()), int(step_saving.sum())), details)
