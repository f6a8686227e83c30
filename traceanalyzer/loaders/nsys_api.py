"""The CUDA API rows a summary reads from an nsys export, picked in one pass over the runtime table.

The runtime table is an export's biggest (4–5 rows per kernel). It is read once, in chunks of integer columns
(:func:`~.nsys_sql.table_chunks`), and a summary keeps from it only

* in ``api_calls``: the calls that launched a kernel or a memory operation (the ``correlationId`` of a kernel,
  memcpy or memset row), the calls named as :data:`~traceanalyzer.model.api_names.SELECTED_API_NAMES` says (blocking,
  synchronising, graph launches), and for each outermost CPU range issuing a collective
  (:data:`~traceanalyzer.model.api_names.ISSUE_OP`) the first call starting in it and the one ending last among the
  calls overlapping it: all that ``host_issue.api_span_within`` reads of the calls such a range makes;
* in ``api_starts`` and ``api_start_blocks``: the start of every call, 4 bytes each
(:mod:`~traceanalyzer.model.call_starts`;
  the profiler's recorded host events, which the what-if counts per step).

Rows that cannot be true are left out and counted with :mod:`.sanity`'s rule (end before start; beyond the
capture, whose bounds come from the GPU activity already read), so its warning names the same numbers as when
every row is read. Rows stay in table order.
"""

from __future__ import annotations

import numpy as np

from ..model.api_names import ISSUE_OP, SELECTED_API_NAMES
from ..model.call_starts import start_blocks
from ..model.trace import ApiCallsSubset, StringPool
from .nsys_sql import sorted_by_start, table_chunks
from .nsys_tables import RUNTIME, ReadContext, int_expr, read_api_calls, strip_api_version
from .sanity import capture_bounds

#: Words every name of :data:`SELECTED_API_NAMES` contains (an SQL ``LIKE`` pre-filter of StringIds).
_NAME_WORDS = ("Synchronize", "GraphLaunch", "Memcpy", "Malloc", "Free", "HostAlloc", "StreamWaitEvent")
_NONE = np.iinfo(np.int64).max

_Columns = dict[str, np.ndarray]


