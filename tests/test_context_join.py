"""The context pass joins kernels to their launching API rows a chunk of API rows at a time
(classify.context.launch_rows): the same rows as a stable sort of every API row's key."""

from __future__ import annotations

import numpy as np
import pytest

from traceanalyzer.classify.context import launch_rows


def _plain(api_pid: np.ndarray, api_corr: np.ndarray, pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """The definition: the first API row, in table order, of the same process and correlation id."""
    key_api = api_pid.astype(np.int64) << 32 | (api_corr & 0xFFFFFFFF)
    order = np.argsort(key_api, kind="stable")
    key = pid.astype(np.int64) << 32 | (corr & 0xFFFFFFFF)
    pos = np.clip(np.searchsorted(key_api[order], key), 0, max(len(order) - 1, 0))
    row = order[pos] if len(order) else np.zeros(len(key), dtype=np.int64)
    return np.where(len(order) and (key_api[row] == key), row, -1) if len(order) else np.full(len(key), -1)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("chunk", [1, 13, 1 << 20])
def test_launch_rows_are_the_first_matching_api_rows(seed: int, chunk: int) -> None:
    rng = np.random.default_rng(seed)
    n_api = 2000
    api_pid = rng.choice([7, 9, 11], size=n_api).astype(np.int64)
    api_corr = rng.integers(-1, 400, size=n_api)  # repeated ids within and across processes, and -1
    pid = rng.choice([7, 9, 12], size=700).astype(np.int64)
    corr = rng.integers(-1, 450, size=700)
    got = launch_rows(api_pid, api_corr, pid, corr, chunk=chunk)
    assert np.array_equal(got, _plain(api_pid, api_corr, pid, corr))
    assert (got >= 0).sum() > 100 and (got < 0).sum() > 10


def test_no_api_rows_or_no_kernels() -> None:
    empty = np.empty(0, dtype=np.int64)
    assert launch_rows(empty, empty, np.array([1]), np.array([5])).tolist() == [-1]
    assert launch_rows(np.array([1]), np.array([5]), empty, empty).tolist() == []
