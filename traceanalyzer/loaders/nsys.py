"""Nsight Systems SQLite export (``nsys export --type sqlite``) → normalized :class:`Trace`.

Works on every export from the 2021 era to 2026.x: tables and columns are probed (tables are created lazily
and columns come and go between versions), the file is opened read-only and immutable, text that is not UTF-8
is decoded as Latin-1. The tables read and what each Trace column comes from: docs/INPUTS.md and docs/SCHEMA.md.

Several processes in one file are several ranks: MPI_RANKS when present, otherwise the processes that used a
GPU, sorted by pid, are ranks 0..n-1 (with a warning).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np

from ..model.errors import BadInputError, CorruptFileError, FileChangedError, UnknownFormatError
from ..model.schema import NARROW_IDS, NARROW_SMALL, TABLES, fits_int16, fits_int32
from ..model.trace import ApiCallsSubset, StringPool, Table, Trace
from .detect import API_SUBSET, NSYS, ProgressFn, open_regular
from .limits import Window, check_memory, nsys_estimate, window_views
from .nsys_api import read_needed_api_calls
from .nsys_meta import (
    GpuCatalog,
    RankAssignment,
    assign_ranks,
    device_infos,
    distinct_pid_devices,
    export_versions,
    graph_trace_mode,
    mpi_ranks,
    session_start_utc_ns,
)
from .nsys_sql import (
    SIDECAR_HINT,
    BadColumn,
    RowProgress,
    Schema,
    StoredQuery,
    check_sidecars,
    connect,
    count_rows,
    distinct_pairs,
    int_value,
    probe,
)
from .nsys_tables import (
    GPU_METRICS,
    GRAPH_TRACE,
    KERNEL,
    MEMCPY,
    MEMSET,
    NVTX,
    NVTX_TYPE_DEFAULTS,
    RUNTIME,
    ReadContext,
    collectives_from_nccl_ranges,
    nvtx_event_types,
    read_api_calls,
    read_gpu_metrics,
    read_graph_launches,
    read_kernels,
    read_memops,
    read_ranges,
    read_stream_waits,
)

OPTIONAL_TABLES = frozenset({"memops", "ranges", "api_calls", "graph_launches", "gpu_metrics", "collectives",
                             "stream_waits"})
_Columns = dict[str, np.ndarray]


def load(path: Path, *, progress: ProgressFn | None = None, tables: frozenset[str] | None = None,
         window: Window | None = None) -> Trace:
    """Load an nsys SQLite export. ``tables`` limits the optional tables read (kernels are always read);
    ``window`` keeps only the activity starting inside it (read through SQLite views, see :mod:`.limits`).
    Before reading, the memory needed is estimated from row counts (:func:`~traceanalyzer.loaders.limits.check_memory`).

    ``progress(done_rows, total_rows)`` is called after every fetched chunk. Raises
    :class:`~traceanalyzer.model.errors.BadInputError` for files that are not nsys exports or are corrupt.
    """
    path = Path(path)
    _check_size(path)
    _check_sidecars(path)
    try:
        conn = connect(path)
    except sqlite3.Error as exc:
        raise BadInputError(path, f"cannot open the SQLite database ({exc})") from None
    try:
        trace = _load(conn, path, progress, OPTIONAL_TABLES if tables is None else frozenset(tables), window)
        _check_sidecars(path, while_reading=True)
        return trace
    except StoredQuery as exc:
        raise CorruptFileError(path, f"{exc.table} is {exc.what}: reading it would run a query stored in the file",
                               "nsys writes its activity as plain tables; re-export it with nsys export --type "
                               "sqlite") from None
    except BadColumn as exc:
        raise CorruptFileError(path, f"bad value in {exc.table}.{exc.column}: {exc.problem}",
                               "the export is damaged or was edited; re-export it with nsys export --type sqlite") \
            from None
    except sqlite3.DatabaseError as exc:
        raise CorruptFileError(path, f"cannot read the SQLite database, it is corrupt or truncated ({exc})",
                               "re-export it with nsys export --type sqlite") from None
    finally:
        conn.close()


def _check_size(path: Path) -> None:
    """A database shorter than its header says is truncated (SQLite itself may not notice when the missing pages
    are not read)."""
    try:
        with open_regular(path) as fh:
            header = fh.read(100)
            size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(header) < 100:
        raise CorruptFileError(path, "truncated SQLite database: the file ends inside its header")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    header_valid = header[92:96] == header[24:28]  # "version-valid-for" = change counter: the page count is current
    if header_valid and pages and size < page_size * pages:
        raise CorruptFileError(path, f"truncated SQLite database: {size:,} bytes where its header says "
                               f"{page_size * pages:,}", "was the copy or the export interrupted?")


def _check_sidecars(path: Path, *, while_reading: bool = False) -> None:
    """A write-ahead log or live rollback journal beside the export (:func:`~.nsys_sql.check_sidecars`) is exit 2:
    the file is read alone (immutable), so its answer would not be the committed data. Checked again after the
    read, for a writer that started meanwhile."""
    problem = check_sidecars(path)
    if problem is not None:
        cls = FileChangedError if while_reading else CorruptFileError
        raise cls(path, (f"changed while reading: it now {problem}" if while_reading else problem), SIDECAR_HINT)


def _require_nsys(path: Path, schema: Schema) -> None:
    if not schema.has("StringIds") and not schema.any_prefixed("CUPTI_", "NVTX_"):
        raise UnknownFormatError(path, "not an nsys export: an SQLite database without StringIds or "
                                       "CUPTI/NVTX tables", "export a report with nsys export --type sqlite")


def raw_counts(conn: sqlite3.Connection, schema: Schema, types: dict[str, int]) -> tuple[dict[str, int], int]:
    """(activity counts reported by ``info``, NVTX rows of the kinds the loader reads)."""
    counts = {key: count_rows(conn, table) if schema.cols(table) else 0 for key, table in (
        ("kernels", KERNEL), ("memcpy", MEMCPY), ("memset", MEMSET), ("gpu_metrics_samples", GPU_METRICS),
        ("graph_launches", GRAPH_TRACE), ("api_calls", RUNTIME))}
    by_type: dict[int, tuple[int, int]] = {}  # eventType → (rows, rows without an end)
    if schema.has(NVTX, "eventType", "end"):
        sql = f'SELECT eventType, COUNT(*), COUNT(*) - COUNT("end") FROM {NVTX} GROUP BY 1'
        by_type = {int_value(t, NVTX, "eventType"): (int(n), int(open_)) for t, n, open_ in conn.execute(sql)
                   if t is not None}
    ranges = [by_type.get(types[kind], (0, 0)) for kind in ("NvtxPushPopRange", "NvtxStartEndRange")]
    counts["nvtx_ranges"] = sum(n for n, _ in ranges)
    counts["nvtx_open_ranges"] = sum(open_ for _, open_ in ranges)
    counts["nvtx_marks"] = by_type.get(types["NvtxMark"], (0, 0))[0]
    return counts, counts["nvtx_ranges"] + counts["nvtx_marks"]


def _read_tables(ctx: ReadContext, want: frozenset[str], types: dict[str, int]
                 ) -> tuple[dict[str, _Columns], ApiCallsSubset | None]:
    """The tables asked for, and (reading only the API rows a summary needs) the counts of API rows left out as
    impossible (:func:`~.nsys_api.read_needed_api_calls`)."""
    # a summary's load (API_SUBSET) leaves out the kernels' short names: the name read is the demangled one,
    # else the short one, and nothing after classification reads the short one
    cols: dict[str, _Columns] = {"kernels": _narrowed(read_kernels(ctx, short_names=API_SUBSET not in want))}
    checked: ApiCallsSubset | None = None
    if "memops" in want:
        cols["memops"] = _narrowed(read_memops(ctx))
    if want & {"ranges", "collectives"}:
        ranges = _narrowed(read_ranges(ctx, types))
        if "ranges" in want:
            cols["ranges"] = ranges
        if "collectives" in want:
            cols["collectives"] = collectives_from_nccl_ranges(ctx.pool, ranges)
    if "api_calls" in want:
        cols["api_calls"] = read_api_calls(ctx)
    elif API_SUBSET in want:
        cols["api_calls"], cols["api_starts"], cols["api_start_blocks"], checked = read_needed_api_calls(ctx, cols)
    if "graph_launches" in want:
        cols["graph_launches"] = read_graph_launches(ctx)
    if "gpu_metrics" in want:
        cols["gpu_metrics"] = read_gpu_metrics(ctx)
    if "stream_waits" in want:
        cols["stream_waits"] = read_stream_waits(ctx)
    return cols, checked


def _narrowest(name: str, values: np.ndarray) -> type[np.integer] | None:
    """The dtype a column ``name`` is stored in where every value fits a narrower one than declared: int32 for an
    id (:data:`~traceanalyzer.model.schema.NARROW_IDS`), int16 for a rank or GPU index (``NARROW_SMALL``); else None."""
    if name in NARROW_SMALL and fits_int16(values):
        return np.int16
    if name in NARROW_IDS and fits_int32(values):
        return np.int32
    return None


def _narrowed(data: _Columns) -> _Columns:
    """``data`` with its id, rank and device columns as narrow as :func:`_narrowest` allows, one column at a time:
    read before the next table, so a big export's later reads find them narrow already."""
    for key in list(data):
        dtype = _narrowest(key, data[key])
        if dtype is not None and data[key].dtype != dtype:
            data[key] = data[key].astype(dtype)
    return data