def read_needed_api_calls(ctx: ReadContext, cols: dict[str, _Columns]
                          ) -> tuple[_Columns, _Columns, _Columns, ApiCallsSubset | None]:
    """(``api_calls`` of the rows a summary reads; ``api_starts`` and ``api_start_blocks``, every call's start
    (:mod:`~traceanalyzer.model.call_starts`; blocks by ``pid``); counts of the rows left out as impossible plus
    ``rows``, the calls read). ``cols``: the tables already read (kernels, memops, ranges). Without GPU activity
    to bound the capture, every row is read (no starts, None)."""
    table_cols = ctx.schema.cols(RUNTIME)
    if not table_cols:
        return {}, {}, {}, None
    bounds = capture_bounds([cols[t]["start_ns"] for t in ("kernels", "memops") if cols.get(t)])
    issue = _IssueRanges.of(ctx.pool, cols.get("ranges") or {}, bounds) if bounds is not None else None
    if bounds is None or issue is None:
        return read_api_calls(ctx), {}, {}, None
    lo, hi, _ = bounds
    is_launch = _Launches(np.concatenate([cols[t]["correlation"] for t in ("kernels", "memops") if cols.get(t)]),
                          ctx.counts.get(RUNTIME, 0))
    names = np.asarray(_selected_name_ids(ctx), dtype=np.int64)
    # globalTid read once and split here (PID_SQL, TID_SQL): one column less to format and parse
    exprs = ["start", 'IFNULL("end", start)', "IFNULL(globalTid, 0)", int_expr(table_cols, "correlationId"),
             int_expr(table_cols, "nameId")]
    read = [("start_ns", "i8"), ("end_ns", "i8"), ("global_tid", "i8"), ("correlation", "i8"), ("name_sid", "i8")]
    # process and thread ids are 24 bits (PID_SQL, TID_SQL): int32 from the start, as the trace keeps them
    fields = [("start_ns", "i8"), ("end_ns", "i8"), ("pid", "i4"), ("tid", "i4"), ("correlation", "i8"),
              ("name_sid", "i8")]
    expected = ctx.counts.get(RUNTIME, 0)
    # outputs preallocated at their largest size and filled in place: no per-chunk parts to concatenate, and the
    # rows never kept leave their pages untouched (a large np.empty is mapped, not resident, until written)
    kept = _Filled([("row", "i8" if expected >= 1 << 31 else "i4"), *fields], expected)
    offsets = _Filled([("offset_ns", "i4")], expected)  # every call's start, 4 bytes each (.call_starts)
    blocks: list[_Columns] = []
    negative = beyond = row = 0
    for chunk in table_chunks(ctx.conn, RUNTIME, exprs, read, ctx.tick, plain=ctx.plain, expected=expected,
                              sources=["start", "end", "globalTid", "correlationId", "nameId"]):
        global_tid = chunk.pop("global_tid")
        chunk = {"start_ns": chunk["start_ns"], "end_ns": chunk["end_ns"],
                 "pid": ((global_tid >> 24) & 0xFFFFFF).astype(np.int32),
                 "tid": (global_tid & 0xFFFFFF).astype(np.int32), "correlation": chunk["correlation"],
                 "name_sid": chunk["name_sid"]}
        s, e = chunk["start_ns"], chunk["end_ns"]
        bad_order = e < s
        outside = ((s < lo) | (s > hi) | (e > hi) | (e < lo)) & ~bad_order
        negative += int(bad_order.sum())
        beyond += int(outside.sum())
        ok = ~(bad_order | outside)
        rows = row + np.flatnonzero(ok)
        row += len(s)
        if not ok.all():
            chunk = {k: v[ok] for k, v in chunk.items()}
        block, offset = start_blocks(chunk["start_ns"], chunk["pid"], offsets.rows)
        blocks.append(block)
        offsets.append({"offset_ns": offset})
        keep = is_launch(chunk["correlation"])
        keep |= np.isin(chunk["name_sid"], names)
        issue.offer(chunk, rows)
        kept.append_rows(np.flatnonzero(keep), {"row": rows, **chunk})
    ends = issue.rows()
    if len(ends["row"]):  # those not kept already, merged in table order
        taken = kept.columns()["row"]  # increasing
        pos = np.minimum(np.searchsorted(taken, ends["row"]), max(len(taken) - 1, 0))
        new = taken[pos] != ends["row"] if len(taken) else np.ones(len(ends["row"]), dtype=bool)
        kept.merge_rows("row", {k: v[new] for k, v in ends.items()})
    api = kept.columns()
    del api["row"]
    (api["name_id"],) = ctx.ids([api.pop("name_sid")], transform=strip_api_version)
    starts = {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]} if blocks else {}
    checked = ApiCallsSubset(rows=int(row), end_before_start=int(negative), beyond_capture=int(beyond))
    return sorted_by_start(api), offsets.columns(), starts, checked


class _Launches:
    """Whether a call's correlation id is one of ``launched`` (the GPU activity's; ``-1`` for none): a lookup
    table indexed by the id when ids are dense (one gather per call), else a binary search."""

    def __init__(self, launched: np.ndarray, calls: int) -> None:
        launched = launched[launched >= 0]
        top = int(launched.max()) if len(launched) else -1
        self.table: np.ndarray | None = None
        self.sorted = np.empty(0, dtype=np.int64)
        if top <= 4 * max(calls, len(launched)) + (1 << 20):
            self.table = np.zeros(top + 2, dtype=bool)  # the last slot, False, takes -1 and every id past top
            self.table[launched] = True
        else:
            self.sorted = np.unique(launched)

    def __call__(self, correlation: np.ndarray) -> np.ndarray:
        if self.table is not None:
            return self.table[np.clip(correlation, -1, len(self.table) - 1)]
        if not len(self.sorted):
            return np.zeros(len(correlation), dtype=bool)
        pos = np.minimum(np.searchsorted(self.sorted, correlation), len(self.sorted) - 1)
        return self.sorted[pos] == correlation


