"""The normalized Trace: plain columnar data that every loader produces and every analysis reads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .schema import TABLES, empty_columns

#: A file path as the public functions take it.
PathLike = str | Path

if TYPE_CHECKING:
    import pandas as pd


class StringPool:
    """Interns strings once; tables store int32 ids into it (``-1`` = no string)."""

    __slots__ = ("_ids", "values")

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values: list[str] = []
        self._ids: dict[str, int] = {}
        for v in values:
            self.intern(v)

    def intern(self, value: str) -> int:
        """Id of ``value``, adding it if new."""
        got = self._ids.get(value)
        if got is None:
            got = len(self.values)
            self._ids[value] = got
            self.values.append(value)
        return got

    def intern_many(self, values: Iterable[str | None]) -> np.ndarray:
        """Ids (int32) of many values; ``None`` becomes ``-1``."""
        return np.fromiter(
            (-1 if v is None else self.intern(v) for v in values), dtype=np.int32
        )

    def get(self, value: str) -> int:
        """Id of ``value`` or ``-1`` when it was never interned."""
        return self._ids.get(value, -1)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Strings (object array) for an id array; ``-1`` becomes ``None``."""
        pool = np.array([*self.values, None], dtype=object)
        ids = np.asarray(ids, dtype=np.int64)
        return pool[np.where(ids < 0, len(self.values), ids)]

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> str:
        return self.values[i]


class Table:
    """A fixed set of equally long numpy columns (see ``schema.TABLES``)."""

    __slots__ = ("columns", "name")

    def __init__(self, name: str, columns: Mapping[str, np.ndarray]) -> None:
        self.name = name
        self.columns: dict[str, np.ndarray] = dict(columns)
        lengths = {len(v) for v in self.columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"table {name}: columns of different lengths {sorted(lengths)}")

    @classmethod
    def empty(cls, name: str, n: int = 0) -> Table:
        """A table of ``n`` rows with every declared column set to ``-1``."""
        return cls(name, empty_columns(name, n))

    @classmethod
    def from_columns(cls, name: str, n: int, **values: Any) -> Table:
        """Declared columns cast to their dtypes; columns not given are ``-1``; extra columns are kept."""
        cols = empty_columns(name, 0)  # the declared dtypes, in order; filled below
        for key, val in values.items():
            dtype = cols[key].dtype if key in cols else None
            arr = np.asarray(val, dtype=dtype)
            if arr.ndim == 0:
                arr = np.full(n, arr, dtype=arr.dtype)
            cols[key] = arr
        for key, col in cols.items():
            if key not in values:
                cols[key] = np.full(n, np.nan if col.dtype.kind == "f" else -1, dtype=col.dtype)
        return cls(name, cols)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as one byte buffer holding every column (a small table: ``PACK_MAX_BYTES`` at most, no object
        column): a worker's one-kernel trace has some eighty columns, and unpickling each as its own array cost the
        parent more than the trace's analysis. Larger tables pickle column by column, with no extra copy."""
        columns = self.columns
        if sum(v.nbytes for v in columns.values()) > PACK_MAX_BYTES or \
                any(v.dtype.hasobject or v.ndim != 1 for v in columns.values()):
            return Table, (self.name, columns)
        layout: list[tuple[str, str, int, int]] = []
        parts: list[bytes] = []
        offset = 0
        for key, values in columns.items():
            pad = -offset % _PACK_ALIGN  # every column starts aligned, as an array of its own would
            parts.append(bytes(pad))
            offset += pad
            layout.append((key, values.dtype.str, len(values), offset))
            data = np.ascontiguousarray(values).tobytes()
            parts.append(data)
            offset += len(data)
        return _unpacked_table, (self.name, layout, bytearray(b"".join(parts)))

    def __getitem__(self, column: str) -> np.ndarray:
        return self.columns[column]

    def __contains__(self, column: str) -> bool:
        return column in self.columns

    def take(self, index: np.ndarray) -> Table:
        """Rows selected by a boolean mask or an integer index."""
        return Table(self.name, {k: v[index] for k, v in self.columns.items()})

    def rows(self, lo: int, hi: int) -> Table:
        """Rows ``lo`` to ``hi`` (exclusive) as views of this table's columns, no copy."""
        return Table(self.name, {k: v[lo:hi] for k, v in self.columns.items()})

    def group_by_device(self) -> None:
        """Rows ordered by (rank, device, start), stable, in place: each (rank, device)'s rows consecutive and in
        start order, so a per-device analysis takes them as views (``analysis.activity.gather``). One column at a
        time: the temporary is one column, not a copy of the table."""
        if len(self) < 2:
            return
        order = np.lexsort((self.columns["start_ns"], self.columns["device"], self.columns["rank"]))
        if bool((order[1:] > order[:-1]).all()):
            return
        for key, values in list(self.columns.items()):
            if values.strides != (0,):  # a repeated constant (loaders.nsys) is in every order already
                self.columns[key] = values[order]

    def with_columns(self, **new: np.ndarray) -> Table:
        """A copy with columns added or replaced."""
        cols = dict(self.columns)
        cols.update(new)
        return Table(self.name, cols)

    def sorted_by(self, *keys: str) -> Table:
        """Rows ordered by the given columns (first key most significant), stable."""
        order = np.argsort(self.columns[keys[0]], kind="stable") if len(keys) == 1 else \
            np.lexsort([self.columns[k] for k in reversed(keys)])
        return self.take(order)

    @staticmethod
    def concat(name: str, parts: list[Table]) -> Table:
        """Rows of several tables of the same kind, one after the other."""
        if not parts:
            return Table.empty(name)
        keys = list(parts[0].columns)
        return Table(name, {k: np.concatenate([p.columns[k] for p in parts]) for k in keys})


