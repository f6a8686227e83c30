"""Run metadata of an nsys export: versions, capture options, GPUs, ranks — privacy-aware.

Only named keys are read from the META tables (versions and the CUDA-graph trace mode); environment rows,
TARGET_INFO_SYSTEM_ENV, ProcessStreams, user names and paths are never selected.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..model.trace import DeviceInfo
from .nsys_sql import BadColumn, Schema, int_value, quote

META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # 2023.3+ name first, then 2022.1–2023.2
GRAPH_MODE_KEY = "CUDA_GRAPH_TRACE_OPTIONS:MODE"
_CHUNK = 1 << 20  # rows per step when mapping pids to ranks


def export_versions(conn: sqlite3.Connection, schema: Schema) -> tuple[str | None, str | None, str | None]:
    """(meta table name, EXPORT_PRODUCT_VERSION, EXPORT_SCHEMA_VERSION); all None for 2021-era exports."""
    for table in META_TABLES:
        if schema.has(table, "name", "value"):
            rows = dict(conn.execute(
                f"SELECT name, value FROM {table} WHERE name IN ('EXPORT_PRODUCT_VERSION', 'EXPORT_SCHEMA_VERSION')"
            ).fetchall())
            return table, _text(rows.get("EXPORT_PRODUCT_VERSION")), _text(rows.get("EXPORT_SCHEMA_VERSION"))
    return None, None, None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def graph_trace_mode(conn: sqlite3.Connection, schema: Schema) -> str | None:
    """``CUDA_GRAPH_TRACE_OPTIONS:MODE`` capture option (``Graph`` or ``Node``), any process prefix; else None."""
    if not schema.has("META_DATA_CAPTURE", "name", "value"):
        return None
    row = conn.execute("SELECT value FROM META_DATA_CAPTURE WHERE name = ? OR name LIKE ? LIMIT 1",
                       (GRAPH_MODE_KEY, "%:" + GRAPH_MODE_KEY)).fetchone()
    return None if row is None else str(row[0])


def session_start_utc_ns(conn: sqlite3.Connection, schema: Schema) -> int | None:
    """UTC epoch ns of the session start (``t_utc = t + base``), when the export records it."""
    if not schema.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        return None
    row = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
    return None if row is None or row[0] is None else int_value(row[0], "TARGET_INFO_SESSION_START_TIME", "utcEpochNs")


def mpi_ranks(conn: sqlite3.Connection, schema: Schema) -> tuple[dict[int, int], dict[int, list[int]]]:
    """pid → rank from MPI_RANKS (the only rank mapping nsys records itself), and the processes labelled with
    several ranks (pid → those ranks; the lowest is used)."""
    if not schema.has("MPI_RANKS", "globalTid", "rank"):
        return {}, {}
    rows = conn.execute("SELECT DISTINCT (globalTid >> 24) & 16777215, rank FROM MPI_RANKS "
                        "WHERE rank IS NOT NULL").fetchall()
    labels: dict[int, set[int]] = {}
    for pid, rank in rows:  # one row per distinct (process, rank)
        value = int_value(rank, "MPI_RANKS", "rank")
        if not 0 <= value < 1 << 31:
            raise BadColumn("MPI_RANKS", "rank", f"{value} is not a rank")
        labels.setdefault(int(pid), set()).add(value)
    conflicts = {pid: sorted(ranks) for pid, ranks in labels.items() if len(ranks) > 1}
    return {pid: min(ranks) for pid, ranks in labels.items()}, conflicts


def distinct_pid_devices(conn: sqlite3.Connection, schema: Schema, tables: Iterable[str]) -> np.ndarray:
    """Distinct (pid, deviceId) pairs with activity in the given GPU-activity tables (SQL DISTINCT)."""
    pairs: set[tuple[int, int]] = set()
    for table in tables:
        if schema.has(table, "globalPid", "deviceId"):
            sql = f"SELECT DISTINCT (globalPid >> 24) & 16777215, deviceId FROM {quote(table)}"
            pairs.update((int(p), int_value(d, table, "deviceId")) for p, d in conn.execute(sql)
                         if p is not None and d is not None)
    return np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)


@dataclass(frozen=True)
class RankAssignment:
    """pid → rank mapping, how it was obtained, and the world size it implies."""

    ranks: dict[int, int]
    source: str  # "mpi" | "process_order" | "single_process" | "none"

    @property
    def world_size(self) -> int | None:
        return len(set(self.ranks.values())) or None

    def of(self, pids: np.ndarray) -> np.ndarray:
        """Rank (int32, ``-1`` unknown) of each pid."""
        if not self.ranks or len(pids) == 0:
            return np.full(len(pids), -1, dtype=np.int32)
        keys = np.array(sorted(self.ranks), dtype=np.int64)
        values = np.array([self.ranks[k] for k in keys.tolist()], dtype=np.int32)
        out = np.empty(len(pids), dtype=np.int32)
        for lo in range(0, len(pids), _CHUNK):  # int64 temporaries of one chunk, not of every row
            part = pids[lo:lo + _CHUNK]
            pos = np.clip(np.searchsorted(keys, part), 0, len(keys) - 1)
            out[lo:lo + _CHUNK] = np.where(keys[pos] == part, values[pos], -1)
        return out


def assign_ranks(mpi: dict[int, int], gpu_pids: Iterable[int]) -> RankAssignment:
    """MPI_RANKS when present, else the sorted pids that used a GPU numbered 0..n-1 (NCCL payload ranks are not
    exported without blobs)."""
    if mpi:
        return RankAssignment(dict(mpi), "mpi")
    pids = sorted({int(p) for p in gpu_pids})
    if not pids:
        return RankAssignment({}, "none")
    return RankAssignment({p: i for i, p in enumerate(pids)}, "process_order" if len(pids) > 1 else "single_process")


@dataclass(frozen=True)
class _Gpu:
    name: str | None = None
    sm_count: int | None = None
    compute_capability: str | None = None
    memory_bytes: int | None = None


def _int_or_none(value: object) -> int | None:
    try:
        return None if value is None else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _cc(major: object, minor: object) -> str | None:
    return None if major is None or minor is None else f"{major}.{minor}"


def _select(conn: sqlite3.Connection, schema: Schema, table: str, wanted: dict[str, str]) -> list[dict[str, object]]:
    """Rows of ``table`` as dicts keyed by ``wanted`` aliases; absent columns read as None."""
    cols = schema.cols(table)
    exprs = ", ".join(quote(src) if src in cols else "NULL" for src in wanted.values())
    return [dict(zip(wanted, row, strict=True)) for row in conn.execute(f"SELECT {exprs} FROM {quote(table)}")]


class GpuCatalog:
    """GPU descriptions from TARGET_INFO_GPU (by id, then cuDevice), TARGET_INFO_CUDA_DEVICE and the 2021-era
    TARGET_INFO_CUDA_GPU; every table optional (gVisor captures have none)."""

    def __init__(self, conn: sqlite3.Connection, schema: Schema) -> None:
        self.by_id: dict[int, _Gpu] = {}
        self.by_cuda: dict[int, _Gpu] = {}
        self.cuda_map: dict[tuple[int, int], tuple[int | None, int | None]] = {}  # (pid, cudaId) → (gpuId, SMs)
        self.legacy: dict[tuple[int | None, int], _Gpu] = {}  # 2021 TARGET_INFO_CUDA_GPU by (pid, deviceId)
        self.present = schema.has("TARGET_INFO_GPU") or schema.has("TARGET_INFO_CUDA_GPU")
        if schema.has("TARGET_INFO_GPU"):
            id_col = "id" if "id" in schema.cols("TARGET_INFO_GPU") else "deviceId"
            for r in _select(conn, schema, "TARGET_INFO_GPU", {
                    "id": id_col, "cuda": "cuDevice", "name": "name", "sm": "smCount", "major": "computeMajor",
                    "minor": "computeMinor", "mem": "totalMemory"}):
                gpu = _Gpu(_text(r["name"]), _int_or_none(r["sm"]), _cc(r["major"], r["minor"]),
                           _int_or_none(r["mem"]))
                if (gid := _int_or_none(r["id"])) is not None:
                    self.by_id.setdefault(gid, gpu)
                if (cid := _int_or_none(r["cuda"])) is not None:
                    self.by_cuda.setdefault(cid, gpu)
        if schema.has("TARGET_INFO_CUDA_DEVICE", "gpuId", "cudaId"):
            for r in _select(conn, schema, "TARGET_INFO_CUDA_DEVICE", {
                    "gpu": "gpuId", "cuda": "cudaId", "pid": "pid", "sm": "numMultiprocessors"}):
                pid = _int_or_none(r["pid"])
                cuda = _int_or_none(r["cuda"])
                if cuda is not None:
                    self.cuda_map[(pid if pid is not None else -1, cuda)] = (_int_or_none(r["gpu"]),
                                                                           _int_or_none(r["sm"]))
        if schema.has("TARGET_INFO_CUDA_GPU"):
            for r in _select(conn, schema, "TARGET_INFO_CUDA_GPU", {
                    "dev": "deviceId", "pid": "pid", "name": "name", "sm": "numMultiprocessors",
                    "major": "computeCapabilityMajor", "minor": "computeCapabilityMinor", "mem": "globalMemorySize"}):
                if (dev := _int_or_none(r["dev"])) is not None:
                    self.legacy[(_int_or_none(r["pid"]), dev)] = _Gpu(
                        _text(r["name"]), _int_or_none(r["sm"]), _cc(r["major"], r["minor"]), _int_or_none(r["mem"]))

    def describe(self, pid: int, device: int) -> _Gpu:
        """Best description of ``device`` as seen by process ``pid`` (an empty one when nothing is known)."""
        gpu_id, sms = self.cuda_map.get((pid, device)) or self.cuda_map.get((-1, device)) or (None, None)
        primary = (self.by_id.get(device) or self.by_cuda.get(device)
                   or (self.by_id.get(gpu_id) if gpu_id is not None else None) or _Gpu())
        legacy = self.legacy.get((pid, device)) or self.legacy.get((None, device)) or _Gpu()
        return _Gpu(primary.name or legacy.name, primary.sm_count or sms or legacy.sm_count,
                    primary.compute_capability or legacy.compute_capability,
                    primary.memory_bytes or legacy.memory_bytes)


def device_infos(catalog: GpuCatalog, pairs: np.ndarray, ranks: RankAssignment) -> list[DeviceInfo]:
    """One DeviceInfo per (pid, device) pair that had GPU activity, ordered by (rank, device, pid)."""
    infos = []
    for pid, device in pairs.tolist():
        gpu = catalog.describe(pid, device)
        rank = ranks.ranks.get(pid)
        infos.append(DeviceInfo(device=int(device), name=gpu.name, rank=rank, pid=int(pid), sm_count=gpu.sm_count,
                                compute_capability=gpu.compute_capability, memory_bytes=gpu.memory_bytes))
    return sorted(infos, key=lambda d: (d.rank if d.rank is not None else 1 << 30, d.device, d.pid or 0))
