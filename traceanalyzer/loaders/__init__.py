"""Format detection by content and dispatch to one loader module per format."""

from __future__ import annotations

from pathlib import Path

from ..trace import Trace
from .detect import GZIP_MAGIC, KINETO, NSYS, SQLITE_MAGIC, ProgressFn, detect_format, expand_paths, file_size


def load_one(path: str | Path, *, progress: ProgressFn | None = None,
             tables: frozenset[str] | None = None) -> Trace:
    """Load one trace file into a normalized Trace (format detected from content).

    ``tables`` limits which optional tables are read (kernels are always read).
    """
    fmt = detect_format(path)
    if fmt == NSYS:
        from . import nsys

        return nsys.load(Path(path), progress=progress, tables=tables)
    from . import kineto

    return kineto.load(Path(path), progress=progress, tables=tables)


__all__ = ["GZIP_MAGIC", "KINETO", "NSYS", "SQLITE_MAGIC", "ProgressFn", "detect_format", "expand_paths",
           "file_size", "load_one"]
