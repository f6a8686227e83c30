"""Per-device analysis on hand-built traces with hand-computed answers (ns)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceanalyzer.analysis.activity import gather
from traceanalyzer.analysis.device import analyze_device
from traceanalyzer.analysis.structure.steps import detect_steps, step_windows
from traceanalyzer.analysis.summary import SummaryOptions
from traceanalyzer.testing.synth import make_trace

AR = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication", "allreduce")


def basic_trace():
    # stream 7: gemm [0,10) then all-reduce [10,20); stream 9: attention [15,30), all-reduce [40,50)
    # memops: HtoD [50,55) (memory), PtoP [60,70) (communication)
    return make_trace(
        kernels=[(0, 10, 0, 7, "gemm_a", "gemm"), (10, 20, 0, 7, *AR), (15, 30, 0, 9, "attn", "attention"),
                 (40, 50, 0, 9, *AR)],
        memops=[(50, 55, 0, 7, "HtoD"), (60, 70, 0, 7, "PtoP")])


def test_device_totals_are_exact():
    d = analyze_device(basic_trace(), 0, 0)
    assert (d.span_ns, d.busy_ns, d.idle_ns) == (70, 55, 15)
    assert d.bucket_ns == {"attention": 15, "communication": 30, "gemm": 10, "memory": 5}
    assert (d.comm_ns, d.comm_hidden_ns, d.comm_exposed_ns) == (30, 5, 25)
    assert d.overlap_pct == pytest.approx(100 * 5 / 30)
    assert sum(d.bucket_exclusive_ns.values()) == d.busy_ns
    assert d.figures.exclusive_precedence.index("gemm") < d.figures.exclusive_precedence.index("communication")
    assert d.comm_streams == [7, 9] and d.compute_streams == [7, 9]
    assert d.comm_serialized_with_compute
    assert d.steps == 1 and d.step_source == "none" and d.step_ns_median == 70


def test_collective_instances_and_exposed_segments():
    d = analyze_device(basic_trace(), 0, 0)
    c = d.collectives
    assert c["kind"].tolist() == ["allreduce", "allreduce", "p2p_copy"]
    assert c["ordinal"].tolist() == [0, 1, 0]
    assert c["hidden_ns"].tolist() == [5, 0, 0]
    assert c["exposed_ns"].tolist() == [5, 10, 10]
    assert (c["compute_beside_ns"] == c["hidden_ns"]).all()
    gaps = d.comm_idle_gaps_ns
    assert list(zip(gaps["start_ns"], gaps["end_ns"], strict=True)) == [(10, 15), (40, 50), (60, 70)]
    assert gaps["duration_ns"].sum() == d.comm_exposed_ns


def test_memory_copies_do_not_hide_communication():
    t = make_trace(kernels=[(0, 100, 0, 9, *AR)], memops=[(0, 100, 0, 7, "DtoD")])
    d = analyze_device(t, 0, 0)
    assert (d.comm_hidden_ns, d.comm_exposed_ns) == (0, 100)
    # the exclusive split gives the shared 100 ns to whichever bucket the stated precedence puts first
    first = min(("communication", "memory"), key=d.figures.exclusive_precedence.index)
    assert d.bucket_exclusive_ns[first] == 100 and sum(d.bucket_exclusive_ns.values()) == 100


def test_comm_on_its_own_stream_is_not_serialized():
    t = make_trace(kernels=[(0, 100, 0, 7, "gemm", "gemm"), (50, 150, 0, 20, *AR)])
    d = analyze_device(t, 0, 0)
    assert d.comm_streams == [20] and d.compute_streams == [7]
    assert not d.comm_serialized_with_compute
    assert (d.comm_hidden_ns, d.comm_exposed_ns, d.overlap_pct) == (50, 50, 50.0)


def test_profiler_steps_are_projected_through_launch_correlation():
    # CPU steps [0,100) and [100,200) launch kernels 1,2 and 3,4; GPU runs them late (async)
    t = make_trace(
        kernels=[(50, 80, 0, 7, "gemm", "gemm", None, 1), (80, 130, 0, 7, *AR, 2),
                 (150, 170, 0, 7, "gemm", "gemm", None, 3), (170, 260, 0, 7, *AR, 4)],
        api_calls=[(10, 12, 1), (20, 22, 2), (110, 112, 3), (120, 122, 4)],
        ranges=[(0, 100, "profiler_step", "ProfilerStep#5"), (100, 200, "profiler_step", "ProfilerStep#6")])
    d = analyze_device(t, 0, 0)
    assert d.step_source == "profiler_step"
    ps = d.per_step
    assert ps["step"].tolist() == [5, 6]
    assert list(zip(ps["start_ns"], ps["end_ns"], strict=True)) == [(50, 130), (150, 260)]
    assert ps["busy_ns"].tolist() == [80, 110] and ps["idle_ns"].tolist() == [0, 0]
    assert ps["comm_exposed_ns"].tolist() == [50, 90]
    assert d.step_ns_median == (80 + 110) // 2
    assert d.comm_exposed_per_step_ns == 70
    assert d.collectives["step"].tolist() == [5, 6]


def test_gpu_side_profiler_step_annotation_is_used_directly():
    t = make_trace(kernels=[(50, 80, 0, 7, "gemm", "gemm"), (90, 95, 0, 7, "gemm", "gemm")],
                   ranges=[(0, 40, "profiler_step", "ProfilerStep#3"), (45, 100, "gpu_user_annotation",
                                                                            "ProfilerStep#3", 0)])
    steps = step_windows(gather(t, 0, 0))  # the annotation (45..100), clipped to the device span (50..95)
    assert steps[["step", "start_ns", "end_ns", "source"]].values.tolist() == [[3, 50, 95, "profiler_step"]]


def test_user_step_range_and_overlapping_projection_made_disjoint():
    t = make_trace(
        kernels=[(10, 60, 0, 7, "k", "gemm", None, 1), (55, 90, 0, 8, "k", "gemm", None, 2)],
        api_calls=[(1, 2, 1), (6, 7, 2)], ranges=[(0, 5, "nvtx", "iter"), (5, 9, "nvtx", "iter")])
    steps = step_windows(gather(t, 0, 0), "iter")
    assert steps[["start_ns", "end_ns"]].values.tolist() == [[10, 55], [55, 90]]
    assert set(steps["source"]) == {"nvtx:iter"}


def _layered_step(t0: int, corr0: int) -> tuple[list, list, list]:
    """One step of 2 layers, each: attention [+0,+10), all-reduce [+10,+14), moe [+14,+30), all-reduce
    [+30,+34); layer ranges on the CPU launch them; then an lm_head kernel."""
    kernels, calls, ranges = [], [], []
    corr = corr0
    for layer in range(2):
        base = t0 + 40 * layer
        for a, b, name, bucket, sub in [(0, 10, "attn", "attention", None), (10, 14, *AR),
                                        (14, 30, "moe", "moe_gemm", None), (30, 34, *AR)]:
            kernels.append((base + a, base + b, 0, 7, name, bucket, sub, corr))
            calls.append((t0 + 4 * (corr - corr0), t0 + 4 * (corr - corr0) + 1, corr))
            corr += 1
        ranges.append((t0 + 16 * layer, t0 + 16 * layer + 16, "nvtx", f"layer_{layer}"))
    kernels.append((t0 + 80, t0 + 90, 0, 7, "lm_head", "gemm", None, corr))
    calls.append((t0 + 33, t0 + 34, corr))
    return kernels, calls, ranges


def test_layers_from_nvtx_ranges():
    kernels, calls, ranges = _layered_step(1000, 1)
    t = make_trace(kernels=kernels, api_calls=calls, ranges=ranges)
    d = analyze_device(t, 0, 0)
    assert d.layer_source == "nvtx:layer ranges"
    pl = d.per_layer
    assert pl["layer"].tolist() == [0, 1] and pl["name"].tolist() == ["layer_0", "layer_1"]
    assert list(zip(pl["start_ns"], pl["end_ns"], strict=True)) == [(1000, 1034), (1040, 1074)]
    assert pl["comm_ns"].tolist() == [8, 8] and pl["comm_exposed_ns"].tolist() == [8, 8]
    assert pl["compute_ns"].tolist() == [26, 26]
    assert d.collectives["layer"].tolist() == [0, 0, 1, 1]


def test_layer_ranges_recorded_on_both_sides_count_once():
    kernels, calls, ranges = _layered_step(1000, 1)
    gpu_side = [(1000, 1034, "gpu_user_annotation", "layer_0", 0), (1040, 1074, "gpu_user_annotation", "layer_1", 0)]
    d = analyze_device(make_trace(kernels=kernels, api_calls=calls, ranges=ranges + gpu_side), 0, 0)
    assert d.per_layer["name"].tolist() == ["layer_0", "layer_1"]
    assert d.per_layer["compute_ns"].tolist() == [26, 26]


def test_layers_from_collective_period_when_no_ranges():
    k1, c1, _ = _layered_step(1000, 1)
    k2, c2, _ = _layered_step(2000, 100)
    steps = [(990, 1100, "profiler_step", "ProfilerStep#1"), (1990, 2100, "profiler_step", "ProfilerStep#2")]
    t = make_trace(kernels=k1 + k2, api_calls=[(s - 10, e - 10, c) for s, e, c in c1 + c2], ranges=steps)
    d = analyze_device(t, 0, 0)
    assert d.step_source == "profiler_step" and d.steps == 2
    assert d.layer_source == "collective_period"
    pl = d.per_layer
    assert pl["step"].tolist() == [1, 1, 2, 2] and pl["layer"].tolist() == [0, 1, 0, 1]
    assert list(zip(pl["start_ns"], pl["end_ns"], strict=True))[:2] == [(1000, 1034), (1040, 1074)]
    assert pl["comm_ns"].tolist() == [8, 8, 8, 8] and pl["compute_ns"].tolist() == [26, 26, 26, 26]


def test_steps_detected_from_repeating_kernel_sequence():
    kernels = []
    for step in range(4):
        t0 = 1000 * step
        kernels += [(t0 + 100, t0 + 200, 0, 7, "embed", "other"), (t0 + 200, t0 + 400, 0, 7, "gemm", "gemm"),
                    (t0 + 400, t0 + 450, 0, 7, *AR), (t0 + 450, t0 + 600, 0, 7, "gemm", "gemm"),
                    (t0 + 600, t0 + 650, 0, 7, *AR), (t0 + 650, t0 + 700, 0, 7, "head", "gemm")]
    steps = detect_steps(gather(make_trace(kernels=kernels), 0, 0))
    assert steps is not None
    # idle-gap steps run from one pass's first kernel to the next pass's (the gap is part of the step's time)
    assert steps[["start_ns", "end_ns"]].values.tolist() == [[100, 1100], [1100, 2100], [2100, 3100], [3100, 3700]]
    d = analyze_device(make_trace(kernels=kernels), 0, 0, options=SummaryOptions(layer_pattern=None))
    assert d.step_source == "idle_gaps" and d.steps == 4 and d.step_ns_median == 1000
    assert d.comm_exposed_per_step_ns == 100


def test_collectives_link_to_metadata_by_external_id():
    t = make_trace(kernels=[(0, 10, 0, 7, *AR, 5, 77), (20, 30, 0, 7, *AR, 6, 78)],
                   collectives=[(77, "allreduce", 8192, 11, 2), (78, "allreduce", 4096, 12, 2)])
    c = analyze_device(t, 0, 0).collectives
    assert c["seq"].tolist() == [11, 12] and c["bytes"].tolist() == [8192, 4096]
    assert c["group_size"].tolist() == [2, 2] and c["dtype"].tolist() == ["BFloat16", "BFloat16"]


def test_multi_device_trace_keeps_devices_apart():
    t = make_trace(kernels=[(0, 100, 0, 7, "gemm", "gemm"), (0, 50, 1, 7, *AR), (60, 80, 1, 7, "g", "gemm")])
    d0, d1 = analyze_device(t, 0, 0), analyze_device(t, 0, 1)
    assert (d0.comm_ns, d0.busy_ns) == (0, 100)
    assert (d1.comm_ns, d1.comm_exposed_ns, d1.busy_ns, d1.span_ns) == (50, 50, 70, 80)
    assert d0.overlap_pct is None


def test_top_kernels_grouped_by_name():
    t = make_trace(kernels=[(0, 10, 0, 7, "a", "gemm"), (10, 40, 0, 7, "a", "gemm"), (40, 45, 0, 7, "b", "other")])
    top = analyze_device(t, 0, 0).top_kernels
    assert top["name"].tolist() == ["a", "b"]
    assert top["count"].tolist() == [2, 1] and top["total_ns"].tolist() == [40, 5]
    assert top["mean_ns"].tolist() == [20.0, 5.0] and top["p50_ns"].tolist() == [20.0, 5.0]
    assert np.isclose(top["p99_ns"].iloc[0], 10 + 0.99 * 20)


# ---- device numbers against a per-ns brute force on random small traces ---------------------------------------

BUCKETS = ["gemm", "attention", "communication", "other"]
kernel_rows = st.lists(st.tuples(st.integers(0, 80), st.integers(0, 15), st.sampled_from([7, 9, 20]),
                                 st.sampled_from(BUCKETS)), min_size=1, max_size=14)
memop_rows = st.lists(st.tuples(st.integers(0, 80), st.integers(1, 10), st.sampled_from(["HtoD", "PtoP"])),
                      max_size=4)


def _mask(pairs: list[tuple[int, int]]) -> np.ndarray:
    m = np.zeros(120, dtype=bool)
    for a, b in pairs:
        m[a:b] = True
    return m


@settings(max_examples=60, deadline=None)
@given(kernel_rows, memop_rows)
def test_device_numbers_match_brute_force(kernels, memops):
    ks = [(a, a + d, 0, s, f"k_{b}", b) for a, d, s, b in kernels]
    ms = [(a, a + d, 0, 7, kind) for a, d, kind in memops]
    t = make_trace(kernels=ks, memops=ms)
    d = analyze_device(t, 0, 0, options=SummaryOptions(layer_pattern=None))
    busy = _mask([(a, b) for a, b, *_ in ks] + [(a, b) for a, b, *_ in ms])
    comm = _mask([(a, b) for a, b, _, _, _, bucket in ks if bucket == "communication"]
                 + [(a, b) for a, b, _, _, kind in ms if kind == "PtoP"])
    compute = _mask([(a, b) for a, b, _, _, _, bucket in ks if bucket != "communication"])
    assert d.busy_ns == busy.sum() and d.comm_ns == comm.sum()
    assert d.comm_hidden_ns == (comm & compute).sum() and d.comm_exposed_ns == (comm & ~compute).sum()
    assert sum(d.bucket_exclusive_ns.values()) == d.busy_ns
    assert d.comm_idle_gaps_ns["duration_ns"].sum() == d.comm_exposed_ns
    assert d.idle_ns == d.span_ns - d.busy_ns >= 0
    c = d.collectives
    assert (c["hidden_ns"] + c["exposed_ns"] == c["duration_ns"]).all()
    for bucket, ns in d.bucket_ns.items():
        assert ns == _mask([(a, b) for a, b, _, _, _, kb in ks if kb == bucket]
                           + [(a, b) for a, b, _, _, kind in ms
                              if ("communication" if kind == "PtoP" else "memory") == bucket]).sum()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 100), st.integers(1, 20)), min_size=1, max_size=12),
       st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), min_size=1, max_size=6))
def test_gpu_projection_matches_brute_force(kernels, ranges):
    from traceanalyzer.analysis.structure.steps import project_to_gpu

    # kernel i launched at host time `launch` (correlation i+1), runs [start, start+dur) on the GPU
    t = make_trace(kernels=[(s, s + d, 0, 7, "k", "gemm", None, i + 1) for i, (_, s, d) in enumerate(kernels)],
                   api_calls=[(launch, launch + 1, i + 1) for i, (launch, _, _) in enumerate(kernels)])
    act = gather(t, 0, 0)
    rs = np.array([a for a, _ in ranges])
    re_ = rs + np.array([d for _, d in ranges])
    gs, ge, ok = project_to_gpu(act, rs, re_, np.full(len(rs), 100), np.full(len(rs), 1))
    for j, (a, b) in enumerate(zip(rs.tolist(), re_.tolist(), strict=True)):
        inside = [(s, s + d) for launch, s, d in kernels if a <= launch < b]
        assert ok[j] == bool(inside)
        if inside:
            assert (gs[j], ge[j]) == (min(s for s, _ in inside), max(e for _, e in inside))
