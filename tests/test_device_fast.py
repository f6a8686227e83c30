"""Fast paths of the per-device analysis, each equal to its plain definition on random data."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from traceanalyzer.analysis import intervals as iv
from traceanalyzer.analysis.device import _exclusive

_spans = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 200), st.integers(0, 30)), min_size=0, max_size=60)
_windows = st.lists(st.tuples(st.integers(0, 230), st.integers(0, 40)), min_size=0, max_size=6)


def _sets(spans: list[tuple[int, int, int]]) -> dict[str, iv.Intervals]:
    """A union per bucket of random intervals (bucket ``b3`` outside the stated precedence)."""
    out = {}
    for b in sorted({b for b, _, _ in spans}):
        mine = [(s, s + n) for c, s, n in spans if c == b]
        out[f"b{b}"] = iv.union(np.array([s for s, _ in mine]), np.array([e for _, e in mine]))
    return out


def _plain_exclusive(busy: iv.Intervals, sets: dict[str, iv.Intervals], order: list[str]) -> dict[str, int]:
    """Busy minus the buckets before, intersected with the bucket, bucket by bucket."""
    out, remaining = {}, busy
    for bucket in order:
        out[bucket] = iv.coverage(remaining, sets[bucket])
        remaining = iv.difference(remaining, sets[bucket])
    return out


@settings(max_examples=80, deadline=None)
@given(spans=_spans, windows=_windows)
def test_exclusive_split_by_growing_union_matches_differences(spans: list[tuple[int, int, int]],
                                                              windows: list[tuple[int, int]]) -> None:
    sets = _sets(spans)
    order = [b for b in ("b2", "b0", "b1") if b in sets] + [b for b in ("b3",) if b in sets]
    nothing = np.empty(0, dtype=np.int64)
    busy = iv.union(np.concatenate([nothing, *[u[0] for u in sets.values()]]),
                    np.concatenate([nothing, *[u[1] for u in sets.values()]]))
    win = iv.union(np.array([s for s, _ in windows]), np.array([s + n for s, n in windows]))
    whole, within = _exclusive(sets, ("b2", "b0", "b1"), win)
    assert list(whole) == list(within) == order
    assert whole == _plain_exclusive(busy, sets, order)
    assert within == _plain_exclusive(iv.intersect(busy, win), {b: iv.intersect(u, win) for b, u in sets.items()},
                                      order)
    assert sum(whole.values()) == iv.lengths_sum(busy)
