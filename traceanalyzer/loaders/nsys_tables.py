"""Readers of the nsys activity tables into normalized columns (see ``schema.TABLES``).

Each reader selects only the columns it needs (probed with PRAGMA table_info, so every schema from 2021 to
2026 works), computes pid/tid and products in SQL, fetches integers into numpy in chunks and maps StringIds ids
to string-pool ids once per distinct id. Ranks are filled in afterwards by the caller.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..model.trace import StringPool
from .nsys_sql import (
    BadColumn,
    RowProgress,
    Schema,
    distinct_pairs,
    fetch_columns,
    fetch_table,
    int_value,
    intern_string_ids,
    intern_texts,
    quote,
    require_columns,
    sorted_by_start,
    string_values,
)

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
SYNCHRONIZATION = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
CUDA_EVENT = "CUPTI_ACTIVITY_KIND_CUDA_EVENT"
STREAM_WAIT_EVENT = 2  # ENUM_CUPTI_SYNC_TYPE: CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT
NVTX = "NVTX_EVENTS"
GPU_METRICS = "GPU_METRICS"
METRIC_NAMES = "TARGET_INFO_GPU_METRICS"

PID_SQL = "((IFNULL({col}, 0) >> 24) & 16777215)"  # globalPid / globalTid → process id
TID_SQL = "(IFNULL(globalTid, 0) & 16777215)"
NVTX_TYPE_DEFAULTS = {"NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxMark": 34, "NvtxDomainCreate": 75}
# CUPTI memcpy kinds (stable since CUDA 5); used when the export has no ENUM_CUDA_MEMCPY_OPER (2022.x and older).
MEMCPY_KIND_FALLBACK = {
    0: ("CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"), 1: ("CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
    2: ("CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"), 3: ("CUDA_MEMCPY_KIND_HTOA", "Host-to-Array"),
    4: ("CUDA_MEMCPY_KIND_ATOH", "Array-to-Host"), 5: ("CUDA_MEMCPY_KIND_ATOA", "Array-to-Array"),
    6: ("CUDA_MEMCPY_KIND_ATOD", "Array-to-Device"), 7: ("CUDA_MEMCPY_KIND_DTOA", "Device-to-Array"),
    8: ("CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"), 9: ("CUDA_MEMCPY_KIND_HTOH", "Host-to-Host"),
    10: ("CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer"), 11: ("CUDA_MEMCPY_KIND_UVM_HTOD", "Unified Host-to-Device"),
    12: ("CUDA_MEMCPY_KIND_UVM_DTOH", "Unified Device-to-Host"),
    13: ("CUDA_MEMCPY_KIND_UVM_DTOD", "Unified Device-to-Device"),
}
NCCL_COLLECTIVE_APIS = {
    "ncclAllReduce": "allreduce", "ncclAllGather": "allgather", "ncclReduceScatter": "reducescatter",
    "ncclBroadcast": "broadcast", "ncclBcast": "broadcast", "ncclReduce": "reduce", "ncclSend": "send",
    "ncclRecv": "recv", "ncclAllToAll": "alltoall", "ncclAlltoAll": "alltoall", "ncclGather": "gather",
    "ncclScatter": "scatter",
}
_API_SUFFIX = re.compile(r"_v\d+$")
_Columns = dict[str, np.ndarray]


@dataclass
class ReadContext:
    """What every table reader needs: the connection, its schema, the pool, progress and row counts."""

    conn: sqlite3.Connection
    schema: Schema
    pool: StringPool
    tick: RowProgress
    counts: dict[str, int]  # COUNT(*) of each source table (preallocation sizes)
    plain: bool = True  # the activity tables are the export's own (with rowids), not window views

    def ids(self, arrays: list[np.ndarray], transform: Callable[[str], str] | None = None) -> list[np.ndarray]:
        """StringIds ids → pool ids (see :func:`intern_string_ids`)."""
        return intern_string_ids(self.conn, self.pool, arrays, transform,
                                 has_string_table=self.schema.has("StringIds", "id", "value"))


def int_expr(cols: frozenset[str], name: str, default: str = "-1") -> str:
    """``IFNULL(col, -1)`` when the column exists, else the default literal."""
    return f"IFNULL({quote(name)}, -1)" if name in cols else default


def _product(cols: frozenset[str], *names: str) -> str:
    if not all(n in cols for n in names):
        return "-1"
    return "(" + " * ".join(f"IFNULL({quote(n)}, 1)" for n in names) + ")"


def strip_api_version(name: str) -> str:
    """``cudaLaunchKernel_v7000`` → ``cudaLaunchKernel``."""
    return _API_SUFFIX.sub("", name)


def read_kernels(ctx: ReadContext, short_names: bool = True) -> _Columns:
    """CUPTI_ACTIVITY_KIND_KERNEL → kernels columns (names via StringIds, grid/block as products). The name is the
    demangled one, else the short one; ``short_names=False`` leaves the short-name column out (-1)."""
    cols = ctx.schema.cols(KERNEL)
    if not cols:
        return {}
    require_columns(cols, KERNEL, "start", "end")
    graph = ("IFNULL(graphId, IFNULL(graphNodeId, -1))" if {"graphId", "graphNodeId"} <= cols
             else int_expr(cols, "graphId") if "graphId" in cols else int_expr(cols, "graphNodeId"))
    name = ("IFNULL(demangledName, IFNULL(shortName, -1))" if {"demangledName", "shortName"} <= cols
            else int_expr(cols, "demangledName", int_expr(cols, "shortName")))
    exprs = ["start", 'IFNULL("end", start)', PID_SQL.format(col="globalPid"), int_expr(cols, "deviceId"),
             int_expr(cols, "streamId"), int_expr(cols, "correlationId"), name,
             int_expr(cols, "shortName") if short_names else "-1", graph,
             _product(cols, "gridX", "gridY", "gridZ"), _product(cols, "blockX", "blockY", "blockZ")]
    fields = [("start_ns", "i8"), ("end_ns", "i8"), ("pid", "i4"), ("device", "i4"), ("stream", "i8"),
              ("correlation", "i8"), ("name_sid", "i8"), ("short_sid", "i8"), ("graph_id", "i8"),
              ("grid", "i8"), ("block", "i8")]
    data = fetch_table(ctx.conn, KERNEL, exprs, fields, ctx.counts.get(KERNEL, 0), ctx.tick, plain=ctx.plain,
                       sources=["start", "end", "globalPid", "deviceId", "streamId", "correlationId",
                                  "demangledName", "shortName", "graphId", "gridX", "blockX"])
    data["name_id"], data["short_name_id"] = ctx.ids([data.pop("name_sid"), data.pop("short_sid")])
    return sorted_by_start(data)


def memcpy_kind_names(conn: sqlite3.Connection, schema: Schema) -> dict[int, tuple[str, str]]:
    """copyKind id → (short name like ``HtoD``/``PtoP``, label like ``Host-to-Device``)."""
    raw = dict(MEMCPY_KIND_FALLBACK)
    if schema.has("ENUM_CUDA_MEMCPY_OPER", "id", "name", "label"):
        rows = conn.execute("SELECT id, name, label FROM ENUM_CUDA_MEMCPY_OPER")
        raw.update({int_value(i, "ENUM_CUDA_MEMCPY_OPER", "id"): (n, lbl) for i, n, lbl in rows})
    out = {}
    for kind, (name, label) in raw.items():
        short = re.sub(r"^CUDA_MEMCPY_KIND_", "", str(name))
        short = "unknown" if short == "UNKNOWN" else re.sub(r"([A-Z])TO([A-Z])", r"\1to\2", short)
        out[kind] = (short, str(label or short))
    return out


def _memcpy(ctx: ReadContext) -> _Columns:
    cols = ctx.schema.cols(MEMCPY)
    require_columns(cols, MEMCPY, "start", "end")
    exprs = ["start", 'IFNULL("end", start)', PID_SQL.format(col="globalPid"), int_expr(cols, "deviceId"),
             int_expr(cols, "streamId"), int_expr(cols, "correlationId"), int_expr(cols, "copyKind", "0"),
             int_expr(cols, "bytes"), int_expr(cols, "srcDeviceId"), int_expr(cols, "dstDeviceId")]
    fields = [("start_ns", "i8"), ("end_ns", "i8"), ("pid", "i4"), ("device", "i4"), ("stream", "i8"),
              ("correlation", "i8"), ("copy_kind", "i8"), ("bytes", "i8"), ("src_device", "i4"),
              ("dst_device", "i4")]
    data = fetch_table(ctx.conn, MEMCPY, exprs, fields, ctx.counts.get(MEMCPY, 0), ctx.tick, plain=ctx.plain,
                       sources=["start", "end", "globalPid", "deviceId", "streamId", "correlationId", "copyKind",
                                  "bytes", "srcDeviceId", "dstDeviceId"])
    kinds = memcpy_kind_names(ctx.conn, ctx.schema)
    uniq, inverse = np.unique(data.pop("copy_kind"), return_inverse=True)
    short_ids, name_ids = [], []
    for k in uniq.tolist():
        short, label = kinds.get(k, (f"kind {k}", f"kind {k}"))
        short_ids.append(ctx.pool.intern(short))
        name_ids.append(ctx.pool.intern(f"[CUDA memcpy {label}]"))
    data["copy_kind_id"] = np.asarray(short_ids, dtype=np.int32)[inverse]
    data["name_id"] = np.asarray(name_ids, dtype=np.int32)[inverse]
    data["kind_id"] = np.full(len(inverse), ctx.pool.intern("memcpy"), dtype=np.int32)
    return data


def _memset(ctx: ReadContext) -> _Columns:
    cols = ctx.schema.cols(MEMSET)
    require_columns(cols, MEMSET, "start", "end")
    exprs = ["start", 'IFNULL("end", start)', PID_SQL.format(col="globalPid"), int_expr(cols, "deviceId"),
             int_expr(cols, "streamId"), int_expr(cols, "correlationId"), int_expr(cols, "bytes")]
    fields = [("start_ns", "i8"), ("end_ns", "i8"), ("pid", "i4"), ("device", "i4"), ("stream", "i8"),
              ("correlation", "i8"), ("bytes", "i8")]
    data = fetch_table(ctx.conn, MEMSET, exprs, fields, ctx.counts.get(MEMSET, 0), ctx.tick, plain=ctx.plain,
                       sources=["start", "end", "globalPid", "deviceId", "streamId", "correlationId", "bytes"])
    n = len(data["start_ns"])
    data["kind_id"] = np.full(n, ctx.pool.intern("memset"), dtype=np.int32)
    data["name_id"] = np.full(n, ctx.pool.intern("[CUDA memset]"), dtype=np.int32)
    for key in ("copy_kind_id", "src_device", "dst_device"):
        data[key] = np.full(n, -1, dtype=np.int32)
    return data


def read_memops(ctx: ReadContext) -> _Columns:
    """MEMCPY (with copy kinds and peer devices) and MEMSET rows → memops columns."""
    parts = [reader(ctx) for table, reader in ((MEMCPY, _memcpy), (MEMSET, _memset)) if ctx.schema.cols(table)]
    if not parts:
        return {}
    # one column at a time, each part's column released once copied (one column's worth of temporary)
    return sorted_by_start({k: np.concatenate([p.pop(k) for p in parts]) for k in list(parts[0])})


def nvtx_event_types(conn: sqlite3.Connection, schema: Schema) -> dict[str, int]:
    """NVTX eventType ids from ENUM_NSYS_EVENT_TYPE, with the ids every observed version uses as fallback."""
    types = dict(NVTX_TYPE_DEFAULTS)
    if schema.has("ENUM_NSYS_EVENT_TYPE", "id", "name"):
        marks = ",".join("?" * len(types))
        rows = conn.execute(f"SELECT name, id FROM ENUM_NSYS_EVENT_TYPE WHERE name IN ({marks})", list(types))
        types.update({str(n): int_value(i, "ENUM_NSYS_EVENT_TYPE", "id") for n, i in rows})
    return types


def _text_sql(cols: frozenset[str], alias: str = "") -> tuple[str, str]:
    """(text expression, textId expression) for NVTX_EVENTS, whichever columns exist."""
    text = f"{alias}text" if "text" in cols else "NULL"
    text_id = f"IFNULL({alias}textId, -1)" if "textId" in cols else "-1"
    return text, text_id


def nvtx_domain_names(ctx: ReadContext, create_type: int) -> dict[tuple[int, int], str]:
    """(pid, domainId) → domain name, from NvtxDomainCreate rows (domain ids are per process)."""
    cols = ctx.schema.cols(NVTX)
    if "domainId" not in cols:
        return {}
    text, text_id = _text_sql(cols)
    sql = (f"SELECT {PID_SQL.format(col='globalTid')}, domainId, {text}, {text_id} FROM {NVTX} "
           f"WHERE eventType = ?")
    rows = ctx.conn.execute(sql, (create_type,)).fetchall()
    missing = [r[3] for r in rows if r[2] is None and r[3] >= 0]
    registered = string_values(ctx.conn, missing) if missing and ctx.schema.cols("StringIds") else {}
    out = {}
    for pid, domain, txt, tid in rows:
        name = txt if txt is not None else registered.get(tid)
        if name:
            out[(int(pid), int(domain))] = str(name)
    return out


def _resolve_domains(ctx: ReadContext, pid: np.ndarray, domain: np.ndarray, name_id: np.ndarray,
                     names: dict[tuple[int, int], str]) -> np.ndarray:
    """Pool id of each range's domain name; an unnamed domain whose ranges are ``nccl*`` is NCCL."""
    out = np.full(len(pid), -1, dtype=np.int32)
    named = domain != 0
    if not named.any():
        return out
    pairs, inverse = distinct_pairs(pid[named], domain[named])
    nccl_name = np.array([v.startswith("nccl") for v in ctx.pool.values] + [False], dtype=bool)
    looks_nccl = np.zeros(len(pairs), dtype=bool)
    np.logical_or.at(looks_nccl, inverse, nccl_name[name_id[named]])
    group_ids = np.full(len(pairs), -1, dtype=np.int32)
    for i, (p, d) in enumerate(pairs.tolist()):
        name = names.get((p, d)) or ("NCCL" if looks_nccl[i] else None)
        if name is not None:
            group_ids[i] = ctx.pool.intern(name)
    out[named] = group_ids[inverse]
    return out


