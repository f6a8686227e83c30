"""Fast paths of the per-device analysis, each equal to its plain definition on random data."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from traceanalyzer.analysis.device import _exclusive
from traceanalyzer.analysis.grouped import dense_codes, distinct, sorted_runs
from traceanalyzer.analysis.numeric import intervals as iv
from traceanalyzer.analysis.structure.steps import project_to_gpu
from traceanalyzer.analysis.what_if.comm_free import _contention, _dependency_latency
from traceanalyzer.findings.evidence import NORM_NAME, _names_match, most_frequent_names
from traceanalyzer.model.trace import StringPool, Table, Trace

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
    whole, within = _exclusive(dict(sets), ("b2", "b0", "b1"), busy, win)  # consumes the dict it is given
    assert list(whole) == list(within) == order
    assert whole == _plain_exclusive(busy, sets, order)
    assert within == _plain_exclusive(iv.intersect(busy, win), {b: iv.intersect(u, win) for b, u in sets.items()},
                                      order)
    assert sum(whole.values()) == iv.lengths_sum(busy)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-1, 6), st.integers(-5, 60)), min_size=1, max_size=50),
       big=st.booleans())
def test_names_then_durations_by_one_sort_match_a_lexsort(rows: list[tuple[int, int]], big: bool) -> None:
    name_id = np.array([n for n, _ in rows], dtype=np.int32)
    dur = np.array([abs(d) for _, d in rows], dtype=np.int64) + ((1 << 41) if big else 0)  # big: the lexsort path
    for d in (dur, np.array([d for _, d in rows], dtype=np.int64)):  # negative durations: the lexsort path too
        ids, first_row, which = np.unique(name_id, return_index=True, return_inverse=True)
        order = np.lexsort((d, which))
        got_ids, got_first_row, got_sorted, got_first = sorted_runs(name_id, d)
        assert got_ids.tolist() == ids.tolist() and got_ids.dtype == ids.dtype
        assert got_first_row.tolist() == first_row.tolist()
        assert got_sorted.tolist() == d[order].tolist()
        assert got_first.tolist() == np.flatnonzero(np.r_[True, which[order][1:] != which[order][:-1]]).tolist()


@settings(max_examples=80, deadline=None)
@given(spans=_spans, probes=st.lists(st.tuples(st.integers(0, 240), st.integers(0, 20)), max_size=30))
def test_overlaps_is_a_positive_measure(spans: list[tuple[int, int, int]], probes: list[tuple[int, int]]) -> None:
    u = iv.union(np.array([s for _, s, _ in spans], dtype=np.int64), np.array([s + n for _, s, n in spans]))
    s = np.array([a for a, _ in probes], dtype=np.int64)
    e = s + np.array([n for _, n in probes], dtype=np.int64)
    assert iv.overlaps(u, s, e).tolist() == (iv.measure_within(u, s, e) > 0).tolist()


def _plain_contention(act: SimpleNamespace, per_step: pd.DataFrame) -> pd.Series:
    """The what-if's contention as first written: pandas group-by median, join and group-by sum."""
    k, compute = act.kernels, ~act.kernel_is_comm
    s, e = k["start_ns"][compute], k["end_ns"][compute]
    frame = pd.DataFrame({"name": k["name_id"][compute], "grid": k["grid"][compute], "block": k["block"][compute],
                          "dur": e - s, "beside": iv.measure_within(act.comm, s, e) > 0})
    keys = ["name", "grid", "block"]
    base = frame[~frame["beside"]].groupby(keys)["dur"].median().rename("base")
    frame = frame.join(base, on=keys)
    excess = (frame["dur"] - frame["base"]).clip(lower=0).where(frame["beside"] & frame["base"].notna(), 0)
    order = np.argsort(per_step["start_ns"].to_numpy(), kind="stable")
    win = iv.window_of(s, per_step["start_ns"].to_numpy()[order], per_step["end_ns"].to_numpy()[order])
    step = np.where(win >= 0, per_step["step"].to_numpy()[order][np.maximum(win, 0)], -1)
    out = excess.groupby(step).sum()
    return out[out.index >= 0].astype(np.int64)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 40), st.integers(0, 3), st.integers(0, 2),
                               st.booleans()), min_size=1, max_size=60),
       cuts=st.lists(st.integers(0, 450), min_size=1, max_size=5, unique=True))
