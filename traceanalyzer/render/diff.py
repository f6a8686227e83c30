"""``diff`` for people: the terminal tables and the single-file HTML page (no script; an SVG waterfall).

The page uses the report's stylesheet, autoescapes every trace string (jinja2) and allows no script and no
network access (Content-Security-Policy ``default-src 'none'``), so it opens offline as an attachment.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from ..model.units import fmt_ms
from .formatting import fmt_ns

if TYPE_CHECKING:
    from rich.console import Console

    from ..analysis.diff.compare import DiffResult, DiffSide

TOP_KERNELS = 15  # kernel rows shown (terminal and page); the JSON has them all
NAME_WIDTH = 70  # kernel name characters shown in the terminal
INCREASE, DECREASE, TOTAL = "#b2182b", "#2a9d8f", "#52606d"


def _short(name: Any, width: int = NAME_WIDTH) -> str:
    text = "—" if name is None else str(name)
    return text if len(text) <= width else text[: width - 1] + "…"


def headline(result: DiffResult) -> str:
    """One line: verdict, the two step times, the change and the noise floor."""
    s = result.step
    if s["delta_ns"] is None:
        return f"{s['verdict']}: step time not measured on both sides"
    return (f"{s['verdict']}: {fmt_ms(s['before_ns'])} → {fmt_ms(s['after_ns'])} ms/step, "
            f"{fmt_ms(s['delta_ns'], signed=True)} ms ({s['delta_pct']:+.1f} %), noise ±{fmt_ms(s['noise_ns'])} ms")


def side_rows(result: DiffResult) -> list[tuple[str, str, str]]:
    """(label, before, after) facts about the two runs, shown side by side."""
    def facts(side: DiffSide) -> dict[str, str]:
        traces = side.summary.traces
        return {"traces": ", ".join(Path(t.path).name for t in traces),
                "format": ", ".join(sorted({t.format for t in traces})),
                "ranks (world size)": str(side.world_size),
                "devices": str(len(side.summary.devices)),
                "steps (all devices)": str(side.steps),
                "step source": f"{side.step_source} ({side.step_confidence} confidence)",
                "layers per step": "—" if side.layers_per_step is None else str(side.layers_per_step),
                "median step": f"{fmt_ms(side.step_ns)} ms", "step-to-step spread": f"±{fmt_ms(side.spread_ns)} ms"}

    b, a = facts(result.before), facts(result.after)
    return [(k, b[k], a[k]) for k in b]


def kernel_rows(result: DiffResult, limit: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The largest kernel changes (per device-step), with display names."""
    rows: list[dict[str, Any]] = []
    for r in _records(result.kernels.head(limit)):
        names = [str(n) for n in (r["before_name"], r["after_name"]) if isinstance(n, str)]
        label = names[0] if len(set(names)) == 1 else " → ".join(names)
        rows.append({**r, "label": label})
    return rows


def _records(frame: Any) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict(orient="records")]


# -- terminal -------------------------------------------------------------------------------------------------------
def print_diff(result: DiffResult, console: Console | None = None) -> None:
    """``traceanalyzer diff``: headline, sides, attribution, kernels, collectives, findings delta."""
    from .terminal import _table, _text, make_console

    con = console or make_console()
    con.print(_text(f"traceanalyzer diff — {headline(result)}"), style="bold")
    for reason in result.reasons:
        con.print(_text(f"  not comparable: {reason}"), style="yellow")
    sides = _table(None, ["", "before", "after"])
    for label, b, a in side_rows(result):
        sides.add_row(label, _text(b), _text(a))
    con.print(sides)
    attribution = _table("Attribution (ms/step; Δ adds up to the step Δ)",
                         ["component", "before", "after", "Δ"], [False, True, True, True])
    for row in result.attribution:
        attribution.add_row(row["component"], fmt_ms(row["before_ns"]), fmt_ms(row["after_ns"]),
                            fmt_ms(row["delta_ns"], signed=True))
    s = result.step
    attribution.add_row("step", fmt_ms(s["before_ns"]), fmt_ms(s["after_ns"]), fmt_ms(s["delta_ns"], signed=True),
                        style="bold")
    con.print(attribution)
    if result.moe:
        moe = _table("MoE stages (ms/step, exclusive, the step of median MoE time; Δ adds up to the MoE Δ)",
                     ["stage", "before", "after", "Δ"], [False, True, True, True])
        for row in result.moe:
            moe.add_row(row["stage"], fmt_ms(row["before_ns"]), fmt_ms(row["after_ns"]),
                        fmt_ms(row["delta_ns"], signed=True), style="bold" if row["stage"] == "moe" else None)
        con.print(moe)
    overlap = "—" if result.kernel_overlap is None else f"{100 * result.kernel_overlap:.0f} %"
    kernels = _table(f"Largest kernel changes (per device-step; {overlap} of kernel time matched)",
                     ["match", "bucket", "count", "before", "after", "Δ", "kernel"], [False, False, True, True, True,
                                                                                     True, False])
    for r in kernel_rows(result):
        kernels.add_row(r["match"], _text(r["bucket"]), f"{r['before_count']:.4g}→{r['after_count']:.4g}",
                        fmt_ms(r["before_ns"]), fmt_ms(r["after_ns"]), fmt_ms(r["delta_ns"], signed=True),
                        _text(_short(r["label"])))
    con.print(kernels)
    if len(result.collectives):
        con.print(_collective_table(result))
    if result.findings:
        findings = _table("Findings", ["status", "before", "after", "Δ", "finding"], [False, True, True, True, False])
        for f in result.findings:
            findings.add_row(f["status"], fmt_ms(f["before_impact_ns"]), fmt_ms(f["after_impact_ns"]),
                             fmt_ms(f["delta_impact_ns"], signed=True), _text(f["title_after"] or f["title_before"]))
        con.print(findings)
    for warning in result.warnings:
        con.print(_text(f"warning: {warning}"), style="yellow")


