"""Rich terminal output for people (stdout): info, classification and the summary tables.

rich is imported lazily; colours only when stdout is a terminal (rich's own detection, NO_COLOR respected).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..findings.rule_ids import SLOW_RANK
from ..model.buckets import BUCKET_COLORS
from .formatting import (
    bucket_sort_key,
    device_label,
    fmt_ns,
    fmt_pct,
    issue_only_text,
    outside_steps_text,
    pct_of,
    range_text,
    runs_lines,
    step_source_text,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from ..analysis.hta_compat import HtaCompatResult
    from ..analysis.results import CrossRankSummary, DeviceSummary, Summary

PIPE_WIDTH = 140  # columns used when stdout is not a terminal (rich would otherwise wrap at 80)


def make_console(file: Any = None) -> Console:
    """A console on stdout (or ``file``): terminal width and colours on a TTY, plain and wide otherwise. Whatever
    it prints is inert (:func:`_inert_console`), so no control character or bidi control of a trace, rules file,
    option or path reaches the terminal, whichever table or line carries it; no string is read as rich markup
    (a ``[link=…]`` in a kernel name stays text)."""
    out = file or sys.stdout
    tty = hasattr(out, "isatty") and out.isatty()
    width = None if tty or os.environ.get("COLUMNS") else PIPE_WIDTH
    console: Console = _inert_console()(file=out, width=width, highlight=False, soft_wrap=False, emoji=False,
                                        markup=False, color_system="auto" if tty else None)
    return console


@functools.cache
def _inert_console() -> type[Console]:
    """rich's Console, with every text it shows passed through ``errors.printable`` (line breaks kept): each string
    before layout (``render_str``: table cells, titles, lines), and as a backstop every rendered text segment (a
    render hook), so a ``Text`` made from a raw string is inert too. rich's own control segments and styles are
    untouched."""
    from rich.console import Console, RenderHook
    from rich.measure import Measurement
    from rich.segment import Segment

    from ..model.errors import printable

    class Inert:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __rich_console__(self, console: Console, options: Any) -> Any:
            for segment in console.render(self.inner, options):
                if segment.control or not segment.text:
                    yield segment
                else:
                    yield Segment(printable(segment.text, keep="\n"), segment.style)

        def __rich_measure__(self, console: Console, options: Any) -> Measurement:
            return Measurement.get(console, options, self.inner)

    class Hook(RenderHook):
        def process_renderables(self, renderables: list[Any]) -> list[Any]:
            return [Inert(r) for r in renderables]

    class InertConsole(Console):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.push_render_hook(Hook())

        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(printable(text, keep="\n"), **kwargs)

        def on_broken_pipe(self) -> None:
            """A reader that left (``| head -1``): stdout to /dev/null, as rich does, then BrokenPipeError, which
            the CLI ends quietly with 0 (rich itself raises SystemExit(1), an exit 1 without a word)."""
            if self.quiet:
                return
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise BrokenPipeError

    return InertConsole


def _table(title: str | None, columns: Sequence[str], numeric: Iterable[bool] = ()) -> Table:
    """A table whose first and numeric columns never wrap (a number stays beside its unit); other text folds."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    flags = list(numeric) + [False] * len(columns)
    for i, (name, is_num) in enumerate(zip(columns, flags, strict=False)):
        table.add_column(name, justify="right" if is_num else "left", overflow="fold", no_wrap=i == 0 or is_num)
    return table


def _fitted(con: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
            numeric: Sequence[bool]) -> list[Any]:
    """The table, or when it is wider than the console, several tables of consecutive columns that each fit,
    every one repeating the first column (so no cell is ever split between its number and its unit). Titles are
    lines of their own above the tables, so a long title wraps as text, never into the table's width."""
    from rich.console import Group

    def build(part: list[int], heading: str | None) -> Table:
        table = _table(heading, [columns[0], *(columns[i] for i in part)], [numeric[0], *(numeric[i] for i in part)])
        for row in rows:
            table.add_row(row[0], *(row[i] for i in part))
        return table

    def width(part: list[int]) -> int:
        return con.measure(build(part, None), options=con.options.update(width=1 << 16)).maximum

    parts: list[list[int]] = [[]]
    for i in range(1, len(columns)):
        if parts[-1] and width([*parts[-1], i]) > con.width:
            parts.append([])
        parts[-1].append(i)
    if len(parts) == 1:
        return [Group(_text_styled(title, "bold"), build(parts[0], None))]
    return [Group(_text_styled(f"{title} ({n}/{len(parts)})", "bold"), build(part, None))
            for n, part in enumerate(parts, start=1)]


