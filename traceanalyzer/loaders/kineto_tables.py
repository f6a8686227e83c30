"""Kineto complete-event columns → the normalized tables (kernels, memops, api_calls, ranges, collectives).

Per-name work (copy kind, API suffix, ProfilerStep) runs once per distinct name, then maps back with numpy.
Every table is ordered by ``start_ns`` (stable: ties keep file order).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model.trace import StringPool, Table

if TYPE_CHECKING:
    from .kineto import Complete

_STEP_NAME = re.compile(r"ProfilerStep#\d+")
_API_SUFFIX = re.compile(r"_v\d+$")
_COPY_KINDS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")
# Bytes per element of the dtype names torch writes in record_param_comms ("dtype" arg).
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16, "UInt16": 2, "UInt32": 4, "UInt64": 8,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "Float8_e8m0fnu": 1,
    "Float4_e2m1fn_x2": 1, "QInt8": 1, "QUInt8": 1, "QInt32": 4,
}


def build_tables(c: Complete, pool: StringPool, rank: int, tables: frozenset[str] | None) -> dict[str, Table]:
    """The tables asked for (all when ``tables`` is None; kernels always)."""
    builders: dict[str, Callable[[Complete, StringPool, int], Table]] = {
        "kernels": _kernels, "memops": _memops, "api_calls": _api_calls, "ranges": _ranges,
        "collectives": _collectives, "stream_waits": _stream_waits,
    }
    out = {}
    for name, build in builders.items():
        if name == "kernels" or tables is None or name in tables:
            out[name] = build(c, pool, rank).sorted_by("start_ns")
    return out


def _kernels(c: Complete, pool: StringPool, rank: int) -> Table:
    rows = c.rows("kernel")
    return Table.from_columns(
        "kernels", len(rows), start_ns=c.start_ns[rows], end_ns=c.end_ns[rows], pid=c.pid[rows], rank=rank,
        device=_or(c.device[rows], c.pid[rows]), stream=_or(c.stream[rows], c.tid[rows]),
        correlation=c.correlation[rows], external_id=c.external_id[rows], name_id=c.name_id[rows],
        grid=c.grid[rows], block=c.block[rows],
    )


def _memops(c: Complete, pool: StringPool, rank: int) -> Table:
    copies, sets = c.rows("gpu_memcpy"), c.rows("gpu_memset")
    rows = np.concatenate([copies, sets])
    kind = np.concatenate([np.full(len(copies), pool.intern("memcpy"), np.int32),
                           np.full(len(sets), pool.intern("memset"), np.int32)])
    copy_kind = np.concatenate([_map_names(c.name_id[copies], pool, copy_kind_of),
                                np.full(len(sets), -1, np.int32)])
    return Table.from_columns(
        "memops", len(rows), start_ns=c.start_ns[rows], end_ns=c.end_ns[rows], pid=c.pid[rows], rank=rank,
        device=_or(c.device[rows], c.pid[rows]), stream=_or(c.stream[rows], c.tid[rows]),
        correlation=c.correlation[rows], kind_id=kind, copy_kind_id=copy_kind, bytes=c.bytes[rows],
        name_id=c.name_id[rows],
    )


def copy_kind_of(name: str) -> str:
    """``"Memcpy DtoD (Device -> Device)"`` → ``"DtoD"``; peer copies → ``"PtoP"``; else ``"unknown"``."""
    if "peer" in name.lower() or "PtoP" in name:
        return "PtoP"
    parts = name.split()
    token = parts[1] if len(parts) > 1 and parts[0].lower() == "memcpy" else ""
    return token if token in _COPY_KINDS else "unknown"


def _api_calls(c: Complete, pool: StringPool, rank: int) -> Table:
    rows = np.sort(np.concatenate([c.rows("cuda_runtime"), c.rows("cuda_driver")]))
    return Table.from_columns(
        "api_calls", len(rows), start_ns=c.start_ns[rows], end_ns=c.end_ns[rows], pid=c.pid[rows], rank=rank,
        tid=c.tid[rows], correlation=c.correlation[rows], external_id=c.external_id[rows],
        name_id=_map_names(c.name_id[rows], pool, lambda s: _API_SUFFIX.sub("", s)),
    )


def _ranges(c: Complete, pool: StringPool, rank: int) -> Table:
    parts = {cat: c.rows(cat) for cat in ("cpu_op", "user_annotation", "gpu_user_annotation", "python_function",
                                          "cuda_sync")}
    rows = np.concatenate(list(parts.values()))
    kind = np.concatenate([np.full(len(r), pool.intern(cat), np.int32) for cat, r in parts.items()])
    cpu_side = np.concatenate([np.full(len(r), cat not in ("gpu_user_annotation", "cuda_sync"))
                               for cat, r in parts.items()])
    # GPU-side synchronization (Stream Wait Event, Event/Context Sync): its own stream, -1 when device-wide
    exact_stream = np.concatenate([np.full(len(r), cat == "cuda_sync") for cat, r in parts.items()])
    name_id = c.name_id[rows]
    step = np.isin(name_id, [i for i in np.unique(name_id).tolist() if _STEP_NAME.fullmatch(pool[i])]) & cpu_side
    kind = np.where(step, pool.intern("profiler_step"), kind).astype(np.int32)
    none = np.int64(-1)
    return Table.from_columns(
        "ranges", len(rows), start_ns=c.start_ns[rows], end_ns=c.end_ns[rows], pid=c.pid[rows], rank=rank,
        tid=np.where(cpu_side, c.tid[rows], none),
        device=np.where(cpu_side, none, _or(c.device[rows], c.pid[rows])),
        stream=np.where(cpu_side, none, np.where(exact_stream, c.stream[rows], _or(c.stream[rows], c.tid[rows]))),
        kind_id=kind, name_id=name_id, correlation=c.correlation[rows], external_id=c.external_id[rows],
    )


def _stream_waits(c: Complete, pool: StringPool, rank: int) -> Table:
    """``cuda_sync`` "Stream Wait Event" rows that name the event record they wait on (``wait_on_stream``,
    ``wait_on_cuda_event_record_corr_id``: PyTorch's ``enable_cuda_sync_events``)."""
    rows = np.array(sorted(c.wait_args), dtype=np.int64)
    rows = rows[c.stream[rows] >= 0]  # a stream waits ("Event Sync" rows are the host waiting: no stream)
    args = [c.wait_args[i] for i in rows.tolist()]
    return Table.from_columns(
        "stream_waits", len(rows), start_ns=c.start_ns[rows], pid=c.pid[rows], rank=rank,
        device=_or(c.device[rows], c.pid[rows]), wait_stream=c.stream[rows], wait_correlation=c.correlation[rows],
        record_stream=np.array([as_int(a.wait_on_stream) for a in args], dtype=np.int64),
        record_correlation=np.array([as_int(a.wait_on_record) for a in args], dtype=np.int64),
    )


def _collectives(c: Complete, pool: StringPool, rank: int) -> Table:
    """``record_param_comms`` CPU ops with collective args (else ``nccl:*`` ops with them, else the collective
    kernels' own args — newer torch copies name, sizes, dtype, group and sequence number onto the kernel row, which a
    capture without CPU activity still has —, else ``nccl:*`` annotations by name alone, sizes unknown). ``wait``
    entries that torch records are kept as rows. Rows from kernels carry the kernel's times and correlation."""
    cpu = np.sort(np.concatenate([c.rows("cpu_op"), c.rows("user_annotation")]))
    with_args = np.array(sorted(c.comm_args), dtype=np.int64)
    on_kernel = np.isin(with_args, c.rows("kernel"))
    host_args, kernel_args = with_args[~on_kernel], with_args[on_kernel]
    names = c.name_id[host_args]
    comms_id = pool.get("record_param_comms")
    rows = host_args[names == comms_id] if np.any(names == comms_id) else host_args
    if len(rows):
        return _collectives_from_args(c, pool, rank, rows)
    if len(kernel_args):
        return _collectives_from_args(c, pool, rank, kernel_args)
    nccl = np.isin(c.name_id[cpu], [i for i in np.unique(c.name_id[cpu]).tolist() if pool[i].startswith("nccl:")])
    rows = cpu[nccl]
    short = _map_names(c.name_id[rows], pool, lambda s: s.removeprefix("nccl:"))
    return Table.from_columns(
        "collectives", len(rows), start_ns=c.start_ns[rows], end_ns=c.end_ns[rows], pid=c.pid[rows], rank=rank,
        external_id=c.external_id[rows], name_id=short,
    )


def _collectives_from_args(c: Complete, pool: StringPool, rank: int, rows: np.ndarray) -> Table:
    args = [c.comm_args[i] for i in rows.tolist()]
    in_nelems = np.array([as_int(a.in_nelems) for a in args], dtype=np.int64)
    dtypes = [a.dtype if isinstance(a.dtype, str) else None for a in args]
    size = np.array([DTYPE_BYTES.get(d, -1) if d else -1 for d in dtypes], dtype=np.int64)
    return Table.from_columns(
        "collectives", len(rows), start_ns=c.start_ns[rows], end_ns=c.end_ns[rows], pid=c.pid[rows], rank=rank,
        external_id=c.external_id[rows], correlation=c.correlation[rows],
        name_id=pool.intern_many([str(a.collective) for a in args]),
        in_nelems=in_nelems, out_nelems=np.array([as_int(a.out_nelems) for a in args], dtype=np.int64),
        dtype_id=pool.intern_many(dtypes),
        bytes=np.where((in_nelems >= 0) & (size > 0), in_nelems * size, -1),
        group_size=np.array([as_int(a.group_size) for a in args], dtype=np.int64),
        pg_name_id=pool.intern_many([_as_text(a.pg_name if a.pg_name is not None else a.pg_id) for a in args]),
        pg_ranks_id=pool.intern_many([_as_text(a.pg_ranks) for a in args]),
        seq=np.array([as_int(a.seq if a.seq is not None else a.seq_lower) for a in args], dtype=np.int64),
    )


# -- helpers --------------------------------------------------------------------------------------------------


def _or(primary: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """``primary`` where known (>= 0), else ``fallback``."""
    return np.where(primary >= 0, primary, fallback)


def _map_names(ids: np.ndarray, pool: StringPool, fn: Callable[[str], str]) -> np.ndarray:
    """Apply ``fn`` to each distinct pooled string once; return the ids of the results, row by row."""
    if not len(ids):
        return np.zeros(0, np.int32)
    uniq, inverse = np.unique(ids, return_inverse=True)
    mapped = np.array([pool.intern(fn(pool[i])) if i >= 0 else -1 for i in uniq.tolist()], dtype=np.int32)
    return mapped[inverse]


class OutOfRange(Exception):
    """An integer field of the trace holds a value beyond int64 (the loader reports it as bad input)."""

    def __init__(self, field: str, value: object) -> None:
        super().__init__(f"{field} = {str(value)[:40]} is out of range")
        self.field = field


INT64_MAX = (1 << 63) - 1


def dims_product(dims: list[Any], field: str = "args.grid") -> np.ndarray:
    """x*y*z of grid/block lists; ``-1`` where absent or not a list of integers; :class:`OutOfRange` when a
    product does not fit in int64."""
    try:
        arr = np.array(dims)
    except (ValueError, OverflowError):  # ragged, or integers numpy cannot hold
        arr = np.zeros(0)
    small = arr.dtype.kind in "ib" and arr.shape == (len(dims), 3) and (
        not len(arr) or int(np.abs(arr).max()) < 1 << 21)  # JSON arrays of three integers whose product fits
    if small:
        return arr.astype(np.int64).prod(axis=1)
    return np.fromiter((_dims_one(d, field) for d in dims), dtype=np.int64, count=len(dims))


def _dims_one(value: Any, field: str) -> int:
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        product = math.prod(value)
        if not -INT64_MAX <= product <= INT64_MAX:
            raise OutOfRange(field, value)
        return product
    return -1


def as_int(value: Any) -> int:
    """An integer from a JSON value (int, integral float, decimal or ``0x`` text); ``-1`` otherwise."""
    if isinstance(value, bool):
        return -1
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else -1
    if isinstance(value, str):
        try:
            return int(value.strip(), 0)
        except ValueError:
            return -1
    return -1


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)
