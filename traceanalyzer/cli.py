"""The ``traceanalyzer`` command: thin shells over the library, one error boundary."""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ._version import __version__
from .analysis.structure.layer_pattern import DEFAULT_LAYER_PATTERN
from .model.buckets import BUCKETS
from .model.errors import ExitCode, TraceAnalyzerError, printable

# readable=False: an unreadable file is reported by the loader in one line naming it, not as a usage error
_PATH = click.Path(path_type=Path, readable=False)
_TRACES = click.argument("traces", nargs=-1, required=True, type=_PATH)
_RULES = click.option("--rules", type=_PATH, default=None,
                      help="TOML file of extra classification rules (checked before the defaults).")
_JOBS = click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
                     help="Load rank files in this many worker processes.")

_STEP_RANGE = click.option("--step-range", default=None,
                           help="NVTX/record_function range name that marks a step (default: ProfilerStep#N, else a "
                                "range named step, train_step, iteration…, else detected from the kernel sequence).")
_LAYER_PATTERN = click.option("--layer-pattern", default=DEFAULT_LAYER_PATTERN,
                              show_default="whole layer names: layer_3, layers.3, model.layers.3",
                              help="Regex of NVTX range names that mark layers.")
_GPU_LOG = click.option("--gpu-log", type=_PATH, default=None,
                        help="nvidia-smi CSV log (power, clocks) to align with the trace.")
