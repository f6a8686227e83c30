"""The public functions behind ``ta.*`` (``traceanalyzer/__init__.py`` re-exports them lazily): summarize, report,
export, diff, what-if and classify, each a thin front to the pipeline and the commands."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .analysis.structure.layer_pattern import DEFAULT_LAYER_PATTERN
from .model.trace import PathLike, Trace

if TYPE_CHECKING:
    from .analysis.results import Summary
    from .commands.export import ExportResult, PerfettoResult
    from .loaders import ProgressFn


def summary(traces_or_paths: Trace | PathLike | Sequence[Trace | PathLike], *, step_range: str | None = None,
            layer_pattern: str | None = DEFAULT_LAYER_PATTERN, rules: PathLike | None = None,
            gpu_log: PathLike | None = None, jobs: int = 1, findings: bool = True,
            extra: dict[str, Any] | None = None, progress: ProgressFn | None = None,
            window: str | None = None, engine: str = "local", scheduler: str | None = None) -> Summary:
    """Summarize loaded Traces, or trace files / directories of rank traces (loaded and classified first).

    ``step_range`` names the NVTX/record_function range marking a step, ``layer_pattern`` the regex of layer
    ranges, ``rules`` a TOML file of extra classification rules, ``gpu_log`` an nvidia-smi CSV log; ``jobs``
    worker processes load files; ``findings=False`` skips the findings rules; ``extra`` passes
    ``finding_thresholds`` / ``disabled_findings`` / ``gpu_log_tz`` / ``gpu_log_utc_offset_s`` (another key is
    :class:`BadInputError`). ``progress`` and ``window`` (``"START:END"`` seconds from the
    capture start) apply to paths only. ``engine="dask"`` loads and analyses each rank file on a Dask worker
    (``scheduler``: its address, else ``$DASK_SCHEDULER_ADDRESS``, else a local cluster of ``jobs`` workers;
    ``pip install 'traceanalyzer[dask]'``); the answer is the local engine's.

    >>> s = ta.summary(["rank0.json.gz", "rank1.json.gz"])   # doctest: +SKIP
    >>> s = ta.summary("ranks/", engine="dask", scheduler="tcp://head:8786")   # doctest: +SKIP
    """
    from .pipeline.summarize import summary as _summary

    options: dict[str, Any] = {"step_range": step_range, "layer_pattern": layer_pattern, "rules": rules,
                               "gpu_log": gpu_log, "jobs": jobs, "findings": findings, "extra": extra or {}}
    if progress is not None:
        options["progress"] = progress
    if window is not None:
        options["window"] = window
    if engine != "local" or scheduler is not None:
        options.update(engine=engine, scheduler=scheduler)
    return _summary(traces_or_paths, **options)


def report(paths: PathLike | Sequence[PathLike], *, output: PathLike | None = None, rules: PathLike | None = None,
           jobs: int = 1, step_range: str | None = None, layer_pattern: str | None = DEFAULT_LAYER_PATTERN,
           gpu_log: PathLike | None = None, cdn: bool = False, progress: ProgressFn | None = None,
           window: str | None = None, gpu_log_tz: str | None = None) -> tuple[Path | str, Summary]:
    """The single-file HTML report for trace files: ``(html_path, Summary)`` when ``output`` names the file to write,
    else ``(html_text, Summary)`` with nothing written (the ``report`` command writes
    ``reports/<first trace name>.html`` by default; this function writes only where told).

    ``cdn`` references plotly on its CDN instead of inlining it. The other keywords are :func:`summary`'s.

    >>> html, s = ta.report("trace.sqlite")                      # doctest: +SKIP
    >>> path, s = ta.report("trace.sqlite", output="run.html")  # doctest: +SKIP
    """
    from .commands.report import report as _report

    files: list[PathLike] = [paths] if isinstance(paths, (str, Path)) else list(paths)
    return _report(files, output=output, rules=rules,
                   jobs=jobs, step_range=step_range, layer_pattern=layer_pattern, gpu_log=gpu_log, cdn=cdn,
                   progress=progress, window=window, gpu_log_tz=gpu_log_tz)


def diff(before: Any, after: Any, **options: Any) -> Any:
    """Compare two runs into a ``DiffResult``: each side a trace file, directory, list of them, Traces or a Summary
    (see ``traceanalyzer.commands.diff.diff``; method in docs/DIFF.md).

    >>> d = ta.diff("before/", "after/"); d.step["verdict"], d.attribution   # doctest: +SKIP
    """
    from .commands.diff import diff as _diff

    return _diff(before, after, **options)


def export(traces: Summary | Trace | PathLike | Sequence[Trace | PathLike], output: PathLike, *,
           append: bool = False, rules: PathLike | None = None, jobs: int = 1, step_range: str | None = None,
           layer_pattern: str | None = DEFAULT_LAYER_PATTERN, gpu_log: PathLike | None = None,
           progress: ProgressFn | None = None, window: str | None = None,
           format: str | None = None) -> ExportResult | PerfettoResult:
    """Write the analysis to a SQLite database (docs/EXPORT.md): trace files, Traces, or a ready ``Summary``.

    ``append`` adds a run to an existing database instead of replacing it. Returns an ``ExportResult``
    (``path``, ``run_id``, ``trace_ids``, ``rows`` per table, ``summary``). ``format="perfetto"`` (the default for
    an ``output`` ending in ``.pftrace``) writes a Perfetto trace instead (docs/PERFETTO.md) and returns a
    ``PerfettoResult`` (``path``, ``tracks``, ``slices`` per track name, ``summary``).
    """
    from .commands.export import export as _export

    return _export(traces, output, append=append, rules=rules, jobs=jobs, step_range=step_range,
                   layer_pattern=layer_pattern, gpu_log=gpu_log, progress=progress, window=window, format=format)


def whatif(traces_or_paths: PathLike | Trace | Sequence[PathLike | Trace], *, scale: Sequence[str] = (),
           comm: str | None = None, graphs: bool = False, rank_like_median: int | None = None,
           fuse: Sequence[str] = (), unprofiled: bool = False, **options: Any) -> Any:
    """Replay the run's dependency graph with changes and recompute its steps (``WhatIfResult``; method in
    docs/METHOD_WHATIF_SIM.md): ``scale=["attention=0.5"]`` (a bucket or kernel-name regex), ``comm="free"`` or
    ``"100GB/s"``, ``graphs=True`` (CUDA graphs: launch gaps removed), ``rank_like_median=R``, ``fuse=["REGEX"]``;
    ``unprofiled=True`` measures the changes against the run without the profiler's own host cost.
    With no change: the critical path of every step and the no-change replay. ``options`` as :func:`summary`'s.

    >>> w = ta.whatif("ranks/", comm="free"); w.change_ns, w.assumptions   # doctest: +SKIP
    """
    from .pipeline.summarize import whatif as _whatif

    return _whatif(traces_or_paths, scale=scale, comm=comm, graphs=graphs, rank_like_median=rank_like_median,
                   fuse=fuse, unprofiled=unprofiled, **options)


def classify_names(names: list[str], rules: PathLike | None = None) -> list[Any]:
    """Classify kernel names into buckets (see ``traceanalyzer.classify.classify_names``)."""
    from .classify import classify_names as _classify_names

    return _classify_names(names, rules=rules)
