"""A Table survives pickling: small tables travel as one buffer, large or object ones column by column."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from traceanalyzer.model.trace import PACK_MAX_BYTES, Table


def _random_table(rng: np.random.Generator, n: int) -> Table:
    dtypes = [np.int64, np.int32, np.int16, np.uint8, np.float64, np.float32, np.bool_]
    columns = {f"c{i}": (rng.random(n) * 1000).astype(dtypes[int(rng.integers(0, len(dtypes)))])
               for i in range(int(rng.integers(1, 12)))}
    if n and rng.random() < 0.3:
        columns["c0"] = np.full(n, np.nan)
    if rng.random() < 0.3:  # a repeated constant, stride 0
        columns["const"] = np.broadcast_to(np.int64(7), (n,))
    return Table("kernels", columns)


@pytest.mark.parametrize("seed", range(30))
def test_pickled_table_has_the_same_columns(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = _random_table(rng, int(rng.choice([0, 1, 3, 50])))
    back = pickle.loads(pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL))
    assert back.name == table.name and list(back.columns) == list(table.columns)
    for key, values in table.columns.items():
        got = back[key]
        assert got.dtype == values.dtype and got.shape == values.shape
        np.testing.assert_array_equal(got, values)
        assert got.flags.writeable and got.flags.aligned
    if len(back) and "c1" in back:  # columns are independent: writing one leaves the others
        before = {k: v.copy() for k, v in back.columns.items() if k != "c1"}
        back["c1"][:] = 0
        assert all(np.array_equal(back[k], v, equal_nan=True) for k, v in before.items())


def test_large_and_object_tables_pickle_column_by_column() -> None:
    big = Table("kernels", {"a": np.zeros(PACK_MAX_BYTES // 8 + 1, dtype=np.int64)})
    assert big.__reduce__()[0] is Table
    assert np.array_equal(pickle.loads(pickle.dumps(big))["a"], big["a"])
    obj = Table("kernels", {"a": np.array(["x", None], dtype=object)})
    assert pickle.loads(pickle.dumps(obj))["a"].tolist() == ["x", None]
