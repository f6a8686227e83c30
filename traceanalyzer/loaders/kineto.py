"""PyTorch profiler (Kineto) JSON / JSON.gz traces → normalized :class:`Trace`.

Flow: bytes (``kineto_read``) → typed msgspec events → one columnar pass over the complete (``ph == "X"``)
events of the categories used → per-table selections (``kineto_tables``). Times: ``ts``/``dur`` µs → exact
integer ns (``kineto_time``) on the trace's own clock; ``base_time_ns`` (``baseTimeNanoseconds``, when the trace
has it) turns them into UTC epoch ns: ``utc_ns = start_ns + base_time_ns``. Older traces have absolute epoch µs
in ``ts`` and no base: there ``start_ns`` already is epoch ns and ``base_time_ns`` is ``None``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import InvalidOperation
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptFileError
from ..trace import DeviceInfo, StringPool, Trace
from . import KINETO, ProgressFn, file_size
from .kineto_read import Document, Event, decode, decode_exact_times, read_bytes
from .kineto_tables import as_int, build_tables
from .kineto_time import MissingTimes, decimal_us_to_ns, us_to_ns

# Complete-event categories turned into table rows (everything else is only counted).
USED_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op",
                   "user_annotation", "gpu_user_annotation", "python_function")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
_RANK_IN_TEXT = re.compile(r"(?:^|[^a-z])rank[\s_:#=-]*(\d{1,6})(?!\d)", re.IGNORECASE)
_RANK_IN_FILENAME = re.compile(r"[_-](\d{1,5})(?:\.pt\.trace)?\.json(?:\.gz)?$", re.IGNORECASE)


@dataclass
class Complete:
    """Columns of the used complete events, in file order (``cat`` indexes ``USED_CATEGORIES``)."""

    cat: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    name_id: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    bytes: np.ndarray
    events: list[Event]  # the decoded structs, for the few per-row extras (grid/block, collective args)

    def rows(self, category: str) -> np.ndarray:
        return np.flatnonzero(self.cat == USED_CATEGORIES.index(category))


def load(path: Path, *, progress: ProgressFn | None = None, tables: frozenset[str] | None = None) -> Trace:
    """Load one Kineto trace (``.json`` or ``.json.gz``, detected by content) into a normalized Trace.

    ``tables`` limits the optional tables built (kernels always are). Raises ``BadInputError`` subclasses with
    one line naming the file for empty, truncated, corrupt, oversized or non-trace input.
    """
    size = max(file_size(path), 1)  # progress units: reading is the first half, decoding + tables the second
    data = read_bytes(path, progress=(lambda done, total: progress(done, 2 * size)) if progress else None)
    doc = decode(data, path)
    if progress:
        progress(size * 3 // 2, 2 * size)
    events = doc.traceEvents
    cats = _Codes([e.cat for e in events])
    index, sub = _select(events, cats)
    start_ns, dur_ns, time_path = _times(sub, index, data, path)
    del data  # the structs hold all that is needed from here on
    pool = StringPool()
    complete = _columns(sub, index, cats, pool, start_ns, dur_ns)
    rank, warnings = _rank(doc, events, cats, path)
    built = build_tables(complete, pool, rank, tables)
    kernel_devices = sorted({int(d) for d in np.unique(built["kernels"]["device"])})
    trace = Trace(
        path=str(path), format=KINETO, strings=pool, tables=built,
        devices=_devices(doc, kernel_devices, rank),
        tool_version=_tool_version(doc), schema_version=_text(doc.schemaVersion),
        base_time_ns=_int_or_none(doc.baseTimeNanoseconds),
        world_size=_int_or_none(doc.distributedInfo.world_size) if doc.distributedInfo else None,
        raw_counts=_raw_counts(cats, len(events)),
        capabilities={"timestamp_conversion": time_path, "has_distributed_info": doc.distributedInfo is not None,
                      "has_base_time": doc.baseTimeNanoseconds is not None},
        warnings=warnings,
    )
    if progress:
        progress(2 * size, 2 * size)
    return trace


# -- events → columns ---------------------------------------------------------------------------------------


class _Codes:
    """Integer codes of one string field, with the distinct values (sorted, so ids are deterministic)."""

    def __init__(self, values: list[str]) -> None:
        self.values = sorted(set(values))
        lookup = {v: i for i, v in enumerate(self.values)}
        self.codes = np.fromiter(map(lookup.__getitem__, values), dtype=np.int32, count=len(values))

    def mask(self, *wanted: str) -> np.ndarray:
        return np.isin(self.codes, [self.values.index(w) for w in wanted if w in self.values])

    def count(self, *wanted: str) -> int:
        return int(self.mask(*wanted).sum())


def _select(events: list[Event], cats: _Codes) -> tuple[np.ndarray, list[Event]]:
    """Positions and structs of the complete (``ph == "X"``) events of the used categories."""
    used = np.flatnonzero(cats.mask(*USED_CATEGORIES))
    candidates = [events[i] for i in used.tolist()]
    is_complete = np.fromiter(map("X".__eq__, map(attrgetter("ph"), candidates)), dtype=bool, count=len(used))
    if is_complete.all():
        return used, candidates
    return used[is_complete], list(compress(candidates, is_complete.tolist()))


def _times(sub: list[Event], index: np.ndarray, data: bytearray, path: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """Exact (start_ns, dur_ns) and which conversion path was used (see ``kineto_time``)."""
    start_ns = us_to_ns([e.ts for e in sub])
    dur_ns = us_to_ns([e.dur for e in sub])
    for what, col in (("ts", start_ns), ("dur", dur_ns)):
        if isinstance(col, MissingTimes):
            raise CorruptFileError(path, f"not a valid Kineto trace: complete event $.traceEvents[{index[col.first]}]"
                                   f" has no \"{what}\" ({col.count} such events)")
    if isinstance(start_ns, np.ndarray) and isinstance(dur_ns, np.ndarray):
        return start_ns, dur_ns, "float64-exact"
    exact = decode_exact_times(data)
    picked = [exact[i] for i in index.tolist()]
    try:
        if not isinstance(start_ns, np.ndarray):
            start_ns = decimal_us_to_ns([t.ts for t in picked])
        if not isinstance(dur_ns, np.ndarray):
            dur_ns = decimal_us_to_ns([t.dur for t in picked])
    except (OverflowError, InvalidOperation):
        raise CorruptFileError(path, "not a valid Kineto trace: a timestamp is beyond ±292 years in ns") from None
    return start_ns, dur_ns, "decimal-exact"


def _columns(sub: list[Event], index: np.ndarray, cats: _Codes, pool: StringPool, start_ns: np.ndarray,
             dur_ns: np.ndarray) -> Complete:
    cat_of = np.array([USED_CATEGORIES.index(c) if c in USED_CATEGORIES else -1 for c in cats.values] or [-1],
                      dtype=np.int8)
    cat = cat_of[cats.codes[index]]
    args = [e.args for e in sub]
    names = _Codes([e.name for e in sub])
    name_ids = pool.intern_many(names.values) if names.values else np.zeros(0, np.int32)
    # device/stream/bytes are read only where used: GPU activities (CPU ops are the bulk of a trace)
    gpu = np.flatnonzero(np.isin(cat, [USED_CATEGORIES.index(c) for c in GPU_CATEGORIES]))
    gpu_args = [args[i] for i in gpu.tolist()]
    return Complete(
        cat=cat, start_ns=start_ns, end_ns=start_ns + dur_ns,
        pid=_ids(sub, "pid"), tid=_ids(sub, "tid"), name_id=name_ids[names.codes],
        device=_scatter(len(sub), gpu, _ids(gpu_args, "device")),
        stream=_scatter(len(sub), gpu, _ids(gpu_args, "stream")),
        correlation=_ids(args, "correlation"), external_id=_ids(args, "external_id"),
        bytes=_scatter(len(sub), gpu, _ids(gpu_args, "bytes")), events=sub,
    )


def _scatter(n: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.full(n, -1, dtype=np.int64)
    out[rows] = values
    return out


def _ids(items: list[Any], field: str) -> np.ndarray:
    """An integer field as int64 (fast path: all ints); text is parsed (``"0x0"``, ``"7"``), else ``-1``."""
    get = attrgetter(field)
    try:
        return np.fromiter(map(get, items), dtype=np.int64, count=len(items))
    except (TypeError, ValueError):
        return np.fromiter((as_int(get(x)) for x in items), dtype=np.int64, count=len(items))


# -- metadata -------------------------------------------------------------------------------------------------


def _rank(doc: Document, events: list[Event], cats: _Codes, path: Path) -> tuple[int, list[str]]:
    """Rank from distributedInfo, else process metadata (``rank N``), else the file name; ``-1`` + a warning."""
    if doc.distributedInfo is not None and (rank := _int_or_none(doc.distributedInfo.rank)) is not None:
        return rank, []
    for i in np.flatnonzero(cats.mask("")).tolist():  # metadata events have no category
        meta = events[i]
        if meta.ph == "M" and meta.name in ("process_name", "process_labels"):
            text = meta.args.name if meta.name == "process_name" else meta.args.labels
            if isinstance(text, str) and (m := _RANK_IN_TEXT.search(text)):
                return int(m.group(1)), []
    for pattern in (_RANK_IN_TEXT, _RANK_IN_FILENAME):
        if m := pattern.search(path.name):
            return int(m.group(1)), []
    return -1, [f"{path.name}: rank unknown (no distributedInfo.rank, no 'rank N' in process names or the file "
                "name); using -1"]


def _devices(doc: Document, kernel_devices: list[int], rank: int) -> list[DeviceInfo]:
    props = {p.get("id"): p for p in doc.deviceProperties or [] if isinstance(p, dict)}
    out = []
    for device in kernel_devices:
        p = props.get(device, {})
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        out.append(DeviceInfo(
            device=device, name=_text(p.get("name")), rank=None if rank < 0 else rank, pid=device,
            sm_count=_int_or_none(p.get("numSms")),
            compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
            memory_bytes=_int_or_none(p.get("totalGlobalMem")),
        ))
    return out


def _tool_version(doc: Document) -> str:
    torch = doc.torch_version or doc.pytorch_version
    parts = [f"torch {torch}" if torch else "PyTorch profiler (Kineto)"]
    for label, value in (("CUPTI", doc.cupti_version), ("CUDA runtime", doc.cuda_runtime_version),
                         ("NCCL", doc.distributedInfo.nccl_version if doc.distributedInfo else None)):
        if value is not None:
            parts.append(f"{label} {value}")
    return ", ".join(parts)


def _raw_counts(cats: _Codes, n_events: int) -> dict[str, int]:
    return {
        "kernels": cats.count("kernel"),
        "memcpy": cats.count("gpu_memcpy"),
        "memset": cats.count("gpu_memset"),
        "nvtx_ranges": cats.count("user_annotation", "gpu_user_annotation"),
        "gpu_metrics_samples": 0,
        "events": n_events,
        "cpu_ops": cats.count("cpu_op"),
        "runtime_calls": cats.count("cuda_runtime", "cuda_driver"),
        "flows_ac2g": cats.count("ac2g"),
    }


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
