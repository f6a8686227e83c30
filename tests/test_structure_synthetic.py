"""Step, layer and run structure on tiny synthetic traces with hand-computable answers (docs/STRUCTURE.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import traceanalyzer as ta
from traceanalyzer.testing.synth import make_trace

AR = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication", "allreduce")
LAYER = [("qkv_gemm", "gemm", 40), ("flash_fwd", "attention", 30), ("o_proj_gemm", "gemm", 20),
         ("add_rmsnorm", "other", 10), ("mlp_up_gemm", "gemm", 40), ("silu_mul", "other", 10),
         ("mlp_down_gemm", "gemm", 30)]


def _passes(n_passes: int, n_layers: int, *, gap: int, head: bool = False, allreduce: bool = False,
            warmup: bool = False) -> list[tuple]:
    """Forward passes of identical layers, back to back inside a pass, ``gap`` ns of GPU idle between passes."""
    kernels: list[tuple] = []
    t = 0
    if warmup:  # setup kernels, different from any pass
        for i in range(5):
            kernels.append((t, t + 500, 0, 7, f"init_{i}", "other"))
            t += 5_000
    for _ in range(n_passes):
        if head:
            kernels.append((t, t + 15, 0, 7, "embedding_gather", "other"))
            t += 15
        for _ in range(n_layers):
            for name, bucket, dur in LAYER:
                kernels.append((t, t + dur, 0, 7, name, bucket))
                t += dur
            if allreduce:
                kernels.append((t, t + 25, 0, 7, *AR))
                t += 25
        if head:
            kernels.append((t, t + 50, 0, 7, "lm_head_gemm", "gemm"))
            kernels.append((t + 50, t + 60, 0, 7, "argmax_reduce", "other"))
            t += 60
        t += gap
    return kernels


def _device(kernels: list[tuple], **kw: object) -> ta.analysis.results.DeviceSummary:  # type: ignore[name-defined]
    return ta.summary([make_trace(kernels=kernels, **kw)], findings=False).devices[0]


def test_decode_passes_between_host_gaps_are_steps_not_layers():
    # 12 passes of 8 identical layers, 3 µs of idle between passes; no NVTX, no ProfilerStep, no embedding
    d = _device(_passes(12, 8, gap=3_000))
    assert d.step_source == "idle_gaps" and d.steps == 12
    pass_ns = 8 * 180
    assert d.step_ns_median == pass_ns + 3_000  # first kernel to the next pass's first kernel
    assert d.layer_source == "kernel_period" and d.layers_per_step == 8
    assert d.step_evidence["kernels_per_step"] == 56 and d.step_confidence == "medium"


def test_back_to_back_passes_are_cut_by_the_once_per_pass_kernels():
    d = _device(_passes(10, 6, gap=0, head=True))
    assert d.step_source == "kernel_period" and 9 <= d.steps <= 10
    assert d.step_ns_median == 15 + 6 * 180 + 60
    assert d.layers_per_step == 6


def test_warmup_before_the_passes_belongs_to_no_step():
    d = _device(_passes(8, 4, gap=2_000, warmup=True))
    assert d.step_source == "idle_gaps" and d.steps == 8
    assert d.in_steps["kernels"] == 8 * 4 * 7
    assert d.in_steps["busy_pct"] > 100 * d.busy_ns / d.span_ns  # warm-up idle dilutes the whole window only


def test_kernel_bursts_between_long_copies_are_not_steps():
    # 6 bursts of 20 kernels, each after a 10 µs host-to-device weight copy: copies hold most of the busy time
    kernels, memops, t = [], [], 0
    for _ in range(6):
        memops.append((t, t + 10_000, 0, 9, "HtoD", 200 << 20))
        t += 10_000
        for i in range(20):
            kernels.append((t, t + 50, 0, 7, f"k{i % 5}", "gemm" if i % 5 == 0 else "other"))
            t += 50
    d = _device(kernels, memops=memops)
    assert d.step_source == "none" and d.steps == 1


def test_one_collective_after_each_layer_gives_tensor_parallel_layers():
    d = _device(_passes(6, 4, gap=3_000, allreduce=True))
    assert d.step_source == "idle_gaps" and d.steps == 6
    assert d.layer_source == "collective_period" and d.layers_per_step == 4


def test_back_to_back_gradient_buckets_are_not_layers():
    # a training step: compute, then 40 all-reduce buckets with nothing between them (DDP), 3 steps
    kernels, t = [], 0
    for step in range(3):
        for name, bucket, dur in LAYER * 3:
            kernels.append((t, t + dur, 0, 7, name, bucket))
            t += dur
        for _ in range(40):
            kernels.append((t, t + 20, 0, 20, *AR))
            t += 20
        t += 5_000
        kernels.append((t - 100, t - 90, 0, 7, f"optimizer_{step % 1}", "other"))
    d = _device(kernels)
    assert d.steps == 3 and d.layer_source == "none" and d.layers_per_step == 0


def _rank_trace(rank: int, *, base: int, world: int | None, path: str, n_ar: int = 4) -> ta.Trace:
    kernels, t = [], 1_000
    for i in range(n_ar):
        kernels += [(t, t + 100, rank, 7, "gemm", "gemm", None, -1, -1),
                    (t + 100, t + 150, rank, 7, *AR, -1, 10 + i)]
        t += 1_000
    trace = make_trace(kernels=kernels, rank=rank, pid=100 + rank, path=path)
    return replace(trace, base_time_ns=base, world_size=world)


def test_rank_files_of_different_runs_are_not_matched():
    a0 = _rank_trace(0, base=10**18, world=2, path="a_rank0.json")
    a1 = _rank_trace(1, base=10**18, world=2, path="a_rank1.json")
    b1 = _rank_trace(1, base=10**18 + 45 * 10**9, world=2, path="b_rank1.json")
    s = ta.summary([a0, a1, b1], findings=False)
    runs = s.runs
    assert runs is not None and [r.paths for r in runs] == [["a_rank0.json", "a_rank1.json"], ["b_rank1.json"]]
    assert s.cross_rank is not None and s.cross_rank.detail is not None and s.cross_rank.detail.ranks == [0, 1]
    assert any("b_rank1.json: not the same run" in w and "repeats rank 1" in w for w in s.warnings)
    # without the rank collision the profiled windows, 45 s apart, tell the runs apart
    b0 = replace(_rank_trace(0, base=10**18 + 45 * 10**9, world=2, path="b_rank0.json"))
    s = ta.summary([a1, b0], findings=False)
    assert s.runs is not None and len(s.runs) == 2 and s.cross_rank is None
    assert any("45.0 s apart on the common clock" in w for w in s.warnings)


def test_missing_ranks_make_cross_rank_results_partial():
    s = ta.summary([_rank_trace(r, base=10**18, world=8, path=f"r{r}.json") for r in (0, 1)], findings=False)
    assert s.runs is not None and s.runs[0].ranks_missing == 6 and s.ranks_missing == 6
    assert s.cross_rank is not None and s.cross_rank.completeness is not None
    assert s.cross_rank.completeness.partial and s.cross_rank.completeness.world_size == 8
    cross = s.to_json()["cross_rank"]
    assert list(cross)[-3:] == ["partial", "ranks_missing", "world_size"]  # the JSON contract's keys, last
    assert (cross["partial"], cross["ranks_missing"], cross["world_size"]) == (True, 6, 8)
    assert s.what_if.to_json()["partial"] is True and s.what_if.to_json()["confidence"] == "low"
    assert "6 of 8 ranks are missing" in " ".join(s.warnings)


@pytest.mark.parametrize("world_b", [2, 4])
def test_world_size_and_collective_mix_split_runs(world_b: int):
    a0 = _rank_trace(0, base=10**18, world=2, path="a0.json")
    b1 = _rank_trace(1, base=10**18, world=world_b, path="b1.json")
    s = ta.summary([a0, b1], findings=False)
    assert s.runs is not None and len(s.runs) == (2 if world_b != 2 else 1)
