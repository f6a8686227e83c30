"""Two summarized runs compared — step time, an attribution of its change that adds up, kernels matched by role,
collectives, findings, and whether the runs are comparable at all: the pure part of ``diff`` (docs/DIFF.md).

:func:`build_side` reduces one :class:`Summary` to what the comparison needs (small, picklable); :func:`compare`
compares two sides. Both read only the summaries' results (steps, cross-rank match, activity): no loading.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from ...model.buckets import EXCLUSIVE_PRECEDENCE
from ...model.units import fmt_ms
from ..device import device_key
from ..results import Summary, _records
from .attribution import step_component_arrays
from .kernel_match import (
    collective_table,
    compare_collectives,
    compare_findings,
    kernel_groups,
    kernel_overlap,
    match_kernels,
)

DIFF_SCHEMA_VERSION = "1.0"
MIN_NOISE_PCT = 1.0  # noise floor never below this % of the before step (a trace against a near-copy of itself)
MIN_KERNEL_OVERLAP = 0.5  # below this share of kernel time matched, the runs are different workloads
MAD_TO_SIGMA = 1.4826  # median absolute deviation → standard deviation of a normal distribution
VERDICTS = ("faster", "slower", "same", "not comparable")
CONFIDENCE = ("low", "medium", "high")  # DeviceSummary.step_confidence, weakest first


@dataclass
class DiffSide:
    """One side of a diff: its summary (made by ``diff``: without the parts ``diff_runs.DIFF_SKIPS`` names, and
    without the devices' activity) and the representative step."""

    summary: Summary
    step_ns: int | None  # mean over devices of each device's median step
    spread_ns: int  # step-to-step spread (1.4826 · MAD of step durations, largest device)
    steps: int  # steps over all devices
    components: dict[str, int]  # the representative step's components; they sum to step_ns
    world_size: int
    layers_per_step: int | None
    step_source: str
    step_confidence: str = "low"  # the lowest of the devices' (high: marked by the program … low: detected)
    kernel_groups: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)  # per device-step, by name
    collective_table: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)  # per device-step, by kind
    # the MoE stages' exclusive time of the representative MoE step, mean over the MoE devices (docs/MOE.md); they
    # add up to ``moe["moe_ns"]``; None without MoE work
    moe: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"traces": [t.path for t in self.summary.traces], "formats": sorted({t.format for t in
                                                                                    self.summary.traces}),
                "step_ns": self.step_ns, "spread_ns": self.spread_ns, "steps": self.steps,
                "world_size": self.world_size, "layers_per_step": self.layers_per_step,
                "step_source": self.step_source, "step_confidence": self.step_confidence}


