"""Vectorized interval algebra over half-open ``[start, end)`` int64 nanosecond arrays.

Every function is O(n log n) numpy over sorted arrays, with no Python loop per interval. A *set* is a pair
``(starts, ends)`` of int64 arrays; a *union* (the result of :func:`union`) is a set whose intervals are sorted,
non-empty, disjoint and not touching (``[0, 5) + [5, 9)`` merges into ``[0, 9)``). Zero-length intervals
contribute nothing anywhere.
"""

from __future__ import annotations

import numpy as np

from ..grouped import distinct

Intervals = tuple[np.ndarray, np.ndarray]

_I64 = np.int64


def _arrays(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    s = np.asarray(starts, dtype=_I64).ravel()
    e = np.asarray(ends, dtype=_I64).ravel()
    if s.shape != e.shape:
        raise ValueError(f"starts and ends differ in length ({len(s)} vs {len(e)})")
    return s, e


def empty() -> Intervals:
    """The empty set."""
    return np.empty(0, dtype=_I64), np.empty(0, dtype=_I64)


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge any intervals into a union: sorted, disjoint, touching intervals joined, empty ones dropped."""
    s, e = _arrays(starts, ends)
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    del keep
    if len(s) == 0:
        return empty()
    if not bool((s[1:] >= s[:-1]).all()):  # in start order already (a device's kernels): no sort, no copies
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        del order
    return _merged(s, np.maximum.accumulate(e))


def _merged(s: np.ndarray, reach: np.ndarray) -> Intervals:
    """The union of intervals sorted by start (``s``), ``reach`` the running maximum of their ends: a new merged
    interval begins where the start lies beyond everything seen so far."""
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    np.greater(s[1:], reach[:-1], out=new[1:])
    starts = s[new]  # selected by the mask: no index array as long as the union
    last = new  # the last interval of each merged one: the one before the next new one
    last[:-1] = new[1:]
    last[-1] = True
    return starts, reach[last]


def merge_unions(a: Intervals, b: Intervals) -> Intervals:
    """``a ∪ b`` of two unions: the intervals of ``b`` placed among those of ``a`` by binary search (no sort),
    then merged as :func:`union` merges."""
    (a_s, a_e), (b_s, b_e) = a, b
    if len(a_s) == 0 or len(b_s) == 0:
        return (b_s, b_e) if len(a_s) == 0 else (a_s, a_e)
    at = np.searchsorted(a_s, b_s, side="right") + np.arange(len(b_s))  # b's slots in the merged start order
    from_a = np.ones(len(a_s) + len(b_s), dtype=bool)
    from_a[at] = False
    s, reach = np.empty(len(from_a), dtype=_I64), np.empty(len(from_a), dtype=_I64)
    s[at], reach[at] = b_s, b_e
    s[from_a], reach[from_a] = a_s, a_e
    del at, from_a
    np.maximum.accumulate(reach, out=reach)
    return _merged(s, reach)


def total(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union of the intervals (overlaps counted once)."""
    s, e = union(starts, ends)
    return int((e - s).sum())


def lengths_sum(u: Intervals) -> int:
    """Sum of lengths of a union (already disjoint)."""
    return int((u[1] - u[0]).sum())


def _sweep(a: Intervals, b: Intervals, want_b: bool) -> Intervals:
    """``a ∩ b`` (``want_b``) or ``a − b`` for any two sets: between two unions by :func:`_pieces`, else by a
    coverage-count sweep over all boundaries."""
    a, b = _arrays(*a), _arrays(*b)
    if _is_union(a) and _is_union(b):
        return _pieces(a, b, want_b)
    x, in_a, in_b = _states(a, b)
    return _runs(x, in_a & in_b if want_b else in_a & ~in_b)


def _is_union(u: Intervals) -> bool:
    """Whether a set already is a union: sorted, non-empty, disjoint and not touching intervals."""
    s, e = u
    return bool((e > s).all() and (s[1:] > e[:-1]).all())


def _pieces(a: Intervals, b: Intervals, want_b: bool) -> Intervals:
    """``a ∩ b`` or ``a − b`` of two unions without sorting: for each interval of ``a``, the intervals of ``b``
    overlapping it (found by binary search) cut it into pieces — the overlaps, or the gaps between them. The pieces
    are a union already: within an interval of ``a`` they are separated by non-empty intervals of ``b`` (or are
    overlaps with distinct, non-touching ones), and intervals of ``a`` are apart."""
    (a_s, a_e), (b_s, b_e) = a, b
    first = np.searchsorted(b_e, a_s, side="right")  # first b ending after the a interval starts
    stop = np.searchsorted(b_s, a_e, side="left")  # b intervals from here on start at or after its end
    n = np.maximum(stop - first, 0)
    if want_b:
        owner = np.repeat(np.arange(len(a_s)), n)
        j = first[owner] + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))
        return np.maximum(a_s[owner], b_s[j]), np.minimum(a_e[owner], b_e[j])
    # only the a intervals some b overlaps change: n overlapping b intervals leave n + 1 gaps,
    # [a_s, b_s[first]), [b_e[first], b_s[first + 1]), …, [b_e[last], a_e)
    hit = np.flatnonzero(n)
    if len(hit) == 0:
        return a_s.copy(), a_e.copy()
    h_n = n[hit]
    owner = np.repeat(np.arange(len(hit)), h_n + 1)
    k = np.arange(int((h_n + 1).sum())) - np.repeat(np.cumsum(h_n + 1) - (h_n + 1), h_n + 1)  # gap index
    j = first[hit][owner] + k
    h_s, h_e = a_s[hit][owner], a_e[hit][owner]
    starts = np.maximum(np.where(k == 0, h_s, b_e[np.maximum(j - 1, 0)]), h_s)
    ends = np.minimum(np.where(k == h_n[owner], h_e, b_s[np.minimum(j, len(b_s) - 1)]), h_e)
    keep = ends > starts
    starts, ends, owner = starts[keep], ends[keep], owner[keep]
    # every a interval in order: untouched ones whole, the others as their gaps
    count = np.ones(len(a_s), dtype=np.int64)
    count[hit] = per_hit = np.bincount(owner, minlength=len(hit))
    at = np.cumsum(count) - count
    out_s, out_e = np.empty(int(count.sum()), dtype=_I64), np.empty(int(count.sum()), dtype=_I64)
    whole = np.ones(len(a_s), dtype=bool)
    whole[hit] = False
    out_s[at[whole]], out_e[at[whole]] = a_s[whole], a_e[whole]
    slot = at[hit][owner] + (np.arange(len(owner)) - np.repeat(np.cumsum(per_hit) - per_hit, per_hit))
    out_s[slot], out_e[slot] = starts, ends
    return out_s, out_e