def read_ranges(ctx: ReadContext, types: dict[str, int]) -> _Columns:
    """NVTX push/pop and start/end ranges (kind ``nvtx``) and marks (``nvtx_mark``) with per-process domains."""
    cols = ctx.schema.cols(NVTX)
    if not cols:
        return {}
    require_columns(cols, NVTX, "start", "end", "eventType")
    text, text_id = _text_sql(cols)
    domain = "IFNULL(domainId, 0)" if "domainId" in cols else "0"
    range_types = (types["NvtxPushPopRange"], types["NvtxStartEndRange"], types["NvtxMark"])
    # integer columns as chunks of text (no tuple per row); then the inline texts alone, in the same order
    exprs = ["start", 'IFNULL("end", -1)', "eventType", PID_SQL.format(col="globalTid"), TID_SQL, domain, text_id,
             f"{text} IS NOT NULL"]
    fields = [("start_ns", "i8"), ("end_ns", "i8"), ("event_type", "i8"), ("pid", "i8"), ("tid", "i8"),
              ("domain", "i8"), ("text_sid", "i8"), ("has_text", "i8")]
    where = "eventType IN (?, ?, ?)"
    data = fetch_table(ctx.conn, NVTX, exprs, fields, ctx.counts.get("nvtx_rows", 0), ctx.tick, where=where,
                       params=range_types, plain=ctx.plain, sources=["start", "end", "eventType", "globalTid",
                                                                     "globalTid", "domainId", "textId", "text"])
    has_text = data.pop("has_text").astype(bool)
    texts = np.full(len(has_text), None, dtype=object)
    if has_text.any():
        # text as its UTF-8 bytes: decoded once per distinct text by intern_texts, not once per row
        as_bytes = f"CASE WHEN typeof({text}) = 'text' THEN CAST({text} AS BLOB) ELSE {text} END"
        found = [t for (t,) in ctx.conn.execute(f"SELECT {as_bytes} FROM {NVTX} WHERE {where} AND {text} IS NOT NULL",
                                                range_types)]
        if len(found) != int(has_text.sum()):  # a file written to while read
            raise BadColumn(NVTX, "text", "rows changed while the export was read")
        texts[has_text] = found
    data["text"] = texts
    is_mark = data.pop("event_type") == types["NvtxMark"]
    data["end_ns"] = np.where(is_mark, data["start_ns"], data["end_ns"])
    inline = intern_texts(ctx.pool, data.pop("text"))
    (registered,) = ctx.ids([data.pop("text_sid")])
    data["name_id"] = np.where(inline >= 0, inline, registered).astype(np.int32)
    data["kind_id"] = np.where(is_mark, ctx.pool.intern("nvtx_mark"), ctx.pool.intern("nvtx")).astype(np.int32)
    names = nvtx_domain_names(ctx, types["NvtxDomainCreate"])
    data["domain_id"] = _resolve_domains(ctx, data["pid"], data.pop("domain"), data["name_id"], names)
    return sorted_by_start(data)


