"""Why the slow rank is slow: its kernels compared with the other ranks' by role.

The role of a kernel is its name and class (bucket / sub-bucket) among the kernels that run inside steps: the same
kernel at the same place in every rank's layer has the same name and count per step on every rank of a
tensor-parallel group. For the straggler (the rank the others wait for, ``CrossRankSummary.straggler_rank``) and each
role, the extra time per step is its time per step minus the median of the other ranks' time per step for the same
role; roles are added up into their class ("attention", "moe_fp4_gemm / grouped_gemm"), communication left out (its
time is the waiting, not the cause). Reads only ``DeviceSummary.top_kernels_in_steps`` and step counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .results import DeviceSummary


@dataclass(frozen=True)
class SlowClass:
    """One kernel class that makes up part of the slow rank's lateness."""

    bucket: str
    subbucket: str | None
    kernels_per_step: int
    straggler_median_ns: float  # the straggler's median kernel duration of the class's largest role
    others_median_ns: float  # the same role on the other ranks (median over ranks)
    extra_ns_per_step: int
    names: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.bucket if not self.subbucket or self.subbucket == self.bucket else \
            f"{self.bucket} / {self.subbucket}"

    @property
    def pct(self) -> float:
        return 100.0 * (self.straggler_median_ns / self.others_median_ns - 1) if self.others_median_ns else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"class": self.label, "kernels_per_step": self.kernels_per_step,
                "straggler_median_ns": round(self.straggler_median_ns), "others_median_ns":
                round(self.others_median_ns), "extra_ns_per_step": self.extra_ns_per_step,
                "pct_slower": round(self.pct, 1), "kernel_names": list(self.names)}


def _per_step(dev: DeviceSummary) -> dict[tuple[str, str | None, str], tuple[float, float, float]]:
    """Role → (time per step, count per step, median duration) from the device's kernels inside steps."""
    top = dev.top_kernels_in_steps
    steps = max(dev.steps, 1)
    if not len(top):
        return {}
    out = {}
    for bucket, sub, name, count, total, p50 in zip(top["bucket"], top["subbucket"], top["name"], top["count"],
                                                    top["total_ns"], top["p50_ns"], strict=True):
        if bucket == "communication":
            continue
        out[(str(bucket), None if sub is None else str(sub), str(name))] = (float(total) / steps,
                                                                             float(count) / steps, float(p50))
    return out


def slow_rank_classes(devices: list[DeviceSummary], straggler: int, min_extra_ns: int = 0) -> list[SlowClass]:
    """The kernel classes the straggler spends more time per step in than the other ranks do (by role), largest
    extra first; only classes with at least ``min_extra_ns`` extra per step."""
    by_rank: dict[int, DeviceSummary] = {}
    for d in devices:
        by_rank.setdefault(d.rank, d)
    if straggler not in by_rank or len(by_rank) < 2:
        return []
    mine = _per_step(by_rank[straggler])
    others = [_per_step(d) for r, d in by_rank.items() if r != straggler]
    classes: dict[tuple[str, str | None], list[tuple[float, float, float, float, str]]] = {}
    for role, (total, count, p50) in mine.items():
        theirs = [o[role] for o in others if role in o]
        if len(theirs) < max(1, len(others) // 2):
            continue  # a role most other ranks do not have is not comparable
        other_total = float(np.median([t[0] for t in theirs]))
        other_p50 = float(np.median([t[2] for t in theirs]))
        classes.setdefault(role[:2], []).append((total - other_total, count, p50, other_p50, role[2]))
    out = []
    for (bucket, sub), roles in classes.items():
        extra = sum(r[0] for r in roles)
        if extra <= 0 or extra < min_extra_ns:
            continue
        largest = max(roles, key=lambda r: r[0])
        out.append(SlowClass(bucket=bucket, subbucket=sub, kernels_per_step=round(sum(r[1] for r in roles)),
                             straggler_median_ns=largest[2], others_median_ns=largest[3],
                             extra_ns_per_step=round(extra), names=tuple(r[4] for r in roles if r[0] > 0)))
    return sorted(out, key=lambda c: -c.extra_ns_per_step)


__all__ = ["SlowClass", "slow_rank_classes"]
