"""Step windows of one (rank, device) on the GPU clock, and the GPU projection of CPU-side ranges.

Sources, first that applies:

1. ``--step-range NAME``: ranges with that exact name (NVTX / user annotations), projected to the GPU.
2. ``ProfilerStep#N``: the CPU ``profiler_step`` ranges projected to the GPU, widened to Kineto's GPU-side
   ``gpu_user_annotation`` ``ProfilerStep*`` range of the same step when the trace has one per step (the hull:
   the annotation alone can cover a sliver of the step); the annotations alone when nothing is projected.
3. A well-known step range (``WELL_KNOWN_STEP``: ``step``, ``train_step``, ``iteration``, ``decode_step``,
   ``step_12``…; the outermost family when several match), projected to the GPU as in 1. nsys exports hold the
   whole run, warm-up included, so a range the program put around its timed steps is better than detection.
4. ``nvtx:layer_cycle``: numbered layer ranges (the layer pattern) whose numbering starts over mark forward
   passes; each pass is a step (see :func:`_layer_cycle_steps`).
5. Detected from the GPU timeline alone (:mod:`.step_detect`): idle gaps that recur at a regular kernel count
   (``idle_gaps``), or a kernel that recurs once per step (``kernel_period``); the candidate holding the most
   kernel time wins, and among near ties the largest (outermost) unit. Irregular pieces (warm-up, partial steps)
   belong to no step.
6. ``none``: one window covering the whole span (per-step numbers are then whole-window numbers).

**GPU projection** of a CPU range ``[a, b)``: the kernels and memory operations whose launching API call (joined
on correlation id, same process, same thread when the range has one) starts in ``[a, b)``; the projected window
is [first start, last end] of that GPU work. Projected step windows are then made disjoint (a step ends no later
than the next one starts) and clipped to the device span, so per-step parts add up; time between steps belongs to
no step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ...model.trace import Trace
from ..activity import DeviceActivity
from ..grouped import distinct
from ..numeric import intervals as iv
from ..numeric.frames import array_of, frame
from . import pass_grammar, step_detect

WARMUP_FACTOR = 3.0  # a forward pass this many times longer than the typical one is warm-up
_STEP_NUMBER = re.compile(r"ProfilerStep#(\d+)")
#: NVTX / record_function names taken as steps when there is no ProfilerStep and no ``--step-range``:
#: step, iteration, iter, optionally prefixed train/training/eval/decode/prefill and suffixed by a step number
#: (``step``, ``train_step``, ``training_step``, ``decode_step``, ``iteration 12``, ``step_3``, ``step#3``)
WELL_KNOWN_STEP = re.compile(r"^(?:(?:train|training|eval|decode|prefill)[ _]?)?(?:step|iteration|iter)"
                             r"(?:[ _#:]?\d+)?$"
                             # vLLM V1's engine step: execute_context_<n>(<tokens>)_generation_<n>(<tokens>)
                             r"|^execute_context_\d+\([^)]*\)_generation_\d+\([^)]*\)$", re.IGNORECASE)


def project_to_gpu(act: DeviceActivity, starts: np.ndarray, ends: np.ndarray, pids: np.ndarray,
                   tids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPU windows ``(start, end, non_empty)`` of CPU ranges (see the module doc; 0, 0 where empty); vectorized
    per thread, over the kernels and the memory operations apart (the window covers both)."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    g_start = np.zeros(len(starts), dtype=np.int64)
    g_end = np.zeros(len(starts), dtype=np.int64)
    found = np.zeros(len(starts), dtype=bool)
    # kernels and memory operations: a range's GPU work includes the copies it issued
    parts = [(act.launch_ns, act.launch_pid, act.launch_tid, act.kernels),
             (act.memop_launch_ns, act.memop_launch_pid, act.memop_launch_tid, act.memops)]
    if not any(bool((launch >= 0).any()) for launch, *_ in parts) or len(starts) == 0:
        return g_start, g_end, found
    threads = pd.DataFrame({"pid": np.asarray(pids, dtype=np.int64), "tid": np.asarray(tids, dtype=np.int64)})
    for pid, tid in threads.drop_duplicates().itertuples(index=False):  # a few; all ranges of a thread at once
        rows = np.flatnonzero((pids == pid) & (tids == tid))
        of_pid = [(launch >= 0) & (l_pid == pid) for launch, l_pid, _, _ in parts]
        # the thread's own launches where it made any, else the process's
        by_tid = tid >= 0 and any(bool((sel & (part[2] == tid)).any()) for sel, part in zip(of_pid, parts,
                                                                                             strict=True))
        lo_ends = np.maximum(ends[rows], starts[rows])
        for sel, (launch, _, l_tid, table) in zip(of_pid, parts, strict=True):
            idx = np.flatnonzero(sel & (l_tid == tid) if by_tid else sel)
            idx = idx[np.argsort(launch[idx], kind="stable")]
            lo = np.searchsorted(launch[idx], starts[rows], side="left")
            hi = np.searchsorted(launch[idx], lo_ends, side="left")
            mins, maxs, ok = iv.range_min_max(table["start_ns"][idx], table["end_ns"][idx], lo, hi)
            both = ok & found[rows]
            g_start[rows] = np.where(both, np.minimum(g_start[rows], mins), np.where(ok, mins, g_start[rows]))
            g_end[rows] = np.where(both, np.maximum(g_end[rows], maxs), np.where(ok, maxs, g_end[rows]))
            found[rows] |= ok
    return g_start, g_end, found


def matching_ids(pool: list[str], ids: np.ndarray, pattern: re.Pattern[str]) -> np.ndarray:
    """The distinct string ids among ``ids`` whose text matches ``pattern`` (regex run once per distinct name)."""
    return np.array([i for i in distinct(ids[ids >= 0]).tolist() if pattern.search(pool[i])], dtype=np.int64)


def ranges_named(act: DeviceActivity, *, name: str | None = None, pattern: re.Pattern[str] | None = None,
                 kinds: tuple[str, ...] = ()) -> pd.DataFrame:
    """Ranges of the device's processes (CPU) or of the device itself (GPU-side), by name or regex and kind."""
    r = act.trace.ranges
    if len(r) == 0:
        return pd.DataFrame(columns=["start_ns", "end_ns", "pid", "tid", "device", "kind", "name"])
    if name is not None:
        sel = r["name_id"] == act.trace.strings.get(name)
    elif pattern is not None:
        sel = np.isin(r["name_id"], matching_ids(act.trace.strings.values, r["name_id"], pattern))
    else:
        sel = np.ones(len(r), dtype=bool)
    if kinds:
        sel &= np.isin(r["kind_id"], [i for i in map(act.trace.strings.get, kinds) if i >= 0])
    on_gpu = r["device"] >= 0
    mine = np.where(on_gpu, r["device"] == act.device, np.isin(r["pid"], act.pids))
    sel &= mine & (r["end_ns"] >= r["start_ns"])
    out = pd.DataFrame({"start_ns": r["start_ns"][sel], "end_ns": r["end_ns"][sel], "pid": r["pid"][sel],
                        "tid": r["tid"][sel], "device": r["device"][sel],
                        "kind": act.trace.names(r["kind_id"][sel]), "name": act.trace.names(r["name_id"][sel])})
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _disjoint(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    end = np.minimum(end, np.concatenate((start[1:], [np.iinfo(np.int64).max])))
    return start, end


def _frame(numbers: np.ndarray, start: np.ndarray, end: np.ndarray, source: str) -> pd.DataFrame:
    return frame({"step": numbers.astype(np.int64), "start_ns": start.astype(np.int64),
                         "end_ns": end.astype(np.int64), "source": source})


def _projected(act: DeviceActivity, ranges: pd.DataFrame, source: str, numbers: np.ndarray | None
               ) -> pd.DataFrame | None:
    cpu = ranges[ranges["device"] < 0]
    if len(cpu) == 0:
        return None
    gs, ge, ok = project_to_gpu(act, array_of(cpu, "start_ns"), array_of(cpu, "end_ns"),
                                array_of(cpu, "pid"), array_of(cpu, "tid"))
    if not ok.any():
        return None
    nums = np.arange(len(cpu)) if numbers is None else numbers
    order = np.argsort(gs[ok], kind="stable")
    start, end = _disjoint(gs[ok], ge[ok])
    return _frame(nums[ok][order], start, end, source)


def _profiler_steps(act: DeviceActivity) -> pd.DataFrame | None:
    cpu = ranges_named(act, pattern=_STEP_NUMBER, kinds=("profiler_step", "user_annotation", "cpu_op", "nvtx"))
    cpu = cpu[cpu["device"] < 0]
    numbers = cpu["name"].astype(str).str.extract(_STEP_NUMBER, expand=False).astype(np.int64).to_numpy()
    gpu = ranges_named(act, pattern=re.compile(r"^ProfilerStep"), kinds=("gpu_user_annotation",))
    gpu = gpu[gpu["device"] == act.device]
    projected = _projected(act, cpu, "profiler_step", numbers)
    if len(gpu) == 0:
        return projected
    nums = numbers if len(numbers) == len(gpu) else np.arange(len(gpu))
    start, end = array_of(gpu, "start_ns"), array_of(gpu, "end_ns")
    if projected is not None and len(projected) == len(gpu):
        # Kineto's GPU annotation can cover only part of the step's GPU work (seen with torch 2.11: 93 µs of a
        # 31 ms step); the step is the hull of both, which equals the annotation when it is whole
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
        nums = array_of(projected, "step")
        start = np.minimum(start, array_of(projected, "start_ns"))
        end = np.maximum(end, array_of(projected, "end_ns"))
    start, end = _disjoint(start, end)
    return _frame(nums, start, end, "profiler_step")


def detect_steps(act: DeviceActivity) -> pd.DataFrame | None:
    """Steps found from the GPU timeline alone (:mod:`.step_detect`), as a step frame, or None."""
    found = step_detect.detect(act)
    if found is None:
        return None
    return _frame(np.arange(len(found.start_ns)), found.start_ns, found.end_ns, found.method)


def _named_steps(act: DeviceActivity, named: pd.DataFrame, label: str) -> pd.DataFrame | None:
    """Step windows from ranges of one name family: the device's GPU-side ranges, else CPU ranges projected."""
    numbers = named["name"].astype(str).str.extract(r"(\d+)\s*$", expand=False)
    gpu = named["device"] == act.device
    part = gpu if gpu.any() else named["device"] < 0
    nums = numbers[part]
    # numbered names (step_3) keep their numbers when they tell the steps apart, else steps count from 0
    usable = len(nums) > 0 and nums.notna().all() and nums.is_unique
    ids = nums.astype(np.int64).to_numpy() if usable else np.arange(int(part.sum()))
    if gpu.any():
        start, end = _disjoint(named["start_ns"][gpu].to_numpy(), named["end_ns"][gpu].to_numpy())
        return _frame(ids, start, end, label)
    return _projected(act, named[part], label, ids)


def _well_known_steps(act: DeviceActivity) -> pd.DataFrame | None:
    """Steps from a well-known step range name (see ``WELL_KNOWN_STEP``); of several name families, the one
    whose ranges last longest (the outermost, e.g. ``train_step`` around ``step``)."""
    named = ranges_named(act, pattern=WELL_KNOWN_STEP, kinds=("nvtx", "user_annotation", "gpu_user_annotation"))
    if len(named) == 0:
        return None
    family = named["name"].astype(str).str.replace(r"[ _#:]?\d+$", "", regex=True).str.lower()
    duration = (named["end_ns"] - named["start_ns"]).groupby(family).median()
    best = str(duration.sort_values(ascending=False, kind="stable").index[0])
    chosen = named[family == best]
    label = str(chosen["name"].iloc[0]) if chosen["name"].nunique() == 1 else best
    return _named_steps(act, chosen, f"nvtx:{label}")


#: Ranges a training or benchmark loop puts around the phases of one iteration; ``forward`` opens each iteration.
PHASE_RANGE = re.compile(r"^(?:forward|backward|optimizer|optimizer_step|zero_grad)$", re.IGNORECASE)


def _outermost(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which ranges lie inside no other (another starts no later and ends no earlier, and is not the same span)."""
    order = np.lexsort((-end, start))  # by start, the longest first among equal starts
    s, e = start[order], end[order]
    group_first = np.searchsorted(s, s, side="left")  # the first (longest) range of each start
    reach = np.maximum.accumulate(e)
    before = np.where(group_first > 0, reach[np.maximum(group_first - 1, 0)], np.iinfo(np.int64).min)
    nested = (before >= e) | (e[group_first] > e)
    out = np.empty(len(order), dtype=bool)
    out[order] = ~nested
    return out


def _phase_steps(act: DeviceActivity) -> pd.DataFrame | None:
    """Iterations marked by phase ranges (``forward``, ``backward``, ``optimizer``; NVTX or record_function): each
    step runs from one outermost ``forward`` range to the next, the last to the end of the phase ranges after it.
    Ranges around several iterations (``warmup``, ``benchmark_loop``) are phases of the run, not steps."""
    phases = ranges_named(act, pattern=PHASE_RANGE, kinds=("nvtx", "user_annotation"))
    phases = phases[phases["device"] < 0]
    forward = phases[phases["name"].astype(str).str.lower() == "forward"]
    if len(forward) < 2:
        return None
    forward = forward[_outermost(array_of(forward, "start_ns", np.int64), array_of(forward, "end_ns", np.int64))]
    if len(forward) < 2:
        return None
    starts = array_of(forward, "start_ns", np.int64)
    after_last = phases["start_ns"] >= starts[-1]
    ends = np.r_[starts[1:], int(phases["end_ns"][after_last].max())]
    windows = pd.DataFrame({"start_ns": starts, "end_ns": ends, "pid": array_of(forward, "pid"),
                            "tid": array_of(forward, "tid"), "device": -1})
    return _projected(act, windows, "nvtx:forward", None)


@dataclass
class StepStructure:
    """Step windows of a device and how they were found: ``source`` (profiler_step, nvtx:<name>, idle_gaps,
    kernel_period, none), ``confidence`` (high: the program marked its steps; medium / low: detected, by the
    strength of the evidence; low for none) and the evidence itself."""

    windows: pd.DataFrame  # step, start_ns, end_ns, source
    source: str
    confidence: str
    evidence: dict[str, Any] = field(default_factory=dict)


def _layer_cycle_steps(act: DeviceActivity, layer_pattern: str) -> tuple[pd.DataFrame, dict[str, Any]] | None:
    """Steps from numbered layer ranges (``layer_0`` … ``layer_7``, then ``layer_0`` again): a new forward pass
    starts where the numbering starts over. A step runs from the GPU start of its first layer's work to the next
    pass's; pieces whose kernel count is more than 10% off the typical pass (warm-up) belong to no step. Steps keep
    their pass index, which is the same on every rank of one program. A pass lasting more than ``WARMUP_FACTOR``
    times the typical one is warm-up, not a step."""
    ranges = ranges_named(act, pattern=re.compile(layer_pattern), kinds=("nvtx", "user_annotation"))
    ranges = ranges[ranges["device"] < 0]
    if len(ranges) < 4:
        return None
    digits = ranges["name"].astype(str).str.extract(r"(\d+)(?!.*\d)", expand=False)
    ranges = ranges[digits.notna()].assign(number=digits[digits.notna()].astype(np.int64))
    gs, ge, ok = project_to_gpu(act, array_of(ranges, "start_ns"), array_of(ranges, "end_ns"),
                                array_of(ranges, "pid"), array_of(ranges, "tid"))
    number = array_of(ranges, "number")
    cycle = np.cumsum(np.concatenate(([True], number[1:] <= number[:-1]))) - 1
    if np.median(np.bincount(cycle)) < 2:
        return None  # numbers that do not count up through a pass are not layers of a forward pass
    gs, ge, cycle = gs[ok], ge[ok], cycle[ok]
    if len(np.unique(cycle)) < 2:
        return None
    ids = np.unique(cycle)
    first = np.full(len(ids), np.iinfo(np.int64).max, dtype=np.int64)
    last = np.zeros(len(ids), dtype=np.int64)
    pos = np.searchsorted(ids, cycle)
    np.minimum.at(first, pos, gs)
    np.maximum.at(last, pos, ge)
    order = np.argsort(first, kind="stable")
    ids, first, last = ids[order], first[order], last[order]
    end = np.concatenate((first[1:], [last[-1]]))
    counts = np.diff(np.searchsorted(act.kernels["start_ns"], np.c_[first, end].ravel())).reshape(-1)[::2]
    typical = float(np.median(counts))
    regular = np.abs(counts - typical) <= max(1.0, 0.1 * typical)
    # a pass that took more than 3× the typical time for the same work is warm-up (autotuning, lazy init)
    regular &= (end - first) <= WARMUP_FACTOR * np.median((end - first)[regular]) if regular.any() else regular
    if regular.sum() < 2:
        return None
    evidence = {"method": "layer_cycle", "passes": len(ids), "steps": int(regular.sum()),
                "kernels_per_step": int(typical), "regular_pct": round(100 * float(regular.mean()), 1)}
    return _frame(ids[regular], first[regular], end[regular], "nvtx:layer_cycle"), evidence


def _passes_in_range(act: DeviceActivity, found: pd.DataFrame, evidence: dict[str, Any]
                     ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A lone annotated step that holds several whole passes of a layered model (five model calls inside one
    ``ProfilerStep``) is that many steps (:func:`.pass_grammar.passes_within`); the range's label is kept and
    the evidence says the split. Anything else is returned as it is."""
    k = act.kernels
    lo, hi = int(found["start_ns"].iloc[0]), int(found["end_ns"].iloc[0])
    inside = np.flatnonzero((np.asarray(k["start_ns"]) >= lo) & (np.asarray(k["start_ns"]) < hi))
    rows, names, gap = step_detect.issue_sequence(act, inside)
    passes = pass_grammar.passes_within(names, gap, step_detect.pass_work_ids(act, names))
    if passes is None:
        return found, evidence
    start, end = step_detect.pass_windows(act, rows, passes.cuts)
    source = str(found["source"].iloc[0])
    split = {"method": "passes_in_range", "range_steps": 1, "steps": passes.passes,
             "pass_markers": passes.markers, "kernels_per_step": int(np.median(np.diff(passes.cuts)))}
    return _frame(np.arange(passes.passes), np.maximum(start, lo), np.minimum(end, hi), source), split


def find_steps(act: DeviceActivity, step_range: str | None = None,
               layer_pattern: str | None = None) -> StepStructure:
    """Step windows ``(step, start_ns, end_ns, source)`` on the GPU clock, disjoint, in time order, with their
    evidence. Without steps the one window is the whole span and the source is ``none``."""
    found: pd.DataFrame | None = None
    confidence = "high"
    evidence: dict[str, Any] = {}
    annotated = len(act.trace.ranges) > 0  # every source before detection reads the trace's ranges
    if step_range and annotated:
        found = _named_steps(act, ranges_named(act, name=step_range), f"nvtx:{step_range}")
    if found is None and annotated:
        found = _profiler_steps(act)
    if found is None and not step_range and annotated:
        found = _well_known_steps(act)
    if found is None and not step_range and annotated:
        found = _phase_steps(act)
    if found is not None and len(found) == 1 and str(found["source"].iloc[0]) != "nvtx:" + str(step_range):
        found, evidence = _passes_in_range(act, found, evidence)
    if found is None and layer_pattern and annotated:
        cycles = _layer_cycle_steps(act, layer_pattern)
        if cycles is not None:
            found, evidence = cycles
    if found is None:
        detected = step_detect.detect(act)
        if detected is not None:
            found = _frame(np.arange(len(detected.start_ns)), detected.start_ns, detected.end_ns, detected.method)
            confidence, evidence = detected.confidence, detected.evidence()
    lo, hi = act.span
    if found is None or len(found) == 0:
        found = _frame(np.zeros(1), np.array([lo]), np.array([hi]), "none")
        confidence, evidence = "low", {"method": "none", "reason": "no step annotation and no regular repeating "
                                       "unit holding half of the kernel time"}
    # inside the device span: Kineto's µs-float GPU annotations can reach 1 ns beyond the first/last kernel
    given_start, given_end = array_of(found, "start_ns", np.int64), array_of(found, "end_ns", np.int64)
    start, end = np.maximum(given_start, lo), np.minimum(given_end, hi)
    keep = end > start
    source = str(found["source"].iloc[0])  # one source per frame
    if not (keep.all() and np.array_equal(start, given_start) and np.array_equal(end, given_end)):
        found = _frame(array_of(found, "step", np.int64)[keep], start[keep], end[keep], source)
    return StepStructure(found, source if len(found) else "none", confidence, evidence)


def step_windows(act: DeviceActivity, step_range: str | None = None) -> pd.DataFrame:
    """Step windows ``(step, start_ns, end_ns, source)`` on the GPU clock (see :func:`find_steps`)."""
    return find_steps(act, step_range).windows


ANNOTATION_KINDS = ("nvtx", "user_annotation", "gpu_user_annotation", "profiler_step")
_NUMBERS = re.compile(r"\d+")


def annotation_names(trace: Trace, limit: int = 12) -> list[str]:
    """Names of the trace's NVTX / record_function / ProfilerStep ranges, most frequent first, numbered families
    shown once (``layer_0`` … ``layer_15`` → ``layer_N (16 names)``); at most ``limit`` entries."""
    r = trace.ranges
    kinds = [i for i in map(trace.strings.get, ANNOTATION_KINDS) if i >= 0]
    ids, counts = np.unique(r["name_id"][np.isin(r["kind_id"], kinds) & (r["name_id"] >= 0)], return_counts=True)
    families: dict[str, list[int]] = {}  # family → [ranges, distinct names]
    first: dict[str, str] = {}  # family → one of its names
    for i, n in zip(ids.tolist(), counts.tolist(), strict=True):
        name = trace.strings[i]
        key = _NUMBERS.sub("N", name)
        tally = families.setdefault(key, [0, 0])
        tally[0] += n
        tally[1] += 1
        first.setdefault(key, name)
    out: list[str] = []
    for key, (_, members) in sorted(families.items(), key=lambda kv: (-kv[1][0], kv[0])):
        out.append(first[key] if members == 1 else f"{key} ({members} names)")
    return out[:limit] + ([f"… ({len(out) - limit} more)"] if len(out) > limit else [])


def has_range(trace: Trace, name: str) -> bool:
    """Whether any range of the trace has exactly this name."""
    sid = trace.strings.get(name)
    return sid >= 0 and bool((trace.ranges["name_id"] == sid).any())
