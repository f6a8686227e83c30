"""Format detection by content, the trace files of a directory, and what every loader module shares."""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ..model.errors import BadInputError, UnknownFormatError

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
#: The first bytes of an Nsight Systems report (``.nsys-rep``, nsys 2025.3 seen), read through its export.
NSYS_REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"

# compressed containers a trace often travels in (gzip is read directly): magic → (name, unpack command)
_ARCHIVES = {b"\xfd7zXZ\x00": ("xz", "xz -dk"), b"BZh": ("bzip2", "bunzip2 -k"),
             b"\x28\xb5\x2f\xfd": ("zstd", "zstd -d"), b"PK\x03\x04": ("zip", "unzip")}

NSYS = "nsys-sqlite"
KINETO = "kineto-json"
#: ``tables`` entry asking for the CUDA API rows a summary reads (``api_calls``) and every call's start
#: (``api_starts``) instead of every API row (nsys: ``loaders.nsys_api``; a Kineto trace reads its calls whole).
API_SUBSET = "api_calls_needed"
#: The optional tables a summary reads.
SUMMARY_TABLES = frozenset({"memops", "ranges", "graph_launches", "gpu_metrics", "collectives", "stream_waits",
                            API_SUBSET})

ProgressFn = Callable[[int, int], None]


def _first_json_byte(head: bytes) -> bytes:
    stripped = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    return stripped[:1]


def special_kind(mode: int) -> str | None:
    """What a non-regular, non-directory file is (``None`` for regular files and directories)."""
    for test, kind in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else "not a regular file"


def _stat(p: Path, missing: str) -> os.stat_result:
    try:
        return os.stat(p)
    except FileNotFoundError:
        raise BadInputError(p, missing) from None
    except OSError as exc:
        raise BadInputError(p, f"cannot read: {exc.strerror or exc}") from None


def require_regular_file(p: Path, st: os.stat_result | None = None) -> None:
    """BadInputError unless ``p`` is a regular file: checked before opening, so a FIFO or device never hangs."""
    st = st or _stat(p, "no such file")
    if stat.S_ISDIR(st.st_mode):
        raise BadInputError(p, "is a directory, expected a trace file")
    if (kind := special_kind(st.st_mode)) is not None:
        raise BadInputError(p, f"is {kind}, not a regular file", "traces are read from regular files")


def open_regular(p: Path) -> BinaryIO:
    """``open(p, "rb")`` that cannot hang: opened non-blocking and checked with ``fstat`` to be a regular file
    (a file swapped for a FIFO after :func:`require_regular_file` is refused too). Raises OSError or
    BadInputError."""
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        require_regular_file(p, os.fstat(fd))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def detect_format(path: str | Path) -> str:
    """``"nsys-sqlite"`` or ``"kineto-json"`` from the file's first bytes; raises BadInputError otherwise."""
    p = Path(path)
    require_regular_file(p)
    try:
        with open_regular(p) as fh:
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
    if head.startswith(NSYS_REPORT_MAGIC):
        raise UnknownFormatError(p, "an Nsight Systems report without the .nsys-rep suffix",
                                 f"rename it to {p.stem}.nsys-rep (read through its SQLite export), or run "
                                 f"nsys export --type sqlite {p.name}")
    for magic, (kind, unpack) in _ARCHIVES.items():
        if head.startswith(magic):
            raise UnknownFormatError(p, f"{kind}-compressed file", f"unpack it first ({unpack} {p.name})")
    raise UnknownFormatError(
        p, "not a trace: expected an nsys SQLite export (nsys export --type sqlite) or a Kineto JSON trace"
    )


def expand_paths(paths: list[str | Path], skipped: list[str] | None = None) -> list[Path]:
    """Files named directly, plus the trace files inside named directories (sorted, one level deep). An Nsight
    Systems report (``.nsys-rep``) stands for its SQLite export, made first where needed (:mod:`.nsys_rep`); in a
    directory holding a report and its export, the pair counts once.

    A directory must hold traces of a single format; hidden files and ``*.truth.json`` sidecars are skipped. A file
    reached twice (named twice, or named and inside a named directory) is bad input: it would count as two ranks.
    Anything named directly that is not a regular file or directory (a FIFO, a device) is bad input; inside a
    directory such entries are skipped and, when their names look like traces, listed in ``skipped``.
    """
    from .nsys_rep import as_export, beside, is_report

    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        st = _stat(p, "no such file or directory")
        if not stat.S_ISDIR(st.st_mode):
            require_regular_file(p, st)
            files.append(as_export(p))
            continue
        inside = []
        for q in sorted(p.iterdir()):
            if q.name.startswith(".") or not _looks_like_trace_name(q.name):
                continue
            try:
                kind = special_kind(os.stat(q).st_mode)
            except OSError as exc:  # a dangling link, a file removed meanwhile
                kind = f"unreadable ({exc.strerror or exc})"
            if kind is None and q.is_file():
                inside.append(q)
            elif skipped is not None and kind is not None:
                skipped.append(f"skipped {q}: {kind}, not a regular file")
        if not inside:
            raise BadInputError(p, "directory holds no trace files (*.sqlite, *.json, *.json.gz, *.nsys-rep)")
        reports = [q for q in inside if is_report(q)]
        exports = [as_export(q) for q in reports]
        taken = {e.resolve() for e in exports} | {beside(q).resolve() for q in reports}  # a stale one too
        inside = sorted([q for q in inside if not is_report(q) and q.resolve() not in taken] + exports)
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
                           ".pt.trace.json.gz", ".nsys-rep", ".qdrep"))


def file_size(path: str | Path) -> int:
    """Size in bytes (0 when unknown)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
