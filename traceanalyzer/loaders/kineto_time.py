"""Kineto µs timestamps → exact integer ns.

Kineto writes ``ts``/``dur`` as integer ns printed as µs with three decimals (``"{}.{:03}"``), relative to
``baseTimeNanoseconds`` (newer torch) or as absolute epoch µs (older torch, sometimes with ns decimals).

* **float path** (vectorized): with ``f`` the float, ``ip = floor(f)``, ``ns = ip*1000 + rint((f-ip)*1000)``.
  ``f - ip`` is exact and the float's error is at most half an ulp, below 0.5 ns while ``|f| < 2**43`` µs
  (about 102 days), so rounding recovers the written ns exactly. Integer literals are exact at any size.
* **decimal path**: a float ``≥ 2**43`` µs (absolute-epoch µs with decimals, e.g. ``1712195495519689.047``)
  cannot hold its ns digit; those values are decoded a second time as exact Decimals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np

FLOAT_EXACT_LIMIT_US = float(2**43)
INT_EXACT_LIMIT = 2**53
_ONE = Decimal(1)


@dataclass(frozen=True)
class MissingTimes:
    """Some values were absent: ``count`` of them, the first at position ``first``."""

    first: int
    count: int


def us_to_ns(values: Sequence[int | float | None]) -> np.ndarray | MissingTimes | None:
    """Exact ns (int64) from decoded µs values; ``None`` when only the decimal path is exact.

    Integer literals: ``µs * 1000``. Floats below ``2**43``: the float path. Anything else (a float at or above
    ``2**43``, an integer beyond ``2**53``) returns ``None``: decode those values as Decimals instead.
    """
    arr = np.array(values)
    if not len(values):
        return np.zeros(0, np.int64)
    if arr.dtype.kind == "i" and np.abs(arr).max() < INT_EXACT_LIMIT:
        return arr.astype(np.int64) * 1000
    if arr.dtype.kind == "O":
        missing = np.flatnonzero(np.fromiter((v is None for v in values), dtype=bool, count=len(values)))
        if len(missing):
            return MissingTimes(int(missing[0]), len(missing))
        return None  # integers too large for int64 µs → ns
    if arr.dtype.kind != "f" or np.abs(arr).max() >= FLOAT_EXACT_LIMIT_US:
        return None
    return float_us_to_ns(arr)


def float_us_to_ns(us: np.ndarray) -> np.ndarray:
    """Exact ns (int64) for µs floats below ``2**43`` with at most 3 decimals."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def decimal_us_to_ns(values: Sequence[Decimal | None]) -> np.ndarray:
    """Exact ns (int64) from Decimal µs, rounded half-even to the ns; ``None`` becomes ``-1``."""
    return np.fromiter(
        (-1 if v is None else int(v.scaleb(3).quantize(_ONE, rounding=ROUND_HALF_EVEN)) for v in values),
        dtype=np.int64, count=len(values),
    )