def _text(value: Any) -> Any:
    """Trace strings as literal rich Text (never parsed as markup; control characters and ANSI escapes in file
    and kernel names shown escaped, never acted on)."""
    from rich.text import Text

    from ..model.errors import printable

    return Text("—" if value is None else printable(value))


# -- info ---------------------------------------------------------------------------------------------------------
def print_info(path: str | Path, result: dict[str, Any], console: Console | None = None,
               err_console: Console | None = None) -> None:
    """``traceanalyzer info``: format, versions, devices and activity counts of one trace file (warnings on
    ``err_console``, stderr by default)."""
    con = console or make_console()
    con.print(_text(f"{Path(path).name}: {result['format']}"), style="bold")
    con.print(_text(f"  tool version: {result.get('tool_version') or '—'}   "
                    f"schema version: {result.get('schema_version') or '—'}"))
    ranks = result.get("ranks") or []
    if ranks:
        con.print(_text(f"  ranks: {', '.join(map(str, ranks))}"))
    if result.get("devices"):
        devices = _table("devices", ["device", "name", "rank"], [True, False, True])
        for d in result["devices"]:
            devices.add_row(str(d.get("device")), _text(d.get("name")), _text(d.get("rank")))
        con.print(devices)
    else:
        con.print(_text("  no GPU ran a kernel in this trace"), style="yellow")
    counts = _table("activity counts", ["kind", "count"], [False, True])
    for key, value in result.get("counts", {}).items():
        counts.add_row(key, f"{value:,}")
    if result.get("graph_launches"):
        counts.add_row("cuda_graph_launches", f"{result['graph_launches']:,}")
    con.print(counts)
    if result.get("files"):
        files = _table("files", ["file", "ranks", "kernels"], [False, False, True])
        for f in result["files"]:
            files.add_row(_text(Path(f["path"]).name), ", ".join(map(str, f["ranks"])) or "—",
                          f"{f['counts']['kernels']:,}")
        con.print(files)
    for hint in result.get("hints", []):
        con.print(_text(f"note: {hint}"))
    print_warnings(result.get("warnings", []), err_console)


# -- classify ----------------------------------------------------------------------------------------------------
def print_classification(results: Sequence[Any], console: Console | None = None) -> None:
    """``traceanalyzer classify``: one row per kernel name, in input order."""
    con = console or make_console()
    table = _table(None, ["bucket", "subbucket", "precision", "confidence", "rule", "name"])
    for r in results:
        d = r.to_dict() if hasattr(r, "to_dict") else dict(r)
        bucket = str(d.get("bucket"))
        table.add_row(_text_styled(bucket, BUCKET_COLORS.get(bucket)), _text(d.get("subbucket")),
                      _text(d.get("precision")), _text(d.get("confidence")), _text(d.get("rule")),
                      _text(d.get("name")))
    con.print(table)


def _text_styled(value: str, color: str | None) -> Any:
    from rich.text import Text

    return Text(value, style=color or "")


# -- summary ------------------------------------------------------------------------------------------------------
def _device_table(con: Console, summary: Summary) -> list[Any]:
    """Per device (whole window; busy % over the steps beside), without the communication columns when no device
    communicates."""
    comm = any(d.comm_ns for d in summary.devices)
    cols = ["device", "span", "busy", "idle", *(["comm", "hidden", "exposed", "overlap"] if comm else []), "steps",
            "step median", *(["exposed/step"] if comm else []), "busy in steps"]
    rows = []
    for d in summary.devices:
        in_steps = fmt_pct(d.in_steps.get("busy_pct"), 0) if d.step_source != "none" else "—"
        comm_cells = [fmt_ns(d.comm_ns), fmt_ns(d.comm_hidden_ns), fmt_ns(d.comm_exposed_ns), fmt_pct(d.overlap_pct)]
        rows.append([_text(device_label(d.rank, d.device)), fmt_ns(d.span_ns), fmt_ns(d.busy_ns), fmt_ns(d.idle_ns),
                     *(comm_cells if comm else []), str(d.steps), fmt_ns(d.step_ns_median),
                     *([fmt_ns(d.comm_exposed_per_step_ns)] if comm else []), in_steps])
    return _fitted(con, "Per device (whole window; busy % over the steps beside)", cols, rows,
                   [False] + [True] * (len(cols) - 1))


