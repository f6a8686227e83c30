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

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .analysis.layer_pattern import DEFAULT_LAYER_PATTERN, check_layer_pattern
from .api import classified, load_files, load_many, require_kernels
from .errors import BadInputError
from .loaders import KINETO, SUMMARY_TABLES, ProgressFn, detect_format, expand_paths
from .trace import Trace

if TYPE_CHECKING:
    import pandas as pd

    from .analysis.hta_compat import HtaCompatResult
    from .analysis.results import DeviceSummary, Summary
    from .analysis.summary import SummaryOptions

PathLike = str | Path


def summarize(traces: Trace | Sequence[Trace], options: SummaryOptions | None = None, **kwargs: Any) -> Summary:
    """The whole ``summary`` of already loaded (classified) traces: one :class:`DeviceSummary` per (rank, device)
    with kernels, cross-rank matching, the what-if estimate and findings. ``kwargs`` set SummaryOptions fields."""
    from .analysis.cross_rank import analyze_cross_rank
    from .analysis.device import analyze_device
    from .analysis.results import Summary
    from .analysis.runs import group_runs, run_warnings
    from .analysis.summary import SummaryOptions, device_pairs, trace_meta
    from .analysis.what_if import estimate_comm_free

    opts = options or SummaryOptions(**kwargs)
    check_layer_pattern(opts.layer_pattern)
    trace_list = [_classified(t, opts.rules) for t in ([traces] if isinstance(traces, Trace) else traces)]
    metas = [trace_meta(t) for t in trace_list]
    devices = [analyze_device(t, rank, device, options=opts)
               for t in trace_list for rank, device in device_pairs(t)]
    # cross-rank claims only between rank files of one run (analysis.runs): the primary run
    runs = group_runs(trace_list, devices)
    primary = set(runs[0].paths) if runs else set()
    run_traces = [t for t in trace_list if str(t.path) in primary]
    run_devices = [d for d in devices if d.trace in primary]
    cross = analyze_cross_rank(run_traces, run_devices)
    if cross is not None and runs:
        cross.extra.update({"partial": runs[0].ranks_missing > 0, "ranks_missing": runs[0].ranks_missing,
                            "world_size": runs[0].world_size})
    what_if = estimate_comm_free(run_traces, run_devices, cross)  # reads cross.extra["partial"]
    warnings = [_named(t.path, w) for t in trace_list for w in t.warnings]
    warnings += [_named(d.trace, w) for d in devices for w in d.extra.get("warnings", [])]
    warnings += run_warnings(runs)
    result = Summary(traces=metas, devices=devices, cross_rank=cross, what_if=what_if, warnings=warnings,
                     gpu_metrics=_gpu_metrics(trace_list),
                     extra={"runs": [r.to_json() for r in runs],
                            "ranks_missing": sum(r.ranks_missing for r in runs)})
    if opts.gpu_log is not None:
        result.power = _power(trace_list, devices, opts.gpu_log)
    if opts.findings:
        from .findings import run_findings

        result.findings = run_findings(trace_list, result, opts)
    return result


def summary(traces_or_paths: Trace | PathLike | Sequence[Trace | PathLike], **options: Any) -> Summary:
    """``ta.summary(...)``: summarize loaded Traces, or trace files / directories (loaded and classified first).

    ``options`` are SummaryOptions fields (``step_range``, ``layer_pattern``, ``rules``, ``gpu_log``, ``jobs``…)
    and, for paths, ``window`` (``"START:END"`` seconds from the capture start).
    """
    from .analysis.summary import SummaryOptions

    items = list(traces_or_paths) if isinstance(traces_or_paths, (list, tuple)) else [traces_or_paths]
    traces = [t for t in items if isinstance(t, Trace)]
    if items and len(traces) == len(items):
        return summarize(traces, SummaryOptions(**options))
    if traces:
        raise TypeError("pass either Trace objects or paths, not both")
    fields = set(SummaryOptions.__dataclass_fields__)
    unknown = set(options) - fields - {"progress", "window"}
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    return summarize_paths([p for p in items if isinstance(p, (str, Path))], **options)


