"""Forward passes read from the kernel-name sequence: the grammar ``prologue · layer block · epilogue`` of a pass.

Definitions (docs/STRUCTURE.md, "The pass grammar"), on one device's kernels in issue order:

* **Layer block**: a stretch of the sequence made of one block of ``p`` kernel names (≥ 3 distinct) repeated back to
  back ≥ 3 times (a tandem repeat) whose block fits 3 times into one pass (a repetition of whole passes is no layer
  block). Periods are tried from the most frequent lags between successive occurrences of a name.
* **Once-per-pass work**: kernels outside every layer block — embedding gather, final norm, LM head, sampling, loss,
  optimizer. A name whose count is exactly ``K`` and that lies outside the layer blocks is a **pass marker** for
  ``K`` passes when its occurrences interleave with the other such names: the i-th occurrence of every marker lies
  after every (i−1)-th and before every (i+1)-th, so the i-th occurrences are pass i's once-per-pass work.
* **Pass cut**: between the last marker of pass i and the first of pass i+1, never inside a layer block: at the
  largest GPU-idle gap there (the host's gap between passes), right before the next pass's first marker or right
  after this pass's last, whichever closes the most passes in the window (the idle gap on ties).
* **Same skeleton**: consecutive passes share most of their kernel names (a forward chunk and a backward chunk of
  different kernels are not two passes of one model).

Of the valid ``K``, those whose markers include once-per-pass work by its kernel family (:data:`PASS_WORK`) when any
do, then the largest (a step holds every layer once: a unit holding several passes, such as a request of many
decode steps, is no step); among counts within 10 % of it (partial passes at the ends), the one with the most
markers. A window with no two passes holds one when it has a layer block between once-per-pass work of names no
layer block uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

#: Kernel families that are once-per-pass work by definition (docs/STRUCTURE.md): greedy sampling and samplers, the
#: token embedding (not the rotary one), the loss and the optimizer step. Top-k and index-select are left out: MoE
#: routers run them in every layer.
PASS_WORK = re.compile(r"argmax|arg_max|ArgMaxOps|sampling|sampler|(?<!rotary_)embedding(?!_rotary)|nll_loss"
                       r"|cross_entropy|crossentropy|log_softmax|multi_tensor_apply|adam|lamb_|sgd_|lm_head",
                       re.IGNORECASE)
MIN_UNIT_NAMES = 3  # distinct names in a layer unit
MIN_UNIT_REPEATS = 3  # a layer unit repeated back to back this many times
MAX_UNIT = 4096  # longest layer unit tried (kernels)
PERIODS_TRIED = 24  # most frequent lags tried as layer periods
OUTSIDE_LAYERS = 0.9  # share of a marker name's occurrences that lie outside the layer blocks
MIN_PASS_KERNELS = 4  # a pass holds at least this many kernels
MIN_SKELETON_SHARE = 0.5  # Jaccard similarity of the name sets of consecutive passes
MIN_SIMILAR_PAIRS = 0.8  # share of consecutive pass pairs that must be similar
SIMILARITY_PAIRS = 64  # consecutive pairs compared, spread over the window
MAX_COUNTS_TRIED = 64  # distinct marker counts tried, largest first
MIN_LAYER_SHARE = 0.3  # a single pass: its layer blocks hold this share of the kernels
MIN_COVERAGE = 0.5  # complete passes hold at least this share of the kernels
MIN_PASSES_UNSEEN_LAYERS = 3  # markers of a window with no visible layer block must recur this often
PASS_LAYER_SHARE = 0.2  # where layer blocks are visible, each pass holds at least this share of layer kernels
MAX_LAYERS_PER_UNIT = 4  # layer types that alternate: a repeating unit holds at most this many layers
LAYER_PIECES = 0.25  # share of the window in layer blocks longer than a candidate pass that rejects it
SPACING_TOLERANCE = 0.05  # marker spacings this close are the same
SAME_LEVEL = 1.1  # marker counts within 10 % of each other mark the same passes (partial passes at the ends)


@dataclass(frozen=True)
class Passes:
    """Forward passes of a kernel sequence: ``cuts`` (issue positions where passes start; pass ``i`` is
    ``[cuts[i], cuts[i+1])``, the last one ``[cuts[-2], cuts[-1])``) and the evidence that chose them."""

    cuts: np.ndarray
    markers: int  # distinct marker names
    count: int  # occurrences of each marker (the number of passes the markers mark)
    coverage: float  # kernels in complete passes / all kernels
    named: bool = False  # a marker is once-per-pass work by its kernel family (sampling, embedding, loss, optimizer)

    @property
    def passes(self) -> int:
        return len(self.cuts) - 1


def previous_lags(names: np.ndarray) -> np.ndarray:
    """For each position, the distance back to the previous occurrence of the same name (0 for a first one)."""
    n = len(names)
    order = np.lexsort((np.arange(n), names))
    lag = np.zeros(n, dtype=np.int64)
    same = names[order[1:]] == names[order[:-1]]
    lag[order[1:][same]] = order[1:][same] - order[:-1][same]
    return lag


def _tandem_stretches(names: np.ndarray, period: int) -> tuple[np.ndarray, np.ndarray]:
    """``(start, stop)`` of the stretches made of one block of ``period`` names repeated ≥ ``MIN_UNIT_REPEATS``
    times back to back, the block holding ≥ ``MIN_UNIT_NAMES`` distinct names."""
    same = names[:-period] == names[period:]
    edges = np.diff(np.r_[0, same.astype(np.int8), 0])
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    keep = (stops - starts) >= (MIN_UNIT_REPEATS - 1) * period
    starts, stops = starts[keep], stops[keep] + period
    ok = np.array([len(np.unique(names[s:s + period])) >= MIN_UNIT_NAMES for s in starts.tolist()], dtype=bool)
    return starts[ok] if len(ok) else starts, stops[ok] if len(ok) else stops


def tandem_blocks(names: np.ndarray) -> list[tuple[int, int, int]]:
    """Every tandem repeat of the sequence as ``(start, stop, period)``, the periods tried being the most frequent
    lags between successive occurrences of a name (see the module doc)."""
    n = len(names)
    if n < MIN_UNIT_NAMES * MIN_UNIT_REPEATS:
        return []
    lags = previous_lags(names)
    lags = lags[(lags >= MIN_UNIT_NAMES) & (lags <= min(MAX_UNIT, n // MIN_UNIT_REPEATS))]
    if len(lags) == 0:
        return []
    values, counts = np.unique(lags, return_counts=True)
    blocks: list[tuple[int, int, int]] = []
    for period in np.sort(values[np.argsort(counts, kind="stable")[::-1][:PERIODS_TRIED]]).tolist():
        starts, stops = _tandem_stretches(names, period)
        blocks += [(s, e, period) for s, e in zip(starts.tolist(), stops.tolist(), strict=True)]
    return blocks


def cover_of(blocks: list[tuple[int, int, int]], n: int, max_period: float) -> np.ndarray:
    """Positions inside the blocks whose unit fits ``MIN_UNIT_REPEATS`` times into a pass of ``max_period``
    kernels: a layer block. A repetition of whole passes is no layer block of those passes."""
    edges = np.zeros(n + 1, dtype=np.int64)
    for s, e, p in blocks:
        if p * MIN_UNIT_REPEATS <= max_period:
            edges[s] += 1
            edges[e] -= 1
    return np.cumsum(edges[:-1]) > 0


def _marker_groups(names: np.ndarray, markers: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """First and last position of each pass's marker occurrences, or None when the occurrences do not interleave."""
    pos = np.flatnonzero(np.isin(names, markers))
    order = np.argsort(names[pos], kind="stable")
    occurrence = np.empty(len(pos), dtype=np.int64)
    occurrence[order] = np.tile(np.arange(count), len(markers))  # each marker occurs exactly `count` times
    first = np.full(count, len(names), dtype=np.int64)
    last = np.full(count, -1, dtype=np.int64)
    np.minimum.at(first, occurrence, pos)
    np.maximum.at(last, occurrence, pos)
    if np.any(last[:-1] >= first[1:]):
        return None
    return first, last


