"""Host-side evidence of one (rank, device): who waited for whom between the CPU and the GPU.

* **launch-bound kernel**: it started within ``LAUNCH_SLACK_NS`` of its launch call returning, on a device that
  was idle just before — the GPU was waiting for the host to launch it. The idle gap before it is GPU time
  spent **waiting for the host**.
* **host sync**: an API call that blocks the host until the GPU catches up (``cuda*Synchronize``) on a thread
  that launches this device's kernels; it splits the host timeline into segments, because host time saved before
  a sync is lost waiting in it.
* **issuing op** of a communication kernel: the innermost CPU range on the launching thread that contains its
  launch call and is named like a collective issue — ProcessGroupNCCL's ``nccl:*`` record (Kineto), NCCL's own
  NVTX range (``ncclAllReduce``, nsys), else the ``c10d::*`` op / ``record_param_comms`` / a user range named
  after the collective; without any, the launch call itself: NCCL's own share of the call. Where the CUDA calls
  made inside the outermost issuing range span longer (first start to last end) and that range makes this one
  collective, that span is taken instead: NCCL's NVTX range (nsys) covers only the NCCL call, not
  ProcessGroupNCCL's stream-sync and work-end events around it, which Kineto's ``nccl:*`` record does cover.
* **whole call** of a communication kernel: the outermost such range (the user's range named after the
  collective, else the ``c10d::*`` op): everything the host did for the collective, torch.distributed's wrapper
  included. The what-if counts whole calls; the issuing op alone is its ``issue_only`` reading.
* **collective calls without kernels**: whole calls that launch no communication kernel (a process group of one
  rank, gloo on CPU tensors), with the kernels launched around them to place them in steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..model.api_names import HOST_SYNC, ISSUE_OP
from ..model.communication import OTHER, kind_of
from ..model.trace import Trace
from .activity import DeviceActivity
from .grouped import dense_codes, distinct
from .numeric import intervals as iv

LAUNCH_SLACK_NS = 20_000  # a kernel starting this soon after its launch call, on an idle device, waited for it
# CPU ranges that issue a collective: PyTorch's c10d op and profiler record, ProcessGroupNCCL's nccl:* range,
# NCCL's own NVTX ranges, and user annotations named after the collective (e.g. an NVTX "allreduce" range)
NOT_A_CALL = ("record_param_comms",)  # an issuing range that never stands alone for a collective call
HOST_RECOVERY_NS = 300_000  # CPU ops starting this soon after a collective call run slower than elsewhere
MIN_BASELINE_OPS = 3  # far-from-call ops of a name needed for its baseline duration
MAX_WALK = 8  # closed ranges stepped over when looking for the innermost open range before a launch


@dataclass
class HostEvidence:
    """Launch-bound flags per kernel of ``act.kernels`` (sorted by start); the issuing evidence per
    communication kernel (``act.kernels[act.kernel_is_comm]``, in that order); the device's waiting gaps and host
    syncs."""

    launch_bound: np.ndarray  # bool, per kernel
    issue_start_ns: np.ndarray  # issuing op, per communication kernel (-1 when unlinked)
    issue_end_ns: np.ndarray
    issue_op: np.ndarray  # id shared by kernels issued by one op (or one launch call), -1 when none
    issue_source: np.ndarray  # "cpu_op" | "launch_api" | "none"
    call_start_ns: np.ndarray  # whole call: the outermost issuing range (the issue itself where none is wider)
    call_end_ns: np.ndarray
    call_op: np.ndarray  # id shared by kernels issued by one whole call, -1 when none
    wait_anchor_ns: np.ndarray  # host time (launch end) of each GPU-waiting-for-host gap, sorted
    wait_cumsum_ns: np.ndarray  # cumulative gap length, ``len(anchor) + 1`` entries
    sync_start_ns: np.ndarray  # starts of host-blocking sync calls of the device's processes, sorted

    def waiting_between(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """GPU time spent waiting for the host, over gaps whose launch (host time) falls in ``[lo, hi)``."""
        a, c = self.wait_anchor_ns, self.wait_cumsum_ns
        return c[np.searchsorted(a, hi, side="left")] - c[np.searchsorted(a, lo, side="left")]


def _lift(times: np.ndarray, lane: np.ndarray, t0: int, span: int) -> np.ndarray:
    """Times of several lanes (dense ids) laid end to end on one axis, so one sorted search serves all lanes."""
    return (times - t0) + lane * span


def thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One int64 per (process, thread)."""
    return np.asarray(pid, dtype=np.int64) * (1 << 32) + (np.asarray(tid, dtype=np.int64) & 0xFFFFFFFF)


