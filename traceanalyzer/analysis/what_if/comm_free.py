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

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from ...model.trace import Table, Trace
from ..activity import DeviceActivity, gather
from ..device import DeviceKey, DeviceState, device_key
from ..grouped import dense_codes, run_quantile, sorted_runs
from ..host_issue import HostEvidence, collective_calls, host_evidence, host_only_in_steps, host_slowed_after_calls
from ..numeric import intervals as iv
from ..numeric.frames import array_of, frame
from ..results import (
    CrossRankSummary,
    DeviceSummary,
    PartialRun,
    RankEvidence,
    RankStepFigures,
    RankWhatIf,
    WhatIf,
    WhatIfDetails,
    WhatIfSteps,
)
from .range import profiler_weighing, step_range, upper_bounds

HOST_SHARE = 0.75  # host share of the saving at/above which basis is host_launch (gpu_transfer at/below 1 - it)
NEVER = np.iinfo(np.int64).max
OWN_TRANSFER_Q = 0.1  # quantile of a collective's durations taken as its transfer when other ranks are absent
#: One rank's what-if inputs: per step its own communication cost and parts (ns), and its evidence.
RankCosts = tuple[pd.DataFrame, RankEvidence]
#: Idle time around a collective longer than this is no stream-dependency or graph-node latency (those are µs:
#: ~2.3 µs measured before NCCL kernels of the H200 CUDA-graph decodes) but the host's work, e.g. between passes
DEPENDENCY_MAX_NS = 50_000
ISSUE_OUTLIER = 4  # an issuing call counts at most this many times the median call of its kind on the rank
Columns = dict[str, np.ndarray]  # a table as named numpy columns of one length