def _collective_table(result: DiffResult) -> Any:
    from .terminal import _table, _text

    table = _table("Collectives (per device-step)", ["kind", "count", "MB", "time ms", "transfer ms", "busbw GB/s"],
                   [False, True, True, True, True, True])
    for r in collective_rows(result):
        table.add_row(_text(r["kind"]), r["count"], r["mb"], r["time"], r["transfer"], r["busbw"])
    return table


def collective_rows(result: DiffResult) -> list[dict[str, str]]:
    """Per collective kind: before → after of count, MB, time, transfer and bus bandwidth."""
    def pair(row: dict[str, Any], key: str, fmt: Any) -> str:
        return f"{fmt(row['before_' + key])} → {fmt(row['after_' + key])}"

    def num(v: Any, scale: float = 1.0, digits: int = 3) -> str:
        return "—" if v is None or v != v else f"{v / scale:.{digits}f}"

    out = []
    for r in _records(result.collectives):
        out.append({"kind": str(r["kind"]), "count": pair(r, "count", lambda v: num(v, 1, 1)),
                    "mb": pair(r, "bytes", lambda v: num(v, 1e6, 2)),
                    "time": pair(r, "duration_ns", lambda v: num(v, 1e6)),
                    "transfer": pair(r, "transfer_ns", lambda v: num(v, 1e6)),
                    "busbw": pair(r, "busbw_gbps", lambda v: num(v, 1, 1))})
    return out


# -- HTML -----------------------------------------------------------------------------------------------------------
def waterfall_svg(result: DiffResult, width: int = 760, row: int = 22) -> Markup:
    """The attribution as a horizontal waterfall: the before step, each component's change, the after step."""
    from markupsafe import escape

    s = result.step
    if s["before_ns"] is None or s["after_ns"] is None:
        return Markup('<p class="empty">no step on one side: nothing to attribute</p>')
    bars: list[tuple[str, float, float, str, str]] = [("before step", 0, s["before_ns"], TOTAL,
                                                       fmt_ms(s["before_ns"]))]
    level = float(s["before_ns"])
    for a in result.attribution:
        if a["delta_ns"]:
            bars.append((a["component"], level, level + a["delta_ns"], INCREASE if a["delta_ns"] > 0 else DECREASE,
                         fmt_ms(a["delta_ns"], signed=True)))
            level += a["delta_ns"]
    bars.append(("after step", 0, s["after_ns"], TOTAL, fmt_ms(s["after_ns"])))
    top = max(max(lo, hi) for _, lo, hi, _, _ in bars) or 1.0
    label_w, value_w = 190, 80
    scale = (width - label_w - value_w) / top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{row * len(bars) + 8}" '
             'role="img" aria-label="attribution waterfall" font-size="12" font-family="system-ui, sans-serif">']
    for i, (label, lo, hi, color, value) in enumerate(bars):
        y = 4 + i * row
        x0, x1 = label_w + scale * min(lo, hi), label_w + scale * max(lo, hi)
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{escape(label)}</text>'
                     f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 1):.1f}" height="{row - 6}" '
                     f'fill="{color}"/><text x="{x1 + 4:.1f}" y="{y + 14}">{escape(value)} ms</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def render_diff_html(result: DiffResult, generated_at: datetime | None = None) -> str:
    """The diff page as text (templates/diff.html with the report's stylesheet inlined)."""
    from .._version import __version__
    from .html import _asset, _environment

    template = _environment().get_template("diff.html")
    return template.render(
        version=__version__, generated=(generated_at or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC"),
        headline=headline(result), verdict=result.step["verdict"], reasons=result.reasons,
        sides=side_rows(result), attribution=result.attribution, step=result.step, moe=result.moe,
        waterfall=waterfall_svg(result), kernels=kernel_rows(result), collectives=collective_rows(result),
        findings=result.findings, warnings=result.warnings, ms=fmt_ms, ns=fmt_ns,
        overlap=None if result.kernel_overlap is None else f"{100 * result.kernel_overlap:.0f} %",
        css=Markup(_asset("report.css")))

