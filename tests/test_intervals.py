"""Exact and property tests of the vectorized interval engine (half-open [start, end) int64 ns)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceanalyzer.analysis.numeric import intervals as iv


def arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def pairs(u: iv.Intervals) -> list[tuple[int, int]]:
    return list(zip(u[0].tolist(), u[1].tolist(), strict=True))


def test_touching_intervals_merge_into_one():
    u = iv.union(arr(0, 5), arr(5, 9))
    assert pairs(u) == [(0, 9)]
    assert iv.total(arr(0, 5), arr(5, 9)) == 9


def test_nested_overlapping_and_zero_length():
    u = iv.union(arr(10, 0, 2, 3, 30, 30), arr(12, 8, 4, 3, 40, 30))
    assert pairs(u) == [(0, 8), (10, 12), (30, 40)]
    assert iv.total(arr(3), arr(3)) == 0
    assert pairs(iv.union(arr(), arr())) == []


def test_intersection_and_difference():
    a = (arr(0, 20), arr(10, 30))
    b = (arr(5, 10, 25), arr(8, 22, 40))
    assert pairs(iv.intersect(a, b)) == [(5, 8), (20, 22), (25, 30)]
    assert pairs(iv.difference(a, b)) == [(0, 5), (8, 10), (22, 25)]
    assert iv.coverage(a, b) == 3 + 2 + 5
    # touching pieces of the difference stay separate only when something lies between them
    assert pairs(iv.difference((arr(0), arr(10)), (arr(5), arr(5)))) == [(0, 10)]


def test_overlap_across_streams_counts_once():
    # stream 7: [0,10) [20,30); stream 9: [5,25)
    s, e = arr(0, 20, 5), arr(10, 30, 25)
    assert iv.total(s, e) == 30
    gs, ge, g = iv.group_union(s, e, arr(7, 7, 9))
    assert pairs((gs, ge)) == [(0, 10), (20, 30), (5, 25)]
    assert g.tolist() == [7, 7, 9]


def test_group_union_per_device_does_not_leak_between_groups():
    # device 0 has a long kernel; device 1's short ones inside that time must not merge with it
    s, e, g = arr(0, 10, 30, 50), arr(100, 20, 40, 60), arr(0, 1, 1, 0)
    gs, ge, gg = iv.group_union(s, e, g)
    assert list(zip(gg.tolist(), gs.tolist(), ge.tolist(), strict=True)) == [
        (0, 0, 100), (1, 10, 20), (1, 30, 40)]


def test_measure_within_windows_and_cumulative():
    u = iv.union(arr(0, 20), arr(10, 30))
    assert iv.cumulative(u, arr(-5, 0, 5, 10, 15, 25, 99)).tolist() == [0, 0, 5, 10, 10, 15, 20]
    got = iv.measure_within(u, arr(0, 5, 12, 0, 25), arr(30, 25, 18, 0, 100))
    assert got.tolist() == [20, 10, 0, 0, 5]


def test_clip_to_windows_splits_across_windows():
    s, e, w, src = iv.clip_to_windows(arr(0, 15, 50), arr(25, 16, 60), arr(5, 20), arr(15, 40))
    assert list(zip(s.tolist(), e.tolist(), w.tolist(), src.tolist(), strict=True)) == [
        (5, 15, 0, 0), (20, 25, 1, 0)]
    assert pairs(iv.clip(arr(0, 10), arr(5, 20), 3, 12)) == [(3, 5), (10, 12)]


def test_window_of_and_gaps():
    assert iv.window_of(arr(-1, 0, 9, 10, 25), arr(0, 20), arr(10, 30)).tolist() == [-1, 0, 0, -1, 1]
    u = iv.union(arr(0, 20), arr(10, 30))
    assert pairs(iv.gaps(u)) == [(10, 20)]
    assert pairs(iv.gaps(u, -5, 40)) == [(-5, 0), (10, 20), (30, 40)]


def test_which_window_holds_a_point_with_windows_in_any_order():
    # windows given out of start order: [20, 30) is window 0, [0, 10) window 1; ids are step numbers
    points = arr(-1, 0, 9, 10, 25)
    assert iv.window_index(points, arr(20, 0), arr(30, 10)).tolist() == [-1, 1, 1, -1, 0]
    assert iv.window_ids(points, arr(20, 0), arr(30, 10), arr(7, 3)).tolist() == [-1, 3, 3, -1, 7]
    assert iv.window_ids(points, arr(), arr(), arr()).tolist() == [-1] * 5


def test_range_min_max_handles_nested_and_empty_ranges():
    mins, maxs, ok = iv.range_min_max(arr(5, 3, 9, 1), arr(6, 4, 10, 2), arr(0, 1, 2, 4), arr(4, 3, 2, 4))
    assert ok.tolist() == [True, True, False, False]
    assert mins[ok].tolist() == [1, 3]
    assert maxs[ok].tolist() == [10, 10]


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        iv.union(arr(0, 1), arr(2))


# ---- properties against a per-ns brute force ---------------------------------------------------------------

span = st.integers(min_value=0, max_value=60)
interval_lists = st.lists(st.tuples(span, st.integers(min_value=0, max_value=12)), max_size=12)


def as_set(items: list[tuple[int, int]]) -> iv.Intervals:
    return arr(*[a for a, _ in items]), arr(*[a + d for a, d in items])


def mask(items: list[tuple[int, int]]) -> np.ndarray:
    m = np.zeros(80, dtype=bool)
    for a, d in items:
        m[a:a + d] = True
    return m


def runs(m: np.ndarray) -> list[tuple[int, int]]:
    d = np.diff(np.r_[0, m.astype(int), 0])
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


@settings(max_examples=200, deadline=None)
@given(interval_lists, interval_lists)
def test_set_algebra_matches_brute_force(a, b):
    ma, mb = mask(a), mask(b)
    assert pairs(iv.union(*as_set(a))) == runs(ma)
    assert pairs(iv.intersect(as_set(a), as_set(b))) == runs(ma & mb)
    assert pairs(iv.difference(as_set(a), as_set(b))) == runs(ma & ~mb)
    both, only_a = iv.split(as_set(a), as_set(b))
    assert (pairs(both), pairs(only_a)) == (runs(ma & mb), runs(ma & ~mb))
    assert iv.total(*as_set(a)) == int(ma.sum())


@settings(max_examples=200, deadline=None)
@given(interval_lists, st.lists(st.tuples(span, st.integers(0, 30)), max_size=6))
def test_measure_within_matches_brute_force(a, windows):
    m = mask(a)
    ws, we = as_set(windows)
    got = iv.measure_within(iv.union(*as_set(a)), ws, we)
    assert got.tolist() == [int(m[s:e].sum()) for s, e in zip(ws.tolist(), we.tolist(), strict=True)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(span, st.integers(0, 12), st.integers(0, 3)), max_size=14))
def test_group_union_matches_per_group_brute_force(items):
    s = arr(*[a for a, _, _ in items])
    e = arr(*[a + d for a, d, _ in items])
    g = arr(*[k for _, _, k in items])
    gs, ge, gg = iv.group_union(s, e, g)
    for key in range(4):
        expected = runs(mask([(a, d) for a, d, k in items if k == key]))
        sel = gg == key
        assert pairs((gs[sel], ge[sel])) == expected


@settings(max_examples=150, deadline=None)
@given(interval_lists, st.lists(st.tuples(span, st.integers(1, 10)), max_size=5))
def test_clip_to_windows_matches_brute_force(a, windows):
    wu = iv.union(*as_set(windows))  # disjoint sorted windows
    s, e, w, _ = iv.clip_to_windows(*as_set(a), *wu)
    for k, (lo, hi) in enumerate(pairs(wu)):
        sel = w == k
        got = mask(list(zip(s[sel].tolist(), (e[sel] - s[sel]).tolist(), strict=True)))
        expected = mask(a)
        expected[:lo] = False
        expected[hi:] = False
        assert np.array_equal(got, expected)


@settings(max_examples=300, deadline=None)
@given(interval_lists, interval_lists)
def test_unions_are_cut_as_the_sweep_cuts_them(a, b):
    """Between two unions, intersect/difference/split cut without sorting (_pieces): the same arrays as the sweep."""
    ua, ub = iv.union(*as_set(a)), iv.union(*as_set(b))
    x, in_a, in_b = iv._states(ua, ub)
    both, only_a = iv._runs(x, in_a & in_b), iv._runs(x, in_a & ~in_b)
    cut = iv.split(ua, ub)
    for got, expected in ((iv.intersect(ua, ub), both), (iv.difference(ua, ub), only_a), (cut[0], both),
                          (cut[1], only_a)):
        assert got[0].dtype == expected[0].dtype == np.int64
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
