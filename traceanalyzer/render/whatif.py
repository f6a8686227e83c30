"""The ``whatif`` command's terminal text: the critical path of the median step, what limits it, the no-change
replay's error and each change's simulated effect with its assumptions (results only; no analysis here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..model.units import fmt_brief_ns, fmt_pct

if TYPE_CHECKING:
    from ..analysis.what_if.simulate import StepPath, WhatIfResult


def _parts(values: dict[str, int], total: int, label: str = "") -> str:
    items = sorted(((k, v) for k, v in values.items() if v > 0), key=lambda kv: -kv[1])
    return " · ".join(f"{label}{k} {fmt_brief_ns(v)} ({fmt_pct(100.0 * v / total, 0) if total else '—'})"
                      for k, v in items)


def median_path(result: WhatIfResult) -> StepPath | None:
    """The critical path of the run step whose traced length is the median."""
    if not result.paths:
        return None
    lengths = np.array([p.step_ns for p in result.paths])
    return result.paths[int(np.argsort(lengths, kind="stable")[len(lengths) // 2])]


def whatif_lines(result: WhatIfResult) -> list[str]:
    """Plain lines for the terminal."""
    lines: list[str] = []
    path = median_path(result)
    if path is not None:
        lines.append(f"Critical path, median step (rank {path.rank}, step {path.step}, {fmt_brief_ns(path.step_ns)}):")
        lines.append("  by kind:   " + _parts(path.by_category, path.step_ns))
        lines.append("  by bucket: " + _parts(path.by_bucket, path.step_ns))
        lines.append("  by rank:   " + _parts(path.by_rank, path.step_ns, "rank "))
        lines.append("  by edge:   " + _parts(path.by_edge, path.step_ns))
        lines.append(f"What limits the step: {path.limiter()}")
    err = result.no_change_error_pct
    lines.append(f"No-change replay: every traced step within {fmt_pct(err, 2)} ({len(result.steps)} steps; "
                 f"{result.graph['nodes']} nodes, {result.graph['edges']} edges)")
    if result.changes:
        lines.append("Changes: " + "; ".join(result.changes))
        pct = 100.0 * result.change_ns / result.baseline_step_ns if result.change_ns is not None and \
            result.baseline_step_ns else None
        if result.baseline_step_ns != result.traced_step_ns:
            lines.append(f"Baseline (traced {fmt_brief_ns(result.traced_step_ns)}, without the profiler's host cost): "
                         f"{fmt_brief_ns(result.baseline_step_ns)}")
        lines.append(f"Simulated step: {fmt_brief_ns(result.baseline_step_ns)} → "
                     f"{fmt_brief_ns(result.simulated_step_ns)}"
                     f" ({'+' if (result.change_ns or 0) > 0 else ''}{fmt_brief_ns(result.change_ns)}, "
                     f"{fmt_pct(pct)}; median over steps)"
                     + (f"; step to step {fmt_brief_ns(result.change_period_ns)}"
                        if result.change_period_ns is not None else ""))
        if result.simulated_paths:
            sim = result.simulated_paths[len(result.simulated_paths) // 2]
            lines.append(f"After the change the step is limited by: {sim.limiter()}")
    lines.append("Assumptions:")
    lines += [f"  - {a}" for a in result.assumptions]
    lines += [f"  note: {n}" for n in result.graph.get("notes", [])]
    return lines


#: colours of the critical path's kinds (the buckets' where a kind is one: compute stretches take their bucket's)
_KIND_COLORS = {"transfer": "#d62728", "wait": "#ff9896", "launch": "#bcbd22", "host_gap": "#7f7f7f"}
_LANE_PX, _WIDTH_PX, _LEFT_PX = 26, 1100, 90


def whatif_html(result: WhatIfResult) -> str:
    """One offline HTML page (no script): the critical path of the median step drawn over its timeline, one lane
    per rank, each stretch coloured by its kind (compute by bucket), with the splits beside; every trace string
    escaped."""
    from html import escape

    from ..model.buckets import BUCKET_COLORS

    path = median_path(result)
    parts = ["<!doctype html><meta charset='utf-8'><title>traceanalyzer whatif</title>"
             "<style>body{font:13px sans-serif;margin:20px}td,th{padding:2px 8px;text-align:right}"
             "th:first-child,td:first-child{text-align:left}</style><h1>Critical path</h1>"]
    if path is None or not path.segments:
        return parts[0] + "<p>No step with GPU activity.</p>"
    t0, t1 = path.segments[0].start_ns, path.segments[-1].end_ns
    ranks = sorted({s.rank for s in path.segments})
    scale = (_WIDTH_PX - _LEFT_PX) / max(t1 - t0, 1)
    height = _LANE_PX * len(ranks) + 30
    parts.append(f"<p>Median step: rank {path.rank}, step {path.step}, {escape(fmt_brief_ns(path.step_ns))}. "
                 f"What limits it: {escape(path.limiter())}.</p>")
    svg = [f"<svg width='{_WIDTH_PX}' height='{height}' role='img'>"]
    for i, r in enumerate(ranks):
        svg.append(f"<text x='0' y='{i * _LANE_PX + 17}'>rank {r}</text>")
    for s in path.segments:
        lane = ranks.index(s.rank)
        color = BUCKET_COLORS.get(s.bucket, "#1f77b4") if s.category == "compute" else \
            _KIND_COLORS.get(s.category, "#cccccc")
        x = _LEFT_PX + (s.start_ns - t0) * scale
        w = max((s.end_ns - s.start_ns) * scale, 0.5)
        tip = escape(f"{s.category} · {s.bucket} · {s.edge} · {fmt_brief_ns(s.end_ns - s.start_ns)}")
        svg.append(f"<rect x='{x:.2f}' y='{lane * _LANE_PX + 4}' width='{w:.2f}' height='{_LANE_PX - 8}' "
                   f"fill='{color}'><title>{tip}</title></rect>")
    svg.append(f"<text x='{_LEFT_PX}' y='{height - 6}'>0</text><text x='{_WIDTH_PX - 60}' y='{height - 6}'>"
               f"{escape(fmt_brief_ns(t1 - t0))}</text></svg>")
    parts.append("".join(svg))
    kinds = {**{b: BUCKET_COLORS[b] for b in sorted({s.bucket for s in path.segments if s.category == "compute"})
                if b in BUCKET_COLORS}, **_KIND_COLORS}
    parts.append("<p>" + " ".join(f"<span style='background:{c};padding:0 8px'>&nbsp;</span> {escape(k)}"
                                  for k, c in kinds.items()) + "</p>")
    for title, values in (("By kind", path.by_category), ("By bucket", path.by_bucket),
                          ("By rank", {f"rank {k}": v for k, v in path.by_rank.items()}), ("By edge", path.by_edge)):
        rows = "".join(f"<tr><td>{escape(str(k))}</td><td>{escape(fmt_brief_ns(v))}</td>"
                       f"<td>{100.0 * v / path.step_ns:.1f} %</td></tr>"
                       for k, v in sorted(values.items(), key=lambda kv: -kv[1]) if v > 0)
        parts.append(f"<h2>{title}</h2><table><tr><th></th><th>time</th><th>share</th></tr>{rows}</table>")
    if result.changes:
        parts.append("<h2>Changes</h2><ul>" + "".join(f"<li>{escape(c)}</li>" for c in result.changes) + "</ul>"
                     f"<p>Simulated step: {escape(fmt_brief_ns(result.baseline_step_ns))} → "
                     f"{escape(fmt_brief_ns(result.simulated_step_ns))}</p>")
    parts.append("<h2>Assumptions</h2><ul>" + "".join(f"<li>{escape(a)}</li>" for a in result.assumptions) + "</ul>")
    return "\n".join(parts)
