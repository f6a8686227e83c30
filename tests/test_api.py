"""Library surface: rank assignment across files."""

from __future__ import annotations

from traceanalyzer.pipeline.loading import assign_ranks_across_files
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


def test_info_of_a_directory_of_rank_traces(capsys) -> None:  # type: ignore[no-untyped-def]
    """A TRACE may be a directory (README): info describes the rank files together and one by one."""
    import json
    from pathlib import Path

    from traceanalyzer.cli import main

    directory = Path(__file__).resolve().parents[1] / "fixtures" / "kineto" / "tp2_prefill_serial"
    assert main(["info", "--json", str(directory)]) == 0
    info = json.loads(capsys.readouterr().out)
    per_file = []
    for f in sorted(directory.glob("*.json.gz")):
        assert main(["info", "--json", str(f)]) == 0
        per_file.append(json.loads(capsys.readouterr().out))
    assert info["format"] == "kineto-json" and info["ranks"] == [0, 1]
    assert info["counts"] == {k: sum(p["counts"][k] for p in per_file) for k in info["counts"]}
    assert info["counts"]["kernels"] == 1368
    assert [f["ranks"] for f in info["files"]] == [[0], [1]]
    assert sorted((d["device"], d["rank"]) for d in info["devices"]) == [(0, 0), (1, 1)]
    assert main(["info", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "rank0.json.gz" in out and "rank1.json.gz" in out and "1,368" in out
