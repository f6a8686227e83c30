"""``report``: load traces, summarize them, and write the single-file HTML report (plus return the Summary)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

from ..analysis.results import Summary
from ..analysis.structure.layer_pattern import DEFAULT_LAYER_PATTERN
from ..model.errors import EmptyTraceError
from ..model.trace import PathLike

DEFAULT_DIR = Path("reports")
_TRACE_SUFFIXES = re.compile(r"(\.pt\.trace)?\.(json\.gz|json|sqlite3?|db|nsys-rep)$", re.IGNORECASE)


def default_output(paths: Sequence[PathLike], directory: Path = DEFAULT_DIR) -> Path:
    """``reports/<stem of the first trace>.html`` (a directory argument gives its own name)."""
    first = Path(paths[0])
    stem = _TRACE_SUFFIXES.sub("", first.name) or "report"
    return directory / f"{stem}.html"


@overload
def report(paths: Sequence[PathLike], *, output: None = None, rules: PathLike | None = None, jobs: int = 1,
           step_range: str | None = None, layer_pattern: str | None = DEFAULT_LAYER_PATTERN,
           gpu_log: PathLike | None = None, cdn: bool = False, progress: Any = None, window: str | None = None,
           gpu_log_tz: str | None = None) -> tuple[str, Summary]: ...


@overload
def report(paths: Sequence[PathLike], *, output: PathLike, rules: PathLike | None = None, jobs: int = 1,
           step_range: str | None = None, layer_pattern: str | None = DEFAULT_LAYER_PATTERN,
           gpu_log: PathLike | None = None, cdn: bool = False, progress: Any = None, window: str | None = None,
           gpu_log_tz: str | None = None) -> tuple[Path, Summary]: ...


def report(paths: Sequence[PathLike], *, output: PathLike | None = None, rules: PathLike | None = None,
           jobs: int = 1, step_range: str | None = None, layer_pattern: str | None = DEFAULT_LAYER_PATTERN,
           gpu_log: PathLike | None = None, cdn: bool = False, progress: Any = None,
           window: str | None = None, gpu_log_tz: str | None = None) -> tuple[Path | str, Summary]:
    """Load and classify trace files (or directories of rank traces), summarize them and render the HTML report.

    With ``output`` the report is written there and ``(path written, Summary)`` is returned (``-`` = stdout); the
    target is checked before loading and written by :func:`output.write_output` (atomic replace, never an input
    trace, ``cannot write FILE: <reason>`` as exit 2). Without it nothing is written and ``(HTML text, Summary)``
    is returned; the ``report`` command's own default file is :func:`default_output`. ``cdn`` references plotly on
    its CDN instead of inlining it (smaller file, needs network to view).
    """
    from ..pipeline.summarize import replay_run, summary_run
    from ..render.html import render_html
    from .output import check_output, write_output

    if not paths:
        raise EmptyTraceError(None, "no trace files given")
    inputs = [*paths, *(p for p in (rules, gpu_log) if p is not None)]
    target = Path(output) if output is not None else None
    if target is not None:
        check_output(target, inputs)
    run = summary_run(list(paths), rules=rules, jobs=jobs, step_range=step_range, layer_pattern=layer_pattern,
                      gpu_log=gpu_log, progress=progress, window=window,
                      **({"extra": {"gpu_log_tz": gpu_log_tz}} if gpu_log_tz else {}))
    page = render_html(run.summary, run.traces, cdn=cdn, critical=replay_run(run))
    if target is None:
        return page, run.summary
    write_output(page, target, inputs=inputs)
    return target, run.summary
