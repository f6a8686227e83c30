"""``export``: the summary's results as a SQLite database (sqlite-utils), one row per kernel, step, layer, collective.

The database holds the results of one summary pass (nothing is recomputed here): ``runs`` (one per export call,
with the whole ``summary --json``), ``traces`` (one per input file), ``devices`` (the summary's per-device
figures), ``kernels`` and ``memops`` (with bucket, step and layer), ``steps``, ``layers``, ``collectives`` (with
bytes, transfer, wait, algbw and busbw) and ``findings``. Every table but ``runs`` has a ``trace_id`` foreign key
to ``traces`` (``findings``: ``run_id``, and ``trace_id`` when the finding names a device). Kernel names are
full-text searchable (``kernels_fts``). ``append`` adds a run to an existing database, which keeps a history.
Tables and columns are in docs/EXPORT.md.

``format="perfetto"`` writes the same summary as a Perfetto trace instead (``render/perfetto.py``,
docs/PERFETTO.md): the kernels, copies and annotation ranges per rank and stream, with the analysis as tracks.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..analysis.structure.layer_pattern import DEFAULT_LAYER_PATTERN
from ..model.errors import BadInputError, EmptyTraceError
from ..model.trace import PathLike, Trace

if TYPE_CHECKING:
    import sqlite_utils

    from ..analysis.activity import DeviceActivity
    from ..analysis.device import DeviceKey
    from ..analysis.results import DeviceSummary, Summary
    from ..analysis.structure.layers import Layers
    from ..loaders import ProgressFn

#: What ``export`` writes: a SQLite database (default) or a Perfetto trace.
FORMATS = ("sqlite", "perfetto")
#: Output suffixes that mean a Perfetto trace when no format is given.
PERFETTO_SUFFIXES = (".pftrace", ".perfetto-trace", ".perfetto")
TABLES = ("runs", "traces", "devices", "kernels", "memops", "steps", "layers", "collectives", "findings",
          "critical_path", "moe_layers")
_WHERE = ["trace_id", "rank", "device"]
# indexed on (trace_id, rank, device, start_ns)
_INDEXED = ("kernels", "memops", "steps", "layers", "collectives", "moe_layers")


@dataclass
class ExportResult:
    """What an export wrote: the database, the run and trace ids it added, rows per table, and the Summary."""

    path: Path
    run_id: int
    trace_ids: list[int]
    rows: dict[str, int] = field(default_factory=dict)
    summary: Summary | None = field(default=None, repr=False)


@dataclass
class PerfettoResult:
    """What a Perfetto export wrote: the trace file, its tracks, slices per track name, and the Summary."""

    path: Path
    tracks: int
    slices: dict[str, int] = field(default_factory=dict)
    summary: Summary | None = field(default=None, repr=False)


def output_format(output: PathLike, format: str | None) -> str:
    """The format asked for, else ``perfetto`` for a ``.pftrace`` (:data:`PERFETTO_SUFFIXES`) output, else
    ``sqlite``."""
    if format is not None:
        if format not in FORMATS:
            raise BadInputError(None, f"unknown export format {format!r}", f"one of {', '.join(FORMATS)}")
        return format
    return "perfetto" if str(output).lower().endswith(PERFETTO_SUFFIXES) else "sqlite"


def export(traces: Summary | PathLike | Trace | Sequence[PathLike | Trace], output: PathLike, *,
           append: bool = False, rules: PathLike | None = None, jobs: int = 1, step_range: str | None = None,
           layer_pattern: str | None = DEFAULT_LAYER_PATTERN, gpu_log: PathLike | None = None,
           progress: ProgressFn | None = None, window: str | None = None,
           gpu_log_tz: str | None = None, format: str | None = None) -> ExportResult | PerfettoResult:
    """Summarize trace files (or loaded Traces, or take a ready :class:`Summary`) and write the results to the
    SQLite database ``output``: the ``export`` command and ``ta.export(...)``. ``format="perfetto"`` (the default
    for a ``.pftrace`` output) writes a Perfetto trace instead (:func:`write_perfetto`; no ``append``).

    Without ``append`` the database is written to a temporary file and renamed (a failed export leaves no half
    database, and a file already at ``output`` is replaced); with ``append`` the run is added to a copy of
    ``output`` (created when absent) that then replaces it. ``output`` may not be one of the input traces. The
    other keywords are the summary's options (``window``: ``"START:END"`` seconds, for paths).
    """
    from ..analysis.results import Summary

    target = Path(output)
    kind = output_format(target, format)
    if kind == "perfetto" and append:
        raise BadInputError(target, "--append adds a run to a SQLite database; a Perfetto trace is written whole",
                            "drop --append, or export to a .db file")
    write: Callable[..., ExportResult | PerfettoResult] = write_perfetto if kind == "perfetto" else write_database
    inputs: list[PathLike] = []
    if isinstance(traces, Summary):
        summary = traces
    else:
        items: list[PathLike | Trace] = [traces] if isinstance(traces, (str, Path, Trace)) else list(traces)
        if not items:
            raise EmptyTraceError(None, "no trace files given")
        inputs = [p for p in items if isinstance(p, (str, Path))]
        check_output(target, inputs, append=append)
        from ..pipeline.summarize import summary_run

        run = summary_run(items, rules=rules, jobs=jobs, step_range=step_range, layer_pattern=layer_pattern,
                          gpu_log=gpu_log, **({"progress": progress, "window": window} if inputs else {}),
                          **({"extra": {"gpu_log_tz": gpu_log_tz}} if gpu_log_tz else {}))
        check_output(target, [t.path for t in run.summary.traces], append=append)
        return write(run.summary, target, append=append)
    check_output(target, [t.path for t in summary.traces], append=append)
    return write(summary, target, append=append)


def check_output(target: Path, inputs: Iterable[PathLike], *, append: bool) -> None:
    """Refuse, before any work, an output that ``output.write_built`` would refuse (stdout, a directory, a special
    file, one of the input traces) or (with ``append``) a file that is not a traceanalyzer database."""
    from .output import check_output as check_target

    if str(target) == "-":
        raise BadInputError(None, "-o -: a SQLite database cannot be written to stdout",
                            "give it a file name, e.g. -o analysis.db")
    check_target(target, [Path(p) for p in inputs])
    if append and target.exists():
        _check_appendable(target)


#: seconds an ``append`` waits for another writer of the same database (another ``export --append``) to finish
APPEND_WAIT_S = 120.0
_APPEND_HINT = "--append adds to a database that traceanalyzer export wrote"


def _check_appendable(target: Path) -> None:
    """Refuse, before any work, a ``--append`` target that :func:`_append_in_place` would refuse."""
    try:
        conn = _open_target(target)
        try:
            _require_appendable(conn, target)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise BadInputError(target, f"is not a SQLite database ({exc})", _APPEND_HINT) from None


def _open_target(target: Path) -> sqlite3.Connection:
    """A read-write connection to an existing database that waits :data:`APPEND_WAIT_S` for another writer's lock,
    reads its write-ahead log or rolls back a crashed writer's journal as SQLite does, and runs nothing stored in
    the file: its authorizer denies any statement prepared on behalf of a trigger or view and any recursive query
    (:func:`_require_appendable` names those first)."""
    conn = sqlite3.connect(target, timeout=APPEND_WAIT_S)
    conn.execute("PRAGMA trusted_schema = OFF")
    conn.execute("PRAGMA recursive_triggers = OFF")
    conn.set_authorizer(_deny_stored_code)
    return conn


def _deny_stored_code(action: int, arg1: str | None, arg2: str | None, database: str | None,
                      origin: str | None) -> int:
    if action == sqlite3.SQLITE_RECURSIVE or origin is not None:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _require_appendable(conn: sqlite3.Connection, target: Path) -> None:
    """:class:`BadInputError` unless the database is empty or has the export's tables: ``runs`` and ``traces`` with
    their ``id`` primary keys, ``kernels``; each of its tables a table (not a view) and no trigger on any of them
    (a trigger runs on every row the export inserts, and may never end)."""
    objects = conn.execute("SELECT type, name, tbl_name FROM sqlite_master").fetchall()
    if not objects:
        return
    kinds = {name: kind for kind, name, _ in objects if kind in ("table", "view")}
    ours = set(TABLES) | {n for n in kinds if n.startswith("kernels_fts")}
    for kind, name, table in objects:
        if kind == "trigger" and table in ours:
            raise BadInputError(target, f"has a trigger ({name} on {table}) that appending would run: "
                                "traceanalyzer export writes no triggers", _APPEND_HINT)
    for name in TABLES:
        if kinds.get(name) == "view":
            raise BadInputError(target, f"is not a traceanalyzer export: {name} is a view", _APPEND_HINT)
    if not {"runs", "traces", "kernels"} <= set(kinds):
        raise BadInputError(target, "is not a traceanalyzer export (no runs/traces/kernels tables)", _APPEND_HINT)
    for name in ("runs", "traces"):
        keys = [row[1] for row in conn.execute(f"PRAGMA table_info([{name}])") if row[5]]
        if keys != ["id"]:
            raise BadInputError(target, f"is not a traceanalyzer export: {name} has no id primary key",
                                _APPEND_HINT)


def _append_in_place(summary: Summary, target: Path, rows: Callable[[DeviceSummary], DeviceRows]) -> ExportResult:
    """Add the run to ``target`` in one write transaction (``BEGIN IMMEDIATE``): concurrent appends to one database
    wait for each other (:data:`APPEND_WAIT_S`) instead of losing a run; a failure, a signal or a crash leaves the
    database as it was (SQLite rolls the transaction back); its write-ahead log, if any, is SQLite's to keep."""
    import sqlite_utils

    try:
        conn = _open_target(target)
    except sqlite3.Error as exc:
        raise BadInputError(target, f"cannot open the database ({exc})") from None
    db = sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)
    try:
        conn.execute("BEGIN IMMEDIATE")
        _require_appendable(conn, target)
        result = _write(db, summary, target, rows)
        conn.commit()
        return result
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise BadInputError(target, f"is locked by another writer (waited {APPEND_WAIT_S:.0f} s)",
                                "try again when the other export has finished") from None
        raise BadInputError(target, f"cannot write the database ({exc})") from None
    except sqlite3.Error as exc:
        raise BadInputError(target, f"cannot write the database ({exc})") from None
    finally:
        if conn.in_transaction:
            conn.rollback()
        conn.close()