def _gpu_pairs(conn: sqlite3.Connection, schema: Schema, kernels: _Columns) -> np.ndarray:
    """(pid, device) pairs with kernels; without kernels, those with graph launches or memory operations."""
    if kernels and len(kernels["pid"]):
        return distinct_pairs(kernels["pid"], kernels["device"])[0]
    return distinct_pid_devices(conn, schema, (GRAPH_TRACE, MEMCPY, MEMSET))


def _table(name: str, data: _Columns) -> Table:
    """A declared table from loader columns (consumed: each released once converted) without copying arrays that
    already have the declared dtype. An integer column the export lacks, or whose every value is ``-1``, takes no
    memory: a read-only ``-1`` repeated (``np.broadcast_to``). An id column
    (:data:`~traceanalyzer.model.schema.NARROW_IDS`)
    whose every value fits is int32."""
    n = len(next(iter(data.values())))
    cols = {}
    for col in TABLES[name]:
        values = data.pop(col.name) if col.name in data else None
        if values is not None:
            values = np.asarray(values, dtype=_narrowest(col.name, values) or col.dtype)
        if col.dtype.startswith("int") and (values is None or (n and values[0] == -1 and bool((values == -1).all()))):
            cols[col.name] = np.broadcast_to(np.array(-1, dtype=col.dtype), (n,))
        elif values is None:
            cols[col.name] = np.full(n, np.nan if col.dtype.startswith("float") else -1, dtype=col.dtype)
        else:
            cols[col.name] = values
    return Table(name, cols)


