"""SQLite plumbing for the nsys loader: read-only connection, schema probing, chunked fetch into numpy,
and StringIds → string-pool mapping done once per distinct id."""

from __future__ import annotations

import functools
import queue
import sqlite3
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..model.trace import StringPool
from .detect import ProgressFn

FETCH_ROWS = 65536  # rows per fetchmany chunk: bounds the Python-tuple working set
CONCAT_ROWS = 131072  # rowids per group_concat chunk of :func:`fetch_table` (a few MB of text per column)
_IN_BATCH = 900  # ids per "IN (...)" query, below SQLite's historical 999-variable limit


def decode_text(raw: bytes) -> str:
    """UTF-8, else Latin-1 (old Windows exports store user/host names in Latin-1)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class BadColumn(Exception):
    """A value in the export that cannot be what its column means (NULL start, text or BLOB where an integer
    belongs, a missing column). The loader turns it into one line naming the file, table and column."""

    def __init__(self, table: str, column: str, problem: str) -> None:
        super().__init__(f"{table}.{column}: {problem}")
        self.table, self.column, self.problem = table, column, problem


def describe_value(value: object) -> str:
    """A stored value as a user would name it: ``NULL``, ``a BLOB``, ``the text 'abc'``, ``9.5``."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes | bytearray | memoryview):
        return "a BLOB"
    if isinstance(value, str):
        return "the text " + repr(value[:40] + ("…" if len(value) > 40 else ""))
    return repr(value)


def int_value(value: object, table: str, column: str) -> int:
    """``value`` as an int64, or :class:`BadColumn` naming ``table.column`` (NULL, text, BLOB, out of range)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63):
        return value
    raise BadColumn(table, column, f"{describe_value(value)} where an integer is expected")


def require_columns(schema_cols: frozenset[str], table: str, *names: str) -> None:
    """:class:`BadColumn` for the first of ``names`` that ``table`` lacks (checked before any SQL names it)."""
    for name in names:
        if name not in schema_cols:
            raise BadColumn(table, name, "column missing")


def connect(path: Path) -> sqlite3.Connection:
    """Open an export read-only and immutable: no journal, WAL or lock file is needed (read-only dirs work).

    Immutable means SQLite reads the main file alone, so :func:`check_sidecars` must have refused a file whose
    write-ahead log or rollback journal holds data the file lacks. The file is data, never code: the connection's
    authorizer (:func:`_authorize`) refuses, when a statement is prepared, any read made through a view or trigger
    stored in the file and any recursive query, so no query can run a program the file holds."""
    uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False, factory=ExportConnection)
    conn.text_factory = decode_text
    conn.execute("PRAGMA trusted_schema = OFF")
    conn.set_authorizer(functools.partial(_authorize, conn.window_views))
    return conn


class ExportConnection(sqlite3.Connection):
    """A connection to an export; ``window_views`` names the TEMP views the loader made on it (each shadows the
    activity table it filters: :func:`~traceanalyzer.loaders.limits.window_views`), the only views it may read."""

    window_views: set[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.window_views = set()


def _authorize(window_views: set[str], action: int, arg1: str | None, arg2: str | None, database: str | None,
               origin: str | None) -> int:
    """SQLite authorizer of an export's connection, asked as each statement is prepared: deny a recursive query
    (``WITH RECURSIVE``: endless rows) and any read made on behalf of a view or trigger (``origin``: the innermost
    one) other than the loader's own window views."""
    if action == sqlite3.SQLITE_RECURSIVE:
        return sqlite3.SQLITE_DENY
    if origin is not None and action == sqlite3.SQLITE_READ and origin not in window_views:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class StoredQuery(Exception):
    """A table the loader reads is a view, a virtual table or has computed columns: reading it would run a query
    or expression stored in the file. The loader turns it into one line naming the file and the table."""

    def __init__(self, table: str, what: str) -> None:
        super().__init__(f"{table} is {what}")
        self.table, self.what = table, what


