"""Every impact is a prediction (issue 27): the findings' predicted unprofiled step-time change against measured A/B
runs on one H200 (fixtures/truth/impacts/, made by examples/make_impact_fixtures.sh; docs/METHOD_IMPACTS.md).

Per case and capture of its variant A (Kineto and nsys): the finding the fix answers must predict the measured
change (B − A, unprofiled, same process, alternating rounds) within ±25 % and its range must hold it. Where it
does not, the case is a strict xfail with the reason measured; a later fix that makes it pass turns it red.
"""

from __future__ import annotations

import json
import warnings
from functools import cache
from pathlib import Path

import pytest

import traceanalyzer as ta
from traceanalyzer.analysis.results import Summary
from traceanalyzer.pipeline.summarize import summarize

ROOT = Path(__file__).resolve().parents[1]
TRUTH = ROOT / "fixtures" / "truth" / "impacts"
FINDING = {"graph": "host_bound_no_cuda_graphs", "norm": "norm_not_fused", "sync": "idle_gaps_host_cause"}
SYNC_KINETO_MISS = ("no CUDA call blocks during the 1 ms gap: cudaStreamSynchronize returns 9-12 µs into it, the rest "
                    "is host Python work, and idle_gaps_host_cause needs a blocking call in the gap")
#: (case, capture) → why the prediction misses, measured
MISSES = {
    ("graph_dense_b64_l8_big", "kineto"): "GPU-bound: launch idle 7 % of the step, under the finding's 30 %; graphs "
                                          "still save 0.34 ms (6 %)",
    ("graph_dense_b64_l8_big", "nsys"): "GPU-bound: launch idle 5 % of the step, under the finding's 30 %",
    ("graph_dense_b8_l8", "kineto"): "the unprofiled host ran in two speeds (rounds −3.50 … −1.21 ms); the capture "
                                     "came from the fast one (profiled 3.39 ms < unprofiled median 3.98 ms)",
    ("graph_dense_b8_l8", "nsys"): "the host's two speeds, as the Kineto capture (profiled 3.62 ms < 3.98 ms "
                                   "unprofiled); the range holds the fast rounds only",
    ("graph_dense_b8_l16", "kineto"): "Kineto's cost here, 4.67 µs per event, is the highest measured; the median "
                                      "3.5 µs leaves profiler time in the estimate (point −4.02 vs −2.87 ms, −40 %)",
    ("graph_dense_b8_l16", "nsys"): "point −3.17 vs −2.87 ms (+10 %), but the range's low end 2.8748 ms is 1 µs "
                                    "above the measured 2.8738: with all 6 captured passes as steps (5 before the "
                                    "pass grammar) the launch idle per step is 0.2 ms higher",
    ("graph_moe_b32_l4", "nsys"): "nsys's cost here, 2.13 µs per call, is a third of the median 6.66 µs: launch idle "
                                  "3.28 ms − 533 calls × 6.66 µs < 0, so the finding is silent",
    ("norm_eager_big", "kineto"): "point −0.60 vs −0.47 ms (−27 %, the range holds it): in the eager Kineto capture "
                                  "the gaps inside each chain are the profiled host's launch gaps (step 9.34 ms vs "
                                  "6.07 under nsys)",
    ("sync_eager_big", "nsys"): "point −1.01 vs −1.02 ms (+1 %), but the measured saving exceeds the gap (1.015 ms) "
                                "by 6 µs, the range's high end: the read's own latency also leaves the path",
    ("sync_eager_big", "kineto"): SYNC_KINETO_MISS, ("sync_graph_small", "kineto"): SYNC_KINETO_MISS,
}
CASES = sorted(p.stem for p in TRUTH.glob("*.json") if "nsys" not in p.name and not p.stem.startswith("profcost"))
GRAPH_CAPTURES = [(c, v) for c in CASES for v in ("a", "b")
                  if (c.startswith("graph_") and v == "b") or c in ("norm_graph_big", "sync_graph_small")]


def _capture(case: str, fmt: str, variant: str = "a") -> Path:
    if fmt == "kineto":
        return ROOT / "fixtures" / "kineto" / "impacts" / case / variant / "rank0.json.gz"
    return ROOT / "fixtures" / "nsys" / f"impact_{case}_{variant}.sqlite"