PACK_MAX_BYTES = 1 << 20  # tables up to this size pickle as one buffer (Table.__reduce__)
_PACK_ALIGN = 16


def _unpacked_table(name: str, layout: list[tuple[str, str, int, int]], buffer: bytearray) -> Table:
    """A table from :meth:`Table.__reduce__`'s buffer: its columns are writable views of the one buffer."""
    return Table(name, {key: np.frombuffer(buffer, dtype=np.dtype(dtype), count=n, offset=offset) if n
                        else np.empty(0, dtype=np.dtype(dtype)) for key, dtype, n, offset in layout})


@dataclass(frozen=True)
class DeviceInfo:
    """A GPU seen in the trace."""

    device: int
    name: str | None = None
    rank: int | None = None
    pid: int | None = None
    sm_count: int | None = None
    compute_capability: str | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True)
class TraceHeader:
    """A trace's identity without its tables: what a summary's reduce reads of a trace (run identity, clocks,
    power alignment) where the trace itself stays on a worker."""

    path: str
    format: str
    base_time_ns: int | None = None
    world_size: int | None = None


@dataclass(frozen=True)
class RowChecks:
    """Rows of one table that cannot be true (``loaders.sanity``): ending before they start, or outside the
    capture window."""

    end_before_start: int
    beyond_capture: int


@dataclass(frozen=True)
class ApiCallsSubset:
    """An nsys export's runtime API table read in part (``loaders.nsys_api``): ``rows`` calls in the file, every
    one counted and checked in SQL; the calls a summary reads are kept, every call's start in ``api_starts``."""

    rows: int
    end_before_start: int
    beyond_capture: int


@dataclass
class Trace:
    """One trace file, normalized. Times are integer ns on the trace's own clock.

    ``base_time_ns`` converts that clock to UTC epoch ns (``utc = t + base_time_ns``) when the trace says so.
    ``capabilities`` holds what the file's format offered (tables present, clock conversion, rank source: facts
    of the file, per format); the typed fields after it are what loading and the map step did to the tables.
    """

    path: str
    format: str  # "nsys-sqlite" | "kineto-json"
    strings: StringPool
    tables: dict[str, Table]
    devices: list[DeviceInfo] = field(default_factory=list)
    tool_version: str | None = None
    schema_version: str | None = None
    base_time_ns: int | None = None
    world_size: int | None = None
    raw_counts: dict[str, int] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    api_calls_subset: ApiCallsSubset | None = None  # nsys: the API table read in part (None: read whole)
    dropped_rows: dict[str, RowChecks] = field(default_factory=dict)  # per table, rows left out (loaders.sanity)
    # the ranks whose API call starts (model.call_starts) were let go after their device's analysis, or "all"
    call_starts_released: tuple[int, ...] | Literal["all"] = ()

    def __post_init__(self) -> None:
        for name in TABLES:
            if name not in self.tables:  # an empty table only where one is missing (not built and thrown away)
                self.tables[name] = Table.empty(name)

    def header(self) -> TraceHeader:
        """The trace's identity without its tables."""
        return TraceHeader(str(self.path), self.format, self.base_time_ns, self.world_size)

    # -- convenient access -------------------------------------------------------------------
    @property
    def kernels(self) -> Table:
        return self.tables["kernels"]

    @property
    def memops(self) -> Table:
        return self.tables["memops"]

    @property
    def ranges(self) -> Table:
        return self.tables["ranges"]

    @property
    def api_calls(self) -> Table:
        return self.tables["api_calls"]

    @property
    def api_starts(self) -> Table:
        return self.tables["api_starts"]

    @property
    def gpu_metrics(self) -> Table:
        return self.tables["gpu_metrics"]

    @property
    def collectives(self) -> Table:
        return self.tables["collectives"]

    @property
    def graph_launches(self) -> Table:
        return self.tables["graph_launches"]

    @property
    def ranks(self) -> list[int]:
        """Distinct ranks that have kernels (``-1`` when the rank is unknown)."""
        return sorted(int(r) for r in np.unique(self.kernels["rank"]))

    def with_table(self, name: str, table: Table) -> Trace:
        """A copy of the trace with one table replaced (tables are shared, not copied)."""
        tables = dict(self.tables)
        tables[name] = table
        return replace(self, tables=tables)

    def names(self, ids: np.ndarray) -> np.ndarray:
        """Strings for string-pool ids (object array, ``None`` for ``-1``)."""
        return self.strings.lookup(ids)

    def df(self, table: str) -> pd.DataFrame:
        """A table as a pandas DataFrame; string-id columns become categorical string columns."""
        import pandas as pd

        from .schema import TABLES as DECL

        if table not in self.tables:
            raise KeyError(f"no table {table!r}; tables: {', '.join(self.tables)}")
        t = self.tables[table]
        declared = {c.name: c for c in DECL.get(table, [])}
        string_cols = {name for name, c in declared.items() if c.string}
        # columns added later (the classifier's bucket_id, …): string ids, int16 or int32
        string_cols |= {k for k in t.columns if k.endswith("_id") and k not in declared
                        and t[k].dtype in (np.int16, np.int32)}
        data: dict[str, Any] = {}
        categories = pd.Index(self.strings.values, dtype=object)
        for key, arr in t.columns.items():
            if key in string_cols:
                out = key[:-3] if key.endswith("_id") else key
                data[out] = pd.Categorical.from_codes(arr.astype(np.int64), categories=categories,
                                                      validate=False) if len(categories) else arr
            else:
                data[key] = arr
        return pd.DataFrame(data)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.tables.items() if len(v))
        return f"Trace({self.format}, {self.path!r}, {sizes})"
