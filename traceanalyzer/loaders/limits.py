"""Windows and memory limits for big captures: ``--window START:END`` and the memory estimate before loading.

``--window START:END`` keeps the activity that *starts* inside ``[START, END)`` seconds from the capture start:
an nsys export's own clock (seconds since its session start, as the nsys timeline shows them), or for a Kineto
trace the earliest event in the file. An nsys export is filtered in SQLite (temporary views over its activity
tables), so only the window's rows are ever read; a Kineto file is parsed whole and then cut.

Before loading, the memory the load will need is estimated from the rows it will read (nsys: ``COUNT(*)`` of
each activity table, inside the window; Kineto: the uncompressed JSON size). When the estimate exceeds the memory
available (``MemAvailable``, or ``TRACEANALYZER_MEMORY_LIMIT`` such as ``8G``) the load stops with exit code 2 and
a message naming ``--window``, instead of being killed by the kernel.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.errors import BadInputError
from ..model.trace import Trace

# Peak bytes per row of an nsys summary (the load's typed columns, string interning, transient copies of sorting,
# and the analyses' per-device tables), from a 400x grown tp2 prefill export (benchmarks/grow_nsys.py;
# docs/SCALE.md): about 1.2x the measured peak there. A summary reads only the API calls it needs
# (loaders.nsys_api): "api_needed" counts one per kernel or memory operation (their launches), "api_starts" every
# API row (each call's start is kept, 4 bytes); "api_calls" is a load of every API row.
NSYS_BYTES_PER_ROW = {"kernels": 150, "memops": 75, "ranges": 75, "api_calls": 150, "api_needed": 55,
                      "api_starts": 6, "graph_launches": 150, "gpu_metrics": 60}
KINETO_BYTES_PER_JSON_BYTE = 2.5  # peak RSS / uncompressed JSON size, with headroom (docs/SCALE.md)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class Window:
    """``[start_s, end_s)`` seconds from the capture start."""

    start_s: float
    end_s: float

    @property
    def start_ns(self) -> int:
        return round(self.start_s * 1e9)

    @property
    def end_ns(self) -> int:
        return round(self.end_s * 1e9)

    def __str__(self) -> str:
        return f"{self.start_s:g}:{self.end_s:g}"


def parse_window(text: str | Window | None) -> Window | None:
    """``"START:END"`` (seconds, END > START ≥ 0; either side may be empty: from the start / to the end)."""
    if text is None or isinstance(text, Window):
        return text
    m = re.fullmatch(r"\s*([0-9.eE+-]*)\s*:\s*([0-9.eE+-]*)\s*", str(text))
    try:
        start = float(m.group(1)) if m and m.group(1) else 0.0
        end = float(m.group(2)) if m and m.group(2) else float("inf")
    except ValueError:
        m = None
    if m is None or not (0 <= start < end):
        raise BadInputError(None, f"--window {text!r} is not START:END in seconds from the capture start "
                                  "(0 <= START < END, e.g. 10:12.5)")
    if start > MAX_WINDOW_S or MAX_WINDOW_S < end < float("inf"):
        raise BadInputError(None, f"--window {text!r}: START and END are at most {MAX_WINDOW_S:.3g} s (int64 "
                                  "nanoseconds, 292 years)", "leave END empty for the rest of the capture")
    return Window(start, end)


#: the largest window bound, in seconds: times are int64 nanoseconds
MAX_WINDOW_S = ((1 << 63) - 1) / 1e9


MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: memory.max and memory.current of this process's group


def memory_budget() -> int | None:
    """Bytes a load may use: ``TRACEANALYZER_MEMORY_LIMIT`` (``8G``, ``512M``, bytes), else the smaller of
    ``MemAvailable``, the room left under a cgroup v2 memory limit (a container's limit is not in meminfo) and the
    address space left under ``ulimit -v``."""
    text = os.environ.get("TRACEANALYZER_MEMORY_LIMIT", "").strip().upper()
    if text:
        m = re.fullmatch(r"([0-9.]+)\s*([KMGT]?)I?B?", text)
        if m is None:
            raise BadInputError(None, f"TRACEANALYZER_MEMORY_LIMIT={text!r} is not a size such as 8G or 512M")
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    found = [n for n in (_meminfo_available(), _cgroup_room(), _address_space_room()) if n is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        with MEMINFO.open(encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _address_space_room() -> int | None:
    """Bytes of address space left under ``ulimit -v`` (RLIMIT_AS, soft) beyond what this process maps now; None
    without a limit or where it cannot be read."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft < 0:
            return None
        pages = int(Path("/proc/self/statm").read_text(encoding="ascii").split()[0])
        return max(soft - pages * os.sysconf("SC_PAGE_SIZE"), 0)
    except (ImportError, OSError, ValueError, IndexError):
        return None


def _cgroup_room() -> int | None:
    try:
        limit = (CGROUP / "memory.max").read_text(encoding="ascii").strip()
        if limit == "max":
            return None
        return max(int(limit) - int((CGROUP / "memory.current").read_text(encoding="ascii").strip()), 0)
    except (OSError, ValueError):
        return None


def check_memory(path: str | Path, needed: int, window: Window | None) -> None:
    """Raise :class:`BadInputError` (exit 2) when loading ``path`` needs more than the memory budget."""
    budget = memory_budget()
    if budget is None or needed <= budget:
        return
    scope = f"the window {window}" if window is not None else "it"
    raise BadInputError(path, f"loading {scope} needs about {_size(needed)} of memory, {_size(budget)} available",
                        "analyse part of the capture with --window START:END (seconds from the capture start)")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def nsys_estimate(rows: dict[str, int]) -> int:
    """Peak bytes of an nsys load reading ``rows`` (table → rows read)."""
    return sum(NSYS_BYTES_PER_ROW.get(table, 200) * n for table, n in rows.items())


def json_size(path: Path) -> int:
    """Uncompressed size of a JSON or gzipped JSON file (gzip: its ISIZE trailer, the size modulo 4 GiB, never
    below the compressed size); 0 when it cannot be read (the loader then reports the problem)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if fh.read(2) != b"\x1f\x8b" or size < 18:
                return size
            fh.seek(-4, os.SEEK_END)
            return max(int.from_bytes(fh.read(4), "little"), size)
    except OSError:
        return 0


def kineto_estimate(json_bytes: int) -> int:
    """Peak bytes of a Kineto load of ``json_bytes`` of (uncompressed) JSON."""
    return int(json_bytes * KINETO_BYTES_PER_JSON_BYTE)


def window_views(conn: object, tables: dict[str, str], window: Window, keep: str = "") -> None:
    """Temporary views named like the export's activity tables (``table → time column``), holding only the rows
    that start inside ``window``: every later query reads them in place of the tables (TEMP shadows MAIN).
    ``keep`` is an extra SQL condition for rows kept whatever their time (NVTX domain names)."""
    for table, column in tables.items():
        cond = f'"{column}" >= {window.start_ns}' + (f' AND "{column}" < {window.end_ns}'
                                                     if window.end_s != float("inf") else "")
        if keep and table == "NVTX_EVENTS":
            cond = f"({cond}) OR {keep}"
        allowed: set[str] = getattr(conn, "window_views", set())  # the export connection's authorizer reads these
        allowed.add(table)
        conn.execute(f'CREATE TEMP VIEW "{table}" AS SELECT * FROM main."{table}" WHERE {cond}')  # type: ignore[attr-defined]


def window_trace(trace: Trace, window: Window) -> Trace:
    """The trace with only the rows of its timed tables that start inside ``window`` (seconds from its earliest
    event)."""
    timed = {name: t for name, t in trace.tables.items() if "start_ns" in t and len(t)}
    if not timed:
        return trace
    origin = min(int(t["start_ns"].min()) for t in timed.values())
    lo = origin + window.start_ns
    hi = origin + window.end_ns if window.end_s != float("inf") else np.iinfo(np.int64).max
    out = trace
    for name, table in timed.items():
        start = table["start_ns"]
        keep = (start >= lo) & (start < hi)
        if not keep.all():
            out = out.with_table(name, table.take(np.flatnonzero(keep)))
    return out