def _with_ranks(cols: dict[str, _Columns], ranks: RankAssignment) -> dict[str, Table]:
    tables = {}
    for name in list(cols):
        data = cols.pop(name)  # consumed: each loader column released once its table holds it
        if data:
            if "pid" in data:  # gpu_metrics are per device, not per process
                data["rank"] = ranks.of(data["pid"])
            tables[name] = _table(name, data)
    for name in ("kernels", "memops"):  # each device's activity a slice of views (analysis.activity.gather)
        if name in tables:
            tables[name].group_by_device()
    return tables


def _warnings(counts: dict[str, int], caps: dict[str, object], ranks: RankAssignment,
              has_gpu_names: bool) -> list[str]:
    out = []
    if not caps["has_kernel_table"]:
        out.append("export has no kernel table (CUPTI_ACTIVITY_KIND_KERNEL): nothing ran on a GPU while tracing, "
                   "or CUDA was not traced (-t cuda)")
    if counts["graph_launches"]:
        out.append(f"CUDA graphs traced at graph level: kernels inside {counts['graph_launches']} graph launches "
                   "are not itemised (profile with --cuda-graph-trace=node)")
    if ranks.source == "process_order":
        pids = ", ".join(f"{p}→{r}" for p, r in sorted(ranks.ranks.items()))
        out.append(f"rank inferred from process order (pid→rank: {pids})")
    if not has_gpu_names and caps["has_kernel_table"]:
        out.append("export has no GPU description table (TARGET_INFO_GPU): device names are unknown")
    if counts["nvtx_open_ranges"]:
        out.append(f"{counts['nvtx_open_ranges']} NVTX ranges were never closed (end_ns = -1)")
    return out


