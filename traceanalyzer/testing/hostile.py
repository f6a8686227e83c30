"""Hostile and broken inputs made from a good trace, for the test suite (``tests/test_hostile.py``).

Each maker copies a good trace into a folder and damages the copy one way; nothing is ever written beside the
source. nsys mutations rebuild the damaged table without its NOT NULL constraints first (``CREATE TABLE x AS
SELECT *``), as an edited or damaged export would be.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
INT64_MAX = (1 << 63) - 1


def _loosen(conn: sqlite3.Connection, table: str) -> None:
    """Rebuild ``table`` without constraints (so NULLs, text and BLOBs can be stored in any column)."""
    conn.execute(f'CREATE TABLE "_loose" AS SELECT * FROM "{table}"')
    conn.execute(f'DROP TABLE "{table}"')
    conn.execute(f'ALTER TABLE "_loose" RENAME TO "{table}"')


def _first_pid(conn: sqlite3.Connection) -> int:
    return int(conn.execute(f"SELECT globalPid FROM {KERNEL} LIMIT 1").fetchone()[0])


# name → (table to loosen or None, SQL statements): {pid} is a kernel process's globalPid, {last} the last rowid
# of the table damaged (the kernel table when none is named)
NSYS_MUTATIONS: dict[str, tuple[str | None, list[str]]] = {
    "kernel_start_null": (KERNEL, [f"UPDATE {KERNEL} SET start = NULL WHERE rowid = {{last}}"]),
    "kernel_start_text": (KERNEL, [f"UPDATE {KERNEL} SET start = 'abc' WHERE rowid = {{last}}"]),
    "kernel_start_blob": (KERNEL, [f"UPDATE {KERNEL} SET start = x'0102' WHERE rowid = {{last}}"]),
    "kernel_end_column_dropped": (KERNEL, [f'ALTER TABLE {KERNEL} DROP COLUMN "end"']),
    "kernel_device_text": (KERNEL, [f"UPDATE {KERNEL} SET deviceId = 'gpu0' WHERE rowid = {{last}}"]),
    "nvtx_start_null": ("NVTX_EVENTS", ["UPDATE NVTX_EVENTS SET start = NULL WHERE rowid = {last}"]),
    "memcpy_start_null": ("CUPTI_ACTIVITY_KIND_MEMCPY",
                          ["UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET start = NULL WHERE rowid = {last}"]),
    "runtime_start_null": ("CUPTI_ACTIVITY_KIND_RUNTIME",
                           ["UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = NULL WHERE rowid = {last}"]),
    "string_value_blob": ("StringIds", ["UPDATE StringIds SET value = CAST(value AS BLOB)"]),
    "string_value_null": ("StringIds", [f"UPDATE StringIds SET value = NULL WHERE id IN "
                                        f"(SELECT demangledName FROM {KERNEL} LIMIT 1)"]),
    "session_start_text": ("TARGET_INFO_SESSION_START_TIME",
                           ["UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'abc'"]),
    "event_type_id_text": ("ENUM_NSYS_EVENT_TYPE",
                           ["UPDATE ENUM_NSYS_EVENT_TYPE SET id = 'x' WHERE name = 'NvtxPushPopRange'"]),
    "mpi_rank_text": (None, ["CREATE TABLE MPI_RANKS (globalTid INTEGER, rank)",
                             "INSERT INTO MPI_RANKS VALUES ({pid}, 'r0')"]),
    # impossible but well-formed values: loaded, the bad rows dropped or the problem reported
    "kernel_end_before_start_20pct": (None, [f'UPDATE {KERNEL} SET "end" = start - 1000 WHERE rowid % 5 = 0']),
    "kernel_end_int64_max": (None, [f'UPDATE {KERNEL} SET "end" = {INT64_MAX} WHERE rowid = {{last}}']),
    "string_ids_dropped": (None, ["DROP TABLE StringIds"]),
    "pid_labelled_two_ranks": (None, ["CREATE TABLE MPI_RANKS (globalTid INTEGER, rank INTEGER)",
                                      "INSERT INTO MPI_RANKS VALUES ({pid}, 3), ({pid}, 5)"]),
}


def mutate_nsys(source: Path, folder: Path, mutation: str) -> Path:
    """A copy of the nsys export ``source`` in ``folder``, damaged by ``NSYS_MUTATIONS[mutation]``."""
    table, statements = NSYS_MUTATIONS[mutation]
    out = Path(folder) / f"{mutation}.sqlite"
    shutil.copyfile(source, out)
    conn = sqlite3.connect(out)
    try:
        if table is not None:
            _loosen(conn, table)
        pid = _first_pid(conn)
        last = conn.execute(f'SELECT MAX(rowid) FROM "{table or KERNEL}"').fetchone()[0]
        for sql in statements:
            conn.execute(sql.format(pid=pid, last=last))
        conn.commit()
    finally:
        conn.close()
    return out


def read_kineto(path: Path) -> dict[str, Any]:
    """A Kineto trace (``.json`` or ``.json.gz``) as a dict."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def _set_kernel(field: str, value: Any, *, in_args: bool = False) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        target = _kernels(doc)[3]
        (target.setdefault("args", {}) if in_args else target)[field] = value
    return apply


_DEEP = "@@nested@@"  # replaced in the JSON text (json.dumps itself would recurse too deeply)
DEEP_LEVELS = 1000


def _deep_args(doc: dict[str, Any]) -> None:
    _kernels(doc)[3]["args"]["deep"] = _DEEP


def _two_ranks(doc: dict[str, Any]) -> None:
    doc["traceEvents"].append({"ph": "M", "name": "process_labels", "pid": 0, "args": {"labels": "rank 5"}})
    doc.setdefault("distributedInfo", {})["rank"] = 3


KINETO_MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "args_nested_1000_deep": _deep_args,
    "pid_2_pow_63": _set_kernel("pid", 1 << 63),
    "tid_2_pow_64": _set_kernel("tid", 1 << 64),
    "correlation_2_pow_64": _set_kernel("correlation", (1 << 64) + 5, in_args=True),
    "stream_2_pow_63": _set_kernel("stream", 1 << 63, in_args=True),
    "grid_2_pow_63": _set_kernel("grid", [1 << 63, 1, 1], in_args=True),
    "block_product_overflow": _set_kernel("block", [1 << 40, 1 << 40, 1], in_args=True),
    "rank_2_pow_63": lambda doc: doc.setdefault("distributedInfo", {}).update(rank=1 << 63),
    # impossible but well-formed values
    "ts_9e15_us": _set_kernel("ts", 9.2e15),
    "dur_9e12_us": _set_kernel("dur", 9.2e12),
    "dur_negative": _set_kernel("dur", -5.0),
    "pid_labelled_two_ranks": _two_ranks,
}


def mutate_kineto(source: Path, folder: Path, mutation: str) -> Path:
    """A plain-JSON copy of the Kineto trace ``source`` in ``folder``, damaged by ``KINETO_MUTATIONS[mutation]``."""
    doc = read_kineto(source)
    KINETO_MUTATIONS[mutation](doc)
    out = Path(folder) / f"{mutation}.json"
    text = json.dumps(doc).replace(json.dumps(_DEEP), '{"a":' * DEEP_LEVELS + "1" + "}" * DEEP_LEVELS)
    out.write_text(text)
    return out