def issue_ranges(trace: Trace, pids: np.ndarray, with_names: bool = False) -> tuple[np.ndarray, ...]:
    """CPU ranges of the processes named like a collective issue: ``(start, end, thread[, name_id])``, sorted by
    thread, start, longest first."""
    r = trace.ranges
    empty = np.empty(0, dtype=np.int64)
    if len(r) == 0:
        return (empty,) * (4 if with_names else 3)
    wanted = np.array(_ids_matching(trace, r["name_id"], ISSUE_OP), dtype=np.int64)
    sel = np.isin(r["name_id"], wanted) & np.isin(r["pid"], pids) & (r["device"] < 0) & (r["end_ns"] > r["start_ns"])
    s, e = r["start_ns"][sel], r["end_ns"][sel]
    thread = thread_key(r["pid"][sel], r["tid"][sel])
    order = np.lexsort((-(e - s), s, thread))
    out = (s[order], e[order], thread[order])
    return (*out, r["name_id"][sel][order]) if with_names else out


def collective_calls(trace: Trace, act: DeviceActivity) -> pd.DataFrame:
    """Whole collective calls (outermost issuing ranges, collectives only) on the threads that launch this device's
    kernels, by thread and start. Columns ``start_ns, end_ns, thread, name, kind``, ``issue_ns`` (the shortest
    issuing range inside the call: its issue reading), ``launches_comm`` (it launches a communication kernel) and
    ``before_ns`` / ``after_ns``: GPU start of the last kernel launched before the call on its thread and of the
    first launched after it (-1 when none)."""
    none = np.empty(0, dtype=np.int64)
    empty = {**{c: none for c in ("start_ns", "end_ns", "thread", "issue_ns", "before_ns", "after_ns")},
             "name": np.empty(0, dtype=object), "kind": np.empty(0, dtype=object),
             "launches_comm": np.empty(0, dtype=bool)}
    linked = act.launch_row >= 0
    s, e, thread, name = issue_ranges(trace, act.pids, with_names=True)
    if len(s) == 0 or not linked.any():
        return pd.DataFrame(empty)
    k_thread = thread_key(act.launch_pid[linked], act.launch_tid[linked])
    keep = np.isin(thread, k_thread)
    s, e, thread, name = s[keep], e[keep], thread[keep], name[keep]
    if len(s) == 0:
        return pd.DataFrame(empty)
    lane = dense_codes(np.r_[thread, k_thread])
    launch = act.launch_ns[linked]
    t0 = int(min(s.min(), launch.min()))
    span = int(max(e.max(), launch.max()) - t0) + 1
    rs, re_ = _lift(s, lane[: len(s)], t0, span), _lift(e, lane[: len(s)], t0, span)
    outermost = np.concatenate(([True], rs[1:] >= np.maximum.accumulate(re_)[:-1]))
    # the issue reading of each call: the shortest issuing range inside it (ranges nested in an outermost one
    # follow it in this order, up to the next outermost one)
    issue = np.zeros(len(s), dtype=np.int64)
    issue[outermost] = np.minimum.reduceat(e - s, np.flatnonzero(outermost))
    kl = _lift(launch, lane[len(s):], t0, span)
    order = np.argsort(kl, kind="stable")
    kl, k_start = kl[order], act.kernels["start_ns"][linked][order]
    comm_l = np.sort(kl[act.kernel_is_comm[linked][order]])
    launches_comm = np.searchsorted(comm_l, re_, side="left") > np.searchsorted(comm_l, rs, side="left")
    sel = outermost
    lo = np.searchsorted(kl, rs[sel], side="left") - 1  # last launch before the call (same lane: lane-lifted)
    hi = np.searchsorted(kl, re_[sel], side="left")  # first launch after it
    lane_of = lane[: len(s)][sel]
    lo_ok = (lo >= 0) & (kl[np.maximum(lo, 0)] // span == lane_of)
    hi_ok = (hi < len(kl)) & (kl[np.minimum(hi, len(kl) - 1)] // span == lane_of)
    # names and kinds looked up once per distinct name, not per call
    distinct, which = np.unique(name[sel], return_inverse=True)
    text = np.array([trace.strings[i] for i in distinct.tolist()], dtype=object)
    kind = np.array([kind_of(None, n) for n in text], dtype=object)
    calls = pd.DataFrame({
        "start_ns": s[sel], "end_ns": e[sel], "thread": thread[sel], "issue_ns": issue[sel],
        "name": text[which.ravel()], "kind": kind[which.ravel()], "launches_comm": launches_comm[sel],
        "before_ns": np.where(lo_ok, k_start[np.maximum(lo, 0)], -1),
        "after_ns": np.where(hi_ok, k_start[np.minimum(hi, len(kl) - 1)], -1),
    })
    # collectives only (NCCL's communicator set-up and tear-down ranges are not), and not the profiler's own
    # record of a work's wait()
    known = (calls["kind"] != OTHER) | calls["name"].str.contains("barrier", case=False)
    return calls[known & ~calls["name"].isin(NOT_A_CALL)].reset_index(drop=True)


def host_only_collectives(trace: Trace, act: DeviceActivity) -> pd.DataFrame:
    """:func:`collective_calls` that launch no communication kernel: collectives done on the CPU side (a process
    group of one rank, gloo on CPU tensors)."""
    calls = collective_calls(trace, act)
    return calls[~calls["launches_comm"].astype(bool)].reset_index(drop=True)


def host_slowed_after_calls(trace: Trace, act: DeviceActivity, calls: pd.DataFrame) -> np.ndarray:
    """Per call of ``calls`` (:func:`collective_calls`): how much longer the CPU ops starting within
    ``HOST_RECOVERY_NS`` after it ran than the same ops (by name) starting farther from any call, summed (ns).

    Ops are the outermost ``cpu_op`` ranges on the call's thread that are not collective calls themselves; an op
    counts only where at least ``MIN_BASELINE_OPS`` of its name run far from the calls. Measured on the H200 eager
    decodes: top-level aten ops run 40–50 % longer in the first 100 µs after an all-reduce call and 10–15 %
    longer up to 300 µs, then as far away (docs/METHOD_WHAT_IF.md)."""
    out = np.zeros(len(calls), dtype=np.int64)
    r = trace.ranges
    if len(calls) == 0 or len(r) == 0:
        return out
    cpu_op = [i for i in np.unique(r["kind_id"][r["kind_id"] >= 0]).tolist() if trace.strings[i] == "cpu_op"]
    thread = thread_key(r["pid"], r["tid"])
    sel = np.isin(r["kind_id"], cpu_op) & (r["device"] < 0) & (r["end_ns"] > r["start_ns"]) & \
        np.isin(thread, calls["thread"].to_numpy(np.int64))
    if not sel.any():
        return out
    s, e, th, name = r["start_ns"][sel], r["end_ns"][sel], thread[sel], r["name_id"][sel]
    c_s, c_e, c_th = (calls[c].to_numpy(np.int64) for c in ("start_ns", "end_ns", "thread"))
    lane = dense_codes(np.r_[th, c_th])
    t0 = int(min(s.min(), c_s.min()))
    span = int(max(e.max(), c_e.max()) - t0) + 1
    ls, le = _lift(s, lane[: len(s)], t0, span), _lift(e, lane[: len(s)], t0, span)
    order = np.lexsort((-(le - ls), ls))
    ls, le, name = ls[order], le[order], name[order]
    top = np.concatenate(([True], ls[1:] >= np.maximum.accumulate(le)[:-1]))  # not nested in another cpu_op
    cs, ce = _lift(c_s, lane[len(s):], t0, span), _lift(c_e, lane[len(s):], t0, span)
    by_start, by_end = np.argsort(cs, kind="stable"), np.argsort(ce, kind="stable")
    last_start = np.searchsorted(cs[by_start], ls, side="right") - 1
    inside = (last_start >= 0) & (ls < ce[by_start][np.maximum(last_start, 0)])
    last_end = np.searchsorted(ce[by_end], ls, side="right") - 1
    after = np.where(last_end >= 0, ls - ce[by_end][np.maximum(last_end, 0)], span)
    same_lane = (last_end >= 0) & (ce[by_end][np.maximum(last_end, 0)] // span == ls // span)
    near = top & ~inside & same_lane & (after < HOST_RECOVERY_NS)
    far = top & ~inside & ~near
    dur = le - ls
    frame = pd.DataFrame({"name": name[far], "dur": dur[far]})
    counts = frame.groupby("name")["dur"].agg(["median", "size"])
    base = counts["median"][counts["size"] >= MIN_BASELINE_OPS]
    near_base = pd.Series(name[near]).map(base).to_numpy(dtype=float)
    ok = ~np.isnan(near_base)
    excess = (dur[near][ok] - near_base[ok]).astype(np.int64)
    owner = by_end[last_end[near][ok]]
    np.add.at(out, owner, excess)
    return out


def containing(starts: np.ndarray, ends: np.ndarray, threads: np.ndarray, t: np.ndarray,
               thread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indexes of the innermost and of the outermost range of the same thread containing each time ``t``, -1 if
    none. Ranges nest per thread and are sorted as :func:`issue_ranges` returns them. Each thread gets its own
    stretch of one axis, so
    no range of one thread can contain a time of another. From the latest range starting at or before ``t``,
    walk back (vectorized over all times) past ranges already closed; after ``MAX_WALK`` steps, the outermost
    range still open is taken."""
    if len(starts) == 0 or len(t) == 0:
        return np.full(len(t), -1, dtype=np.int64), np.full(len(t), -1, dtype=np.int64)
    lane = dense_codes(np.r_[threads, thread])
    t0 = int(min(starts.min(), t.min()))
    span = int(max(ends.max(), t.max()) - t0) + 1
    key = _lift(starts, lane[: len(starts)], t0, span)
    end = _lift(ends, lane[: len(starts)], t0, span)
    probe = _lift(t, lane[len(starts):], t0, span)
    idx = np.searchsorted(key, probe, side="right") - 1
    found = np.full(len(t), -1, dtype=np.int64)
    for _ in range(MAX_WALK):  # bounded by nesting/sibling count, not by the number of events
        ok = (found < 0) & (idx >= 0) & (end[np.maximum(idx, 0)] > probe)
        found = np.where(ok, idx, found)
        idx = np.where(found < 0, idx - 1, idx)
    outermost = np.flatnonzero(np.concatenate(([True], key[1:] >= np.maximum.accumulate(end)[:-1])))
    pos = np.searchsorted(key[outermost], probe, side="right") - 1
    cand = outermost[np.maximum(pos, 0)]
    outer = np.where((pos >= 0) & (end[cand] > probe), cand, -1)
    return np.where(found >= 0, found, outer), outer


def api_span_within(trace: Trace, starts: np.ndarray, ends: np.ndarray, threads: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """First start and last end of the CUDA API calls each range ``[start, end)`` of ``threads`` makes
    (``-1, -1`` where it makes none). One thread at a time (a few), on that thread's calls only."""
    api = trace.api_calls
    first_start = np.full(len(starts), -1, dtype=np.int64)
    last_end = first_start.copy()
    if len(api) == 0 or len(starts) == 0:
        return first_start, last_end
    a_pid, a_tid = api["pid"], api["tid"]
    plain_tids = int(a_tid.min()) >= 0 and int(a_tid.max()) <= 0xFFFFFFFF  # thread_key keeps them as they are
    for thread in distinct(threads).tolist():
        low = thread & 0xFFFFFFFF
        same = a_pid == thread >> 32
        same &= (a_tid == low) if plain_tids else (a_tid & 0xFFFFFFFF) == low
        calls = np.flatnonzero(same)  # the thread's calls: no key per call of the table
        del same
        if len(calls) == 0:
            continue
        a_start, reach = api["start_ns"][calls], api["end_ns"][calls]
        del calls
        if not bool((a_start[1:] >= a_start[:-1]).all()):  # a thread's calls come in start order
            order = np.argsort(a_start, kind="stable")
            a_start, reach = a_start[order], reach[order]
            del order
        np.maximum.accumulate(reach, out=reach)
        mine = np.flatnonzero(threads == thread)
        lo, hi = starts[mine], ends[mine]
        first = np.searchsorted(a_start, lo, side="left")
        last = np.searchsorted(a_start, hi, side="left") - 1
        ok = last >= first
        first_start[mine] = np.where(ok, a_start[np.minimum(first, len(a_start) - 1)], -1)
        last_end[mine] = np.where(ok, np.minimum(reach[np.maximum(last, 0)], hi), -1)
    return first_start, last_end


def _waiting_gaps(start: np.ndarray, idle_from: np.ndarray, launch_end: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Launch end (sorted) and cumulative idle gap of the launch-bound kernels (their ``start``, the end of the
    busy stretch before each, ``idle_from``, and their ``launch_end``): only they wait for the host, so the others,
    gaps of 0, are left out of the sums' axis."""
    order = np.argsort(launch_end, kind="stable")
    return launch_end[order], np.concatenate(([0], np.cumsum((start - idle_from)[order]))).astype(np.int64)


def host_evidence(trace: Trace, act: DeviceActivity) -> HostEvidence:
    """Launch-bound flags, issuing ops of communication kernels, GPU-waiting gaps and host syncs of a device.
    Per-kernel arrays only where every kernel is read (launch-bound); the issue evidence for the communication
    kernels alone."""
    k = act.kernels
    api = trace.api_calls
    linked = act.launch_row >= 0
    start = k["start_ns"]
    b_start, b_end = act.busy  # built for this read (a summary's device analysis let it go): read once
    pos = np.searchsorted(b_start, start, side="right") - 1
    # no busy interval at all when every kernel lasted 0 ns: then no kernel opened one after idle time
    launch_bound = (pos >= 0) & (b_start[np.maximum(pos, 0)] == start) if len(b_start) else \
        np.zeros(len(k), dtype=bool)
    launch_bound &= linked
    bound = np.flatnonzero(launch_bound)
    # where each one's wait began: the end of the busy stretch before it (its own start when none)
    before = pos[bound] - 1
    idle_from = np.where(before >= 0, b_end[np.maximum(before, 0)], start[bound]) if len(b_end) else start[bound]
    del pos, before, b_start, b_end
    if len(api):
        launch_end = api["end_ns"][act.launch_row[bound]]
        slack_ok = start[bound] - launch_end <= LAUNCH_SLACK_NS
        launch_bound[bound[~slack_ok]] = False
        launch_end, idle_from, bound = launch_end[slack_ok], idle_from[slack_ok], bound[slack_ok]
    else:
        launch_bound[:] = False
        launch_end = idle_from = bound = np.empty(0, dtype=np.int64)

    comm = np.flatnonzero(act.kernel_is_comm)  # the kernels whose issue is read (what_if._instances)
    c_linked = linked[comm]
    c_row = act.launch_row[comm]
    c_launch = act.launch_ns[comm]
    c_launch_end = np.where(c_linked, api["end_ns"][np.maximum(c_row, 0)], -1) if len(api) else \
        np.full(len(comm), -1, dtype=np.int64)
    o_s, o_e, o_thread = issue_ranges(trace, act.pids)
    op, outer = containing(o_s, o_e, o_thread, np.where(c_linked, c_launch, -1),
                           thread_key(act.launch_pid[comm], act.launch_tid[comm]))
    op = np.where(c_linked, op, -1)
    has_op = op >= 0
    # the CUDA calls the outermost issuing range makes (stream-sync events, the launch, the work-end event) stand
    # in for the collective's runtime work where the innermost range is only the NCCL call (nsys)
    outer = np.where(has_op, outer, -1)
    none = np.full(len(comm), -1, dtype=np.int64)
    out_s = np.where(outer >= 0, o_s[np.maximum(outer, 0)], -1) if len(o_s) else none
    out_e = np.where(outer >= 0, o_e[np.maximum(outer, 0)], -1) if len(o_s) else none
    span_s, span_e = api_span_within(trace, out_s, out_e, np.where(outer >= 0, o_thread[np.maximum(outer, 0)], -1)
                                     if len(o_s) else none)
    in_s = o_s[np.maximum(op, 0)] if len(o_s) else none
    in_e = o_e[np.maximum(op, 0)] if len(o_s) else none
    # widened only where the outermost range makes this one collective (a user range around several calls spans
    # them all)
    pairs = np.unique(np.c_[outer, op][has_op & (outer >= 0)], axis=0)
    ops_in_outer = np.bincount(pairs[:, 0], minlength=len(o_s)) if len(pairs) else np.zeros(len(o_s), np.int64)
    single = (outer >= 0) & (ops_in_outer[np.maximum(outer, 0)] == 1) if len(o_s) else np.zeros(len(comm), bool)
    use_span = has_op & single & (span_s >= 0) & (span_e - span_s > in_e - in_s)
    # without an issuing range, the launch call itself; a call that launched several kernels (a CUDA graph)
    # is split evenly, and each communication kernel owns its share
    launched = np.where(c_linked, _launched_by(act.launch_row[linked], c_row), 1)  # unlinked: never divided by 0
    share = (c_launch_end - c_launch) // launched
    issue_start = np.where(has_op, np.where(use_span, span_s, in_s), np.where(c_linked, c_launch, -1))
    issue_end = np.where(has_op, np.where(use_span, span_e, in_e), np.where(c_linked, c_launch + share, -1))
    whole = has_op & (outer >= 0)
    call_start = np.where(whole, np.minimum(out_s, issue_start), issue_start)
    call_end = np.where(whole, np.maximum(out_e, issue_end), issue_end)
    owner = np.where(has_op, op, np.where(c_linked, len(o_s) + comm, -1))
    call_owner = np.where(whole, outer, owner)
    source = np.where(has_op, "cpu_op", np.where(c_linked, "launch_api", "none"))

    anchor, cumsum = _waiting_gaps(start[bound], idle_from, launch_end)
    sync = np.flatnonzero(np.isin(api["name_id"], _ids_matching(trace, api["name_id"], HOST_SYNC)))
    launching = distinct(thread_key(act.launch_pid[linked], act.launch_tid[linked]))
    sync = sync[np.isin(thread_key(api["pid"][sync], api["tid"][sync]), launching)]
    return HostEvidence(launch_bound, issue_start, issue_end, owner, source, call_start, call_end, call_owner,
                        anchor, cumsum, np.sort(api["start_ns"][sync]))


def _launched_by(launch_rows: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """How many of ``launch_rows`` (the launching call of each linked kernel) are each of ``rows``: the kernels
    one call launched (``np.bincount(launch_rows)[rows]``, without a count per API row)."""
    launched = np.sort(launch_rows)
    return np.searchsorted(launched, rows, side="right") - np.searchsorted(launched, rows, side="left")


def _ids_matching(trace: Trace, ids: np.ndarray, pattern: re.Pattern[str]) -> list[int]:
    """String ids among ``ids`` whose text matches ``pattern`` — or among the whole string pool when it is the
    smaller: ids the rows do not hold select no row either way."""
    pool = trace.strings
    candidates = range(len(pool)) if len(pool) <= len(ids) else distinct(ids[ids >= 0]).tolist()
    return [i for i in candidates if pattern.search(pool[i])]


def host_only_in_steps(trace: Trace, act: DeviceActivity, per_step: pd.DataFrame,
                       calls: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`host_only_collectives` inside steps, with their ``step``: a call counts in a step when the kernels
    launched just before and just after it (same thread) both run in a step window (so calls during warm-up or
    CUDA-graph capture do not); the step is the later kernel's. ``calls``: :func:`collective_calls` if at hand."""
    if calls is None:
        calls = host_only_collectives(trace, act)
    elif len(calls):
        calls = calls[~calls["launches_comm"].astype(bool)].reset_index(drop=True)
    if not len(calls):
        return calls.assign(step=np.empty(0, dtype=np.int64))
    if not len(per_step):
        return calls.assign(step=pd.Series(dtype=np.int64))
    ws, we = per_step["start_ns"].to_numpy(), per_step["end_ns"].to_numpy()
    after = iv.window_index(calls["after_ns"].to_numpy(np.int64), ws, we)
    before = iv.window_index(calls["before_ns"].to_numpy(np.int64), ws, we)
    ok = (calls["after_ns"].to_numpy() >= 0) & (calls["before_ns"].to_numpy() >= 0) & (after >= 0) & (before >= 0)
    steps = per_step["step"].to_numpy()
    return calls[ok].assign(step=steps[after[ok]].astype(np.int64)).reset_index(drop=True)
