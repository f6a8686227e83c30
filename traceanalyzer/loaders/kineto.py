"""PyTorch profiler (Kineto) JSON / JSON.gz traces → normalized :class:`Trace`.

Flow: bytes (``kineto_read``) → batches of typed msgspec events → per batch, columns of the complete
(``ph == "X"``) events of the categories used (the structs are then dropped; with many batches a forked helper
takes batches too, ``beside``) → per-table selections (``kineto_tables``). Times: ``ts``/``dur`` µs → exact
integer ns (``kineto_time``) on the trace's own clock; ``base_time_ns`` (``baseTimeNanoseconds``, when the trace
has it) turns them into UTC epoch ns: ``utc_ns = start_ns + base_time_ns``. Older traces have absolute epoch µs
in ``ts`` and no base: there ``start_ns`` already is epoch ns and ``base_time_ns`` is ``None``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import InvalidOperation
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from ..model.errors import CorruptFileError
from ..model.trace import DeviceInfo, StringPool, Trace
from .beside import share
from .detect import KINETO, ProgressFn, file_size
from .kineto_read import Args, Batch, Document, Event, SplitFailed, decode_whole, read_bytes, split_events
from .kineto_tables import INT64_MAX, OutOfRange, as_int, build_tables, dims_product
from .kineto_time import MissingTimes, decimal_us_to_ns, us_to_ns

# Complete-event categories turned into table rows (everything else is only counted).
USED_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op",
                   "user_annotation", "gpu_user_annotation", "python_function", "cuda_sync")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
HELPER_MIN_BATCHES = 4  # from this many event batches (~32 MB of JSON) a forked helper shares the decoding
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
    grid: np.ndarray  # x*y*z of kernels' args.grid (-1 elsewhere)
    block: np.ndarray
    comm_args: dict[int, Args]  # row → args, for CPU ops / annotations / kernels with a "Collective name"
    wait_args: dict[int, Args] = field(default_factory=dict)  # row → args, cuda_sync waits naming their event record

    def rows(self, category: str) -> np.ndarray:
        return np.flatnonzero(self.cat == USED_CATEGORIES.index(category))


def load(path: Path, *, progress: ProgressFn | None = None, tables: frozenset[str] | None = None) -> Trace:
    """Load one Kineto trace (``.json`` or ``.json.gz``, detected by content) into a normalized Trace.

    ``tables`` limits the optional tables built (kernels always are). Raises ``BadInputError`` subclasses with
    one line naming the file for empty, truncated, corrupt, oversized, too deeply nested or non-trace input.
    """
    try:
        return _load(path, progress, tables)
    except RecursionError:
        raise CorruptFileError(path, "not a valid Kineto trace: JSON nested too deeply to decode",
                               "a profiler never writes such nesting; the file is damaged or hostile") from None
    except OutOfRange as exc:
        raise CorruptFileError(path, f"not a valid Kineto trace: {exc}") from None


def _load(path: Path, progress: ProgressFn | None, tables: frozenset[str] | None) -> Trace:
    size = max(file_size(path), 1)  # progress units: reading is the first half, decoding + tables the second
    data = read_bytes(path, progress=(lambda done, total: progress(done, 2 * size)) if progress else None)
    doc, batches = split_events(data, path)
    pool = StringPool()
    try:
        events = _Events.collect(batches, path, size, progress)
    except SplitFailed:  # a cut was not between two events (or the file is malformed): the whole document
        doc, batches = decode_whole(data, path)
        events = _Events.collect(batches, path, size, progress)
    del data, batches
    complete = events.complete(pool)
    rank, warnings = _rank(doc, events.metadata, path)
    built = build_tables(complete, pool, rank, tables)
    kernel_devices = sorted({int(d) for d in np.unique(built["kernels"]["device"])})
    trace = Trace(
        path=str(path), format=KINETO, strings=pool, tables=built,
        devices=_devices(doc, kernel_devices, rank),
        tool_version=_tool_version(doc), schema_version=_text(doc.schemaVersion),
        base_time_ns=_int_or_none(doc.baseTimeNanoseconds),
        world_size=_int_or_none(doc.distributedInfo.world_size) if doc.distributedInfo else None,
        raw_counts=_raw_counts(events.cat_counts, events.n_events),
        capabilities={"timestamp_conversion": events.time_path,
                      "has_distributed_info": doc.distributedInfo is not None,
                      "has_base_time": doc.baseTimeNanoseconds is not None},
        warnings=warnings,
    )
    if progress:
        progress(2 * size, 2 * size)
    return trace


# -- events → columns, batch by batch -------------------------------------------------------------------------


class _Interner:
    """Dense integer codes of strings across batches (first-seen order)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def codes(self, values: list[str]) -> np.ndarray:
        ids = self.ids
        try:  # later batches rarely bring new strings: skip building their set
            return np.fromiter(map(ids.__getitem__, values), dtype=np.int32, count=len(values))
        except KeyError:
            for new in sorted(set(values).difference(ids)):
                ids[new] = len(ids)
        return np.fromiter(map(ids.__getitem__, values), dtype=np.int32, count=len(values))

    def code_of(self, *wanted: str) -> list[int]:
        return [self.ids[w] for w in wanted if w in self.ids]


