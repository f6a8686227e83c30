"""Write small but realistic nsys SQLite exports (2025/2026 schema: real table and column names) for tests.

>>> from traceanalyzer.testing.synth_nsys import write_nsys_export
>>> write_nsys_export(tmp_path / "t.sqlite", kernels=[(1000, 2000, 0, 7, "gemm_kernel"),
...                                                    (1500, 2500, 1, 7, "ncclDevKernel_AllReduce", 101)])

Row tuples (optional trailing fields in brackets; ``pid`` defaults to 100):

* kernels: ``(start, end, device, stream, name[, pid[, correlation[, short_name[, grid[, block[, graph_id]]]]]])``
  with ``grid``/``block`` as ``(x, y, z)``; ``name`` may be ``bytes`` (stored undecoded, e.g. Latin-1).
* nvtx: ``(start, end, text[, pid[, domain[, registered[, event_type[, tid]]]]])`` — ``end`` None = never closed;
  ``domain`` a name (a DomainCreate row is written per process) or None; ``registered`` stores the text through
  ``textId`` (StringIds) instead of ``text``; ``event_type`` 59 push/pop (default), 60 start/end, 34 mark.
* memcpy: ``(start, end, device, stream, copy_kind, bytes[, pid[, src_device, dst_device]])`` (1 HtoD, 8 DtoD, 10 PtoP).
* memset: ``(start, end, device, stream, bytes[, pid])``.
* runtime: ``(start, end, name, correlation[, pid[, tid]])`` e.g. ``"cudaLaunchKernel_v7000"``.
* graph_launches: ``(start, end, device, stream, graph_id[, pid])`` (a graph-level CUDA-graph trace).
* gpu_metrics: ``(timestamp, device, metric_name, value)``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Row = tuple[Any, ...]
VM_BITS = 1 << 48  # hardware/VM id bits seen in real globalPid values
DEFAULT_PID = 100
NVTX_EVENT_TYPES = {33: "NvtxCategory", 34: "NvtxMark", 39: "NvtxThread", 59: "NvtxPushPopRange",
                    60: "NvtxStartEndRange", 75: "NvtxDomainCreate", 76: "NvtxDomainDestroy"}
MEMCPY_OPER = [(0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"), (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
               (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"), (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
               (9, "CUDA_MEMCPY_KIND_HTOH", "Host-to-Host"), (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer")]

DDL = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        'start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, '
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, "
        "cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, "
        "gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, "
        "staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER "
        "NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, "
        "graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER, qmdBulkReleaseDone INTEGER, qmdPreexitDone INTEGER, "
        "qmdLastCtaDone INTEGER, graphId INTEGER, clusterX INTEGER, clusterY INTEGER, clusterZ INTEGER, "
        "clusterSchedulingPolicy INTEGER, maxPotentialClusterSize INTEGER, maxActiveClusters INTEGER, "
        "sharedMemoryRequestedPercentage INTEGER, tensorSizeMinusOneElements TEXT NOT NULL"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        'start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, '
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, "
        "dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, "
        "migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER, copyCount INTEGER"),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        'start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, '
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        'start INTEGER NOT NULL, "end" INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, '
        "correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER"),
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": (
        'start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, '
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "graphId INTEGER NOT NULL, graphExecId INTEGER NOT NULL"),
    "NVTX_EVENTS": (
        'start INTEGER NOT NULL, "end" INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER, '
        "color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, "
        "uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, "
        "floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT"),
    "ENUM_NSYS_EVENT_TYPE": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
    "ENUM_CUDA_MEMCPY_OPER": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
    "TARGET_INFO_GPU": (
        "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER, "
        "l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, smCount INTEGER, "
        "pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER, computeMajor INTEGER, "
        "computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER"),
    "TARGET_INFO_CUDA_DEVICE": "gpuId INTEGER NOT NULL, cudaId INTEGER NOT NULL, pid INTEGER NOT NULL, uuid TEXT, "
                               "numMultiprocessors INTEGER",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT, systemClockNs INTEGER",
    "META_DATA_CAPTURE": "name TEXT NOT NULL, value TEXT",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "GPU_METRICS": "rawTimestamp INTEGER NOT NULL, timestamp INTEGER NOT NULL, typeId INTEGER NOT NULL, "
                   "metricId INTEGER NOT NULL, value INTEGER NOT NULL",
    "TARGET_INFO_GPU_METRICS": "typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, typeName TEXT NOT NULL, "
                               "metricId INTEGER NOT NULL, metricName TEXT NOT NULL",
    "MPI_RANKS": "globalTid INTEGER NOT NULL, rank INTEGER NOT NULL",
}


def global_pid(pid: int) -> int:
    """nsys globalPid of a process (VM bits | pid << 24)."""
    return VM_BITS | (pid << 24)


def global_tid(pid: int, tid: int | None = None) -> int:
    """nsys globalTid of a thread (the main thread when ``tid`` is None)."""
    return global_pid(pid) | (pid if tid is None else tid)


class _Writer:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.ids: dict[str | bytes, int] = {}

    def create(self, table: str) -> None:
        self.conn.execute(f"CREATE TABLE {table} ({DDL[table]})")

    def string(self, value: str | bytes) -> int:
        """StringIds id of a value (``bytes`` are stored as-is, e.g. Latin-1 text)."""
        if value not in self.ids:
            self.ids[value] = len(self.ids)
            self.conn.execute("INSERT INTO StringIds VALUES (?, CAST(? AS TEXT))", (self.ids[value], value))
        return self.ids[value]

    def insert(self, table: str, columns: str, rows: list[Row]) -> None:
        if not rows:
            return  # the table stays empty (e.g. an export whose kernel table exists but holds no rows)
        marks = ",".join("?" * len(rows[0]))
        self.conn.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows)


def _short(name: str | bytes) -> str | bytes:
    text = name.decode("latin-1") if isinstance(name, bytes) else name
    base = text.split("(")[0].split("<")[0].split()[-1] if text.strip() else text
    return base if isinstance(name, str) else base.encode("latin-1")


def _kernels(w: _Writer, rows: Sequence[Row]) -> None:
    w.create("CUPTI_ACTIVITY_KIND_KERNEL")
    out = []
    for i, r in enumerate(rows):
        start, end, device, stream, name = r[:5]
        pid = r[5] if len(r) > 5 else DEFAULT_PID
        corr = r[6] if len(r) > 6 else 1000 + i
        short = r[7] if len(r) > 7 and r[7] is not None else _short(name)
        grid = r[8] if len(r) > 8 else (1, 1, 1)
        block = r[9] if len(r) > 9 else (128, 1, 1)
        graph = r[10] if len(r) > 10 else None
        out.append((start, end, device, 1, stream, corr, global_pid(pid), w.string(name), w.string(short),
                    *grid, *block, 32, 0, 0, 0, 0, i, graph, ""))
    w.insert("CUPTI_ACTIVITY_KIND_KERNEL",
             'start, "end", deviceId, contextId, streamId, correlationId, globalPid, demangledName, shortName, '
             "gridX, gridY, gridZ, blockX, blockY, blockZ, registersPerThread, staticSharedMemory, "
             "dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId, graphId, "
             "tensorSizeMinusOneElements", out)


def _nvtx(w: _Writer, rows: Sequence[Row]) -> None:
    w.create("NVTX_EVENTS")
    domains: dict[tuple[int, str], int] = {}
    out: list[Row] = []
    for r in rows:
        start, end, text = r[:3]
        pid = r[3] if len(r) > 3 else DEFAULT_PID
        domain = r[4] if len(r) > 4 else None
        registered = r[5] if len(r) > 5 else False
        event_type = r[6] if len(r) > 6 else 59
        gtid = global_tid(pid, r[7] if len(r) > 7 else None)
        domain_id = 0
        if domain is not None:
            if (pid, domain) not in domains:
                domains[(pid, domain)] = 1 + sum(1 for p, _ in domains if p == pid)
                out.append((-1000, None, 75, domain, global_tid(pid), None, domains[(pid, domain)]))
            domain_id = domains[(pid, domain)]
        text_value, text_id = (None, w.string(text)) if registered else (text, None)
        out.append((start, None if event_type == 34 else end, event_type, text_value, gtid, text_id, domain_id))
    w.conn.executemany('INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, textId, domainId) '
                       "VALUES (?, ?, ?, CAST(? AS TEXT), ?, ?, ?)", out)  # bytes text stays undecoded


def _simple(w: _Writer, table: str, columns: str, rows: list[Row]) -> None:
    w.create(table)
    w.insert(table, columns, rows)


def _activity(w: _Writer, memcpy: Sequence[Row], memset: Sequence[Row], runtime: Sequence[Row],
              graph_launches: Sequence[Row]) -> None:
    if memcpy:
        _simple(w, "CUPTI_ACTIVITY_KIND_MEMCPY", 'start, "end", deviceId, contextId, streamId, correlationId, '
                "globalPid, bytes, copyKind, srcDeviceId, dstDeviceId",
                [(r[0], r[1], r[2], 1, r[3], 5000 + i, global_pid(r[6] if len(r) > 6 else DEFAULT_PID), r[5], r[4],
                  r[7] if len(r) > 7 else None, r[8] if len(r) > 8 else None) for i, r in enumerate(memcpy)])
    if memset:
        _simple(w, "CUPTI_ACTIVITY_KIND_MEMSET", 'start, "end", deviceId, contextId, streamId, correlationId, '
                "globalPid, value, bytes",
                [(r[0], r[1], r[2], 1, r[3], 6000 + i, global_pid(r[5] if len(r) > 5 else DEFAULT_PID), 0, r[4])
                 for i, r in enumerate(memset)])
    if runtime:
        _simple(w, "CUPTI_ACTIVITY_KIND_RUNTIME", 'start, "end", eventClass, globalTid, correlationId, nameId, '
                "returnValue",
                [(r[0], r[1], 1, global_tid(r[4] if len(r) > 4 else DEFAULT_PID, r[5] if len(r) > 5 else None),
                  r[3], w.string(r[2]), 0) for r in runtime])
    if graph_launches:
        _simple(w, "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", 'start, "end", deviceId, contextId, streamId, correlationId, '
                "globalPid, graphId, graphExecId",
                [(r[0], r[1], r[2], 1, r[3], 7000 + i, global_pid(r[5] if len(r) > 5 else DEFAULT_PID), r[4], r[4])
                 for i, r in enumerate(graph_launches)])


def _gpu_metrics(w: _Writer, rows: Sequence[Row]) -> None:
    names = sorted({r[2] for r in rows})
    devices = sorted({r[1] for r in rows})
    type_base = (1 << 48) | (0x10 << 8)
    _simple(w, "TARGET_INFO_GPU_METRICS", "typeId, sourceId, typeName, metricId, metricName",
            [(type_base | d, type_base, "", i, n) for d in devices for i, n in enumerate(names)])
    _simple(w, "GPU_METRICS", "rawTimestamp, timestamp, typeId, metricId, value",
            [(r[0], r[0], type_base | r[1], names.index(r[2]), r[3]) for r in rows])


def _target_info(w: _Writer, devices: Sequence[int], pids: Sequence[int], gpu_name: str,
                 compute_capability: tuple[int, int] = (9, 0), sm_count: int = 132) -> None:
    major, minor = compute_capability
    _simple(w, "TARGET_INFO_GPU", "vmId, id, name, totalMemory, smCount, cuDevice, computeMajor, computeMinor",
            [(VM_BITS, d, gpu_name, 150109880320, sm_count, d, major, minor) for d in devices])
    _simple(w, "TARGET_INFO_CUDA_DEVICE", "gpuId, cudaId, pid, numMultiprocessors",
            [(d, d, p, sm_count) for d in devices for p in pids])


def _meta(w: _Writer, meta_table: str | None, tool_version: str, schema_version: str, graph_trace_mode: str | None,
          session_start_utc_ns: int | None) -> None:
    if meta_table is not None:
        w.conn.execute(f"CREATE TABLE {meta_table} (name TEXT NOT NULL, value TEXT)")
        w.insert(meta_table, "name, value", [
            ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_PRODUCT_VERSION", tool_version),
            ("EXPORT_SCHEMA_VERSION", schema_version), ("EXPORT_USER", "synthetic-user"),
            ("EXPORT_PARAM_INPUT_FILE_PATH_ABS", "/private/path/report.nsys-rep")])
    capture = [("PROCESS_0:ENVIRONMENT_VARIABLE", "SECRET_TOKEN=do-not-read")]
    if graph_trace_mode is not None:
        capture.append(("PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE", graph_trace_mode))
    _simple(w, "META_DATA_CAPTURE", "name, value", capture)
    if session_start_utc_ns is not None:
        _simple(w, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs, utcTime, localTime",
                [(session_start_utc_ns, "2026-11-30T12:00:00", "2026-11-30T12:00:00")])


def write_nsys_export(path: str | Path, kernels: Sequence[Row] = (), *, nvtx: Sequence[Row] = (),
                      memcpy: Sequence[Row] = (), memset: Sequence[Row] = (), runtime: Sequence[Row] = (),
                      graph_launches: Sequence[Row] = (), gpu_metrics: Sequence[Row] = (),
                      kernel_table: bool = True, target_info_gpu: bool = True, gpu_name: str = "NVIDIA H200",
                      meta_table: str | None = "META_DATA_EXPORT", tool_version: str = "2026.2.1.210",
                      schema_version: str = "3.25.0", graph_trace_mode: str | None = "Graph",
                      session_start_utc_ns: int | None = 1_796_045_593_920_696_427,
                      mpi_ranks: dict[int, int] | None = None, compute_capability: tuple[int, int] = (9, 0),
                      sm_count: int = 132) -> Path:
    """Write an export holding the given rows; tables without rows are not created (nsys creates them lazily),
    except the kernel table unless ``kernel_table=False``. ``meta_table`` may be ``META_DATA_EXPORT`` (2023.3+),
    ``EXPORT_META_DATA`` (2022.1–2023.2) or None (2021 era). ``compute_capability`` and ``sm_count`` describe
    every GPU in TARGET_INFO_GPU. Returns the path."""
    path = Path(path)
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        w = _Writer(conn)
        w.create("StringIds")
        _simple(w, "ENUM_NSYS_EVENT_TYPE", "id, name, label", [(i, n, n) for i, n in NVTX_EVENT_TYPES.items()])
        _simple(w, "ENUM_CUDA_MEMCPY_OPER", "id, name, label", MEMCPY_OPER)
        if kernel_table:
            _kernels(w, kernels)
        if nvtx:
            _nvtx(w, nvtx)
        _activity(w, memcpy, memset, runtime, graph_launches)
        if gpu_metrics:
            _gpu_metrics(w, gpu_metrics)
        pids = sorted({r[5] if len(r) > 5 else DEFAULT_PID for r in kernels} or {DEFAULT_PID})
        _simple(w, "PROCESSES", "globalPid, pid, name", [(global_pid(p), p, "python3") for p in pids])
        if target_info_gpu:
            devices = sorted({r[2] for r in (*kernels, *memcpy, *memset, *graph_launches)} or {0})
            _target_info(w, devices, pids, gpu_name, compute_capability, sm_count)
        if mpi_ranks:
            _simple(w, "MPI_RANKS", "globalTid, rank", [(global_tid(p), r) for p, r in mpi_ranks.items()])
        _meta(w, meta_table, tool_version, schema_version, graph_trace_mode, session_start_utc_ns)
        conn.commit()
    finally:
        conn.close()
    return path
