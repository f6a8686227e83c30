"""Number formatting and bucket presentation shared by the terminal and HTML renderers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, SupportsFloat

from ..classify.demangle import display_name as display_name  # re-exported: renderers format names from here
from ..classify.demangle import display_names as display_names
from ..model.buckets import BUCKET_COLORS, BUCKETS
from ..model.units import fmt_ns as fmt_ns
from ..model.units import fmt_pct as fmt_pct

#: Buckets in display order (declared in :mod:`traceanalyzer.model.buckets`); unknown buckets sort after these.
BUCKET_ORDER: tuple[str, ...] = BUCKETS
FALLBACK_COLOR = "#6c757d"
IDLE_COLOR = "#e9ecef"
HIDDEN_COLOR = "#f4a582"
EXPOSED_COLOR = "#b2182b"
#: Colours of devices/ranks in charts that compare them: blues, greens, purples and greys only, so no rank is
#: ever drawn in the red/orange of communication, "exposed" or "hidden".
RANK_COLORS: tuple[str, ...] = ("#1f5fa8", "#2a9d8f", "#6a3d9a", "#5e8c31", "#17a2b8", "#4a4a8a", "#8c8c8c",
                                "#0b3d5c")


def rank_color(index: int) -> str:
    """The chart colour of the ``index``-th device (cycling through :data:`RANK_COLORS`)."""
    return RANK_COLORS[index % len(RANK_COLORS)]


def bucket_sort_key(bucket: str) -> tuple[int, str]:
    """Sort key putting known buckets in taxonomy order and the rest alphabetically after them."""
    try:
        return (BUCKET_ORDER.index(bucket), bucket)
    except ValueError:
        return (len(BUCKET_ORDER), bucket)


def bucket_color(bucket: str) -> str:
    """The chart colour of a bucket."""
    return BUCKET_COLORS.get(bucket, FALLBACK_COLOR)


def fmt_bytes(n: SupportsFloat | None) -> str:
    """A message size in binary units (``128 MiB``); ``—`` when unknown (None, NaN or negative)."""
    if n is None or (isinstance(n, float) and math.isnan(n)) or float(n) < 0:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" or value == int(value) else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def fmt_gbps(value: float | None) -> str:
    """A bandwidth in GB/s (10⁹ B/s); ``—`` when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.1f} GB/s" if value < 100 else f"{value:.0f} GB/s"


def pct_of(part: float | int | None, whole: float | int | None) -> float | None:
    """``part / whole * 100``, or None when either is unknown or ``whole`` is 0."""
    if part is None or whole is None or not whole:
        return None
    return 100.0 * float(part) / float(whole)


def device_label(rank: int, device: int, name: str | None = None, *, with_name: bool = False) -> str:
    """``rank 0 · GPU 1`` (rank omitted when unknown), optionally with the GPU model."""
    head = f"rank {rank} · GPU {device}" if rank is not None and rank >= 0 else f"GPU {device}"
    return f"{head} ({name})" if with_name and name else head


ISSUE_ONLY_MAX_RATIO = 0.9  # show the NCCL-issue-only reading of a host-bound what-if when it is this much smaller


def range_text(what_if: Any) -> str:
    """The what-if's range with the reading each end comes from and its confidence (``details.range_ns``,
    ``range_basis``, ``confidence``); ``""`` when it has none."""
    spread = what_if.details.range
    if spread is None or what_if.comm_free_step_saving_ns is None:
        return ""
    (low, high), (low_name, high_name) = spread.range_ns, spread.range_basis
    return (f"range {fmt_ns(low)} ({low_name}) – {fmt_ns(high)} ({high_name}), "
            f"confidence {what_if.details.confidence}")


def issue_only_text(what_if: Any) -> str:
    """The what-if counting only NCCL's own issue range of each collective (``details.issue_only_saving_ns``),
    where the step is host-bound and that reading differs; else ``""``."""
    steps = what_if.details.steps
    issue = steps.issue_only_saving_ns if steps is not None else None
    base = what_if.comm_free_step_saving_ns
    if issue is None or base is None or what_if.basis == "gpu_transfer" or issue > base * ISSUE_ONLY_MAX_RATIO:
        return ""
    return f"counting NCCL's issue alone: {fmt_ns(issue)}"


def step_source_text(d: Any) -> str:
    """Where a device's steps came from and how sure that is, e.g. ``idle_gaps, medium``; ``no steps`` when the
    whole window stands in for one."""
    if d.step_source == "none":
        return "no steps: whole window"
    return f"{d.step_source}, {d.step_confidence}"


def outside_steps_text(d: Any) -> str:
    """The device's time that belongs to no step, e.g. ``outside steps 3.1 ms (4 % of the span, 2.2 ms busy)``;
    ``""`` without steps."""
    outside = d.in_steps.get("outside_ns") if d.step_source != "none" and d.in_steps else None
    if outside is None:
        return ""
    pct = 100 * outside / d.span_ns if d.span_ns else 0.0
    return f"outside steps {fmt_ns(outside)} ({pct:.0f} % of the span, {fmt_ns(d.in_steps['busy_outside_ns'])} busy)"


def runs_lines(summary: Any) -> list[str]:
    """One line per run when the inputs are not exactly one whole run (several runs, or ranks missing)."""
    runs = summary.runs or []
    if len(runs) <= 1 and not any(r.ranks_missing for r in runs):
        return []
    lines = [f"{len(runs)} run(s) among the inputs; cross-rank results use run 1 only:" if len(runs) > 1
             else "The inputs are part of a larger job:"]
    for i, r in enumerate(runs, 1):
        missing = f" — {r.ranks_missing} of {r.world_size} ranks missing" if r.ranks_missing else ""
        names = [Path(p).name for p in r.paths]
        files = ", ".join(names[:4]) + (" …" if len(names) > 4 else "")
        lines.append(f"  run {i}: ranks {', '.join(map(str, r.ranks[:8]))}{missing} ({files})")
    return lines
