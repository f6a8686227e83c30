"""Findings: deterministic rules that turn the numbers into a diagnosis with impact per step and evidence.

Each rule is a pure function ``rule(ctx) -> list[Finding]`` registered in ``_registry`` (ids in ``RULE_IDS``,
:mod:`.rule_ids`: each spelled once);
``run_findings`` runs them all and sorts the findings by impact (largest first; findings without a time impact
last). Thresholds are parameters (:class:`FindingThresholds`) with documented defaults; docs/FINDINGS.md documents
every rule: what it detects, how its impact is computed, its thresholds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..analysis.device import DeviceKey, DeviceState, device_key
from ..analysis.results import DeviceSummary, Finding, Summary
from ..model.trace import Trace
from .context import EvidenceKey, FindingContext, FindingThresholds, device_evidence
from .evidence import DeviceEvidence
from .rule_ids import RULE_IDS

Rule = Callable[[FindingContext], list[Finding]]


def _registry() -> dict[str, Rule]:
    """Rule id → rule, in :data:`RULE_IDS` order (a test checks it; the rule modules are imported on first use)."""
    from . import comm_rules, fusion_rules, host_rules, metric_rules, moe_rules, pass_rules, rank_rules
    from . import rule_ids as ids

    return {
        ids.EXPOSED_COMMUNICATION: comm_rules.exposed_communication,
        ids.COMM_SERIALIZED_WITH_COMPUTE: comm_rules.comm_serialized_with_compute,
        ids.COMM_COMPUTE_CONTENTION: comm_rules.comm_compute_contention,
        ids.COLLECTIVE_HOST_COST: comm_rules.collective_host_cost,
        ids.ALLREDUCE_NOT_FUSED: fusion_rules.allreduce_not_fused,
        ids.NORM_NOT_FUSED: fusion_rules.norm_not_fused,
        ids.NCCL_SMALL_MESSAGES: comm_rules.nccl_small_messages,
        ids.STRAGGLER_WAIT: comm_rules.straggler_wait,
        ids.SLOW_RANK: rank_rules.slow_rank,
        ids.LOW_COMM_BANDWIDTH: comm_rules.low_comm_bandwidth,
        ids.HOST_BOUND_NO_CUDA_GRAPHS: host_rules.host_bound_no_cuda_graphs,
        ids.IDLE_GAPS_HOST_CAUSE: host_rules.idle_gaps_host_cause,
        ids.HOST_GAP_BETWEEN_PASSES: pass_rules.host_gap_between_passes,
        ids.COLLECTIVES_WITHOUT_KERNELS: host_rules.collectives_without_kernels,
        ids.LOW_TENSOR_ACTIVITY: metric_rules.low_tensor_activity,
        ids.GPU_POWER_UNDERUSE: metric_rules.gpu_power_underuse,
        ids.MOE_EXPOSED_DISPATCH_COMBINE: moe_rules.exposed_dispatch_combine,
        ids.MOE_EXPERT_IMBALANCE: moe_rules.expert_imbalance,
        ids.MOE_ROUTING_OVERHEAD: moe_rules.routing_overhead,
    }


@dataclass(frozen=True)
class FindingOptions:
    """Which rules to run and with which thresholds."""

    thresholds: FindingThresholds = field(default_factory=FindingThresholds)
    disabled: frozenset[str] = frozenset()


def _options(options: Any) -> FindingOptions:
    """FindingOptions from ``options``: itself, or a SummaryOptions (its ``finding_thresholds`` and
    ``disabled_findings``), or anything with a ``thresholds`` attribute."""
    if isinstance(options, FindingOptions):
        return options
    thresholds = getattr(options, "finding_thresholds", None) or getattr(options, "thresholds", None) or \
        FindingThresholds()
    return FindingOptions(thresholds=thresholds, disabled=frozenset(getattr(options, "disabled_findings", ())))


def run_findings(traces: list[Trace], summary: Summary, options: Any = None,
                 evidence: dict[EvidenceKey, DeviceEvidence] | None = None,
                 states: Mapping[DeviceKey, DeviceState] | None = None) -> list[Finding]:
    """All findings for ``summary`` (computed from ``traces`` and the devices' working ``states``, or from each
    device's ``evidence`` computed where its trace is: :func:`materialized_evidence`), largest impact per step
    first."""
    opts = _options(options)
    ctx = FindingContext(traces=traces, summary=summary, thresholds=opts.thresholds, evidence=evidence,
                         states=states or {},
                         lean_evidence="finding_evidence" in getattr(options, "skip", ()))
    found: list[Finding] = []
    for rule_id, rule in _registry().items():
        if rule_id not in opts.disabled:
            found.extend(rule(ctx))
    if "known_causes" not in opts.disabled:
        from .causes import known_causes

        found.extend(known_causes(ctx, found))  # reads the findings above; may replace their advice
    from .overlap import mark_shared_time

    # each finding's shares_time_with, and the union bound
    summary.findings_combined = mark_shared_time(summary, found)
    return sorted(found, key=lambda f: (f.impact_ns_per_step is None, -(f.impact_ns_per_step or 0), f.id))


def materialized_evidence(trace: Trace, devices: list[DeviceSummary], options: Any = None,
                          figures: tuple[str, ...] | None = None,
                          states: Mapping[DeviceKey, DeviceState] | None = None
                          ) -> dict[EvidenceKey, DeviceEvidence]:
    """The figures the rules read from ``trace`` for each of its ``devices`` (default: all but the late ones,
    :data:`~traceanalyzer.findings.evidence.LATE_FIGURES`), computed now and detached from the trace (where the
    trace lives: a Dask worker, a lane), keyed as :meth:`FindingContext.evidence_of` looks them up."""
    thresholds = _options(options).thresholds
    known = states or {}
    return {(d.trace, d.rank, d.device): device_evidence(trace, d, thresholds, known.get(device_key(d)))
            .materialize(figures) for d in devices}


def late_evidence_wanted(summary: Summary) -> list[DeviceSummary]:
    """The devices whose late evidence figures (the CPU-side collective calls) the rules will read."""
    from .host_rules import wants_host_only_calls

    return [d for d in summary.devices if wants_host_only_calls(d, summary)]


__all__ = ["RULE_IDS", "FindingOptions", "FindingThresholds", "late_evidence_wanted", "materialized_evidence",
           "run_findings"]