def collectives_from_nccl_ranges(pool: StringPool, ranges: _Columns) -> _Columns:
    """Host-side NCCL collective calls (NCCL-domain NVTX ranges such as ``ncclAllReduce``); sizes unknown.

    NCCL's extended NVTX payloads (message size, communicator, rank) are only exported with blobs enabled,
    so byte counts and group sizes stay ``-1`` here.
    """
    nccl = pool.get("NCCL")
    if not ranges or nccl < 0:
        return {}
    name_of = np.full(len(pool) + 1, -1, dtype=np.int32)
    for api, short in NCCL_COLLECTIVE_APIS.items():
        if (api_id := pool.get(api)) >= 0:
            name_of[api_id] = pool.intern(short)
    coll_name = name_of[ranges["name_id"]]  # -1 indexes the trailing sentinel
    keep = (ranges["domain_id"] == nccl) & (coll_name >= 0)
    return {"start_ns": ranges["start_ns"][keep], "end_ns": ranges["end_ns"][keep], "pid": ranges["pid"][keep],
            "name_id": coll_name[keep]}


def read_api_calls(ctx: ReadContext, where: str = "") -> _Columns:
    """CUDA runtime/driver API calls (those matching the SQL condition ``where``, when given); names without the
    ``_v\\d+`` version suffix."""
    cols = ctx.schema.cols(RUNTIME)
    if not cols:
        return {}
    require_columns(cols, RUNTIME, "start", "end")
    exprs = ["start", 'IFNULL("end", start)', PID_SQL.format(col="globalTid"), TID_SQL, int_expr(cols, "correlationId"),
             int_expr(cols, "nameId")]
    fields = [("start_ns", "i8"), ("end_ns", "i8"), ("pid", "i8"), ("tid", "i8"), ("correlation", "i8"),
              ("name_sid", "i8")]
    data = fetch_table(ctx.conn, RUNTIME, exprs, fields, 0 if where else ctx.counts.get(RUNTIME, 0), ctx.tick,
                       where=where, plain=ctx.plain,
                       sources=["start", "end", "globalTid", "globalTid", "correlationId", "nameId"])
    (data["name_id"],) = ctx.ids([data.pop("name_sid")], transform=strip_api_version)
    return sorted_by_start(data)


