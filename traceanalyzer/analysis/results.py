"""Typed results of the analyses: the one contract between analyses, findings and renderers.

Analyses fill these objects with exact integer-ns numbers and DataFrames; renderers (terminal, JSON, HTML)
format them. ``Summary.to_json()`` is the stable ``summary --json`` contract of docs/ARCHITECTURE.md: fields may
be added, never renamed or dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from .device import DeviceKey, DeviceState
    from .moe import DeviceMoe, MoeSummary
    from .runs import Run

JSON_SCHEMA_VERSION = "1.0"


def _empty_df() -> pd.DataFrame:
    return pd.DataFrame()


@dataclass
class TraceMeta:
    """Header facts of one input file (never environment or credential data)."""

    path: str
    format: str
    tool_version: str | None
    schema_version: str | None
    ranks: list[int]
    devices: list[dict[str, Any]]
    window_ns: tuple[int, int] | None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "tool_version": self.tool_version,
                "schema_version": self.schema_version, "ranks": self.ranks, "devices": self.devices,
                "window_ns": list(self.window_ns) if self.window_ns else None, "warnings": self.warnings}


@dataclass(frozen=True)
class DeviceFigures:
    """The rest of a (rank, device)'s figures, at the end of its ``summary --json`` entry (in this order)."""

    exclusive_precedence: tuple[str, ...]  # the buckets in the order the exclusive split claims time
    comm_on_compute_stream_pct: float | None  # communication time on a stream that also runs compute
    kernels: int
    memops: int
    window_ns: tuple[int, int]  # first start and last end of the device's activity
    layers: int  # layer instances found
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"exclusive_precedence": list(self.exclusive_precedence),
                "comm_on_compute_stream_pct": self.comm_on_compute_stream_pct, "kernels": self.kernels,
                "memops": self.memops, "window_ns": list(self.window_ns), "layers": self.layers,
                "warnings": list(self.warnings)}


