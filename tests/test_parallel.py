"""``--jobs N``: rank files loaded in worker processes give the same Traces, in order; errors name the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from traceanalyzer.model.errors import BadInputError, UnknownFormatError
from traceanalyzer.model.trace import Trace
from traceanalyzer.pipeline.loading import load_many
from traceanalyzer.pipeline.workers import map_files


def _rank_file(folder: Path, rank: int, kernels: int) -> Path:
    """A small Kineto trace: ``kernels`` launches (one NCCL every third) under two ProfilerSteps."""
    events: list[dict[str, object]] = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
         "ts": 1000 + s * 500, "dur": 500, "args": {"External id": s}} for s in range(2)
    ]
    for i in range(kernels):
        ts = 1010 + i * 40
        name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" if i % 3 == 2 else f"gemm_kernel_{i % 2}"
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": ts, "dur": 5, "args": {"correlation": 100 + i, "External id": 10 + i}})
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts + 8,
                       "dur": 20 + rank, "args": {"correlation": 100 + i, "External id": 10 + i, "device": 0,
                                                  "stream": 7 + (i % 3 == 2), "grid": [4, 1, 1],
                                                  "block": [128, 1, 1]}})
    path = folder / f"rank{rank}.json"
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2},
                                "traceEvents": events}))
    return path


@pytest.fixture
def rank_files(tmp_path: Path) -> list[Path]:
    return [_rank_file(tmp_path, 0, 12), _rank_file(tmp_path, 1, 18)]


def _same(a: Trace, b: Trace) -> bool:
    ta, tb = a.kernels, b.kernels
    return a.path == b.path and set(ta.columns) == set(tb.columns) and all(
        np.array_equal(ta[c], tb[c]) for c in ta.columns) and a.strings.values == b.strings.values


def test_workers_give_the_same_traces_in_order(rank_files: list[Path]) -> None:
    serial = load_many(rank_files, classify=False, jobs=1)
    parallel = map_files(rank_files, classify=False, jobs=2)
    assert [len(t.kernels) for t in parallel] == [12, 18]
    assert [t.ranks for t in parallel] == [[0], [1]]
    assert all(_same(a, b) for a, b in zip(serial, parallel, strict=True))
    # the library entry point routes jobs > 1 here; the order of the files given is kept
    reversed_ = load_many(rank_files[::-1], classify=False, jobs=2)
    assert [Path(t.path).name for t in reversed_] == ["rank1.json", "rank0.json"]


def test_progress_counts_files(rank_files: list[Path]) -> None:
    seen: list[tuple[int, int]] = []
    map_files(rank_files, classify=False, jobs=2, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (2, 2)


def test_bad_file_raises_in_parent_naming_it(rank_files: list[Path], tmp_path: Path) -> None:
    broken = tmp_path / "rank2.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel"')  # truncated
    with pytest.raises(BadInputError) as info:
        map_files([*rank_files, broken], classify=False, jobs=2)
    assert "rank2.json" in str(info.value)
    assert info.value.path is not None and Path(info.value.path).name == "rank2.json"


def test_not_a_trace_keeps_its_error_class(rank_files: list[Path], tmp_path: Path) -> None:
    junk = tmp_path / "notes.json"
    junk.write_text("[1, 2, 3]")
    with pytest.raises(UnknownFormatError, match=r"notes\.json"):
        map_files([rank_files[0], junk], classify=False, jobs=2)


def test_empty_list() -> None:
    assert map_files([], classify=False, jobs=4) == []


def test_workers_classify_like_the_parent(rank_files: list[Path]) -> None:
    serial = load_many(rank_files, jobs=1)
    parallel = load_many(rank_files, jobs=2)
    assert "bucket_id" in parallel[0].kernels
    for a, b in zip(serial, parallel, strict=True):
        assert list(a.names(a.kernels["bucket_id"])) == list(b.names(b.kernels["bucket_id"]))
    assert "communication" in set(parallel[1].names(parallel[1].kernels["bucket_id"]))


def test_on_loaded_sees_every_returned_trace_once(rank_files: list[Path]) -> None:
    seen: list[Trace] = []
    parallel = load_many(rank_files, jobs=2, on_loaded=seen.append)
    assert sorted(map(id, seen)) == sorted(map(id, parallel))


def test_summary_analysing_while_loading_matches_one_process(rank_files: list[Path], tmp_path: Path) -> None:
    """With workers, each trace is analysed as it arrives; the summary is the one of a single process — also when
    loading replaces a trace afterwards (colliding ranks renumbered: that trace is analysed again)."""
    from traceanalyzer.pipeline.summarize import summarize_paths

    def as_json(paths: list[Path], jobs: int) -> str:
        return json.dumps(summarize_paths(paths, jobs=jobs).to_json(), sort_keys=True)

    assert as_json(rank_files, 2) == as_json(rank_files, 1)
    unstated = []  # no rank in the file or its name: both ranks unknown, the loader assigns them in file order
    for f, name in zip(rank_files, ("a.json", "b.json"), strict=True):
        doc = json.loads(f.read_text())
        del doc["distributedInfo"]
        unstated.append(tmp_path / name)
        unstated[-1].write_text(json.dumps(doc))
    assert sorted(d.rank for d in summarize_paths(unstated, jobs=2).devices) == [0, 1]
    assert as_json(unstated, 2) == as_json(unstated, 1)
