"""Compact HTML for notebooks (``_repr_html_``): a few tables of a result, escaped, no scripts or styles to load.

Any result object gets a notebook view with ``def _repr_html_(self): return html_card(title, [html_table(...)])``
(``Summary`` below; a diff result does the same with its own rows).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..model.units import fmt_ns, fmt_pct

if TYPE_CHECKING:
    from ..analysis.results import Summary

MAX_ROWS = 12  # rows per table in a notebook view; the DataFrames have them all


def html_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, numeric: Sequence[bool] = (),
               caption: str | None = None, max_rows: int = MAX_ROWS) -> str:
    """An escaped HTML table (numeric columns right-aligned), at most ``max_rows`` rows plus a "more" line."""
    flags = [*numeric, *([False] * len(columns))]
    align = ['style="text-align:right"' if flags[i] else 'style="text-align:left"' for i in range(len(columns))]
    head = "".join(f"<th {align[i]}>{html.escape(str(c))}</th>" for i, c in enumerate(columns))
    body = "".join("<tr>" + "".join(f"<td {align[i]}>{html.escape(str(v))}</td>" for i, v in enumerate(row))
                   + "</tr>" for row in rows[:max_rows])
    more = f"<tr><td colspan={len(columns)}>… {len(rows) - max_rows} more</td></tr>" if len(rows) > max_rows else ""
    cap = f"<caption style=\"text-align:left\"><b>{html.escape(caption)}</b></caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}{more}</tbody></table>"


def html_card(title: str, parts: Sequence[str], lines: Sequence[str] = ()) -> str:
    """A titled block of tables (already HTML) and text lines (escaped here)."""
    text = "".join(f"<div>{html.escape(line)}</div>" for line in lines)
    return f"<div><div><b>{html.escape(title)}</b></div>{''.join(parts)}{text}</div>"


def summary_html(summary: Summary) -> str:
    """The notebook view of a Summary: devices, the largest findings, the what-if and cross-rank in one line."""
    devices = [[f"{d.rank}", f"{d.device}", d.name or "—", fmt_ns(d.span_ns), fmt_ns(d.busy_ns), fmt_ns(d.comm_ns),
                fmt_ns(d.comm_exposed_ns), fmt_pct(d.overlap_pct), f"{d.steps}", fmt_ns(d.step_ns_median),
                fmt_ns(d.comm_exposed_per_step_ns)] for d in summary.devices]
    tables = [html_table(["rank", "device", "name", "span", "busy", "comm", "exposed", "overlap", "steps",
                          "step median", "exposed/step"], devices, numeric=[True, True, False] + [True] * 8,
                         caption="devices (.devices)")]
    findings = sorted(summary.findings, key=lambda f: -(f.impact_ns_per_step or 0))
    if findings:
        tables.append(html_table(["impact/step", "id", "title"],
                                 [[fmt_ns(f.impact_ns_per_step) if f.impact_ns_per_step is not None else "—", f.id,
                                   f.title] for f in findings], numeric=[True, False, False],
                                 caption="findings (.findings)", max_rows=5))
    wi, cr = summary.what_if, summary.cross_rank
    lines = [f"if communication were free: {fmt_ns(wi.comm_free_step_saving_ns)} per step (basis {wi.basis})"]
    if cr is not None:
        lines.append(f"cross-rank: {cr.collectives_matched} collectives matched, straggler "
                     f"{'—' if cr.straggler_rank is None else f'rank {cr.straggler_rank}'}")
    if summary.warnings:
        lines.append(f"{len(summary.warnings)} warning(s) (.warnings)")
    names = ", ".join(t.path.rsplit("/", 1)[-1] for t in summary.traces)
    return html_card(f"traceanalyzer Summary of {names}", tables, lines)
