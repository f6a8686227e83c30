"""The MoE section of the terminal summary and the HTML report (docs/MOE.md): per device the MoE time per step split
by stage, per layer the stacked stages, and a rank × layer heat map of expert time."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..model.buckets import MOE_STAGE_COLORS, MOE_STAGES
from .formatting import device_label, fmt_ns, fmt_pct, pct_of

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from ..analysis.moe import DeviceMoe, MoeSummary
    from ..analysis.results import Summary

Escape = Callable[[str], str]
MAX_HEAT_RANKS = 256  # rows of the heat map; more ranks are left out (the note says how many)


def _moe(summary: Summary) -> MoeSummary | None:
    moe = summary.moe
    return moe if moe is not None and getattr(moe, "devices", None) else None


def device_columns(moe: MoeSummary) -> list[str]:
    """The columns of :func:`device_rows`: the stages some device has, the precisions of its expert GEMMs, and
    dispatch / combine exposure when a device has expert-parallel communication."""
    medians = [d.step_median() for d in moe.devices]
    stages = [s for s in MOE_STAGES if any(m.get(f"{s}_ns") for m in medians)]
    precisions = sorted({c[len("expert_"):-3] for m in medians for c, v in m.items()
                         if c.startswith("expert_") and c not in ("expert_ns", "expert_gemm_ns")
                         and not c.endswith("exclusive_ns") and v})
    comm = any(m.get("dispatch_comm_ns") or m.get("combine_comm_ns") for m in medians)
    return ["device", "MoE layers", "MoE/step", *stages, *[f"expert {p}" for p in precisions],
            *(["dispatch exposed", "combine exposed"] if comm else [])]


def device_rows(summary: Summary) -> tuple[list[str], list[list[str]]] | None:
    """Per device, its representative step (``DeviceMoe.step_median``): MoE layers, MoE time and each stage's
    exclusive share of it, expert GEMM time by precision, exposed dispatch / combine; None without MoE work."""
    moe = _moe(summary)
    if moe is None:
        return None
    cols = device_columns(moe)
    rows = []
    for d in moe.devices:
        m = d.step_median()
        total = m.get("moe_ns", 0)
        row = [device_label(d.rank, d.device), str(m.get("layers", 0)), fmt_ns(total)]
        for c in cols[3:]:
            if c.startswith("expert "):
                row.append(fmt_ns(m.get(f"expert_{c[7:]}_ns", 0)))
            elif c.endswith(" exposed"):
                stage = c.split()[0]
                row.append(f"{fmt_ns(m.get(f'{stage}_exposed_ns', 0))} of {fmt_ns(m.get(f'{stage}_comm_ns', 0))}")
            else:
                part = m.get(f"{c}_exclusive_ns", 0)
                row.append(f"{fmt_ns(part)} {fmt_pct(pct_of(part, total), 0)}")
        rows.append(row)
    return cols, rows


def source_lines(summary: Summary) -> list[str]:
    """How the MoE layers and stages were found, one line per distinct answer."""
    moe = _moe(summary)
    if moe is None:
        return []
    groups: dict[str, list[str]] = {}
    for d in moe.devices:
        src = d.stage_sources
        streams = (f"; dispatch / combine on stream {', '.join(map(str, d.comm_streams))}, experts on "
                   f"{', '.join(map(str, d.expert_streams))}") if d.comm_streams else ""
        text = (f"MoE layers: {d.layer_source if d.layer_source != 'step' else 'no layers: one MoE block per step'}; "
                f"stages by name {src.get('name', 0)}, position {src.get('position', 0)}, range "
                f"{src.get('range', 0)} kernels{streams}")
        groups.setdefault(text, []).append(device_label(d.rank, d.device))
    return [f"{t} — {', '.join(v) if len(groups) > 1 else 'all MoE devices'}" for t, v in groups.items()]


def layer_medians(d: DeviceMoe) -> pd.DataFrame:
    """Per layer number, the median over steps of each ``*_ns`` column."""
    t = d.layers
    cols = [c for c in t.columns if c.endswith("_ns") and c not in ("start_ns", "end_ns")]
    if not len(t):
        return pd.DataFrame(columns=["layer", *cols])
    return t.groupby("layer", sort=True)[cols].median().round().astype(np.int64).reset_index()


def stage_figure(summary: Summary, escape: Escape) -> go.Figure | None:
    """Stacked bars per MoE layer of the first MoE device: each stage's exclusive time (median over steps), in ms;
    the bar is the layer's MoE time."""
    import plotly.graph_objects as go

    moe = _moe(summary)
    if moe is None:
        return None
    d = moe.devices[0]
    per = layer_medians(d)
    if not len(per):
        return None
    fig = go.Figure()
    labels = [escape(f"layer {v}" if v >= 0 else "step") for v in per["layer"]]
    for s in MOE_STAGES:
        y = per[f"{s}_exclusive_ns"].to_numpy(dtype=float) / 1e6
        if not y.any():
            continue
        fig.add_trace(go.Bar(x=labels, y=y, name=s, marker={"color": MOE_STAGE_COLORS[s]},
                             hovertemplate="%{x}: %{y:.4f} ms<extra>" + s + "</extra>"))
    fig.update_layout(barmode="stack", height=340, margin={"l": 60, "r": 20, "t": 30, "b": 40},
                      title={"text": escape(f"{device_label(d.rank, d.device)}: MoE time per layer by stage")},
                      xaxis={"type": "category"}, yaxis={"title": {"text": "ms (median over steps)"}})
    return fig


