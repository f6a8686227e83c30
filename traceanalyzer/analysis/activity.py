"""The GPU activity of one (rank, device), gathered once for every per-device analysis.

Kernels and memory operations of the device, sorted by start, with their bucket strings, which of them are
communication, the launch time of each kernel (the host API call that shares its correlation id) and the three
unions every definition builds on: busy (all kernels + memops), comm (communication kernels + peer-to-peer copies)
and compute (non-communication *kernels*; memory ops run on copy engines and hide nothing, so they are not compute).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

import numpy as np

from ..model.schema import fits_int32
from ..model.trace import Table, Trace
from .grouped import distinct
from .numeric import intervals as iv

COMMUNICATION = "communication"
MEMORY = "memory"


_T = TypeVar("_T")


class _derived(Generic[_T]):
    """A property computed on first read and cached in the instance, until :meth:`DeviceActivity.forget_derived`;
    after it, computed on every read and not kept."""

    def __init__(self, build: Callable[[Any], _T]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _derived[_T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> _T: ...

    def __get__(self, obj: object | None, owner: type) -> _T | _derived[_T]:
        if obj is None:
            return self
        cache = obj.__dict__
        if self.name in cache:
            return cache[self.name]
        value = self.build(obj)
        if not cache.get("_settled"):
            cache[self.name] = value
        return value


@dataclass
class DeviceActivity:
    """Kernels and memops of one (rank, device), sorted by start, with derived unions (all int64 ns)."""

    trace: Trace
    rank: int
    device: int
    pids: np.ndarray
    kernels: Table
    memops: Table
    kernel_is_comm: np.ndarray
    memop_is_comm: np.ndarray
    launch_row: np.ndarray  # row of the launching call in trace.api_calls, -1 when it links to none (int32 if fits)
    memop_launch_row: np.ndarray  # the same for memops
    comm: iv.Intervals

    # Derived on first read, dropped by :meth:`forget_derived` once the device analysis is done (a summary's
    # findings read few of them again): each is about as long as the device's kernels.
    @_derived
    def busy(self) -> iv.Intervals:
        """Union of every kernel and memop; the kernels, in start order, make a union without a sort."""
        k, m = self.kernels, self.memops
        return iv.merge_unions(iv.union(k["start_ns"], k["end_ns"]), iv.union(m["start_ns"], m["end_ns"]))

    @_derived
    def launch_ns(self) -> np.ndarray:
        """Host launch time per kernel (start of the launching API call), -1 when unlinked."""
        return self._launch(self.launch_row, "start_ns")

    @_derived
    def launch_pid(self) -> np.ndarray:
        """Process of the launching call per kernel, -1 when unlinked (int32 where every one fits)."""
        return self._launch(self.launch_row, "pid")

    @_derived
    def launch_tid(self) -> np.ndarray:
        """Thread of the launching call per kernel, -1 when unlinked (int32 where every one fits)."""
        return self._launch(self.launch_row, "tid")

    @_derived
    def memop_launch_ns(self) -> np.ndarray:
        """:attr:`launch_ns` of the memops."""
        return self._launch(self.memop_launch_row, "start_ns")

    @_derived
    def memop_launch_pid(self) -> np.ndarray:
        """:attr:`launch_pid` of the memops."""
        return self._launch(self.memop_launch_row, "pid")

    @_derived
    def memop_launch_tid(self) -> np.ndarray:
        """:attr:`launch_tid` of the memops."""
        return self._launch(self.memop_launch_row, "tid")

    def _launch(self, rows: np.ndarray, column: str) -> np.ndarray:
        """``api_calls[column]`` of the launching call at each of ``rows`` (-1 where unlinked); ids narrowed."""
        values = _via(rows, self.trace.api_calls[column])
        return values if column == "start_ns" else _narrow(values)

    def forget(self, *names: str) -> None:
        """Drop the cached derived columns ``names`` (of :data:`LAUNCH_COLUMNS`, ``busy``, ``compute``); a later
        read builds and caches them again."""
        for name in names:
            self.__dict__.pop(name, None)

    def forget_derived(self) -> None:
        """Drop every cached derived column (:attr:`busy`, :attr:`compute`, the launch columns) and cache them no
        more: each later read builds its own, dropped with it. What a summary keeps of a device between its
        analysis and the findings is then the views of the trace's rows, the launch rows, the comm union and the
        flags; the findings read a derived column of a device once or twice."""
        self.__dict__["_settled"] = True
        for name in _DERIVED:
            self.__dict__.pop(name, None)

    @property
    def memop_bucket(self) -> np.ndarray:
        """Bucket string of each memop (object array), looked up on each read: not kept per memop."""
        return _memop_buckets(self.trace, self.memops)

    @property
    def kernel_bucket(self) -> np.ndarray:
        """Bucket string of each kernel (object array), looked up on each read: not kept per kernel."""
        return self.trace.names(self.kernels["bucket_id"]).astype(object, copy=False)

    @_derived
    def compute(self) -> iv.Intervals:
        """Union of the non-communication kernels; cached until :meth:`forget_derived` (the device analysis reads
        it three times, nothing after it but ``compare``)."""
        compute = ~self.kernel_is_comm
        return iv.union(self.kernels["start_ns"][compute], self.kernels["end_ns"][compute])


    @property
    def span(self) -> tuple[int, int]:
        """First start to last end of any kernel or memop (``(0, 0)`` when empty)."""
        if len(self.busy[0]) == 0:
            return 0, 0
        return int(self.busy[0][0]), int(self.busy[1][-1])


def _rows_of(table: Table, rank: int, device: int) -> Table:
    """Rows of (rank, device) in start order: views of the table's rows when they are consecutive and in start
    order already (as the nsys loader stores them, ``Table.group_by_device``), else one gather."""
    idx = np.flatnonzero((table["rank"] == rank) & (table["device"] == device))
    if len(idx) == 0 or idx[-1] - idx[0] + 1 == len(idx):
        lo, hi = (int(idx[0]), int(idx[-1]) + 1) if len(idx) else (0, 0)
        start = table["start_ns"][lo:hi]
        if len(start) < 2 or bool((start[1:] >= start[:-1]).all()):
            return table if hi - lo == len(table) else table.rows(lo, hi)
    return table.take(idx[np.argsort(table["start_ns"][idx], kind="stable")])


def _memop_buckets(trace: Trace, memops: Table) -> np.ndarray:
    """Bucket per memop: the classifier's column when present, else PtoP copies are communication."""
    if "bucket_id" in memops:
        return trace.names(memops["bucket_id"]).astype(object)
    ptop = memops["copy_kind_id"] == trace.strings.get("PtoP")
    return np.where(ptop, COMMUNICATION, MEMORY).astype(object)


