"""What every finding rule sees: the traces, the summary, thresholds, and per-step helpers.

Rules quantify impact **per step, restricted to the detected step windows** (``DeviceSummary.per_step``), so a
warm-up, NCCL initialisation or autotuning phase captured in the same file (nsys exports hold the whole run) never
counts. Per-step quantities are the **median over steps** of the per-step sum (as ``comm_exposed_per_step_ns``),
unless a rule says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.device import DeviceKey, DeviceState
from ..analysis.numeric.frames import array_of
from ..analysis.results import DeviceSummary, Finding, RankMatches, Summary
from ..model.communication import KIND_NAMES
from ..model.trace import Trace
from ..model.units import fmt_brief_ns as ms  # the rules' titles: ms(ns)
from .evidence import DeviceEvidence
from .windows import kernel_mask, pct_of_step, per_step_median, step_index, step_ns, step_windows, steps

EvidenceKey = tuple[str, int, int]  # (trace path, rank, device)


@dataclass(frozen=True)
class FindingThresholds:
    """When rules fire. Percentages are of the device's median step time unless said otherwise."""

    exposed_comm_min_pct: float = 5.0  # exposed communication worth reporting
    serialized_overlap_max_pct: float = 5.0  # "serialized": comm shares the compute stream and hides < this
    contention_overlap_min_pct: float = 50.0  # comm this much hidden is "overlapped": its cost is contention
    small_message_max_bytes: int = 1 << 20  # one-shot / custom all-reduce territory
    oneshot_latency_ns: int = 8_000  # fixed cost assumed for a one-shot all-reduce on NVLink
    straggler_wait_min_pct: float = 5.0  # per-step exposed wait on a slower rank worth reporting
    host_bound_idle_min_pct: float = 30.0  # GPU idle share of the step that suggests host-bound
    host_bound_kernel_max_ns: int = 50_000  # median kernel shorter than this: launch cost matters
    host_bound_min_kernels_per_step: int = 20  # fewer kernels per step is a micro-benchmark, not a launch-bound step
    graph_launched_max_fraction: float = 0.5  # above this share of kernels from CUDA graphs: graphs are in use
    fusion_gap_max_ns: int = 5_000  # launch gap before a fusable kernel counted at most (longer: host issued late)
    long_gap_min_ns: int = 1_000_000  # idle gaps this long get their host-side cause looked up
    pass_gap_min_pct: float = 3.0  # GPU idle at the boundary between two steps (forward passes) worth reporting
    tensor_active_min_pct: float = 50.0  # Tensor Active below this while GEMM kernels run is low
    bandwidth_min_fraction: float = 0.25  # bus bandwidth below this fraction of the link peak is low
    bandwidth_min_bytes: int = 1 << 20  # only messages at least this large are bandwidth-bound
    power_min_pct_of_limit: float = 50.0  # mean power below this share of the limit is reported
    min_impact_pct: float = 1.0  # findings worth less than this share of a step are dropped
    moe_imbalance_min_pct: float = 10.0  # hot rank's extra expert time, % of the median rank's expert time
    moe_routing_min_pct: float = 25.0  # routing, permutation and un-permutation as a share of the MoE time