def test_contention_matches_the_pandas_definition(rows: list[tuple[int, int, int, int, bool]],
                                                   cuts: list[int]) -> None:
    rows = sorted(rows)
    col = {name: np.array([r[i] for r in rows], dtype=np.int64) for i, name in enumerate(("start_ns", "dur", "name_id",
                                                                                         "grid"))}
    kernels = {"start_ns": col["start_ns"], "end_ns": col["start_ns"] + col["dur"], "name_id": col["name_id"],
               "grid": col["grid"], "block": col["grid"] % 2}
    is_comm = np.array([r[4] for r in rows])
    act = SimpleNamespace(kernels=kernels, kernel_is_comm=is_comm,
                          comm=iv.union(kernels["start_ns"][is_comm], kernels["end_ns"][is_comm]))
    bounds = sorted(cuts)
    per_step = pd.DataFrame({"step": np.arange(len(bounds))[::-1], "start_ns": bounds,
                             "end_ns": [*bounds[1:], bounds[-1] + 60]})
    if not (~is_comm).any() or len(act.comm[0]) == 0:
        return
    got, want = _contention(act, per_step), _plain_contention(act, per_step)  # type: ignore[arg-type]
    assert got.index.tolist() == want.index.tolist() and got.tolist() == want.tolist()


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.integers(-3, 2**40), max_size=40))
def test_dense_codes_are_unique_inverse(values: list[int]) -> None:
    v = np.array(values, dtype=np.int64)
    assert dense_codes(v).tolist() == np.unique(v, return_inverse=True)[1].tolist()


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(-1, 5), max_size=40))
def test_most_frequent_names_by_id_match_counting_the_texts(ids: list[int]) -> None:
    trace = Trace("t", "nsys-sqlite", StringPool(["a", "b", "None", "c", "d", "e"]), {})
    rows = np.array(ids, dtype=np.int32)
    want = pd.Series(trace.names(rows).astype(str)).value_counts().head(3)
    assert list(most_frequent_names(trace, rows, 3).items()) == list(zip(want.index, want.tolist(), strict=True))
    positive = rows[rows >= 0]
    want = pd.Series(trace.names(positive).astype(str)).value_counts().head(3)
    assert list(most_frequent_names(trace, positive, 3).items()) == list(zip(want.index, want.tolist(), strict=True))