def read_graph_launches(ctx: ReadContext) -> _Columns:
    """CUPTI_ACTIVITY_KIND_GRAPH_TRACE: whole-graph executions (graph-level CUDA-graph tracing)."""
    cols = ctx.schema.cols(GRAPH_TRACE)
    if not cols:
        return {}
    require_columns(cols, GRAPH_TRACE, "start", "end")
    exprs = ["start", 'IFNULL("end", start)', PID_SQL.format(col="globalPid"), int_expr(cols, "deviceId"),
             int_expr(cols, "streamId"), int_expr(cols, "correlationId"), int_expr(cols, "graphId")]
    fields = [("start_ns", "i8"), ("end_ns", "i8"), ("pid", "i4"), ("device", "i4"), ("stream", "i8"),
              ("correlation", "i8"), ("graph_id", "i8")]
    return sorted_by_start(fetch_table(
        ctx.conn, GRAPH_TRACE, exprs, fields, ctx.counts.get(GRAPH_TRACE, 0), ctx.tick, plain=ctx.plain,
        sources=["start", "end", "globalPid", "deviceId", "streamId", "correlationId", "graphId"]))


def read_stream_waits(ctx: ReadContext) -> _Columns:
    """Cross-stream waits: each CUPTI stream-wait-event synchronization joined to the event record it waits on
    (same event id, event sync id, process and context); empty where the export has either table without the
    columns (nsys traces CUDA events with ``-t cuda``; older exports lack ``eventSyncId``)."""
    sync, event = ctx.schema.cols(SYNCHRONIZATION), ctx.schema.cols(CUDA_EVENT)
    need = {"eventId", "eventSyncId", "globalPid", "contextId", "streamId", "correlationId"}
    if not need <= sync or not need <= event or not {"syncType", "start", "deviceId"} <= sync:
        return {}
    rows = ctx.conn.execute(
        f'SELECT w.start, {PID_SQL.format(col="w.globalPid")}, w.deviceId, w.streamId, w.correlationId, '
        f'e.streamId, e.correlationId FROM "{SYNCHRONIZATION}" w JOIN "{CUDA_EVENT}" e '
        "ON e.eventId = w.eventId AND e.eventSyncId = w.eventSyncId AND e.globalPid = w.globalPid "
        f"AND e.contextId = w.contextId WHERE w.syncType = {STREAM_WAIT_EVENT} "
        "AND w.correlationId IS NOT NULL AND e.correlationId IS NOT NULL ORDER BY w.start").fetchall()
    data = np.array(rows, dtype=np.int64).reshape(-1, 7)
    keys = ("start_ns", "pid", "device", "wait_stream", "wait_correlation", "record_stream", "record_correlation")
    return {k: data[:, i].copy() for i, k in enumerate(keys)} if len(data) else {}