@dataclass
class FindingContext:
    """Inputs of the rules."""

    traces: list[Trace]
    summary: Summary
    thresholds: FindingThresholds
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)  # results the rules share, computed once
    # evidence computed where the traces live (Dask engine: materialized on the workers); else from ``traces``
    evidence: dict[EvidenceKey, DeviceEvidence] | None = None
    # findings' evidence only as far as their titles read it (a diff's summaries: ``SummaryOptions.skip``
    # ``finding_evidence``); ids, titles and impacts are the same
    lean_evidence: bool = False
    # each device's working state (its activity, host events) where the traces are in this process
    states: Mapping[DeviceKey, DeviceState] = field(default_factory=dict)

    @cached_property
    def trace_by_path(self) -> dict[str, Trace]:
        return {t.path: t for t in self.traces}

    def evidence_of(self, dev: DeviceSummary) -> DeviceEvidence | None:
        """What the rules read from the device's trace (:mod:`.evidence`); None when its trace is not at hand."""
        key = (dev.trace, dev.rank, dev.device)
        if self.evidence is not None:
            return self.evidence.get(key)
        memo_key = ("evidence", key)
        found = self.memo.get(memo_key)
        if found is None:
            trace = self.trace_by_path.get(dev.trace)
            if trace is None:
                return None
            found = self.memo[memo_key] = device_evidence(trace, dev, self.thresholds, self.states.get(key))
        return found if isinstance(found, DeviceEvidence) else None

    steps = staticmethod(steps)
    step_ns = staticmethod(step_ns)

    @staticmethod
    def pct_of_step(dev: DeviceSummary, ns: float | None) -> float | None:
        return pct_of_step(dev, ns)

    def worth_reporting(self, dev: DeviceSummary, ns: float) -> bool:
        pct = self.pct_of_step(dev, ns)
        return pct is not None and pct >= self.thresholds.min_impact_pct

    @cached_property
    def _matched_by_rank(self) -> dict[int, RankMatches]:
        """Per rank, its figures in the cross-rank table (read once)."""
        cr = self.summary.cross_rank
        if cr is None or not len(cr.per_collective):
            return {}
        out = {}
        for rank in {d.rank for d in self.summary.devices}:
            found = cr.rank_matches(rank)
            if found is not None:
                out[rank] = found
        return out

    def collectives(self, dev: DeviceSummary) -> pd.DataFrame:
        """The device's collective instances inside step windows, with cross-rank ``transfer_ns`` and this
        rank's ``wait_ns`` where matched (else transfer = duration, wait = 0) and ``exposed_transfer_ns`` =
        min(exposed, transfer): the SM-idle time of the instance that is not waiting for another rank.
        Computed once per device (the rules call it many times); rules that test a few columns first read them
        with :meth:`collective_column` instead (no frame per device)."""
        key = ("collectives", id(dev))
        cached = self.memo.get(key)
        if cached is None or cached[0] is not dev:
            c, split = self._step_rows(dev), self._cross_split(dev)
            cached = self.memo[key] = (dev, c.assign(**split) if split else c)
        result: pd.DataFrame = cached[1]
        return result

    def collective_column(self, dev: DeviceSummary, name: str) -> np.ndarray:
        """Column ``name`` of :meth:`collectives` as an array, read without building that frame."""
        split = self._cross_split(dev)
        if name in split:
            return split[name]
        c = dev.collectives
        if not len(c):
            return array_of(c, name) if name in c else np.zeros(0)
        if not len(dev.per_step):
            return np.zeros(len(c), dtype=np.int64) if name == "step" else array_of(c, name)
        values = array_of(c, name)
        rows = self._inside_rows(dev)
        return values if rows is None else values[rows]

    def _inside_rows(self, dev: DeviceSummary) -> np.ndarray | None:
        """Rows of the device's collectives inside a step window; None for all of them."""
        inside = array_of(dev.collectives, "step") >= 0
        return None if inside.all() else np.flatnonzero(inside)

    def _step_rows(self, dev: DeviceSummary) -> pd.DataFrame:
        """The device's collectives inside step windows (all, as step 0, when no step was found), indexed 0..n-1."""
        c = dev.collectives
        if not len(c):
            return c
        if len(dev.per_step):
            rows = self._inside_rows(dev)
            c = c if rows is None else c.iloc[rows]
        else:
            c = c.assign(step=0)
        if not (isinstance(c.index, pd.RangeIndex) and c.index.equals(pd.RangeIndex(len(c)))):
            c = c.reset_index(drop=True)
        return c

    def _cross_split(self, dev: DeviceSummary) -> dict[str, np.ndarray]:
        """The cross-rank columns :meth:`collectives` adds (empty without collectives), computed once per device."""
        key = ("cross_split", id(dev))
        cached = self.memo.get(key)
        if cached is not None and cached[0] is dev:
            found: dict[str, np.ndarray] = cached[1]
            return found
        c = dev.collectives
        split: dict[str, np.ndarray] = {}
        if len(c):
            rows = self._inside_rows(dev) if len(dev.per_step) else None
            duration, start, exposed = (array_of(c, k, np.int64) for k in ("duration_ns", "start_ns", "exposed_ns"))
            if rows is not None:
                duration, start, exposed = duration[rows], start[rows], exposed[rows]
            transfer = duration.copy()
            wait = np.zeros(len(duration), dtype=np.int64)
            matched = self._matched_by_rank.get(dev.rank)
            if matched is not None and len(duration):
                hit, m_transfer, m_wait = matched.lookup(start)
                transfer[hit] = m_transfer[hit]
                wait[hit] = m_wait[hit]
            split = {"transfer_ns": transfer, "wait_ns": wait, "exposed_transfer_ns": np.minimum(exposed, transfer),
                     "exposed_wait_ns": np.minimum(exposed, wait)}
        self.memo[key] = (dev, split)
        return split