@dataclass
class DeviceSummary:
    """Time breakdown of one (rank, device). All times integer ns, intervals half-open."""

    rank: int
    device: int
    name: str | None
    trace: str
    span_ns: int
    busy_ns: int
    idle_ns: int
    bucket_ns: dict[str, int]  # union of each bucket's intervals
    bucket_exclusive_ns: dict[str, int]  # busy split by precedence, parts add up to busy_ns
    comm_ns: int
    comm_hidden_ns: int
    comm_exposed_ns: int  # = SM-idle during collectives
    overlap_pct: float | None  # hidden / comm * 100, None when comm_ns == 0
    steps: int
    step_ns_median: int | None
    comm_exposed_per_step_ns: int | None
    step_source: str = "none"  # profiler_step | nvtx:<name> | idle_gaps | kernel_period | none
    layer_source: str = "none"  # nvtx:<pattern> | collective_period | none
    step_confidence: str = "low"  # high (marked by the program) | medium | low (detected, by evidence strength)
    step_evidence: dict[str, Any] = field(default_factory=dict)  # how the steps were found
    layers_per_step: int = 0  # median layers in a step, 0 without layer evidence
    comm_streams: list[int] = field(default_factory=list)
    compute_streams: list[int] = field(default_factory=list)
    comm_serialized_with_compute: bool = False  # comm kernels share a stream with compute kernels
    per_step: pd.DataFrame = field(default_factory=_empty_df)
    per_layer: pd.DataFrame = field(default_factory=_empty_df)
    collectives: pd.DataFrame = field(default_factory=_empty_df)
    top_kernels: pd.DataFrame = field(default_factory=_empty_df)  # whole window
    top_kernels_in_steps: pd.DataFrame = field(default_factory=_empty_df)  # kernels starting inside a step
    # the headline numbers over the step windows only: window_ns, busy_ns, idle_ns, busy_pct, bucket_exclusive_ns
    in_steps: dict[str, Any] = field(default_factory=dict)
    comm_idle_gaps_ns: pd.DataFrame = field(default_factory=_empty_df)  # exposed comm segments
    figures: DeviceFigures | None = None  # None in hand-built summaries (tests)
    # the device's MoE layers, None without MoE work; in JSON through Summary.moe
    moe: DeviceMoe | None = field(default=None, repr=False, compare=False)

    # the figures' JSON names as attributes (notebooks read them), with their values when ``figures`` is None
    @property
    def kernels(self) -> int:
        """Number of kernels on the device (JSON ``kernels``)."""
        return self.figures.kernels if self.figures is not None else 0

    @property
    def memops(self) -> int:
        """Number of memory operations on the device (JSON ``memops``)."""
        return self.figures.memops if self.figures is not None else 0

    @property
    def layers(self) -> int:
        """Number of layer instances found (JSON ``layers``; the table is ``per_layer``)."""
        return self.figures.layers if self.figures is not None else 0

    @property
    def window_ns(self) -> tuple[int, int]:
        """First start and last end of the device's activity, ns (JSON ``window_ns``)."""
        lo, hi = self.figures.window_ns if self.figures is not None else (0, self.span_ns)
        return int(lo), int(hi)

    @property
    def warnings(self) -> list[str]:
        """Warnings about this device's analysis (JSON ``warnings``)."""
        return list(self.figures.warnings) if self.figures is not None else []

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "device": self.device, "name": self.name, "trace": self.trace,
            "span_ns": self.span_ns, "busy_ns": self.busy_ns, "idle_ns": self.idle_ns,
            "bucket_ns": self.bucket_ns, "bucket_exclusive_ns": self.bucket_exclusive_ns,
            "comm_ns": self.comm_ns, "comm_hidden_ns": self.comm_hidden_ns,
            "comm_exposed_ns": self.comm_exposed_ns, "overlap_pct": self.overlap_pct,
            "steps": self.steps, "step_ns_median": self.step_ns_median,
            "comm_exposed_per_step_ns": self.comm_exposed_per_step_ns,
            "step_source": self.step_source, "layer_source": self.layer_source,
            "step_confidence": self.step_confidence, "step_evidence": self.step_evidence,
            "layers_per_step": self.layers_per_step, "in_steps": self.in_steps,
            "comm_streams": self.comm_streams, "compute_streams": self.compute_streams,
            "comm_serialized_with_compute": self.comm_serialized_with_compute,
            **(self.figures.to_json() if self.figures is not None else {}),
        }


def rank_column(name: str, rank: int) -> str:
    """The column of ``CrossRankSummary.per_collective`` that holds one rank's ``name`` (``start_ns_r0``,
    ``wait_ns_r1``…)."""
    return f"{name}_r{rank}"