def _cuts(lo: np.ndarray, hi: np.ndarray, gap: np.ndarray, cover: np.ndarray) -> np.ndarray:
    """The pass start in each span of issue positions ``(lo, hi]`` (ordered, disjoint): the kernel after the largest
    idle gap there that is not inside a layer block, else ``hi`` (the next pass's first marker)."""
    if len(lo) == 0:
        return hi.astype(np.int64)
    allowed = np.r_[True, ~(cover[1:] & cover[:-1])]
    score = np.where(allowed, gap, -1).astype(np.int64)
    best = np.maximum.reduceat(np.r_[score, -1], np.c_[lo + 1, hi + 1].ravel())[::2]  # hi < n: a sentinel after
    spans = np.arange(int(lo[0]) + 1, int(hi[-1]) + 1)  # the positions of every span and those between them
    region = np.searchsorted(lo + 1, spans, side="right") - 1
    inside = spans <= hi[region]
    hit = spans[inside & (score[spans] == best[region])]
    region = region[inside & (score[spans] == best[region])]
    first_hit = np.full(len(lo), -1, dtype=np.int64)
    regions, at = np.unique(region, return_index=True)
    first_hit[regions] = hit[at]
    return np.where((best > 0) & (first_hit >= 0), first_hit, hi).astype(np.int64)