class _Filled:
    """Columns preallocated for ``capacity`` rows and filled from the front, part by part (grown by
    concatenation only when a live file holds more rows than it counted)."""

    def __init__(self, fields: list[tuple[str, str]], capacity: int) -> None:
        self._cols = {name: np.empty(max(capacity, 0), dtype=dtype) for name, dtype in fields}
        self._n = 0

    def append(self, part: _Columns) -> None:
        """Copy ``part``'s columns (same names) after the rows filled so far."""
        k = len(next(iter(part.values())))
        n = self._n
        if n + k > len(next(iter(self._cols.values()))):
            self._reserve(n + max(k, n))
        for name, a in self._cols.items():
            a[n:n + k] = part[name]
        self._n = n + k

    def append_rows(self, index: np.ndarray, part: _Columns) -> None:
        """Copy rows ``index`` of ``part``'s columns after the rows filled so far (no temporary per column)."""
        k, n = len(index), self._n
        if n + k > len(next(iter(self._cols.values()))):
            self.append({name: column[index] for name, column in part.items()})
            return
        for name, a in self._cols.items():
            np.take(part[name], index, out=a[n:n + k])
        self._n = n + k

    def merge_rows(self, key: str, part: _Columns, block: int = 1 << 20) -> None:
        """Merge ``part``'s rows in among those filled, both increasing in column ``key`` (``part`` holds no
        value of it that the rows filled do), in place: the rows filled move right, ``block`` rows at a time
        from the last, to where ``part``'s rows before them leave room. Only a block's worth of temporary."""
        n, m = self._n, len(part[key])
        self._reserve(n + m)
        keys, added = self._cols[key], part[key]
        at = np.arange(m) + np.searchsorted(keys[:n], added)  # where part's rows go
        for hi in range(n, 0, -block):  # from the right: a block never lands on rows still to move
            lo = max(hi - block, 0)
            to = np.arange(lo, hi) + np.searchsorted(added, keys[lo:hi])
            for column in self._cols.values():
                column[to] = column[lo:hi].copy()
        for name, column in self._cols.items():
            column[at] = part[name]
        self._n = n + m

    def _reserve(self, rows: int) -> None:
        if rows > len(next(iter(self._cols.values()))):
            self._cols = {name: np.concatenate([a[:self._n], np.empty(rows - self._n, a.dtype)])
                          for name, a in self._cols.items()}

    @property
    def rows(self) -> int:
        """Rows filled so far."""
        return self._n

    def columns(self) -> _Columns:
        """The filled rows (views)."""
        return {name: a[:self._n] for name, a in self._cols.items()}


def _selected_name_ids(ctx: ReadContext) -> list[int]:
    """StringIds ids of the API names an analysis selects calls by (matched without the version suffix)."""
    if not ctx.schema.has("StringIds", "id", "value"):
        return []
    like = " OR ".join(f"value LIKE '%{w}%'" for w in _NAME_WORDS)
    rows = ctx.conn.execute(f"SELECT id, value FROM StringIds WHERE {like}").fetchall()
    return sorted(int(i) for i, v in rows if isinstance(v, str) and isinstance(i, int)
                  and any(p.search(strip_api_version(v)) for p in SELECTED_API_NAMES))


def _thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return np.asarray(pid, dtype=np.int64) * (1 << 32) + (np.asarray(tid, dtype=np.int64) & 0xFFFFFFFF)


