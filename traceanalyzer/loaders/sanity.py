"""The one place where rows that cannot be true are counted, dropped and reported, for every format.

Run by :func:`traceanalyzer.loaders.load_one` on each loaded Trace (vectorized numpy, no loop per row):

* **end before start** (a negative duration): dropped. NVTX ranges that were never closed (``end_ns == -1``)
  are kept: they are open, not negative.
* **beyond the capture**: a start or end more than ``max(10 × the middle half's span, 1 day)`` outside the middle
  half of the GPU activity's start times (kernels and memory operations; every timed row when there is none).
  This catches ends at INT64_MAX, ``ts``/``dur`` of 10^15 µs and a clock jump of days, while a real capture
  (seconds to hours, possibly with long idle gaps) keeps every row. GPU metric samples are checked the same way.
* **names that cannot be resolved** (kernels without a name, e.g. an nsys export whose StringIds table is
  missing or lacks their ids): kept, because their time is real, but reported: such kernels cannot be classified,
  so communication and the compute buckets are unknown for them.

Each reason becomes one line in ``Trace.warnings`` (so in ``info``, the summary JSON ``warnings``, the terminal
and the report) and the counts are in ``Trace.dropped_rows``; ``raw_counts`` stay what the file holds.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..model.trace import RowChecks, Table, Trace

TIMED_TABLES = ("kernels", "memops", "ranges", "api_calls", "graph_launches", "collectives")
MIN_SLACK_NS = 86_400 * 10**9  # one day
SPREAD_FACTOR = 10


def capture_window(trace: Trace) -> tuple[int, int, int] | None:
    """``(lo, hi, slack)`` ns: no row of ``trace`` outside ``[lo, hi]`` can be real, ``slack`` being how far
    beyond the middle half of the activity that is (see the module docstring); None without timed rows."""
    starts = [trace.tables[t]["start_ns"] for t in ("kernels", "memops") if len(trace.tables[t])]
    if not starts:
        starts = [trace.tables[t]["start_ns"] for t in TIMED_TABLES if len(trace.tables[t])]
    return capture_bounds(starts)


def capture_bounds(starts: list[np.ndarray]) -> tuple[int, int, int] | None:
    """:func:`capture_window` of the given start times (the GPU activity's, when there is any)."""
    starts = [s for s in starts if len(s)]
    if not starts:
        return None
    joined = np.concatenate(starts) if len(starts) > 1 else starts[0]
    q1, q3 = np.percentile(joined, [25, 75], method="nearest")
    slack = max(SPREAD_FACTOR * (int(q3) - int(q1)), MIN_SLACK_NS)
    lo = max(int(q1) - slack, -(1 << 62))
    hi = min(int(q3) + slack, 1 << 62)
    return lo, hi, slack


def drop_impossible(trace: Trace) -> Trace:
    """``trace`` without the rows that cannot be true, with one warning per reason (see the module docstring)."""
    window = capture_window(trace)
    tables = dict(trace.tables)
    dropped: dict[str, RowChecks] = {}
    totals = {name: len(t) for name, t in trace.tables.items()}
    subset = trace.api_calls_subset  # API rows read in part, checked in SQL (loaders.nsys_api)
    for name in TIMED_TABLES:
        table = tables[name]
        if name == "api_calls" and subset is not None:
            totals[name] = subset.rows
            if subset.end_before_start or subset.beyond_capture:
                dropped[name] = RowChecks(subset.end_before_start, subset.beyond_capture)
            continue
        if not len(table):
            continue
        start, end = table["start_ns"], table["end_ns"]
        is_open = (end == -1) if name == "ranges" else np.zeros(len(end), dtype=bool)
        negative = (end < start) & ~is_open
        beyond = np.zeros(len(start), dtype=bool)
        if window is not None:
            lo, hi, _ = window
            beyond = ((start < lo) | (start > hi) | (~is_open & ((end > hi) | (end < lo)))) & ~negative
        bad = negative | beyond
        if bad.any():
            tables[name] = table.take(~bad)
            dropped[name] = RowChecks(int(negative.sum()), int(beyond.sum()))
    metrics = tables["gpu_metrics"]
    if window is not None and len(metrics):
        t = metrics["timestamp_ns"]
        beyond = (t < window[0]) | (t > window[1])
        if beyond.any():
            tables["gpu_metrics"] = metrics.take(~beyond)
            dropped["gpu_metrics"] = RowChecks(0, int(beyond.sum()))
    warnings = _dropped_warnings(dropped, totals, window)
    warnings += _unnamed_warning(tables["kernels"])
    if not warnings:
        return trace
    return replace(trace, tables=tables, warnings=[*trace.warnings, *warnings], dropped_rows=dropped)


def _dropped_warnings(dropped: dict[str, RowChecks], totals: dict[str, int],
                      window: tuple[int, int, int] | None) -> list[str]:
    out = []
    for name, counts in dropped.items():
        total = totals[name]
        parts = []
        if counts.end_before_start:
            parts.append(f"{counts.end_before_start:,} ending before they start")
        if counts.beyond_capture and window is not None:
            days = window[2] / 86_400e9
            parts.append(f"{counts.beyond_capture:,} beyond the capture (more than {days:.3g} day"
                         f"{'s' if days != 1 else ''} from the bulk of the trace's activity)")
        what = "GPU metric samples" if name == "gpu_metrics" else f"{name} rows"
        out.append(f"dropped {counts.end_before_start + counts.beyond_capture:,} of {total:,} {what} that cannot "
                   "be true: "
                   + "; ".join(parts))
    return out


def _unnamed_warning(kernels: Table) -> list[str]:
    if not len(kernels):
        return []
    unnamed = int(np.count_nonzero(kernels["name_id"] < 0))
    if not unnamed:
        return []
    return [f"{unnamed:,} of {len(kernels):,} kernels have names that cannot be resolved (the export's StringIds "
            "table is missing or lacks their ids): they cannot be classified, so communication and compute time "
            "are unknown for them"]