def _similar(names: np.ndarray, cuts: np.ndarray) -> bool:
    """Consecutive passes share their skeleton (see the module doc): the Jaccard similarity of the name sets of
    pass ``i`` and ``i + 1``, over at most ``SIMILARITY_PAIRS`` pairs spread over the window."""
    if len(cuts) < 3:
        return True
    pairs = np.unique(np.linspace(0, len(cuts) - 3, min(SIMILARITY_PAIRS, len(cuts) - 2)).round().astype(np.int64))
    similar = []
    for i in pairs.tolist():
        x = np.unique(names[cuts[i]:cuts[i + 1]])
        y = np.unique(names[cuts[i + 1]:cuts[i + 2]])
        shared = len(np.intersect1d(x, y, assume_unique=True))
        similar.append(shared / max(len(x) + len(y) - shared, 1) >= MIN_SKELETON_SHARE)
    return float(np.mean(similar)) >= MIN_SIMILAR_PAIRS


def _tiles_a_repeat(blocks: list[tuple[int, int, int]], cover: np.ndarray, first: np.ndarray, n: int) -> bool:
    """The markers recur once per unit of one uniform repetition and the passes hold no layer block of their own: a
    layer (or a group of layers) repeated back to back, whatever its count, is no pass."""
    if cover.any():
        return False
    return once_per_repeat(blocks, float(np.median(np.diff(first))), n)


def once_per_repeat(blocks: list[tuple[int, int, int]], length: float, n: int) -> bool:
    """Whether a unit of ``length`` kernels is the unit of a uniform repetition (once or a few times: layer types
    that alternate) covering half of the ``n`` kernels: then it is a layer or a group of layers, never a pass."""
    if length <= 0:
        return False
    # the repetition's unit holds the marker spacing once or a few times (a group of layers of alternating types)
    same = [e - s for s, e, p in blocks
            if 1 <= round(p / length) <= MAX_LAYERS_PER_UNIT and abs(p - round(p / length) * length) <= 0.1 * p]
    return sum(same) >= 0.5 * n


def _splits_layers(blocks: list[tuple[int, int, int]], first: np.ndarray, n: int) -> bool:
    """A layer block whose unit is longer than the candidate pass and not a whole number of passes covers a good part
    of the window: the candidate cuts layers into pieces (a pass holds every layer once)."""
    length = float(np.median(np.diff(first)))
    if length <= 0:
        return False
    longer = [e - s for s, e, p in blocks if p > 1.1 * length and abs(p - round(p / length) * length) > 0.1 * p]
    return sum(longer) >= LAYER_PIECES * n


