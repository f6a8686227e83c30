"""The single-file HTML report: a jinja2 template (autoescape on) with plotly figures embedded as JSON.

Safety: every trace string reaches the page either through jinja2 autoescaping or inside a
``<script type="application/json">`` block whose ``<``, ``>``, ``&``, U+2028 and U+2029 are written as
``\\uXXXX`` escapes, so no name can close the script element. A Content-Security-Policy allows only the page's
own two scripts (by hash) and no network access (``--cdn``: the plotly CDN script as well).
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from markupsafe import Markup

from . import figures, sections
from . import moe as moe_section
from .formatting import fmt_ns

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from ..analysis.results import DeviceSummary, Summary
    from ..analysis.what_if.simulate import WhatIfResult
    from ..model.trace import Trace

MAX_TIMELINES = 16  # devices drawn on the timeline; the rest are listed as omitted
TOTAL_RECTS = 20_000  # timeline rectangles of the whole page, shared by the devices drawn


def json_for_script(text: str) -> str:
    """JSON text made safe inside ``<script type="application/json">`` (still valid JSON)."""
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def plot_text(text: str) -> str:
    """A trace string made literal for plotly labels (plotly interprets a few HTML tags and entities)."""
    return html.escape(str(text), quote=True)


@dataclass(frozen=True)
class Plot:
    """One figure placed in the page: a div and the JSON block it is drawn from."""

    id: str
    json: Markup
    caption: str = ""


class _Figures:
    """Collects figures in page order and hands out ids."""

    def __init__(self) -> None:
        self.plots: list[Plot] = []

    def add(self, fig: go.Figure | None, caption: str = "") -> Plot | None:
        if fig is None:
            return None
        fig.update_layout(template="plotly_white", autosize=True)
        unknown = {t.type for t in fig.data} - BUNDLE_TRACES
        if unknown:  # the inlined bundle could not draw it
            raise RuntimeError(f"figure trace type(s) {sorted(unknown)} are not in {PLOTLY_BUNDLE}")
        plot = Plot(f"fig{len(self.plots)}", Markup(json_for_script(fig.to_json())), caption)
        self.plots.append(plot)
        return plot


#: The plotly.js bundle inlined in the page: plotly's own "basic" partial bundle (bar, scatter and pie traces;
#: npm plotly.js-basic-dist-min, MIT, templates/plotly-basic.LICENSE), 1.2 MB where the full bundle is 4.8 MB.
PLOTLY_BUNDLE = "plotly-basic.min.js"
#: The trace types that bundle draws: every figure of the report uses only these (checked as figures are added).
BUNDLE_TRACES = frozenset({"bar", "scatter", "pie"})


@lru_cache(maxsize=1)
def _plotly_js() -> str:
    js = _asset(PLOTLY_BUNDLE)
    if "</script" in js.lower():  # never expected; inlining it would break the page
        raise RuntimeError("plotly.js contains '</script' and cannot be inlined")
    return js


@lru_cache(maxsize=1)
def _plotly_cdn_hash() -> str:
    """The integrity hash of the full plotly.js that ``--cdn`` loads (the bundle of the installed plotly)."""
    from plotly.offline import get_plotlyjs

    return _csp_hash(get_plotlyjs())


def _plotly_cdn_url() -> str:
    from plotly.offline.offline import get_plotlyjs_version

    return f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"


def _asset(name: str) -> str:
    return (Path(__file__).resolve().parent.parent / "templates" / name).read_text(encoding="utf-8")


def _csp_hash(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("traceanalyzer", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["ns"] = fmt_ns
    return env


#: A device whose representative step ran the same activities in the same order as a drawn one, with a step at
#: most this much longer or shorter, is listed beside it instead of drawn again.
SAME_STEP_SHARE = 0.05


@dataclass
class _Drawn:
    device: DeviceSummary
    trace: Trace
    window: Any
    signature: tuple[str, int]
    like: list[dict[str, Any]]


def _timelines(summary: Summary, traces: Sequence[Trace], plots: _Figures) -> tuple[list[dict[str, Any]],
                                                                                     dict[str, Any] | None]:
    """The timeline of each device's representative step — one per group of devices that ran the same activities
    in the same order over a step of about the same length (:data:`SAME_STEP_SHARE`), the others listed under it —
    and the zoom onto one layer of the first drawn device (:func:`timeline.layer_window`)."""
    from .timeline import MAX_RECTS, layer_window, representative_window, timeline_figure, window_signature

    by_path = {t.path: t for t in traces}
    groups: list[_Drawn] = []
    for ds in summary.devices[:MAX_TIMELINES]:
        trace = by_path.get(ds.trace) or next(
            (t for t in traces if ds.rank in t.ranks and ds.device in {d.device for d in t.devices}), None)
        if trace is None:
            continue
        window = representative_window(ds)
        signature = window_signature(trace, ds, window)
        length = window.end_ns - window.start_ns
        like = next((g for g in groups if g.signature == signature and
                     abs(length - (g.window.end_ns - g.window.start_ns)) <=
                     SAME_STEP_SHARE * (g.window.end_ns - g.window.start_ns)), None)
        if like is None:
            groups.append(_Drawn(ds, trace, window, signature, []))
            continue
        like.like.append({"device": sections.device_title(ds), "window": window.label, "window_ns": length,
                          "exposed": _exposed_in(ds, window)})
    out: list[dict[str, Any]] = []
    budget = max(min(MAX_RECTS, TOTAL_RECTS // max(len(groups), 1)), 1000)  # keeps the page light with many GPUs
    for g in groups:
        fig, facts = timeline_figure(g.trace, g.device, escape=plot_text, max_rects=budget, window=g.window)
        out.append({"label": sections.device_title(g.device), "plot": plots.add(fig), "like": g.like,
                    "exposed": _exposed_in(g.device, g.window), **facts})
    zoom = None
    if groups:
        first = groups[0]
        layer = layer_window(first.device, first.window)
        if layer is not None:
            fig, facts = timeline_figure(first.trace, first.device, escape=plot_text, max_rects=MAX_RECTS,
                                         window=layer)
            zoom = {"label": sections.device_title(first.device), "plot": plots.add(fig),
                    "exposed": _exposed_in(first.device, layer), **facts}
    return out, zoom


def _exposed_in(ds: DeviceSummary, window: Any) -> int:
    """Exposed communication (ns) of the device inside ``window``."""
    gaps = ds.comm_idle_gaps_ns
    if not len(gaps) or window.end_ns <= window.start_ns:
        return 0
    s = np.maximum(gaps["start_ns"].to_numpy(np.int64), window.start_ns)
    e = np.minimum(gaps["end_ns"].to_numpy(np.int64), window.end_ns)
    return int(np.maximum(e - s, 0).sum())


def _marked(section: dict[str, Any]) -> dict[str, Any]:
    """``section`` with its ``body`` (HTML escaped where it was built) marked safe for the template."""
    return {**section, "body": Markup(section["body"]) if section.get("body") else None}


def render_html(summary: Summary, traces: Sequence[Trace] = (), *, cdn: bool = False,
                generated_at: datetime | None = None, critical: WhatIfResult | None = None) -> str:
    """The whole report page as text. ``traces`` (the analysed Traces) feed the timeline; without them it is left
    out. ``critical``: the no-change replay of the run (``pipeline.summarize.replay_run``), whose median step's
    critical path gets a section; without it the section says why. ``cdn`` loads plotly from its CDN instead of
    inlining it."""
    from .._version import __version__

    plots = _Figures()
    devices = summary.devices
    context: dict[str, Any] = {
        "version": __version__,
        "generated": (generated_at or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC"),
        "header": sections.header(summary),
        "headline": sections.headline(summary),
        "findings": sections.findings(summary),
        "platform_lines": sections.platform_lines(summary),
        "causes": sections.cause_rows(summary),
        "combined": sections.combined_line(summary),
        "breakdown_plot": plots.add(figures.breakdown_figure(devices, plot_text)) if devices else None,
        "comm_plot": plots.add(figures.comm_figure(devices, plot_text)) if devices else None,
        "not_applicable": sections.not_applicable(summary),
        "device_table": sections.device_rows(summary),
        "step_plot": plots.add(figures.step_figure(devices, plot_text)),
        **dict(zip(("timelines", "layer_zoom"), _timelines(summary, traces, plots), strict=True)),
        "timelines_omitted": max(len(devices) - MAX_TIMELINES, 0),
        "same_step_pct": f"{100 * SAME_STEP_SHARE:g}",
        "layer_plot": plots.add(figures.layer_figure(devices, plot_text)),
        "layer_table": sections.layer_rows(devices),
        "collective_plot": plots.add(figures.collective_figure(devices, plot_text)),
        "collective_table": sections.collective_rows(devices, summary.cross_rank),
        "gap_plot": plots.add(figures.gap_histogram(devices, plot_text)),
        "gap_stats": sections.gap_rows(devices),
        "cross_rank": sections.cross_rank(summary.cross_rank),
        "cross_plot": plots.add(figures.cross_rank_figure(summary.cross_rank)) if summary.cross_rank else None,
        "top_kernels": sections.top_kernel_groups(devices),
        "gpu_metrics": sections.gpu_metric_rows(summary.gpu_metrics),
        "metrics_plot": plots.add(figures.metric_figure(summary.gpu_metrics, plot_text)),
        "power": sections.power_rows(summary.power),
        "notes": sections.method_notes(summary),
        "critical": _marked(sections.critical_path(critical, traces)),
        **moe_section.html_context(summary, plots.add, plot_text),
    }
    boot = _asset("report.js")
    plotly_js = None if cdn else _plotly_js()
    plotly_hash = _plotly_cdn_hash() if cdn else _csp_hash(_plotly_js())  # the CDN's bytes: its integrity hash
    script_src = [_csp_hash(boot)] + ([_plotly_cdn_url()] if cdn else [plotly_hash])
    csp = ("default-src 'none'; script-src " + " ".join(script_src) +
           "; style-src 'unsafe-inline'; img-src data: blob:; font-src data:; connect-src 'none'")
    template = _environment().get_template("report.html")
    return template.render(**context, plots=plots.plots, csp=csp, css=Markup(_asset("report.css")),
                           boot_js=Markup(boot), plotly_js=Markup(plotly_js) if plotly_js else None,
                           plotly_cdn=_plotly_cdn_url() if cdn else None, plotly_sri=plotly_hash.strip("'"))
