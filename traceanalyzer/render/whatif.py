"""The ``whatif`` command's terminal text: the critical path of the median step, what limits it, the no-change
replay's error and each change's simulated effect with its assumptions (results only; no analysis here)."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass
class _Rect:
    """Consecutive stretches of the path on one rank drawn as one rectangle: those of one colour, and runs of
    stretches narrower than a pixel (coloured by the kind with most time), so the drawing has at most about two
    rectangles per pixel of width however long the path (the splits below it stay exact)."""

    rank: int
    start_ns: int
    end_ns: int
    color: str
    parts: dict[str, int]  # "category · bucket" → time
    parts_label: str  # the one stretch's own label (edge included) while count is 1
    count: int = 1


def _path_rects(path: StepPath, scale: float) -> list[_Rect]:
    from ..model.buckets import BUCKET_COLORS

    rects: list[_Rect] = []
    colors: dict[str, str] = {}
    for s in path.segments:
        color = BUCKET_COLORS.get(s.bucket, "#1f77b4") if s.category == "compute" else \
            _KIND_COLORS.get(s.category, "#cccccc")
        key, length = f"{s.category} · {s.bucket}", s.end_ns - s.start_ns
        colors[key] = color
        last = rects[-1] if rects else None
        narrow = length * scale < 1 and last is not None and (last.end_ns - last.start_ns) * scale < 1
        if last is not None and last.rank == s.rank and (last.color == color or narrow):
            last.end_ns = max(last.end_ns, s.end_ns)
            last.parts[key] = last.parts.get(key, 0) + length
            last.count += 1
            last.color = colors[max(last.parts, key=lambda k: last.parts[k])]
            continue
        rects.append(_Rect(s.rank, s.start_ns, s.end_ns, color, {key: length},
                           f"{key} · {s.edge} · {fmt_brief_ns(length)}"))
    return rects


def whatif_html(result: WhatIfResult) -> str:
    """One offline HTML page (no script): :func:`critical_path_html` with the changes and the assumptions."""
    from html import escape

    parts = ["<!doctype html><meta charset='utf-8'><title>traceanalyzer whatif</title>"
             "<style>body{font:13px sans-serif;margin:20px}td,th{padding:2px 8px;text-align:right}"
             "th:first-child,td:first-child{text-align:left}</style><h1>Critical path</h1>"]
    body = critical_path_html(result)
    if body is None:
        return parts[0] + "<p>No step with GPU activity.</p>"
    parts.append(body)
    if result.changes:
        parts.append("<h2>Changes</h2><ul>" + "".join(f"<li>{escape(c)}</li>" for c in result.changes) + "</ul>"
                     f"<p>Simulated step: {escape(fmt_brief_ns(result.baseline_step_ns))} → "
                     f"{escape(fmt_brief_ns(result.simulated_step_ns))}</p>")
    parts.append("<h2>Assumptions</h2><ul>" + "".join(f"<li>{escape(a)}</li>" for a in result.assumptions) + "</ul>")
    return "\n".join(parts)


def critical_path_html(result: WhatIfResult, heading: str = "h2") -> str | None:
    """The critical path of the median step as HTML without script (the ``whatif --html`` page and the report's
    section): a line naming the step and what limits it, the path drawn over the step's timeline (one lane per
    rank, each stretch coloured by its kind, compute by bucket) and its splits by kind, bucket, rank and edge,
    each adding up to the step. Every trace string is escaped; None without a step."""
    from html import escape

    from ..model.buckets import BUCKET_COLORS

    path = median_path(result)
    if path is None or not path.segments:
        return None
    t0, t1 = path.segments[0].start_ns, path.segments[-1].end_ns
    ranks = sorted({s.rank for s in path.segments})
    scale = (_WIDTH_PX - _LEFT_PX) / max(t1 - t0, 1)
    height = _LANE_PX * len(ranks) + 30
    parts = [f"<p>Median step: rank {path.rank}, step {path.step}, {escape(fmt_brief_ns(path.step_ns))}. "
             f"What limits it: {escape(path.limiter())}.</p>"]
    svg = [f"<svg width='{_WIDTH_PX}' height='{height}' viewBox='0 0 {_WIDTH_PX} {height}' role='img' "
           "style='max-width:100%;height:auto'>"]
    for i, r in enumerate(ranks):
        svg.append(f"<text x='0' y='{i * _LANE_PX + 17}'>rank {r}</text>")
    lanes = {r: i for i, r in enumerate(ranks)}
    for rect in _path_rects(path, scale):
        lane = lanes[rect.rank]
        top = sorted(rect.parts.items(), key=lambda kv: -kv[1])
        label = rect.parts_label if len(top) == 1 and rect.count == 1 else \
            f"{rect.count} stretches, {fmt_brief_ns(rect.end_ns - rect.start_ns)}: " + ", ".join(
                f"{k} {fmt_brief_ns(v)}" for k, v in top[:3]) + (" …" if len(top) > 3 else "")
        x = _LEFT_PX + (rect.start_ns - t0) * scale
        w = max((rect.end_ns - rect.start_ns) * scale, 0.5)
        svg.append(f"<rect x='{x:.2f}' y='{lane * _LANE_PX + 4}' width='{w:.2f}' height='{_LANE_PX - 8}' "
                   f"fill='{rect.color}'><title>{escape(label)}</title></rect>")
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
        parts.append(f"<{heading}>{title}</{heading}><table><tr><th></th><th>time</th><th>share</th></tr>{rows}"
                     "</table>")
    return "\n".join(parts)