def heatmap_figure(summary: Summary, escape: Escape) -> go.Figure | None:
    """Rank × layer heat map of expert-stage time (median over steps, ms), first device of each rank."""
    import plotly.graph_objects as go

    moe = _moe(summary)
    if moe is None:
        return None
    firsts: dict[int, DeviceMoe] = {}
    for d in moe.devices:
        firsts.setdefault(d.rank, d)
    ranks = sorted(firsts)[:MAX_HEAT_RANKS]
    tables = {r: layer_medians(firsts[r]) for r in ranks}
    layers = sorted({int(v) for t in tables.values() for v in t["layer"]})
    if not layers:
        return None
    # one square marker per (rank, layer): a scatter, which the report's inlined plotly bundle draws (no heatmap)
    xs, ys, values = [], [], []
    for r in ranks:
        t = tables[r]
        for layer, v in zip(t["layer"].to_numpy(), t["expert_ns"].to_numpy(dtype=float), strict=True):
            xs.append(escape(f"L{int(layer)}" if int(layer) >= 0 else "step"))
            ys.append(escape(f"rank {r}"))
            values.append(v / 1e6)
    size = max(6, min(24, 600 // max(len(layers), 1)))
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="markers",
                               marker={"symbol": "square", "size": size, "color": values, "colorscale": "Viridis",
                                       "colorbar": {"title": {"text": "ms"}}, "line": {"width": 0}},
                               hovertemplate="%{y} · %{x}: %{marker.color:.4f} ms<extra>expert</extra>"))
    fig.update_layout(height=max(220, 22 * len(ranks) + 120), margin={"l": 80, "r": 20, "t": 30, "b": 40},
                      title={"text": "Expert time per rank and layer (median over steps)"},
                      xaxis={"type": "category"}, yaxis={"type": "category", "autorange": "reversed"})
    return fig


def imbalance_rows(summary: Summary) -> dict[str, Any] | None:
    """The layers matched across ranks with their hot rank and extra expert time (HTML table)."""
    from .sections import frame_table

    moe = _moe(summary)
    if moe is None or not len(moe.imbalance):
        return None
    return frame_table(moe.imbalance)


def html_context(summary: Summary, add: Callable[[Any, str], Any], escape: Escape) -> dict[str, Any]:
    """What the report's MoE section reads: ``moe`` None without MoE work."""
    rows = device_rows(summary)
    if rows is None:
        return {"moe": None}
    cols, body = rows
    table = {"columns": cols, "rows": body, "more": [], "numeric": [False] + [True] * (len(cols) - 1),
             "omitted": 0}
    return {"moe": {"table": table, "sources": source_lines(summary),
                    "stage_plot": add(stage_figure(summary, escape), ""),
                    "heat_plot": add(heatmap_figure(summary, escape), ""),
                    "imbalance": imbalance_rows(summary)}}
