"""A summary as map and reduce, for every engine: :func:`analyze_trace` maps one classified trace to its
:class:`TracePart` where the trace is (this process, a loader worker, a Dask worker); :func:`reduce_parts` turns the
parts into the :class:`~traceanalyzer.analysis.results.Summary`: run identity, cross-rank matching, GPU metrics and
power, and — through :class:`TraceWork`, since they read the traces again — the what-if and the findings.

:class:`LocalTraceWork` does that work on traces held in this process
(:func:`traceanalyzer.pipeline.summarize.summarize`);
:mod:`traceanalyzer.pipeline.dask_engine` where each trace lives on a Dask worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..model.trace import PathLike, Table, Trace, TraceHeader
from .loading import classified

if TYPE_CHECKING:
    import pandas as pd

    from ..analysis.device import DeviceKey, DeviceState
    from ..analysis.results import CrossRankSummary, DeviceSummary, Finding, Summary, TraceMeta, WhatIf
    from ..analysis.summary import SummaryOptions


@dataclass
class TracePart:
    """One trace file's share of a summary, computed where the trace is (:func:`analyze_trace`): its header,
    meta, per-device summaries, GPU-metric aggregates and warnings, and each device's working state. :meth:`compact`
    drops what only later work on the same trace reads (the states), so it can travel to a driver that never holds
    a trace."""

    header: TraceHeader
    meta: TraceMeta
    devices: list[DeviceSummary]
    gpu_metrics: pd.DataFrame | None
    warnings: list[str]
    platform: Any = None  # analysis.platform.TracePlatform: the GPUs, kernel families, communication paths
    states: list[DeviceState] = field(default_factory=list)  # each device's (``analysis.device.DeviceWork``)

    def compact(self) -> TracePart:
        return replace(self, states=[])

    def device_states(self) -> dict[DeviceKey, DeviceState]:
        """Each device's working state by (trace path, rank, device); none in a compact part."""
        return {(d.trace, d.rank, d.device): state for d, state in zip(self.devices, self.states, strict=False)}


#: Tables only the map step reads (an nsys export's every API call start, counted per step with each device's
#: analysis: ``DeviceState.host_events``).
MAP_ONLY_TABLES = ("api_starts", "api_start_blocks")


def analyze_trace(trace: Trace, options: SummaryOptions, *, release: bool = False) -> TracePart:
    """The map step of a summary: one classified trace's devices analysed (``analysis.device``), its header and
    meta, its GPU-metric aggregates. ``release``: then empty the trace's :data:`MAP_ONLY_TABLES` (a trace the
    summary loaded itself and reads again only for the reduce)."""
    from ..analysis.device import device_work
    from ..analysis.gpu_metrics import aggregate_gpu_metrics
    from ..analysis.platform import trace_platform
    from ..analysis.summary import device_pairs, trace_meta

    pairs = device_pairs(trace)
    works = []
    for i, (rank, device) in enumerate(pairs):
        works.append(device_work(trace, rank, device, options=options))
        if release and len(trace.api_starts) and all(r != rank for r, _ in pairs[i + 1:]):
            _release_starts(trace, rank)  # the rank's last device: its calls' starts were counted
    metrics = aggregate_gpu_metrics(trace).assign(trace=str(trace.path)) if len(trace.gpu_metrics) else None
    if release:
        _release_starts(trace, None)
    return TracePart(header=trace.header(), meta=trace_meta(trace), devices=[w.summary for w in works],
                     gpu_metrics=metrics if metrics is not None and len(metrics) else None,
                     warnings=list(trace.warnings), platform=trace_platform(trace),
                     states=[w.state for w in works])


def _release_starts(trace: Trace, rank: int | None) -> None:
    """Let go of the API call starts (:data:`MAP_ONLY_TABLES`) of ``rank``, or of every rank with ``None``."""
    from ..model.call_starts import without_rank

    if not any(len(trace.tables[name]) for name in MAP_ONLY_TABLES if name in trace.tables):
        return
    if rank is None:
        for name in MAP_ONLY_TABLES:
            trace.tables[name] = Table.empty(name)
        trace.call_starts_released = "all"
    else:
        blocks, offsets = without_rank(trace.tables["api_start_blocks"], trace.api_starts["offset_ns"], rank)
        trace.tables["api_start_blocks"] = Table("api_start_blocks", blocks)
        trace.tables["api_starts"] = Table("api_starts", {"offset_ns": offsets})
        if trace.call_starts_released != "all":
            trace.call_starts_released = (*trace.call_starts_released, int(rank))


class TraceWork(Protocol):
    """What a summary's reduce asks of the place where the traces are, once cross-rank matching is done."""

    #: the devices' working state the Summary keeps (``Summary.states``): none where the traces are elsewhere
    states: dict[DeviceKey, DeviceState]

    def comm_free(self, run_paths: set[str], run_devices: list[DeviceSummary], cross: CrossRankSummary | None,
                  with_range: bool) -> WhatIf:
        """The "if communication were free" estimate of the primary run (``analysis.what_if``); its range too
        with ``with_range``."""

    def findings(self, result: Summary, options: SummaryOptions) -> list[Finding]:
        """The findings rules over the summary and the traces' evidence (``findings``)."""