def summarize_paths(paths: Sequence[PathLike], *, rules: PathLike | None = None, jobs: int = 1,
                    step_range: str | None = None, layer_pattern: str | None = DEFAULT_LAYER_PATTERN,
                    gpu_log: PathLike | None = None, findings: bool = True, extra: dict[str, Any] | None = None,
                    progress: ProgressFn | None = None, window: str | None = None) -> Summary:
    """Load trace files (or directories of rank traces) and summarize them: the ``summary`` and ``report``
    commands and ``ta.summary(paths)``. The keywords are ``analysis.summary.SummaryOptions`` fields.

    Errors as :func:`load_for_summary`.
    """
    traces = load_for_summary(paths, rules=rules, jobs=jobs, layer_pattern=layer_pattern, progress=progress,
                              window=window)
    from .analysis.summary import SummaryOptions

    return summarize(traces, SummaryOptions(step_range=step_range, layer_pattern=layer_pattern, rules=rules,
                                            gpu_log=gpu_log, jobs=jobs, findings=findings, extra=extra or {}))


def load_for_summary(paths: Sequence[PathLike], *, rules: PathLike | None = None, jobs: int = 1,
                     layer_pattern: str | None = DEFAULT_LAYER_PATTERN,
                     progress: ProgressFn | None = None, window: str | None = None) -> list[Trace]:
    """``api.load_many`` before a summary: the layer pattern checked first, :class:`EmptyTraceError` when no file
    has kernels, and the analysis modules imported while a forked helper decodes part of a big Kineto file."""
    from .loaders.beside import meanwhile

    check_layer_pattern(layer_pattern)
    with meanwhile(_prepare_summary):
        traces = load_many(list(paths), rules=rules, jobs=jobs, progress=progress, window=window,
                           tables=SUMMARY_TABLES)
    require_kernels(traces, paths)
    return traces


def hta_compat(paths: Sequence[PathLike], progress: ProgressFn | None = None, jobs: int = 1) -> HtaCompatResult:
    """``summary --hta-compat``: load Kineto rank traces (files or directories; ``jobs`` worker processes when
    > 1; only the tables HTA's numbers read) and compute HTA's temporal breakdown and overlap per rank."""
    from .analysis.hta_compat import HTA_TABLES, hta_compat_traces

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
    from . import findings  # noqa: F401
    from .analysis import cross_rank, device, gpu_metrics, summary, what_if  # noqa: F401
    from .classify.rules import default_rules

    default_rules()


def _classified(trace: Trace, rules: PathLike | None) -> Trace:
    """The trace itself when it already has class columns, else classified (e.g. ``ta.load(classify=False)``)."""
    if "bucket_id" in trace.kernels:
        return trace
    return classified(trace, rules)


def _gpu_metrics(traces: list[Trace]) -> pd.DataFrame | None:
    import pandas as pd

    from .analysis.gpu_metrics import aggregate_gpu_metrics

    frames = [aggregate_gpu_metrics(t).assign(trace=str(t.path)) for t in traces if len(t.gpu_metrics)]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else None


def _power(traces: list[Trace], devices: list[DeviceSummary], gpu_log: PathLike) -> dict[str, Any] | None:
    """The nvidia-smi log read and aligned with each GPU's activity window (UTC), or why it could not be."""
    from .analysis.power import power_during
    from .loaders.power_log import read_power_log

    windows: dict[int, tuple[int, int]] = {}
    base = {str(t.path): t.base_time_ns for t in traces}
    for dev in devices:
        origin = base.get(dev.trace)
        lo, hi = dev.extra.get("window_ns", (0, 0))
        if origin is None or hi <= lo:
            continue
        old = windows.get(dev.device)
        span = (lo + origin, hi + origin)
        windows[dev.device] = span if old is None else (min(old[0], span[0]), max(old[1], span[1]))
    if not windows:
        return {"log": Path(gpu_log).name, "matched": False, "reason": "traces carry no UTC clock origin",
                "gpus": []}
    return power_during(read_power_log(gpu_log), windows)


def _named(path: PathLike, warning: str) -> str:
    """The warning prefixed by its file's name, unless a loader already put the name first."""
    name = Path(path).name
    return warning if warning.startswith(f"{name}:") else f"{name}: {warning}"