def _windowed(conn: sqlite3.Connection, schema: Schema, types: dict[str, int], window: Window) -> None:
    """Temporary views that hold only the window's rows, in place of the activity tables."""
    timed = {t: "start" for t in (KERNEL, MEMCPY, MEMSET, RUNTIME, GRAPH_TRACE, NVTX) if schema.has(t, "start")}
    if schema.has(GPU_METRICS, "timestamp"):
        timed[GPU_METRICS] = "timestamp"
    keep = f"eventType = {int(types['NvtxDomainCreate'])}" if schema.has(NVTX, "eventType") else ""
    window_views(conn, timed, window, keep)


def _load(conn: sqlite3.Connection, path: Path, progress: ProgressFn | None, want: frozenset[str],
          window: Window | None = None) -> Trace:
    schema = probe(conn)
    _require_nsys(path, schema)
    types = nvtx_event_types(conn, schema) if schema.cols(NVTX) else dict(NVTX_TYPE_DEFAULTS)
    if window is not None:
        _windowed(conn, schema, types, window)
    counts, nvtx_rows = raw_counts(conn, schema, types)
    source_counts = {KERNEL: counts["kernels"], MEMCPY: counts["memcpy"], MEMSET: counts["memset"],
                     GPU_METRICS: counts["gpu_metrics_samples"], GRAPH_TRACE: counts["graph_launches"],
                     RUNTIME: counts["api_calls"], "nvtx_rows": nvtx_rows}
    planned = counts["kernels"] + sum(n for key, n in (
        ("memops", counts["memcpy"] + counts["memset"]), ("ranges", nvtx_rows), ("api_calls", counts["api_calls"]),
        ("graph_launches", counts["graph_launches"]), ("gpu_metrics", counts["gpu_metrics_samples"]))
        if key in want or (key == "ranges" and "collectives" in want) or (key == "api_calls" and API_SUBSET in want))
    rows = {"kernels": counts["kernels"], **{key: n for key, n in (
        ("memops", counts["memcpy"] + counts["memset"]), ("ranges", nvtx_rows), ("api_calls", counts["api_calls"]),
        ("graph_launches", counts["graph_launches"]), ("gpu_metrics", counts["gpu_metrics_samples"]))
        if key in want or (key == "ranges" and "collectives" in want)}}
    if API_SUBSET in want and "api_calls" not in want:  # about one launch per kernel or memop, and every start
        rows |= {"api_needed": counts["kernels"] + counts["memcpy"] + counts["memset"],
                 "api_starts": counts["api_calls"]}
    check_memory(path, nsys_estimate(rows), window)
    pool = StringPool()
    ctx = ReadContext(conn, schema, pool, RowProgress(progress, planned), source_counts, plain=window is None)
    cols, api_checked = _read_tables(ctx, want, types)

    pairs = _gpu_pairs(conn, schema, cols["kernels"])
    mpi, rank_conflicts = mpi_ranks(conn, schema)
    ranks = assign_ranks(mpi, pairs[:, 0].tolist())
    catalog = GpuCatalog(conn, schema)
    meta_table, tool_version, schema_version = export_versions(conn, schema)
    kernel_cols = schema.cols(KERNEL)
    caps: dict[str, object] = {
        "has_kernel_table": bool(kernel_cols), "has_nvtx": bool(schema.cols(NVTX)),
        "has_graph_trace": bool(schema.cols(GRAPH_TRACE)), "graph_trace_mode": graph_trace_mode(conn, schema),
        "has_gpu_metrics": bool(schema.cols(GPU_METRICS)), "has_mangled": "mangledName" in kernel_cols,
        "meta_table": meta_table, "has_memcpy": bool(schema.cols(MEMCPY)), "has_memset": bool(schema.cols(MEMSET)),
        "has_runtime": bool(schema.cols(RUNTIME)), "has_gpu_info": catalog.present, "rank_source": ranks.source,
        "tables_read": sorted(want | {"kernels"}),
    }
    return Trace(
        path=str(path), format=NSYS, strings=pool, tables=_with_ranks(cols, ranks),
        devices=device_infos(catalog, pairs, ranks), tool_version=tool_version, schema_version=schema_version,
        base_time_ns=session_start_utc_ns(conn, schema), world_size=ranks.world_size,
        raw_counts=counts, capabilities=caps, api_calls_subset=api_checked,
        warnings=_warnings(counts, caps, ranks, catalog.present) + [
            f"MPI_RANKS labels process {pid} as ranks {', '.join(map(str, r))}: using rank {r[0]}"
            for pid, r in sorted(rank_conflicts.items())],
    )
