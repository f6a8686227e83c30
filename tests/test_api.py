"""Library surface: rank assignment across files."""

from __future__ import annotations

from traceanalyzer.api import assign_ranks_across_files
from traceanalyzer.testing.synth import make_trace


def _one(rank: int, path: str):
    return make_trace([(0, 10, 0, 7, "k", "gemm")], rank=rank, path=path)


def test_colliding_single_rank_files_get_file_order_ranks():
    a, b = _one(0, "a.sqlite"), _one(0, "b.sqlite")
    out = assign_ranks_across_files([a, b])
    assert [t.ranks for t in out] == [[0], [1]]
    assert out[1].devices[0].rank == 1 and "file order" in out[1].warnings[-1]
    assert a.ranks == [0] and b.ranks == [0]  # inputs untouched


def test_distinct_ranks_are_kept():
    a, c = _one(0, "a.json"), _one(3, "c.json")
    assert [t.ranks for t in assign_ranks_across_files([a, c])] == [[0], [3]]
    unknown = [_one(-1, "x.json"), _one(-1, "y.json")]
    assert [t.ranks for t in assign_ranks_across_files(unknown)] == [[0], [1]]