def write_database(summary: Summary, output: PathLike, *, append: bool = False) -> ExportResult:
    """Write ``summary`` to ``output``: its results, and each device's kernels and memops with their step and
    layer (:func:`device_rows`).

    A new database is built in a temporary file beside ``output`` and renamed over it by ``output.write_built``
    (``output`` is either the old file or the complete new database; the old file's write-ahead log, shared
    memory and journal are removed with it). With ``append`` an existing database gets the run in one transaction
    (:func:`_append_in_place`); an absent one is created as a new database would be, unless another append
    created it meanwhile.
    """
    import sqlite_utils

    target = Path(output)
    rows = device_rows(summary)
    from .output import SQLITE_SIDECARS, write_built

    if append and target.exists():
        return _append_in_place(summary, target, rows)
    written: list[ExportResult] = []

    def build(tmp: Path) -> None:
        try:
            db = sqlite_utils.Database(tmp, recursive_triggers=False, execute_plugins=False)
            try:
                written.append(_write(db, summary, target, rows))
                db.conn.commit()
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise BadInputError(target, f"cannot write the database ({exc})") from None

    try:
        write_built(target, build, inputs=[t.path for t in summary.traces], exclusive=append)
    except FileExistsError:  # another append created the database meanwhile: add to it
        return _append_in_place(summary, target, rows)
    if not append:
        for suffix in SQLITE_SIDECARS:  # the replaced database's; SQLite would apply a stale log to the new file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{os.path.realpath(target)}{suffix}")
    return written[0]


