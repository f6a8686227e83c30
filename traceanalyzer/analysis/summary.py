"""``summary``: every per-device breakdown, then cross-rank matching, the what-if estimate and the findings.

Map: :func:`analyze_device` per (rank, device) with kernels, per trace. Reduce: cross-rank matching and the
"if communication were free" estimate over all devices, GPU-metric and power aggregates, then the findings rules.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..api import DEFAULT_LAYER_PATTERN, check_layer_pattern
from ..trace import Trace
from .device import analyze_device
from .results import CrossRankSummary, DeviceSummary, Summary, TraceMeta, WhatIf

PathLike = str | Path


@dataclass
class SummaryOptions:
    """Options of :func:`summarize` (the ``summary`` command's flags)."""

    step_range: str | None = None  # NVTX range name marking a step (default: ProfilerStep, else detected)
    layer_pattern: str | None = DEFAULT_LAYER_PATTERN  # regex of range names marking layers
    rules: PathLike | None = None  # extra classification rules (TOML)
    gpu_log: PathLike | None = None  # nvidia-smi CSV log to align with the traces
    jobs: int = 1  # worker processes for loading
    findings: bool = True  # run the findings rules
    extra: dict[str, Any] = field(default_factory=dict)


def _optional(module: str, attr: str) -> Callable[..., Any] | None:
    """A function of an optional sibling module, or None when the module is not part of this install."""
    name = f"{__package__.rsplit('.', 1)[0]}.{module}"
    if importlib.util.find_spec(name) is None:
        return None
    fn: Callable[..., Any] = getattr(importlib.import_module(name), attr)
    return fn


def device_pairs(trace: Trace) -> list[tuple[int, int]]:
    """The (rank, device) pairs that have kernels, sorted."""
    k = trace.kernels
    if len(k) == 0:
        return []
    rank, device = k["rank"], k["device"]
    ranks = np.unique(rank)
    if len(ranks) == 1:  # the usual case (one file, one rank): no row-wise unique over all kernels
        return [(int(ranks[0]), int(d)) for d in np.unique(device)]
    return [(int(r), int(d)) for r in ranks for d in np.unique(device[rank == r])]


def trace_meta(trace: Trace) -> TraceMeta:
    """Header facts of a trace (formats, versions, ranks, devices, activity window); no environment data."""
    k, m = trace.kernels, trace.memops
    starts = np.r_[k["start_ns"], m["start_ns"]]
    ends = np.r_[k["end_ns"], m["end_ns"]]
    window = (int(starts.min()), int(ends.max())) if len(starts) else None
    devices = [{"device": d.device, "name": d.name, "rank": d.rank, "sm_count": d.sm_count,
                "compute_capability": d.compute_capability} for d in trace.devices]
    ranks = sorted({r for r, _ in device_pairs(trace)})
    return TraceMeta(path=str(trace.path), format=trace.format, tool_version=trace.tool_version,
                     schema_version=trace.schema_version, ranks=ranks, devices=devices, window_ns=window,
                     warnings=list(trace.warnings))


def _gpu_metrics(traces: list[Trace]) -> pd.DataFrame | None:
    aggregate = _optional("analysis.gpu_metrics", "aggregate_gpu_metrics")
    if aggregate is None:
        return None
    frames = [aggregate(t).assign(trace=str(t.path)) for t in traces if len(t.gpu_metrics)]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else None


def _power(traces: list[Trace], devices: list[DeviceSummary], gpu_log: PathLike) -> dict[str, Any] | None:
    read = _optional("analysis.power", "read_power_log")
    during = _optional("analysis.power", "power_during")
    if read is None or during is None:
        return None
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
    result: dict[str, Any] = during(read(gpu_log), windows)
    return result


def _classified(trace: Trace, rules: PathLike | None) -> Trace:
    """The trace itself when it already has class columns, else classified (e.g. ``ta.load(classify=False)``)."""
    if "bucket_id" in trace.kernels:
        return trace
    from ..api import classified

    return classified(trace, rules)


def summarize(traces: Trace | Sequence[Trace], options: SummaryOptions | None = None, **kwargs: Any) -> Summary:
    """The whole ``summary`` of already loaded (classified) traces: one :class:`DeviceSummary` per (rank, device)
    with kernels, cross-rank matching, the what-if estimate and findings. ``kwargs`` set SummaryOptions fields."""
    opts = options or SummaryOptions(**kwargs)
    check_layer_pattern(opts.layer_pattern)
    trace_list = [_classified(t, opts.rules) for t in ([traces] if isinstance(traces, Trace) else traces)]
    metas = [trace_meta(t) for t in trace_list]
    devices = [analyze_device(t, rank, device, options=opts)
               for t in trace_list for rank, device in device_pairs(t)]
    cross_fn = _optional("analysis.cross_rank", "analyze_cross_rank")
    cross: CrossRankSummary | None = cross_fn(trace_list, devices) if cross_fn else None
    what_if_fn = _optional("analysis.what_if", "estimate_comm_free")
    what_if = what_if_fn(trace_list, devices, cross) if what_if_fn else \
        WhatIf(None, "gpu_transfer", {"reason": "not computed"})
    warnings = [_named(t.path, w) for t in trace_list for w in t.warnings]
    warnings += [_named(d.trace, w) for d in devices for w in d.extra.get("warnings", [])]
    result = Summary(traces=metas, devices=devices, cross_rank=cross, what_if=what_if, warnings=warnings,
                     gpu_metrics=_gpu_metrics(trace_list))
    if opts.gpu_log is not None:
        result.power = _power(trace_list, devices, opts.gpu_log)
    findings_fn = _optional("findings", "run_findings") if opts.findings else None
    if findings_fn is not None:
        result.findings = findings_fn(trace_list, result, opts)
    return result


def _named(path: PathLike, warning: str) -> str:
    """The warning prefixed by its file's name, unless a loader already put the name first."""
    name = Path(path).name
    return warning if warning.startswith(f"{name}:") else f"{name}: {warning}"


def summary(traces_or_paths: Trace | PathLike | Sequence[Trace | PathLike], **options: Any) -> Summary:
    """``ta.summary(...)``: summarize loaded Traces, or trace files / directories (loaded and classified first).

    ``options`` are SummaryOptions fields (``step_range``, ``layer_pattern``, ``rules``, ``gpu_log``, ``jobs``…)
    and, for paths, ``window`` (``"START:END"`` seconds from the capture start).
    """
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
    from ..api import summarize_paths

    result: Summary = summarize_paths([p for p in items if isinstance(p, (str, Path))], **options)
    return result
