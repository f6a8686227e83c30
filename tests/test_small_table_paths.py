"""The numpy group-bys that replaced pandas on small per-rank tables give the pandas definitions' results."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from traceanalyzer.analysis.cross_rank import _first_of_each_key, _ordinals
from traceanalyzer.analysis.grouped import run_quantile
from traceanalyzer.analysis.what_if.comm_free import OWN_TRANSFER_Q, _first_match, _issue_capped, _own_transfer

SEEDS = range(20)


def _random_rows(rng: np.random.Generator) -> pd.DataFrame:
    n = int(rng.integers(0, 30))
    return pd.DataFrame({"kind": rng.choice(["allreduce", "allgather", "sendrecv"], n),
                         "bytes": rng.choice([8, 4096, 1 << 40], n), "name": rng.choice(["a", "b"], n),
                         "step": rng.integers(-1, 3, n), "start_ns": rng.integers(0, 20, n),
                         "duration_ns": rng.integers(1, 10**int(rng.integers(1, 13)), n)})


@pytest.mark.parametrize("seed", SEEDS)
def test_run_quantile_is_pandas_groupby_quantile(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    group, values = rng.integers(0, 6, n), rng.integers(0, 10**int(rng.integers(1, 15)), n)
    order = np.lexsort((values, group))
    first = np.flatnonzero(np.r_[True, group[order][1:] != group[order][:-1]])
    for q in (0.1, 0.5, 0.99):
        expected = pd.Series(values).groupby(group).quantile(q).to_numpy()
        assert np.array_equal(run_quantile(values[order], first, q), expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_ordinals_and_first_rows_are_the_pandas_ones(seed: int) -> None:
    frame = _random_rows(np.random.default_rng(seed))
    for by in (["kind"], ["kind", "step"]):
        plain = frame.sort_values("start_ns", kind="stable").groupby(by, sort=False).cumcount()
        assert np.array_equal(_ordinals(frame, by), plain.reindex(frame.index).to_numpy(np.int64))
        columns = {k: frame[k].to_numpy() for k in frame.columns}
        first = pd.DataFrame(_first_of_each_key(columns, by))
        expected = frame.drop_duplicates(subset=by).reset_index(drop=True)
        pd.testing.assert_frame_equal(first, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_first_match_is_a_left_merge_keeping_the_first_duplicate(seed: int) -> None:
    rng = np.random.default_rng(seed)
    left = pd.DataFrame({"a": rng.integers(0, 4, 25), "b": rng.integers(0, 3, 25)})
    m = int(rng.integers(0, 15))
    right = pd.DataFrame({"a": rng.integers(0, 4, m), "b": rng.integers(0, 3, m), "row": np.arange(m)})
    merged = left.merge(right.drop_duplicates(["a", "b"]), on=["a", "b"], how="left")
    expected = merged["row"].fillna(-1).to_numpy(np.int64)
    found = _first_match((left["a"].to_numpy(), left["b"].to_numpy()), (right["a"].to_numpy(), right["b"].to_numpy()))
    assert np.array_equal(found, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_issue_cap_and_own_transfer_are_the_groupby_definitions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = _random_rows(rng)
    issue = rng.integers(0, 10**6, len(rows))
    counted = rng.random(len(rows)) < 0.7
    usual = pd.Series(np.where(counted, issue, np.nan)).groupby(rows["kind"].to_numpy()).transform("median")
    expected = np.minimum(issue, usual.fillna(np.inf).to_numpy() * 4).astype(np.int64)
    assert np.array_equal(_issue_capped(issue, counted, rows["kind"].to_numpy()), expected)
    if len(rows):
        dur = rows["duration_ns"].astype(np.int64)
        fast = dur.groupby([rows[k].astype(str) for k in ("kind", "bytes", "name")]).transform(
            lambda d: d.quantile(OWN_TRANSFER_Q))
        assert np.array_equal(_own_transfer(rows), np.minimum(fast.to_numpy(), dur.to_numpy()).astype(np.int64))
