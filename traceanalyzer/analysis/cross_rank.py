"""Cross-rank analysis: the same collective instance matched across ranks, split into transfer and wait.

Every participant is one (rank, device) summary with a ``collectives`` table (one row per communication kernel).
Instances are matched by the first key that applies:

1. ``seq``: the process-group sequence number, when every row of every rank knows it.
2. ``step+ordinal``: (kind, step number, order of that kind within the step), when steps are named alike on
   every rank: Kineto's ``ProfilerStep#N`` carries the same ``N`` on every rank, so windows that start on
   different steps still line up (detected steps are numbered per rank, so they are not used as keys).
3. ``ordinal+offset``: (kind, order of that kind within the rank), each rank shifted by the offset that makes
   the most ``(kind, bytes)`` pairs agree (ties: closest start times when clocks compare, else the smallest shift).

For a matched instance the **transfer** is the shortest rank's duration (that rank arrived last, so it hardly
waited) and every rank's **wait** is its duration minus the transfer. The **straggler** is the rank that arrives
last: by start time on a common clock when the clocks compare (one nsys file; Kineto files carrying
``baseTimeNanoseconds``, i.e. host clocks that may skew between machines), and by "least wait" (the rank the others
wait for) always.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..model.communication import bus_factors
from ..model.trace import Trace, TraceHeader
from .numeric.frames import array_of
from .results import CrossRankDetail, CrossRankSummary, DeviceSummary, rank_column

NAMED_STEP_SOURCES = ("profiler_step", "nvtx")  # DeviceSummary.step_source values numbered alike on every rank
MAX_OFFSET_SEARCH = 2048  # ordinal shifts tried when aligning ranks without step numbers
ALIGN_SAMPLE = 2048  # leading collectives of the reference rank compared per shift


def _clock_offsets(traces: Sequence[Trace | TraceHeader], parts: list[DeviceSummary]) -> dict[str, int] | None:
    """Offset (ns) that puts each trace file on one common clock, or None when the clocks do not compare."""
    paths = {d.trace for d in parts}
    if len(paths) == 1:
        return {next(iter(paths)): 0}
    by_path = {t.path: t for t in traces}
    bases = {p: getattr(by_path.get(p), "base_time_ns", None) for p in paths}
    if any(b is None for b in bases.values()):
        return None
    return {p: int(b) for p, b in bases.items() if b is not None}


def _cumcount(codes: np.ndarray) -> np.ndarray:
    """0-based place of each element among the equal codes before it."""
    order = np.argsort(codes, kind="stable")
    first = np.flatnonzero(np.concatenate(([True], codes[order][1:] != codes[order][:-1]))) if len(order) else order
    out = np.empty(len(order), dtype=np.int64)
    out[order] = np.arange(len(order)) - np.repeat(first, np.diff(np.concatenate((first, [len(order)]))))
    return out


def _ordinals(df: pd.DataFrame, by: list[str]) -> np.ndarray:
    """0-based order of each row within its group, rows taken in start-time order."""
    return _ordinals_of(array_of(df, "start_ns"), [array_of(df, k) for k in by])


def _ordinals_of(start: np.ndarray, by: list[np.ndarray]) -> np.ndarray:
    """:func:`_ordinals` of columns: the group of a row is its values in ``by``."""
    codes = np.zeros(len(start), dtype=np.int64)
    for column in by:
        part, uniques = pd.factorize(column, use_na_sentinel=False)
        codes = codes * max(len(uniques), 1) + part
    order = np.argsort(start, kind="stable")
    out = np.empty(len(start), dtype=np.int64)
    out[order] = _cumcount(codes[order])
    return out


Columns = dict[str, np.ndarray]  # one rank's collectives as named numpy columns of one length (no frame per rank)


def _rows(frame: Columns) -> int:
    return len(frame["start_ns"])


def _take(frame: Columns, rows: np.ndarray) -> Columns:
    return {k: v[rows] for k, v in frame.items()}


def _prepare(dev: DeviceSummary, offset: int | None) -> Columns:
    c = dev.collectives
    n = len(c)
    kind = c["kind"].astype(str).to_numpy() if "kind" in c else np.full(n, "unknown", dtype=object)
    start = array_of(c, "start_ns", np.int64)

    def column(name: str) -> np.ndarray:
        return array_of(c, name, np.int64) if name in c else np.full(n, -1, np.int64)

    step = column("step")
    return {
        "kind": kind, "start_ns": start,
        "duration_ns": array_of(c, "duration_ns", np.int64) if "duration_ns" in c
        else (c["end_ns"] - c["start_ns"]).to_numpy(np.int64),
        "step": step, "seq": column("seq"), "bytes": column("bytes"), "group_size": column("group_size"),
        "clock_ns": start + offset if offset is not None else np.full(n, -1, np.int64),
        "ordinal": _ordinals_of(start, [kind]), "step_ordinal": _ordinals_of(start, [kind, step]),
    }


def _start_order_positions(frame: Columns, shift: int = 0) -> np.ndarray:
    """Position of each row in start-time order, minus ``shift``."""
    pos = np.empty(_rows(frame), dtype=np.int64)
    pos[np.argsort(frame["start_ns"], kind="stable")] = np.arange(_rows(frame)) - shift
    return pos


def _best_shift(ref: Columns, other: Columns, comparable: bool) -> int:
    """Shift ``s`` such that ``other``'s row ``i + s`` (start order) is ``ref``'s row ``i``: most (kind, bytes)
    agreements over the first ``ALIGN_SAMPLE`` rows, then the closest start times (comparable clocks), then the
    smallest ``|s|``."""
    ref_order = np.argsort(ref["start_ns"], kind="stable")
    other_order = np.argsort(other["start_ns"], kind="stable")
    # one code per (kind, bytes) pair, equal across the two ranks for equal pairs
    kinds, _ = pd.factorize(np.concatenate([ref["kind"][ref_order], other["kind"][other_order]]))
    sizes, distinct_sizes = pd.factorize(np.concatenate([ref["bytes"][ref_order], other["bytes"][other_order]]))
    codes = kinds.astype(np.int64) * max(len(distinct_sizes), 1) + sizes
    a, b = codes[: min(_rows(ref), ALIGN_SAMPLE)], codes[_rows(ref):]
    a_t, b_t = ref["clock_ns"][ref_order][: len(a)], other["clock_ns"][other_order]
    shifts = np.arange(max(-(len(a) - 1), -MAX_OFFSET_SEARCH), min(len(b) - 1, MAX_OFFSET_SEARCH) + 1)
    if len(shifts) == 0:
        return 0

    def window(shift: int) -> tuple[slice, slice]:
        i0, i1 = max(0, -shift), min(len(a), len(b) - shift)
        return slice(i0, i1), slice(i0 + shift, i1 + shift)

    matches = np.array([int((a[wa] == b[wb]).sum()) for wa, wb in map(window, shifts.tolist())])  # per shift
    best = shifts[matches == matches.max()]
    if comparable and len(best) > 1:
        closeness = np.array([float(np.median(np.abs(a_t[wa] - b_t[wb]))) for wa, wb in map(window, best.tolist())])
        best = best[closeness == closeness.min()]
    return int(best[np.argmin(np.abs(best))])


def _keys(frames: list[Columns], comparable: bool, named_steps: bool) -> tuple[list[Columns], list[str], str]:
    """Add match-key columns to each rank's frame; returns the frames, the key columns and the method name.
    Step numbers are keys only when they are names shared by every rank (ProfilerStep#N, an NVTX range), not
    when each rank's steps were detected on its own."""
    if all(_rows(f) and (f["seq"] >= 0).all() for f in frames):
        return frames, ["kind", "seq"], "seq"
    steps = [set(f["step"][f["step"] >= 0].tolist()) for f in frames]
    if named_steps and all(steps) and set.intersection(*steps):
        return [_take(f, f["step"] >= 0) for f in frames], ["kind", "step", "step_ordinal"], "step+ordinal"
    shifts = [0] + [_best_shift(frames[0], f, comparable) for f in frames[1:]]
    for f, shift in zip(frames, shifts, strict=True):  # the frames are this module's own (_prepare)
        f["aligned"] = _start_order_positions(f, shift)
    return frames, ["kind", "aligned"], "ordinal+offset"


def _first_of_each_key(frame: Columns, keys: list[str]) -> Columns:
    """``frame.drop_duplicates(subset=keys)``: the first row of each key, in frame order (the frame itself when
    every key is distinct)."""
    codes = np.zeros(_rows(frame), dtype=np.int64)
    for key in keys:
        part, uniques = pd.factorize(frame[key], use_na_sentinel=False)
        codes = pd.factorize(codes * max(len(uniques), 1) + part)[0].astype(np.int64)
    first = np.unique(codes, return_index=True)[1]
    return frame if len(first) == len(codes) else _take(frame, np.sort(first))


def _shared_codes(frames: list[Columns], keys: list[str]) -> list[np.ndarray]:
    """One integer code per row for its match key, equal across ranks for equal keys (all ranks at once)."""
    lengths = [_rows(f) for f in frames]
    codes = np.zeros(sum(lengths), dtype=np.int64)
    for key in keys:
        part, uniques = pd.factorize(np.concatenate([f[key] for f in frames]))
        codes = pd.factorize(codes * max(len(uniques), 1) + part)[0].astype(np.int64)
    return np.split(codes, np.cumsum(lengths)[:-1])


def match_collectives(devices: list[DeviceSummary], clocks: dict[str, int] | None) -> tuple[pd.DataFrame, str]:
    """Wide table: one row per instance seen by every participant (in the first rank's order), per-rank
    start/duration/wait columns. A key seen twice on a rank counts its first row. Built from per-rank arrays in
    one pass: cost grows linearly with the number of ranks."""
    frames = [_prepare(d, None if clocks is None else clocks.get(d.trace)) for d in devices]
    named = all(d.step_source.startswith(NAMED_STEP_SOURCES) for d in devices)
    frames, keys, method = _keys(frames, clocks is not None, named)
    frames = [_first_of_each_key(f, keys) for f in frames]
    codes = _shared_codes(frames, keys)
    n_codes = int(max((c.max() for c in codes if len(c)), default=-1)) + 1
    ranks_with = np.zeros(n_codes, dtype=np.int64)
    for c in codes:
        ranks_with[c] += 1  # codes are distinct within a rank after drop_duplicates
    rows = np.flatnonzero(ranks_with[codes[0]] == len(frames))  # the first rank's rows every rank has
    wanted = codes[0][rows]
    first = _take(frames[0], rows)
    columns: dict[str, object] = {k: first[k] for k in keys}
    values = ["step", "bytes", "group_size", "start_ns", "clock_ns", "duration_ns"]
    where = np.empty(n_codes, dtype=np.int64)
    for i, (dev, f, c) in enumerate(zip(devices, frames, codes, strict=True)):
        where[c] = np.arange(len(c))
        take = where[wanted]
        for v in values:
            columns[rank_column(v, dev.rank)] = f[v][take]
        if i == 0:  # the first rank's sequence numbers and ordinals, for reading the table
            columns.update({k: first[k] for k in ("seq", "ordinal", "step_ordinal") if k not in keys})
    return pd.DataFrame(columns), method


def _instance_metrics(wide: pd.DataFrame, ranks: list[int], comparable: bool) -> pd.DataFrame:
    dur = np.column_stack([array_of(wide, rank_column("duration_ns", r), np.int64) for r in ranks])
    transfer = dur.min(axis=1)
    new: dict[str, object] = {"transfer_ns": transfer}
    new.update({rank_column("wait_ns", r): dur[:, i] - transfer for i, r in enumerate(ranks)})
    rank_arr = np.asarray(ranks)
    new["least_wait_rank"] = rank_arr[dur.argmin(axis=1)]
    if comparable:
        clock = np.column_stack([array_of(wide, rank_column("clock_ns", r), np.int64) for r in ranks])
        latest = clock.max(axis=1)
        # an instance where several ranks arrive at the same ns has no last arriver (not the first of them)
        new["last_arrival_rank"] = np.where((clock == latest[:, None]).sum(axis=1) == 1,
                                            rank_arr[clock.argmax(axis=1)], -1)
        new["arrival_skew_ns"] = clock.max(axis=1) - clock.min(axis=1)
    else:
        new["last_arrival_rank"] = -1
        new["arrival_skew_ns"] = -1
    new["step"] = array_of(wide, f"step_r{ranks[0]}", np.int64)
    size = np.column_stack([array_of(wide, rank_column("bytes", r), np.int64) for r in ranks]).max(axis=1)
    group = np.column_stack([array_of(wide, rank_column("group_size", r), np.int64) for r in ranks]).max(axis=1)
    new["bytes"] = size
    factor = bus_factors(wide["kind"].to_numpy(), group, len(ranks))
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where((size > 0) & (transfer > 0), size / np.maximum(transfer, 1), np.nan)  # B/ns = GB/s
    new["algbw_gbps"] = algbw
    new["busbw_gbps"] = algbw * factor
    kept = wide.drop(columns=[c for c in new if c in wide])
    added = pd.DataFrame(new, index=wide.index)
    out = pd.concat([kept, added], axis=1)
    order = [*wide.columns, *(c for c in new if c not in wide)]  # replaced columns keep their place
    return out[order]


def _clock_evidence(per: pd.DataFrame, ranks: list[int]) -> tuple[float, dict[int, int]] | None:
    """How far the common clock can be trusted at this scale: the share of instances whose last arriver is also
    the rank that waited least, and each rank's apparent clock offset to the first rank, the median of
    ``(start_r - start_0) - (wait_0 - wait_r)`` (zero when start gaps are explained by waits)."""
    if not len(per):
        return None
    ref = ranks[0]

    def of(name: str, rank: int) -> np.ndarray:
        return array_of(per, rank_column(name, rank), np.int64)

    clock0, wait0 = of("clock_ns", ref), of("wait_ns", ref)
    offsets = {r: int(np.median((of("clock_ns", r) - clock0) - (wait0 - of("wait_ns", r)))) for r in ranks[1:]}
    agree = float((per["last_arrival_rank"] == per["least_wait_rank"]).mean() * 100)
    return round(agree, 1), offsets


def _counts(values: pd.Series, ranks: list[int]) -> dict[int, int]:
    """How often each rank appears in ``values`` (0 for absent ones), in ``ranks`` order."""
    counts = values.value_counts()
    return {r: int(counts.get(r, 0)) for r in ranks}


def _mode(values: np.ndarray) -> int | None:
    values = values[values >= 0]
    if len(values) == 0:
        return None
    keys, counts = np.unique(values, return_counts=True)
    return int(keys[counts.argmax()])


def _per_step(per: pd.DataFrame, ranks: list[int]) -> tuple[int | None, dict[int, int], int]:
    stepped = per[per["step"] >= 0]
    if len(stepped) == 0:
        return None, {}, 0
    grouped = stepped.groupby("step")
    transfer = grouped["transfer_ns"].sum()
    medians = grouped[[rank_column("wait_ns", r) for r in ranks]].sum().median()
    waits = {r: int(medians[rank_column("wait_ns", r)]) for r in ranks}
    return int(transfer.median()), waits, len(transfer)


def analyze_cross_rank(traces: Sequence[Trace | TraceHeader], devices: list[DeviceSummary]) -> CrossRankSummary | None:
    """Match collectives across ranks; None when fewer than two ranks ran any communication."""
    parts: list[DeviceSummary] = []
    seen: set[int] = set()
    for d in devices:  # the first device with collectives of each rank
        if len(d.collectives) and d.rank not in seen:
            parts.append(d)
            seen.add(d.rank)
    if len(parts) < 2:
        return None
    clocks = _clock_offsets(traces, parts)
    ranks = [d.rank for d in parts]
    wide, method = match_collectives(parts, clocks)
    per = _instance_metrics(wide, ranks, clocks is not None)
    wait_total = {r: int(per[rank_column("wait_ns", r)].sum()) for r in ranks}
    transfer_step, wait_step, steps = _per_step(per, ranks)
    wait_basis = wait_step or wait_total  # per-step medians resist one bad (warm-up) step
    by_wait = min(wait_basis, key=lambda r: wait_basis[r]) if len(per) else None
    by_arrival = _mode(array_of(per, "last_arrival_rank")) if clocks is not None else None
    straggler = by_arrival if by_arrival is not None else by_wait
    sized = per["busbw_gbps"].notna()
    evidence = _clock_evidence(per, ranks) if clocks is not None else None
    detail = CrossRankDetail(
        ranks=ranks,
        wait_ns_per_step_by_rank=wait_step,
        transfer_ns_total=int(per["transfer_ns"].sum()),
        steps_matched=steps,
        straggler_by_arrival=by_arrival,
        straggler_by_least_wait=by_wait,
        least_wait_counts=_counts(per["least_wait_rank"], ranks),
        clock_comparable=clocks is not None,
        clock_note="one trace file: one clock" if clocks is not None and len(clocks) == 1 else
        "Kineto baseTimeNanoseconds + ts (host clocks: skew between machines adds to arrival times)"
        if clocks is not None else "clocks not comparable: straggler by least wait only",
        arrival_skew_ns_median=int(per["arrival_skew_ns"].median()) if clocks is not None and len(per) else None,
        algbw_gbps_median=float(per.loc[sized, "algbw_gbps"].median()) if sized.any() else None,
        busbw_gbps_median=float(per.loc[sized, "busbw_gbps"].median()) if sized.any() else None,
        unmatched_by_rank={d.rank: int(len(d.collectives) - len(per)) for d in parts},
        arrival_agrees_with_least_wait_pct=evidence[0] if evidence else None,
        clock_offset_ns_by_rank=evidence[1] if evidence else None,
    )
    return CrossRankSummary(collectives_matched=len(per), wait_ns_by_rank=wait_total,
                            transfer_ns_per_step=transfer_step, straggler_rank=straggler, match_method=method,
                            per_collective=per, detail=detail)