@dataclass(frozen=True, eq=False)
class RankMatches:
    """One rank's figures in the collective instances matched across ranks (``CrossRankSummary.per_collective``),
    in table order, as int64 arrays: the rank's start, the transfer (the shortest rank's duration) and the rank's
    wait (its duration minus the transfer)."""

    start_ns: np.ndarray
    transfer_ns: np.ndarray
    wait_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ns)

    def first_per_start(self) -> RankMatches:
        """The first matched instance of each distinct start of the rank, in table order."""
        first = np.sort(np.unique(self.start_ns, return_index=True)[1])
        return RankMatches(self.start_ns[first], self.transfer_ns[first], self.wait_ns[first])

    @cached_property
    def _by_start(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        starts, first = np.unique(self.start_ns, return_index=True)
        return starts, self.transfer_ns[first], self.wait_ns[first]

    def lookup(self, start_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For instances of this rank starting at ``start_ns``: whether a matched instance starts there (the first
        one in table order counts), and its transfer and wait (0 where none does)."""
        starts, transfer, wait = self._by_start
        start_ns = np.asarray(start_ns, dtype=np.int64)
        if not len(starts) or not len(start_ns):
            none = np.zeros(len(start_ns), dtype=np.int64)
            return np.zeros(len(start_ns), dtype=bool), none, none.copy()
        pos = np.minimum(np.searchsorted(starts, start_ns), len(starts) - 1)
        hit = starts[pos] == start_ns
        return hit, np.where(hit, transfer[pos], 0), np.where(hit, wait[pos], 0)


@dataclass(frozen=True)
class RunCompleteness:
    """Whether the matched ranks are the whole job (from run identity, :mod:`.runs`): ``partial`` when
    ``ranks_missing`` of its ``world_size`` ranks are not in the traces."""

    ranks_missing: int
    world_size: int | None

    @property
    def partial(self) -> bool:
        return self.ranks_missing > 0

    def to_json(self) -> dict[str, Any]:
        return {"partial": self.partial, "ranks_missing": self.ranks_missing, "world_size": self.world_size}


@dataclass(frozen=True)
class CrossRankDetail:
    """The cross-rank match's figures beyond the headline (JSON: the keys after ``match_method``, in this order;
    the clock evidence only where the ranks' clocks are comparable)."""

    ranks: list[int]  # the matched ranks, in match order
    wait_ns_per_step_by_rank: dict[int, int]  # median over steps of each rank's summed wait
    transfer_ns_total: int
    steps_matched: int
    straggler_by_arrival: int | None  # the rank arriving last most often (comparable clocks only)
    straggler_by_least_wait: int | None  # the rank that waited least (per-step medians, else the whole window)
    least_wait_counts: dict[int, int]  # instances in which each rank waited least
    clock_comparable: bool
    clock_note: str
    arrival_skew_ns_median: int | None
    algbw_gbps_median: float | None
    busbw_gbps_median: float | None
    unmatched_by_rank: dict[int, int]  # each rank's collectives left out of the match
    arrival_agrees_with_least_wait_pct: float | None = None  # clock evidence: last arriver = least waiter
    clock_offset_ns_by_rank: dict[int, int] | None = None  # clock evidence: apparent offset to the first rank

    def to_json(self) -> dict[str, Any]:
        def keyed(values: dict[int, int]) -> dict[str, int]:
            return {str(k): v for k, v in values.items()}

        out: dict[str, Any] = {
            "ranks": self.ranks, "wait_ns_per_step_by_rank": keyed(self.wait_ns_per_step_by_rank),
            "transfer_ns_total": self.transfer_ns_total, "steps_matched": self.steps_matched,
            "straggler_by_arrival": self.straggler_by_arrival, "straggler_by_least_wait": self.straggler_by_least_wait,
            "least_wait_counts": keyed(self.least_wait_counts), "clock_comparable": self.clock_comparable,
            "clock_note": self.clock_note, "arrival_skew_ns_median": self.arrival_skew_ns_median,
            "algbw_gbps_median": self.algbw_gbps_median, "busbw_gbps_median": self.busbw_gbps_median,
            "unmatched_by_rank": keyed(self.unmatched_by_rank)}
        if self.clock_offset_ns_by_rank is not None:
            out["arrival_agrees_with_least_wait_pct"] = self.arrival_agrees_with_least_wait_pct
            out["clock_offset_ns_by_rank"] = keyed(self.clock_offset_ns_by_rank)
        return out


@dataclass
class CrossRankSummary:
    """Matched collective instances across ranks: transfer (shortest rank) vs wait/skew.

    ``per_collective`` has one row per matched instance: shared columns (``kind``, ``transfer_ns``, ``bytes``,
    ``busbw_gbps``…) and per-rank ones named by :func:`rank_column`; read a rank's figures with
    :meth:`rank_matches`."""

    collectives_matched: int
    wait_ns_by_rank: dict[int, int]
    transfer_ns_per_step: int | None
    straggler_rank: int | None
    match_method: str = ""
    per_collective: pd.DataFrame = field(default_factory=_empty_df)
    detail: CrossRankDetail | None = None  # None only for a summary built by hand (tests)
    # set by the reduce once the runs are known (JSON ``partial``, ``ranks_missing``, ``world_size``)
    completeness: RunCompleteness | None = None

    def to_json(self) -> dict[str, Any]:
        return {"collectives_matched": self.collectives_matched,
                "wait_ns_by_rank": {str(k): v for k, v in self.wait_ns_by_rank.items()},
                "transfer_ns_per_step": self.transfer_ns_per_step, "straggler_rank": self.straggler_rank,
                "match_method": self.match_method, **(self.detail.to_json() if self.detail is not None else {}),
                **(self.completeness.to_json() if self.completeness is not None else {})}

    @property
    def ranks(self) -> list[int]:
        """The ranks of the match: those with a wait column in ``per_collective``, in column order."""
        prefix = rank_column("wait_ns", 0)[:-1]
        return [int(c[len(prefix):]) for c in self.per_collective.columns if str(c).startswith(prefix)]

    def rank_matches(self, rank: int) -> RankMatches | None:
        """The rank's start, transfer and wait in the matched instances; None when the rank is not in the match."""
        per = self.per_collective
        start, wait = rank_column("start_ns", rank), rank_column("wait_ns", rank)
        if start not in per or wait not in per:
            return None
        return RankMatches(per[start].to_numpy(np.int64), per["transfer_ns"].to_numpy(np.int64),
                           per[wait].to_numpy(np.int64))


@dataclass(frozen=True)
class RankEvidence:
    """What one rank's what-if reading rests on (``what_if.ranks[r]``, first keys)."""

    kernels_linked_pct: float | None  # kernels linked to the host call that launched them
    launch_bound_kernel_pct: float | None  # of the linked kernels, those the GPU waited for their launch
    comm_launch_bound_pct: float | None  # the same of the communication kernels
    host_syncs: int  # host synchronizations seen
    issue_source: str  # where the collectives' host calls were read from (the most frequent), "none"
    calls_without_kernels: int  # collective calls in steps that launched no kernel
    gpu_idle_pct: float | None = None  # median per step; with ``step_ns`` only where the device has steps
    step_ns: int | None = None  # median step

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kernels_linked_pct": self.kernels_linked_pct, "launch_bound_kernel_pct": self.launch_bound_kernel_pct,
            "comm_launch_bound_pct": self.comm_launch_bound_pct, "host_syncs": self.host_syncs,
            "issue_source": self.issue_source, "calls_without_kernels": self.calls_without_kernels}
        if self.step_ns is not None:
            out.update(gpu_idle_pct=self.gpu_idle_pct, step_ns=self.step_ns)
        return out


@dataclass(frozen=True)
class RankStepFigures:
    """One rank's what-if readings, each the median over its steps, ns (docs/METHOD_WHAT_IF.md)."""

    own_ns: int  # the rank's own communication cost: what the what-if would save on it
    exposed_ns: int
    wait_ns: int
    host_issue_ns: int  # the collective calls' host time
    host_issue_critical_ns: int  # of it, what the GPU waited for
    host_nccl_issue_ns: int  # NCCL's own issue range of each call
    issue_only_own_ns: int  # the cost counting NCCL's issue alone
    host_slowed_after_calls_ns: int
    gpu_transfer_critical_ns: int
    contention_ns: int
    dependency_latency_ns: int
    step_gap_after_comm_ns: int
    as_profiled_ns: int
    gpu_reading_ns: int
    profiler_ns: int
    idle_ns: int
    gpu_weight: float
    collectives_per_step: int
    launch_bound_collectives_per_step: float
    bound: str  # host | gpu | mixed

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class RankWhatIf:
    """One rank's share of the what-if: its evidence and, where it has collectives inside steps, its readings."""

    evidence: RankEvidence
    figures: RankStepFigures | None  # None: no collective inside a step window

    def to_json(self) -> dict[str, Any]:
        rest = self.figures.to_json() if self.figures is not None else {"note": "no collective inside a step window"}
        return {**self.evidence.to_json(), **rest}


@dataclass(frozen=True)
class WhatIfSteps:
    """Per step, the rank that sets it and what the what-if saves there."""

    limiting_rank_by_step: dict[str, int]
    saving_ns_by_step: dict[str, int]
    host_share_pct: float | None  # the host part's share of the saving
    issue_only_saving_ns: int  # the saving counting NCCL's own issue range alone

    def to_json(self) -> dict[str, Any]:
        return {"limiting_rank_by_step": self.limiting_rank_by_step, "saving_ns_by_step": self.saving_ns_by_step,
                "host_share_pct": self.host_share_pct, "issue_only_saving_ns": self.issue_only_saving_ns}


@dataclass(frozen=True)
class WhatIfRange:
    """The what-if's range, the reading each end comes from and its confidence (``analysis.what_if_range``)."""

    range_ns: tuple[int, int]
    range_basis: tuple[str, str]
    confidence: str  # high | medium | low
    profiler_weighed_steps: int

    def to_json(self) -> dict[str, Any]:
        return {"range_ns": list(self.range_ns), "range_basis": list(self.range_basis),
                "confidence": self.confidence, "profiler_weighed_steps": self.profiler_weighed_steps}


@dataclass(frozen=True)
class PartialRun:
    """Ranks of the job missing from the traces: the confidence is low."""

    ranks_missing: int
    world_size: int | None

    def to_json(self) -> dict[str, Any]:
        return {"partial": True, "ranks_missing": self.ranks_missing, "confidence": "low",
                "partial_note": f"{self.ranks_missing} of {self.world_size} ranks missing: the given ranks' "
                                "collectives include waiting for ranks not in the trace"}


@dataclass(frozen=True)
class WhatIfDetails:
    """How the what-if was computed (JSON: the ``what_if`` keys after ``basis``, each only where it applies)."""

    note: str | None = None  # why there is no estimate, or how a one-rank trace was read
    method: str | None = None
    ranks: dict[str, RankWhatIf] = field(default_factory=dict)
    steps_used: int | None = None
    transfer_ns: int | None = None  # the cross-rank transfer per step (with ``cross_rank``)
    cross_rank: bool = False  # whether ranks were matched: ``transfer_ns`` then, else the one-rank ``note``
    steps: WhatIfSteps | None = None
    range: WhatIfRange | None = None
    partial: PartialRun | None = None

    @property
    def confidence(self) -> str | None:
        """The confidence of the range (low on a partial run), None without either."""
        return "low" if self.partial is not None else self.range.confidence if self.range is not None else None

    def to_json(self) -> dict[str, Any]:
        if self.method is None:
            return {"note": self.note} if self.note is not None else {}
        out: dict[str, Any] = {"method": self.method, "ranks": {r: v.to_json() for r, v in self.ranks.items()},
                               "steps_used": self.steps_used}
        if self.cross_rank:
            out["transfer_ns"] = self.transfer_ns
        if self.note is not None:
            out["note"] = self.note
        if self.steps is not None:
            out.update(self.steps.to_json())
        if self.range is not None:
            out.update(self.range.to_json())
        if self.partial is not None:
            out.update(self.partial.to_json())
        return out


@dataclass
class WhatIf:
    """Step time a user would save if communication were free."""

    comm_free_step_saving_ns: int | None
    basis: str  # gpu_transfer | host_launch | mixed
    details: WhatIfDetails = field(default_factory=WhatIfDetails)

    def to_json(self) -> dict[str, Any]:
        return {"comm_free_step_saving_ns": self.comm_free_step_saving_ns, "basis": self.basis,
                **self.details.to_json()}


@dataclass
class Finding:
    """One diagnosis with its quantified impact and the evidence behind it."""

    id: str
    title: str
    impact_ns_per_step: int | None
    evidence: dict[str, Any]
    impact_pct_of_step: float | None = None
    severity: str = "info"  # high | medium | low | info
    recommendation: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "impact_ns_per_step": self.impact_ns_per_step,
                "impact_pct_of_step": self.impact_pct_of_step, "severity": self.severity,
                "recommendation": self.recommendation, "evidence": self.evidence}