def _structure_lines(summary: Summary) -> list[str]:
    """How steps and layers were found, one line per distinct answer (devices that agree share a line)."""
    groups: dict[str, list[str]] = {}
    for d in summary.devices:
        layers = f"{d.layers_per_step} layers/step ({d.layer_source})" if d.layers_per_step else "no layers"
        groups.setdefault(f"steps: {step_source_text(d)}; {layers}", []).append(device_label(d.rank, d.device))
    lines = [f"{text} — {', '.join(devs) if len(groups) > 1 else 'all devices'}" for text, devs in groups.items()]
    outside = [(int(d.in_steps.get("outside_ns") or 0), d) for d in summary.devices
               if d.step_source != "none" and d.in_steps]
    if outside and max(o for o, _ in outside) > 0:
        _, most = max(outside, key=lambda od: od[0])
        lines.append(f"{outside_steps_text(most)}, most on {device_label(most.rank, most.device)}: warm-up, "
                     "partial passes and gaps at the ends belong to no step")
    return lines


def _bucket_table(con: Console, summary: Summary) -> list[Any]:
    """The exclusive bucket split over the steps (warm-up and gaps between steps left out) where a device has
    steps, else over the whole window; the title says which."""
    stepped = all(d.step_source != "none" and d.in_steps for d in summary.devices)

    def split(d: DeviceSummary) -> tuple[dict[str, int], int]:
        if stepped:
            return d.in_steps.get("bucket_exclusive_ns", {}), int(d.in_steps.get("busy_ns") or 0)
        return d.bucket_exclusive_ns, d.busy_ns

    buckets = sorted({b for d in summary.devices for b in split(d)[0]}, key=bucket_sort_key)
    where = "over the steps" if stepped else "whole window"
    rows = []
    for d in summary.devices:
        parts, busy = split(d)
        rows.append([_text(device_label(d.rank, d.device)),
                     *(f"{fmt_ns(parts.get(b, 0))} {fmt_pct(pct_of(parts.get(b, 0), busy), 0)}" for b in buckets)])
    return _fitted(con, f"Busy time by bucket, {where} (exclusive; % of busy)", ["device", *buckets], rows,
                   [False] + [True] * len(buckets))


def _print_moe(con: Console, summary: Summary) -> None:
    """The MoE section (render/moe.py): per device the MoE time per step split by stage; nothing without MoE."""
    from .moe import device_rows, source_lines

    rows = device_rows(summary)
    if rows is None:
        return
    cols, body = rows
    title = "MoE layers per step (the step of median MoE time; stages exclusive, % of MoE time)"
    for table in _fitted(con, title, cols, [[_text(c) for c in r] for r in body], [False] + [True] * (len(cols) - 1)):
        con.print(table)
    for line in source_lines(summary):
        con.print(_text(line))


def _findings_table(summary: Summary) -> Table:
    from .sections import findings as finding_rows

    table = _table("Findings (largest impact first)", ["impact/step", "% of step", "severity", "finding"],
                   [True, True, False, False])
    for f in finding_rows(summary):
        title = f["title"] + (f" — {f['recommendation']}" if f["recommendation"] else "")
        table.add_row(f["impact"], f["pct"], f["severity"], _text(title))
    return table


def _cross_rank_lines(cr: CrossRankSummary) -> list[str]:
    per_step = cr.detail.wait_ns_per_step_by_rank if cr.detail is not None else {}
    if per_step:
        waits = ", ".join(f"rank {r}: {fmt_ns(ns)}" for r, ns in sorted(per_step.items()))
        wait_line = f"wait per step (median): {waits}"
    else:
        waits = ", ".join(f"rank {r}: {fmt_ns(ns)}" for r, ns in sorted(cr.wait_ns_by_rank.items()))
        wait_line = f"wait over the whole window: {waits or '—'}"
    return [f"{cr.collectives_matched} collectives matched ({cr.match_method or 'n/a'}); "
            f"transfer per step {fmt_ns(cr.transfer_ns_per_step)}; waited for (straggler): "
            f"{'—' if cr.straggler_rank is None else f'rank {cr.straggler_rank}'}",
            wait_line]


