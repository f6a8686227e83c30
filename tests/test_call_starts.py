"""Every API call's start in 4 bytes (traceanalyzer.model.call_starts): blocks decode to the starts they were made from,
and the counts per window equal counting the plain starts."""

from __future__ import annotations

import numpy as np
import pytest
from references import decoded

from traceanalyzer.model.call_starts import BLOCK_SPAN_NS, counts_between, start_blocks


def _encoded(start: np.ndarray, pid: np.ndarray, rank_of: dict[int, int], chunk: int
             ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Blocks and offsets of ``start``/``pid`` read in chunks of ``chunk`` rows, as the nsys loader makes them."""
    parts, offsets, n = [], [], 0
    for a in range(0, len(start), chunk):
        block, offset = start_blocks(start[a:a + chunk], pid[a:a + chunk], n)
        parts.append(block)
        offsets.append(offset)
        n += len(offset)
    blocks = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    blocks["rank"] = np.array([rank_of[p] for p in blocks["pid"].tolist()], dtype=np.int32)
    return blocks, np.concatenate(offsets)


def _random_calls(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts with gaps from 1 ns to several block spans, several processes, partly out of order."""
    gaps = rng.choice([1, 500, 70_000, BLOCK_SPAN_NS - 1, BLOCK_SPAN_NS, 3 * BLOCK_SPAN_NS], size=n,
                      p=[0.2, 0.5, 0.27, 0.01, 0.01, 0.01])
    start = 10**12 + np.cumsum(gaps)
    shuffled = rng.random(n) < 0.1
    start[shuffled] = rng.permutation(start[shuffled])
    return start.astype(np.int64), rng.integers(100, 104, size=n).astype(np.int64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("chunk", [7, 1000, 100_000])
def test_blocks_decode_and_count_as_the_plain_starts(seed: int, chunk: int) -> None:
    rng = np.random.default_rng(seed)
    start, pid = _random_calls(rng, 5000)
    rank_of = {100: 0, 101: 1, 102: -1, 103: -1}  # two processes of unknown rank share rank -1
    blocks, offsets = _encoded(start, pid, rank_of, chunk)
    assert offsets.dtype == np.int32 and len(offsets) == len(start) and (offsets >= 0).all()
    assert np.array_equal(np.sort(decoded(blocks, offsets)), np.sort(start))
    lo = np.sort(rng.choice(np.r_[start, start + 1, start - 1, rng.integers(start.min() - 10, start.max() + 10, 200)],
                            size=300))
    hi = lo + rng.choice([0, 1, 1000, BLOCK_SPAN_NS, 5 * BLOCK_SPAN_NS], size=len(lo))
    for rank in (0, 1, -1, 7):
        mine = np.sort(start[np.isin(pid, [p for p, r in rank_of.items() if r == rank])])
        assert np.array_equal(np.sort(decoded(blocks, offsets, rank)), mine)
        plain = np.searchsorted(mine, hi) - np.searchsorted(mine, lo)
        assert np.array_equal(counts_between(blocks, offsets, rank, lo, hi), plain)


def test_no_calls_and_no_windows() -> None:
    blocks, offsets = start_blocks(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), 0)
    blocks["rank"] = np.empty(0, dtype=np.int32)
    assert len(offsets) == 0 and len(decoded(blocks, offsets)) == 0
    assert counts_between(blocks, offsets, 0, np.array([1]), np.array([5])).tolist() == [0]
    full, off = _encoded(np.array([5, 9], dtype=np.int64), np.array([1, 1], dtype=np.int64), {1: 0}, 10)
    assert counts_between(full, off, 0, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)).tolist() == []
