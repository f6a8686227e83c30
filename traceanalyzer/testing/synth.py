"""Tiny synthetic Traces with hand-computable answers, already classified (bucket columns set).

>>> from traceanalyzer.testing.synth import make_trace
>>> t = make_trace(kernels=[(0, 10, 0, 7, "gemm_a", "gemm"), (5, 20, 0, 9, "ncclAllReduce", "communication")])

Kernel tuples: ``(start, end, device, stream, name, bucket[, subbucket[, correlation[, external_id]]])``.
Memop tuples: ``(start, end, device, stream, copy_kind[, bytes])`` (``PtoP`` is communication, others memory).
Range tuples: ``(start, end, kind, name[, device[, tid]])`` with kind ``profiler_step``, ``nvtx``, ``user_annotation``,
``gpu_user_annotation``… API-call tuples: ``(start, end, correlation[, name[, tid]])``.
Collective tuples: ``(external_id, name, bytes, seq, group_size[, dtype])``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.trace import DeviceInfo, StringPool, Table, Trace

KernelRow = tuple[Any, ...]


def _pad(rows: Sequence[tuple[Any, ...]], width: int, defaults: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    full = []
    for row in rows:
        if len(row) < width - len(defaults):
            raise ValueError(f"row {row!r} has too few fields")
        full.append(tuple(row) + tuple(defaults[len(row) - (width - len(defaults)):]))
    return full


def _col(rows: list[tuple[Any, ...]], i: int, dtype: str) -> np.ndarray:
    return np.array([r[i] for r in rows], dtype=dtype)


def _kernels(pool: StringPool, rows: Sequence[KernelRow], rank: int, pid: int) -> Table:
    full = _pad(rows, 9, (None, -1, -1))
    return Table.from_columns(
        "kernels", len(full),
        start_ns=_col(full, 0, "int64"), end_ns=_col(full, 1, "int64"), pid=pid, rank=rank,
        device=_col(full, 2, "int32"), stream=_col(full, 3, "int64"),
        correlation=_col(full, 7, "int64"), external_id=_col(full, 8, "int64"),
        name_id=pool.intern_many(r[4] for r in full),
        bucket_id=pool.intern_many(r[5] for r in full),
        subbucket_id=pool.intern_many(r[6] for r in full),
        precision_id=np.full(len(full), -1, dtype=np.int32),
        rule_id=pool.intern_many("synthetic" for _ in full),
    )


def _memops(pool: StringPool, rows: Sequence[tuple[Any, ...]], rank: int, pid: int) -> Table:
    full = _pad(rows, 6, (-1,))
    kinds = [r[4] for r in full]
    return Table.from_columns(
        "memops", len(full),
        start_ns=_col(full, 0, "int64"), end_ns=_col(full, 1, "int64"), pid=pid, rank=rank,
        device=_col(full, 2, "int32"), stream=_col(full, 3, "int64"), bytes=_col(full, 5, "int64"),
        kind_id=pool.intern_many("memcpy" for _ in full),
        copy_kind_id=pool.intern_many(kinds),
        name_id=pool.intern_many(f"Memcpy {k}" for k in kinds),
        bucket_id=pool.intern_many("communication" if k == "PtoP" else "memory" for k in kinds),
        subbucket_id=pool.intern_many("p2p" if k == "PtoP" else "memcpy" for k in kinds),
    )


def _ranges(pool: StringPool, rows: Sequence[tuple[Any, ...]], rank: int, pid: int) -> Table:
    full = _pad(rows, 6, (-1, 1))
    return Table.from_columns(
        "ranges", len(full),
        start_ns=_col(full, 0, "int64"), end_ns=_col(full, 1, "int64"), pid=pid, rank=rank,
        tid=_col(full, 5, "int64"), device=_col(full, 4, "int32"),
        kind_id=pool.intern_many(r[2] for r in full), name_id=pool.intern_many(r[3] for r in full),
    )


def _api_calls(pool: StringPool, rows: Sequence[tuple[Any, ...]], rank: int, pid: int) -> Table:
    full = _pad(rows, 5, ("cudaLaunchKernel", 1))
    return Table.from_columns(
        "api_calls", len(full),
        start_ns=_col(full, 0, "int64"), end_ns=_col(full, 1, "int64"), pid=pid, rank=rank,
        tid=_col(full, 4, "int64"), correlation=_col(full, 2, "int64"),
        name_id=pool.intern_many(r[3] for r in full),
    )


def _collectives(pool: StringPool, rows: Sequence[tuple[Any, ...]], rank: int, pid: int) -> Table:
    full = _pad(rows, 6, ("BFloat16",))
    return Table.from_columns(
        "collectives", len(full), pid=pid, rank=rank,
        external_id=_col(full, 0, "int64"), name_id=pool.intern_many(r[1] for r in full),
        bytes=_col(full, 2, "int64"), seq=_col(full, 3, "int64"), group_size=_col(full, 4, "int32"),
        dtype_id=pool.intern_many(r[5] for r in full),
    )


def make_trace(kernels: Sequence[KernelRow] = (), *, memops: Sequence[tuple[Any, ...]] = (),
               ranges: Sequence[tuple[Any, ...]] = (), api_calls: Sequence[tuple[Any, ...]] = (),
               collectives: Sequence[tuple[Any, ...]] = (), rank: int = 0, pid: int = 100,
               path: str = "synthetic.json", fmt: str = "kineto-json",
               device_names: dict[int, str] | None = None) -> Trace:
    """A classified Trace of one process (``rank``/``pid``) built from plain tuples (see the module doc)."""
    pool = StringPool()
    tables = {
        "kernels": _kernels(pool, kernels, rank, pid),
        "memops": _memops(pool, memops, rank, pid),
        "ranges": _ranges(pool, ranges, rank, pid),
        "api_calls": _api_calls(pool, api_calls, rank, pid),
        "collectives": _collectives(pool, collectives, rank, pid),
    }
    used = sorted({int(d) for d in tables["kernels"]["device"]} | {int(d) for d in tables["memops"]["device"]})
    names = device_names or {}
    devices = [DeviceInfo(device=d, name=names.get(d, "Synthetic GPU"), rank=rank, pid=pid) for d in used]
    counts = {"kernels": len(tables["kernels"]), "memcpy": len(tables["memops"]), "memset": 0,
              "nvtx_ranges": len(tables["ranges"]), "gpu_metrics_samples": 0}
    return Trace(path=path, format=fmt, strings=pool, tables=tables, devices=devices, raw_counts=counts,
                 world_size=None)
