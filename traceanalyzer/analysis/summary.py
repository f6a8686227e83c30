"""What a ``summary`` is made of besides the per-device numbers: its options, the (rank, device) pairs of a
trace and a trace's header facts. The summary itself is assembled by :mod:`traceanalyzer.pipeline.summarize`."""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import Any

import numpy as np

from ..model.errors import BadInputError
from ..model.trace import PathLike, Trace
from .results import TraceMeta
from .structure.layer_pattern import DEFAULT_LAYER_PATTERN

#: Parts of a summary that ``SummaryOptions.skip`` leaves out (left empty in the result): the whole-window and
#: in-step top-kernel tables (``top_kernels``, ``top_kernels_in_steps``), the in-step headline numbers
#: (``in_steps``), the whole-window exclusive bucket split (``bucket_exclusive``: ``bucket_exclusive_ns``), the
#: exposed-communication segments (``comm_idle_gaps_ns``) and the what-if's range and confidence
#: (``what_if_range``: ``what_if.details`` ``range_ns``, ``range_basis``, ``confidence`` unless the run is partial,
#: ``profiler_weighed_steps``). No findings rule reads any of them. ``finding_evidence``: the findings' evidence
#: figures no finding's id, title or impact reads (the fusion rules' per-chain medians and per-step totals, their
#: steps and following kernels) are left out of ``Finding.evidence``. ``layer_numbers``: the per-layer table
#: (``per_layer``) keeps its layers and their steps and windows but leaves out their times (``comm_ns``,
#: ``comm_exposed_ns``, ``compute_ns``). ``moe``: the MoE layers (``Summary.moe``, docs/MOE.md; the MoE findings
#: then stay silent).
EXTRA_OPTIONS = ("finding_thresholds", "disabled_findings", "gpu_log_tz", "gpu_log_utc_offset_s")
SKIPPABLE = frozenset({"top_kernels", "in_steps", "bucket_exclusive", "comm_idle_gaps", "what_if_range",
                       "finding_evidence", "layer_numbers", "moe"})


@dataclass
class SummaryOptions:
    """Options of :func:`traceanalyzer.pipeline.summarize.summarize` (the ``summary`` command's flags)."""

    step_range: str | None = None  # NVTX range name marking a step (default: ProfilerStep, else detected)
    layer_pattern: str | None = DEFAULT_LAYER_PATTERN  # regex of range names marking layers
    rules: PathLike | None = None  # extra classification rules (TOML)
    gpu_log: PathLike | None = None  # nvidia-smi CSV log to align with the traces
    jobs: int = 1  # worker processes for loading
    findings: bool = True  # run the findings rules
    skip: frozenset[str] = frozenset()  # parts of SKIPPABLE left out (a diff's summaries skip all of them)
    finding_thresholds: Any = None  # a findings.FindingThresholds; None: the defaults
    disabled_findings: frozenset[str] = frozenset()  # finding ids not to run
    gpu_log_tz: str | None = None  # the zone --gpu-log timestamps are written in (None: UTC unless the log says)
    gpu_log_utc_offset_s: int | None = None  # the same as a fixed offset from UTC, in seconds
    #: ``ta.summary(extra={...})``: the four fields above by name (any other key is an error)
    extra: InitVar[dict[str, Any] | None] = None

    def __post_init__(self, extra: dict[str, Any] | None) -> None:
        for key, value in (extra or {}).items():
            if key not in EXTRA_OPTIONS:
                raise BadInputError(None, f"unknown extra option {key!r}", f"one of {', '.join(EXTRA_OPTIONS)}")
            setattr(self, key, value)
        self.skip = frozenset(self.skip)
        self.disabled_findings = frozenset(self.disabled_findings)
        unknown = self.skip - SKIPPABLE
        if unknown:
            raise ValueError(f"unknown summary part(s) to skip: {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(SKIPPABLE))})")


def device_pairs(trace: Trace) -> list[tuple[int, int]]:
    """The (rank, device) pairs that have kernels, sorted."""
    from .grouped import distinct

    k = trace.kernels
    if len(k) == 0:
        return []
    rank, device = k["rank"], k["device"]
    ranks = distinct(rank)
    if len(ranks) == 1:  # the usual case (one file, one rank): no row-wise unique over all kernels
        return [(int(ranks[0]), int(d)) for d in distinct(device)]
    return [(int(r), int(d)) for r in ranks for d in distinct(device[rank == r])]


def trace_meta(trace: Trace) -> TraceMeta:
    """Header facts of a trace (formats, versions, ranks, devices, activity window); no environment data."""
    k, m = trace.kernels, trace.memops
    starts = np.concatenate((k["start_ns"], m["start_ns"]))
    ends = np.concatenate((k["end_ns"], m["end_ns"]))
    window = (int(starts.min()), int(ends.max())) if len(starts) else None
    devices = [{"device": d.device, "name": d.name, "rank": d.rank, "sm_count": d.sm_count,
                "compute_capability": d.compute_capability} for d in trace.devices]
    ranks = sorted({r for r, _ in device_pairs(trace)})
    return TraceMeta(path=str(trace.path), format=trace.format, tool_version=trace.tool_version,
                     schema_version=trace.schema_version, ranks=ranks, devices=devices, window_ns=window,
                     warnings=list(trace.warnings))