def _runs(x: np.ndarray, inside: np.ndarray) -> Intervals:
    """The maximal runs of ``inside`` over the elementary segments ``[x_i, x_{i+1})``."""
    if len(x) == 0:
        return empty()
    prev = np.concatenate(([False], inside[:-1]))
    return x[inside & ~prev], x[~inside & prev]


def _states(a: Intervals, b: Intervals) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boundaries ``x`` of ``a`` and ``b`` and, on each ``[x_i, x_{i+1})``, whether it lies in ``a`` / in ``b``."""
    a_s, a_e = _arrays(*a)
    b_s, b_e = _arrays(*b)
    keep_a, keep_b = a_e > a_s, b_e > b_s
    a_s, a_e, b_s, b_e = a_s[keep_a], a_e[keep_a], b_s[keep_b], b_e[keep_b]
    if len(a_s) == 0:
        return np.empty(0, dtype=_I64), np.empty(0, dtype=bool), np.empty(0, dtype=bool)
    points = np.concatenate([a_s, a_e, b_s, b_e])
    na, nb = len(a_s), len(b_s)
    delta_a = np.concatenate([np.ones(na, _I64), -np.ones(na, _I64), np.zeros(2 * nb, _I64)])
    delta_b = np.concatenate([np.zeros(2 * na, _I64), np.ones(nb, _I64), -np.ones(nb, _I64)])
    order = np.argsort(points, kind="stable")
    points = points[order]
    count_a = np.cumsum(delta_a[order])
    count_b = np.cumsum(delta_b[order])
    # the state on [x_i, x_{i+1}) is the count after the last event at x_i
    last = np.concatenate((points[1:] != points[:-1], [True]))
    x = points[last]
    return x, count_a[last] > 0, count_b[last] > 0


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """``a ∩ b`` as a union (inputs need not be unions)."""
    return _sweep(a, b, want_b=True)


def difference(a: Intervals, b: Intervals) -> Intervals:
    """``a − b`` as a union (inputs need not be unions)."""
    return _sweep(a, b, want_b=False)


def split(a: Intervals, b: Intervals) -> tuple[Intervals, Intervals]:
    """``(a ∩ b, a − b)`` from one sweep (inputs need not be unions; two unions are cut without one)."""
    a, b = _arrays(*a), _arrays(*b)
    if _is_union(a) and _is_union(b):
        return _pieces(a, b, True), _pieces(a, b, False)
    x, in_a, in_b = _states(a, b)
    return _runs(x, in_a & in_b), _runs(x, in_a & ~in_b)


def coverage(a: Intervals, b: Intervals) -> int:
    """Length of ``a ∩ b``: how much of ``a`` is covered by ``b``."""
    return lengths_sum(intersect(a, b))


def group_union(starts: np.ndarray, ends: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                    np.ndarray]:
    """Union per group (e.g. per stream or device): ``(starts, ends, group)`` sorted by group then start.

    Each group is shifted onto its own stretch of the number line (so no running maximum leaks between groups),
    merged with one global :func:`union`, and shifted back.
    """
    s, e = _arrays(starts, ends)
    g = np.asarray(groups).ravel()
    keep = e > s
    if not keep.all():
        s, e, g = s[keep], e[keep], g[keep]
    del keep
    if len(s) == 0:
        return s, e, g
    keys = distinct(g) if g.dtype.kind in "iu" else np.unique(g)
    gi = np.searchsorted(keys, g)  # np.unique's inverse, without a sort of every row
    lo = np.full(len(keys), np.iinfo(_I64).max, dtype=_I64)
    hi = np.full(len(keys), np.iinfo(_I64).min, dtype=_I64)
    np.minimum.at(lo, gi, s)
    np.maximum.at(hi, gi, e)
    width = hi - lo + 1  # +1 keeps the last end of one group from touching the next group's first start
    offset = np.r_[0, np.cumsum(width)[:-1]].astype(_I64)
    shift = offset[gi]
    shift -= lo[gi]
    del gi
    lifted_s = s + shift
    shift += e  # the lifted ends, in place
    us, ue = union(lifted_s, shift)
    del lifted_s, shift
    owner = np.searchsorted(offset, us, side="right") - 1
    back = offset[owner]
    back -= lo[owner]
    us -= back
    ue -= back
    return us, ue, keys[owner]


def cumulative(u: Intervals, t: np.ndarray) -> np.ndarray:
    """``F(t)`` = length of ``u ∩ (-inf, t)`` for each point ``t``; ``u`` must be a union."""
    u_s, u_e = u
    t = np.asarray(t, dtype=_I64)
    if len(u_s) == 0:
        return np.zeros(t.shape, dtype=_I64)
    cum = np.concatenate(([0], np.cumsum(u_e - u_s))).astype(_I64)
    k = np.searchsorted(u_s, t, side="left")  # intervals starting before t
    over = np.where(k > 0, np.maximum(u_e[np.maximum(k - 1, 0)] - t, 0), 0)
    return cum[k] - over


def measure_within(u: Intervals, win_starts: np.ndarray, win_ends: np.ndarray) -> np.ndarray:
    """Length of ``u ∩ [ws_i, we_i)`` for each window (windows may overlap or nest); ``u`` must be a union.

    Two searchsorted passes over ``u``'s boundaries plus a cumulative sum: O((n + m) log n).
    """
    ws, we = _arrays(win_starts, win_ends)
    we = np.maximum(we, ws)
    return cumulative(u, we) - cumulative(u, ws)


def overlaps(u: Intervals, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each interval ``[start, end)`` shares time with the union ``u`` (``measure_within(u, …) > 0``, by one
    binary search: the first interval of ``u`` ending after the start must begin before the end)."""
    s, e = _arrays(starts, ends)
    u_s, u_e = u
    if len(u_s) == 0:
        return np.zeros(len(s), dtype=bool)
    first = np.searchsorted(u_e, s, side="right")
    return (e > s) & (first < len(u_s)) & (u_s[np.minimum(first, len(u_s) - 1)] < e)