def write_perfetto(summary: Summary, output: PathLike, *, append: bool = False) -> PerfettoResult:
    """Write ``summary`` as a Perfetto trace at ``output`` (atomically, as :func:`write_database`): each device's
    kernels and memops (its activity, read again from its file when the Summary kept none), the annotation ranges
    of its trace and the analysis tracks (``render/perfetto.py``). ``append`` is not used."""
    from ..render.perfetto import write_perfetto as write_tracks
    from .output import write_built

    target = Path(output)
    activity_of = device_activities(summary)
    written: list[PerfettoResult] = []

    def build(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            w = write_tracks(summary, activity_of, fh)
        counts: dict[str, int] = {}
        for t in w.tracks:
            base = t.name.split(" · lane ")[0]
            counts[base] = counts.get(base, 0) + len(t)
        written.append(PerfettoResult(path=target, tracks=len(w.tracks), slices=counts, summary=summary))

    write_built(target, build, inputs=[t.path for t in summary.traces])
    return written[0]


# -- each device's kernels and memops ----------------------------------------------------------------------------
#: What a device's kernel and memop rows are read from: its activity, and its layers (each kernel's layer).
DeviceRows = tuple["DeviceActivity", "Layers"]


def device_rows(summary: Summary) -> Callable[[DeviceSummary], DeviceRows]:
    """Where each device's kernel and memop rows come from: its working state as the summary's analysis left it
    (``Summary.states``: its activity and layers), else its activity read again (:func:`device_activities`) and its
    layers found again from the activity and the device's steps, as its analysis found them."""
    from ..analysis.device import device_key
    from ..analysis.structure.layers import layer_table

    activity_of = device_activities(summary)

    def rows_of(dev: DeviceSummary) -> DeviceRows:
        state = summary.states.get(device_key(dev))
        if state is not None:
            return state.activity, state.layering
        act = activity_of(dev)
        pattern = summary.source.layer_pattern if summary.source is not None else DEFAULT_LAYER_PATTERN
        return act, layer_table(act, dev.per_step, pattern, numbers=False)

    return rows_of


def device_activities(summary: Summary) -> Callable[[DeviceSummary], DeviceActivity]:
    """Each device's activity: the one its analysis kept (``Summary.states``), else its trace file read again as
    the summary read it (``Summary.source``: a Summary of the Dask engine, whose traces stayed on the workers).
    Files are read again (all at once) before anything is written: one that cannot be is refused first."""
    from ..analysis.activity import gather
    from ..analysis.device import device_key

    traces: dict[str, Trace] = {}
    lacking = [d for d in summary.devices if device_key(d) not in summary.states]
    if lacking:
        source = summary.source
        if source is None or not source.from_files:
            where = ", ".join(f"rank {d.rank} GPU {d.device}" for d in lacking)
            raise ValueError(f"the Summary keeps no working state for its devices ({where}) and it was not read "
                             "from files: pass the traces")
        from ..pipeline.summarize import load_for_summary

        paths = [t.path for t in summary.traces]
        loaded = load_for_summary(paths, rules=source.rules, layer_pattern=source.layer_pattern, window=source.window)
        traces = {str(t.path): t for t in loaded}

    def activity_of(dev: DeviceSummary) -> DeviceActivity:
        state = summary.states.get(device_key(dev))
        return state.activity if state is not None else gather(traces[dev.trace], dev.rank, dev.device)

    return activity_of


# -- the tables ------------------------------------------------------------------------------------------------
def _write(db: sqlite_utils.Database, summary: Summary, target: Path,
           rows_of: Callable[[DeviceSummary], DeviceRows]) -> ExportResult:
    from .._version import __version__
    from ..analysis.device import device_key

    _create_schema(db)
    payload = summary.to_json()
    wi = summary.what_if
    cr = summary.cross_rank
    run_id = _insert_one(db, "runs", {
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "traceanalyzer_version": __version__, "json_schema_version": payload["schema_version"],
        "comm_free_step_saving_ns": wi.comm_free_step_saving_ns, "what_if_basis": wi.basis,
        "collectives_matched": cr.collectives_matched if cr else None,
        "straggler_rank": cr.straggler_rank if cr else None,
        "summary_json": json.dumps(payload, allow_nan=False, default=_json_default),
    })
    trace_ids: dict[str, int] = {}
    for meta in summary.traces:
        window = meta.window_ns or (None, None)
        trace_ids[meta.path] = _insert_one(db, "traces", {
            "run_id": run_id, "path": meta.path, "name": Path(meta.path).name, "format": meta.format,
            "tool_version": meta.tool_version, "schema_version": meta.schema_version,
            "ranks": json.dumps(meta.ranks), "devices": json.dumps(meta.devices, default=_json_default),
            "window_start_ns": window[0], "window_end_ns": window[1], "warnings": json.dumps(meta.warnings),
        })
    rows = {name: 0 for name in TABLES}
    rows["runs"], rows["traces"] = 1, len(trace_ids)
    activities: dict[DeviceKey, DeviceActivity] = {}  # each device's activity, as its rows were read from
    for dev in summary.devices:
        tid = trace_ids[dev.trace]
        rows["devices"] += _insert_frame(db, "devices", pd.DataFrame([_device_row(dev)]), tid)
        act, layers = rows_of(dev)
        activities[device_key(dev)] = act
        rows["kernels"] += _insert_kernels(db, dev, act, layers, tid)
        rows["memops"] += _insert_memops(db, dev, act, layers, tid)
        rows["steps"] += _insert_frame(db, "steps", _with_device(dev.per_step, dev), tid)
        rows["layers"] += _insert_frame(db, "layers", _with_device(dev.per_layer, dev), tid)
        rows["collectives"] += _insert_frame(db, "collectives", _collective_frame(summary, dev), tid)
        if dev.moe is not None:
            rows["moe_layers"] += _insert_frame(db, "moe_layers", _with_device(dev.moe.layers, dev), tid)
    rows["findings"] = _insert_findings(db, summary, run_id, trace_ids)
    rows["critical_path"] = _insert_critical_path(db, summary, activities, run_id, trace_ids)
    _populate_fts(db, list(trace_ids.values()))
    return ExportResult(path=target, run_id=run_id, trace_ids=list(trace_ids.values()), rows=rows, summary=summary)


_SCHEMA: dict[str, dict[str, type]] = {
    "runs": {"id": int, "exported_at": str, "traceanalyzer_version": str, "json_schema_version": str,
             "comm_free_step_saving_ns": int, "what_if_basis": str, "collectives_matched": int,
             "straggler_rank": int, "summary_json": str},
    "traces": {"id": int, "run_id": int, "path": str, "name": str, "format": str, "tool_version": str,
               "schema_version": str, "ranks": str, "devices": str, "window_start_ns": int, "window_end_ns": int,
               "warnings": str},
    "devices": {"trace_id": int, "rank": int, "device": int, "name": str, "span_ns": int, "busy_ns": int,
                "idle_ns": int, "comm_ns": int, "comm_hidden_ns": int, "comm_exposed_ns": int,
                "overlap_pct": float, "steps": int, "step_ns_median": int, "comm_exposed_per_step_ns": int},
    "kernels": {"trace_id": int, "rank": int, "device": int, "stream": int, "start_ns": int, "end_ns": int,
                "duration_ns": int, "name": str, "raw_name": str, "bucket": str, "subbucket": str,
                "precision": str, "rule": str, "step": int, "layer": int, "correlation": int, "moe_stage": str},
    "memops": {"trace_id": int, "rank": int, "device": int, "stream": int, "start_ns": int, "end_ns": int,
               "duration_ns": int, "kind": str, "copy_kind": str, "bytes": int, "name": str, "bucket": str,
               "step": int, "layer": int},
    "steps": {"trace_id": int, "rank": int, "device": int, "step": int, "start_ns": int, "end_ns": int,
              "duration_ns": int},
    "layers": {"trace_id": int, "rank": int, "device": int, "step": int, "layer": int, "name": str,
               "start_ns": int, "end_ns": int, "duration_ns": int},
    "collectives": {"trace_id": int, "rank": int, "device": int, "start_ns": int, "end_ns": int,
                    "duration_ns": int, "name": str, "raw_name": str, "kind": str, "bytes": int,
                    "transfer_ns": int, "wait_ns": int, "algbw_gbps": float, "busbw_gbps": float},
    "critical_path": {"run_id": int, "trace_id": int, "step_ordinal": int, "step": int, "step_rank": int,
                      "rank": int, "start_ns": int, "end_ns": int, "duration_ns": int, "category": str,
                      "bucket": str, "edge": str},
    "moe_layers": {"trace_id": int, "rank": int, "device": int, "step": int, "layer": int, "start_ns": int,
                   "end_ns": int, "kernels": int, "moe_ns": int},
    "findings": {"run_id": int, "trace_id": int, "id": str, "title": str, "impact_ns_per_step": int,
                 "impact_pct_of_step": float, "severity": str, "recommendation": str, "rank": int, "device": int,
                 "evidence": str},
}


def _create_schema(db: sqlite_utils.Database) -> None:
    """Tables (with foreign keys), indexes and the kernel-name full-text index, when not there yet."""
    if "runs" not in db.table_names():
        _t(db, "runs").create(_SCHEMA["runs"], pk="id")
        _t(db, "traces").create(_SCHEMA["traces"], pk="id", foreign_keys=[("run_id", "runs", "id")])
    for name in TABLES[2:]:
        if name in db.table_names():
            continue
        keys = [("trace_id", "traces", "id")] + ([("run_id", "runs", "id")] if name in ("findings", "critical_path")
                                                 else [])
        _t(db, name).create(_SCHEMA[name], foreign_keys=keys)
        if name in _INDEXED:
            _t(db, name).create_index([*_WHERE, "start_ns"], index_name=f"idx_{name}_where_start")
    if "moe_stage" not in _t(db, "kernels").columns_dict:  # a database an earlier version made (--append)
        _t(db, "kernels").add_column("moe_stage", str)
    if "idx_kernels_bucket" not in {i.name for i in _t(db, "kernels").indexes}:
        _t(db, "kernels").create_index(["trace_id", "bucket", "step"], index_name="idx_kernels_bucket")
        _t(db, "devices").create_index(_WHERE, index_name="idx_devices_where")
        _t(db, "findings").create_index(["run_id"], index_name="idx_findings_run")
        _t(db, "kernels").enable_fts(["name", "raw_name"], fts_version="FTS5", create_triggers=False)


def _t(db: sqlite_utils.Database, name: str) -> sqlite_utils.db.Table:
    """A table of the database (sqlite-utils' ``db[name]`` may also be a view)."""
    return db.table(name)


def _insert_one(db: sqlite_utils.Database, name: str, row: dict[str, Any]) -> int:
    """Insert one row; its primary key."""
    table = _t(db, name)
    table.insert(row)
    if table.last_pk is None:
        raise RuntimeError(f"no primary key for the row inserted into {name}")
    return int(table.last_pk)


def _populate_fts(db: sqlite_utils.Database, trace_ids: list[int]) -> None:
    marks = ", ".join("?" for _ in trace_ids)
    db.execute(f"INSERT INTO kernels_fts (rowid, name, raw_name) SELECT rowid, name, raw_name FROM kernels "
               f"WHERE trace_id IN ({marks})", trace_ids)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _device_row(dev: DeviceSummary) -> dict[str, Any]:
    """The device's ``summary --json`` entry: scalars as columns, lists and dicts as JSON text."""
    out: dict[str, Any] = {}
    for key, value in dev.to_json().items():
        if key == "trace":
            continue
        out[key] = json.dumps(value, default=_json_default) if isinstance(value, (dict, list, tuple)) else value
    return out


def _with_device(df: pd.DataFrame, dev: DeviceSummary) -> pd.DataFrame:
    return df.assign(rank=dev.rank, device=dev.device)


def _insert_frame(db: sqlite_utils.Database, table: str, df: pd.DataFrame, trace_id: int) -> int:
    """Rows of a DataFrame (plus ``trace_id``); columns the table lacks are added."""
    if not len(df):
        return 0
    frame = df.assign(trace_id=trace_id)
    front = [c for c in _SCHEMA[table] if c in frame.columns]
    frame = frame[front + [c for c in frame.columns if c not in front]]
    records = [{k: _plain(v) for k, v in rec.items()} for rec in frame.to_dict(orient="records")]
    _t(db, table).insert_all(records, alter=True)
    return len(records)


def _plain(value: Any) -> Any:
    """A value SQLite stores: numpy scalars to Python, NaN/NA to NULL, other objects to text."""
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, np.generic):
        value = value.item()
        return None if isinstance(value, float) and np.isnan(value) else value
    if isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, default=_json_default) if isinstance(value, (dict, list, tuple)) else str(value)


