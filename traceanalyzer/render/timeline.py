"""The per-device timeline of one representative step: kernels per stream coloured by bucket, downsampled.

Big traces hold hundreds of thousands of kernels; a browser draws a few thousand rectangles comfortably. Adjacent
kernels of one bucket on one stream that are shorter than a pixel merge into one rectangle ("12 kernels"), and the
pixel doubles until at most ``max_rects`` rectangles remain (last resort, when buckets alternate faster than
pixels: one rectangle per pixel and stream, coloured by its longest kernel). All vectorized numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .formatting import EXPOSED_COLOR, bucket_color, bucket_sort_key, display_names

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from ..analysis.results import DeviceSummary
    from ..model.trace import Trace

MAX_RECTS = 5000
PLOT_WIDTH_PX = 1400
NAME_CHARS = 120  # hover text keeps this many characters of a kernel name
EXPOSED_ROW = "exposed comm"


@dataclass(frozen=True)
class Window:
    """The time window drawn for one device (trace clock ns) and why it was chosen."""

    start_ns: int
    end_ns: int
    label: str


@dataclass(frozen=True)
class Rects:
    """Downsampled rectangles: one row per drawn bar."""

    stream: np.ndarray  # int64
    start_ns: np.ndarray  # int64
    end_ns: np.ndarray  # int64
    bucket: np.ndarray  # object (str)
    name: np.ndarray  # object (str): kernel name, or "N kernels" for merged groups
    count: np.ndarray  # int64, kernels merged into the rectangle
    kernels_in_window: int

    def __len__(self) -> int:
        return len(self.start_ns)


def representative_window(summary: DeviceSummary) -> Window:
    """The median-duration step of the device (from ``per_step``), else its whole span."""
    steps = summary.per_step
    if len(steps) and {"start_ns", "end_ns"} <= set(steps.columns):
        start = steps["start_ns"].to_numpy(dtype=np.int64)
        end = steps["end_ns"].to_numpy(dtype=np.int64)
        dur = end - start
        order = np.argsort(dur, kind="stable")
        pick = int(order[(len(order) - 1) // 2])
        step_name = steps["step"].iloc[pick] if "step" in steps.columns else pick
        return Window(int(start[pick]), int(end[pick]), f"step {step_name} (median of {len(steps)} steps)")
    if summary.figures is not None:
        lo, hi = summary.figures.window_ns
        return Window(int(lo), int(hi), "whole trace (no steps found)")
    return Window(0, 0, "whole trace (no steps found)")


def _activity(trace: Trace, rank: int, device: int, window: Window) -> tuple[np.ndarray, ...]:
    """start, end, stream, bucket (str), name (str) of the device's kernels and memory operations that overlap
    ``window`` (all of them when the window is empty), clipped to it."""
    parts = []
    clip = window.end_ns > window.start_ns
    for table, default_bucket in ((trace.kernels, "unclassified"), (trace.memops, "memory")):
        if not len(table):
            continue
        mask = (table["device"] == device) & ((table["rank"] == rank) | (rank < 0))
        if clip:
            mask &= (table["end_ns"] > window.start_ns) & (table["start_ns"] < window.end_ns)
        t = table.take(mask)
        if not len(t):
            continue
        if "bucket_id" in t:
            buckets = trace.names(t["bucket_id"])
            buckets = np.where(pd.isna(buckets), default_bucket, buckets).astype(object)
        else:
            buckets = np.full(len(t), default_bucket, dtype=object)
        ids, inverse = np.unique(t["name_id"], return_inverse=True)  # each distinct name demangled once
        shown = np.array([*display_names(trace.names(ids).tolist())], dtype=object)[inverse.ravel()]
        names = np.where(pd.isna(shown), "(unnamed)", shown).astype(object)
        start, end = t["start_ns"], t["end_ns"]
        if clip:
            start, end = np.maximum(start, window.start_ns), np.minimum(end, window.end_ns)
        parts.append((start, end, t["stream"], buckets, names))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, np.zeros(0, dtype=object), np.zeros(0, dtype=object)
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(5))


def _groups(start: np.ndarray, end: np.ndarray, stream: np.ndarray, bucket_code: np.ndarray,
            pixel_ns: int, mixed: bool) -> np.ndarray:
    """Start index of each rectangle in (stream, start)-sorted rows."""
    dur = end - start
    small = dur < pixel_ns
    new = np.ones(len(start), dtype=bool)
    if len(start) > 1:
        gap = start[1:] - end[:-1]
        join = (stream[1:] == stream[:-1]) & small[1:] & small[:-1] & (gap <= pixel_ns)
        if mixed:  # one rectangle per pixel at most, coloured by its longest kernel
            cell = start // pixel_ns
            join &= cell[1:] == cell[:-1]
        else:
            join &= bucket_code[1:] == bucket_code[:-1]
        new[1:] = ~join
    return np.flatnonzero(new)


def downsample(start: np.ndarray, end: np.ndarray, stream: np.ndarray, bucket: np.ndarray, name: np.ndarray,
               *, window_ns: int, max_rects: int = MAX_RECTS, width_px: int = PLOT_WIDTH_PX) -> Rects:
    """Merge sub-pixel neighbours of one bucket on one stream until at most ``max_rects`` rectangles remain."""
    n = len(start)
    order = np.lexsort((start, stream))
    start, end, stream, bucket, name = (a[order] for a in (start, end, stream, bucket, name))
    _, bucket_code = np.unique(bucket.astype(str), return_inverse=True) if n else (None, np.zeros(0, np.int64))
    first_pixel = max(int(window_ns) // width_px, 1)
    pixel, mixed = first_pixel, False
    while True:
        idx = _groups(start, end, stream, bucket_code, pixel, mixed)
        if len(idx) <= max_rects or (mixed and pixel >= window_ns):
            break
        if pixel >= window_ns:  # buckets alternate too often: start again, merging across buckets
            pixel, mixed = first_pixel, True
        else:
            pixel *= 2
    if not n:
        return Rects(stream, start, end, bucket, name, np.zeros(0, np.int64), 0)
    counts = np.diff(np.append(idx, n))
    g_start = np.minimum.reduceat(start, idx)
    g_end = np.maximum.reduceat(end, idx)
    # the bucket and name of a group come from its longest kernel
    group_of = np.repeat(np.arange(len(idx)), counts)
    longest = np.lexsort((end - start, group_of))
    last = np.cumsum(counts) - 1
    rep = longest[last]
    g_bucket = bucket[rep]
    g_name = name[rep].copy()
    merged = counts > 1
    g_name[merged] = [f"{c} kernels, longest: {nm}" for c, nm in zip(counts[merged], name[rep][merged],
                                                                      strict=True)]
    return Rects(stream[idx], g_start, g_end, g_bucket, g_name, counts, n)


def device_rects(trace: Trace, summary: DeviceSummary, window: Window, *,
                 max_rects: int = MAX_RECTS) -> Rects:
    """Downsampled activity of one device clipped to ``window``."""
    start, end, stream, bucket, name = _activity(trace, summary.rank, summary.device, window)
    span = int(window.end_ns - window.start_ns) if window.end_ns > window.start_ns else \
        int(end.max() - start.min()) if len(start) else 1
    return downsample(start, end, stream, bucket, name, window_ns=max(span, 1), max_rects=max_rects)


def _short(text: str) -> str:
    return text if len(text) <= NAME_CHARS else text[: NAME_CHARS - 1] + "…"


def _exposed_segments(summary: DeviceSummary, window: Window) -> tuple[np.ndarray, np.ndarray]:
    gaps = summary.comm_idle_gaps_ns
    if not len(gaps) or not {"start_ns", "end_ns"} <= set(gaps.columns):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    s = gaps["start_ns"].to_numpy(dtype=np.int64)
    e = gaps["end_ns"].to_numpy(dtype=np.int64)
    if window.end_ns > window.start_ns:
        keep = (e > window.start_ns) & (s < window.end_ns)
        s, e = np.maximum(s[keep], window.start_ns), np.minimum(e[keep], window.end_ns)
    if len(s) > MAX_RECTS:  # keep the longest ones; they are what the eye needs
        top = np.sort(np.argsort(e - s)[-MAX_RECTS:])
        s, e = s[top], e[top]
    return s, e


def window_signature(trace: Trace, summary: DeviceSummary, window: Window) -> tuple[str, int]:
    """(digest of the names of the device's activities in ``window``, in start order; their number): two devices
    with equal signatures ran the same kernels and copies in the same order there."""
    import hashlib

    start, _, stream, _, name = _activity(trace, summary.rank, summary.device, window)
    order = np.lexsort((stream, start))
    digest = hashlib.sha256("\x00".join(str(n) for n in name[order]).encode("utf-8", "surrogatepass"))
    return digest.hexdigest(), len(start)


def layer_window(summary: DeviceSummary, step: Window) -> Window | None:
    """The layer of ``step`` to zoom onto: the one with the most exposed communication (the first on ties), else,
    without communication, the median-length one. None when the step has no layers."""
    pl = summary.per_layer
    if not len(pl) or not {"start_ns", "end_ns"} <= set(pl.columns) or step.end_ns <= step.start_ns:
        return None
    start, end = pl["start_ns"].to_numpy(np.int64), pl["end_ns"].to_numpy(np.int64)
    rows = np.flatnonzero((start >= step.start_ns) & (end <= step.end_ns))
    if not len(rows):
        return None
    exposed = pl["comm_exposed_ns"].to_numpy(np.int64)[rows] if "comm_exposed_ns" in pl.columns else None
    if exposed is not None and exposed.max() > 0:
        pick, why = int(rows[int(np.argmax(exposed))]), "the layer with the most exposed communication"
    else:
        order = rows[np.argsort((end - start)[rows], kind="stable")]
        pick, why = int(order[(len(order) - 1) // 2]), "the median-length layer"
    name = str(pl["name"].iloc[pick]) if "name" in pl.columns else f"layer {pick}"
    return Window(int(start[pick]), int(end[pick]), f"{name} of {step.label.split(' (')[0]} ({why})")


def timeline_figure(trace: Trace, summary: DeviceSummary, *, escape: Any, max_rects: int = MAX_RECTS,
                    window: Window | None = None) -> tuple[go.Figure, dict[str, Any]]:
    """The timeline figure of one device over ``window`` (default: its representative step) and facts about it
    (window, kernels, rectangles drawn).

    ``escape`` makes trace text safe for plotly's pseudo-HTML labels.
    """
    import plotly.graph_objects as go

    window = window or representative_window(summary)
    rects = device_rects(trace, summary, window, max_rects=max_rects)
    origin = window.start_ns if window.end_ns > window.start_ns else (int(rects.start_ns.min()) if len(rects)
                                                                        else 0)
    streams = [int(s) for s in np.unique(rects.stream)]
    row_of = {s: f"stream {s}" for s in streams}
    fig = go.Figure()
    seg_s, seg_e = _exposed_segments(summary, window)
    if len(seg_s):
        fig.add_trace(go.Bar(
            orientation="h", name="exposed comm (SM idle)", y=np.full(len(seg_s), EXPOSED_ROW, dtype=object),
            base=(seg_s - origin) / 1e6, x=(seg_e - seg_s) / 1e6, marker={"color": EXPOSED_COLOR},
            hovertemplate="exposed comm: %{x:.4f} ms at %{base:.4f} ms<extra></extra>"))
    for bucket in sorted({str(b) for b in rects.bucket}, key=bucket_sort_key):
        sel = rects.bucket == bucket
        comm = bucket == "communication"
        names = np.array([escape(_short(str(nm))) for nm in rects.name[sel]], dtype=object)
        fig.add_trace(go.Bar(
            orientation="h", name=escape(bucket),
            y=np.array([row_of[int(s)] for s in rects.stream[sel]], dtype=object),
            base=(rects.start_ns[sel] - origin) / 1e6, x=(rects.end_ns[sel] - rects.start_ns[sel]) / 1e6,
            customdata=names,
            marker={"color": bucket_color(bucket),
                    "line": {"color": "#7a1010" if comm else "rgba(0,0,0,0)", "width": 1.5 if comm else 0}},
            hovertemplate="%{customdata}<br>%{base:.4f} ms + %{x:.4f} ms<extra>" + escape(bucket) + "</extra>"))
    rows = ([EXPOSED_ROW] if len(seg_s) else []) + [row_of[s] for s in streams]
    fig.update_layout(
        barmode="overlay", bargap=0.25, height=140 + 34 * max(len(rows), 1),
        margin={"l": 110, "r": 50, "t": 30, "b": 40},
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "traceorder": "normal"},
        xaxis={"title": {"text": "ms from the window's start" if window.end_ns > window.start_ns else "ms"},
               "zeroline": False, "range": [0, max(window.end_ns - window.start_ns, 0) / 1e6] if
               window.end_ns > window.start_ns else None},
        modebar={"orientation": "v"},
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(rows)), "type": "category"})
    facts = {"window": window.label, "window_ns": max(window.end_ns - window.start_ns, 0),
             "kernels": rects.kernels_in_window, "rects": len(rects), "streams": len(streams)}
    return fig, facts