SIDECAR_HINT = ("let SQLite finish it first (open the file once with sqlite3 in a writable folder), or wait for "
                "the writer")


def check_sidecars(path: Path) -> str | None:
    """Why the file alone is not the committed data, or None: a write-ahead log beside a WAL-mode database that
    holds frames (``NAME-wal`` longer than its 32-byte header), or a rollback journal beside it whose header is
    live (``NAME-journal``: a writer crashed or is writing; a zeroed or empty journal is a finished one)."""
    wal, journal = Path(f"{path}-wal"), Path(f"{path}-journal")
    try:
        with open(path, "rb") as fh:
            header = fh.read(20)
        wal_size = wal.stat().st_size if wal.exists() else 0
        live_journal = False
        if journal.exists() and journal.stat().st_size:
            with open(journal, "rb") as fh:
                live_journal = any(fh.read(28))
    except OSError:
        return None  # the loader's own open says what is wrong with the file
    if len(header) == 20 and header[18:20] == b"\x02\x02" and wal_size > 32:
        return (f"has a write-ahead log beside it ({wal.name}, {wal_size:,} bytes) holding changes the file lacks "
                "(a writer has it open or did not checkpoint)")
    if live_journal:
        return (f"has a live rollback journal beside it ({journal.name}): a write was interrupted or is under way, "
                "so the file may hold half-written pages")
    return None


def quote(identifier: str) -> str:
    """SQL-quoted identifier."""
    return '"' + identifier.replace('"', '""') + '"'


@dataclass(frozen=True)
class Schema:
    """Tables of the export and the columns of each (from sqlite_master + PRAGMA table_xinfo).

    ``untrusted`` names the views, virtual tables and tables with computed (virtual generated) columns, each with
    what it is: nsys writes none of them where its own tables belong (Extra-P adds views of its own names), so
    asking for one of them (:meth:`has`, :meth:`cols`) raises :class:`StoredQuery` instead of running it."""

    columns: dict[str, frozenset[str]]
    untrusted: dict[str, str] = field(default_factory=dict)

    def has(self, table: str, *cols: str) -> bool:
        """Whether ``table`` exists and has every column in ``cols``."""
        have = self.cols(table)
        return bool(have) and all(c in have for c in cols)

    def cols(self, table: str) -> frozenset[str]:
        """Columns of ``table`` (empty when absent)."""
        if table in self.untrusted:
            raise StoredQuery(table, self.untrusted[table])
        return self.columns.get(table, frozenset())

    def any_prefixed(self, *prefixes: str) -> bool:
        """Whether any table name starts with one of ``prefixes``."""
        return any(name.startswith(prefixes) for name in [*self.columns, *self.untrusted])


def probe(conn: sqlite3.Connection) -> Schema:
    """Discover every table and its columns; never trust the version string alone. Views and virtual tables are
    recorded as untrusted without being compiled; so is a table whose column is computed when read."""
    columns: dict[str, frozenset[str]] = {}
    untrusted: dict[str, str] = {}
    for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view')"):
        if kind == "view":
            untrusted[name] = "a view, not a table"
        elif str(sql or "").lstrip()[:14].upper().startswith("CREATE VIRTUAL"):
            untrusted[name] = "a virtual table, not a table"
        else:
            info = conn.execute(f"PRAGMA table_xinfo({quote(name)})").fetchall()
            if any(row[6] == 2 for row in info):  # hidden = 2: a VIRTUAL generated column, computed on every read
                untrusted[name] = "a table with columns computed when read"
            else:
                columns[name] = frozenset(row[1] for row in info if row[6] in (0, 3))  # 3: stored generated
    return Schema(columns, untrusted)


def count_rows(conn: sqlite3.Connection, table: str, where: str = "", params: Sequence[object] = ()) -> int:
    """``COUNT(*)`` of a table, optionally filtered."""
    sql = f"SELECT COUNT(*) FROM {quote(table)}" + (f" WHERE {where}" if where else "")
    return int(conn.execute(sql, tuple(params)).fetchone()[0])