def _bulk(db: sqlite_utils.Database, table: str, columns: dict[str, Any]) -> int:
    """Insert equally long columns (numpy arrays or lists) in one executemany: kernels can be millions of rows."""
    names = list(columns)
    lists = [np.asarray(v).tolist() if not isinstance(v, list) else v for v in columns.values()]
    if not lists or not len(lists[0]):
        return 0
    sql = f"INSERT INTO [{table}] ({', '.join(f'[{n}]' for n in names)}) VALUES ({', '.join('?' for _ in names)})"
    db.conn.executemany(sql, zip(*lists, strict=True))
    return len(lists[0])


def _strings(trace: Trace, table: Any, column: str) -> list[Any]:
    if column not in table:
        return [None] * len(table)
    return trace.names(table[column]).tolist()


def _steps_of(dev: DeviceSummary, starts: np.ndarray) -> np.ndarray:
    """Step number of the step window holding each start (as the summary assigns collectives), -1 outside."""
    from ..analysis.numeric import intervals as iv

    ps = dev.per_step
    if not len(ps):
        return np.full(len(starts), -1, dtype=np.int64)
    return iv.window_ids(starts, ps["start_ns"].to_numpy(np.int64), ps["end_ns"].to_numpy(np.int64),
                         ps["step"].to_numpy(np.int64))


