"""Steps of one device found from the GPU timeline alone, when the trace has no step annotation.

Two kinds of evidence are weighed; a candidate segmentation counts only when its steps are *regular* (kernel
count within ±10 % of the typical one), at least ``MIN_STEPS`` of them, and they hold at least half of the
device's busy time, copies included (``MIN_COVERAGE``): a unit that covers a sliver of the run, or kernel bursts
between long weight copies (layer-by-layer offloading), is no step.

* ``idle_gaps``: the device's kernel timeline (union over streams) is cut at every idle gap of at least ``T``.
  Thresholds are tried from the largest gap down; the pieces between cuts are step candidates. A step runs from
  its first kernel to the next step's first kernel, so the gap before the next pass is part of its time. Serving loops
  (a scheduler between forward passes) and training loops with a host-side sync show up here. Its strength is
  the *separation*: the shortest cut gap over the longest gap left inside a regular step.
* ``kernel_period``: a kernel name that recurs at a regular spacing of the busiest stream's sequence (the old
  "anchor"); each period is cut at the phase of the largest median gap. This finds GPU-bound loops whose steps
  touch without an idle gap. It does not count when the whole sequence repeats at a finer lag (a fraction of the
  spacing) almost everywhere: then the anchor only marks every m-th unit of a uniform repetition (layers).

A capture holding a single forward pass and a truncated one (too short for a period) gets that pass as its one
step when one idle gap dwarfs all others and the pass is made of repeating layer blocks.

Of the candidates that qualify, the one holding the most busy time wins, and among those within 10 % of it the
one with the *largest* step (the outermost repeating unit: a forward pass of N identical layers, not a layer).
Pieces that are not regular (warm-up, a partial step at either end, autotuning) belong to no step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..activity import DeviceActivity
from ..numeric import intervals as iv
from . import pass_grammar

MIN_STEPS = 3  # regular pieces a candidate needs
MIN_STEP_KERNELS = 4  # kernels in a typical step (a pair of kernels repeated by a benchmark is no step)
UNIFORM_MATCH = 0.95  # a kernel sequence this periodic at a finer lag is a uniform repetition (layers), no steps
MIN_COVERAGE = 0.5  # share of the device's busy time (kernels and copies) its regular steps must hold
REGULAR_TOLERANCE = 0.1  # a step's kernel count within ±10 % of the typical count
MIN_REGULAR_SHARE = 0.6  # of a candidate's pieces (warm-up and tail pieces are the rest)
STRONG_SEPARATION = 3.0  # cut gaps ≥ 3× every gap inside a step: confident
NEAR_BEST_COVERAGE = 0.9  # candidates within 10 % of the best coverage compete on step size
MAX_THRESHOLDS = 160  # gap thresholds tried per device
ONE_PASS_SEPARATION = 5.0  # a lone gap this many times longer than any other splits passes of a short capture
WEAK_SEPARATION = 1.5  # idle gaps barely longer than those inside a step: weaker than a once-per-step kernel
MIN_LAYER_KERNELS = 3  # a repeating layer block holds at least 3 kernels
MIN_LAYER_NAMES = 3  # with at least 3 distinct kernel names (one GEMM repeated is a benchmark, not a layer)
MIN_LAYER_REPEATS = 3  # repeated back to back at least 3 times
MIN_LAYER_COVERAGE = 0.3  # covering at least 30% of the step's kernels
MAX_LAYER_PERIOD = 2048  # longest block tried (kernels)
MAX_REPEAT_SCAN = 20_000  # kernels of a sequence searched for a repeating block
SAME_PASS_START = 0.8  # share of idle-gap pieces that must start with the same kernel names (a pass start)
PASS_START_NAMES = 3  # names compared at the start of each piece
ISSUE_ORDER_LINKED = 0.95  # share of kernels linked to their launch for the host's issue order to be used


@dataclass
class Detected:
    """A qualified segmentation: step windows plus the evidence that chose it."""

    method: str  # idle_gaps | kernel_period
    start_ns: np.ndarray
    end_ns: np.ndarray
    kernels_per_step: int
    coverage: float  # busy time in the steps / busy time of the device (kernels and copies)
    regular_share: float  # regular pieces / all pieces
    separation: float | None  # idle_gaps: shortest cut gap / longest gap inside a step
    extra: dict[str, Any] = field(default_factory=dict)

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "steps": len(self.start_ns),
                               "kernels_per_step": self.kernels_per_step,
                               "coverage_pct": round(100 * self.coverage, 1),
                               "regular_pct": round(100 * self.regular_share, 1)}
        if self.separation is not None:
            out["gap_separation"] = round(self.separation, 2) if np.isfinite(self.separation) else None
        out.update(self.extra)
        return out

    @property
    def confidence(self) -> str:
        strong = self.coverage >= 0.7 and self.regular_share >= 0.75 and len(self.start_ns) >= 5
        if self.method == "idle_gaps":
            strong = strong and (self.separation or 0) >= STRONG_SEPARATION
        return "medium" if strong else "low"


def _regular(counts: np.ndarray) -> tuple[np.ndarray, int]:
    """Which pieces are regular, and the typical count: the median of the non-trivial pieces' counts."""
    if len(counts) == 0:
        return np.zeros(0, dtype=bool), 0
    typical = int(np.median(counts[counts > 0])) if (counts > 0).any() else 0
    ok = (counts > 0) & (np.abs(counts - typical) <= max(1.0, REGULAR_TOLERANCE * typical))
    return ok, typical