@cache
def _summary(path: Path) -> Summary:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return summarize([ta.load(path)])


def _truth(case: str) -> dict[str, object]:
    return json.loads((TRUTH / f"{case}.json").read_text())  # type: ignore[no-any-return]


def test_ten_cases_with_both_captures_and_same_process_truth() -> None:
    assert len(CASES) >= 10
    for case in CASES:
        truth = _truth(case)
        rounds = truth["change_ms_per_round"]
        assert isinstance(rounds, list) and len(rounds) >= 8
        assert all(_capture(case, fmt, v).is_file() for fmt in ("kineto", "nsys") for v in ("a", "b"))


PARAMS = [pytest.param(case, fmt, marks=pytest.mark.xfail(strict=True, reason=MISSES[(case, fmt)])
                       if (case, fmt) in MISSES else ()) for case in CASES for fmt in ("kineto", "nsys")]


@pytest.mark.parametrize(("case", "fmt"), PARAMS)
def test_prediction_within_25_percent_and_range_holds_the_measurement(case: str, fmt: str) -> None:
    truth = _truth(case)
    measured = float(truth["change_ms"]) * 1e6  # type: ignore[arg-type]
    finding = FINDING[truth["config"]["kind"]]  # type: ignore[index]
    found = [f for f in _summary(_capture(case, fmt)).findings if f.id == finding]
    assert found, f"{finding} is silent"
    ev = found[0].evidence
    predicted = ev["predicted_change_ns"]
    if finding == "host_bound_no_cuda_graphs":
        assert predicted == -found[0].impact_ns_per_step  # the impact is the predicted (de-profiled) saving
    else:
        assert -predicted <= found[0].impact_ns_per_step  # the impact: an upper bound of the predicted saving
    assert abs(predicted - measured) <= 0.25 * abs(measured)
    low, high = ev["range_ns"]
    assert low <= -measured <= high
    assert ev["confidence"] in ("high", "medium", "low") and set(ev["range_basis"]) == {"point", "low", "high"}


@pytest.mark.parametrize(("case", "variant"), GRAPH_CAPTURES)
@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_host_bound_finding_is_silent_on_cuda_graph_captures(case: str, variant: str, fmt: str) -> None:
    ids = [f.id for f in _summary(_capture(case, fmt, variant)).findings]
    assert "host_bound_no_cuda_graphs" not in ids


def test_host_bound_impact_is_the_profiled_idle_less_the_profilers_host_time() -> None:
    found = next(f for f in _summary(_capture("graph_moe_b4_l8", "nsys")).findings
                 if f.id == "host_bound_no_cuda_graphs")
    ev = found.evidence
    assert ev["profiled_launch_idle_ns"] - ev["profiler_host_ns_per_step"] == found.impact_ns_per_step
    assert ev["profiler_host_ns_per_step"] == ev["profiler_events_per_step"] * 6_660
    assert ev["profiled_launch_idle_ns"] > 2 * found.impact_ns_per_step  # the issue's +113 %: profiled ≈ 2 × saving


def test_profiler_cost_per_event_measured_beside_each_capture() -> None:
    """The truth files hold the step timed under each profiler next to the unprofiled one: on the host-bound eager
    cases the profilers slow the step (their cost), on the GPU-bound ones they add little."""
    for case in ("graph_dense_b8_l16", "graph_moe_b4_l8", "graph_moe_b32_l4"):
        truth = _truth(case)
        nsys = json.loads((TRUTH / f"{case}.nsys_cuda.json").read_text())
        assert truth["kineto_a"]["step_ms_median"] > 1.5 * truth["a_step_ms_median"]  # type: ignore[index]
        assert nsys["nsys_a_step_ms_median"] > 1.2 * truth["a_step_ms_median"]  # type: ignore[operator]
    big = _truth("graph_dense_b64_l8_big")
    assert big["kineto_a"]["step_ms_median"] < 1.1 * big["a_step_ms_median"]  # type: ignore[index,operator]
