"""Plotly figures of the HTML report, built from result objects only (no trace access, no I/O).

Every string that may come from a trace passes through ``escape`` (plotly renders a subset of HTML in labels).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..model.units import fmt_round_ns
from .formatting import (
    EXPOSED_COLOR,
    HIDDEN_COLOR,
    IDLE_COLOR,
    bucket_color,
    bucket_sort_key,
    device_label,
    rank_color,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from ..analysis.results import CrossRankSummary, DeviceSummary

Escape = Callable[[str], str]

_BASE_LAYOUT = {"margin": {"l": 120, "r": 50, "t": 30, "b": 45},
                "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "traceorder": "normal"},
                "modebar": {"orientation": "v"},
                "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12}}


def column(df: pd.DataFrame, *candidates: str) -> str | None:
    """The first of ``candidates`` that ``df`` has, else None."""
    return next((c for c in candidates if c in df.columns), None)


def _labels(devices: Sequence[DeviceSummary], escape: Escape) -> list[str]:
    return [escape(device_label(d.rank, d.device)) for d in devices]


def breakdown_figure(devices: Sequence[DeviceSummary], escape: Escape) -> go.Figure:
    """Stacked bars per device: exclusive bucket time (adds up to busy) plus idle, in ms."""
    import plotly.graph_objects as go

    labels = _labels(devices, escape)
    buckets = sorted({b for d in devices for b in d.bucket_exclusive_ns}, key=bucket_sort_key)
    fig = go.Figure()
    for bucket in buckets:
        ms = [d.bucket_exclusive_ns.get(bucket, 0) / 1e6 for d in devices]
        fig.add_trace(go.Bar(orientation="h", y=labels, x=ms, name=escape(bucket),
                             marker={"color": bucket_color(bucket)},
                             hovertemplate="%{y}: %{x:.3f} ms<extra>" + escape(bucket) + "</extra>"))
    fig.add_trace(go.Bar(orientation="h", y=labels, x=[d.idle_ns / 1e6 for d in devices], name="idle",
                         marker={"color": IDLE_COLOR, "line": {"color": "#adb5bd", "width": 1}},
                         hovertemplate="%{y}: %{x:.3f} ms<extra>idle</extra>"))
    fig.update_layout(**_BASE_LAYOUT, barmode="stack", height=110 + 40 * len(devices),
                      xaxis={"title": {"text": "ms over the profiled window"}},
                      yaxis={"autorange": "reversed"})
    return fig


def comm_figure(devices: Sequence[DeviceSummary], escape: Escape) -> go.Figure | None:
    """Stacked bars per device: communication hidden under compute vs exposed (SM idle), in ms; None when no
    device communicates."""
    import plotly.graph_objects as go

    if not any(d.comm_ns for d in devices):
        return None
    labels = _labels(devices, escape)
    fig = go.Figure()
    for name, attr, color in (("exposed (SM idle)", "comm_exposed_ns", EXPOSED_COLOR),
                              ("hidden under compute", "comm_hidden_ns", HIDDEN_COLOR)):
        fig.add_trace(go.Bar(orientation="h", y=labels, x=[getattr(d, attr) / 1e6 for d in devices], name=name,
                             marker={"color": color}, hovertemplate="%{y}: %{x:.3f} ms<extra>" + name + "</extra>"))
    fig.update_layout(**_BASE_LAYOUT, barmode="stack", height=110 + 40 * len(devices),
                      xaxis={"title": {"text": "communication ms over the profiled window"}},
                      yaxis={"autorange": "reversed"})
    return fig


def step_figure(devices: Sequence[DeviceSummary], escape: Escape) -> go.Figure | None:
    """Per step and device: step duration and exposed communication (ms); None without steps."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, d in enumerate(devices):
        steps = d.per_step
        if len(steps) < 2 or not {"step", "duration_ns", "comm_exposed_ns"} <= set(steps.columns):
            continue  # one step is a number (the table has it), not a chart
        color = rank_color(i)
        label = escape(device_label(d.rank, d.device))
        x = steps["step"].to_numpy()
        fig.add_trace(go.Scatter(x=x, y=steps["duration_ns"].to_numpy(dtype=float) / 1e6, mode="lines+markers",
                                 name=f"{label}: step", line={"color": color},
                                 hovertemplate="step %{x}: %{y:.3f} ms<extra>%{fullData.name}</extra>"))
        if d.comm_ns:
            fig.add_trace(go.Scatter(x=x, y=steps["comm_exposed_ns"].to_numpy(dtype=float) / 1e6,
                                     mode="lines+markers", name=f"{label}: exposed comm",
                                     line={"color": color, "dash": "dot"},
                                     hovertemplate="step %{x}: %{y:.3f} ms<extra>%{fullData.name}</extra>"))
    if not fig.data:
        return None
    fig.update_layout(**_BASE_LAYOUT, height=300, xaxis={"title": {"text": "step"}},
                      yaxis={"title": {"text": "ms"}, "rangemode": "tozero"})
    fig.update_layout(margin={"l": 60})
    return fig