def _print_why(con: Console, summary: Summary) -> bool:
    """The platform, the known causes that fired, the slow rank and the findings' combined bound: the first
    screen's "why". True when a cause or the slow rank was printed (the combined bound with them)."""
    from .sections import cause_rows, combined_line, platform_lines

    for line in platform_lines(summary):
        con.print(_text(line))
    causes = cause_rows(summary)
    slow = [f for f in summary.findings if f.id == SLOW_RANK]
    if not causes and not slow:
        return False
    con.print(_text("Why (known causes, rules/causes.toml; the slow rank)"), style="bold")
    for c in causes:
        con.print(_text(f"  • {c['title']}"))
        if c["alternative"]:
            con.print(_text(f"    what can be done: {c['alternative']}"))
    for f in slow:
        con.print(_text(f"  • {f.title}"))
    together = combined_line(summary)
    if together is not None:
        con.print(_text(together))
    return True


def print_summary(summary: Summary, console: Console | None = None, err_console: Console | None = None) -> None:
    """``traceanalyzer summary`` / ``report``: devices, buckets, findings, what-if and cross-rank on ``console``
    (stdout); warnings on ``err_console`` (stderr)."""
    con = console or make_console()
    names = ", ".join(Path(t.path).name for t in summary.traces)
    con.print(_text(f"traceanalyzer summary of {names}"), style="bold")
    models = sorted({d.name for d in summary.devices if d.name})
    con.print(_text(f"{len(summary.devices)} device(s): {', '.join(models) or 'GPU model unknown'}"))
    why = _print_why(con, summary)
    for table in _device_table(con, summary):
        con.print(table)
    for line in [*_structure_lines(summary), *runs_lines(summary)]:
        con.print(_text(line))
    if any(d.bucket_exclusive_ns for d in summary.devices):
        for table in _bucket_table(con, summary):
            con.print(table)
    _print_moe(con, summary)
    if summary.findings:
        con.print(_findings_table(summary))
        from .sections import combined_line

        together = combined_line(summary)
        if together is not None and not why:
            con.print(_text(together))
    if not any(d.comm_ns for d in summary.devices):
        con.print(_text("No communication kernels or peer copies: exposed communication, cross-rank wait and the "
                        "what-if do not apply."))
    else:
        wi = summary.what_if
        saving = "not determined" if wi.comm_free_step_saving_ns is None else \
            f"{fmt_ns(wi.comm_free_step_saving_ns)} per step"
        extra = [part for part in (range_text(wi), issue_only_text(wi)) if part]
        con.print(_text(f"If communication were free: {saving} (basis: {wi.basis})" +
                        "".join(f"; {p}" for p in extra)))
    if summary.cross_rank is not None:
        con.print(_text("Cross-rank"), style="bold")
        for line in _cross_rank_lines(summary.cross_rank):
            con.print(_text("  " + line))
    print_warnings(summary.warnings, err_console)


def print_warnings(warnings: Sequence[str], console: Console | None = None) -> None:
    """``warning: …`` lines on stderr (or ``console``): stdout carries only the result."""
    if not warnings:
        return
    con = console or make_console(sys.stderr)
    for warning in warnings:
        con.print(_text(f"warning: {warning}"), style="yellow")


# -- summary --hta-compat -----------------------------------------------------------------------------------------
def print_hta_compat(result: HtaCompatResult, console: Console | None = None) -> None:
    """``summary --hta-compat``: HTA 0.5.0's temporal breakdown and comm/comp overlap per rank, in µs as HTA."""
    con = console or make_console()

    def num(v: float | None) -> str:
        return "—" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:.2f}"

    table = _table("HTA-compatible breakdown, µs (HolisticTraceAnalysis 0.5.0 conventions)",
                   ["rank", "kernel", "idle", "idle %", "compute", "compute %", "non-compute", "overlap %"],
                   [True] * 8)
    for r in result.ranks:
        table.add_row(str(r.rank), num(r.kernel_us), num(r.idle_us), num(r.pct(r.idle_us)), num(r.compute_us),
                      num(r.pct(r.compute_us)), num(r.non_compute_us), num(r.overlap_pct))
    con.print(table)
    for note in result.notes:
        con.print(_text(f"note: {note}"), style="dim")
