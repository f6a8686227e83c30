"""``summary``: the JSON contract (pinned keys, exact ns on a hand-built Kineto trace) and the done-when checks of
the communication analysis on the real 2×H200 traces."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from traceanalyzer.cli import main
from traceanalyzer.testing.synth import make_trace

TOP_KEYS = {"schema_version", "traces", "devices", "cross_rank", "what_if", "findings", "warnings"}
DEVICE_KEYS = {"rank", "device", "name", "span_ns", "busy_ns", "idle_ns", "bucket_ns", "comm_ns", "comm_hidden_ns",
               "comm_exposed_ns", "overlap_pct", "steps", "step_ns_median", "comm_exposed_per_step_ns",
               "bucket_exclusive_ns", "step_source", "layer_source", "comm_streams", "compute_streams",
               "comm_serialized_with_compute", "exclusive_precedence"}
CROSS_KEYS = {"collectives_matched", "wait_ns_by_rank", "transfer_ns_per_step", "straggler_rank"}
FINDING_KEYS = {"id", "title", "impact_ns_per_step", "evidence"}


def _kernel(name: str, ts: int, dur: int, stream: int, corr: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, "grid": [1, 1, 1], "block": [128, 1, 1]}}


def _launch(ts: int, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 1,
            "args": {"correlation": corr}}


def tiny_kineto(path: Path) -> Path:
    """One step: GEMM [1000,1100) µs and all-reduce [1100,1150) on stream 7, GEMM [1120,1140) on stream 20.
    comm 50 µs, hidden 20 µs (by the stream-20 GEMM), exposed 30 µs, busy = span = 150 µs."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 990, "dur": 200,
         "args": {}},
        _launch(995, 1), _launch(996, 2), _launch(997, 3),
        _kernel("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", 1000, 100, 7, 1),
        _kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1100, 50, 7, 2),
        _kernel("ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_tn", 1120, 20, 20, 3),
    ]
    doc = {"schemaVersion": 1, "traceEvents": events, "baseTimeNanoseconds": 0,
           "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": 132, "computeMajor": 9,
                                 "computeMinor": 0}],
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}}
    path.write_text(json.dumps(doc))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["summary", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_summary_json_contract_and_exact_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("traceanalyzer.loaders.kineto")
    out = run_json(capsys, str(tiny_kineto(tmp_path / "rank0.json")))
    assert set(out) >= TOP_KEYS
    assert set(out["what_if"]) >= {"comm_free_step_saving_ns", "basis"}
    assert out["what_if"]["basis"] in ("gpu_transfer", "host_launch", "mixed")
    assert all(set(f) >= FINDING_KEYS for f in out["findings"])
    assert out["cross_rank"] is None or set(out["cross_rank"]) >= CROSS_KEYS
    (dev,) = out["devices"]
    assert set(dev) >= DEVICE_KEYS
    expected = {"rank": 0, "device": 0, "span_ns": 150_000, "busy_ns": 150_000, "idle_ns": 0,
                "comm_ns": 50_000, "comm_hidden_ns": 20_000, "comm_exposed_ns": 30_000, "overlap_pct": 40.0,
                "steps": 1, "step_ns_median": 150_000, "comm_exposed_per_step_ns": 30_000,
                "step_source": "profiler_step", "comm_streams": [7], "compute_streams": [7, 20],
                "comm_serialized_with_compute": True}
    assert {k: dev[k] for k in expected} == expected
    assert dev["bucket_ns"] == {"communication": 50_000, "gemm": 120_000}
    assert sum(dev["bucket_exclusive_ns"].values()) == dev["busy_ns"]
    # DeviceSummary.figures: typed, at the end of the device's entry in this order
    assert list(dev)[-7:] == ["exclusive_precedence", "comm_on_compute_stream_pct", "kernels", "memops", "window_ns",
                              "layers", "warnings"]
    assert (dev["kernels"], dev["memops"], dev["layers"], dev["warnings"]) == (3, 0, 0, [])
    assert dev["comm_on_compute_stream_pct"] == 100.0 and dev["exclusive_precedence"][-1] == "communication"
    lo, hi = dev["window_ns"]
    assert hi - lo == 150_000


GEMM = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def tiny_nsys(path: Path) -> Path:
    """One process, GPU 0. Launches (host ns 100..150) inside NVTX ``iter`` [50,200), ``layer_0`` [95,115) and
    ``layer_1`` [115,145). GPU: GEMM [1000,2000) s7, all-reduce [2000,2600) s7, GEMM [2600,3600) s7,
    all-reduce [3600,4000) s20 beside GEMM [3700,3900) s7, peer copy [4000,4100) s20.
    comm = 600 + 500 = 1100, hidden 200, exposed 900; layer_0 exposes 600, layer_1 200 (of 400)."""
    from traceanalyzer.testing.synth_nsys import write_nsys_export

    launch = "cudaLaunchKernel_v7000"
    return write_nsys_export(
        path, kernels=[(1000, 2000, 0, 7, GEMM, 100, 1), (2000, 2600, 0, 7, ALLREDUCE, 100, 2),
                       (2600, 3600, 0, 7, GEMM, 100, 3), (3600, 4000, 0, 20, ALLREDUCE, 100, 4),
                       (3700, 3900, 0, 7, GEMM, 100, 5)],
        memcpy=[(4000, 4100, 0, 20, 10, 1 << 20, 100, 0, 1)],
        runtime=[(100, 105, launch, 1), (110, 115, launch, 2), (120, 125, launch, 3), (130, 135, launch, 4),
                 (140, 145, launch, 5), (150, 155, "cudaMemcpyAsync_v3020", 5000)],
        nvtx=[(50, 200, "iter"), (95, 115, "layer_0"), (115, 145, "layer_1")])


def test_summary_nsys_step_range_and_layers_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("traceanalyzer.testing.synth_nsys")
    out = run_json(capsys, str(tiny_nsys(tmp_path / "run.sqlite")), "--step-range", "iter")
    (dev,) = out["devices"]
    expected = {"span_ns": 3100, "busy_ns": 3100, "idle_ns": 0, "comm_ns": 1100, "comm_hidden_ns": 200,
                "comm_exposed_ns": 900, "steps": 1, "step_ns_median": 3100, "comm_exposed_per_step_ns": 900,
                "step_source": "nvtx:iter", "layer_source": "nvtx:layer ranges", "comm_streams": [7, 20],
                "compute_streams": [7], "bucket_ns": {"communication": 1100, "gemm": 2200}}
    assert {k: dev[k] for k in expected} == expected
    assert dev["overlap_pct"] == pytest.approx(100 * 200 / 1100)

    import traceanalyzer as ta

    d = ta.summary(str(tmp_path / "run.sqlite"), step_range="iter").devices[0]
    layers = d.per_layer[["name", "start_ns", "end_ns", "comm_ns", "comm_exposed_ns", "compute_ns"]]
    assert layers.values.tolist() == [["layer_0", 1000, 2600, 600, 600, 1000],
                                      ["layer_1", 2600, 4000, 400, 200, 1200]]
    c = d.collectives
    assert c["kind"].tolist() == ["allreduce", "allreduce", "p2p_copy"]
    assert c["layer"].tolist() == [0, 1, -1] and c["exposed_ns"].tolist() == [600, 200, 100]
    assert c["bytes"].tolist()[2] == 1 << 20


def test_trace_without_kernels_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("traceanalyzer.loaders.kineto")
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}))
    assert main(["summary", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: {path}") and "no kernel activity" in err[0]


def test_library_summary_on_synthetic_traces() -> None:
    import traceanalyzer as ta

    ranks = [make_trace(kernels=[(0, 100, r, 7, "gemm", "gemm"), (100, 150 + 10 * r, r, 7, "ncclAllReduce",
                                                                 "communication", "allreduce")], rank=r,
                        path=f"rank{r}.json") for r in (0, 1)]
    s = ta.summary(ranks)
    assert [(d.rank, d.device, d.comm_exposed_ns) for d in s.devices] == [(0, 0, 50), (1, 1, 60)]
    assert [t.ranks for t in s.traces] == [[0], [1]]
    json.dumps(s.to_json(), allow_nan=False)


# ---- real 2×H200 traces (skipped without ../shared) ---------------------------------------------------------

def _kineto(shared: Path, name: str) -> list[str]:
    return [str(shared / "h200" / "kineto" / f"{name}_rank{r}.json.gz") for r in (0, 1)]


@pytest.mark.parametrize("name", ["prefill_serial", "decode_serial"])
def test_real_serial_runs_have_no_overlap(shared_data: Path, name: str) -> None:
    import traceanalyzer as ta

    s = ta.summary(_kineto(shared_data, name))
    assert len(s.devices) == 2
    for d in s.devices:
        assert d.comm_ns > 0 and d.comm_hidden_ns == 0 and d.overlap_pct == 0.0
        assert d.comm_serialized_with_compute and d.comm_streams == d.compute_streams
        assert d.step_source == "profiler_step" and d.steps == 3
        assert d.layer_source == "collective_period"
        assert set(d.per_layer.groupby("step").size()) == {8 if name.startswith("prefill") else 16}


def test_real_overlap_run_hides_comm_on_its_own_stream(shared_data: Path) -> None:
    import traceanalyzer as ta

    s = ta.summary(_kineto(shared_data, "prefill_overlap"))
    for d in s.devices:
        assert d.comm_hidden_ns > 0 and d.overlap_pct > 20
        assert not d.comm_serialized_with_compute
        assert not set(d.comm_streams) & set(d.compute_streams)
        c = d.collectives
        assert (c["kind"] == "allreduce").all() and (c["hidden_ns"] + c["exposed_ns"] == c["duration_ns"]).all()
        assert d.comm_idle_gaps_ns["duration_ns"].sum() == d.comm_exposed_ns


def test_real_gpu_step_annotation_matches_projection(shared_data: Path) -> None:
    """Kineto's own GPU ProfilerStep windows equal our projection of the CPU steps through correlation ids."""
    import traceanalyzer as ta
    from traceanalyzer.analysis.activity import gather
    from traceanalyzer.analysis.structure.steps import _projected, ranges_named, step_windows

    trace = ta.load(_kineto(shared_data, "prefill_overlap")[0])
    act = gather(trace, 0, 0)
    gpu = step_windows(act)
    cpu = ranges_named(act, pattern=re.compile(r"ProfilerStep#\d+"))
    projected = _projected(act, cpu[cpu["device"] < 0], "profiler_step", None)
    assert projected is not None
    assert len(gpu) == len(projected) == 3
    # equal up to Kineto's µs-float timestamps (1 ns of rounding)
    assert np.abs(gpu["start_ns"].to_numpy() - projected["start_ns"].to_numpy()).max() <= 1
    assert np.abs(gpu["end_ns"].to_numpy() - projected["end_ns"].to_numpy()).max() <= 1


@pytest.mark.parametrize("name,hidden", [("tp2_prefill_serial", False), ("tp2_prefill_overlap", True)])
def test_real_nsys_layers_line_up_with_nvtx(shared_data: Path, name: str, hidden: bool) -> None:
    import traceanalyzer as ta

    trace = ta.load(shared_data / "h200" / "nsys" / f"{name}.sqlite")
    s = ta.summary([trace])
    ranges = trace.ranges
    names = trace.names(ranges["name_id"]).astype(str)
    for d in s.devices:
        pid = int(np.unique(trace.kernels["pid"][trace.kernels["device"] == d.device])[0])
        mine = (ranges["pid"] == pid) & np.char.startswith(names, "layer_")
        assert d.layer_source.startswith("nvtx:")
        assert len(d.per_layer) == int(mine.sum())  # one row per layer_N range of the rank
        assert sorted(set(d.per_layer["name"])) == sorted(set(names[mine]))
        assert (d.comm_hidden_ns > 0) == hidden
        assert d.step_source == "nvtx:layer_cycle" and d.steps == 12  # 13 passes, the first one warm-up
        pl = d.per_layer[d.per_layer["step"] >= 0]
        assert (pl["comm_exposed_ns"] <= pl["comm_ns"]).all() and (pl["comm_ns"] > 0).all()


def test_real_nsys_export_without_kernels_exits_2(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_data / "h200" / "nsys" / "tp2_decode_graphs.sqlite"
    assert main(["summary", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: {path}: ") and "no kernel activity" in err[0]


def test_real_gpu_log_is_aligned_through_the_trace_clock(shared_data: Path) -> None:
    import traceanalyzer as ta

    s = ta.summary(_kineto(shared_data, "nop2p_prefill_serial")[:1],
                   gpu_log=shared_data / "h200" / "gpu" / "power_log_nop2p_runs.csv")
    assert s.power is not None and s.power["matched"]
    (gpu,) = s.power["gpus"]
    assert gpu["gpu"] == 0 and gpu["samples"] >= 10 and 0 < gpu["power_mean_w"] <= gpu["power_limit_w"]


def test_bad_layer_pattern_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "never_read.json"
    path.write_text("{}")
    assert main(["summary", "--layer-pattern", "layer_(", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: --layer-pattern 'layer_(' is not a valid regular expression")


def test_step_range_matching_nothing_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    import traceanalyzer as ta
    from traceanalyzer.model.errors import BadInputError

    t = make_trace(kernels=[(0, 10, 0, 7, "gemm", "gemm")], path="r0.json")
    with pytest.raises(BadInputError, match="--step-range 'train_step' matches no range in the trace — it has no "):
        ta.summary([t], step_range="train_step")
    kineto = Path(__file__).resolve().parents[1] / "fixtures" / "kineto" / "tp2_prefill_serial"
    assert main(["summary", "--step-range", "train_step", str(kineto)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: {kineto / 'rank0.json.gz'}: --step-range 'train_step' "
                                                "matches no range in the trace — ranges it has: ")
    assert "layer_N (4 names)" in err[0] and "ProfilerStep#N (3 names)" in err[0] and "attention" in err[0]


def test_step_range_on_another_device_falls_back_with_a_warning() -> None:
    """The range exists but launched nothing on this GPU: the steps come from elsewhere, with a warning."""
    import traceanalyzer as ta

    t = make_trace(kernels=[(0, 10, 0, 7, "gemm", "gemm")], path="r0.json", ranges=[(100, 200, "nvtx", "train_step")])
    s = ta.summary([t], step_range="train_step")
    assert s.devices[0].step_source == "none"
    assert s.warnings == ["r0.json: rank 0 GPU 0: no range named 'train_step' launched GPU work; steps from none "
                          "instead"]


def test_unclassified_traces_are_classified_first(tmp_path: Path) -> None:
    pytest.importorskip("traceanalyzer.loaders.kineto")
    import traceanalyzer as ta

    trace = ta.load(tiny_kineto(tmp_path / "rank0.json"), classify=False)
    assert "bucket_id" not in trace.kernels
    d = ta.summary(trace).devices[0]
    assert (d.comm_ns, d.comm_hidden_ns, d.comm_exposed_ns) == (50_000, 20_000, 30_000)
