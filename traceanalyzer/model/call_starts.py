"""Every host API call's start, kept exactly in 4 bytes a call (an nsys export read for a summary).

The what-if counts the profiler's recorded host events per step window (``analysis.what_if_range``); a big
export has tens of millions of calls, so their starts are kept as blocks (table ``api_start_blocks``: rank,
process, the block's first start, the position and number of its calls) of ``int32`` offsets from that start
(table ``api_starts``, ``offset_ns``), each block sorted and spanning less than 2**31 ns. A block holds calls of
one process from one chunk of the runtime table; blocks may overlap in time, so a count sums over blocks.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

#: A block spans less than this many ns, so every offset from its first start fits an int32.
BLOCK_SPAN_NS = 1 << 31

_Columns = dict[str, np.ndarray]


class Columns(Protocol):
    """Named columns: a ``Table`` or a dict of arrays."""

    def __getitem__(self, column: str, /) -> np.ndarray: ...


def start_blocks(start_ns: np.ndarray, pid: np.ndarray, first_row: int) -> tuple[_Columns, np.ndarray]:
    """(block columns ``pid``, ``start_ns``, ``first``, ``rows``; the offsets) of one chunk of calls: grouped by
    process, sorted by start, cut where a block would span ``BLOCK_SPAN_NS`` or more. ``first`` counts from
    ``first_row``, the position of this chunk's first offset in the whole table."""
    order = np.lexsort((start_ns, pid))
    s, p = start_ns[order], pid[order]
    n = len(s)
    if not n:
        empty = np.empty(0, dtype=np.int64)
        return {"pid": empty, "start_ns": empty, "first": empty, "rows": empty}, np.empty(0, dtype=np.int32)
    heads = [0]
    new_pid = np.flatnonzero(p[1:] != p[:-1]) + 1
    bounds = np.r_[0, new_pid, n]
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):  # one process at a time
        head = a
        while True:  # a block per BLOCK_SPAN_NS stretch that has calls
            nxt = a + int(np.searchsorted(s[a:b], s[head] + BLOCK_SPAN_NS))
            if nxt >= b:
                break
            heads.append(nxt)
            head = nxt
        if b < n:
            heads.append(b)
    first = np.asarray(heads, dtype=np.int64)
    rows = np.diff(np.r_[first, n])
    base = s[first]
    offsets = (s - np.repeat(base, rows)).astype(np.int32)
    return {"pid": p[first], "start_ns": base, "first": first + first_row, "rows": rows}, offsets


def counts_between(blocks: Columns, offsets: np.ndarray, rank: int, lo: np.ndarray,
                   hi: np.ndarray) -> np.ndarray:
    """Per window ``[lo, hi)``: the calls of ``rank`` starting in it."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    counts = np.zeros(len(lo), dtype=np.int64)
    mine = np.flatnonzero(np.asarray(blocks["rank"]) == rank)
    if not len(lo) or not len(mine):
        return counts
    for base, first, rows in zip(blocks["start_ns"][mine].tolist(), blocks["first"][mine].tolist(),
                                 blocks["rows"][mine].tolist(), strict=True):
        block = offsets[first:first + rows]
        last = base + int(block[-1])
        near = (hi > base) & (lo <= last)  # windows that may hold some of the block's calls
        if not near.any():
            continue
        # searched as int32 (no int64 copy of the block): lo <= last keeps lo - base below BLOCK_SPAN_NS
        a = np.maximum(lo[near] - base, 0).astype(np.int32)
        b = hi[near] - base
        past = b >= BLOCK_SPAN_NS
        before_hi = np.searchsorted(block, np.where(past, 0, b).astype(np.int32))
        counts[near] += np.where(past, rows, before_hi) - np.searchsorted(block, a)
    return counts


def without_rank(blocks: Columns, offsets: np.ndarray, rank: int) -> tuple[_Columns, np.ndarray]:
    """The blocks and offsets less ``rank``'s calls: its blocks dropped, the other blocks' calls moved up (in the
    order of their positions), as a summary lets go of a rank's starts once its devices are analysed."""
    names = ("start_ns", "pid", "rank", "first", "rows")
    keep = np.flatnonzero(np.asarray(blocks["rank"]) != rank)
    keep = keep[np.argsort(np.asarray(blocks["first"])[keep], kind="stable")]
    first, rows = np.asarray(blocks["first"])[keep], np.asarray(blocks["rows"])[keep]
    taken = np.zeros(len(offsets), dtype=bool)
    for at, n in zip(first.tolist(), rows.tolist(), strict=True):  # a loop over blocks, not calls
        taken[at:at + n] = True
    kept = {name: np.asarray(blocks[name])[keep] for name in names}
    kept["first"] = np.concatenate(([0], np.cumsum(rows)[:-1])).astype(np.int64) if len(rows) else rows
    return kept, offsets[taken]