@dataclass
class DiffResult:
    """Everything ``diff`` shows. ``step`` and ``attribution`` are integer ns per step; ``kernels`` and
    ``collectives`` are per device-step DataFrames (float ns), ``findings`` a list of dicts."""

    before: DiffSide
    after: DiffSide
    step: dict[str, Any]  # before_ns, after_ns, delta_ns, delta_pct, noise_ns, verdict
    attribution: list[dict[str, Any]]  # component, before_ns, after_ns, delta_ns (sum = step delta_ns)
    kernels: pd.DataFrame
    collectives: pd.DataFrame
    findings: list[dict[str, Any]]
    comparable: bool
    reasons: list[str]
    kernel_overlap: float | None
    warnings: list[str] = field(default_factory=list)
    # per MoE stage: before_ns, after_ns, delta_ns (exclusive, per step; the stage Δs add up to the MoE time's
    # Δ, the last row); None when neither side has MoE work
    moe: list[dict[str, Any]] | None = None

    def slower_than(self, pct: float) -> bool:
        """Whether the after step is slower by more than ``pct`` % and by more than the noise (the CI gate)."""
        s = self.step
        if s["delta_ns"] is None or s["delta_pct"] is None:
            return False
        return bool(s["delta_pct"] > pct and s["delta_ns"] > s["noise_ns"])

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": DIFF_SCHEMA_VERSION, "before": self.before.to_json(),
                "after": self.after.to_json(), "step": self.step, "attribution": self.attribution,
                "comparable": self.comparable, "reasons": self.reasons, "kernel_overlap": self.kernel_overlap,
                "kernels": _records(self.kernels), "collectives": _records(self.collectives),
                "findings": self.findings, "warnings": self.warnings,
                **({"moe": self.moe} if self.moe is not None else {})}

    def _repr_html_(self) -> str:
        s = self.step
        rows = "".join(f"<tr><td>{html.escape(a['component'])}</td><td>{fmt_ms(a['before_ns'])}</td>"
                       f"<td>{fmt_ms(a['after_ns'])}</td><td>{fmt_ms(a['delta_ns'], signed=True)}</td></tr>"
                       for a in self.attribution if a["delta_ns"] or a["before_ns"] or a["after_ns"])
        head = "—" if s["delta_ns"] is None else (f"{fmt_ms(s['before_ns'])} → {fmt_ms(s['after_ns'])} ms/step "
                                                 f"({s['delta_pct']:+.1f} %, noise {fmt_ms(s['noise_ns'])} ms)")
        why = "".join(f"<li>{html.escape(r)}</li>" for r in self.reasons)
        return (f"<div><b>diff: {html.escape(s['verdict'])}</b> — {html.escape(head)}<ul>{why}</ul>"
                "<table><tr><th>component</th><th>before ms</th><th>after ms</th><th>Δ ms</th></tr>"
                f"{rows}</table></div>")