class RowProgress:
    """Turns rows fetched from several queries into one ``progress(done_rows, total_rows)`` stream."""

    def __init__(self, progress: ProgressFn | None, total: int) -> None:
        self._progress = progress
        self.total = max(int(total), 0)
        self.done = 0

    def advance(self, rows: int) -> None:
        """Count ``rows`` more rows fetched and report."""
        self.done += rows
        if self._progress is not None:
            self._progress(self.done, max(self.total, self.done))


ChunkConverter = Callable[[np.ndarray], dict[str, np.ndarray]]


def fetch_columns(conn: sqlite3.Connection, sql: str, fields: Sequence[tuple[str, str]], expected: int,
                  tick: RowProgress, params: Sequence[object] = (), *,
                  convert: tuple[Sequence[tuple[str, str]], ChunkConverter] | None = None,
                  table: str = "?", sources: Sequence[str] = (), first_row: int = 0) -> dict[str, np.ndarray]:
    """Run ``sql`` and return its result columns as numpy arrays named and typed by ``fields``.

    Rows arrive in chunks of :data:`FETCH_ROWS` through ``fetchmany``; each chunk is converted at C speed
    (``np.fromiter`` of a structured dtype) into preallocated columns of ``expected`` rows, so peak memory
    is the final arrays plus one chunk. Integer columns must not be NULL (wrap them in ``IFNULL`` in SQL).
    ``convert = (out_fields, fn)`` turns each structured chunk into the output columns instead (so a
    derived column never exists at full length). A value that does not convert (NULL, text or a BLOB where a
    number belongs) raises :class:`BadColumn` naming ``table`` and the field's source column from ``sources``
    (found by checking only the chunk that failed: the normal path pays nothing).
    """
    dtype = np.dtype(list(fields))
    all_int = all(np.dtype(t).kind == "i" for _, t in fields)
    out_fields, fn = convert if convert is not None else (fields, None)
    cols = {name: np.empty(max(expected, 0), dtype=t) for name, t in out_fields}
    cursor = conn.execute(sql, tuple(params))
    n = 0
    while rows := cursor.fetchmany(FETCH_ROWS):
        k = len(rows)
        try:
            if all_int and fn is None:  # a 2-D int64 array converts ~20% faster than a structured one
                block = np.array(rows, dtype=np.int64).reshape(k, len(fields))
                parts = {name: block[:, i] for i, (name, _) in enumerate(fields)}
            else:
                chunk = np.array(rows, dtype=dtype)
                parts = fn(chunk) if fn is not None else {name: chunk[name] for name in cols}
        except (TypeError, ValueError, OverflowError):
            raise _bad_chunk(rows, fields, table, sources, first_row + n) from None
        del rows
        if n + k > len(next(iter(cols.values()))):  # more rows than COUNT(*) said: only for a live file
            cols = {name: np.concatenate([arr[:n], np.empty(max(k, n), arr.dtype)]) for name, arr in cols.items()}
        for name in cols:
            cols[name][n:n + k] = parts[name]
        n += k
        tick.advance(k)
    return {name: arr[:n] if len(arr) != n else arr for name, arr in cols.items()}


def fetch_table(conn: sqlite3.Connection, table: str, exprs: Sequence[str], fields: Sequence[tuple[str, str]],
                expected: int, tick: RowProgress, *, where: str = "", params: Sequence[object] = (),
                sources: Sequence[str] = (), plain: bool = True) -> dict[str, np.ndarray]:
    """``SELECT exprs FROM table [WHERE where]`` as integer columns named and typed by ``fields``, in table order
    (read as :func:`table_chunks` says into columns of ``expected`` rows, grown when there are more)."""
    cols = {name: np.empty(max(expected, 0), dtype=t) for name, t in fields}
    n = 0
    for part in table_chunks(conn, table, exprs, fields, tick, where=where, params=params, sources=sources,
                             plain=plain, expected=expected):
        k = len(part[fields[0][0]])
        if n + k > len(cols[fields[0][0]]):  # more rows than expected (a subset of unknown size, a live file)
            cols = {name: np.concatenate([arr[:n], np.empty(max(k, n), arr.dtype)]) for name, arr in cols.items()}
        for name in cols:
            cols[name][n:n + k] = part[name]
        n += k
    return {name: arr[:n] if len(arr) != n else arr for name, arr in cols.items()}


