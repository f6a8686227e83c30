"""Number formatting and bucket presentation shared by the terminal and HTML renderers."""

from __future__ import annotations

import math
from typing import Any, SupportsFloat

from ..buckets import BUCKET_COLORS, BUCKETS

#: Buckets in display order (declared in :mod:`traceanalyzer.buckets`); unknown buckets sort after these.
BUCKET_ORDER: tuple[str, ...] = BUCKETS
FALLBACK_COLOR = "#6c757d"
IDLE_COLOR = "#e9ecef"
HIDDEN_COLOR = "#f4a582"
EXPOSED_COLOR = "#b2182b"


def bucket_sort_key(bucket: str) -> tuple[int, str]:
    """Sort key putting known buckets in taxonomy order and the rest alphabetically after them."""
    try:
        return (BUCKET_ORDER.index(bucket), bucket)
    except ValueError:
        return (len(BUCKET_ORDER), bucket)


def bucket_color(bucket: str) -> str:
    """The chart colour of a bucket."""
    return BUCKET_COLORS.get(bucket, FALLBACK_COLOR)


def fmt_ns(ns: SupportsFloat | None, *, unit: str | None = None) -> str:
    """A duration in the most readable unit (``12.3 ms``); ``—`` when unknown."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "—"
    value = float(ns)
    if unit is None:
        mag = abs(value)
        unit = "s" if mag >= 1e9 else "ms" if mag >= 1e6 else "µs" if mag >= 1e3 else "ns"
    scale = {"s": 1e9, "ms": 1e6, "µs": 1e3, "us": 1e3, "ns": 1.0}[unit]
    scaled = value / scale
    if unit == "ns":
        return f"{scaled:.0f} ns"
    digits = 3 if abs(scaled) < 10 else 2 if abs(scaled) < 100 else 1
    return f"{scaled:.{digits}f} {unit}"


def fmt_ms(ns: SupportsFloat | None) -> str:
    """A duration in milliseconds with 3 decimals; ``—`` when unknown."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "—"
    return f"{float(ns) / 1e6:.3f}"


def fmt_pct(value: float | None, digits: int = 1) -> str:
    """A percentage (``42.0 %``); ``—`` when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f} %"


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
    rng, names = what_if.details.get("range_ns"), what_if.details.get("range_basis")
    if not rng or not names or what_if.comm_free_step_saving_ns is None:
        return ""
    return (f"range {fmt_ns(rng[0])} ({names[0]}) – {fmt_ns(rng[1])} ({names[1]}), "
            f"confidence {what_if.details.get('confidence', '?')}")


def issue_only_text(what_if: Any) -> str:
    """The what-if counting only NCCL's own issue range of each collective (``details.issue_only_saving_ns``),
    where the step is host-bound and that reading differs; else ``""``."""
    issue = what_if.details.get("issue_only_saving_ns")
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


def runs_lines(summary: Any) -> list[str]:
    """One line per run when the inputs are not exactly one whole run (several runs, or ranks missing)."""
    runs = summary.extra.get("runs") or []
    if len(runs) <= 1 and not any(r.get("partial") for r in runs):
        return []
    lines = [f"{len(runs)} run(s) among the inputs; cross-rank results use run 1 only:" if len(runs) > 1
             else "The inputs are part of a larger job:"]
    for i, r in enumerate(runs, 1):
        missing = f", {r['ranks_missing']} of {r['world_size']} ranks missing" if r.get("partial") else ""
        files = ", ".join(r["files"][:4]) + (" …" if len(r["files"]) > 4 else "")
        lines.append(f"  run {i}: ranks {', '.join(map(str, r['ranks'][:8]))}{missing} ({files})")
    return lines