def layer_totals(df: pd.DataFrame) -> pd.DataFrame:
    """Per-layer rows (one per step × layer, those inside steps) summed per layer, with the median exposed comm of
    one occurrence.

    Empty when the frame lacks the ``layer`` / ``comm_exposed_ns`` columns.
    """
    if not len(df) or not {"layer", "comm_exposed_ns"} <= set(df.columns):
        return pd.DataFrame()
    if "step" in df.columns and (df["step"] >= 0).any():
        df = df[df["step"] >= 0]  # layer instances outside every step (warm-up, NCCL init) are not per-step figures
    named = df.assign(name=df["name"].astype(str) if "name" in df.columns else df["layer"].astype(str))
    sums = {c: (c, "sum") for c in ("comm_ns", "comm_exposed_ns", "compute_ns") if c in df.columns}
    out = named.groupby("layer", sort=True).agg(name=("name", "first"), occurrences=("name", "size"),
                                                exposed_median_ns=("comm_exposed_ns", "median"), **sums)
    return out.reset_index()


#: Grouped bars (one per layer and device) up to this many; beyond, one bar per layer with the devices' range.
MAX_GROUPED_BARS = 64


def layer_figure(devices: Sequence[DeviceSummary], escape: Escape) -> go.Figure | None:
    """Median exposed communication of one layer occurrence (≈ per step), in ms: grouped bars per device, or, with
    more than :data:`MAX_GROUPED_BARS` bars (80 layers × 8 ranks), one bar per layer at the median over devices with
    whiskers from the smallest to the largest device."""
    import plotly.graph_objects as go

    fig = go.Figure()
    series = [(i, d, layer_totals(d.per_layer)) for i, d in enumerate(devices)]
    series = [(i, d, t) for i, d, t in series if len(t) and d.comm_ns]
    if not series:
        return None
    if sum(len(t) for _, _, t in series) <= MAX_GROUPED_BARS or len(series) == 1:
        for i, d, totals in series:
            fig.add_trace(go.Bar(x=[escape(v) for v in totals["name"]],
                                 y=totals["exposed_median_ns"].to_numpy(dtype=float) / 1e6,
                                 name=escape(device_label(d.rank, d.device)), marker={"color": rank_color(i)},
                                 hovertemplate="%{x}: %{y:.4f} ms<extra>%{fullData.name}</extra>"))
    else:
        table = pd.concat([t[["layer", "name", "exposed_median_ns"]] for _, _, t in series])
        by = table.groupby("layer", sort=True)
        mid = by["exposed_median_ns"].median().to_numpy(dtype=float) / 1e6
        lo = by["exposed_median_ns"].min().to_numpy(dtype=float) / 1e6
        hi = by["exposed_median_ns"].max().to_numpy(dtype=float) / 1e6
        fig.add_trace(go.Bar(
            x=[escape(v) for v in by["name"].first()], y=mid, name=f"median of {len(series)} devices",
            marker={"color": rank_color(0)}, customdata=np.stack([lo, hi], axis=1),
            error_y={"type": "data", "symmetric": False, "array": hi - mid, "arrayminus": mid - lo,
                     "color": "#616e7c", "thickness": 1},
            hovertemplate="%{x}: %{y:.4f} ms (devices %{customdata[0]:.4f}–%{customdata[1]:.4f} ms)<extra></extra>"))
    fig.update_layout(**_BASE_LAYOUT, barmode="group", height=340,
                      xaxis={"title": {"text": "layer"}, "type": "category"},
                      yaxis={"title": {"text": "median exposed comm, ms"}})
    fig.update_layout(margin={"l": 60})
    return fig