def _gap_thresholds(gaps: np.ndarray) -> np.ndarray:
    """Gap ranks (1 = the largest gap) to try: every rank up to 64, then geometrically spaced."""
    n = len(gaps)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ranks = np.unique(np.r_[np.arange(1, min(n, 64) + 1),
                            np.round(np.geomspace(1, n, MAX_THRESHOLDS - 64)).astype(np.int64)])
    return ranks[(ranks >= 1) & (ranks <= n)]


def from_idle_gaps(act: DeviceActivity) -> Detected | None:
    """The best qualifying cut of the kernel timeline at its idle gaps (see the module doc)."""
    k = act.kernels
    if len(k) < 2 * MIN_STEPS:
        return None
    us, ue = iv.union(k["start_ns"], k["end_ns"])
    if len(us) < MIN_STEPS:
        return None
    gaps = us[1:] - ue[:-1]  # gap i lies before union interval i + 1
    total_busy = float(iv.lengths_sum(act.busy))
    interval_of = np.maximum(np.searchsorted(us, k["start_ns"], side="right") - 1, 0)  # 0-length kernels too
    kernels_before = np.r_[0, np.cumsum(np.bincount(interval_of, minlength=len(us)))]
    # device busy time (kernels and copies) up to the start of each kernel-union interval, and to its end
    busy_to_start = iv.cumulative(act.busy, us)
    busy_to_end = iv.cumulative(act.busy, ue)
    order = np.argsort(gaps, kind="stable")[::-1]
    rank_of_gap = np.empty(len(gaps), dtype=np.int64)
    rank_of_gap[order] = np.arange(len(gaps))
    candidates: list[Detected] = []
    for rank in _gap_thresholds(gaps).tolist():
        cut_after = np.flatnonzero(rank_of_gap < rank) + 1  # union-interval index where each piece starts
        first = np.r_[0, cut_after]
        last = np.r_[cut_after, len(us)]  # exclusive
        counts = kernels_before[last] - kernels_before[first]
        ok, typical = _regular(counts)
        if ok.sum() < MIN_STEPS or typical < MIN_STEP_KERNELS or ok.mean() < MIN_REGULAR_SHARE:
            continue
        if not _same_pass_start(k["name_id"], kernels_before[first[ok]]):
            continue
        coverage = float((busy_to_end[last[ok] - 1] - busy_to_start[first[ok]]).sum()) / total_busy
        if coverage < MIN_COVERAGE:
            continue
        # separation: shortest cut gap vs the longest gap inside a regular piece
        inside = ok[np.searchsorted(cut_after, np.arange(len(gaps)), side="right")]
        inside[cut_after - 1] = False
        longest_inside = float(gaps[inside].max()) if inside.any() else 0.0
        shortest_cut = float(gaps[order[rank - 1]])
        separation = shortest_cut / longest_inside if longest_inside > 0 else float("inf")
        # a step runs from its first kernel to the next step's first kernel (the idle gap before the next pass is
        # part of this step's time, as a user timing the loop sees it); the last one to its own last kernel
        start = us[first[ok]]
        follows = np.r_[ok[1:] & ok[:-1], False][ok]  # the next piece is a step too
        end = np.where(follows, np.r_[start[1:], 0], ue[last[ok] - 1])
        candidates.append(Detected("idle_gaps", start, end, typical, coverage,
                                   float(ok.mean()), separation, {"cut_gap_min_ns": int(shortest_cut)}))
    return _pick(candidates) if candidates else _one_pass(act, us, ue, gaps, order, interval_of, total_busy)


