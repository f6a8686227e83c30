"""Findings on real traces: each rule fires where the workload has the problem and stays quiet where it does not.

Real H200 TP=2 runs (../shared/data/h200, skipped when absent) and the project's own fixtures. Truth files
(step times measured without the profiler, with and without all-reduces) are read here only, to check the
impacts the rules compute from the traces.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import statistics
from pathlib import Path

import pytest

from traceanalyzer.analysis.summary import SummaryOptions
from traceanalyzer.findings import FindingThresholds, run_findings
from traceanalyzer.pipeline.loading import load_many
from traceanalyzer.pipeline.summarize import summarize

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

MS = 1_000_000
_CACHE: dict[str, object] = {}


def _summary(paths: list[Path], **options):
    key = json.dumps([str(p) for p in paths] + sorted(f"{k}={v}" for k, v in options.items()))
    if key not in _CACHE:
        _CACHE[key] = summarize(load_many(paths), SummaryOptions(**options))
    return _CACHE[key]


def _kineto(shared: Path, run: str, **options):
    k = shared / "h200" / "kineto"
    return _summary([k / f"{run}_rank0.json.gz", k / f"{run}_rank1.json.gz"], **options)


def _found(summary, rule_id: str):
    return next((f for f in summary.findings if f.id == rule_id), None)


def _truth_cost_ms(files_with: list[Path], files_without: list[Path]) -> float:
    """Median step with communication − without, averaged over the ranks (ms)."""
    def med(p: Path) -> float:
        return statistics.median(json.loads(p.read_text())["step_ms"])
    return statistics.mean(med(a) - med(b) for a, b in zip(files_with, files_without, strict=True))


@pytest.fixture(scope="session")
def power_log(shared_data: Path) -> Path:
    return shared_data / "h200" / "gpu" / "power_log.csv"


# --- comm_serialized_with_compute -------------------------------------------------------------------------------

def test_serial_prefill_is_serialized_with_impact_close_to_measured(shared_data: Path):
    k = shared_data / "h200" / "kineto"
    truth = _truth_cost_ms([k / f"prefill_serial_rank{r}.truth.json" for r in (0, 1)],
                           [k / f"truth_prefill_nocomm_rank{r}.json" for r in (0, 1)])
    for summary in (_kineto(shared_data, "prefill_serial"),
                    _summary([shared_data / "h200" / "nsys" / "tp2_prefill_serial.sqlite"])):
        found = _found(summary, "comm_serialized_with_compute")
        assert found is not None
        assert abs(found.impact_ns_per_step / MS - truth) < 0.5, (found.impact_ns_per_step, truth)
        assert found.evidence["collectives_per_step"]["allreduce"] in (16, 17)  # 8 layers × 2 (+1 outside layers)
        assert "all-reduces per step (ncclDevKernel_AllReduce" in found.title and "compute stream" in found.title


def test_overlapped_prefill_is_not_serialized(shared_data: Path):
    assert _found(_kineto(shared_data, "prefill_overlap"), "comm_serialized_with_compute") is None
    nsys = _summary([shared_data / "h200" / "nsys" / "tp2_prefill_overlap.sqlite"])
    assert _found(nsys, "comm_serialized_with_compute") is None


def test_fixture_serial_prefill_matches_its_truth_and_overlap_does_not_fire(tmp_path: Path):
    truth = _truth_cost_ms([FIXTURES / "truth" / f"prefill_serial_rank{r}.json" for r in (0, 1)],
                           [FIXTURES / "truth" / f"prefill_serial_nocomm_rank{r}.json" for r in (0, 1)])
    serial = _summary([FIXTURES / "nsys" / "tp2_prefill_serial.sqlite"], step_range="step")
    found = _found(serial, "comm_serialized_with_compute")
    assert found is not None and abs(found.impact_ns_per_step / MS - truth) < 0.6
    assert found.evidence["collectives_per_step"] == {"allreduce": 8}  # 4 layers × 2, warm-up excluded
    default = _found(_summary([FIXTURES / "nsys" / "tp2_prefill_serial.sqlite"]), "comm_serialized_with_compute")
    assert default is not None and default.evidence["collectives_per_step"] == {"allreduce": 8}  # steps found alone
    unpacked = tmp_path / "tp2_prefill_overlap.sqlite"
    with lzma.open(FIXTURES / "nsys" / "tp2_prefill_overlap.sqlite.xz") as src, unpacked.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    overlap = summarize(load_many([unpacked]), SummaryOptions(step_range="step"))
    assert _found(overlap, "comm_serialized_with_compute") is None


def test_fixture_kineto_runs_match_their_truth():
    truth = _truth_cost_ms([FIXTURES / "truth" / f"prefill_serial_rank{r}.json" for r in (0, 1)],
                           [FIXTURES / "truth" / f"prefill_serial_nocomm_rank{r}.json" for r in (0, 1)])
    serial = _found(_summary([FIXTURES / "kineto" / "tp2_prefill_serial"]), "comm_serialized_with_compute")
    assert serial is not None and abs(serial.impact_ns_per_step / MS - truth) < 0.6
    assert _found(_summary([FIXTURES / "kineto" / "tp2_prefill_overlap"]), "comm_serialized_with_compute") is None
    eager = _summary([FIXTURES / "kineto" / "tp2_decode_eager"])
    host = _found(eager, "host_bound_no_cuda_graphs")
    # host-bound as profiled; the impact is the de-profiled saving (issue 27), smaller
    assert host is not None and host.evidence["idle_pct_of_step"] > 30
    assert 0 < host.impact_ns_per_step < host.evidence["profiled_launch_idle_ns"]


def test_public_before_after_pair_reports_sendrecv_on_compute_stream(shared_data: Path):
    for name in ("before", "after"):
        summary = _summary([shared_data / "nsys-public" / f"nsysai_mfu_2xh100_{name}_2026.2.1.sqlite"])
        found = _found(summary, "comm_serialized_with_compute")
        # NCCL SendRecv kernels (the classifier's context pass may label them all-to-all from the issuing op)
        assert found is not None and "ncclDevKernel_SendRecv" in found.title
        # the 300 ms windows show no step boundary (docs/STRUCTURE.md; the repeating unit is a layer): the one
        # window-long step holds every SendRecv of the device the finding names
        device = next(d for d in summary.devices if d.rank == found.evidence["rank"])
        sendrecv = device.top_kernels[device.top_kernels["name"].str.contains("SendRecv")]["count"].sum()
        assert found.evidence["steps"] == 1 and sum(found.evidence["collectives_per_step"].values()) == sendrecv
        assert all("SendRecv" in n for n in found.evidence["kernels"])


# --- comm_compute_contention -------------------------------------------------------------------------------------

def test_overlapped_runs_report_contention_and_serial_runs_do_not(shared_data: Path):
    for summary in (_kineto(shared_data, "prefill_overlap"), _summary([FIXTURES / "kineto" / "tp2_prefill_overlap"])):
        found = _found(summary, "comm_compute_contention")
        assert found is not None and found.evidence["overlap_pct"] >= 50
        assert 0.5 * MS < found.impact_ns_per_step < 3 * MS
    assert _found(_kineto(shared_data, "prefill_serial"), "comm_compute_contention") is None


# --- exposed_communication, straggler_wait -----------------------------------------------------------------------

def test_exposed_communication_in_serial_prefill_with_per_rank_wait(shared_data: Path):
    found = _found(_kineto(shared_data, "prefill_serial"), "exposed_communication")
    assert found is not None and found.impact_pct_of_step > 5
    waits = found.evidence["cross_rank_wait_by_rank"]
    assert set(waits) == {"0", "1"} and all(w["wait_ns_per_step"] >= 0 for w in waits.values())
    assert _found(_kineto(shared_data, "decode_serial_graphs"), "exposed_communication") is None  # 2% of a step


def test_straggler_in_eager_decode_but_not_in_serial_prefill(shared_data: Path):
    found = _found(_kineto(shared_data, "decode_serial"), "straggler_wait")
    assert found is not None
    assert found.evidence["waiting_rank"] != found.evidence["waited_for_rank"]
    assert f"Rank {found.evidence['waiting_rank']} idles" in found.title
    assert found.impact_ns_per_step <= found.evidence["wait_by_rank"][str(found.evidence["waiting_rank"])][
        "wait_ns_per_step"]
    assert _found(_kineto(shared_data, "prefill_serial"), "straggler_wait") is None


# --- host_bound_no_cuda_graphs -----------------------------------------------------------------------------------

def test_eager_decode_is_host_bound_and_graphs_decode_is_not(shared_data: Path):
    found = _found(_kineto(shared_data, "decode_serial"), "host_bound_no_cuda_graphs")
    assert found is not None and found.evidence["idle_pct_of_step"] > 30  # the impact: de-profiled (issue 27)
    assert found.evidence["graph_launched_fraction"] < 0.5
    assert _found(_kineto(shared_data, "decode_serial_graphs"), "host_bound_no_cuda_graphs") is None


# --- collective_host_cost ----------------------------------------------------------------------------------------

def test_collective_host_cost_in_eager_decode_only(shared_data: Path):
    found = _found(_kineto(shared_data, "decode_serial"), "collective_host_cost")
    assert found is not None and found.evidence["collectives_per_step"] == {"allreduce": 32}
    ev = found.evidence
    # NCCL's issue (~75 µs per call) inside the whole c10d call (~0.12 ms), both per step on the limiting rank
    assert ev["host_nccl_issue_ns_per_step"] < ev["host_call_ns_per_step"] < 2 * ev["host_nccl_issue_ns_per_step"]
    assert found.impact_ns_per_step == ev["host_issue_critical_ns"] <= (ev["host_call_ns_per_step"]
                                                                        + ev["host_slowed_after_calls_ns_per_step"])
    assert ev["host_slowed_after_calls_ns_per_step"] > 0
    assert ev["issue_only_saving_ns"] < found.impact_ns_per_step
    for run in ("prefill_serial", "decode_serial_graphs"):  # GPU-bound: nothing to say
        assert _found(_kineto(shared_data, run), "collective_host_cost") is None, run
    # the overlapped prefill's straggler, rank 1, is partly host-bound (GPU idle 30%, 97 host syncs): its host cost
    overlap = _found(_kineto(shared_data, "prefill_overlap"), "collective_host_cost")
    assert overlap is not None and overlap.evidence["rank"] == 1 and overlap.evidence["what_if_basis"] == "mixed"


def test_fixture_eager_decode_reports_the_host_cost_of_its_allreduces():
    summary = _summary([FIXTURES / "kineto" / "ab" / "tp2_decode_eager_c"])
    found = _found(summary, "collective_host_cost")
    assert found is not None and found.evidence["collectives_per_step"] == {"allreduce": 8}
    # the user's allreduce range (~0.14 ms per call) wraps c10d and NCCL's issue (~70 µs); measured 1.18 ms/step
    assert 0.9 * MS < found.evidence["host_call_ns_per_step"] < 1.4 * MS
    assert 0.9 * MS < found.impact_ns_per_step < 1.4 * MS
    assert 0.4 * MS < found.evidence["host_nccl_issue_ns_per_step"] < 0.7 * MS
    assert _found(_summary([FIXTURES / "kineto" / "tp2_prefill_serial"]), "collective_host_cost") is None


# --- collectives_without_kernels ---------------------------------------------------------------------------------

def test_single_gpu_allreduce_calls_without_kernels():
    """World size 1: 32 all-reduce calls a step launch nothing, yet the step is 4.01 ms/step slower with them."""
    summary = _summary([FIXTURES / "kineto" / "ab" / "tp1_decode_hostsync_d"])
    found = _found(summary, "collectives_without_kernels")
    assert found is not None and found.evidence["collectives_per_step"] == {"allreduce": 32}
    assert found.evidence["names"] == {"allreduce": 96}  # the user's range around each call, 3 steps
    assert 3.5 * MS < found.impact_ns_per_step < 5.0 * MS  # measured 4.01 ms/step (same-process rounds)
    assert _found(summary, "collective_host_cost") is None  # not reported twice


def test_no_calls_without_kernels_where_collectives_launch_kernels(shared_data: Path, tmp_path: Path):
    for run in ("decode_serial", "prefill_overlap"):  # prefill_overlap: record_param_comms of work.wait()
        assert _found(_kineto(shared_data, run), "collectives_without_kernels") is None, run
    # nsys: NCCL's communicator init / destroy ranges are not collective calls
    assert _found(_summary([FIXTURES / "nsys" / "tp2_prefill_serial.sqlite"]), "collectives_without_kernels") is None
    assert _found(_summary([FIXTURES / "kineto" / "tp2_decode_graphs"]), "collectives_without_kernels") is None


def test_fixture_graphs_decode_is_not_host_bound():
    summary = _summary([FIXTURES / "kineto" / "tp2_decode_graphs"])
    assert _found(summary, "host_bound_no_cuda_graphs") is None
    exposed = _found(summary, "exposed_communication")  # truth: comm costs ~0.17 ms/step
    assert exposed is not None and exposed.impact_ns_per_step < 0.3 * MS


# --- allreduce_not_fused -----------------------------------------------------------------------------------------

def test_unfused_allreduce_norm_in_serial_prefill_not_in_overlap(shared_data: Path):
    found = _found(_kineto(shared_data, "prefill_serial"), "allreduce_not_fused")
    assert found is not None and found.evidence["allreduces_followed_per_step"] == 16
    assert found.evidence["median_chain_kernels"] == 2  # residual add + fused layer-norm kernel
    assert any("layer_norm" in name for name in found.evidence["following_kernels"])
    assert _found(_kineto(shared_data, "prefill_overlap"), "allreduce_not_fused") is None


def test_unfused_decomposed_rmsnorm_in_fixture_prefill():
    found = _found(_summary([FIXTURES / "nsys" / "tp2_prefill_serial.sqlite"], step_range="step"),
                   "allreduce_not_fused")
    assert found is not None and found.evidence["allreduces_followed_per_step"] == 8
    assert found.evidence["median_chain_kernels"] > 4  # add, pow, mean, add, rsqrt, mul… as separate kernels


# --- low_comm_bandwidth, nccl_small_messages --------------------------------------------------------------------

def test_low_bandwidth_without_p2p_not_with_nvlink(shared_data: Path):
    found = _found(_kineto(shared_data, "nop2p_prefill_serial"), "low_comm_bandwidth")
    assert found is not None and found.evidence["median_busbw_gbps"] < 0.25 * 450
    k = shared_data / "h200" / "kineto"
    truth = _truth_cost_ms([k / f"nop2p_prefill_serial_rank{r}.truth.json" for r in (0, 1)],
                           [k / f"truth_nop2p_prefill_nocomm_rank{r}.json" for r in (0, 1)])
    assert found.impact_ns_per_step / MS < truth  # the share above peak-bandwidth time of the whole comm cost
    assert _found(_kineto(shared_data, "prefill_serial"), "low_comm_bandwidth") is None


def test_small_nccl_messages_on_nvlink_are_already_near_one_shot(shared_data: Path):
    summary = _kineto(shared_data, "decode_serial")
    sizes = summary.devices[0].collectives["bytes"]
    assert ((sizes > 0) & (sizes <= 1 << 20)).sum() >= 32  # the rule has its input: 512 KiB all-reduces
    assert _found(summary, "nccl_small_messages") is None  # ~9 µs each: no gain from a one-shot kernel


# --- idle_gaps_host_cause ----------------------------------------------------------------------------------------

def test_warm_up_gaps_of_a_whole_run_export_are_not_counted(shared_data: Path):
    summary = _summary([shared_data / "h200" / "nsys" / "tp2_prefill_serial.sqlite"])
    assert _found(summary, "idle_gaps_host_cause") is None  # cudaMalloc gaps of NCCL init/warm-up: outside steps
    host = run_findings(load_many([shared_data / "h200" / "nsys" / "tp2_prefill_serial.sqlite"]), summary,
                        SummaryOptions())
    assert [f.id for f in host] == [f.id for f in summary.findings]


def test_host_sync_gaps_in_a_public_capture(shared_data: Path):
    """A real Windows test app that synchronizes between kernel batches (no steps: the whole span is one)."""
    summary = _summary([shared_data / "nsys-public" / "extrap_concurrent_gtx1060_2022.1.1.sqlite"])
    found = _found(summary, "idle_gaps_host_cause")
    assert found is not None and found.evidence["gaps"] >= 1
    assert set(found.evidence["host_calls"]) <= {"cudaStreamSynchronize", "cudaEventSynchronize",
                                                  "cudaDeviceSynchronize"}
    assert found.impact_ns_per_step == found.evidence["gap_ns_total"]  # one step


def test_micro_benchmark_with_few_kernels_is_not_called_host_bound(shared_data: Path):
    summary = _summary([shared_data / "nsys-public" / "flameox_graphtrace_rtx3060_2025.5.2.sqlite"])
    assert _found(summary, "host_bound_no_cuda_graphs") is None  # 3 kernels: nothing to capture in a graph


# --- gpu_power_underuse ------------------------------------------------------------------------------------------

def test_power_underuse_with_the_power_log(shared_data: Path, power_log: Path):
    found = _found(_kineto(shared_data, "prefill_serial", gpu_log=power_log), "gpu_power_underuse")
    assert found is not None and found.impact_ns_per_step is None
    assert all(g["power_mean_pct_of_limit"] < 50 for g in found.evidence["gpus"])
    nop2p = _kineto(shared_data, "nop2p_prefill_serial",
                    gpu_log=shared_data / "h200" / "gpu" / "power_log_nop2p_runs.csv")
    assert _found(nop2p, "gpu_power_underuse").evidence["gpus"][0]["samples"] > 10


def test_no_power_finding_when_the_log_shows_high_draw(shared_data: Path, tmp_path: Path, power_log: Path):
    """No real run drew ≥ 50% of the limit, so the log here is synthetic (600 W) over the real trace's window."""
    summary = _kineto(shared_data, "prefill_serial", gpu_log=power_log)
    window = summary.power["gpus"][0]["window_utc_ns"]
    import pandas as pd
    stamps = pd.to_datetime(range(window[0] - 200 * MS, window[1] + 200 * MS, 50 * MS), unit="ns")
    rows = [f"{t:%Y/%m/%d %H:%M:%S.%f}"[:-3] + f", {gpu}, 600.00 W, 700.00 W" for t in stamps for gpu in (0, 1)]
    log = tmp_path / "high_power.csv"
    log.write_text("timestamp, index, power.draw [W], power.limit [W]\n" + "\n".join(rows) + "\n")
    high = summarize(load_many([shared_data / "h200" / "kineto" / f"prefill_serial_rank{r}.json.gz"
                                for r in (0, 1)]), SummaryOptions(gpu_log=log))
    assert high.power["matched"] and _found(high, "gpu_power_underuse") is None


