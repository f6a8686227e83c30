"""Sorted group-by in numpy: runs of equal keys with their values in order, and per-run quantiles."""

from __future__ import annotations

import numpy as np

_VALUE_BITS = 40  # values below 2**40 (durations under 18 min) share an int64 sort key with their group


def sorted_runs(group: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A sorted group-by: the distinct ``group`` keys (sorted) with each one's first row, ``values`` sorted by group
    then value, and where each group's run starts in them. One sort of ``group << 40 | value`` where both fit,
    else a lexsort. Both arrays integer, not empty."""
    lo = int(group.min())
    span = int(group.max()) - lo + 1
    if int(values.min()) < 0 or int(values.max()) >= 1 << _VALUE_BITS or span >= 1 << (63 - _VALUE_BITS):
        ids, first_row, which = np.unique(group, return_index=True, return_inverse=True)
        order = np.lexsort((values, which.ravel()))
        first = np.flatnonzero(np.r_[True, which.ravel()[order][1:] != which.ravel()[order][:-1]])
        return ids, first_row, values[order], first
    code = group.astype(np.int64) - lo
    key = np.sort((code << _VALUE_BITS) | values.astype(np.int64))
    run_code = key >> _VALUE_BITS
    first = np.flatnonzero(np.r_[True, run_code[1:] != run_code[:-1]])
    first_of = np.full(span, len(code), dtype=np.int64)
    np.minimum.at(first_of, code, np.arange(len(code), dtype=np.int64))
    key &= (1 << _VALUE_BITS) - 1
    return (run_code[first] + lo).astype(group.dtype), first_of[run_code[first]], key, first


def dense_codes(values: np.ndarray) -> np.ndarray:
    """Each value's index among the distinct values, sorted (``np.unique(values, return_inverse=True)[1]``): a
    binary search in the few distinct values (threads, steps) instead of a sort of them all."""
    return np.searchsorted(distinct(values), values)


_CHUNK = 1 << 16  # values hashed at a time by :func:`distinct`: its hash table stays ~2 MB


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-d numeric array: one look when all are equal (a device's process, a rank),
    else hashed (pandas) a chunk at a time — a hash table per chunk, not ~35 bytes per value — and only the
    distinct values of the chunks sorted."""
    import pandas as pd  # here: the interval algebra using this stays importable without pandas

    if len(values) == 0 or bool((values == values[0]).all()):
        return np.unique(values[:1])
    parts = [np.asarray(pd.unique(values[at:at + _CHUNK])) for at in range(0, len(values), _CHUNK)]
    return np.unique(np.concatenate(parts))


def run_quantile(values: np.ndarray, first: np.ndarray, q: float) -> np.ndarray:
    """Quantile ``q`` of each run ``values[first[i]:first[i + 1]]`` (each run sorted), interpolated linearly as
    pandas' group-by quantile does: ``v[i] + (v[i + 1] - v[i]) * frac``."""
    size = np.diff(np.r_[first, len(values)])
    pos = q * (size - 1).astype(np.float64)
    below = first + pos.astype(np.int64)
    frac = pos % 1
    above = np.minimum(below + 1, len(values) - 1)
    low = values[below]
    return np.where(frac == 0.0, low.astype(np.float64), low + (values[above] - low) * frac)