def _same_pass_start(names: np.ndarray, rows: np.ndarray) -> bool:
    """Cuts agree with the sequence: the pieces start with the same ``PASS_START_NAMES`` kernel names (a pass
    begins with its own work; a host hiccup falls anywhere in a pass)."""
    if len(rows) == 0:
        return False
    heads = np.stack([names[np.minimum(rows + i, len(names) - 1)].astype(np.int64) for i in range(PASS_START_NAMES)])
    _, counts = np.unique(heads, axis=1, return_counts=True)
    return float(counts.max()) / len(rows) >= SAME_PASS_START


def _one_pass(act: DeviceActivity, us: np.ndarray, ue: np.ndarray, gaps: np.ndarray, order: np.ndarray,
              interval_of: np.ndarray, total_busy: float) -> Detected | None:
    """A capture too short for a step period: the largest idle gap (≥ ``ONE_PASS_SEPARATION`` × every other gap)
    splits it, and the piece holding most of the busy time is one step when it is made of repeating layer blocks
    (a forward pass); a truncated piece with fewer kernels is not a step."""
    if len(gaps) < 2 or gaps[order[1]] <= 0 or gaps[order[0]] < ONE_PASS_SEPARATION * gaps[order[1]]:
        return None
    cut = int(order[0]) + 1
    pieces = [(0, cut), (cut, len(us))]
    busy = [float(iv.cumulative(act.busy, np.array([ue[b - 1]]))[0] - iv.cumulative(act.busy, np.array([us[a]]))[0])
            for a, b in pieces]
    main = int(np.argmax(busy))
    if busy[main] < MIN_COVERAGE * total_busy:
        return None
    a, b = pieces[main]
    rows = np.flatnonzero((interval_of >= a) & (interval_of < b))
    if repeat_unit(act.kernels["name_id"][rows].astype(np.int64)) is None:
        return None
    return Detected("idle_gaps", np.array([us[a]]), np.array([ue[b - 1]]), len(rows), busy[main] / total_busy, 0.5,
                    float(gaps[order[0]] / gaps[order[1]]), {"one_pass": True})


def _pick(candidates: list[Detected]) -> Detected:
    """Weak idle gaps (separation under ``WEAK_SEPARATION``) only when nothing else qualifies; then the most busy
    time covered; among candidates within 10 % of it, the largest step, then the best separation."""
    strong = [c for c in candidates if c.method != "idle_gaps" or (c.separation or 0) >= WEAK_SEPARATION]
    candidates = strong or candidates
    top = max(c.coverage for c in candidates)
    near = [c for c in candidates if c.coverage >= NEAR_BEST_COVERAGE * top]
    return max(near, key=lambda c: (c.kernels_per_step, c.separation or 0.0, c.coverage))