class LocalTraceWork:
    """:class:`TraceWork` over traces held in this process, with their devices' working state (``states``: from
    the map step's parts)."""

    def __init__(self, traces: list[Trace], states: dict[DeviceKey, DeviceState] | None = None) -> None:
        self.traces = traces
        self.states = states or {}

    def comm_free(self, run_paths: set[str], run_devices: list[DeviceSummary], cross: CrossRankSummary | None,
                  with_range: bool) -> WhatIf:
        from ..analysis.what_if.comm_free import estimate_comm_free

        return estimate_comm_free([t for t in self.traces if str(t.path) in run_paths], run_devices, cross,
                                  with_range=with_range, states=self.states)

    def findings(self, result: Summary, options: SummaryOptions) -> list[Finding]:
        from ..findings import run_findings

        return run_findings(self.traces, result, options, states=self.states)


def reduce_parts(parts: list[TracePart], options: SummaryOptions, work: TraceWork) -> Summary:
    """The reduce step of a summary: run identity, cross-rank matching (primary run only), the what-if and the
    findings (through ``work``, where the traces are), GPU metrics and power, from every trace's part."""
    from ..analysis.cross_rank import analyze_cross_rank
    from ..analysis.moe import moe_summary
    from ..analysis.platform import platform_facts
    from ..analysis.results import RunCompleteness, Summary
    from ..analysis.runs import group_runs, run_warnings

    headers = [p.header for p in parts]
    devices = [d for p in parts for d in p.devices]
    # cross-rank claims only between rank files of one run (analysis.runs): the primary run
    runs = group_runs(headers, devices)
    primary = set(runs[0].paths) if runs else set()
    run_devices = [d for d in devices if d.trace in primary]
    cross = analyze_cross_rank([h for h in headers if h.path in primary], run_devices)
    if cross is not None and runs:
        cross.completeness = RunCompleteness(ranks_missing=runs[0].ranks_missing, world_size=runs[0].world_size)
    # reads cross.completeness
    what_if = work.comm_free(primary, run_devices, cross, "what_if_range" not in options.skip)
    warnings = [_named(p.header.path, w) for p in parts for w in p.warnings]
    warnings += [_named(d.trace, w) for d in devices for w in d.warnings]
    warnings += run_warnings(runs)
    frames = [p.gpu_metrics for p in parts if p.gpu_metrics is not None]
    result = Summary(traces=[p.meta for p in parts], devices=devices, cross_rank=cross, what_if=what_if,
                     warnings=warnings, gpu_metrics=_concat(frames), states=work.states, runs=list(runs))
    result.platform = platform_facts([p.platform for p in parts if p.platform is not None], cross, devices)
    result.moe = moe_summary([d.moe for d in devices if d.moe is not None], {d.rank for d in run_devices})
    if options.gpu_log is not None:
        result.power = _power(headers, devices, options.gpu_log, options.gpu_log_utc_offset_s, options.gpu_log_tz)
        if result.power and result.power.get("warning"):
            result.warnings.append(result.power["warning"])
    if options.findings:
        result.findings = work.findings(result, options)
    return result


def classified_once(trace: Trace, rules: PathLike | None) -> Trace:
    """The trace itself when it already has class columns, else classified (e.g. ``ta.load(classify=False)``)."""
    if "bucket_id" in trace.kernels:
        return trace
    return classified(trace, rules)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame | None:
    import pandas as pd

    return pd.concat(frames, ignore_index=True) if frames else None


def _power(traces: Sequence[Trace | TraceHeader], devices: list[DeviceSummary],
           gpu_log: PathLike, utc_offset_s: int | None = None, zone: str | None = None) -> dict[str, Any] | None:
    """The nvidia-smi log read and aligned with each GPU's activity window (UTC), or why it could not be; the log's
    time zone given (``utc_offset_s``, or ``zone``: ``--gpu-log-tz``) or detected
    (``analysis.power.power_aligned``)."""
    from ..analysis.power import power_aligned, zone_offset_s
    from ..loaders.power_log import read_power_log
    from ..model.errors import BadInputError

    windows: dict[int, tuple[int, int]] = {}
    base = {str(t.path): t.base_time_ns for t in traces}
    for dev in devices:
        origin = base.get(dev.trace)
        lo, hi = dev.figures.window_ns if dev.figures is not None else (0, 0)
        if origin is None or hi <= lo:
            continue
        old = windows.get(dev.device)
        span = (lo + origin, hi + origin)
        windows[dev.device] = span if old is None else (min(old[0], span[0]), max(old[1], span[1]))
    if not windows:
        return {"log": Path(gpu_log).name, "matched": False, "reason": "traces carry no UTC clock origin",
                "gpus": [], "warning": f"{Path(gpu_log).name}: the traces carry no UTC clock origin: the power log "
                                       "cannot be aligned"}
    names = {d.device: d.name for d in devices}
    log = read_power_log(gpu_log)
    if zone is not None and utc_offset_s is None and len(log.samples):
        try:
            utc_offset_s = zone_offset_s(zone, int(log.samples["utc_ns"].iloc[0]))
        except ValueError as exc:
            raise BadInputError(None, f"--gpu-log-tz: {exc}") from None
    return power_aligned(log, windows, utc_offset_s, names)


def _named(path: PathLike, warning: str) -> str:
    """The warning prefixed by its file's name, unless a loader already put the name first."""
    name = Path(path).name
    return warning if warning.startswith(f"{name}:") else f"{name}: {warning}"