def _recur_within_a_unit(first: np.ndarray) -> bool:
    """The marker groups alternate in spacing (``d, e, d, e``…): the sequence repeats every ``m`` groups, not every
    group, so each marker occurs ``m`` times per repeating unit and marks no pass."""
    d = np.diff(first).astype(np.float64)
    if len(d) < 4:
        return False
    if _share_close(d, 1) >= 0.5:
        return False
    return any(len(d) > m + 1 and _share_close(d, m) >= 0.9 for m in range(2, 5))


def _share_close(d: np.ndarray, lag: int) -> float:
    """Share of the spacings equal (within ``SPACING_TOLERANCE``) to the one ``lag`` groups later."""
    a, b = d[lag:], d[:-lag]
    return float(np.mean(np.abs(a - b) <= SPACING_TOLERANCE * np.maximum(a, b)))


def _edges(first: np.ndarray, last: np.ndarray, inner: np.ndarray, n: int) -> np.ndarray:
    """Pass starts with the passes at either end closed where the window holds them whole: the first pass starts as
    far before its first marker as the others do, the last ends as far after its last marker."""
    lead = int(np.median(first[1:] - inner))  # kernels of a pass before its first marker
    tail = int(np.median(inner - last[:-1]))  # kernels of a pass after its last marker
    cuts = inner
    if first[0] - lead >= 0:
        cuts = np.r_[first[0] - lead, cuts]
    if last[-1] + tail <= n:
        cuts = np.r_[cuts, last[-1] + tail]
    return cuts


def _candidate(names: np.ndarray, gap: np.ndarray, cover: np.ndarray, markers: np.ndarray, count: int,
               blocks: list[tuple[int, int, int]], named: bool = False) -> Passes | None:
    groups = _marker_groups(names, markers, count)
    if groups is None:
        return None
    first, last = groups
    n = len(names)
    # a uniform repetition of the markers' unit is layers, unless a marker is once-per-pass work by its family
    # (whole passes repeat exactly too; their layers may not, as when Inductor names each layer's kernels apart)
    uniform = not named and _tiles_a_repeat(blocks, cover, first, n)
    if _recur_within_a_unit(first) or uniform or _splits_layers(blocks, first, n):
        return None
    # where a pass ends between two marker groups: at the host's idle gap, else before the next pass's first
    # marker or after this pass's last; the placement that closes the most passes wins (the idle gap on ties)
    at_gap = _cuts(last[:-1], first[1:], gap, cover)
    placements = [_edges(first, last, inner, n) for inner in (at_gap, first[1:], last[:-1] + 1)]
    cuts = max(placements, key=lambda c: (len(c), c[-1] - c[0]))
    if len(cuts) < 2 or np.median(np.diff(cuts)) < MIN_PASS_KERNELS or not _similar(names, cuts):
        return None
    if not _hold_layers(cover, cuts, count):
        return None
    coverage = float(cuts[-1] - cuts[0]) / n
    return Passes(cuts, len(markers), count, coverage, named) if coverage >= MIN_COVERAGE else None


def _hold_layers(cover: np.ndarray, cuts: np.ndarray, count: int, strict: bool = False) -> bool:
    """A pass holds every layer once: where layer blocks are visible, each pass holds layer kernels; where none
    is (or layers vary), the markers must recur ``MIN_PASSES_UNSEEN_LAYERS`` times (``strict``: layers must show)."""
    if not cover.any():
        return not strict and count >= MIN_PASSES_UNSEEN_LAYERS
    inside = np.add.reduceat(cover.astype(np.int64), cuts[:-1]) / np.maximum(np.diff(cuts), 1)
    return bool((inside >= PASS_LAYER_SHARE).all())