@dataclass(frozen=True)
class SummarySource:
    """How a summary read its traces: enough to read them again the same way (the export of a Summary whose
    devices no longer carry their activity, as the Dask engine's). Never in JSON."""

    layer_pattern: str | None
    rules: str | None = None  # the extra classification rules (a TOML file)
    window: str | None = None  # "START:END" seconds from the capture start
    from_files: bool = False  # read from the traces' paths by the summary (False: Traces given, maybe changed)


@dataclass
class Summary:
    """Everything ``summary`` and ``report`` show, for one or several traces (ranks)."""

    traces: list[TraceMeta]
    devices: list[DeviceSummary]
    cross_rank: CrossRankSummary | None
    what_if: WhatIf
    findings: list[Finding] = field(default_factory=list)
    gpu_metrics: pd.DataFrame | None = None  # per device/metric (and bucket) aggregates
    power: dict[str, Any] | None = None  # nvidia-smi log aligned with the trace
    warnings: list[str] = field(default_factory=list)
    # the jobs among the inputs (analysis.runs; the first is the one cross-rank results use); None in a Summary
    # made by hand (no JSON ``runs`` / ``ranks_missing``)
    runs: list[Run] | None = None
    # the union bound of the findings' time impacts (findings.overlap.mark_shared_time); None without timed findings
    findings_combined: dict[str, Any] | None = None
    platform: Any = None  # analysis.platform.PlatformFacts: GPU model, architecture, link, communication paths
    source: SummarySource | None = field(default=None, repr=False)  # None in hand-built summaries (tests)
    # each device's working state (analysis.device.DeviceState) by (trace path, rank, device), as the map step left
    # it: what the export and the diff read without loading the files again. Never in JSON; empty in a Summary of
    # the Dask engine (its traces stay on the workers) and in one made by hand
    states: dict[DeviceKey, DeviceState] = field(default_factory=dict, repr=False, compare=False)
    moe: MoeSummary | None = None  # the MoE layers of every device; None (no JSON key) without MoE work

    def _repr_html_(self) -> str:
        """A compact notebook view: devices, largest findings, what-if (not a dataclass dump)."""
        from ..render.notebook import summary_html

        return summary_html(self)

    def __repr__(self) -> str:
        names = ", ".join(t.path.rsplit("/", 1)[-1] for t in self.traces)
        return (f"Summary({names}: {len(self.devices)} device(s), {len(self.findings)} finding(s), "
                f"comm_free_step_saving_ns={self.what_if.comm_free_step_saving_ns})")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema_version": JSON_SCHEMA_VERSION,
            "traces": [t.to_json() for t in self.traces],
            "devices": [d.to_json() for d in self.devices],
            "cross_rank": self.cross_rank.to_json() if self.cross_rank else None,
            "what_if": self.what_if.to_json(),
            "findings": [f.to_json() for f in self.findings],
            "warnings": self.warnings,
        }
        if self.gpu_metrics is not None and len(self.gpu_metrics):
            out["gpu_metrics"] = _records(self.gpu_metrics)
        if self.power is not None:
            out["power"] = self.power
        if self.platform is not None:
            out["platform"] = self.platform.to_json()
        if self.moe is not None:
            out["moe"] = self.moe.to_json()
        if self.runs is not None:
            out["runs"] = [r.to_json() for r in self.runs]
            out["ranks_missing"] = self.ranks_missing
        if self.findings_combined is not None:
            out["findings_combined"] = self.findings_combined
        return out

    @property
    def ranks_missing(self) -> int | None:
        """Ranks of the stated world sizes that no input holds, over every run; None without run identity."""
        return sum(r.ranks_missing for r in self.runs) if self.runs is not None else None


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame rows as JSON-safe dicts (numpy scalars to Python, NaN to None)."""
    clean = df.astype(object).where(pd.notna(df), None)
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in clean.to_dict(orient="records")]