def _pct(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def _basis(host: int, total: int) -> str:
    if total <= 0:
        return "gpu_transfer"
    share = host / total
    return "host_launch" if share >= HOST_SHARE else "gpu_transfer" if share <= 1 - HOST_SHARE else "mixed"


def kernel_contention_ns(act: DeviceActivity) -> np.ndarray:
    """Per kernel of the device: how much longer it ran than the same kernel's (name, grid, block) median with no
    communication beside it, where communication ran beside it (0 for communication kernels, kernels without
    such a baseline, and speed-ups); float64, multiples of 0.5 ns."""
    k = act.kernels
    compute = ~act.kernel_is_comm
    out = np.zeros(len(compute), dtype=np.float64)
    if not compute.any() or len(act.comm[0]) == 0:
        return out
    s, dur = k["start_ns"][compute], k["end_ns"][compute]
    beside = iv.overlaps(act.comm, s, dur)
    dur -= s
    kernel = _codes(k, ("name_id", "grid", "block"), compute)
    base = np.full(int(kernel.max()) + 1, np.nan)
    if not beside.all():
        ids, _, by_dur, first = sorted_runs(kernel[~beside], dur[~beside])
        base[ids] = run_quantile(by_dur, first, 0.5)
    of_kernel = base[kernel]
    out[compute] = np.where(beside & ~np.isnan(of_kernel), np.maximum(dur - of_kernel, 0.0), 0.0)
    return out


def _contention(act: DeviceActivity, per_step: pd.DataFrame) -> pd.Series | None:
    """Per step: how much longer compute kernels ran while communication ran beside them (ns,
    :func:`kernel_contention_ns` summed by the step the kernel starts in); None where no compute kernel ran, no
    communication, or no step."""
    k = act.kernels
    compute = ~act.kernel_is_comm
    if not compute.any() or len(act.comm[0]) == 0 or len(per_step) == 0:
        return None
    excess = kernel_contention_ns(act)[compute]
    s = k["start_ns"][compute]
    step = iv.window_ids(s, per_step["start_ns"].to_numpy(), per_step["end_ns"].to_numpy(), per_step["step"].to_numpy())
    del s
    steps = np.unique(step)
    total = np.bincount(np.searchsorted(steps, step), weights=excess, minlength=len(steps))
    return pd.Series(total[steps >= 0].astype(np.int64), index=steps[steps >= 0])


def _codes(table: Table, columns: tuple[str, ...], rows: np.ndarray) -> np.ndarray:
    """One dense int64 code per distinct combination of the (integer) ``columns`` at ``rows`` (a mask), in their
    sorted order: each key's rank among its distinct values, combined, made dense again (so the next product cannot
    overflow) — binary searches in the distinct values, no hash table or sort of every row; one column gathered at
    a time."""
    code = np.zeros(int(rows.sum()), dtype=np.int64)
    for column in columns:
        part = dense_codes(table[column][rows])
        code *= int(part.max()) + 1
        code += part
        code = dense_codes(code)
    return code


def _dependency_latency(act: DeviceActivity, host: HostEvidence, steps: pd.DataFrame | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel (ns, communication kernels only): idle time around it beyond the device's usual gap between
    kernels — the stream dependency / graph-node latency of a collective on a busy GPU (measured on the H200
    CUDA-graph decodes: ~2.3 µs before an NCCL kernel against ~0.4 µs between other kernels) — and the idle time
    around it that is *not* that latency: a gap that crosses a step boundary (the gap between passes) or lasts
    longer than ``DEPENDENCY_MAX_NS`` (the host's work: no stream dependency keeps an idle GPU waiting that long),
    reported as its own component (``step_gap_after_comm_ns``), never as communication. Gaps before a
    launch-bound kernel are time waiting for the host and count there instead."""
    k = act.kernels
    out = np.zeros(len(k), dtype=np.int64)
    gap_out = np.zeros(len(k), dtype=np.int64)
    b_start, b_end = act.busy
    if len(b_start) < 2 or not act.kernel_is_comm.any():
        return out, gap_out
    start, end = k["start_ns"], k["end_ns"]
    pos = np.searchsorted(b_start, start, side="right") - 1  # busy interval holding each kernel
    opens = (pos >= 1) & (b_start[np.maximum(pos, 0)] == start)
    # the usual gap: before the kernels opening a busy interval, neither communication nor waiting for the host
    usual_rows = np.flatnonzero(opens & ~act.kernel_is_comm & ~host.launch_bound)
    if len(usual_rows) == 0:
        return out, gap_out
    usual = int(np.median(start[usual_rows] - b_end[pos[usual_rows] - 1]))
    del usual_rows
    comm = np.flatnonzero(act.kernel_is_comm)  # the rest only for the communication kernels
    c_pos, c_opens, c_start, c_end = pos[comm], opens[comm], start[comm], end[comm]
    del pos, opens
    prev_end = b_end[np.maximum(c_pos - 1, 0)]
    before = np.where(c_opens, c_start - prev_end, 0)
    closes = (c_pos >= 0) & (c_pos + 1 < len(b_start)) & (b_end[np.clip(c_pos, 0, len(b_end) - 1)] == c_end)
    nxt_start = b_start[np.clip(c_pos + 1, 0, len(b_start) - 1)]
    nxt = np.minimum(np.searchsorted(start, nxt_start, side="left"), len(k) - 1)
    after = np.where(closes & ~host.launch_bound[nxt], nxt_start - c_end, 0)
    before = np.where(c_opens & ~host.launch_bound[comm], before, 0)
    # not a dependency: a gap holding a step boundary, or longer than any stream / graph-node latency
    bounds = np.sort(np.concatenate([array_of(steps, "start_ns", np.int64), array_of(steps, "end_ns", np.int64)])) \
        if steps is not None and len(steps) else np.zeros(0, dtype=np.int64)

    def host_gap(lo: np.ndarray, hi: np.ndarray, gap: np.ndarray) -> np.ndarray:
        crosses = np.searchsorted(bounds, lo, side="left") < np.searchsorted(bounds, hi, side="right")
        return (gap > 0) & (crosses | (gap > DEPENDENCY_MAX_NS))

    gap_before, gap_after = host_gap(prev_end, c_start, before), host_gap(c_end, nxt_start, after)
    lat = np.where(gap_before, 0, np.maximum(before - usual, 0)) + np.where(gap_after, 0, np.maximum(after - usual, 0))
    out[comm] = lat
    gap_out[comm] = np.where(gap_before, before, 0) + np.where(gap_after, after, 0)
    return out, gap_out


def cross_rank_columns(cross_rank: CrossRankSummary | None, rank: int) -> Columns | None:
    """``start_ns``, ``transfer_ns``, ``wait_ns`` (int64 arrays) of this rank's matched instances, or None without
    cross-rank data (arrays, not a frame: one per rank, a frame's construction would cost more than the work)."""
    matched = cross_rank.rank_matches(rank) if cross_rank is not None else None
    if matched is None:
        return None
    first = matched.first_per_start()  # the first row of each start, in table order
    return {"start_ns": first.start_ns, "transfer_ns": first.transfer_ns, "wait_ns": first.wait_ns}


def _first_match(left: tuple[np.ndarray, ...], right: tuple[np.ndarray, ...]) -> np.ndarray:
    """For each row of ``left`` (parallel key arrays), the first row of ``right`` with equal keys, -1 if none: a
    left merge on keys where the right side keeps its first duplicate."""
    n_left, n_right = len(left[0]), len(right[0])
    if n_left == 0 or n_right == 0:
        return np.full(n_left, -1, dtype=np.int64)
    keys = [np.concatenate((np.asarray(r, dtype=np.int64), np.asarray(lf, dtype=np.int64)))
            for lf, r in zip(left, right, strict=True)]
    order, first = _runs_of(*keys[::-1])  # stable: the right rows come first within a run of equal keys
    run = np.zeros(len(order), dtype=np.int64)
    run[first] = 1
    owner = np.empty(len(order), dtype=np.int64)
    owner[order] = order[first][np.cumsum(run) - 1]
    found = owner[n_right:]
    return np.where(found < n_right, found, -1)


def _instances(dev: DeviceSummary, act: DeviceActivity, host: HostEvidence,
               matched: Columns | None) -> Columns:
    """The device's collectives with their host evidence, transfer and wait (one row per instance); the host
    columns are -1 (``source`` "none") where an instance is no kernel of the device (a peer copy)."""
    comm = np.flatnonzero(act.kernel_is_comm)
    k = act.kernels
    coll = dev.collectives
    start = array_of(coll, "start_ns", np.int64)
    ev = _first_match((start, array_of(coll, "correlation", np.int64)),
                      (k["start_ns"][comm], k["correlation"][comm]))
    has_ev = ev >= 0
    row = comm[np.maximum(ev, 0)] if len(comm) else np.zeros(len(ev), dtype=np.int64)

    def of_kernel(values: np.ndarray, missing: Any) -> np.ndarray:  # values per kernel of the device
        return np.where(has_ev, values[row], missing) if len(values) else np.full(len(ev), missing)

    def of_comm(values: np.ndarray, missing: Any) -> np.ndarray:  # values per communication kernel (host_evidence)
        return np.where(has_ev, values[np.maximum(ev, 0)], missing) if len(values) else np.full(len(ev), missing)

    latency, step_gap = _dependency_latency(act, host, dev.per_step)
    # transfer and wait: from the cross-rank match, else from this rank alone (computed only when needed)
    hit = np.zeros(len(start), dtype=bool)
    transfer = wait = np.zeros(len(start), dtype=np.int64)
    if matched is not None and len(start) and len(matched["start_ns"]):
        m_start = matched["start_ns"]  # unique
        by_start = np.argsort(m_start, kind="stable")
        pos = np.minimum(np.searchsorted(m_start[by_start], start), len(m_start) - 1)
        hit = m_start[by_start][pos] == start
        transfer = matched["transfer_ns"][by_start[pos]]
        wait = matched["wait_ns"][by_start[pos]]
    if not hit.all():
        own = _own_transfer(coll)
        transfer = np.where(hit, transfer, own)
        wait = np.where(hit, wait, array_of(coll, "duration_ns", np.int64) - own)
    return {
        "start_ns": start,
        "step": array_of(coll, "step", np.int64), "exposed_ns": array_of(coll, "exposed_ns", np.int64),
        "launch_bound": of_kernel(host.launch_bound, False).astype(bool),
        "latency_ns": of_kernel(latency, 0).astype(np.int64), "step_gap_ns": of_kernel(step_gap, 0).astype(np.int64),
        "issue_start_ns": of_comm(host.issue_start_ns, -1).astype(np.int64),
        "issue_end_ns": of_comm(host.issue_end_ns, -1).astype(np.int64),
        "op": of_comm(host.issue_op, -1).astype(np.int64),
        "source": of_comm(host.issue_source.astype(object), "none").astype(object),
        "call_start_ns": of_comm(host.call_start_ns, -1).astype(np.int64),
        "call_end_ns": of_comm(host.call_end_ns, -1).astype(np.int64),
        "call_op": of_comm(host.call_op, -1).astype(np.int64),
        "kind": coll["kind"].astype(str).to_numpy() if "kind" in coll else np.full(len(start), ""),
        "transfer_ns": transfer.astype(np.int64), "wait_ns": wait.astype(np.int64),
    }


def _host_only_rows(calls: pd.DataFrame, first_id: int) -> Columns:
    """Rows like :func:`_instances`' for collective calls that launched no kernel (CPU-side collectives): host time
    only — the issue reading is the shortest issuing range inside the call, the whole call its outermost range."""
    n = len(calls)
    ids = first_id + np.arange(n, dtype=np.int64)
    end = array_of(calls, "end_ns", np.int64)
    zero = np.zeros(n, dtype=np.int64)
    return {
        "start_ns": array_of(calls, "start_ns", np.int64), "step": array_of(calls, "step", np.int64),
        "exposed_ns": zero, "launch_bound": np.zeros(n, dtype=bool), "latency_ns": zero, "step_gap_ns": zero,
        "issue_start_ns": end - array_of(calls, "issue_ns", np.int64), "issue_end_ns": end, "op": ids,
        "source": np.full(n, "cpu_op", dtype=object), "call_start_ns": array_of(calls, "start_ns", np.int64),
        "call_end_ns": end, "call_op": ids, "kind": calls["kind"].astype(str).to_numpy(), "transfer_ns": zero,
        "wait_ns": zero}


def _own_transfer(coll: pd.DataFrame) -> np.ndarray:
    """Transfer time of each instance from this rank alone: the 10th percentile of the durations of the same
    collective (kind, size, kernel) — its fastest instances are those where this rank arrived last."""
    dur = array_of(coll, "duration_ns", np.int64)
    if len(coll) == 0:
        return np.zeros(0, dtype=np.int64)
    codes = [pd.factorize(array_of(coll, k))[0] for k in ("kind", "bytes", "name") if k in coll]
    order, first = _runs_of(*codes) if codes else (np.arange(len(dur)), np.zeros(1, dtype=np.int64))
    fast = np.empty(len(dur), dtype=np.float64)
    for lo, hi in zip(first.tolist(), [*first[1:].tolist(), len(order)], strict=True):
        members = order[lo:hi]
        fast[members] = np.quantile(dur[members], OWN_TRANSFER_Q)
    return np.minimum(fast, dur).astype(np.int64)


def _runs_of(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row order sorting by ``keys`` (the last one major, as ``np.lexsort``) and where each run of equal keys
    starts in that order: a sorted group-by in numpy."""
    order = np.lexsort(keys)
    change = np.zeros(len(order), dtype=bool)
    if len(order):
        change[0] = True
        for key in keys:
            ordered = key[order]
            change[1:] |= ordered[1:] != ordered[:-1]
    return order, np.flatnonzero(change)


def _issue_capped(issue: np.ndarray, counted: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Issue time of each call, at most ``ISSUE_OUTLIER`` × the median counted call of the same collective kind:
    a call far longer than its kind's usual one was held up (preemption, the profiler flushing a buffer), and
    that time would have been lost wherever it fell."""
    cap = np.full(len(issue), np.inf)
    kinds, which = np.unique(kind.astype(str), return_inverse=True)
    which = which.ravel()
    for k in range(len(kinds)):
        mine = which == k
        values = issue[mine & counted]
        if len(values):
            cap[mine] = float(np.median(values)) * ISSUE_OUTLIER
    return np.minimum(issue, cap).astype(np.int64)



def _segment_savings(rows: Columns, host: HostEvidence, whole_call: bool = False) -> tuple[np.ndarray, Columns]:
    """Per step (ns): saving, host and GPU parts, exposed, wait, issue time, counts (see the module doc), as the
    steps (sorted) and one column per step of each. ``rows``: :func:`_instances` columns (-1 where a
    time or op is unknown). With ``whole_call``, a collective's host time is its whole call (outermost issuing
    range) plus the CPU work slowed right after it (``slowed_ns``), instead of NCCL's issue alone."""
    op_col, start, end = ("call_op", "call_start_ns", "call_end_ns") if whole_call else \
        ("op", "issue_start_ns", "issue_end_ns")

    def column(name: str) -> np.ndarray:
        return np.asarray(rows[name], dtype=np.int64)

    op = column(op_col)
    linked = op >= 0
    b = np.where(linked, column(end), -1)
    a = np.where(linked, column(start), -1)
    sync = host.sync_start_ns
    seg = np.where(linked, np.searchsorted(sync, b, side="right"), -1)
    seg_end = np.where(linked & (seg < len(sync)), sync[np.minimum(seg, max(len(sync) - 1, 0))]
                       if len(sync) else NEVER, NEVER)
    first_of_op = np.zeros(len(op), dtype=bool)
    first_of_op[np.unique(op, return_index=True)[1]] = True
    first_of_op &= linked
    slowed = column("slowed_ns") if whole_call and "slowed_ns" in rows else np.zeros(len(op), dtype=np.int64)
    latency, transfer, exposed = column("latency_ns"), column("transfer_ns"), column("exposed_ns")
    step = column("step")
    parts = {
        "issue_ns": np.where(first_of_op, _issue_capped(b - a, first_of_op, rows["kind"]), 0),
        "slowed_ns": np.where(first_of_op, slowed, 0),
        "gpu_ns": np.minimum(exposed, transfer) + latency, "latency_ns": latency, "exposed_ns": exposed,
        "wait_ns": column("wait_ns"), "transfer_ns": transfer,
        "launch_bound": column("launch_bound"), "collectives": np.ones(len(op), dtype=np.int64),
        "step_gap_ns": column("step_gap_ns"),
    }
    keep = np.flatnonzero(step >= 0)
    # per (step, segment), in that order
    order, first = _runs_of(seg[keep], step[keep])
    rows_in = keep[order]
    seg_sum = {k: np.add.reduceat(v[rows_in], first) if len(first) else v[:0] for k, v in parts.items()}
    first_b = np.minimum.reduceat(np.where(linked, b, NEVER)[rows_in], first) if len(first) else b[:0]
    seg_step, seg_no = step[rows_in[first]], seg[rows_in[first]]
    slack = np.where(seg_no >= 0, host.waiting_between(first_b, seg_end[rows_in[first]]), 0)
    # a segment's ops after its calls may run faster than far ones on a noisy host: never a negative cost
    seg_sum["slowed_ns"] = np.maximum(seg_sum["slowed_ns"], 0)
    host_part = np.minimum(seg_sum["issue_ns"] + seg_sum["slowed_ns"], slack)
    gpu = seg_sum["gpu_ns"]
    host_chosen = host_part > gpu
    per_seg = {
        "saving_ns": np.maximum(host_part, gpu), "host_part_ns": np.where(host_chosen, host_part, 0),
        "gpu_part_ns": np.where(host_chosen, 0, gpu), "latency_ns": np.where(host_chosen, 0, seg_sum["latency_ns"]),
        "exposed_ns": seg_sum["exposed_ns"], "wait_ns": seg_sum["wait_ns"], "transfer_ns": seg_sum["transfer_ns"],
        "host_issue_ns": seg_sum["issue_ns"], "slowed_ns": seg_sum["slowed_ns"], "gpu_reading_ns": gpu,
        "launch_bound": seg_sum["launch_bound"], "collectives": seg_sum["collectives"],
        "step_gap_ns": seg_sum["step_gap_ns"],
    }
    # segments are in step order: each step's segments are one run
    step_first = np.flatnonzero(np.concatenate(([True], seg_step[1:] != seg_step[:-1]))) if len(seg_step) else first[:0]
    return seg_step[step_first], {k: (np.add.reduceat(v, step_first) if len(step_first) else v).astype(np.int64)
                                  for k, v in per_seg.items()}


def _rank_steps(trace: Trace, dev: DeviceSummary, matched: Columns | None, with_range: bool = True,
                state: DeviceState | None = None) -> RankCosts | None:
    """Per step of one rank (ns): its own communication cost (``own_ns``) and parts; plus its evidence. None when
    the device has neither collectives nor collective calls without kernels. Without ``with_range``, the readings
    only the range uses (``calls_only_ns``, ``ceiling_ns``, ``slowdown_high_ns``) are left out. ``state``: the
    device's working state where its analysis kept it (its activity, host events), else read from the trace."""
    if state is not None and state.activity.trace is not trace:
        state = None
    act = state.activity if state is not None else gather(trace, dev.rank, dev.device)
    # collective calls are CPU ranges: a trace without ranges has none
    calls = collective_calls(trace, act) if len(trace.ranges) else None
    cpu_side = host_only_in_steps(trace, act, dev.per_step, calls) if calls is not None else None
    if len(dev.collectives) == 0 and (cpu_side is None or len(cpu_side) == 0):
        return None
    host = host_evidence(trace, act)
    rows = _instances(dev, act, host, matched)
    if cpu_side is not None and len(cpu_side):
        first = int(max(rows["op"].max(initial=-1), rows["call_op"].max(initial=-1))) + 1
        extra = _host_only_rows(cpu_side, first)
        rows = {c: np.concatenate([rows[c], v]) for c, v in extra.items()}
    # host work slowed right after each call, counted with the call's own host time (the first call of a start)
    rows["slowed_ns"] = np.zeros(len(rows["call_op"]), dtype=np.int64)
    if calls is not None and len(calls):
        row = np.where(rows["call_op"] >= 0, _first_match((rows["call_start_ns"],), (array_of(calls, "start_ns"),)),
                       -1)
        slowed_after = host_slowed_after_calls(trace, act, calls)
        rows["slowed_ns"] = np.where(row >= 0, slowed_after[np.maximum(row, 0)], 0)
    idx, saving = _segment_savings(rows, host, whole_call=True)
    # the same rows give the same steps (rows of step < 0 are left out alike)
    issue_only = _segment_savings(rows, host)[1]
    # compute slowed beside communication, the share of it that was transfer (a waiting rank's spinning kernel
    # would not slow it once communication is free, and that rank is not the one setting the step)
    step_index = pd.Index(idx if idx.dtype == np.int64 else idx.astype(np.int64), name="step")
    by_step = _contention(act, dev.per_step)
    slowed = by_step.reindex(step_index).fillna(0).to_numpy() if by_step is not None and len(by_step) \
        else np.zeros(len(idx))
    busy = saving["transfer_ns"] + saving["wait_ns"]
    share = np.where(busy > 0, saving["transfer_ns"] / np.maximum(busy, 1), 1.0)
    contention = (slowed * np.minimum(share, 1.0)).astype(np.int64)
    columns = {**saving, "gpu_reading_ns": saving["gpu_reading_ns"] + contention, "contention_ns": contention,
               "as_profiled_ns": saving["saving_ns"] + contention}
    if with_range:
        # the whole calls without the CPU work slowed after them: the same rows as ``saving``'s where none was
        calls_only = _segment_savings({**rows, "slowed_ns": np.zeros(len(rows["call_op"]), dtype=np.int64)}, host,
                                      whole_call=True)[1] if rows["slowed_ns"].any() else saving
        columns["calls_only_ns"] = (calls_only["saving_ns"] + contention).astype(np.int64)
    columns["nccl_issue_ns"] = issue_only["host_issue_ns"].astype(np.int64)
    columns["issue_only_own_ns"] = (issue_only["saving_ns"] + contention).astype(np.int64)
    # a rank the profiler made launch-bound: weigh the GPU reading by how much of its idle time the profiler
    # explains (all of it → the GPU reading; half of it or less → the host reading as profiled)
    columns.update(profiler_weighing(idx, trace, dev, columns["host_part_ns"], columns["as_profiled_ns"],
                                     columns["gpu_reading_ns"], state.host_events if state is not None else None))
    if with_range:
        columns.update(upper_bounds(idx, dev.per_step, columns["idle_ns"], columns["profiler_ns"], contention,
                                    columns["host_part_ns"], columns["as_profiled_ns"]))
    steps = frame(columns, index=step_index)
    linked = act.launch_row >= 0
    comm = act.kernel_is_comm
    per_step = dev.per_step
    idle_pct, step_ns = None, None
    if len(per_step) and {"duration_ns", "idle_ns"} <= set(per_step.columns):
        duration = array_of(per_step, "duration_ns", np.float64)
        idle = array_of(per_step, "idle_ns", np.float64)[duration > 0] / duration[duration > 0]
        idle_pct = round(100.0 * float(np.median(idle)), 1) if len(idle) else None
        step_ns = int(np.median(array_of(per_step, "duration_ns")))
    evidence = RankEvidence(
        kernels_linked_pct=_pct(int(linked.sum()), len(linked)),
        launch_bound_kernel_pct=_pct(int(host.launch_bound.sum()), int(linked.sum())),
        comm_launch_bound_pct=_pct(int(host.launch_bound[comm].sum()), int(comm.sum())),
        host_syncs=len(host.sync_start_ns),
        issue_source=_mode(rows["source"]) if len(rows["source"]) else "none",
        calls_without_kernels=len(cpu_side) if cpu_side is not None else 0,
        gpu_idle_pct=idle_pct, step_ns=step_ns)
    return steps, evidence


def _mode(values: np.ndarray) -> str:
    """The most frequent value (the smallest of those tied)."""
    distinct, counts = np.unique(values.astype(str), return_counts=True)
    return str(distinct[np.argmax(counts)])


_DETAIL_COLUMNS = ("own_ns", "exposed_ns", "wait_ns", "host_issue_ns", "host_part_ns", "nccl_issue_ns",
                   "issue_only_own_ns", "slowed_ns", "gpu_part_ns", "contention_ns", "latency_ns", "as_profiled_ns",
                   "gpu_reading_ns", "profiler_ns", "idle_ns", "gpu_weight", "collectives", "launch_bound",
                   "step_gap_ns")


def _rank_details(steps: pd.DataFrame, evidence: RankEvidence) -> RankWhatIf:
    if len(steps) == 0:
        return RankWhatIf(evidence, None)
    medians = np.median(steps.to_numpy(np.float64), axis=0)  # every column is numeric
    position = {name: i for i, name in enumerate(steps.columns)}
    med = {name: float(medians[position[name]]) for name in _DETAIL_COLUMNS}
    return RankWhatIf(evidence, RankStepFigures(
        own_ns=int(med["own_ns"]), exposed_ns=int(med["exposed_ns"]), wait_ns=int(med["wait_ns"]),
        host_issue_ns=int(med["host_issue_ns"]), host_issue_critical_ns=int(med["host_part_ns"]),
        host_nccl_issue_ns=int(med["nccl_issue_ns"]), issue_only_own_ns=int(med["issue_only_own_ns"]),
        host_slowed_after_calls_ns=int(med["slowed_ns"]),
        gpu_transfer_critical_ns=int(med["gpu_part_ns"]), contention_ns=int(med["contention_ns"]),
        dependency_latency_ns=int(med["latency_ns"]), step_gap_after_comm_ns=int(med["step_gap_ns"]),
        as_profiled_ns=int(med["as_profiled_ns"]), gpu_reading_ns=int(med["gpu_reading_ns"]),
        profiler_ns=int(med["profiler_ns"]), idle_ns=int(med["idle_ns"]),
        gpu_weight=round(float(med["gpu_weight"]), 2),
        collectives_per_step=int(med["collectives"]),
        launch_bound_collectives_per_step=float(med["launch_bound"]),
        bound={"host_launch": "host", "gpu_transfer": "gpu", "mixed": "mixed"}[
            _basis(int(array_of(steps, "host_part_ns").sum()), int(array_of(steps, "own_ns").sum()))],
    ))


def estimate_comm_free(traces: list[Trace], devices: list[DeviceSummary],
                       cross_rank: CrossRankSummary | None, *, with_range: bool = True,
                       states: Mapping[DeviceKey, DeviceState] | None = None) -> WhatIf:
    """Step-time saving if communication were free (see the module doc for the method): each rank's costs
    (:func:`rank_comm_costs`, the first of its devices that has any) combined by :func:`combine_comm_free`;
    without ``with_range``, ``details`` leave out the range and its confidence (``range.step_range``).
    ``states``: the devices' working state (``DeviceState``) where their analysis kept it."""
    known = states or {}
    ranks: dict[int, RankCosts] = {}
    by_path: dict[str, Trace] = {}
    for t in traces:  # the first trace of each path, looked up once per device (not a scan per device)
        by_path.setdefault(t.path, t)
    for dev in devices:
        trace = by_path.get(dev.trace, traces[0] if len(traces) == 1 else None)
        if trace is None or dev.rank in ranks:
            continue
        steps = rank_comm_costs(trace, dev, cross_rank, with_range=with_range, state=known.get(device_key(dev)))
        if steps is not None:
            ranks[dev.rank] = steps
    return combine_comm_free(ranks, devices, cross_rank, with_range=with_range)


def trace_comm_costs(trace: Trace, devices: list[DeviceSummary], cross_rank: CrossRankSummary | None,
                     columns: dict[int, Columns | None] | None = None, *, with_range: bool = True,
                     states: Mapping[DeviceKey, DeviceState] | None = None) -> dict[int, RankCosts]:
    """:func:`rank_comm_costs` of each rank of one trace: its first device (in order) that has any. Where the
    trace lives (a Dask worker), with the cross-rank ``columns`` of its ranks (:func:`cross_rank_columns`) instead
    of the whole cross-rank table; :func:`estimate_comm_free` takes the first trace's costs of each rank."""
    out: dict[int, RankCosts] = {}
    for dev in devices:
        if dev.rank in out:
            continue
        matched = columns.get(dev.rank) if columns is not None else cross_rank_columns(cross_rank, dev.rank)
        steps = _rank_steps(trace, dev, matched, with_range, (states or {}).get(device_key(dev)))
        if steps is not None:
            out[dev.rank] = steps
    return out


def rank_comm_costs(trace: Trace, dev: DeviceSummary, cross_rank: CrossRankSummary | None, *,
                    with_range: bool = True, state: DeviceState | None = None) -> RankCosts | None:
    """Per step of one rank: its own communication cost and its parts, with its evidence (None when the device
    has neither collectives nor collective calls without kernels)."""
    return _rank_steps(trace, dev, cross_rank_columns(cross_rank, dev.rank), with_range, state)


def combine_comm_free(ranks: dict[int, RankCosts], devices: list[DeviceSummary],
                      cross_rank: CrossRankSummary | None, *, with_range: bool = True) -> WhatIf:
    """The what-if from each rank's costs (:func:`rank_comm_costs`): per step, the cost of the rank the others
    wait for; the median over steps."""
    if not ranks:
        has_steps = any(d.steps for d in devices)
        return WhatIf(0 if has_steps else None, "gpu_transfer", WhatIfDetails(note="no communication in the trace"))
    stepped = {r: s for r, (s, _) in ranks.items() if len(s)}  # ranks with collectives inside step windows
    own, wait, host, issue_only = _by_rank_tables(stepped)
    details = WhatIfDetails(
        method="per host-sync segment max(host time of the collective calls GPU waited for, exposed transfer) "
               "+ contention, of the rank that waits least; median over steps",
        ranks={str(r): _rank_details(s, e) for r, (s, e) in ranks.items()}, steps_used=len(own),
        cross_rank=cross_rank is not None,
        transfer_ns=cross_rank.transfer_ns_per_step if cross_rank is not None else None,
        note=None if cross_rank is not None else ("one rank: transfer = 10th percentile of the same collective's "
                                                  "durations (kind, size, kernel); the rest counts as waiting for "
                                                  "other ranks"))
    if len(own) == 0:
        return WhatIf(None, "gpu_transfer", replace(details, note="no step holds communication on every rank"))
    # the rank the others wait for sets the step; without cross-rank data, the smallest own cost
    key = wait.to_numpy() if cross_rank is not None else own.to_numpy()
    pick = key.argmin(axis=1)
    rows = np.arange(len(own))
    step_saving = own.to_numpy()[rows, pick]
    step_host = host.to_numpy()[rows, pick]
    per_step = WhatIfSteps(
        limiting_rank_by_step={str(int(s)): int(own.columns[c]) for s, c in zip(own.index, pick, strict=True)},
        saving_ns_by_step={str(int(s)): int(v) for s, v in zip(own.index, step_saving, strict=True)},
        host_share_pct=_pct(int(step_host.sum()), int(step_saving.sum())),
        issue_only_saving_ns=int(np.median(issue_only.to_numpy()[rows, pick])))
    basis = _basis(int(step_host.sum()), int(step_saving.sum()))
    spread = step_range(_limiting_rows(stepped, own, pick), int(np.median(step_saving)), basis) \
        if with_range else None
    details = replace(details, steps=per_step, range=spread, partial=_partial_run(cross_rank))
    return WhatIf(int(np.median(step_saving)), basis, details)


def _limiting_rows(stepped: dict[int, pd.DataFrame], own: pd.DataFrame, pick: np.ndarray) -> pd.DataFrame:
    """Per step of ``own`` (in its order), the row of the rank set as limiting (``pick``: column of ``own``), as
    floats: each rank's rows taken at once, not a row lookup per step."""
    position = np.arange(len(own))
    parts = [stepped[int(own.columns[c])].loc[own.index[pick == c]].set_axis(position[pick == c])
             for c in np.unique(pick).tolist()]
    return pd.concat(parts).sort_index().astype(np.float64)


def _by_rank_tables(stepped: dict[int, pd.DataFrame]
                    ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Step × rank tables of own cost, wait, host part (weighed) and issue-only cost, on the steps every rank
    has. Ranks with the same steps (the usual case) are stacked as arrays; otherwise aligned by pandas."""
    if not stepped:
        return pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame()
    frames = list(stepped.values())
    index = frames[0].index
    if all(f.index.equals(index) for f in frames[1:]) and index.is_unique:
        names = pd.Index(list(stepped), dtype=np.int64)
        own = np.column_stack([array_of(f, "own_ns") for f in frames])
        keep = ~np.isnan(own).any(axis=1) if own.dtype.kind == "f" else np.ones(len(index), dtype=bool)

        def table(values: np.ndarray) -> pd.DataFrame:
            return pd.DataFrame(values[keep], index=index[keep], columns=names)

        def stacked(column: str) -> np.ndarray:
            return np.column_stack([array_of(f, column) for f in frames])

        host = np.column_stack([array_of(f, "host_part_ns") * (1 - array_of(f, "gpu_weight")) for f in frames])
        return table(own), table(stacked("wait_ns")), table(host), table(stacked("issue_only_own_ns"))
    own_t = pd.concat({r: s["own_ns"] for r, s in stepped.items()}, axis=1).dropna()
    wait_t = pd.concat({r: s["wait_ns"] for r, s in stepped.items()}, axis=1).reindex(own_t.index)
    host_t = pd.concat({r: s["host_part_ns"] * (1 - s["gpu_weight"]) for r, s in stepped.items()}, axis=1
                       ).reindex(own_t.index)
    issue_t = pd.concat({r: s["issue_only_own_ns"] for r, s in stepped.items()}, axis=1).reindex(own_t.index)
    return own_t, wait_t, host_t, issue_t


def _partial_run(cross_rank: CrossRankSummary | None) -> PartialRun | None:
    """Confidence low when ranks of the job are missing (``cross_rank.completeness``, from run identity): the
    given ranks' collectives include waiting for ranks not in the trace, so transfer and wait blur."""
    done = cross_rank.completeness if cross_rank is not None else None
    if done is None or not done.partial:
        return None
    return PartialRun(done.ranks_missing, done.world_size)