def _names(raw: list[str | None]) -> tuple[list[str | None], list[str | None]]:
    """(raw name where it differs from the shown one, else None; shown name): mangled symbols demangled."""
    from ..render.formatting import display_names

    shown = display_names(raw)
    return [r if r != s else None for r, s in zip(raw, shown, strict=True)], shown


def _insert_kernels(db: sqlite_utils.Database, dev: DeviceSummary, act: DeviceActivity, layers: Layers,
                    trace_id: int) -> int:
    k, trace = act.kernels, act.trace
    if not len(k):
        return 0
    start, end = k["start_ns"], k["end_ns"]
    raw, names = _names(trace.names(k["name_id"]).tolist())
    layer = layers.kernel_layer()
    return _bulk(db, "kernels", {
        "trace_id": np.full(len(k), trace_id), "rank": np.full(len(k), dev.rank), "device": np.full(len(k), dev.device),
        "stream": k["stream"], "start_ns": start, "end_ns": end, "duration_ns": end - start, "name": names,
        "raw_name": raw, "bucket": act.kernel_bucket.tolist(),
        "subbucket": _strings(trace, k, "subbucket_id"), "precision": _strings(trace, k, "precision_id"),
        "rule": _strings(trace, k, "rule_id"), "step": _steps_of(dev, start), "layer": layer,
        "correlation": k["correlation"], "moe_stage": _moe_stages(dev, len(k))})