@settings(max_examples=80, deadline=None)
@given(spans=_spans)
def test_merge_of_two_unions_is_their_union(spans: list[tuple[int, int, int]]) -> None:
    a = [(s, s + n) for b, s, n in spans if b % 2 == 0]
    b = [(s, s + n) for c, s, n in spans if c % 2 == 1]
    ua = iv.union(np.array([s for s, _ in a], dtype=np.int64), np.array([e for _, e in a], dtype=np.int64))
    ub = iv.union(np.array([s for s, _ in b], dtype=np.int64), np.array([e for _, e in b], dtype=np.int64))
    want = iv.union(np.r_[ua[0], ub[0]], np.r_[ua[1], ub[1]])
    got = iv.merge_unions(ua, ub)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def _plain_projection(act: SimpleNamespace, starts: np.ndarray, ends: np.ndarray, pids: np.ndarray,
                      tids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The GPU projection over kernels and memory operations concatenated, as first written."""
    g_start, g_end = np.zeros(len(starts), dtype=np.int64), np.zeros(len(starts), dtype=np.int64)
    found = np.zeros(len(starts), dtype=bool)
    launch_ns = np.r_[act.launch_ns, act.memop_launch_ns]
    launch_pid = np.r_[act.launch_pid, act.memop_launch_pid]
    launch_tid = np.r_[act.launch_tid, act.memop_launch_tid]
    k_start = np.r_[act.kernels["start_ns"], act.memops["start_ns"]]
    k_end = np.r_[act.kernels["end_ns"], act.memops["end_ns"]]
    linked = launch_ns >= 0
    for pid, tid in np.unique(np.c_[pids, tids], axis=0):
        rows = np.flatnonzero((pids == pid) & (tids == tid))
        ksel = linked & (launch_pid == pid)
        if tid >= 0 and (ksel & (launch_tid == tid)).any():
            ksel &= launch_tid == tid
        idx = np.flatnonzero(ksel)
        idx = idx[np.argsort(launch_ns[idx], kind="stable")]
        lo = np.searchsorted(launch_ns[idx], starts[rows], side="left")
        hi = np.searchsorted(launch_ns[idx], np.maximum(ends[rows], starts[rows]), side="left")
        g_start[rows], g_end[rows], found[rows] = iv.range_min_max(k_start[idx], k_end[idx], lo, hi)
    return g_start, g_end, found


_work = st.lists(st.tuples(st.integers(-1, 100), st.integers(0, 1), st.integers(-1, 1), st.integers(0, 20)),
                 max_size=25)


@settings(max_examples=80, deadline=None)
@given(kernels=_work, memops=_work,
       ranges=st.lists(st.tuples(st.integers(0, 100), st.integers(0, 40), st.integers(0, 1), st.integers(-1, 1)),
                       min_size=1, max_size=8))
def test_projection_of_kernels_and_memops_apart_matches_them_together(
        kernels: list[tuple[int, int, int, int]], memops: list[tuple[int, int, int, int]],
        ranges: list[tuple[int, int, int, int]]) -> None:
    def part(rows: list[tuple[int, int, int, int]]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray,
                                                             np.ndarray]:
        launch = np.array([r[0] for r in rows], dtype=np.int64)
        start = np.maximum(launch, 0) + 5
        return ({"start_ns": start, "end_ns": start + np.array([r[3] for r in rows], dtype=np.int64)}, launch,
                np.array([r[1] for r in rows], dtype=np.int64), np.array([r[2] for r in rows], dtype=np.int64))
    (k, k_launch, k_pid, k_tid), (m, m_launch, m_pid, m_tid) = part(kernels), part(memops)
    act = SimpleNamespace(kernels=k, memops=m, launch_ns=k_launch, launch_pid=k_pid, launch_tid=k_tid,
                          memop_launch_ns=m_launch, memop_launch_pid=m_pid, memop_launch_tid=m_tid)
    starts = np.array([r[0] for r in ranges], dtype=np.int64)
    ends = starts + np.array([r[1] for r in ranges], dtype=np.int64)
    pids, tids = np.array([r[2] for r in ranges], dtype=np.int64), np.array([r[3] for r in ranges], dtype=np.int64)
    got = project_to_gpu(act, starts, ends, pids, tids)  # type: ignore[arg-type]
    want = _plain_projection(act, starts, ends, pids, tids)
    assert got[2].tolist() == want[2].tolist()
    assert got[0][got[2]].tolist() == want[0][want[2]].tolist() and got[1][got[2]].tolist() == want[1][want[2]].tolist()


@settings(max_examples=80, deadline=None)
@given(spans=_spans, windows=_windows)
def test_clip_to_windows_matches_one_piece_per_overlap(spans: list[tuple[int, int, int]],
                                                       windows: list[tuple[int, int]]) -> None:
    s = np.array([a for _, a, _ in spans], dtype=np.int64)
    e = s + np.array([n for _, _, n in spans], dtype=np.int64)
    ws, we = iv.union(np.array([a for a, _ in windows], dtype=np.int64),
                      np.array([a + n for a, n in windows], dtype=np.int64))
    want = sorted((max(a, x), min(b, y), w, i) for i, (a, b) in enumerate(zip(s.tolist(), e.tolist(), strict=True))
                  for w, (x, y) in enumerate(zip(ws.tolist(), we.tolist(), strict=True)) if max(a, x) < min(b, y))
    got = iv.clip_to_windows(s, e, ws, we)
    assert sorted(zip(*(g.tolist() for g in got), strict=True)) == want
    assert got[3].tolist() == sorted(got[3].tolist())  # by source interval, then window


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.integers(-3, 2**40), max_size=40), repeat=st.integers(1, 3000))
def test_distinct_is_np_unique(values: list[int], repeat: int) -> None:
    v = np.tile(np.array(values, dtype=np.int64), repeat)  # long enough for several chunks
    assert distinct(v).tolist() == np.unique(v).tolist() and distinct(v).dtype == v.dtype
    same = np.full(repeat, 7, dtype=np.int32)
    assert distinct(same).tolist() == [7] and distinct(same).dtype == same.dtype


@settings(max_examples=80, deadline=None)
@given(spans=_spans, lo=st.integers(-10, 260), hi=st.integers(-10, 260))
def test_gaps_match_the_clipped_holes(spans: list[tuple[int, int, int]], lo: int, hi: int) -> None:
    u = iv.union(np.array([s for _, s, _ in spans], dtype=np.int64), np.array([s + n for _, s, n in spans]))
    if len(u[0]) == 0:
        return
    want = iv.clip(np.r_[lo, u[1]], np.r_[u[0], hi], lo, hi)
    got = iv.gaps(u, lo, hi)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    inside = iv.gaps(u, min(lo, int(u[0][0])), max(hi, int(u[1][-1])))  # the fast path
    want = iv.clip(np.r_[min(lo, int(u[0][0])), u[1]], np.r_[u[0], max(hi, int(u[1][-1]))], min(lo, int(u[0][0])),
                   max(hi, int(u[1][-1])))
    assert inside[0].tolist() == want[0].tolist() and inside[1].tolist() == want[1].tolist()


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(-1, 5), max_size=40), many=st.booleans())
def test_name_matches_by_lookup_match_testing_each_name(ids: list[int], many: bool) -> None:
    names = ["rms_norm", "gemm", "None", "layer_norm_x", "add", "LayerNorm"]
    names += [f"k{i}" for i in range(60 if many else 0)]  # a pool larger than the rows: their distinct ids
    trace = Trace("t", "nsys-sqlite", StringPool(names), {})
    rows = np.array(ids, dtype=np.int32)
    for pattern in (NORM_NAME, re.compile("^None$"), re.compile("e")):
        want = [bool(pattern.search(str(n))) for n in trace.names(rows)]
        assert _names_match(trace, rows, pattern).tolist() == want


def _plain_latency(act: SimpleNamespace, launch_bound: np.ndarray) -> np.ndarray:
    """The dependency latency computed for every kernel, then kept for the communication ones (as first written)."""
    k, out = act.kernels, np.zeros(len(act.kernels), dtype=np.int64)
    b_start, b_end = act.busy
    if len(b_start) < 2 or not act.kernel_is_comm.any():
        return out
    start, end = k["start_ns"], k["end_ns"]
    pos = np.searchsorted(b_start, start, side="right") - 1
    opens = (pos >= 1) & (b_start[np.maximum(pos, 0)] == start)
    before = np.where(opens, start - b_end[np.maximum(pos - 1, 0)], 0)
    typical = before[opens & ~act.kernel_is_comm & ~launch_bound]
    if len(typical) == 0:
        return out
    usual = int(np.median(typical))
    closes = (pos >= 0) & (pos + 1 < len(b_start)) & (b_end[np.clip(pos, 0, len(b_end) - 1)] == end)
    nxt_start = b_start[np.clip(pos + 1, 0, len(b_start) - 1)]
    nxt = np.minimum(np.searchsorted(start, nxt_start, side="left"), len(start) - 1)
    after = np.where(closes & ~launch_bound[nxt], nxt_start - end, 0)
    lat = np.where(opens & ~launch_bound, np.maximum(before - usual, 0), 0) + np.maximum(after - usual, 0)
    return np.where(act.kernel_is_comm, lat, 0).astype(np.int64)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 25), st.booleans(), st.booleans()), min_size=1,
                     max_size=50))
def test_dependency_latency_of_the_communication_kernels_alone(rows: list[tuple[int, int, bool, bool]]) -> None:
    rows = sorted(rows)
    start = np.array([r[0] for r in rows], dtype=np.int64)
    kernels = Table.from_columns("kernels", len(rows), start_ns=start,
                                 end_ns=start + np.array([r[1] for r in rows], dtype=np.int64))
    act = SimpleNamespace(kernels=kernels, kernel_is_comm=np.array([r[2] for r in rows]),
                          busy=iv.union(kernels["start_ns"], kernels["end_ns"]))
    launch_bound = np.array([r[3] for r in rows])
    got, host_gap = _dependency_latency(act, SimpleNamespace(launch_bound=launch_bound))  # type: ignore[arg-type]
    assert got.tolist() == _plain_latency(act, launch_bound).tolist()  # no step, no gap over DEPENDENCY_MAX_NS
    assert not host_gap.any()
