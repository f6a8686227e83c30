"""Format detection by content and dispatch to one loader module per format."""

from __future__ import annotations

from pathlib import Path

from ..model.trace import Trace
from .detect import (
    API_SUBSET,
    GZIP_MAGIC,
    KINETO,
    NSYS,
    SQLITE_MAGIC,
    SUMMARY_TABLES,
    ProgressFn,
    detect_format,
    expand_paths,
    file_size,
    open_regular,
    require_regular_file,
)
from .limits import Window, check_memory, json_size, kineto_estimate, window_trace


def load_one(path: str | Path, *, progress: ProgressFn | None = None,
             tables: frozenset[str] | None = None, window: Window | None = None) -> Trace:
    """Load one trace file into a normalized Trace (format detected from content).

    ``tables`` limits which optional tables are read (kernels are always read); ``window`` keeps the activity
    starting inside it (:mod:`.limits`). Either format first checks the memory the load needs.
    Rows that cannot be true are then dropped and reported in the trace's warnings (:mod:`.sanity`). An Nsight
    Systems report (``.nsys-rep``) is read through its SQLite export (:mod:`.nsys_rep`).
    """
    from .nsys_rep import as_export
    from .sanity import drop_impossible

    path = as_export(path)
    fmt = detect_format(path)
    if fmt == NSYS:
        from . import nsys

        return drop_impossible(nsys.load(Path(path), progress=progress, tables=tables, window=window))
    from . import kineto

    check_memory(path, kineto_estimate(json_size(Path(path))), None)
    if tables is not None and API_SUBSET in tables:  # a Kineto trace's API calls are read whole
        tables = tables - {API_SUBSET} | {"api_calls"}
    trace = kineto.load(Path(path), progress=progress, tables=tables)
    return drop_impossible(trace if window is None else window_trace(trace, window))


__all__ = [
    "API_SUBSET",
    "GZIP_MAGIC",
    "KINETO",
    "NSYS",
    "SQLITE_MAGIC",
    "SUMMARY_TABLES",
    "ProgressFn",
    "detect_format",
    "expand_paths",
    "file_size",
    "load_one",
    "open_regular",
    "require_regular_file",
]