def _moe_stages(dev: DeviceSummary, n: int) -> list[str | None]:
    """The MoE stage of each of the device's ``n`` kernels (docs/MOE.md), None where none."""
    moe = dev.moe
    if moe is None or len(moe.kernel_stage) != n:
        return [None] * n
    return list(moe.stage_names())


def _insert_memops(db: sqlite_utils.Database, dev: DeviceSummary, act: DeviceActivity, layers: Layers,
                   trace_id: int) -> int:
    m, trace = act.memops, act.trace
    if not len(m):
        return 0
    start, end = m["start_ns"], m["end_ns"]
    layer = layers.layer_at(start)
    return _bulk(db, "memops", {
        "trace_id": np.full(len(m), trace_id), "rank": np.full(len(m), dev.rank), "device": np.full(len(m), dev.device),
        "stream": m["stream"], "start_ns": start, "end_ns": end, "duration_ns": end - start,
        "kind": _strings(trace, m, "kind_id"), "copy_kind": _strings(trace, m, "copy_kind_id"),
        "bytes": np.where(m["bytes"] >= 0, m["bytes"], -1), "name": _strings(trace, m, "name_id"),
        "bucket": act.memop_bucket.tolist(), "step": _steps_of(dev, start), "layer": layer})


def _collective_frame(summary: Summary, dev: DeviceSummary) -> pd.DataFrame:
    from ..analysis.collectives import with_transfer
    from ..model.communication import link_peak_gbps

    if not len(dev.collectives):
        return dev.collectives
    c = with_transfer(dev.collectives, dev.rank, summary.cross_rank, link_peak_gbps(dev.name))
    raw, names = _names(c["name"].tolist())
    c = c.assign(name=names, raw_name=raw)
    return _with_device(c.drop(columns=["compute_beside_ns"]), dev)