def launch_rows(trace: Trace, kernels: Table) -> np.ndarray:
    """Row in ``api_calls`` of the call that launched each kernel or memop (joined on correlation id within the
    same pid, or within the only API process when the rows' pid names none, as Kineto's GPU pids); -1 if none."""
    rows = np.full(len(kernels), -1, dtype=np.int64)
    api = trace.api_calls
    if len(api) == 0 or len(kernels) == 0:
        return rows
    api_pid = api["pid"]
    one_api_pid = bool((api_pid == api_pid[0]).all())
    k_pid, k_corr_all = kernels["pid"], kernels["correlation"]
    for pid in distinct(k_pid):  # one pass per process, not per event
        mine = (k_pid == pid) & (k_corr_all >= 0)
        k_sel = None if mine.all() else np.flatnonzero(mine)  # None: every row (no index array of them all)
        del mine
        same = api_pid == pid
        if one_api_pid and not same[0]:  # the one API process, whatever pid the rows name
            same[:] = True
        same &= api["correlation"] >= 0
        a_sel = np.flatnonzero(same)
        del same
        if (k_sel is not None and len(k_sel) == 0) or len(a_sel) == 0:
            continue
        a_corr = api["correlation"][a_sel]
        if not bool((a_corr[1:] >= a_corr[:-1]).all()):  # an nsys process's calls come in correlation order
            order = np.argsort(a_corr, kind="stable")
            a_corr, a_sel = a_corr[order], a_sel[order]
            del order
        k_corr = k_corr_all if k_sel is None else k_corr_all[k_sel]
        pos = np.searchsorted(a_corr, k_corr)
        np.minimum(pos, len(a_corr) - 1, out=pos)
        hit = a_corr[pos] == k_corr
        del a_corr, k_corr
        if k_sel is None and hit.all():
            rows = a_sel[pos].astype(np.int64, copy=False)
        elif k_sel is None:
            rows[hit] = a_sel[pos[hit]]
        else:
            rows[k_sel[hit]] = a_sel[pos[hit]]
    return rows


def _via(rows: np.ndarray, column: np.ndarray) -> np.ndarray:
    """``column`` at each row, -1 where the row is -1 (in the column's dtype)."""
    if not len(column):
        return np.full(len(rows), -1, dtype=np.int64)
    out = column[np.maximum(rows, 0)]
    out[rows < 0] = -1
    return out


def _narrow(ids: np.ndarray) -> np.ndarray:
    """Ids (processes, threads) or row numbers as int32 where every one fits: they are compared, keyed or used to
    index, never summed, and kept per kernel with the device's activity."""
    return ids.astype(np.int32, copy=False) if fits_int32(ids) else ids


def gather(trace: Trace, rank: int, device: int) -> DeviceActivity:
    """Collect the activity of ``(rank, device)`` from a classified trace."""
    kernels = _rows_of(trace.kernels, rank, device)
    memops = _rows_of(trace.memops, rank, device)
    if "bucket_id" not in kernels:
        raise ValueError("trace is not classified (kernels have no bucket_id); load it with classify=True")
    m_comm = _memop_buckets(trace, memops) == COMMUNICATION
    comm_id = trace.strings.get(COMMUNICATION)  # compared by string id: no string per row
    k_comm = kernels["bucket_id"] == comm_id if comm_id >= 0 else np.zeros(len(kernels), dtype=bool)
    comm = iv.union(np.r_[kernels["start_ns"][k_comm], memops["start_ns"][m_comm]],
                    np.r_[kernels["end_ns"][k_comm], memops["end_ns"][m_comm]])
    rows = _narrow(launch_rows(trace, kernels))
    m_rows = _narrow(launch_rows(trace, memops))
    launch_pid = trace.api_calls["pid"][rows[rows >= 0]] if len(trace.api_calls) else np.empty(0, dtype=np.int64)
    pids = np.unique(np.r_[distinct(kernels["pid"]), distinct(memops["pid"]), distinct(launch_pid[launch_pid >= 0])])
    return DeviceActivity(trace, rank, device, pids, kernels, memops, k_comm, m_comm, rows, m_rows, comm)


#: The derived launch columns of :class:`DeviceActivity` (each as long as the device's kernels or memops).
LAUNCH_COLUMNS = ("launch_ns", "launch_pid", "launch_tid", "memop_launch_ns", "memop_launch_pid", "memop_launch_tid")
_DERIVED = ("busy", "compute", *LAUNCH_COLUMNS)
