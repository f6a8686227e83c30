"""``analysis.frames.frame`` builds the DataFrame ``pd.DataFrame`` builds: values, dtypes, index and columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from traceanalyzer.analysis.numeric.frames import array_of, empty_frame, frame


def _random_columns(rng: np.random.Generator) -> dict[str, Any]:
    n = int(rng.choice([0, 1, 2, 7]))
    makers = [
        lambda: rng.integers(-5, 10**12, n),
        lambda: rng.integers(0, 100, n).astype(np.int32),
        lambda: rng.random(n),
        lambda: rng.random(n) > 0.5,
        lambda: np.array(rng.choice(["allreduce", "x", ""], n), dtype=object),
        lambda: np.array([None if rng.random() < 0.3 else "k" for _ in range(n)], dtype=object),
        lambda: np.array([1 if rng.random() < 0.5 else "a" for _ in range(n)], dtype=object),
        lambda: rng.choice(["a", "bb"], n),  # numpy unicode
        lambda: np.full(n, "", dtype=object),
        lambda: "source",  # scalars are broadcast
        lambda: int(rng.integers(0, 9)),
        lambda: None,
        lambda: [int(x) for x in rng.integers(0, 5, n)],  # not an array: the constructor itself
    ]
    return {f"c{i}": makers[int(rng.integers(0, len(makers)))]() for i in range(int(rng.integers(1, 12)))}


@pytest.mark.parametrize("seed", range(60))
def test_frame_is_the_constructor(seed: int) -> None:
    rng = np.random.default_rng(seed)
    columns = _random_columns(rng)
    n = next((len(v) for v in columns.values() if isinstance(v, np.ndarray)), 3)
    index = pd.Index(rng.integers(0, 50, n), dtype=np.int64, name="step") if rng.random() < 0.3 else None
    if index is None and not any(isinstance(v, np.ndarray) for v in columns.values()):
        index = pd.RangeIndex(n)
    names = list(columns)[::-1] if rng.random() < 0.5 else None
    expected = pd.DataFrame(columns, index=index, columns=names)
    got = frame(columns, names, index)
    pd.testing.assert_frame_equal(got, expected, check_index_type=True, check_column_type=True)
    assert got.dtypes.tolist() == expected.dtypes.tolist()
    for v in columns.values():  # copies: changing an input changes no frame
        if isinstance(v, np.ndarray) and len(v) and v.dtype.kind in "if":
            v[0] = 3
    pd.testing.assert_frame_equal(got, expected, check_index_type=True, check_column_type=True)


def test_frames_share_no_column_index() -> None:
    first, second = frame({"a": np.arange(2)}), frame({"a": np.arange(3)})
    first.columns.name = "renamed"
    assert second.columns.name is None


def test_empty_frame_is_the_constructor_with_names_only() -> None:
    names = ["bucket", "count", "total_ns"]
    pd.testing.assert_frame_equal(empty_frame(names), pd.DataFrame(columns=names), check_index_type=True,
                                  check_column_type=True)


@pytest.mark.parametrize("seed", range(30))
def test_array_of_is_to_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    columns = {k: v for k, v in _random_columns(rng).items() if isinstance(v, np.ndarray)} or {"a": np.arange(3)}
    table = pd.DataFrame(columns)
    for name in table.columns:
        got, expected = array_of(table, name), table[name].to_numpy()
        assert got.dtype == expected.dtype
        assert pd.Series(got, dtype=object).equals(pd.Series(expected, dtype=object))
        if got.dtype.kind in "biuf":  # a view of the frame's block: never writable
            assert not got.flags.writeable
