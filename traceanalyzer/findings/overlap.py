"""Findings that share time: each finding lists the others whose time lies in the same intervals, and the report
gives one combined bound, "together at most X ms/step", from the union of those intervals, never their sum.

The rules measure their time inside a few disjoint interval sets of a device's step:

* ``sm_idle_in_collectives``: the exposed communication intervals (a collective runs, no compute beside it).
  ``exposed_communication`` measures the whole set; ``comm_serialized_with_compute``, ``nccl_small_messages``,
  ``low_comm_bandwidth``, ``straggler_wait`` and ``moe_exposed_dispatch_combine`` measure parts of it, and
  ``slow_rank``'s and ``moe_expert_imbalance``'s extra compute is what the other ranks spend there waiting. The
  set's union per step is the device's ``comm_exposed_per_step_ns``.
* ``gpu_idle``: idle gaps inside steps (launch gaps of ``host_bound_no_cuda_graphs``, long gaps of
  ``idle_gaps_host_cause``, the gap between passes of ``host_gap_between_passes``, the host-side collective calls
  the GPU waits for). Its union is the device's idle time per step.
* ``norm_chain``: the kernels and gaps of the add + RMSNorm chains after all-reduces; ``norm_not_fused`` and
  ``allreduce_not_fused`` split each chain into two disjoint parts (docs/FINDINGS.md), so they add up.
* ``comm_beside_compute``: compute slowed by collectives beside it (``comm_compute_contention``).

Disjoint sets add; inside a set the bound is the set's union (capped by what its findings claim in total).
"""

from __future__ import annotations

from typing import Any

from ..analysis.results import Finding, Summary
from . import rule_ids as ids

GROUPS: dict[str, tuple[str, ...]] = {
    "sm_idle_in_collectives": (ids.EXPOSED_COMMUNICATION, ids.COMM_SERIALIZED_WITH_COMPUTE, ids.NCCL_SMALL_MESSAGES,
                               ids.LOW_COMM_BANDWIDTH, ids.STRAGGLER_WAIT, ids.SLOW_RANK,
                               ids.MOE_EXPOSED_DISPATCH_COMBINE, ids.MOE_EXPERT_IMBALANCE),
    "gpu_idle": (ids.HOST_BOUND_NO_CUDA_GRAPHS, ids.IDLE_GAPS_HOST_CAUSE, ids.HOST_GAP_BETWEEN_PASSES,
                 ids.COLLECTIVE_HOST_COST, ids.COLLECTIVES_WITHOUT_KERNELS),
    "norm_chain": (ids.ALLREDUCE_NOT_FUSED, ids.NORM_NOT_FUSED),
    "comm_beside_compute": (ids.COMM_COMPUTE_CONTENTION,),
}
#: groups whose findings measure disjoint parts of the set (they add up)
_DISJOINT_PARTS = {"norm_chain"}


def _group_of(fid: str) -> str | None:
    return next((g for g, ids in GROUPS.items() if fid in ids), None)


def _union_per_step(summary: Summary, group: str) -> int | None:
    """The measure per step of a group's interval set on the worst device, where the summary has it."""
    if group == "sm_idle_in_collectives":
        values = [d.comm_exposed_per_step_ns for d in summary.devices if d.comm_exposed_per_step_ns is not None]
        return max(values) if values else None
    if group == "gpu_idle":
        values = [int(d.in_steps["idle_ns"]) // d.steps for d in summary.devices
                  if d.steps and d.in_steps.get("idle_ns") is not None]
        return max(values) if values else None
    return None


def mark_shared_time(summary: Summary, found: list[Finding]) -> dict[str, Any] | None:
    """Add ``shares_time_with`` to each finding's evidence (in place) and return the combined bound, or None when
    no finding has a time impact."""
    timed = [f for f in found if f.impact_ns_per_step is not None]
    if not timed:
        return None
    by_group: dict[str, list[Finding]] = {}
    for f in timed:
        by_group.setdefault(_group_of(f.id) or f"own:{f.id}", []).append(f)
    groups = []
    total = 0
    for group, members in by_group.items():
        ids = [m.id for m in members]
        for m in members:
            shared = [i for i in ids if i != m.id]
            if shared and group not in _DISJOINT_PARTS:
                m.evidence["shares_time_with"] = shared
        claimed = sum(int(m.impact_ns_per_step or 0) for m in members)
        if group in _DISJOINT_PARTS or len(members) == 1:
            bound = claimed
        else:
            union = _union_per_step(summary, group)
            largest = max(int(m.impact_ns_per_step or 0) for m in members)
            bound = max(largest, min(claimed, union)) if union is not None else claimed
        total += bound
        groups.append({"time": group.removeprefix("own:"), "findings": ids, "at_most_ns_per_step": bound,
                       "sum_of_impacts_ns": claimed})
    steps = [d.step_ns_median for d in summary.devices if d.step_ns_median]
    step = max(steps) if steps else None
    if step is not None:
        total = min(total, int(step))
    return {"at_most_ns_per_step": int(total), "sum_of_impacts_ns": sum(g["sum_of_impacts_ns"] for g in groups),
            "pct_of_step": round(100.0 * total / step, 1) if step else None, "groups": groups,
            "basis": "union of the interval sets the findings measure (docs/FINDINGS.md, 'Findings that share "
                     "time'): findings in one set share their time, sets are disjoint"}


__all__ = ["GROUPS", "mark_shared_time"]