def longest_repeat(names: np.ndarray, period: int) -> tuple[int, int]:
    """``(start, repeats)`` of the longest stretch of ``names`` made of one block of ``period`` names repeated."""
    same = names[:-period] == names[period:]
    if not same.any():
        return 0, 1
    edges = np.diff(np.r_[0, same.astype(np.int8), 0])
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    longest = int(np.argmax(stops - starts))
    return int(starts[longest]), int((stops[longest] - starts[longest]) // period + 1)


def repeat_unit(names: np.ndarray) -> int | None:
    """The layer period (in kernels) of a step's kernel-name sequence: the smallest block of at least
    ``MIN_LAYER_KERNELS`` kernels and ``MIN_LAYER_NAMES`` distinct names repeated back to back at least
    ``MIN_LAYER_REPEATS`` times, among the periods whose repeats cover at least half as many kernels as the best
    one, which must cover ``MIN_LAYER_COVERAGE`` of the sequence (a training step repeats its block in the forward
    and a longer one in the backward: the forward's is the smaller). None when nothing repeats that way."""
    names = names[:MAX_REPEAT_SCAN]  # layers repeat within a pass: a prefix is enough, and bounds the cost
    n = len(names)
    found: list[tuple[int, int]] = []  # (period, kernels covered)
    for period in range(MIN_LAYER_KERNELS, min(n // MIN_LAYER_REPEATS, MAX_LAYER_PERIOD) + 1):
        start, repeats = longest_repeat(names, period)
        if repeats >= MIN_LAYER_REPEATS and len(np.unique(names[start:start + period])) >= MIN_LAYER_NAMES:
            found.append((period, repeats * period))
    if not found:
        return None
    best = max(cover for _, cover in found)
    if best < MIN_LAYER_COVERAGE * n:
        return None
    return min(period for period, cover in found if cover >= 0.5 * best)


def _dominant_stream_sequence(act: DeviceActivity) -> np.ndarray:
    k = act.kernels
    if len(k) == 0:
        return np.empty(0, dtype=np.int64)
    streams, counts = np.unique(k["stream"], return_counts=True)
    return np.flatnonzero(k["stream"] == streams[np.argmax(counts)])


def _anchor_positions(names: np.ndarray) -> np.ndarray | None:
    """Positions of the step anchor: the kernel name whose occurrences repeat with the longest regular spacing
    (≥ 3 occurrences covering half the sequence, ≥ 80% of spacings within 10% of their median)."""
    n = len(names)
    if n < 6:
        return None
    order = np.lexsort((np.arange(n), names))
    sorted_names = names[order]
    same = sorted_names[1:] == sorted_names[:-1]
    lag = (order[1:] - order[:-1]).astype(np.float64)
    frame = pd.DataFrame({"name": sorted_names[1:][same], "lag": lag[same], "first": order[:-1][same],
                          "last": order[1:][same]})
    if len(frame) == 0:
        return None
    by = frame.groupby("name")
    med = by["lag"].transform("median")
    frame["regular"] = (frame["lag"] - med).abs() <= 0.1 * med
    stats = pd.DataFrame({"lags": by.size(), "median": by["lag"].median(), "regular": by["regular"].mean(),
                          "cover": by["last"].max() - by["first"].min()})
    ok = stats[(stats["lags"] >= 2) & (stats["regular"] >= 0.8) & (stats["cover"] >= n / 2)
               & (stats["median"] >= 2) & (stats["median"] <= n / 2)]
    if len(ok) == 0:
        return None
    anchor = ok.sort_values(["median", "lags"], ascending=[False, False]).index[0]
    return np.flatnonzero(names == anchor)


def _cut_positions(anchors: np.ndarray, gap: np.ndarray, names: np.ndarray) -> tuple[np.ndarray, int]:
    """Step starts: near each regular anchor, the kernel after the largest GPU gap at the phase where the
    median gap over all periods is largest (searched within ±5% of the period to absorb variable-length steps).
    Phases inside the step's repeating layer block are not candidates: a step boundary lies between the last
    layer of one pass and the first of the next, never between two layers."""
    spacing = np.diff(anchors)
    period = int(np.median(spacing))
    regular = np.flatnonzero(np.abs(spacing - period) <= 0.1 * period)
    starts = anchors[np.union1d(regular, regular + 1)]  # both ends of every regular spacing
    n = len(gap)
    phase_idx = np.minimum(starts[:, None] + np.arange(period)[None, :], n - 1)
    score = np.median(gap[phase_idx], axis=0).astype(np.float64)
    middle = starts[len(starts) // 2]
    one_pass = names[middle:middle + period]
    unit = repeat_unit(one_pass) if len(one_pass) == period else None
    inside = np.zeros(period, dtype=bool)
    if unit is not None:
        first, repeats = longest_repeat(one_pass, unit)
        inside[first + 1:first + repeats * unit] = True  # cutting before the block's first kernel is allowed
        if inside.all():
            inside[:] = False
    score[inside] = -1.0
    phase = int(np.argmax(score))
    width = max(1, period // 20)
    offsets = phase + np.arange(-width, width + 1)
    window = np.clip(starts[:, None] + offsets[None, :], 0, n - 1)
    allowed = ~inside[offsets % period]  # the ±5% search stays out of the layer block too
    cuts = np.unique(window[np.arange(len(starts)), np.argmax(np.where(allowed, gap[window], -1), axis=1)])
    return cuts, period


def _finer_uniform_lag(names: np.ndarray, period: int) -> int | None:
    """A lag ``period / m`` (m = 2…8) at which the whole sequence repeats itself almost everywhere (≥ 95 % of
    positions), or None. A sequence that uniform is one unit repeated from start to end (layers, or a benchmark
    loop); a kernel recurring every ``m`` units marks no step boundary there. A real step breaks the finer
    repetition where it starts (embedding, LM head, optimizer)."""
    for m in range(2, 9):
        lag = round(period / m)
        if lag < 1 or lag >= len(names):
            break
        if np.mean(names[:-lag] == names[lag:]) >= UNIFORM_MATCH:
            return lag
    return None


def from_kernel_period(act: DeviceActivity) -> Detected | None:
    """Steps from a kernel that recurs at a regular spacing of the busiest stream (see the module doc)."""
    idx = _dominant_stream_sequence(act)
    k = act.kernels
    names = k["name_id"][idx].astype(np.int64)
    anchors = _anchor_positions(names)
    if anchors is None:
        return None
    spacing = int(np.median(np.diff(anchors)))
    if spacing < MIN_STEP_KERNELS or _finer_uniform_lag(names, spacing) is not None:
        return None
    if pass_grammar.once_per_repeat(pass_grammar.tandem_blocks(names), spacing, len(names)):
        return None  # the anchor recurs once per layer (or group of layers) of a uniform repetition: no step
    starts, ends = k["start_ns"][idx], k["end_ns"][idx]
    gap = np.r_[0, starts[1:] - ends[:-1]]
    cuts, period = _cut_positions(anchors, gap, names)
    lengths = np.diff(cuts)
    typical = int(np.median(lengths)) if len(lengths) else period
    # the last step runs for a typical step length when the sequence still has that many kernels
    if len(idx) - cuts[-1] >= 0.9 * typical:
        stop = np.r_[cuts[1:], min(len(idx), cuts[-1] + typical)]
    else:
        cuts, stop = cuts[:-1], cuts[1:]
    pieces = len(cuts)
    keep = np.abs((stop - cuts) - typical) <= REGULAR_TOLERANCE * typical
    cuts, stop = cuts[keep], stop[keep]
    if len(cuts) < MIN_STEPS:
        return None
    w_start = starts[cuts]
    # a step ends at the last end of the device's kernels (any stream) that start before its last dominant
    # kernel ends, capped at the next step's start
    w_last = ends[stop - 1]
    owner = np.searchsorted(w_start, k["start_ns"], side="right") - 1
    inside = (owner >= 0) & (k["start_ns"] < w_last[np.maximum(owner, 0)])
    w_end = w_last.copy()
    np.maximum.at(w_end, owner[inside], k["end_ns"][inside])
    w_end = np.minimum(w_end, np.r_[w_start[1:], np.iinfo(np.int64).max])
    total = iv.lengths_sum(act.busy)
    coverage = float(iv.measure_within(act.busy, w_start, w_end).sum()) / total if total else 0.0
    if coverage < MIN_COVERAGE:
        return None
    per_step = np.diff(np.searchsorted(k["start_ns"], np.c_[w_start, w_end].ravel())).reshape(-1)[::2]
    return Detected("kernel_period", w_start, w_end, int(np.median(per_step)), coverage,
                    float(len(cuts) / max(pieces, 1)), None,
                    {"anchor": str(act.trace.names(np.array([names[anchors[0]]]))[0])[:120],
                     "period_kernels_on_stream": period})


def issue_sequence(act: DeviceActivity, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(kernel rows, name ids, GPU-idle gap before each)`` of the device's kernels (or of ``rows``) in the order the
    host issued them: by launch time where ≥ ``ISSUE_ORDER_LINKED`` of them link to their launch (graph-launched
    kernels share one and keep their GPU order), else by GPU start."""
    k = act.kernels
    rows = np.arange(len(k)) if rows is None else np.asarray(rows, dtype=np.int64)
    start = np.asarray(k["start_ns"])[rows]
    launch = np.asarray(act.launch_ns)[rows]
    if len(rows) and float((launch >= 0).mean()) >= ISSUE_ORDER_LINKED:
        order = np.lexsort((start, launch))
    else:
        order = np.argsort(start, kind="stable")
    rows = rows[order]
    start, end = start[order], np.asarray(k["end_ns"])[rows]
    gap = np.r_[0, start[1:] - np.maximum.accumulate(end)[:-1]] if len(rows) else np.zeros(0, dtype=np.int64)
    return rows, np.asarray(k["name_id"])[rows].astype(np.int64), gap


def pass_work_ids(act: DeviceActivity, names: np.ndarray) -> np.ndarray:
    """The distinct name ids of ``names`` whose kernel family is once-per-pass work (``pass_grammar.PASS_WORK``)."""
    ids = np.unique(names)
    texts = act.trace.names(ids)
    return ids[np.array([bool(pass_grammar.PASS_WORK.search(str(t))) for t in texts], dtype=bool)] if len(ids) else ids


def pass_windows(act: DeviceActivity, rows: np.ndarray, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GPU windows of passes given as issue positions ``cuts`` over ``rows``: pass ``i`` runs from the earliest start
    of the kernels issued from ``cuts[i]`` on to the next pass's start (its own last end for the last pass when
    nothing follows it)."""
    k = act.kernels
    start = np.asarray(k["start_ns"])[rows]
    end = np.asarray(k["end_ns"])[rows]
    from_here = np.minimum.accumulate(start[::-1])[::-1]  # earliest start of the kernels issued from here on
    w_start = from_here[cuts[:-1]]
    last_end = np.maximum.reduceat(end, cuts[:-1])[-1]
    follows = cuts[-1] < len(rows)
    w_end = np.r_[w_start[1:], from_here[cuts[-1]] if follows else max(last_end, int(end[cuts[-2]:].max()))]
    return w_start, np.maximum(w_end, w_start + 1)


def _from_passes(act: DeviceActivity, rows: np.ndarray, passes: pass_grammar.Passes) -> Detected:
    start, end = pass_windows(act, rows, passes.cuts)
    total = iv.lengths_sum(act.busy)
    coverage = float(iv.measure_within(act.busy, start, end).sum()) / total if total else 0.0
    return Detected("kernel_period", start, end, int(np.median(np.diff(passes.cuts))), coverage, 1.0, None,
                    {"pass_markers": passes.markers, "marker_count": passes.count})


def detect(act: DeviceActivity) -> Detected | None:
    """The step segmentation with the strongest evidence, or None (see the module doc): passes read from the kernel
    sequence (:mod:`.pass_grammar`) first, then idle gaps and a once-per-step kernel, then a window holding one
    pass."""
    rows, names, gap = issue_sequence(act)
    blocks = pass_grammar.tandem_blocks(names)
    passes = pass_grammar.find_passes(names, gap, pass_work_ids(act, names), blocks)
    if passes is not None:
        return _from_passes(act, rows, passes)
    found = [c for c in (from_idle_gaps(act), from_kernel_period(act)) if c is not None]
    if found:
        return _pick(found)
    one = pass_grammar.one_pass(names, blocks)
    if one is None:
        return None
    start, end = pass_windows(act, rows, np.array(one, dtype=np.int64))
    return Detected("kernel_period", start, end, len(rows), 1.0, 1.0, None, {"one_pass": True})