class _IssueRanges:
    """The outermost CPU ranges issuing a collective, per thread (as ``host_issue.containing`` finds them), and
    for each the first call starting in it and the call ending last among those overlapping it, over the chunks
    offered. Times are lifted onto one axis, one stretch per thread (``lane * span + t - lo``)."""

    def __init__(self, threads: np.ndarray, lo: np.ndarray, hi: np.ndarray, origin: int, span: int) -> None:
        self.threads, self.lo, self.hi, self.origin, self.span = threads, lo, hi, origin, span
        n = len(lo)
        self.first_start = np.full(n, _NONE, dtype=np.int64)
        self.last_end = np.full(n, -1, dtype=np.int64)
        self.first: list[_Columns] = []
        self.last: list[_Columns] = []

    @classmethod
    def of(cls, pool: StringPool, ranges: _Columns, bounds: tuple[int, int, int]) -> _IssueRanges | None:
        """The ranges that survive :mod:`.sanity` (inside ``bounds``); None where one axis cannot hold them."""
        lo, hi, _ = bounds
        empty = np.empty(0, dtype=np.int64)
        if not ranges or not len(ranges["start_ns"]):
            return cls(empty, empty, empty, lo, 1)
        name_ids = np.unique(ranges["name_id"][ranges["name_id"] >= 0])
        wanted = [i for i in name_ids.tolist() if ISSUE_OP.search(pool[i])]
        s, e = ranges["start_ns"], ranges["end_ns"]
        sel = np.isin(ranges["name_id"], wanted) & (e > s) & (s >= lo) & (e <= hi)
        s, e, thread = s[sel], e[sel], _thread_key(ranges["pid"][sel], ranges["tid"][sel])
        threads, lane = np.unique(thread, return_inverse=True)
        span = hi - lo + 1
        if len(threads) and len(threads) * span >= 1 << 62:
            return None
        order = np.lexsort((-(e - s), s, thread))
        ls, le = lane.ravel()[order] * span + (s[order] - lo), lane.ravel()[order] * span + (e[order] - lo)
        outer = np.r_[True, ls[1:] >= np.maximum.accumulate(le)[:-1]] if len(ls) else np.zeros(0, dtype=bool)
        return cls(threads, ls[outer], le[outer], lo, span)

    def offer(self, chunk: _Columns, rows: np.ndarray) -> None:
        """Take the chunk's calls (``rows``: their row numbers) that may be a range's first or last call."""
        if not len(self.lo) or not len(rows):
            return
        thread = _thread_key(chunk["pid"], chunk["tid"])
        pos = np.minimum(np.searchsorted(self.threads, thread), len(self.threads) - 1)
        on = np.flatnonzero(self.threads[pos] == thread)
        if not len(on):
            return
        base = pos[on] * self.span - self.origin
        cs, ce = chunk["start_ns"][on] + base, chunk["end_ns"][on] + base
        at = np.searchsorted(self.lo, cs, side="right") - 1  # the last range starting at or before each call
        inside = (at >= 0) & (cs < self.hi[np.maximum(at, 0)])
        self._first(chunk, rows, on[inside], at[inside], cs[inside])
        # overlapping: the call starts inside the range, or before it (in its thread) and ends after its start
        cand_at, cand_end, cand_idx = [at[inside]], [ce[inside]], [on[inside]]
        nxt = at + 1
        lane_end = (pos[on] + 1) * self.span
        while True:
            j = np.minimum(nxt, len(self.lo) - 1)
            over = (nxt < len(self.lo)) & (self.lo[j] < lane_end) & (ce > self.lo[j])
            if not over.any():
                break
            cand_at.append(nxt[over])
            cand_end.append(ce[over])
            cand_idx.append(on[over])
            nxt = nxt + 1
        self._last(chunk, rows, np.concatenate(cand_idx), np.concatenate(cand_at), np.concatenate(cand_end))

    def _first(self, chunk: _Columns, rows: np.ndarray, idx: np.ndarray, at: np.ndarray, key: np.ndarray) -> None:
        order = np.lexsort((rows[idx], key, at))
        at, key, idx = at[order], key[order], idx[order]
        head = np.r_[True, at[1:] != at[:-1]] if len(at) else np.zeros(0, dtype=bool)
        at, key, idx = at[head], key[head], idx[head]
        better = key < self.first_start[at]
        self.first_start[at[better]] = key[better]
        self.first.append({"at": at[better], "row": rows[idx[better]],
                           **{k: v[idx[better]] for k, v in chunk.items()}})

    def _last(self, chunk: _Columns, rows: np.ndarray, idx: np.ndarray, at: np.ndarray, key: np.ndarray) -> None:
        order = np.lexsort((rows[idx], -key, at))
        at, key, idx = at[order], key[order], idx[order]
        head = np.r_[True, at[1:] != at[:-1]] if len(at) else np.zeros(0, dtype=bool)
        at, key, idx = at[head], key[head], idx[head]
        better = key > self.last_end[at]
        self.last_end[at[better]] = key[better]
        self.last.append({"at": at[better], "row": rows[idx[better]],
                          **{k: v[idx[better]] for k, v in chunk.items()}})

    def rows(self) -> _Columns:
        """The calls still first or last of a range (columns of the chunks, ``row``), each once, by row."""
        parts = []
        for offers, best, field in ((self.first, self.first_start, "start_ns"), (self.last, self.last_end, "end_ns")):
            if not offers:
                continue
            got = {k: np.concatenate([o[k] for o in offers]) for k in offers[0]}
            lane_base = np.searchsorted(self.threads, _thread_key(got["pid"], got["tid"])) * self.span - self.origin
            still = best[got["at"]] == got[field] + lane_base
            # several offers may tie on the best value (a later chunk cannot beat it strictly): keep the first
            got = {k: v[still] for k, v in got.items()}
            _, head = np.unique(got["at"], return_index=True)
            parts.append({k: v[head] for k, v in got.items() if k != "at"})
        if not parts:
            return {"row": np.empty(0, dtype=np.int64)}
        both = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        _, once = np.unique(both["row"], return_index=True)  # a call can be first of one range and last of another
        return {k: v[once] for k, v in both.items()}
