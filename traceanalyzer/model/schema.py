"""The normalized tables of a Trace, declared once: every column with dtype, unit and meaning.

Loaders fill these tables; analyses read them; docs are generated from this module. Times are
integer nanoseconds on one clock per trace; ``-1`` marks "not known" in integer columns; string
columns hold ids into the trace's string pool (``Trace.strings``), ``-1`` for none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Column:
    """One column of a normalized table."""

    name: str
    dtype: str
    unit: str
    doc: str
    string: bool = False  # values are ids into Trace.strings


def _c(name: str, dtype: str, unit: str, doc: str, string: bool = False) -> Column:
    return Column(name, dtype, unit, doc, string)


_WHO = [
    _c("pid", "int64", "", "process id (nsys: globalPid >> 24 & 0xFFFFFF; Kineto: pid of the event)"),
    _c("rank", "int32", "", "distributed rank of the process, -1 if unknown"),
]

TABLES: dict[str, list[Column]] = {
    "kernels": [
        _c("start_ns", "int64", "ns", "kernel start"),
        _c("end_ns", "int64", "ns", "kernel end (exclusive)"),
        *_WHO,
        _c("device", "int32", "", "GPU index the kernel ran on"),
        _c("stream", "int64", "", "CUDA stream id"),
        _c("correlation", "int64", "", "correlation id linking to the launching host API call"),
        _c("external_id", "int64", "", "Kineto External id linking to the CPU op, -1 if none"),
        _c("name_id", "int32", "", "full (demangled) kernel name", string=True),
        _c("short_name_id", "int32", "", "nsys shortName, -1 if the format has none or the trace was read for a "
           "summary (which reads name_id: the demangled name, else the short one)", string=True),
        _c("graph_id", "int64", "", "CUDA graph id (node-level graph capture), -1 if not from a graph"),
        _c("grid", "int64", "threads", "grid size in blocks (x*y*z), -1 if unknown"),
        _c("block", "int64", "threads", "block size in threads (x*y*z), -1 if unknown"),
    ],
    "memops": [
        _c("start_ns", "int64", "ns", "operation start"),
        _c("end_ns", "int64", "ns", "operation end (exclusive)"),
        *_WHO,
        _c("device", "int32", "", "GPU index"),
        _c("stream", "int64", "", "CUDA stream id"),
        _c("correlation", "int64", "", "correlation id of the launching API call"),
        _c("kind_id", "int32", "", "'memcpy' or 'memset'", string=True),
        _c("copy_kind_id", "int32", "", "HtoD, DtoH, DtoD, HtoH, PtoP, or unknown (memset: -1)", string=True),
        _c("bytes", "int64", "B", "bytes moved or set, -1 if unknown"),
        _c("src_device", "int32", "", "source device of a peer copy, -1 if not known"),
        _c("dst_device", "int32", "", "destination device of a peer copy, -1 if not known"),
        _c("name_id", "int32", "", "activity name as the trace spells it", string=True),
    ],
    "ranges": [
        _c("start_ns", "int64", "ns", "range start"),
        _c("end_ns", "int64", "ns", "range end; equal to start for marks; -1 if never closed"),
        *_WHO,
        _c("tid", "int64", "", "thread id (CPU ranges), -1 otherwise"),
        _c("device", "int32", "", "GPU index for GPU-side ranges (gpu_user_annotation), -1 for CPU ranges"),
        _c("stream", "int64", "", "stream of GPU-side ranges, -1 otherwise"),
        _c("kind_id", "int32", "", "nvtx | user_annotation | gpu_user_annotation | profiler_step | cpu_op | "
           "python_function | nvtx_mark | cuda_sync (GPU-side synchronization, Kineto)", string=True),
        _c("name_id", "int32", "", "range text", string=True),
        _c("domain_id", "int32", "", "NVTX domain name (e.g. NCCL), -1 for the default domain", string=True),
        _c("correlation", "int64", "", "correlation id (Kineto cpu ops), -1 if none"),
        _c("external_id", "int64", "", "Kineto External id, -1 if none"),
    ],
    "api_calls": [
        _c("start_ns", "int64", "ns", "host API call start"),
        _c("end_ns", "int64", "ns", "host API call end"),
        *_WHO,
        _c("tid", "int64", "", "thread id"),
        _c("correlation", "int64", "", "correlation id shared with the GPU activity it launched"),
        _c("external_id", "int64", "", "Kineto External id, -1 if none"),
        _c("name_id", "int32", "", "API name without version suffix (cudaLaunchKernel)", string=True),
    ],
    "api_starts": [
        _c("offset_ns", "int32", "ns", "start of a host API call less its block's start (``api_start_blocks``): "
           "every call of an nsys export read for a summary, whose api_calls then holds only the calls the "
           "analyses read (launches, blocking calls, calls near a collective's issuing range); empty otherwise"),
    ],
    "api_start_blocks": [
        _c("start_ns", "int64", "ns", "the block's first call start (its calls' starts are this plus their offsets)"),
        *_WHO,
        _c("first", "int64", "", "position in api_starts of the block's first call"),
        _c("rows", "int64", "", "calls in the block: one process, sorted by start, spanning under 2**31 ns"),
    ],
    "graph_launches": [
        _c("start_ns", "int64", "ns", "start of a whole CUDA-graph execution (nsys graph-level trace)"),
        _c("end_ns", "int64", "ns", "end of the graph execution"),
        *_WHO,
        _c("device", "int32", "", "GPU index"),
        _c("stream", "int64", "", "CUDA stream id"),
        _c("correlation", "int64", "", "correlation id of cudaGraphLaunch"),
        _c("graph_id", "int64", "", "graph id"),
    ],
    "stream_waits": [
        _c("start_ns", "int64", "ns", "when the GPU-side wait was recorded (nsys SYNCHRONIZATION start; Kineto "
           "cuda_sync 'Stream Wait Event' ts)"),
        *_WHO,
        _c("device", "int32", "", "GPU index"),
        _c("wait_stream", "int64", "", "the stream made to wait (cudaStreamWaitEvent's stream)"),
        _c("wait_correlation", "int64", "", "correlation id of the cudaStreamWaitEvent call"),
        _c("record_stream", "int64", "", "the stream the event was recorded on"),
        _c("record_correlation", "int64", "", "correlation id of the cudaEventRecord call the wait is on"),
    ],
    "gpu_metrics": [
        _c("timestamp_ns", "int64", "ns", "sample time"),
        _c("device", "int32", "", "GPU index"),
        _c("metric_id", "int32", "", "metric name, e.g. 'SMs Active [Throughput %]'", string=True),
        _c("value", "float64", "", "sample value in the metric's own unit"),
    ],
    "collectives": [
        _c("start_ns", "int64", "ns", "start of the host op that issued the collective"),
        _c("end_ns", "int64", "ns", "end of that host op"),
        *_WHO,
        _c("external_id", "int64", "", "External id shared with the kernels it launched, -1 if none"),
        _c("correlation", "int64", "", "correlation id, -1 if none"),
        _c("name_id", "int32", "", "collective name (allreduce, allgather, send, ...)", string=True),
        _c("in_nelems", "int64", "elements", "input message size in elements, -1 if unknown"),
        _c("out_nelems", "int64", "elements", "output message size in elements, -1 if unknown"),
        _c("dtype_id", "int32", "", "element type (Float, BFloat16, ...)", string=True),
        _c("bytes", "int64", "B", "input message size in bytes, -1 if unknown"),
        _c("group_size", "int32", "", "process-group size, -1 if unknown"),
        _c("pg_name_id", "int32", "", "process-group name", string=True),
        _c("pg_ranks_id", "int32", "", "process-group ranks as text, e.g. '[0, 1]'", string=True),
        _c("seq", "int64", "", "collective sequence number within the process group, -1 if unknown"),
    ],
}


#: Id columns a loader may store as int32 where every value fits (the nsys loader does; an nsys export's process
#: and thread ids are 24 bits): compared, keyed, looked up or used to index, never summed. Code that does
#: arithmetic on one (a key of two ids) widens it first.
NARROW_IDS = frozenset({"pid", "tid", "stream", "correlation", "grid", "block", "graph_id"})


#: Small-valued columns a loader may store as int16 where every value fits (the nsys loader does): ranks and GPU
#: indices, compared and grouped, never combined arithmetically without widening.
NARROW_SMALL = frozenset({"rank", "device"})


def fits_int16(values: np.ndarray) -> bool:
    """Whether every value of an integer array fits in int16 (an empty one does)."""
    if values.dtype.kind not in "iu":
        return False
    info = np.iinfo(np.int16)
    return not len(values) or (info.min <= int(values.min()) and int(values.max()) <= info.max)


def fits_int32(values: np.ndarray) -> bool:
    """Whether every value of an integer array fits in int32 (an empty one does)."""
    if values.dtype.kind not in "iu":
        return False
    if values.dtype.itemsize <= 4 and values.dtype.kind == "i":
        return True
    info = np.iinfo(np.int32)
    return not len(values) or (info.min <= int(values.min()) and int(values.max()) <= info.max)


_FILLS: dict[str, list[tuple[str, np.dtype[Any], float]]] = {
    table: [(col.name, np.dtype(col.dtype), np.nan if col.dtype.startswith("float") else -1) for col in cols]
    for table, cols in TABLES.items()}


def empty_columns(table: str, n: int = 0) -> dict[str, np.ndarray]:
    """Columns of ``table`` filled with ``-1`` (or NaN for floats), length ``n``."""
    if n == 0:  # a loader builds many empty tables: no fill to write
        return {name: np.empty(0, dtype=dtype) for name, dtype, _ in _FILLS[table]}
    return {name: np.full(n, fill, dtype=dtype) for name, dtype, fill in _FILLS[table]}


def schema_markdown() -> str:
    """The table reference as Markdown (used to generate docs/SCHEMA.md)."""
    lines = ["# Trace tables", "",
             "Every time is integer nanoseconds. The id columns " + ", ".join(f"`{n}`" for n in sorted(NARROW_IDS))
             + " are int64, or int32 where every value of the table's column fits (the nsys loader stores them so; "
             "an nsys export's process and thread ids are 24 bits); likewise `rank` and `device` are int32, or "
             "int16 where every value fits. Code that combines two ids into one key widens them first. The "
             "classifier's columns (`bucket_id`, `subbucket_id`, `precision_id`, `rule_id`) are "
             "string ids, int16 while the trace's string pool has under 32,704 strings, else int32.", ""]
    for table, cols in TABLES.items():
        lines += [f"## `{table}`", "", "| column | dtype | unit | meaning |", "|---|---|---|---|"]
        for c in cols:
            kind = "string id" if c.string else c.dtype
            lines.append(f"| `{c.name}` | {kind} | {c.unit} | {c.doc} |")
        lines.append("")
    return "\n".join(lines)