def _median_rows(durations: np.ndarray) -> np.ndarray:
    """Rows of the median step: the middle one, or the two middle ones of an even count."""
    order = np.argsort(durations, kind="stable")
    n = len(order)
    return order[[n // 2]] if n % 2 else order[[n // 2 - 1, n // 2]]


def _round_parts(parts: dict[str, float]) -> dict[str, int]:
    """Integers with the same (rounded) total: floors plus one ns to the largest remainders."""
    keys = list(parts)
    values = np.array([parts[k] for k in keys], dtype=np.float64)
    floors = np.floor(values)
    short = round(values.sum() - floors.sum())
    bump = np.argsort(-(values - floors), kind="stable")[:max(short, 0)]
    floors[bump] += 1
    return {k: int(v) for k, v in zip(keys, floors, strict=True)}


def _layers_per_step(summary: Summary) -> int | None:
    """The median over devices of the summary's layers per step (``DeviceSummary.layers_per_step``), None when no
    device found layers."""
    counts = [d.layers_per_step for d in summary.devices if d.layers_per_step]
    return int(np.median(counts)) if counts else None


def _world_size(summary: Summary) -> int:
    """The job's world size: the primary run's (``analysis.runs``), else the largest one a trace declares (Kineto
    ``distributedInfo``, nsys processes), else the number of ranks loaded (one rank file of an 8-rank job is still
    an 8-rank job)."""
    runs = summary.runs or []
    declared = [s.activity.trace.world_size for s in summary.states.values() if s.activity.trace.world_size]
    ranks = {r for t in summary.traces for r in t.ranks}
    primary = runs[0].world_size if runs else None
    return int(primary) if primary else max([*declared, len(ranks)])


def _mean_parts(parts: list[dict[str, float]]) -> dict[str, float]:
    """The devices' components averaged (a component a device lacks counts 0 there), in order of first
    appearance: ``pd.concat(parts, axis=1).fillna(0.0).mean(axis=1)``, summed device by device alike."""
    names = list(dict.fromkeys(c for p in parts for c in p))
    table = np.array([[p.get(c, 0.0) for c in names] for p in parts], dtype=np.float64)
    return dict(zip(names, (table.sum(axis=0) / len(parts)).tolist(), strict=True))


def build_side(summary: Summary) -> DiffSide:
    """Everything the comparison needs from one summarized run: the representative step and its components, the
    kernel groups and collectives per device-step (see docs/DIFF.md), from the devices' results and their working
    state (``Summary.states``: their activity). The returned side's summary is a copy without the working state
    (the loaded trace), so the side is small and pickles."""
    order = list(EXCLUSIVE_PRECEDENCE)
    medians: list[float] = []
    spreads: list[float] = []
    parts: list[dict[str, float]] = []  # per device: its representative step's components
    steps = 0
    matched: set[int] = set()  # the cross-rank match used each rank's first device with collectives
    for dev in summary.devices:
        mine = len(dev.collectives) > 0 and dev.rank not in matched
        if mine:
            matched.add(dev.rank)
        state = summary.states.get(device_key(dev))
        columns = step_component_arrays(dev, state.activity if state is not None else None,
                                        summary.cross_rank if mine else None, order)
        if not columns or not len(columns["duration_ns"]):
            continue
        durations = columns.pop("duration_ns")
        del columns["step"]
        steps += len(durations)
        rows = _median_rows(durations)
        medians.append(float(durations[rows].mean()))
        spreads.append(MAD_TO_SIGMA * float(np.median(np.abs(durations - np.median(durations)))))
        parts.append({c: float(v[rows].mean()) for c, v in columns.items()})
    world = _world_size(summary)
    sources = ", ".join(sorted({d.step_source for d in summary.devices if d.steps})) or "none"
    levels = [d.step_confidence for d in summary.devices if d.step_confidence in CONFIDENCE]
    confidence = min(levels, key=CONFIDENCE.index) if levels else "low"
    groups = kernel_groups(summary.devices, summary.states)
    collectives = collective_table(summary.devices,
                                   summary.cross_rank.per_collective if summary.cross_rank else None)
    light = replace(summary, states={})
    if not parts:
        return DiffSide(light, None, 0, 0, {}, world, _layers_per_step(summary), sources, confidence, groups,
                        collectives, moe=_moe_side(summary))
    components = _round_parts(_mean_parts(parts))
    return DiffSide(light, sum(components.values()), round(max(spreads)), steps, components, world,
                    _layers_per_step(summary), sources, confidence, groups, collectives, moe=_moe_side(summary))


def _moe_side(summary: Summary) -> dict[str, int] | None:
    """The MoE stages' exclusive time per step of one side (``DiffSide.moe``)."""
    from ...model.buckets import MOE_STAGES

    moe = summary.moe
    devices = [d.step_median() for d in getattr(moe, "devices", None) or []]
    devices = [m for m in devices if m]
    if not devices:
        return None
    parts = {s: round(float(np.mean([m.get(f"{s}_exclusive_ns", 0) for m in devices]))) for s in MOE_STAGES}
    return {**parts, "moe_ns": sum(parts.values())}


def _moe_rows(before: DiffSide, after: DiffSide) -> list[dict[str, Any]] | None:
    """Per MoE stage (then the MoE time) before, after and Δ: the stage Δs add up to the MoE time's."""
    if before.moe is None and after.moe is None:
        return None
    b, a = before.moe or {}, after.moe or {}
    names = [k for k in (b or a) if k != "moe_ns"] + ["moe_ns"]
    return [{"stage": "moe" if k == "moe_ns" else k, "before_ns": b.get(k, 0), "after_ns": a.get(k, 0),
             "delta_ns": a.get(k, 0) - b.get(k, 0)} for k in names]


def _attribution(before: DiffSide, after: DiffSide) -> list[dict[str, Any]]:
    names = list(before.components) + [c for c in after.components if c not in before.components]
    rows: list[dict[str, Any]] = []
    for c in names:
        b, a = before.components.get(c, 0), after.components.get(c, 0)
        rows.append({"component": c, "before_ns": b, "after_ns": a, "delta_ns": a - b})
    return rows


def _comparability(before: DiffSide, after: DiffSide, overlap: float | None) -> list[str]:
    reasons = []
    for side, name in ((before, "before"), (after, "after")):
        if side.step_ns is None:
            reasons.append(f"no steps detected in the {name} run")
        elif side.step_source == "none":
            reasons.append(f"no steps detected in the {name} run: its whole trace counts as one step")
    for side, name in ((before, "before"), (after, "after")):
        runs = side.summary.runs or []
        if len(runs) > 1:
            reasons.append(f"the {name} side holds {len(runs)} different runs (run identity: analysis/runs.py)")
    if before.world_size != after.world_size:
        reasons.append(f"world size differs: {before.world_size} vs {after.world_size} ranks")
    if before.layers_per_step and after.layers_per_step and before.layers_per_step != after.layers_per_step:
        reasons.append(f"layers per step differ: {before.layers_per_step} vs {after.layers_per_step}")
    if overlap is not None and overlap < MIN_KERNEL_OVERLAP:
        reasons.append(f"kernel sets differ: only {100 * overlap:.0f} % of kernel time matches by role "
                       f"(< {100 * MIN_KERNEL_OVERLAP:.0f} %)")
    return reasons


def _step(before: DiffSide, after: DiffSide, comparable: bool, min_noise_pct: float) -> dict[str, Any]:
    if before.step_ns is None or after.step_ns is None:
        return {"before_ns": before.step_ns, "after_ns": after.step_ns, "delta_ns": None, "delta_pct": None,
                "noise_ns": None, "verdict": "not comparable"}
    delta = after.step_ns - before.step_ns
    noise = max(before.spread_ns, after.spread_ns, round(before.step_ns * min_noise_pct / 100))
    verdict = "slower" if delta > noise else "faster" if delta < -noise else "same"
    return {"before_ns": before.step_ns, "after_ns": after.step_ns, "delta_ns": delta,
            "delta_pct": 100.0 * delta / before.step_ns if before.step_ns else None, "noise_ns": noise,
            "verdict": verdict if comparable else "not comparable"}


def compare(side_b: DiffSide, side_a: DiffSide, *, min_noise_pct: float = MIN_NOISE_PCT) -> DiffResult:
    """The diff of two sides made by :func:`build_side`."""
    before, after = side_b.summary, side_a.summary
    kernels = match_kernels(side_b.kernel_groups, side_a.kernel_groups)
    overlap = kernel_overlap(kernels)
    reasons = _comparability(side_b, side_a, overlap)
    warnings = [f"before: {w}" for w in before.warnings] + [f"after: {w}" for w in after.warnings]
    for side, name in ((side_b, "before"), (side_a, "after")):
        if side.step_ns is not None and side.step_confidence == "low":
            warnings.append(f"the {name} run's steps were detected with low confidence ({side.step_source}): check "
                            "that both sides' steps are the same unit of work")
    models = [sorted({d.name for d in s.devices if d.name}) for s in (before, after)]
    if all(models) and models[0] != models[1]:
        warnings.insert(0, f"GPU models differ ({', '.join(models[0])} vs {', '.join(models[1])}): the diff "
                           "compares the hardware too")
    step = _step(side_b, side_a, not reasons, min_noise_pct)
    return DiffResult(before=side_b, after=side_a, step=step, attribution=_attribution(side_b, side_a),
                      kernels=kernels,
                      collectives=compare_collectives(side_b.collective_table, side_a.collective_table),
                      findings=compare_findings(before.findings, after.findings, step["noise_ns"] or 0),
                      comparable=not reasons,
                      reasons=reasons, kernel_overlap=overlap, warnings=warnings, moe=_moe_rows(side_b, side_a))


def diff_summaries(before: Summary, after: Summary, *, min_noise_pct: float = MIN_NOISE_PCT) -> DiffResult:
    """Compare two summaries (computed with their devices' activity, as :func:`traceanalyzer.summary` does)."""
    return compare(build_side(before), build_side(after), min_noise_pct=min_noise_pct)