def _insert_findings(db: sqlite_utils.Database, summary: Summary, run_id: int, trace_ids: dict[str, int]) -> int:
    devices = {(d.rank, d.device): trace_ids[d.trace] for d in summary.devices}
    single = next(iter(trace_ids.values())) if len(trace_ids) == 1 else None
    records = []
    for f in summary.findings:
        rank, device = f.evidence.get("rank"), f.evidence.get("device")
        key = (int(rank), int(device)) if isinstance(rank, (int, np.integer)) and \
            isinstance(device, (int, np.integer)) else None
        records.append({"run_id": run_id, "trace_id": devices.get(key, single) if key else single, "id": f.id,
                        "title": f.title, "impact_ns_per_step": f.impact_ns_per_step,
                        "impact_pct_of_step": f.impact_pct_of_step, "severity": f.severity,
                        "recommendation": f.recommendation, "rank": key[0] if key else None,
                        "device": key[1] if key else None,
                        "evidence": json.dumps(f.evidence, allow_nan=False, default=_json_default)})
    if records:
        _t(db, "findings").insert_all(records)
    return len(records)


def _insert_critical_path(db: sqlite_utils.Database, summary: Summary, activities: dict[DeviceKey, DeviceActivity],
                          run_id: int, trace_ids: dict[str, int]) -> int:
    """The critical path of each step of the summary's first run, one row per stretch (docs/METHOD_WHATIF_SIM.md),
    from the ``activities`` the kernel rows were read from; none where no step has GPU work."""
    from ..analysis.device import device_key
    from ..analysis.runs import group_runs
    from ..analysis.what_if.dep_graph import build_graph
    from ..analysis.what_if.simulate import simulate

    devices = [d for d in summary.devices if device_key(d) in activities]
    traces = list({id(a.trace): a.trace for a in activities.values()}.values())
    if not devices:
        return 0
    runs = group_runs([t.header() for t in traces], devices)
    primary = set(runs[0].paths) if runs else {d.trace for d in devices}
    devices = [d for d in devices if d.trace in primary]
    graph = build_graph([t for t in traces if t.path in primary], devices, summary.cross_rank, activities)
    if not graph.steps:
        return 0
    trace_of = {d.rank: d.trace for d in devices}
    records = [{"run_id": run_id, "trace_id": trace_ids.get(trace_of.get(seg.rank, "")),
                "step_ordinal": p.ordinal, "step": p.step, "step_rank": p.rank, "rank": seg.rank,
                "start_ns": seg.start_ns, "end_ns": seg.end_ns, "duration_ns": seg.end_ns - seg.start_ns,
                "category": seg.category, "bucket": seg.bucket, "edge": seg.edge}
               for p in simulate(graph, []).paths for seg in p.segments]
    _t(db, "critical_path").insert_all(records)
    return len(records)
