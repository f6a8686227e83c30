"""HTA-compatible mode: HolisticTraceAnalysis 0.5.0's numbers, reproduced (reference: tests/data/hta_reference.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from traceanalyzer.analysis.hta_compat import hta_compat_traces, hta_merge, hta_overlap, hta_us
from traceanalyzer.cli import main
from traceanalyzer.pipeline.summarize import hta_compat
from traceanalyzer.testing.synth import make_trace

REFERENCE = json.loads((Path(__file__).parent / "data" / "hta_reference.json").read_text())
COMPARABLE = sorted(set(REFERENCE["sets"]) - set(REFERENCE["known_divergence"]))


@pytest.mark.parametrize("name", COMPARABLE)
def test_matches_hta_on_its_test_traces(shared_data: Path, name: str) -> None:
    ref = REFERENCE["sets"][name]
    root = shared_data / "hta" / "tests" / "data"
    got = hta_compat([root / f for f in ref["files"]]).to_json()["ranks"]
    assert [r["rank"] for r in got] == [r["rank"] for r in ref["ranks"]]
    for ours, theirs in zip(got, ref["ranks"], strict=True):
        for key in ("kernel_us", "idle_us", "compute_us", "non_compute_us"):
            assert ours[key] == pytest.approx(theirs[key], rel=0.005, abs=1), (name, key)
        if theirs["overlap_pct"] is None:
            assert ours["overlap_pct"] is None
        else:
            assert ours["overlap_pct"] == pytest.approx(theirs["overlap_pct"], abs=0.05), name
        assert ours["idle_pct"] == pytest.approx(theirs["idle_pct"], abs=0.05)


def test_trace_filter_numbers_of_the_issue_exactly(shared_data: Path) -> None:
    got = hta_compat([shared_data / "hta" / "tests" / "data" / "trace_filter"]).to_json()["ranks"]
    assert [(r["idle_us"], r["compute_us"], r["overlap_pct"]) for r in got] == [
        (321378, 106252, 11.81), (328671, 135548, 20.05)]
    assert all(r["last_step_dropped"] == "ProfilerStep#552" for r in got)


def test_cli_json_and_table(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(shared_data / "hta" / "tests" / "data" / "trace_filter")
    assert main(["summary", "--hta-compat", "--json", folder]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {"rank", "kernel_us", "idle_us", "compute_us", "non_compute_us", "overlap_pct"} <= set(
        payload["ranks"][0])
    assert main(["summary", "--hta-compat", folder]) == 0
    out = capsys.readouterr().out
    assert "321,378" in out and "20.05" in out


def test_nsys_export_is_bad_input(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export = shared_data / "h200" / "nsys" / "tp2_prefill_serial.sqlite"
    assert main(["summary", "--hta-compat", str(export)]) == 2
    err = capsys.readouterr().err
    assert "tp2_prefill_serial.sqlite" in err and "Kineto" in err


def test_missing_file_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", "--hta-compat", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err


# -- HTA's arithmetic, by hand ------------------------------------------------------------------------------
def test_ns_rounded_inward_like_hta() -> None:
    # [1.2, 1.7) µs → ceil 2, floor 1: HTA keeps the negative length; whole µs are unchanged
    start, end = hta_us(np.array([1200, 5000]), np.array([1700, 9000]))
    assert start.tolist() == [2, 5] and end.tolist() == [1, 9]
    # epoch µs with ns decimals: float64 holds 1/4 µs there, so ts + dur = ...777.95 becomes ...778.0 in HTA
    t0 = 1_712_195_495_505_772_800
    start, end = hta_us(np.array([t0]), np.array([t0 + 5150]))
    assert start.tolist() == [1_712_195_495_505_773] and end.tolist() == [1_712_195_495_505_778]


def test_merge_joins_touching_and_keeps_negative_groups() -> None:
    s, e = hta_merge(np.array([10, 0, 5, 30]), np.array([12, 5, 8, 29]))
    assert s.tolist() == [0, 10, 30] and e.tolist() == [8, 12, 29]
    assert int((e - s).sum()) == 9  # the inverted [30, 29) counts -1, as in HTA


def test_overlap_is_time_with_comm_and_compute_both_running() -> None:
    comm = (np.array([0, 20]), np.array([10, 30]))
    comp = (np.array([5, 25]), np.array([22, 40]))
    assert hta_overlap(comm, comp) == 5 + 2 + 5


# -- HTA's conventions on a synthetic rank ------------------------------------------------------------------
def _two_step_rank(rank: int = 0, steps: tuple[str, ...] = ("ProfilerStep#1", "ProfilerStep#2")):
    us = 1000
    return make_trace(
        kernels=[
            (0 * us, 10 * us, 0, 7, "gemm_kernel", "gemm", None, 1),
            (5 * us, 15 * us, 0, 9, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication", None, 2),
            (20 * us, 30 * us, 0, 7, "Memcpy DtoD (Device -> Device)", "memory", None, 3),
            (40 * us, 50 * us, 0, 7, "gemm_kernel", "gemm", None, 4),  # launched in the last step: dropped
        ],
        ranges=[(0, 35 * us, "profiler_step", steps[0]), (35 * us, 60 * us, "profiler_step", steps[-1])],
        api_calls=[(0, us, 1), (1 * us, 2 * us, 2), (3 * us, 4 * us, 3), (36 * us, 37 * us, 4)],
        rank=rank, path=f"rank{rank}.json",
    )


def test_last_step_dropped_and_kernel_types() -> None:
    result = hta_compat_traces([_two_step_rank()])
    (r,) = result.ranks
    assert result.last_step_filter and r.last_step == "ProfilerStep#2"
    assert (r.gpu_events, r.gpu_events_dropped) == (3, 1)
    assert (r.kernel_us, r.idle_us, r.compute_us, r.comm_us) == (30, 5, 10, 10)
    assert r.non_compute_us == 15  # comm 5..15 outside compute (5) + memcpy 20..30 (10)
    assert r.overlap_pct == 50.0
    assert r.to_json()["idle_pct"] == round(100 * 5 / 30, 2)


def test_single_step_name_disables_filtering() -> None:
    result = hta_compat_traces([_two_step_rank(steps=("ProfilerStep#7",))])
    assert not result.last_step_filter and result.notes
    assert result.ranks[0].gpu_events_dropped == 0 and result.ranks[0].kernel_us == 50


def test_ranks_sorted_and_no_comm_gives_no_overlap() -> None:
    no_comm = make_trace(kernels=[(0, 4000, 0, 7, "gemm_kernel", "gemm")], rank=1, path="r1.json")
    result = hta_compat_traces([no_comm, _two_step_rank(rank=0)])
    assert [r.rank for r in result.ranks] == [0, 1]
    # rank 1 has no ProfilerStep while the set has two names: HTA keeps nothing there
    assert result.ranks[1].kernel_us is None and result.ranks[1].overlap_pct is None
    alone = hta_compat_traces([no_comm]).ranks[0]
    assert alone.overlap_pct is None and alone.compute_us == 4


def test_jobs_gives_the_same_numbers(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(shared_data / "hta" / "tests" / "data" / "trace_filter")
    assert main(["summary", "--hta-compat", "--json", folder]) == 0
    serial = json.loads(capsys.readouterr().out)
    assert main(["summary", "--hta-compat", "--json", "--jobs", "2", folder]) == 0
    assert json.loads(capsys.readouterr().out) == serial
