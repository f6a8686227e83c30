"""Small DataFrames built cheaply: :func:`frame` is ``pd.DataFrame(columns_dict, index=…)`` without the
constructor's per-column checks, for the ten or so small tables each (rank, device) holds.

``pd.DataFrame`` of a dict costs 100–250 µs however few its rows (column-by-column inference, block forming, the
column index built from a list); at 10,000 one-kernel rank files that was about a fifth of the driver's time.
:func:`frame` stacks the numeric numpy columns into one block per dtype, passes every other column through the
constructor's own per-column conversion (``sanitize_array``: strings become pandas' string dtype, scalars are
broadcast, exactly as the constructor does), reuses one column index per tuple of names, and assembles the frame
from those blocks (``pandas.api.internals.create_dataframe_from_blocks``, pandas ≥ 3). Where pandas lacks either
function, or a column is neither a 1-D numpy array nor a scalar (a list, a Series, a 2-D array), or a datetime
array, it is ``pd.DataFrame`` itself.
``tests/test_frames.py`` checks the result equals the constructor's (values, dtypes, index, columns).

:func:`array_of` reads one column as an array without building a Series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

try:  # pandas ≥ 3.0 (the assembly) and the constructor's per-column conversion
    from pandas.api.internals import create_dataframe_from_blocks as _from_blocks
    from pandas.core.construction import sanitize_array as _sanitize
except ImportError:  # pragma: no cover - older pandas: the plain constructor
    _from_blocks = None
    _sanitize = None

_NUMERIC = frozenset("biuf")


@lru_cache(maxsize=512)
def _cached_index(names: tuple[str, ...]) -> pd.Index:
    return pd.Index(list(names))


def _column_index(names: tuple[str, ...]) -> pd.Index:
    """The column index of ``names``: a view of one cached index (building it from the list costs ~80 µs), so a
    frame that renames its columns' axis changes no other."""
    return _cached_index(names).view()


def frame(columns: Mapping[str, Any], names: Sequence[str] | None = None, index: pd.Index | None = None
          ) -> pd.DataFrame:
    """``pd.DataFrame(columns, index=index, columns=names)``, cheaper for small tables: ``columns`` maps each name
    to a 1-D numpy array or a scalar (``names``, when given, names the same columns in the frame's order); the
    result holds copies, as the constructor's does."""
    keys = tuple(columns) if names is None else tuple(names)
    if _from_blocks is None or _sanitize is None or (names is not None and set(keys) != set(columns)) \
            or len(keys) == 0:
        return pd.DataFrame(dict(columns), index=index, columns=None if names is None else list(names))
    values = [columns[k] for k in keys]
    arrays = [v for v in values if isinstance(v, np.ndarray)]
    if any(a.ndim != 1 for a in arrays) or \
            any(not isinstance(v, np.ndarray) and not (v is None or np.isscalar(v)) for v in values):
        return pd.DataFrame(dict(columns), index=index, columns=list(keys))
    n = len(arrays[0]) if arrays else (len(index) if index is not None else None)
    if n is None or any(len(a) != n for a in arrays) or (index is not None and len(index) != n):
        return pd.DataFrame(dict(columns), index=index, columns=list(keys))
    rows = pd.RangeIndex(n) if index is None else index
    by_dtype: dict[np.dtype[Any], list[int]] = {}
    blocks: list[tuple[Any, np.ndarray]] = []
    converted: list[Any] = list(values)
    for i, v in enumerate(values):
        if not (isinstance(v, np.ndarray) and v.dtype.kind in _NUMERIC):
            v = converted[i] = _sanitize(v, rows, copy=True)
        if isinstance(v, np.ndarray):
            if v.dtype.kind not in _NUMERIC and v.dtype != object:
                return pd.DataFrame(dict(columns), index=index, columns=list(keys))  # datetimes, bytes…
            by_dtype.setdefault(v.dtype, []).append(i)
        else:  # an extension array (pandas' string dtype): a block of its own
            blocks.append((v, np.array([i], dtype=np.intp)))
    for at in by_dtype.values():
        stacked = np.empty((len(at), n), dtype=converted[at[0]].dtype)
        for row, i in enumerate(at):
            stacked[row] = converted[i]
        blocks.append((stacked, np.asarray(at, dtype=np.intp)))
    return _from_blocks(blocks, rows, _column_index(keys))


def empty_frame(names: Sequence[str]) -> pd.DataFrame:
    """``pd.DataFrame(columns=names)``: no rows, every column of object dtype."""
    if _from_blocks is None or len(names) == 0:
        return pd.DataFrame(columns=list(names))
    return _from_blocks([(np.empty((len(names), 0), dtype=object), np.arange(len(names), dtype=np.intp))],
                        pd.RangeIndex(0), _column_index(tuple(names)))


def array_of(table: pd.DataFrame, name: str, dtype: Any = None) -> np.ndarray:
    """``table[name].to_numpy(dtype)`` without building the Series (a fifth of the cost, for the many
    single-column reads of small per-rank tables); read-only where it is the frame's own data, as pandas' view is.
    Where the column is not one numpy array (an extension dtype, a repeated name), ``to_numpy`` itself."""
    if isinstance(table, pd.DataFrame):
        loc = table.columns.get_loc(name)
        column = table._mgr.iget_values(loc) if isinstance(loc, int) and hasattr(table._mgr, "iget_values") \
            else None
        if isinstance(column, np.ndarray):
            view = column.view()
            view.flags.writeable = False
            return view if dtype is None else np.asarray(view, dtype=dtype)
    return table[name].to_numpy(dtype)
