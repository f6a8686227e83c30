"""Format detection by content, the trace files of a directory, and what every loader module shares."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable
from pathlib import Path

from ..errors import BadInputError, UnknownFormatError

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"

# compressed containers a trace often travels in (gzip is read directly): magic → (name, unpack command)
_ARCHIVES = {b"\xfd7zXZ\x00": ("xz", "xz -dk"), b"BZh": ("bzip2", "bunzip2 -k"),
             b"\x28\xb5\x2f\xfd": ("zstd", "zstd -d"), b"PK\x03\x04": ("zip", "unzip")}

NSYS = "nsys-sqlite"
KINETO = "kineto-json"

ProgressFn = Callable[[int, int], None]


def _first_json_byte(head: bytes) -> bytes:
    stripped = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    return stripped[:1]


def detect_format(path: str | Path) -> str:
    """``"nsys-sqlite"`` or ``"kineto-json"`` from the file's first bytes; raises BadInputError otherwise."""
    p = Path(path)
    if not p.exists():
        raise BadInputError(p, "no such file")
    if p.is_dir():
        raise BadInputError(p, "is a directory, expected a trace file")
    try:
        with open(p, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise BadInputError(p, f"cannot read: {exc.strerror or exc}") from None
    if not head:
        raise BadInputError(p, "empty file")
    if head.startswith(SQLITE_MAGIC):
        return NSYS
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(p, "rb") as gz:
                inner = gz.read(64)
        except (OSError, EOFError, zlib.error) as exc:
            raise BadInputError(p, f"corrupt gzip data ({exc})") from None
        if _first_json_byte(inner) == b"{":
            return KINETO
        raise UnknownFormatError(p, "gzip file does not contain a JSON trace")
    if _first_json_byte(head) == b"{":
        return KINETO
    for magic, (kind, unpack) in _ARCHIVES.items():
        if head.startswith(magic):
            raise UnknownFormatError(p, f"{kind}-compressed file", f"unpack it first ({unpack} {p.name})")
    raise UnknownFormatError(
        p, "not a trace: expected an nsys SQLite export (nsys export --type sqlite) or a Kineto JSON trace"
    )


def expand_paths(paths: list[str | Path]) -> list[Path]:
    """Files named directly, plus the trace files inside named directories (sorted, one level deep).

    A directory must hold traces of a single format; hidden files and ``*.truth.json`` sidecars are skipped. A file
    reached twice (named twice, or named and inside a named directory) is bad input: it would count as two ranks.
    """
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise BadInputError(p, "no such file or directory")
        if not p.is_dir():
            files.append(p)
            continue
        inside = sorted(
            q for q in p.iterdir()
            if q.is_file() and not q.name.startswith(".") and _looks_like_trace_name(q.name)
        )
        if not inside:
            raise BadInputError(p, "directory holds no trace files (*.sqlite, *.json, *.json.gz)")
        formats = {detect_format(q) for q in inside}
        if len(formats) > 1:
            raise BadInputError(p, f"directory mixes trace formats ({', '.join(sorted(formats))})",
                                "pass the nsys exports and the Kineto traces separately")
        files.extend(inside)
    seen: set[Path] = set()
    for f in files:
        if f.resolve() in seen:
            raise BadInputError(f, "trace given more than once (each rank file may appear once)")
        seen.add(f.resolve())
    return files


def _looks_like_trace_name(name: str) -> bool:
    lower = name.lower()
    if lower.endswith((".truth.json",)) or lower.startswith("truth_"):
        return False
    return lower.endswith((".sqlite", ".sqlite3", ".db", ".json", ".json.gz", ".pt.trace.json",
                           ".pt.trace.json.gz"))


def file_size(path: str | Path) -> int:
    """Size in bytes (0 when unknown)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
