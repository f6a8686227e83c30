"""The ``summary`` pipeline: trace files or loaded Traces → classified Traces → per-device analyses → cross-rank
matching, what-if, GPU metrics, power → findings → :class:`~traceanalyzer.analysis.results.Summary`.

The one place that strings the analyses together, above ``analysis`` and ``findings`` and below the surfaces
(``cli``, ``report``, ``ta.summary``). Map: :func:`~traceanalyzer.analysis.device.analyze_device` per
(rank, device) with kernels, per trace. Reduce: cross-rank matching and the "if communication were free" estimate
over all devices, GPU-metric and power aggregates, then the findings rules. The analysis modules are imported
inside the functions, so that a summary imports them while a forked helper decodes a big Kineto file
(:func:`load_for_summary`) and ``traceanalyzer --help`` does not import pandas.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis.structure.layer_pattern import DEFAULT_LAYER_PATTERN, check_layer_pattern
from ..loaders import KINETO, SUMMARY_TABLES, ProgressFn, detect_format, expand_paths
from ..model.errors import BadInputError
from ..model.trace import PathLike, Trace
from .loading import load_files, load_many, require_kernels
from .stages import LocalTraceWork, TracePart, analyze_trace, classified_once, reduce_parts

if TYPE_CHECKING:
    from ..analysis.hta_compat import HtaCompatResult
    from ..analysis.results import DeviceSummary, Summary
    from ..analysis.summary import SummaryOptions
    from ..analysis.what_if.simulate import Change, WhatIfResult

ENGINES = ("local", "dask")  # summary engines: this process (+ -j loader processes), a Dask cluster


def summarize(traces: Trace | Sequence[Trace], options: SummaryOptions | None = None, **kwargs: Any) -> Summary:
    """The whole ``summary`` of already loaded (classified) traces: one :class:`DeviceSummary` per (rank, device)
    with kernels, cross-rank matching, the what-if estimate and findings. ``kwargs`` set SummaryOptions fields."""
    from ..analysis.summary import SummaryOptions

    opts = options or SummaryOptions(**kwargs)
    return _summarize([traces] if isinstance(traces, Trace) else list(traces), opts, {}).summary


@dataclass
class SummaryRun:
    """A summary and the per-trace work the pipeline kept beside it: the classified traces (the report's timeline
    reads them) and each trace's part, whose devices' layers the export's kernel rows read. The Dask engine's
    traces and parts stay on its workers: none here."""

    summary: Summary
    traces: list[Trace]
    parts: list[TracePart]


def _summarize(traces: list[Trace], opts: SummaryOptions, analyzed: dict[int, tuple[Trace, TracePart]],
               own: bool = False) -> SummaryRun:
    """:func:`summarize`, reusing the parts already ``analyzed`` (by ``id`` of their Trace, the Trace kept
    beside its part) for the Traces that are those very objects. ``own``: the traces were loaded for this
    summary, and what only the map step reads is released after it (``stages.analyze_trace``)."""
    from ..analysis.results import SummarySource

    check_layer_pattern(opts.layer_pattern)
    trace_list = [classified_once(t, opts.rules) for t in traces]

    def part(trace: Trace) -> TracePart:
        early = analyzed.get(id(trace))
        return early[1] if early is not None and early[0] is trace else \
            analyze_trace(trace, opts, release=own)

    parts = [part(t) for t in trace_list]
    states = {key: state for p in parts for key, state in p.device_states().items()}
    result = reduce_parts(parts, opts, LocalTraceWork(trace_list, states))
    result.source = SummarySource(opts.layer_pattern)
    return SummaryRun(result, trace_list, parts)


def summary(traces_or_paths: Trace | PathLike | Sequence[Trace | PathLike], **options: Any) -> Summary:
    """``ta.summary(...)``: summarize loaded Traces, or trace files / directories (loaded and classified first).

    ``options`` are SummaryOptions fields (``step_range``, ``layer_pattern``, ``rules``, ``gpu_log``, ``jobs``…)
    and, for paths, ``window`` (``"START:END"`` seconds from the capture start).
    """
    return summary_run(traces_or_paths, **options).summary


def summary_run(traces_or_paths: Trace | PathLike | Sequence[Trace | PathLike], **options: Any) -> SummaryRun:
    """:func:`summary` with the per-trace work kept beside it (:class:`SummaryRun`: the export's)."""
    from ..analysis.summary import SummaryOptions

    items = list(traces_or_paths) if isinstance(traces_or_paths, (list, tuple)) else [traces_or_paths]
    traces = [t for t in items if isinstance(t, Trace)]
    if items and len(traces) == len(items):
        if options.pop("engine", "local") != "local" or options.pop("scheduler", None) is not None:
            raise TypeError("the Dask engine loads files on its workers: pass paths, not Trace objects")
        return _summarize(traces, SummaryOptions(**options), {})
    if traces:
        raise TypeError("pass either Trace objects or paths, not both")
    fields = set(SummaryOptions.__dataclass_fields__)
    unknown = set(options) - fields - {"progress", "window", "engine", "scheduler", "scheduler_timeout"}
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    return _run_paths([p for p in items if isinstance(p, (str, Path))], **options)


def summarize_paths(paths: Sequence[PathLike], **options: Any) -> Summary:
    """Load trace files (or directories of rank traces) and summarize them: the ``summary`` and ``report``
    commands and ``ta.summary(paths)``. The keywords as :func:`_run_paths`; errors as :func:`load_for_summary`."""
    return _run_paths(paths, **options).summary


def _run_paths(paths: Sequence[PathLike], *, rules: PathLike | None = None, jobs: int = 1,
                    step_range: str | None = None, layer_pattern: str | None = DEFAULT_LAYER_PATTERN,
                    gpu_log: PathLike | None = None, findings: bool = True, extra: dict[str, Any] | None = None,
                    progress: ProgressFn | None = None, window: str | None = None,
                    skip: Collection[str] = (), engine: str = "local", scheduler: str | None = None,
                    scheduler_timeout: float = 10.0) -> SummaryRun:
    """The summary of trace files (or directories of rank traces) and its work. The keywords are
    ``analysis.summary.SummaryOptions`` fields; ``engine="dask"`` computes it on a Dask cluster (``scheduler``
    address, reached within ``scheduler_timeout`` seconds: :mod:`traceanalyzer.pipeline.dask_engine`). The Summary
    records how
    its files were read (``Summary.source``)."""
    from ..analysis.results import SummarySource
    from ..analysis.summary import SummaryOptions

    if engine not in ENGINES:
        raise BadInputError(None, f"unknown engine {engine!r}", f"one of {', '.join(ENGINES)}")
    if engine == "local" and scheduler is not None:
        raise BadInputError(None, "a scheduler address needs the Dask engine", "add --engine dask")
    opts = SummaryOptions(step_range=step_range, layer_pattern=layer_pattern, rules=rules, gpu_log=gpu_log,
                          jobs=jobs, findings=findings, extra=extra or {}, skip=frozenset(skip))
    source = SummarySource(layer_pattern, rules=None if rules is None else str(rules), window=window,
                           from_files=True)
    if engine == "dask":
        from .dask_engine import summarize_on_dask

        result = summarize_on_dask(paths, opts, scheduler=scheduler, window=window, timeout=scheduler_timeout)
        result.source = source
        return SummaryRun(result, [], [])
    # with worker processes, each trace's map step runs here as it arrives, while the workers load the others
    analyzed: dict[int, tuple[Trace, TracePart]] = {}
    with _long_lived() as settled:

        def analyze_loaded(trace: Trace) -> None:
            classified = classified_once(trace, rules)
            analyzed[id(trace)] = (trace, analyze_trace(classified, opts, release=classified is trace))
            settled()

        traces = load_for_summary(paths, rules=rules, jobs=jobs, layer_pattern=layer_pattern, progress=progress,
                                  window=window, on_loaded=analyze_loaded)
        settled()
        run = _summarize(traces, opts, analyzed, own=True)
    run.summary.source = source
    return run


@contextmanager
def _long_lived() -> Iterator[Callable[[], None]]:
    """Keep the garbage collector off what a summary holds to its end: the function given moves every object
    tracked so far (the traces loaded and their parts) out of the collector's generations (``gc.freeze``), so later
    collections do not traverse them again and again — at 10,000 rank files they took a quarter of the driver's
    time. Everything is handed back (``gc.unfreeze``) on the way out; when the caller froze objects itself, this
    does nothing."""
    if gc.get_freeze_count():
        yield lambda: None
        return
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()


def load_for_summary(paths: Sequence[PathLike], *, rules: PathLike | None = None, jobs: int = 1,
                     layer_pattern: str | None = DEFAULT_LAYER_PATTERN,
                     progress: ProgressFn | None = None, window: str | None = None,
                     on_loaded: Callable[[Trace], None] | None = None) -> list[Trace]:
    """``loading.load_many`` before a summary: the layer pattern checked first, :class:`EmptyTraceError` when no file
    has kernels, and the analysis modules imported while a forked helper decodes part of a big Kineto file.
    ``on_loaded`` as :func:`~traceanalyzer.pipeline.loading.load_files`."""
    from ..loaders.beside import meanwhile

    check_layer_pattern(layer_pattern)
    with meanwhile(_prepare_summary):
        traces = load_many(list(paths), rules=rules, jobs=jobs, progress=progress, window=window,
                           tables=SUMMARY_TABLES, on_loaded=on_loaded)
    require_kernels(traces, paths)
    return traces


def hta_compat(paths: Sequence[PathLike], progress: ProgressFn | None = None, jobs: int = 1) -> HtaCompatResult:
    """``summary --hta-compat``: load Kineto rank traces (files or directories; ``jobs`` worker processes when
    > 1; only the tables HTA's numbers read) and compute HTA's temporal breakdown and overlap per rank."""
    from ..analysis.hta_compat import HTA_TABLES, hta_compat_traces

    files = expand_paths(list(paths))
    for f in files:
        if detect_format(f) != KINETO:
            raise BadInputError(f, "--hta-compat reads PyTorch profiler (Kineto) traces, HTA's input; "
                                   "this is an SQLite file", "run summary without --hta-compat")
    traces = load_files(files, classify=False, jobs=jobs, tables=HTA_TABLES, progress=progress)
    require_kernels(traces, files)
    return hta_compat_traces(traces)


def _prepare_summary() -> None:
    """What a summary needs after loading: the analysis and findings modules, the default rules."""
    from .. import findings  # noqa: F401
    from ..analysis import cross_rank, device, gpu_metrics, summary  # noqa: F401
    from ..classify.rules import default_rules

    default_rules()




def whatif(traces_or_paths: Trace | PathLike | Sequence[Trace | PathLike], *, scale: Sequence[str] = (),
           comm: str | None = None, graphs: bool = False, rank_like_median: int | None = None,
           fuse: Sequence[str] = (), unprofiled: bool = False, **options: Any) -> WhatIfResult:
    """``ta.whatif(...)``: the run's dependency graph replayed with the changes (none: the critical path and the
    no-change replay); ``options`` as :func:`summary`'s. Bad change texts and a rank the run lacks are
    :class:`BadInputError`. Method: docs/METHOD_WHATIF_SIM.md."""
    from ..analysis.what_if.simulate import parse_changes

    first = traces_or_paths if isinstance(traces_or_paths, (str, Path, Trace)) else \
        next(iter(traces_or_paths), None)
    where = first.path if isinstance(first, Trace) else first
    try:
        changes = parse_changes(scale=tuple(scale), comm=comm, graphs=graphs, rank_like_median=rank_like_median,
                                fuse=tuple(fuse), unprofiled=unprofiled)
    except ValueError as exc:
        raise BadInputError(None, str(exc)) from None
    options.setdefault("findings", False)
    run = summary_run(traces_or_paths, **options)
    ranks = {d.rank for d in _primary_devices(run)}
    if rank_like_median is not None and rank_like_median not in ranks:
        raise BadInputError(where, f"--rank-like-median {rank_like_median}: the run has ranks {sorted(ranks)}")
    result = replay_run(run, changes)
    if result is None:
        raise BadInputError(where, "no step with GPU activity to replay")
    return result


def _primary_devices(run: SummaryRun) -> list[DeviceSummary]:
    """The devices of the summary's first run (the one cross-rank results use)."""
    devices = run.summary.devices
    primary = set(run.summary.runs[0].paths) if run.summary.runs else {d.trace for d in devices}
    return [d for d in devices if d.trace in primary]


def replay_run(run: SummaryRun, changes: Sequence[Change] = ()) -> WhatIfResult | None:
    """The first run's dependency graph replayed with ``changes`` (none: the critical path of every step and the
    no-change replay), from a summary run that kept its traces; None when no step has GPU activity."""
    from ..analysis.what_if.dep_graph import build_graph
    from ..analysis.what_if.simulate import simulate

    devices = _primary_devices(run)
    primary = {d.trace for d in devices}
    activities = {key: state.activity for key, state in run.summary.states.items()}
    graph = build_graph([t for t in run.traces if t.path in primary], devices, run.summary.cross_rank, activities)
    return simulate(graph, list(changes)) if graph.steps else None