def _metric_names(ctx: ReadContext) -> dict[tuple[int, int], str] | None:
    """(GPU = typeId & 0xFF, metricId) → metricName; None when that key is ambiguous in this file."""
    if not ctx.schema.has(METRIC_NAMES, "typeId", "metricId", "metricName"):
        return {}
    out: dict[tuple[int, int], str] = {}
    for type_id, metric_id, name in ctx.conn.execute(f"SELECT typeId, metricId, metricName FROM {METRIC_NAMES}"):
        key = (int_value(type_id, METRIC_NAMES, "typeId") & 0xFF, int_value(metric_id, METRIC_NAMES, "metricId"))
        if out.setdefault(key, str(name)) != str(name):
            return None
    return out


def read_gpu_metrics(ctx: ReadContext) -> _Columns:
    """GPU_METRICS samples with metric names from TARGET_INFO_GPU_METRICS (joined on typeId, metricId).

    The join is done on a packed (GPU, metricId) key in numpy (one dict lookup per distinct key): a SQL join
    doubles the time of a multi-million-row fetch. If the packed key is ambiguous the SQL join is used.
    """
    cols = ctx.schema.cols(GPU_METRICS)
    if not {"typeId", "metricId", "value"} <= cols:
        return {}
    time_col = "timestamp" if "timestamp" in cols else "rawTimestamp"
    names = _metric_names(ctx)
    if names is not None:
        key = "((typeId & 255) << 32) | (metricId & 4294967295)"
        sql = f"SELECT {time_col}, {key}, value FROM {GPU_METRICS}"
    else:
        key = "((g.typeId & 255) << 32) | IFNULL(m.rowid, 4294967295)"
        sql = (f"SELECT g.{time_col}, {key}, g.value FROM {GPU_METRICS} g LEFT JOIN {METRIC_NAMES} m "
               "ON m.typeId = g.typeId AND m.metricId = g.metricId")
        rowid_names = ctx.conn.execute(f"SELECT rowid, typeId, metricName FROM {METRIC_NAMES}").fetchall()
        names = {(int_value(t, METRIC_NAMES, "typeId") & 0xFF, int(r)): str(n) for r, t, n in rowid_names}
    cache: dict[int, int] = {}

    def to_columns(chunk: np.ndarray) -> _Columns:
        uniq, inverse = np.unique(chunk["key"], return_inverse=True)
        ids = np.empty(len(uniq), dtype=np.int32)
        for i, k in enumerate(uniq.tolist()):
            if (got := cache.get(k)) is None:
                metric = k & 0xFFFFFFFF
                got = cache[k] = ctx.pool.intern(names.get((k >> 32, metric), f"metric {metric}"))
            ids[i] = got
        return {"timestamp_ns": chunk["timestamp_ns"], "device": (chunk["key"] >> 32).astype(np.int32),
                "metric_id": ids[inverse.reshape(-1)], "value": chunk["value"]}

    fields = [("timestamp_ns", "i8"), ("key", "i8"), ("value", "f8")]
    out = [("timestamp_ns", "i8"), ("device", "i4"), ("metric_id", "i4"), ("value", "f8")]
    return fetch_columns(ctx.conn, sql, fields, ctx.counts.get(GPU_METRICS, 0), ctx.tick,
                         convert=(out, to_columns), table=GPU_METRICS, sources=[time_col, "typeId", "value"])