MAX_POINTS = 4000  # collective instances drawn per device before binning


def binned_max(values: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray, int]:
    """(first index, max value, instances per point) of ``values`` in consecutive bins of equal size."""
    per = max(int(np.ceil(len(values) / max_points)), 1)
    starts = np.arange(0, len(values), per)
    if per == 1:
        return starts, values, 1
    return starts, np.maximum.reduceat(values, starts), per


def collective_figure(devices: Sequence[DeviceSummary], escape: Escape) -> go.Figure | None:
    """Exposed time of every collective instance in order (ms); beyond ``MAX_POINTS`` instances, the max of
    each run of consecutive instances. None without collectives."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, d in enumerate(devices):
        df = d.collectives
        exposed = column(df, "exposed_ns", "comm_exposed_ns")
        if not len(df) or exposed is None:
            continue
        x, y, per = binned_max(df[exposed].to_numpy(dtype=float) / 1e6)
        label = device_label(d.rank, d.device) + (f" (max of every {per})" if per > 1 else "")
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", marker={"size": 4, "color": rank_color(i)},
                                 name=escape(label),
                                 hovertemplate="#%{x}: %{y:.4f} ms exposed<extra>%{fullData.name}</extra>"))
    if not fig.data:
        return None
    fig.update_layout(**_BASE_LAYOUT, height=300, xaxis={"title": {"text": "collective instance (in order)"}},
                      yaxis={"title": {"text": "exposed ms"}, "rangemode": "tozero"})
    fig.update_layout(margin={"l": 60})
    return fig


def _one_two_five_edges(lo_ns: float, hi_ns: float) -> np.ndarray:
    """Bin edges in ns on the 1-2-5 sequence covering [lo, hi] (readable log-spaced bins)."""
    lo_dec = int(np.floor(np.log10(max(lo_ns, 1.0))))
    hi_dec = int(np.ceil(np.log10(max(hi_ns, 1.0)))) + 1
    edges = np.array([m * 10.0 ** e for e in range(lo_dec, hi_dec) for m in (1, 2, 5)])
    first = max(int(np.searchsorted(edges, lo_ns, side="right")) - 1, 0)
    last = int(np.searchsorted(edges, hi_ns, side="right")) + 1
    return edges[first:last]


def durations_ns(df: pd.DataFrame) -> np.ndarray:
    """Durations (ns, float) of the rows of an interval frame (``duration_ns``, else end − start)."""
    if "duration_ns" in df.columns:
        return df["duration_ns"].to_numpy(dtype=float)
    return (df["end_ns"] - df["start_ns"]).to_numpy(dtype=float)


def gap_histogram(devices: Sequence[DeviceSummary], escape: Escape) -> go.Figure | None:
    """Segments of SM idle during collectives counted in 1-2-5 duration bins per device; None when none."""
    import plotly.graph_objects as go

    durations = [(d, durations_ns(d.comm_idle_gaps_ns)) for d in devices if len(d.comm_idle_gaps_ns)]
    durations = [(d, v[v > 0]) for d, v in durations if (v > 0).any()]
    if not durations:
        return None
    every = np.concatenate([v for _, v in durations])
    edges = _one_two_five_edges(float(every.min()), float(every.max()))
    labels = [f"{fmt_round_ns(a)}–{fmt_round_ns(b)}" for a, b in itertools.pairwise(edges)]
    fig = go.Figure()
    index = {id(d): i for i, d in enumerate(devices)}
    for d, dur in durations:
        counts, _ = np.histogram(dur, bins=edges)
        total, _ = np.histogram(dur, bins=edges, weights=dur)
        fig.add_trace(go.Bar(x=labels, y=counts, customdata=total / 1e6, name=escape(device_label(d.rank, d.device)),
                             marker={"color": rank_color(index[id(d)])},
                             hovertemplate="%{x}: %{y} segments, %{customdata:.3f} ms in total"
                                           "<extra>%{fullData.name}</extra>"))
    fig.update_layout(**_BASE_LAYOUT, barmode="group", height=320,
                      xaxis={"title": {"text": "segment duration"}, "type": "category"},
                      yaxis={"title": {"text": "segments"}})
    fig.update_layout(margin={"l": 60})
    return fig


def cross_rank_figure(cross: CrossRankSummary) -> go.Figure | None:
    """Bars of wait/skew time per rank, the straggler in its own colour; None without matched collectives."""
    import plotly.graph_objects as go

    if not cross.wait_ns_by_rank:
        return None
    ranks = sorted(cross.wait_ns_by_rank)
    colors = [rank_color(i) for i in range(len(ranks))]
    names = [f"rank {r}" + (" (straggler)" if r == cross.straggler_rank else "") for r in ranks]
    outline = {"color": "#222", "width": [2 if r == cross.straggler_rank else 0 for r in ranks]}
    fig = go.Figure(go.Bar(x=names, y=[cross.wait_ns_by_rank[r] / 1e6 for r in ranks],
                           marker={"color": colors, "line": outline},
                           hovertemplate="%{x}: %{y:.3f} ms waiting<extra></extra>"))
    fig.update_layout(**_BASE_LAYOUT, height=300, yaxis={"title": {"text": "wait/skew ms over the window"}},
                      xaxis={"type": "category"}, showlegend=False)
    fig.update_layout(margin={"l": 60})
    return fig


#: GPU metrics drawn as a chart (by name prefix), in preference order; the first present is drawn.
CHART_METRICS = ("SMs Active", "SM Issue", "Tensor Active")


def metric_figure(df: pd.DataFrame | None, escape: Escape) -> go.Figure | None:
    """Mean of the SM-activity metrics per phase (what the GPU ran), one bar group per device and metric."""
    import plotly.graph_objects as go

    if df is None or not len(df) or not {"device", "metric", "phase", "mean"} <= set(df.columns):
        return None
    names = df["metric"].astype(str)
    wanted = names.map(lambda n: any(n.startswith(p) and "%" in n for p in CHART_METRICS))
    part = df[wanted.to_numpy()]
    if not len(part):
        return None
    fig = go.Figure()
    for (device, metric), rows in part.groupby(["device", "metric"], sort=True):
        rows = rows[rows["phase"].astype(str) != "all"]
        fig.add_trace(go.Bar(x=[escape(str(p)) for p in rows["phase"]], y=rows["mean"].to_numpy(dtype=float),
                             name=escape(f"GPU {device}: {metric}"),
                             hovertemplate="%{x}: %{y:.1f}<extra>%{fullData.name}</extra>"))
    fig.update_layout(**_BASE_LAYOUT, barmode="group", height=340,
                      xaxis={"title": {"text": "what the GPU was running"}, "type": "category"},
                      yaxis={"title": {"text": "mean, % of peak"}})
    fig.update_layout(margin={"l": 60})
    return fig
