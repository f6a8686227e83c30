"""Run identity: which input files are ranks of one job, checked before any cross-rank claim.

Files given together are not always one job: a directory can hold several runs, and a user can pass rank 0 of
one run with rank 1 of another. Every trace file is one unit (an nsys export holds one capture, all its
processes); units are grouped greedily in time order, a unit joining the first run it is compatible with:

* **distinct ranks**: a rank already in the run means another run;
* **world size**: both known and different means another run;
* **profiled windows on a common clock** (UTC: Kineto ``baseTimeNanoseconds`` + ts, epoch-µs ``ts`` of older
  Kineto traces, the nsys session start): windows that do not overlap are different runs;
* **collectives**: communication on both sides whose (kind, size) mixes share less than a third, or whose
  counts per step differ by more than 2×, means another workload.

The **primary** run — the one with the most ranks, the earliest on ties — is the one cross-rank matching, the
what-if and the cross-rank findings use; every file outside it is named in a warning, and per-rank results are
still reported for all files. A run with fewer ranks than its stated world size is **partial**: cross-rank
results hold for the given ranks only, and the warning says how many are missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..model.trace import Trace, TraceHeader
from .numeric.frames import array_of
from .results import DeviceSummary

EPOCH_NS_MIN = 10**18  # times above this (2001-09-09) on a trace without a base are UTC epoch ns
MIN_COLLECTIVE_OVERLAP = 1 / 3  # shared share of (kind, bytes) pairs for two units to be one workload
MAX_COUNT_RATIO = 2.0  # collectives per step of two units of one workload differ by at most 2×


@dataclass
class Unit:
    """One input file's identity facts."""

    path: str
    ranks: list[int]
    world_size: int | None
    window_utc: tuple[int, int] | None
    collective_mix: dict[tuple[str, int], int]
    collectives_per_step: float | None


@dataclass
class Run:
    """Files that form one job."""

    paths: list[str]
    ranks: list[int]
    world_size: int | None
    window_utc: tuple[int, int] | None = None
    reasons: list[str] = field(default_factory=list)  # why it is not one run with the primary

    @property
    def ranks_missing(self) -> int:
        return max(0, (self.world_size or 0) - len(self.ranks))

    def to_json(self) -> dict[str, Any]:
        return {"files": [Path(p).name for p in self.paths], "paths": list(self.paths), "ranks": self.ranks,
                "world_size": self.world_size,
                "ranks_missing": self.ranks_missing, "partial": self.ranks_missing > 0,
                "window_utc_ns": list(self.window_utc) if self.window_utc else None}


def _utc_window(trace: Trace | TraceHeader, devices: list[DeviceSummary]) -> tuple[int, int] | None:
    lows = [d.figures.window_ns[0] for d in devices if d.figures is not None]
    highs = [d.figures.window_ns[1] for d in devices if d.figures is not None]
    if not lows:
        return None
    lo, hi = min(lows), max(highs)
    if trace.base_time_ns is not None:
        return lo + trace.base_time_ns, hi + trace.base_time_ns
    return (lo, hi) if lo >= EPOCH_NS_MIN else None


def _mix(devices: list[DeviceSummary]) -> tuple[dict[tuple[str, int], int], float | None]:
    mix: dict[tuple[str, int], int] = {}
    per_step: list[float] = []
    for d in devices:
        c = d.collectives
        if not len(c):
            continue
        kinds = c["kind"].astype(str).to_numpy() if "kind" in c else np.full(len(c), "unknown")
        sizes = array_of(c, "bytes", np.int64) if "bytes" in c else np.full(len(c), -1)
        for key, n in zip(*np.unique(np.char.add(np.char.add(kinds.astype(str), "|"), sizes.astype(str)),
                                     return_counts=True), strict=True):
            kind, size = str(key).rsplit("|", 1)
            mix[(kind, int(size))] = mix.get((kind, int(size)), 0) + int(n)
        if d.steps and d.step_source != "none":
            in_steps = c[c["step"] >= 0] if "step" in c else c
            per_step.append(len(in_steps) / d.steps)
    return mix, (float(np.median(per_step)) if per_step else None)


def describe(trace: Trace | TraceHeader, devices: list[DeviceSummary]) -> Unit:
    """The identity facts of one trace file from its per-device summaries."""
    return _describe(trace, [d for d in devices if d.trace == str(trace.path)])


def _describe(trace: Trace | TraceHeader, mine: list[DeviceSummary]) -> Unit:
    mix, per_step = _mix(mine)
    return Unit(str(trace.path), sorted({d.rank for d in mine}), trace.world_size, _utc_window(trace, mine),
                mix, per_step)


def _mix_overlap(a: dict[tuple[str, int], int], b: dict[tuple[str, int], int]) -> float:
    """Share of the smaller side's collective calls whose (kind, bytes) the other side also has."""
    small, large = (a, b) if sum(a.values()) <= sum(b.values()) else (b, a)
    total = sum(small.values())
    return sum(n for key, n in small.items() if key in large) / total if total else 1.0