def count_per_step(ctx: FindingContext, dev: DeviceSummary, c: pd.DataFrame) -> dict[str, int]:
    """Median number of instances per step, by collective kind (``c`` from :meth:`FindingContext.collectives`)."""
    if not len(c):
        return {}
    return count_kinds_per_step(ctx, dev, array_of(c, "start_ns", np.int64), c["kind"].astype(str).to_numpy())


def count_kinds_per_step(ctx: FindingContext, dev: DeviceSummary, start: np.ndarray, kinds: np.ndarray
                         ) -> dict[str, int]:
    """:func:`count_per_step` from the instances' start times and kinds (as str)."""
    if not len(start):
        return {}
    idx = step_index(dev, start)
    return {str(k): per_step_median(ctx.steps(dev), idx[kinds == k], np.ones(int((kinds == k).sum())))
            for k in pd.unique(kinds)}


def device_evidence(trace: Trace, dev: DeviceSummary, thresholds: FindingThresholds,
                    state: DeviceState | None = None) -> DeviceEvidence:
    """The device's evidence with the thresholds that shape it, from its working ``state`` where it is kept."""
    return DeviceEvidence(trace, dev, fusion_gap_max_ns=thresholds.fusion_gap_max_ns,
                          long_gap_min_ns=thresholds.long_gap_min_ns, state=state)


def prediction(saving: int, low: int, high: int, basis: dict[str, str], confidence: str | None = None
               ) -> dict[str, object]:
    """The evidence keys of a predicted unprofiled step-time change: a saving of ``saving`` ns (a negative
    change), its range [``low``, ``high``] (widened to hold the point) and the reading behind each end, and a
    confidence: ``confidence`` where the reading has its own, else high when the range's high end is at most 1.5 ×
    its low end, medium at most 3 ×, else low."""
    low, high = min(int(low), int(saving)), max(int(high), int(saving))
    ratio = high / low if low > 0 else float("inf")
    level = confidence or ("high" if ratio <= 1.5 else "medium" if ratio <= 3 else "low")
    return {"predicted_change_ns": -int(saving), "range_ns": [low, high], "range_basis": basis, "confidence": level}


def what_if_prediction(ctx: FindingContext, fallback_ns: int) -> dict[str, object]:
    """The prediction of "communication free" (the what-if: its point, range and confidence); without a what-if
    estimate, ``fallback_ns`` as the high end and nothing as the low (part of it may be waiting for a slower
    rank, which removing communication does not recover). None of it with ``lean_evidence`` (a diff's summaries
    leave the what-if's range out)."""
    if ctx.lean_evidence:
        return {}
    what_if = ctx.summary.what_if
    spread = what_if.details.range
    if what_if.comm_free_step_saving_ns is None or spread is None:
        return prediction(fallback_ns, 0, fallback_ns, {
            "point": "the finding's impact", "low": "none of it: it may be waiting for another rank",
            "high": "the finding's impact"}, "low")
    (low, high), (low_name, high_name) = spread.range_ns, spread.range_basis
    return prediction(what_if.comm_free_step_saving_ns, low, high, {
        "point": "the what-if, communication free (docs/METHOD_WHAT_IF.md)", "low": f"the what-if's {low_name}",
        "high": f"the what-if's {high_name}"}, what_if.details.confidence)


__all__ = ["FindingContext", "FindingThresholds", "count_kinds_per_step", "count_per_step", "device_evidence",
           "kernel_mask", "kinds_text", "ms", "per_step_median", "prediction", "severity", "step_index", "step_windows",
           "what_if_prediction", "worst"]


def _plural(kind: str, n: int) -> str:
    name = KIND_NAMES.get(kind, kind)
    return name[:-1] if n == 1 and name.endswith("s") else name


def kinds_text(counts: dict[str, int]) -> str:
    """'16 all-reduces', '2 send/recv + 1 all-gather' — for titles."""
    parts = [f"{n} {_plural(k, n)}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n]
    return " + ".join(parts) or "collectives"


def worst(findings: list[Finding]) -> list[Finding]:
    """The finding with the largest impact (one finding per rule: the worst device); none without findings."""
    return [max(findings, key=lambda f: f.impact_ns_per_step or 0)] if findings else []


def severity(pct: float | None) -> str:
    """high ≥ 10% of a step, medium ≥ 3%, low otherwise."""
    if pct is None:
        return "info"
    return "high" if pct >= 10 else "medium" if pct >= 3 else "low"