def table_chunks(conn: sqlite3.Connection, table: str, exprs: Sequence[str], fields: Sequence[tuple[str, str]],
                 tick: RowProgress, *, where: str = "", params: Sequence[object] = (), sources: Sequence[str] = (),
                 plain: bool = True, expected: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """``SELECT exprs FROM table [WHERE where]`` as chunks of integer columns named and typed by ``fields``, in
    table order.

    When ``table`` is a plain table (``plain``: not a window view, so it has rowids), each chunk of
    :data:`CONCAT_ROWS` rowids is read by one query of one ``group_concat`` per column, parsed by
    ``np.fromstring``: no Python object per row, 2.5x faster than fetching tuples. Every expression must be
    non-NULL (``IFNULL``). A chunk whose text does not parse into as many integers as it has rows (a NULL, text,
    BLOB or float value) is read again as tuples (:func:`fetch_columns`), which converts what it can and names the
    bad value (:class:`BadColumn`) otherwise. Without rowids, :func:`fetch_columns` reads it all as one chunk.
    """
    cond = f"({where})" if where else "1"
    sql = f"SELECT {', '.join(exprs)} FROM {table} WHERE {cond}"
    if not plain or any(np.dtype(t).kind != "i" for _, t in fields):
        yield fetch_columns(conn, sql, fields, expected, tick, params, table=table, sources=sources)
        return
    # two subqueries: each is one b-tree descent, where MIN and MAX in one SELECT scan the whole table
    lo, hi = conn.execute(f"SELECT (SELECT MIN(rowid) FROM {table}), (SELECT MAX(rowid) FROM {table})").fetchone()
    chunk_sql = (f"SELECT COUNT(*), {', '.join(f'group_concat({e})' for e in exprs)} FROM {table} "
                 f"WHERE rowid >= ? AND rowid < ? AND {cond}")
    n = 0
    spans = [(first, first + CONCAT_ROWS) for first in range(int(lo), int(hi) + 1, CONCAT_ROWS)] \
        if lo is not None else []
    for rowids, (count, *texts) in read_ahead(conn, chunk_sql, spans, params):
        k = int(count)
        if not k:
            continue
        part = _parse_concat(texts, fields, k)
        del texts
        if part is None:  # a value that is not a plain integer: the tuple path converts it or names it
            part = fetch_columns(conn, sql.replace(" WHERE ", " WHERE rowid >= ? AND rowid < ? AND ", 1), fields,
                                 k, RowProgress(None, 0), (*rowids, *params), table=table, sources=sources,
                                 first_row=n)
        n += k
        tick.advance(k)
        yield part


def read_ahead(conn: sqlite3.Connection, sql: str, spans: Sequence[tuple[int, int]], params: Sequence[object]
               ) -> Iterator[tuple[tuple[int, int], tuple[Any, ...]]]:
    """``(span, row)``: the one result row of ``sql`` for each rowid ``span`` (its first two parameters, then
    ``params``), in order. With more than one span of a database file, the queries run one span ahead on a second
    connection in a thread: SQLite releases the GIL while it steps, so it reads the next chunk while the caller
    parses this one (two cores: about the SQL's share of the read off the wall time). The parse stays in the
    caller's thread (it holds the GIL anyway, and its warnings filter is process-wide). A query's error is raised
    here, in the caller's thread; the reader stops when the caller stops iterating."""
    path = _database_file(conn) if len(spans) > 1 else None
    if path is None:
        for span in spans:
            yield span, conn.execute(sql, (*span, *params)).fetchone()
        return
    results: queue.Queue[tuple[tuple[int, int], tuple[Any, ...]] | BaseException | None] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def hand_over(item: tuple[tuple[int, int], tuple[Any, ...]] | BaseException | None) -> bool:
        while not stop.is_set():
            try:
                results.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            other = connect(path)
            try:
                for span in spans:
                    row = other.execute(sql, (*span, *params)).fetchone()
                    if stop.is_set() or not hand_over((span, row)):
                        return
            finally:
                other.close()
            hand_over(None)
        except BaseException as exc:
            hand_over(exc)

    reader = threading.Thread(target=read, name="traceanalyzer-sqlite-read-ahead", daemon=True)
    reader.start()
    try:
        while (item := results.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join()


def _database_file(conn: sqlite3.Connection) -> Path | None:
    """The file of ``conn``'s main database; None for an in-memory one."""
    for _, name, file in conn.execute("PRAGMA database_list"):
        if name == "main" and file:
            return Path(file)
    return None


def _parse_concat(texts: Sequence[object], fields: Sequence[tuple[str, str]], count: int
                  ) -> dict[str, np.ndarray] | None:
    """Comma-separated integers of each column (``group_concat``), or None when one does not hold ``count``."""
    out = {}
    for (name, dtype), text in zip(fields, texts, strict=True):
        if not isinstance(text, str):
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                values = np.fromstring(text, dtype=np.int64, sep=",")
            except (ValueError, DeprecationWarning):
                return None
        if len(values) != count:
            return None
        out[name] = values.astype(dtype, copy=False)
    return out


def _bad_chunk(rows: list[Any], fields: Sequence[tuple[str, str]], table: str, sources: Sequence[str],
               offset: int) -> BadColumn:
    """The first value of a chunk that cannot be stored in its field's dtype, as a :class:`BadColumn`."""
    for i, (name, dtype) in enumerate(fields):
        kind = np.dtype(dtype).kind
        if kind not in "iuf":
            continue
        column = sources[i] if i < len(sources) else name
        for j, row in enumerate(rows):
            value = row[i]
            try:
                if kind == "f":
                    if value is not None and not isinstance(value, int | float):
                        raise BadColumn(table, column, f"{describe_value(value)} where a number is expected")
                else:
                    int_value(value, table, column)
            except BadColumn as exc:
                return BadColumn(table, column, f"{exc.problem} (in row {offset + j + 1:,} read)")
    return BadColumn(table, "?", "a value that does not convert to a number")


def string_values(conn: sqlite3.Connection, ids: Iterable[int]) -> dict[int, str]:
    """``StringIds.value`` for the given ids (missing ids are absent from the result); a value that is not text
    (NULL, a BLOB) raises :class:`BadColumn`."""
    wanted = [int(i) for i in ids if i >= 0]
    found: dict[int, str] = {}
    for lo in range(0, len(wanted), _IN_BATCH):
        batch = wanted[lo:lo + _IN_BATCH]
        marks = ",".join("?" * len(batch))
        found.update(conn.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", batch).fetchall())
    bad = [(sid, v) for sid, v in found.items() if not isinstance(v, str)]
    if bad:
        sid, value = bad[0]
        raise BadColumn("StringIds", "value", f"{describe_value(value)} for id {sid} where a name is expected"
                        + (f" ({len(bad):,} such ids)" if len(bad) > 1 else ""))
    return found


def intern_string_ids(conn: sqlite3.Connection, pool: StringPool, arrays: Sequence[np.ndarray],
                      transform: Callable[[str], str] | None = None,
                      has_string_table: bool = True) -> list[np.ndarray]:
    """Map StringIds ids (``-1`` = none) in several arrays to pool ids, looking each distinct id up once.

    ``transform`` rewrites each distinct string before interning (e.g. strip an API version suffix).
    Without a StringIds table every id maps to ``-1``.
    """
    if not arrays:
        return []
    arrays = [np.asarray(a, dtype=np.int64) for a in arrays]
    arrays = [np.maximum(a, -1) if len(a) and a.min() < -1 else a for a in arrays]
    highest = max((int(a.max()) for a in arrays if len(a)), default=-1)
    total = sum(len(a) for a in arrays)
    if highest < 0:
        return [np.full(len(a), -1, dtype=np.int32) for a in arrays]
    if highest > 4 * total + (1 << 20):  # sparse ids: sort-based distinct values
        joined = np.concatenate(arrays)
        uniq, inverse = np.unique(joined, return_inverse=True)
        pool_ids = _pool_ids(conn, pool, uniq, transform, has_string_table)
        bounds = np.cumsum([len(a) for a in arrays])[:-1]
        return list(np.split(pool_ids[inverse.reshape(-1)], bounds))
    # StringIds ids are dense: distinct ids and the id → pool-id map are O(n) lookup arrays, indexed by the ids
    # themselves (no shifted copy of a column): -1 lands on the last slot, kept for it
    seen = np.zeros(highest + 2, dtype=bool)
    for a in arrays:
        seen[a] = True
    uniq = np.flatnonzero(seen[:-1])
    lookup = np.full(highest + 2, -1, dtype=np.int32)
    lookup[uniq] = _pool_ids(conn, pool, uniq, transform, has_string_table)
    return [lookup[a] for a in arrays]


def _pool_ids(conn: sqlite3.Connection, pool: StringPool, uniq: np.ndarray,
              transform: Callable[[str], str] | None, has_string_table: bool) -> np.ndarray:
    """Pool id of each distinct StringIds id (``-1`` for -1 and for ids missing from StringIds)."""
    values = string_values(conn, uniq.tolist()) if has_string_table else {}
    pool_ids = np.full(len(uniq), -1, dtype=np.int32)
    for i, sid in enumerate(uniq.tolist()):
        text = values.get(sid)
        if text is not None:
            pool_ids[i] = pool.intern(transform(text) if transform else text)
    return pool_ids


def intern_texts(pool: StringPool, texts: np.ndarray) -> np.ndarray:
    """Pool ids (int32) of an object array of strings (or their bytes, decoded here), ``None`` → ``-1``; each
    distinct text decoded and interned once."""
    import pandas as pd

    if len(texts) == 0:
        return np.empty(0, dtype=np.int32)
    codes, uniques = pd.factorize(texts, use_na_sentinel=True)
    # a text column can hold BLOBs (bytes) in a damaged or hand-made export
    pool_ids = pool.intern_many([decode_text(u) if isinstance(u, bytes) else str(u) for u in uniques])
    out = np.full(len(texts), -1, dtype=np.int32)
    present = codes >= 0
    out[present] = pool_ids[codes[present]]
    return out


def distinct_pairs(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (first, second) pairs (as an (n, 2) int64 array) and each row's pair index.

    ``first`` must fit in 31 bits (pids, 24-bit) and ``second`` in 32 bits (device/domain ids): the pair is
    packed into one int64 so the distinct step is a 1-D sort, not a slow row-wise ``np.unique(axis=0)``.
    """
    key = (np.asarray(first, dtype=np.int64) << 32) | (np.asarray(second, dtype=np.int64) & 0xFFFFFFFF)
    uniq, inverse = np.unique(key, return_inverse=True)
    low = (uniq & 0xFFFFFFFF).astype(np.uint32).astype(np.int32).astype(np.int64)
    return np.stack([uniq >> 32, low], axis=1), inverse.reshape(-1)


def sorted_by_start(columns: dict[str, np.ndarray], key: str = "start_ns") -> dict[str, np.ndarray]:
    """Columns reordered by ``key`` (stable) when the file did not already store them in that order.

    When a reorder is needed the input dict is consumed (emptied) to keep only one extra column alive at a time.
    """
    start = columns[key]
    if len(start) < 2 or bool(np.all(start[1:] >= start[:-1])):
        return columns
    order = np.argsort(start, kind="stable")
    out = {}
    for key in list(columns):  # one column at a time: each unsorted column is freed before the next is copied
        out[key] = columns.pop(key)[order]
    return out