def incompatibility(unit: Unit, run: Run, members: list[Unit], run_ranks: set[int] | None = None) -> str | None:
    """Why ``unit`` cannot be a rank file of ``run``, or None when nothing says so. ``run_ranks``: ``run.ranks``
    as a set, when the caller keeps one."""
    name = Path(unit.path).name
    shared = sorted(r for r in set(unit.ranks) if r in (run_ranks if run_ranks is not None else set(run.ranks)))
    if shared:
        return f"{name} repeats rank {shared[0]}"
    if unit.world_size and run.world_size and unit.world_size != run.world_size:
        return f"{name} has world size {unit.world_size}, not {run.world_size}"
    if unit.window_utc and run.window_utc and (unit.window_utc[0] >= run.window_utc[1]
                                               or run.window_utc[0] >= unit.window_utc[1]):
        apart = max(unit.window_utc[0] - run.window_utc[1], run.window_utc[0] - unit.window_utc[1])
        return f"{name} was profiled at another time (windows {apart / 1e9:.1f} s apart on the common clock)"
    for other in members:
        if unit.collective_mix and other.collective_mix:
            if _mix_overlap(unit.collective_mix, other.collective_mix) < MIN_COLLECTIVE_OVERLAP:
                return f"{name} runs other collectives (kind and size) than {Path(other.path).name}"
            a, b = unit.collectives_per_step, other.collectives_per_step
            if a and b and max(a, b) > MAX_COUNT_RATIO * min(a, b):
                return (f"{name} runs {a:.0f} collectives per step where {Path(other.path).name} runs {b:.0f}")
    return None


def group_runs(traces: Sequence[Trace | TraceHeader], devices: list[DeviceSummary]) -> list[Run]:
    """Runs of the inputs, the primary (most ranks, earliest) first (see the module doc)."""
    by_path: dict[str, list[DeviceSummary]] = {}
    for d in devices:  # grouped once: describing each file does not scan every device
        by_path.setdefault(d.trace, []).append(d)
    units = [_describe(t, by_path.get(str(t.path), [])) for t in traces]
    return group_units([u for u in units if u.ranks])


def group_units(units: list[Unit]) -> list[Run]:
    """:func:`group_runs` of described files."""
    units = sorted(units, key=lambda u: (u.window_utc[0] if u.window_utc else 0, u.path))
    runs: list[Run] = []
    # per run: its members with distinct collective signatures (members alike give the same verdict, so the first
    # of each stands for all: the first incompatible member is the same) and its ranks as a set; cost stays
    # linear in the number of files when they are ranks of one job
    members: list[list[Unit]] = []
    signatures: list[set[object]] = []
    rank_sets: list[set[int]] = []
    for unit in units:
        why_not: list[str] = []
        sig = (tuple(sorted(unit.collective_mix.items())), unit.collectives_per_step)
        for i, run in enumerate(runs):
            why = incompatibility(unit, run, members[i], rank_sets[i])
            if why is None:
                run.paths.append(unit.path)
                rank_sets[i].update(unit.ranks)
                run.world_size = run.world_size or unit.world_size
                if unit.window_utc:
                    lo, hi = run.window_utc or unit.window_utc
                    run.window_utc = (min(lo, unit.window_utc[0]), max(hi, unit.window_utc[1]))
                if sig not in signatures[i]:
                    signatures[i].add(sig)
                    members[i].append(unit)
                break
            why_not.append(why)
        else:
            runs.append(Run([unit.path], list(unit.ranks), unit.world_size, unit.window_utc, why_not))
            members.append([unit])
            signatures.append({sig})
            rank_sets.append(set(unit.ranks))
    for run, ranks in zip(runs, rank_sets, strict=True):
        run.ranks = sorted(ranks)
    order = sorted(range(len(runs)), key=lambda i: -len(runs[i].ranks))  # stable: earliest first on ties
    return [runs[i] for i in order]


def run_warnings(runs: list[Run]) -> list[str]:
    """Warnings for runs other than the primary and for the primary's missing ranks (each run's own count is in
    ``runs[].ranks_missing``)."""
    out: list[str] = []
    if not runs:
        return out
    primary = runs[0]
    for run in runs[1:]:
        names = ", ".join(Path(p).name for p in run.paths)
        why = "; ".join(run.reasons[:2]) or "not one job with the primary run"
        out.append(f"{names}: not the same run as {', '.join(Path(p).name for p in primary.paths)} ({why}); "
                   "cross-rank matching, stragglers and the what-if use the first run only, per-rank results "
                   "are shown for every file")
    if primary.ranks_missing:
        out.append(f"{primary.ranks_missing} of {primary.world_size} ranks are missing (given: ranks "
                   f"{', '.join(map(str, primary.ranks[:8]))}{' …' if len(primary.ranks) > 8 else ''}); cross-rank "
                   "results are partial: they hold for the given ranks only")
    return out