def find_passes(names: np.ndarray, gap: np.ndarray, pass_work: np.ndarray | None = None,
                blocks: list[tuple[int, int, int]] | None = None) -> Passes | None:
    """The passes of a kernel-name sequence in issue order (``gap``: GPU-idle time before each kernel), or None
    when the sequence holds fewer than two passes by the definitions of the module doc. ``pass_work``: the name
    ids whose kernel family is once-per-pass work (:data:`PASS_WORK`); ``blocks``: the sequence's
    :func:`tandem_blocks` when the caller has them."""
    blocks = tandem_blocks(names) if blocks is None else blocks
    n = len(names)
    if n < 2 * MIN_PASS_KERNELS:
        return None
    ids, inverse, counts = np.unique(names, return_inverse=True, return_counts=True)
    tried = np.unique(counts[(counts >= 2) & (counts <= n // MIN_PASS_KERNELS)])[::-1][:MAX_COUNTS_TRIED]
    found: list[Passes] = []
    cover, outside, fitted = np.zeros(n, dtype=bool), np.ones(len(ids)), -1
    for count in tried.tolist():  # passes grow longer as the count falls: the layer blocks that fit grow too
        fit = sum(1 for _, _, p in blocks if p * MIN_UNIT_REPEATS <= n / count)
        if fit != fitted:
            cover, fitted = cover_of(blocks, n, n / count), fit
            outside = np.bincount(inverse, weights=(~cover).astype(np.float64), minlength=len(ids)) / counts
        markers = ids[(counts == count) & (outside >= OUTSIDE_LAYERS)]
        if len(markers) == 0:
            continue
        named = pass_work is not None and bool(np.isin(markers, pass_work).any())
        candidate = _candidate(names, gap, cover, markers, count, blocks, named)
        if candidate is not None and candidate.passes >= 2:
            found.append(candidate)
    return _finest(found)


def _finest(found: list[Passes]) -> Passes | None:
    """Of the valid candidates, those whose markers include once-per-pass work by its kernel family when any do
    (a layer with an inner loop of experts looks like a pass with layers otherwise); of those the finest level: a
    step holds every layer once, so a unit that holds several passes (a request of many decode steps) is no step;
    within a level (counts within ``SAME_LEVEL``: partial passes at the ends), the most markers."""
    if not found:
        return None
    found = [c for c in found if c.named] or found
    top = max(c.count for c in found)
    level = [c for c in found if c.count * SAME_LEVEL >= top]
    return max(level, key=lambda c: (c.markers, c.coverage))


def passes_within(names: np.ndarray, gap: np.ndarray, pass_work: np.ndarray | None = None) -> Passes | None:
    """The passes of one annotated range that holds several (see :func:`find_passes`), only where every pass shows
    its layer blocks: a range is split only on evidence that it holds whole passes of a layered model."""
    blocks = tandem_blocks(names)
    found = find_passes(names, gap, pass_work, blocks)
    if found is None:
        return None
    cover = cover_of(blocks, len(names), len(names) / found.count)
    return found if _hold_layers(cover, found.cuts, found.count, strict=True) else None


def one_pass(names: np.ndarray, blocks: list[tuple[int, int, int]] | None = None) -> tuple[int, int] | None:
    """``(first, stop)`` positions of the one pass a window holds: layer blocks holding ≥ ``MIN_LAYER_SHARE`` of
    the kernels with once-per-pass work before and after them made of names no layer block uses; else None."""
    blocks = tandem_blocks(names) if blocks is None else blocks
    cover = cover_of(blocks, len(names), len(names))
    if not blocks or cover.mean() < MIN_LAYER_SHARE:
        return None
    layer_names = np.unique(names[cover])
    first_block = min(s for s, _, _ in blocks)
    last_block = max(e for _, e, _ in blocks)
    before = names[:first_block][~np.isin(names[:first_block], layer_names)]
    after = names[last_block:][~np.isin(names[last_block:], layer_names)]
    if len(before) == 0 or len(after) == 0:
        return None
    return 0, len(names)