@dataclass
class _Missing:
    """Complete events without ``ts`` or ``dur``: how many, and the index of the first in ``traceEvents``."""

    first: int = -1
    count: int = 0


class _Events:
    """Column pieces of the used complete events, appended batch by batch (the structs are dropped after each)."""

    def __init__(self) -> None:
        self.cats, self.names = _Interner(), _Interner()
        self.parts: dict[str, list[np.ndarray]] = {}
        self.comm_args: dict[int, Args] = {}
        self.wait_args: dict[int, Args] = {}
        self.metadata: list[tuple[str, Any]] = []  # (process_name | process_labels, text), file order
        self.cat_counts: dict[str, int] = {}
        self.n_events = self.n_rows = 0
        self.missing = {"ts": _Missing(), "dur": _Missing()}
        self.time_path = "float64-exact"

    @classmethod
    def collect(cls, batches: list[Batch], path: Path, size: int, progress: ProgressFn | None) -> _Events:
        """Columns of every batch, in file order; with many batches a forked helper collects some of them."""
        def one(i: int) -> _Events:
            part = cls()
            part.add(batches[i], path)
            return part

        def done(n: int) -> None:
            if progress:
                progress(size + size * n // (2 * len(batches)), 2 * size)

        parts = share(len(batches), one, done=done, min_items=HELPER_MIN_BATCHES)
        out = parts[0] if parts else cls()
        for part in parts[1:]:
            out.extend(part)
        for what, miss in out.missing.items():
            if miss.count:
                raise CorruptFileError(path, f"not a valid Kineto trace: complete event $.traceEvents[{miss.first}]"
                                       f" has no \"{what}\" ({miss.count} such events)")
        return out

    def extend(self, later: _Events) -> None:
        """Append the columns of the events that follow this collection's (collected apart)."""
        remap = self.names.codes(list(later.names.ids))  # later's codes → this collection's
        for name, parts in later.parts.items():
            mine = self.parts.setdefault(name, [])
            mine.extend(remap[p] if name == "name_code" else p for p in parts)
        self.comm_args.update({self.n_rows + row: args for row, args in later.comm_args.items()})
        self.wait_args.update({self.n_rows + row: args for row, args in later.wait_args.items()})
        self.metadata += later.metadata
        for cat, count in later.cat_counts.items():
            self.cat_counts[cat] = self.cat_counts.get(cat, 0) + count
        for what, miss in later.missing.items():
            own = self.missing[what]
            if miss.count and not own.count:
                own.first = self.n_events + miss.first
            own.count += miss.count
        if later.time_path != "float64-exact":
            self.time_path = later.time_path
        self.n_events += later.n_events
        self.n_rows += later.n_rows

    def add(self, batch: Batch, path: Path) -> None:
        """Append the columns of one batch's used complete events."""
        events = batch.events()
        cat_codes = self.cats.codes([e.cat for e in events])
        for cat, count in zip(self.cats.ids, np.bincount(cat_codes, minlength=len(self.cats.ids)).tolist(),
                              strict=True):
            self.cat_counts[cat] = self.cat_counts.get(cat, 0) + count
        self._metadata(events, cat_codes)
        used = np.flatnonzero(np.isin(cat_codes, self.cats.code_of(*USED_CATEGORIES)))
        candidates = [events[i] for i in used.tolist()]
        is_complete = np.fromiter(map("X".__eq__, map(attrgetter("ph"), candidates)), dtype=bool,
                                  count=len(used))
        index, sub = (used, candidates) if is_complete.all() else \
            (used[is_complete], list(compress(candidates, is_complete.tolist())))
        del events, candidates
        start_ns, dur_ns = self._times(sub, index, batch, path)  # dur < 0: dropped and reported by ``sanity``
        cat_of = np.full(len(self.cats.ids) + 1, -1, dtype=np.int8)
        for j, c in enumerate(USED_CATEGORIES):
            if c in self.cats.ids:
                cat_of[self.cats.ids[c]] = j
        cat = cat_of[cat_codes[index]]
        self._append(sub, cat, start_ns, dur_ns)
        self.n_events += len(cat_codes)

    def _metadata(self, events: list[Event], cat_codes: np.ndarray) -> None:
        for i in np.flatnonzero(cat_codes == self.cats.ids.get("", -1)).tolist():  # metadata has no category
            meta = events[i]
            if meta.ph == "M" and meta.name in ("process_name", "process_labels"):
                self.metadata.append((meta.name, meta.args.name if meta.name == "process_name" else meta.args.labels))

    def _times(self, sub: list[Event], index: np.ndarray, batch: Batch, path: Path) -> tuple[Any, Any]:
        """Exact (start_ns, dur_ns) of one batch (see ``kineto_time``)."""
        start_ns = us_to_ns([e.ts for e in sub])
        dur_ns = us_to_ns([e.dur for e in sub])
        for what, col in (("ts", start_ns), ("dur", dur_ns)):
            if isinstance(col, MissingTimes):
                miss = self.missing[what]
                miss.first = int(index[col.first]) + self.n_events if miss.first < 0 else miss.first
                miss.count += col.count
        if isinstance(start_ns, MissingTimes) or isinstance(dur_ns, MissingTimes):
            return np.zeros(len(sub), np.int64), np.zeros(len(sub), np.int64)  # the error is raised at the end
        if isinstance(start_ns, np.ndarray) and isinstance(dur_ns, np.ndarray):
            return start_ns, dur_ns
        self.time_path = "decimal-exact"
        exact = batch.exact_times()
        picked = [exact[i] for i in index.tolist()]
        try:
            if not isinstance(start_ns, np.ndarray):
                start_ns = decimal_us_to_ns([t.ts for t in picked])
            if not isinstance(dur_ns, np.ndarray):
                dur_ns = decimal_us_to_ns([t.dur for t in picked])
        except (OverflowError, InvalidOperation):
            raise CorruptFileError(path, "not a valid Kineto trace: a timestamp is beyond ±292 years in ns") \
                from None
        return start_ns, dur_ns

    def _append(self, sub: list[Event], cat: np.ndarray, start_ns: np.ndarray, dur_ns: np.ndarray) -> None:
        args = [e.args for e in sub]
        # device/stream/bytes are read only where used: GPU activities (CPU ops are the bulk of a trace)
        gpu = np.flatnonzero(np.isin(cat, [USED_CATEGORIES.index(c) for c in GPU_CATEGORIES]))
        gpu_args = [args[i] for i in gpu.tolist()]
        kernels = np.flatnonzero(cat == USED_CATEGORIES.index("kernel"))
        kernel_args = [args[i] for i in kernels.tolist()]
        columns = {
            "cat": cat, "start_ns": start_ns, "end_ns": start_ns + dur_ns,
            "pid": _ids(sub, "pid"), "tid": _ids(sub, "tid"), "name_code": self.names.codes([e.name for e in sub]),
            "device": _scatter(len(sub), gpu, _ids(gpu_args, "device")),
            "stream": _scatter(len(sub), gpu, _ids(gpu_args, "stream")),
            "correlation": _ids(args, "correlation"), "external_id": _ids(args, "external_id"),
            "bytes": _scatter(len(sub), gpu, _ids(gpu_args, "bytes")),
            "grid": _scatter(len(sub), kernels, dims_product([a.grid for a in kernel_args], "args.grid")),
            "block": _scatter(len(sub), kernels, dims_product([a.block for a in kernel_args], "args.block")),
        }
        for name, col in columns.items():
            self.parts.setdefault(name, []).append(col)
        # torch records a collective's metadata on its record_param_comms op and (newer torch) on its kernel too
        cpu = np.flatnonzero(np.isin(cat, [USED_CATEGORIES.index("cpu_op"), USED_CATEGORIES.index("user_annotation"),
                                           USED_CATEGORIES.index("kernel")]))
        for i in cpu.tolist():
            if args[i].collective is not None:
                self.comm_args[self.n_rows + i] = args[i]
        for i in np.flatnonzero(cat == USED_CATEGORIES.index("cuda_sync")).tolist():
            if as_int(args[i].wait_on_record) >= 0:  # a stream wait naming the event record it waits on
                self.wait_args[self.n_rows + i] = args[i]
        self.n_rows += len(sub)

    def complete(self, pool: StringPool) -> Complete:
        """All batches' columns joined; names interned into ``pool`` in sorted order (deterministic ids)."""
        cols = {name: np.concatenate(parts) for name, parts in self.parts.items()} if self.parts else \
            {name: np.zeros(0, np.int8 if name == "cat" else np.int64) for name in _COLUMNS}
        names = sorted(self.names.ids)
        ids = pool.intern_many(names) if names else np.zeros(0, np.int32)
        by_code = np.zeros(len(names), np.int32)
        by_code[[self.names.ids[n] for n in names]] = ids
        name_code = cols.pop("name_code").astype(np.int64)
        return Complete(**cols, name_id=by_code[name_code] if len(name_code) else np.zeros(0, np.int32),
                        comm_args=self.comm_args, wait_args=self.wait_args)


_COLUMNS = ("cat", "start_ns", "end_ns", "pid", "tid", "name_code", "device", "stream", "correlation", "external_id",
            "bytes", "grid", "block")


def _scatter(n: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.full(n, -1, dtype=np.int64)
    out[rows] = values
    return out


_JSON_FIELD = {"external_id": "args.External id", "device": "args.device", "stream": "args.stream",
               "correlation": "args.correlation", "bytes": "args.bytes"}


def _ids(items: list[Any], field: str) -> np.ndarray:
    """An integer field as int64 (fast path: all ints); text is parsed (``"0x0"``, ``"7"``), else ``-1``;
    :class:`OutOfRange` for a value beyond int64."""
    get = attrgetter(field)
    try:
        return np.fromiter(map(get, items), dtype=np.int64, count=len(items))
    except (TypeError, ValueError, OverflowError):
        return np.fromiter((_in_range(as_int(get(x)), field) for x in items), dtype=np.int64, count=len(items))


def _in_range(value: int, field: str) -> int:
    if -INT64_MAX <= value <= INT64_MAX:
        return value
    raise OutOfRange(_JSON_FIELD.get(field, field), value)


# -- metadata -------------------------------------------------------------------------------------------------


def _rank(doc: Document, metadata: list[tuple[str, Any]], path: Path) -> tuple[int, list[str]]:
    """Rank from distributedInfo, else process metadata (``rank N``), else the file name; ``-1`` + a warning."""
    labelled = sorted({int(m.group(1)) for _, text in metadata
                       if isinstance(text, str) and (m := _RANK_IN_TEXT.search(text))})
    if doc.distributedInfo is not None and (rank := _int_or_none(doc.distributedInfo.rank)) is not None:
        if not -1 <= rank < 1 << 31:
            raise OutOfRange("distributedInfo.rank", rank)
        others = [r for r in labelled if r != rank]
        return rank, [f"{path.name}: process labelled rank {', '.join(map(str, others))} in its metadata but "
                      f"distributedInfo.rank is {rank}: using {rank}"] if others else []
    if len(labelled) > 1:
        return labelled[0], [f"{path.name}: process metadata names ranks {', '.join(map(str, labelled))}: using "
                             f"{labelled[0]}"]
    for _, text in metadata:
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


def _raw_counts(cat_counts: dict[str, int], n_events: int) -> dict[str, int]:
    def count(*cats: str) -> int:
        return sum(cat_counts.get(c, 0) for c in cats)

    return {
        "kernels": count("kernel"),
        "memcpy": count("gpu_memcpy"),
        "memset": count("gpu_memset"),
        "nvtx_ranges": count("user_annotation", "gpu_user_annotation"),
        "gpu_metrics_samples": 0,
        "events": n_events,
        "cpu_ops": count("cpu_op"),
        "runtime_calls": count("cuda_runtime", "cuda_driver"),
        "flows_ac2g": count("ac2g"),
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