def _check_zone(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        from .analysis.power import zone_offset_s

        try:
            zone_offset_s(value, 0)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


_GPU_LOG_TZ = click.option("--gpu-log-tz", default=None, metavar="ZONE", callback=_check_zone,
                           help="Time zone the --gpu-log timestamps are written in (nvidia-smi writes local time): "
                                "UTC, UTC+01:00, -05:30 or an IANA name such as Europe/Berlin. Default: UTC when "
                                "that matches the capture, else the offset detected from the capture window.")
_WINDOW = click.option("--window", default=None, metavar="START:END",
                       help="Analyse only the activity starting in [START, END) seconds from the capture start "
                            "(nsys: its own clock; Kineto: the first event). nsys exports are filtered in SQLite.")


def _use_nsys(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        from .loaders.nsys_rep import NSYS_ENV

        os.environ[NSYS_ENV] = str(value)  # read where a report is exported (loaders/nsys_rep.py)


_NSYS = click.option("--nsys", type=_PATH, default=None, metavar="PATH", expose_value=False, callback=_use_nsys,
                     help="The nsys executable that exports .nsys-rep reports to SQLite (default: nsys on PATH; "
                          "env TRACEANALYZER_NSYS). The export is kept next to the report and reused.")

F = TypeVar("F", bound=Callable[..., Any])


def _finite(_ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A number option that must be finite (click's FloatRange lets nan, inf and 1e309 through)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", param=param)
    return value


def _analysis_options(fn: F) -> F:
    """The options every command that runs the summary takes: --rules, -j, --step-range, --layer-pattern,
    --gpu-log, --gpu-log-tz, --window, --nsys (in that order in --help)."""
    for option in (_NSYS, _WINDOW, _GPU_LOG_TZ, _GPU_LOG, _LAYER_PATTERN, _STEP_RANGE, _JOBS, _RULES):
        fn = option(fn)
    return fn


def _emit_json(payload: Any, output: Path | None = None, inputs: tuple[Path | None, ...] = ()) -> None:
    """The JSON on stdout, or written to ``output`` (``-`` = stdout) by the one output writer."""
    _emit_json_text(json.dumps(payload, indent=2, sort_keys=False, allow_nan=False), output, inputs)


def _emit_json_text(text: str, output: Path | None = None, inputs: tuple[Path | None, ...] = ()) -> None:
    """JSON text already encoded as :func:`_emit_json` encodes it, emitted as it emits it."""
    if output is None:
        click.echo(text)
        return
    from .commands.output import write_output

    written = write_output(text + "\n", output, inputs=[p for p in inputs if p is not None])
    if written != "<stdout>":
        click.echo(f"JSON written: {printable(written)}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="traceanalyzer")
@click.option("--traceback", is_flag=True, help="Show the Python traceback of errors (for bug reports).")
@click.pass_context
def cli(ctx: click.Context, traceback: bool) -> None:
    """Explain GPU traces of LLM serving/training: kernel buckets, exposed communication (SM-idle during
    collectives), cross-rank wait, findings.

    TRACE files are nsys SQLite exports (nsys export --type sqlite), Nsight Systems reports (.nsys-rep: exported
    to SQLite with nsys once, the export kept beside the report) or PyTorch profiler (Kineto) JSON traces (.json
    or .json.gz); a directory stands for the rank traces inside it.

    \b
    Examples:
      traceanalyzer info rank0.json.gz
      traceanalyzer summary traces/            # one file per rank
      traceanalyzer report run.sqlite -o run.html
      traceanalyzer diff before/ --vs after/   # what changed, attributed

    Exit codes: 0 ok, 1 internal error, 2 bad input (one line on stderr naming the file and the problem),
    3 diff --fail-if-slower: the after run is slower than allowed.
    """
    ctx.obj = {"traceback": traceback}


@cli.command(short_help="What a trace file holds: format, versions, devices, counts.")
@click.argument("trace", type=_PATH)
@click.option("--json", "as_json", is_flag=True, help="Print the info JSON contract.")
@_NSYS
def info(trace: Path, as_json: bool) -> None:
    """What TRACE holds: format, tool and schema version, devices and ranks, raw activity counts.

    Reads no more than it needs (fast on large exports). --json prints the info contract:
    format, tool_version, schema_version, devices, counts.
    """
    from .pipeline.loading import info as info_fn

    result = info_fn(trace)
    if as_json:
        _emit_json({k: result[k] for k in ("format", "tool_version", "schema_version", "devices", "counts")}
                   | {k: v for k, v in result.items() if k not in ("capabilities",)})
        return
    from .render.terminal import print_info

    print_info(trace, result)


@cli.command(short_help="Classify kernel names into buckets.",
             help=f"Put kernel names into buckets ({', '.join(BUCKETS)}).\n\n"
                  "NAMES_FILE holds one kernel name per line (UTF-8); '-' reads stdin. Prints bucket, sub-bucket, "
                  "precision,\nconfidence and the matching rule per name, in input order.")
@click.argument("names_file", type=click.Path(path_type=Path, allow_dash=True, readable=False))
@click.option("--json", "as_json", is_flag=True, help="Print the classification JSON contract.")
@_RULES
def classify(names_file: Path, as_json: bool, rules: Path | None) -> None:
    """Put kernel names into the buckets of :mod:`traceanalyzer.model.buckets` (help text built from them)."""
    from .classify import classify_names, read_names

    results = classify_names(read_names(names_file), rules=rules)
    if as_json:
        from .classify.engine import classes_json

        _emit_json_text(classes_json(results))  # json.dumps of every to_dict(), written without the dicts
        return
    from .render.terminal import print_classification

    print_classification(results)


@cli.command(short_help="Time breakdown, exposed communication, cross-rank wait, findings.")
@_TRACES
@click.option("--json", "as_json", is_flag=True, help="Print the summary JSON contract.")
@click.option("--hta-compat", is_flag=True,
              help="HolisticTraceAnalysis 0.5.0 conventions (Kineto traces; µs, last step dropped; its own comm "
                   "regex, so no --rules/--step-range/--layer-pattern/--gpu-log).")
@click.option("-o", "--output", type=click.Path(path_type=Path, allow_dash=True), default=None, metavar="FILE",
              help="With --json: write the JSON to FILE (atomically; '-' = stdout) instead of stdout.")
@_analysis_options
@click.option("--engine", type=click.Choice(["local", "dask"]), default="local", show_default=True,
              help="local: this process (-j loader processes); dask: each rank file loaded and analysed on a Dask "
                   "worker, only compact per-rank results travel back (pip install 'traceanalyzer[dask]').")
@click.option("--scheduler", default=None, metavar="ADDRESS", envvar="DASK_SCHEDULER_ADDRESS",
              help="With --engine dask: the scheduler (tcp://HOST:8786; env DASK_SCHEDULER_ADDRESS); default: a "
                   "local cluster of -j worker processes. Workers read the trace files by path.")
@click.option("--scheduler-timeout", type=click.FloatRange(min=0.1, max=3600), default=10.0, show_default=True,
              metavar="SECONDS", callback=_finite, help="With --scheduler: how long to wait for it to answer.")
def summary(traces: tuple[Path, ...], as_json: bool, hta_compat: bool, output: Path | None, rules: Path | None,
            jobs: int, step_range: str | None, layer_pattern: str, gpu_log: Path | None, gpu_log_tz: str | None,
            window: str | None, engine: str, scheduler: str | None, scheduler_timeout: float) -> None:
    """Per-device time breakdown, exposed communication, cross-rank wait, what-if and findings.

    TRACES: one or more trace files, or directories of rank traces (one format per directory). All numbers are
    per (rank, device); per-step numbers use the steps chosen as --step-range describes.
    """
    from .commands.progress import progress_bar

    if output is not None:
        if not as_json:
            raise click.UsageError("-o/--output writes the JSON: add --json")
        from .commands.output import check_output

        check_output(output, [*traces, *(p for p in (rules, gpu_log) if p is not None)])
    inputs = (*traces, rules, gpu_log)
    if hta_compat:
        from .pipeline.summarize import hta_compat as hta_fn

        ignored = [name for name, given in (("--rules", rules), ("--step-range", step_range), ("--gpu-log", gpu_log),
                                            ("--gpu-log-tz", gpu_log_tz),
                                            ("--window", window), ("--engine dask", engine != "local"),
                                            ("--layer-pattern", layer_pattern != DEFAULT_LAYER_PATTERN)) if given]
        if ignored:
            raise click.UsageError(f"--hta-compat follows HTA's own conventions; drop {', '.join(ignored)}")

        with progress_bar("loading") as progress:
            hta_result = hta_fn(list(traces), progress=progress, jobs=jobs)
        if as_json:
            _emit_json(hta_result.to_json(), output, inputs)
        else:
            from .render.terminal import print_hta_compat

            print_hta_compat(hta_result)
        return
    from .pipeline.summarize import summarize_paths

    if scheduler is not None and engine != "dask":
        if not os.environ.get("DASK_SCHEDULER_ADDRESS") or scheduler != os.environ["DASK_SCHEDULER_ADDRESS"]:
            raise click.UsageError("--scheduler needs --engine dask")
        scheduler = None  # only the environment's default: ignored by the local engine
    with progress_bar("loading") as progress:
        result = summarize_paths(list(traces), rules=rules, jobs=jobs, step_range=step_range,
                                 layer_pattern=layer_pattern, gpu_log=gpu_log, progress=progress, window=window,
                                 engine=engine, scheduler=scheduler, scheduler_timeout=scheduler_timeout,
                                 extra={"gpu_log_tz": gpu_log_tz} if gpu_log_tz else None)
    if as_json:
        _emit_json(result.to_json(), output, inputs)
        return
    from .render.terminal import print_summary

    print_summary(result)


@cli.command(short_help="Critical path across ranks; what a change would buy, by replaying it.")
@_TRACES
@click.option("--scale", multiple=True, metavar="BUCKET=F|REGEX=F",
              help="Kernels of a bucket (or whose name matches REGEX) take F × their time; repeatable.")
@click.option("--comm", default=None, metavar="free|BW",
              help="Communication free (no time, no rank waits, no host call time) or at a bus bandwidth "
                   "(100GB/s).")
@click.option("--graphs", is_flag=True, help="CUDA graphs: one launch per host segment, launch gaps removed.")
@click.option("--rank-like-median", type=int, default=None, metavar="R",
              help="Rank R's kernels and host gaps as long as the other ranks' medians (where shorter).")
@click.option("--fuse", multiple=True, metavar="REGEX[=F]",
              help="Runs of consecutive matching kernels on a stream become one kernel (its longest member, or F × "
                   "the run's total); repeatable.")
@click.option("--unprofiled", is_flag=True,
              help="Take the profiler's own host cost (per recorded host event) out of the host gaps, in the baseline "
                   "and with the changes: the changes' effect on the unprofiled run.")
@click.option("--html", "html_out", type=click.Path(path_type=Path, allow_dash=True), default=None, metavar="FILE",
              help="Also write the median step's critical path drawn over its timeline as one offline HTML file.")
@click.option("--json", "as_json", is_flag=True, help="Print the what-if JSON.")
@click.option("-o", "--output", type=click.Path(path_type=Path, allow_dash=True), default=None, metavar="FILE",
              help="With --json: write the JSON to FILE (atomically; '-' = stdout) instead of stdout.")
@_RULES
@_STEP_RANGE
def whatif(traces: tuple[Path, ...], scale: tuple[str, ...], comm: str | None, graphs: bool,
           rank_like_median: int | None, fuse: tuple[str, ...], unprofiled: bool, html_out: Path | None,
           as_json: bool, output: Path | None, rules: Path | None, step_range: str | None) -> None:
    """The critical path of each step across ranks (compute, transfer, wait, launch, host gap) and, with changes,
    the steps replayed over the same dependencies (docs/METHOD_WHATIF_SIM.md).

    TRACES: trace files or directories of rank traces (one run).
    """
    from .pipeline.summarize import whatif as whatif_fn

    if output is not None and not as_json:
        raise click.UsageError("-o/--output writes the JSON: add --json")
    result = whatif_fn(list(traces), scale=scale, comm=comm, graphs=graphs, rank_like_median=rank_like_median,
                       fuse=fuse, unprofiled=unprofiled, rules=rules, step_range=step_range)
    if html_out is not None:
        from .commands.output import write_output
        from .render.whatif import whatif_html

        written = write_output(whatif_html(result), html_out, inputs=[*traces, *([rules] if rules else [])])
        click.echo(f"HTML written: {written}", err=True)
    if as_json:
        _emit_json(result.to_json(), output, (*traces, rules))
        return
    from .render.whatif import whatif_lines

    click.echo("\n".join(whatif_lines(result)))


@cli.command(short_help="Terminal summary plus a self-contained HTML report.")
@_TRACES
@click.option("-o", "--output", type=click.Path(path_type=Path, allow_dash=True), default=None,
              help="HTML file to write (default: reports/<first trace name>.html); '-' writes the HTML to stdout "
                   "and the terminal summary to stderr.")
@_analysis_options
@click.option("--cdn", is_flag=True, help="Load plotly from its CDN instead of inlining it (smaller file).")
def report(traces: tuple[Path, ...], output: Path | None, rules: Path | None, jobs: int,
           step_range: str | None, layer_pattern: str, gpu_log: Path | None, gpu_log_tz: str | None, window: str | None,
           cdn: bool) -> None:
    """The summary in the terminal plus one self-contained HTML report (charts, per-step, per-layer and
    per-collective tables, findings).

    The page works offline (plotly inlined) unless --cdn; it is written atomically, so a failed run leaves no
    half-written file, and never over an input trace.
    """
    from .commands.output import is_stdout
    from .commands.progress import progress_bar
    from .commands.report import default_output
    from .commands.report import report as report_fn

    with progress_bar("loading") as progress:
        written, result = report_fn(list(traces), output=output or default_output(traces), rules=rules, jobs=jobs,
                                    step_range=step_range, layer_pattern=layer_pattern, gpu_log=gpu_log, cdn=cdn,
                                    progress=progress, window=window, gpu_log_tz=gpu_log_tz)
    from .render.terminal import make_console, print_summary

    to_stdout = is_stdout(written)
    print_summary(result, make_console(sys.stderr) if to_stdout else None)
    if not to_stdout:
        click.echo(f"report written: {printable(written)}", err=True)


@cli.command(short_help="The analysis as a SQLite database or a Perfetto trace.")
@_TRACES
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="File to write: a SQLite database (replaced atomically unless --append), or a Perfetto trace "
                   "with --format perfetto (the default for a .pftrace name).")
@click.option("--format", "fmt", type=click.Choice(["sqlite", "perfetto"]), default=None,
              help="sqlite: tables of kernels, steps, layers, collectives, findings (default); perfetto: the "
                   "kernels, copies and annotation ranges per rank and stream with the analysis as tracks, for "
                   "the Perfetto UI (default for -o *.pftrace).")
@click.option("--append", is_flag=True, help="Add this run to the database instead of replacing it (a history).")
@_analysis_options
def export(traces: tuple[Path, ...], output: Path, fmt: str | None, append: bool, rules: Path | None, jobs: int,
           step_range: str | None, layer_pattern: str, gpu_log: Path | None, gpu_log_tz: str | None,
           window: str | None) -> None:
    """Write the summary of TRACES to a SQLite database: runs, traces, devices, kernels, memops, steps,
    layers, collectives, findings and MoE layers, with foreign keys to traces, indexes on (trace_id, rank, device,
    start_ns) and full-text search on kernel names. Open it with sqlite3 or Datasette; docs/EXPORT.md has
    the tables and example queries.

    With --format perfetto (or -o NAME.pftrace) it writes a Perfetto trace instead: per rank and GPU the
    kernels and copies per stream, the annotation ranges, and the analysis as tracks (steps, layers,
    findings with their impact, exposed communication, SM idle, wait vs transfer per collective, the
    straggler), timestamps as in the trace; docs/PERFETTO.md.
    """
    from .commands.export import PerfettoResult
    from .commands.export import export as export_fn
    from .commands.progress import progress_bar

    with progress_bar("loading") as progress:
        result = export_fn(list(traces), output, append=append, rules=rules, jobs=jobs, step_range=step_range,
                           layer_pattern=layer_pattern, gpu_log=gpu_log, progress=progress, window=window,
                           gpu_log_tz=gpu_log_tz, format=fmt)
    if isinstance(result, PerfettoResult):
        click.echo(f"{printable(result.path)}: Perfetto trace, {result.tracks:,} tracks, "
                   f"{sum(result.slices.values()):,} slices — open it at ui.perfetto.dev")
        return
    counts = ", ".join(f"{n:,} {table}" for table, n in result.rows.items() if n and table != "runs")
    click.echo(printable(f"{result.path}: run {result.run_id} — {counts}"))


def _after_vs(args: list[str], command: click.Command) -> list[str]:
    """``BEFORE... --vs AFTER...``: every path after ``--vs`` (up to ``--``) becomes one ``--vs`` value, so the
    after side can be several files as the before side is; options after ``--vs`` keep their own values."""
    valued = {name for p in command.params if isinstance(p, click.Option) and not p.is_flag
              for name in (*p.opts, *p.secondary_opts)} - {"--vs"}
    out: list[str] = []
    in_vs, given, i = False, 0, 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out += args[i:]
            break
        if arg == "--vs":
            in_vs = True
        elif arg.startswith("-") and arg != "-":
            out.append(arg)
            if arg in valued and i + 1 < len(args):
                out.append(args[i + 1])
                i += 1
        elif in_vs:
            out += ["--vs", arg]
            given += 1
        else:
            out.append(arg)
        i += 1
    if in_vs and not given:
        out.append("--vs")  # let click say that --vs needs a value
    return out


class _DiffCommand(click.Command):
    """``diff``: the after side is every path following ``--vs``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _after_vs(args, self))


@cli.command(cls=_DiffCommand,
             short_help="Compare two runs: step change attributed, kernels, collectives, findings.")
@click.argument("before", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--vs", "after", multiple=True, required=True, type=click.Path(path_type=Path), metavar="AFTER",
              help="The after run: every trace file or directory following --vs.")
@click.option("--json", "as_json", is_flag=True, help="Print the diff JSON (with its schema_version).")
@click.option("-o", "--output", type=click.Path(path_type=Path, allow_dash=True), default=None,
              help="Also write the diff as a self-contained HTML file ('-': stdout, the tables then go to stderr).")
@click.option("--fail-if-slower", type=click.FloatRange(min=0), default=None, metavar="PCT", callback=_finite,
              help="Exit 3 when the after step is slower by more than PCT % and by more than the noise.")
@_RULES
@_JOBS
@_STEP_RANGE
@_LAYER_PATTERN
@_NSYS
@click.pass_context
def diff(ctx: click.Context, before: tuple[Path, ...], after: tuple[Path, ...], as_json: bool, output: Path | None,
         fail_if_slower: float | None, rules: Path | None, jobs: int, step_range: str | None,
         layer_pattern: str) -> None:
    """Compare BEFORE (trace files or directories of rank traces) with the run given by --vs: median step time
    and its noise, a verdict (faster, slower, same, not comparable), the step change attributed to compute
    buckets, exposed communication (transfer, wait), memory copies and idle (host-bound, other) so the parts add
    up, kernels matched by role, collectives and findings before/after.

    Either side may be an nsys export or Kineto traces. Method: docs/DIFF.md. Exit codes as everywhere, plus 3
    with --fail-if-slower when the after run is slower than allowed.

    \b
    Example:
      traceanalyzer diff before/ --vs after/ -o diff.html --fail-if-slower 5
    """
    from .commands.diff import diff as diff_fn
    from .commands.output import check_output, is_stdout, write_output
    from .commands.progress import progress_bar
    from .render.diff import print_diff, render_diff_html
    from .render.terminal import make_console

    inputs = [*before, *after]
    to_stdout = is_stdout(output)
    if to_stdout and as_json:
        raise click.UsageError("-o - and --json both write to stdout; give the HTML a file name")
    if output is not None:
        check_output(output, inputs)  # refused before any work: a directory, an input trace, an unwritable path
    with progress_bar("loading") as progress:
        result = diff_fn(list(before), list(after), rules=rules, jobs=jobs, step_range=step_range,
                         layer_pattern=layer_pattern, progress=progress)
    written = write_output(render_diff_html(result), output, inputs=inputs) if output is not None else None
    if as_json:
        _emit_json(result.to_json())
    else:
        print_diff(result, make_console(sys.stderr) if to_stdout else None)
    if written is not None and not to_stdout:
        click.echo(f"diff written: {printable(written)}", err=True)
    if fail_if_slower is not None and result.slower_than(fail_if_slower):
        click.echo(f"after is slower than allowed (> {fail_if_slower:g} % and > noise)", err=True)
        ctx.exit(int(ExitCode.SLOWER))


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and turn errors into one-line messages and exit codes."""
    args = sys.argv[1:] if argv is None else argv
    show_tb = "--traceback" in args
    try:
        with warnings.catch_warnings():
            if not show_tb:  # library warnings (pandas, numpy) are not for the user; trace warnings are printed
                warnings.simplefilter("ignore")
            code = cli.main(args=args, prog_name="traceanalyzer", standalone_mode=False)
        if isinstance(code, int) and code:  # a command's ctx.exit(n), e.g. diff --fail-if-slower → 3
            return code
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            click.echo("Interrupted.", err=True)
            return 130
        click.echo("Aborted.", err=True)
        return ExitCode.BAD_INPUT
    except click.ClickException as exc:
        click.echo(f"Error: {printable(exc.format_message())}", err=True)
        return ExitCode.BAD_INPUT
    except TraceAnalyzerError as exc:
        if show_tb:
            raise
        click.echo(f"Error: {printable(exc)}", err=True)
        return int(exc.exit_code)
    except BrokenPipeError:
        return ExitCode.OK
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        return 130
    except Exception as exc:  # the one place an unexpected failure becomes a message
        if _TERMINATED:  # raised while SIGTERM unwound the command: its exit code, no message
            return 128 + _TERMINATED[0]
        if show_tb:
            raise
        click.echo(f"Error: internal error: {type(exc).__name__}: {printable(exc)} — rerun with --traceback and "
                   "report it", err=True)
        return ExitCode.INTERNAL_ERROR
    return _flushed()


def _flushed() -> int:
    """Flush stdout before saying 0: a result cut short by ``ulimit -f`` or a full disk behind a redirected stdout
    is exit 2 with one line, not a silent truncation (a reader that left is still 0)."""
    try:
        sys.stdout.flush()
        if _at_file_size_limit():
            raise OSError(27, "file too large (ulimit -f)")
    except BrokenPipeError:
        return ExitCode.OK
    except OSError as exc:
        click.echo(f"Error: cannot write the standard output: {printable(exc.strerror or exc)}", err=True)
        return ExitCode.BAD_INPUT
    return ExitCode.OK


def _at_file_size_limit() -> bool:
    """Whether stdout is a regular file written up to ``ulimit -f`` (RLIMIT_FSIZE): the write that crossed it was
    cut short, which Python's buffered streams do not report."""
    try:
        import resource
        import stat

        fd = sys.stdout.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        return soft != resource.RLIM_INFINITY and os.lseek(fd, 0, os.SEEK_CUR) >= soft
    except (ImportError, OSError, ValueError, AttributeError):
        return False


#: the signals that ended the command (set by :func:`_terminate_as_interrupt`'s handler): a failure met on the way
#: out (a pool torn down mid-call, a half-done import) is the signal's doing, not a bug, and exits as the signal
_TERMINATED: list[int] = []


def _terminate_as_interrupt() -> None:
    """SIGTERM ends the command as Ctrl-C does (worker pools terminated, temporary files removed by the ``finally``
    blocks on the way out), with exit 143, the shell's code for it."""
    import signal

    def handler(signum: int, _frame: object) -> None:
        _TERMINATED.append(signum)
        raise SystemExit(128 + signum)

    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, handler)


#: Arrays of this size and more get pages of their own from glibc's allocator (see :func:`_map_big_arrays`).
MMAP_THRESHOLD_BYTES = 4 << 20


def _map_big_arrays() -> None:
    """Have glibc map every allocation of :data:`MMAP_THRESHOLD_BYTES` or more on its own and unmap it when freed.
    By default glibc raises that threshold up to 32 MiB as large blocks are freed, after which arrays of a few
    million rows come from the heap and their pages, once freed, stay with the process: a 3.8 M-kernel export's
    summary peaked about 90 MB higher. Left alone where glibc is not the allocator, or the user set
    ``MALLOC_MMAP_THRESHOLD_`` themselves."""
    if sys.platform != "linux" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = getattr(libc, "mallopt", None)
        if mallopt is not None and getattr(libc, "gnu_get_libc_version", None) is not None:
            mallopt(-3, MMAP_THRESHOLD_BYTES)  # M_MMAP_THRESHOLD
    except OSError:
        return


def run() -> None:
    """The ``traceanalyzer`` console script: :func:`main`, then leave without tearing the heap down object by object
    (the trace's arrays and names die with the process; 0.15 s on a 377 MB trace). Output is flushed first."""
    _map_big_arrays()
    _terminate_as_interrupt()
    try:
        code = main()
    except SystemExit as exc:  # SIGTERM (its handler raises this); any other exit keeps its code
        code = 128 + _TERMINATED[0] if _TERMINATED else exc.code if isinstance(exc.code, int) else 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, OSError):
        pass
    os._exit(int(code))


if __name__ == "__main__":
    run()