# --- low_tensor_activity (GPU_METRICS) ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def gpumetrics_summary(shared_data: Path, tmp_path_factory: pytest.TempPathFactory):
    src = shared_data / "h200" / "nsys" / "tp2_decode_eager_gpumetrics.sqlite.xz"
    dst = tmp_path_factory.mktemp("gpumetrics") / "tp2_decode_eager_gpumetrics.sqlite"
    with lzma.open(src) as fin, dst.open("wb") as fout:
        shutil.copyfileobj(fin, fout)
    traces = load_many([dst])
    return traces, summarize(traces)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("TRACEANALYZER_SLOW"),
                    reason="unpacks and loads a 225 MB capture (~50 s): set TRACEANALYZER_SLOW=1")
def test_low_tensor_activity_in_eager_decode(gpumetrics_summary):
    traces, summary = gpumetrics_summary
    found = _found(summary, "low_tensor_activity")
    assert found is not None and found.evidence["tensor_active_mean_pct"] < 50
    assert found.evidence["samples"] > 100
    # Same capture, threshold below the measured value: the rule must stay quiet (no real capture of a
    # compute-bound run with GPU metrics exists here).
    strict = run_findings(traces, summary, _Options(FindingThresholds(tensor_active_min_pct=20.0)))
    assert "low_tensor_activity" not in [f.id for f in strict]
    assert _found(summary, "host_bound_no_cuda_graphs") is not None


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("TRACEANALYZER_SLOW"),
                    reason="unpacks and loads a 225 MB capture (~50 s): set TRACEANALYZER_SLOW=1")
def test_nsys_eager_decode_what_if_against_the_measured_no_comm_step(gpumetrics_summary, shared_data: Path):
    """The nsys capture of the shared eager decode (nsys adds little to this host: 23.2 ms profiled steps): its
    profiled step minus the estimate lands on the measured step without all-reduces (19.20 ms, the Kineto twin's
    timed run). Against that twin's measured cost (2.08 ms/step) the estimate is +94% and NCCL's issue alone +18%:
    docs/METHOD_WHAT_IF.md on why that measured cost is below the calls' own host time."""
    kineto = shared_data / "h200" / "kineto"
    without = max(json.loads((kineto / f"truth_decode_nocomm_rank{r}.json").read_text())["step_ms_median"]
                  for r in (0, 1))
    s = gpumetrics_summary[1]
    w = s.what_if
    assert w.basis == "host_launch"
    step = max(d.step_ns_median for d in s.devices) / 1e6
    assert abs((step - w.comm_free_step_saving_ns / 1e6) / without - 1) <= 0.03, (step, w.comm_free_step_saving_ns)
    assert w.to_json()["issue_only_saving_ns"] < w.comm_free_step_saving_ns


class _Options:
    def __init__(self, thresholds: FindingThresholds) -> None:
        self.thresholds = thresholds
