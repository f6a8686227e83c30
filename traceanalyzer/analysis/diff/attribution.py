"""Per-step wall time of one (rank, device) split into components that add up to the step exactly.

The step windows are the summary's own (``DeviceSummary.per_step``), so a better step detection is inherited.
Inside each window ``[ws, we)``, every nanosecond is claimed by the first of these that covers it:

1. ``compute:<bucket>``: the union of that bucket's non-communication kernels, buckets in the classifier's
   exclusive precedence (``moe_fp4_gemm`` > ``moe_gemm`` > ``gemm`` > ``attention`` > ``other`` > ``memory``…).
2. ``comm:wait`` / ``comm:exposed_transfer``: communication (kernels and peer copies) with no compute kernel
   beside it — the exposed communication of the summary. A collective instance matched across ranks spends
   its first ``wait_ns`` (its duration minus the shortest rank's) waiting for peers; the exposed time inside
   that leading part is ``comm:wait``, the rest ``comm:exposed_transfer``. Without a cross-rank match (one rank,
   unmatched instances) all of it is transfer.
3. ``memory:copies``: memory operations (copy engines) under no kernel and no communication.
4. ``idle:host`` / ``idle:other``: the window minus all GPU activity. A gap is host-bound when the kernel or
   memory operation that ends it was launched (its host API call started) after the gap began: the GPU had
   nothing queued and waited for the host. Other gaps (work queued but held by a dependency, an event, a
   peer, or no launch record) are ``idle:other``.

Each step's components therefore sum to its duration by construction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..activity import COMMUNICATION, DeviceActivity
from ..numeric import intervals as iv
from ..results import CrossRankSummary, DeviceSummary

COMM_WAIT = "comm:wait"
COMM_TRANSFER = "comm:exposed_transfer"
MEMORY_COPIES = "memory:copies"
IDLE_HOST = "idle:host"
IDLE_OTHER = "idle:other"
COMPUTE_PREFIX = "compute:"


def _wait_intervals(dev: DeviceSummary, cross: CrossRankSummary | None) -> iv.Intervals:
    """The leading ``wait_ns`` of each of the device's collective instances matched across ranks."""
    matched = cross.rank_matches(dev.rank) if cross is not None else None
    if matched is None or not len(matched):
        return iv.empty()
    return iv.union(matched.start_ns, matched.start_ns + matched.wait_ns)


def _host_bound_gaps(act: DeviceActivity, lo: int, hi: int) -> iv.Intervals:
    """The host-bound idle gaps of the device within ``[lo, hi)`` (the module doc says which)."""
    gs, ge = iv.gaps(act.busy, lo, hi)
    if len(gs) == 0:
        return iv.empty()
    starts = np.r_[act.kernels["start_ns"], act.memops["start_ns"]]
    launch = np.r_[act.launch_ns, act.memop_launch_ns]
    order = np.argsort(starts, kind="stable")
    starts, launch = starts[order], launch[order]
    # the work ending each gap: the earliest activity starting at the gap's end (latest launch if several)
    first = np.searchsorted(starts, ge, side="left")
    last = np.searchsorted(starts, ge, side="right")
    has_next = last > first
    latest = np.full(len(ge), -1, dtype=np.int64)
    if has_next.any():
        mx = np.maximum.reduceat(np.r_[launch, -1], np.c_[np.minimum(first, len(launch)),
                                                          np.minimum(last, len(launch))].ravel())[0::2]
        latest = np.where(has_next, mx, -1)
    host = (latest >= 0) & (latest >= gs)
    return gs[host], ge[host]


def step_components(dev: DeviceSummary, act: DeviceActivity | None, cross: CrossRankSummary | None,
                    order: list[str]) -> pd.DataFrame:
    """One row per step of ``dev`` (its ``per_step`` windows), one int64 column per component plus ``step`` and
    ``duration_ns``; the component columns of a row sum to its ``duration_ns`` (:func:`step_component_arrays` as a
    frame)."""
    columns = step_component_arrays(dev, act, cross, order)
    return pd.DataFrame(columns) if columns else pd.DataFrame(columns=["step", "duration_ns"])


def step_component_arrays(dev: DeviceSummary, act: DeviceActivity | None, cross: CrossRankSummary | None,
                          order: list[str]) -> dict[str, np.ndarray]:
    """The columns of :func:`step_components` (``step``, ``duration_ns``, then the components in attribution
    order), empty without steps or activity.

    The summary's per-step ``busy_ns``, ``idle_ns`` and ``comm_exposed_ns`` are reused: the exposed communication
    is communication under no compute kernel, split into wait and transfer; memory copies are the busy time less
    compute and exposed communication; ``idle:other`` is the idle time less ``idle:host``."""
    steps = dev.per_step
    if act is None or not len(steps):
        return {}
    ws = steps["start_ns"].to_numpy(np.int64)
    we = steps["end_ns"].to_numpy(np.int64)
    out: dict[str, np.ndarray] = {"step": steps["step"].to_numpy(np.int64), "duration_ns": we - ws}
    compute_ns = _claim_compute(act, order, ws, we, out)
    exposed_ns = steps["comm_exposed_ns"].to_numpy(np.int64)
    waits = _wait_intervals(dev, cross)
    wait_ns = iv.measure_within(iv.intersect(iv.difference(act.comm, act.compute), waits), ws, we) \
        if len(waits[0]) else np.zeros(len(ws), dtype=np.int64)
    out[COMM_WAIT] = wait_ns
    out[COMM_TRANSFER] = exposed_ns - wait_ns
    out[MEMORY_COPIES] = steps["busy_ns"].to_numpy(np.int64) - compute_ns - exposed_ns
    lo, hi = (int(min(ws.min(), act.span[0])), int(max(we.max(), act.span[1])))
    host_ns = iv.measure_within(_host_bound_gaps(act, lo, hi), ws, we)
    out[IDLE_HOST] = host_ns
    out[IDLE_OTHER] = steps["idle_ns"].to_numpy(np.int64) - host_ns
    return out


def _claim_compute(act: DeviceActivity, order: list[str], ws: np.ndarray, we: np.ndarray,
                   out: dict[str, np.ndarray]) -> np.ndarray:
    """Add to ``out`` the ``compute:<bucket>`` column of every bucket with non-communication kernels, in ``order``
    (buckets it does not list after it, sorted); returns the compute time per window. A bucket's own time is what
    the buckets before it left: the time of the union of it and them, less the time of theirs."""
    compute = ~act.kernel_is_comm
    codes, found = pd.factorize(act.kernels["bucket_id"][compute])
    names = [str(b) for b in act.trace.names(found)]  # a bucket the rules do not know gets its own component
    buckets = [b for b in order if b != COMMUNICATION and b in names] + sorted(set(names) - set(order))
    rank = np.array([buckets.index(b) for b in names], dtype=np.int64)[codes]
    us, ue, group = iv.group_union(act.kernels["start_ns"][compute], act.kernels["end_ns"][compute], rank)
    cut = np.searchsorted(group, np.arange(len(buckets) + 1))  # group_union sorts by group
    claimed, before = iv.empty(), np.zeros(len(ws), dtype=np.int64)
    for i, bucket in enumerate(buckets):
        claimed = iv.union(np.concatenate([claimed[0], us[cut[i]:cut[i + 1]]]),
                           np.concatenate([claimed[1], ue[cut[i]:cut[i + 1]]]))
        now = iv.measure_within(claimed, ws, we)
        out[COMPUTE_PREFIX + bucket] = now - before
        before = now
    return before