def clip(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> Intervals:
    """Intervals cut to ``[lo, hi)``; those left empty are dropped."""
    s, e = _arrays(starts, ends)
    s, e = np.maximum(s, lo), np.minimum(e, hi)
    keep = e > s
    return s[keep], e[keep]


def clip_to_windows(starts: np.ndarray, ends: np.ndarray, win_starts: np.ndarray,
                    win_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut intervals at the boundaries of sorted, disjoint windows.

    Returns ``(starts, ends, window, source)``: one piece per (interval, window) overlap, ``window`` the index of
    the window and ``source`` the index of the input interval. Time outside every window is dropped.
    """
    s, e = _arrays(starts, ends)
    ws, we = _arrays(win_starts, win_ends)
    first = np.searchsorted(we, s, side="right")  # first window ending after the start
    count = np.searchsorted(ws, e, side="left")  # windows starting before the end, from there on
    count -= first
    np.maximum(count, 0, out=count)
    if int(count.max(initial=0)) <= 1:  # each interval inside one window at most (gaps within steps): no repeats
        source = np.flatnonzero(count)
        window = first[source]
    else:
        source = np.repeat(np.arange(len(s)), count)
        step_in = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        window = np.repeat(first, count) + step_in
        del step_in
    del first, count
    ps = s[source]
    np.maximum(ps, ws[window], out=ps)
    pe = e[source]
    np.minimum(pe, we[window], out=pe)
    keep = pe > ps
    if keep.all():  # non-empty intervals: every piece is
        return ps, pe, window, source
    return ps[keep], pe[keep], window[keep], source[keep]


def window_of(points: np.ndarray, win_starts: np.ndarray, win_ends: np.ndarray) -> np.ndarray:
    """Index of the window holding each point (the latest-starting one whose ``[start, end)`` contains it), -1 if
    none. Windows must be sorted by start; nested windows resolve to the inner one only while it is open."""
    t = np.asarray(points, dtype=_I64)
    ws, we = _arrays(win_starts, win_ends)
    if len(ws) == 0:
        return np.full(t.shape, -1, dtype=np.int64)
    k = np.searchsorted(ws, t, side="right") - 1
    ok = (k >= 0) & (t < we[np.maximum(k, 0)])
    return np.where(ok, k, -1).astype(np.int64, copy=False)


def window_index(points: np.ndarray, win_starts: np.ndarray, win_ends: np.ndarray) -> np.ndarray:
    """:func:`window_of` for windows in any order: the index (into the given windows) of the window holding each
    point, -1 if none."""
    ws, we = _arrays(win_starts, win_ends)
    order = np.argsort(ws, kind="stable")
    found = window_of(points, ws[order], we[order])
    return np.where(found >= 0, order[np.maximum(found, 0)], -1) if len(order) else found


def window_ids(points: np.ndarray, win_starts: np.ndarray, win_ends: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The id (``ids``, one per window, e.g. the step numbers of a ``per_step`` frame) of the window holding each
    point, -1 if none: which step holds this time."""
    row = window_index(points, win_starts, win_ends)
    ids = np.asarray(ids, dtype=_I64)
    return np.where(row >= 0, ids[np.maximum(row, 0)], -1) if len(ids) else np.full(len(row), -1, dtype=_I64)


def gaps(u: Intervals, lo: int | None = None, hi: int | None = None) -> Intervals:
    """Holes of a union within ``[lo, hi)`` (default: between its first start and last end)."""
    u_s, u_e = u
    if len(u_s) == 0:
        if lo is not None and hi is not None and hi > lo:
            return np.array([lo], dtype=_I64), np.array([hi], dtype=_I64)
        return empty()
    lo = int(u_s[0]) if lo is None else lo
    hi = int(u_e[-1]) if hi is None else hi
    g_s = np.r_[lo, u_e].astype(_I64, copy=False)
    g_e = np.r_[u_s, hi].astype(_I64, copy=False)
    if lo <= u_s[0] and u_e[-1] <= hi:  # the union inside [lo, hi): only the two outer gaps can be empty
        first, stop = int(g_e[0] <= g_s[0]), len(g_s) - int(g_e[-1] <= g_s[-1])
        return g_s[first:stop], g_e[first:stop]
    return clip(g_s, g_e, lo, hi)


def range_min_max(values_min: np.ndarray, values_max: np.ndarray, lo_idx: np.ndarray,
                  hi_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For index ranges ``[lo_i, hi_i)`` over two aligned arrays: ``(min of values_min, max of values_max,
    non_empty)`` per range, via one ``reduceat`` each (ranges may overlap or nest)."""
    lo = np.asarray(lo_idx, dtype=np.int64)
    hi = np.asarray(hi_idx, dtype=np.int64)
    n = len(values_min)
    non_empty = hi > lo
    if n == 0 or len(lo) == 0:
        return np.zeros(len(lo), dtype=_I64), np.zeros(len(lo), dtype=_I64), np.zeros(len(lo), dtype=bool)
    lo_c = np.minimum(lo, n - 1)
    pairs = np.empty(2 * len(lo), dtype=np.int64)
    pairs[0::2] = lo_c
    pairs[1::2] = np.minimum(np.maximum(hi, lo_c), n)
    vmin = np.concatenate((np.asarray(values_min, dtype=_I64), [0]))
    vmax = np.concatenate((np.asarray(values_max, dtype=_I64), [0]))
    mins = np.minimum.reduceat(vmin, pairs)[0::2]
    maxs = np.maximum.reduceat(vmax, pairs)[0::2]
    return mins, maxs, non_empty
