"""allreduce_not_fused / norm_not_fused on synthetic traces with hand-computable chains, and on the real fixtures:
the all-reduce fusion bound and the norm-fusion-alone saving are kept apart and never add up to more than the
chain's own time."""

from __future__ import annotations

from pathlib import Path

import pytest

import traceanalyzer as ta
from traceanalyzer.testing.synth import make_trace

US = 1_000
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
FUSED_AR = ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<(flashinfer::"
            "trtllm_allreduce_fusion::AllReduceFusionPattern)1, __nv_bfloat16, 4, false, false>(flashinfer::"
            "trtllm_allreduce_fusion::AllReduceFusionParams<__nv_bfloat16>)")
NORM = "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*)"
NORM_QUANT = "void vllm::fused_add_rms_norm_static_fp8_quant_kernel<c10::BFloat16, 8>(c10::BFloat16*)"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _trace(after_ar: list[tuple[int, int, str, str]], ar: tuple[str, str] = (AR, "allreduce"), steps: int = 2,
           layers: int = 4, rank: int = 0):
    """``steps`` steps of 1 ms on stream 7: per layer a gemm, an all-reduce of 20 µs, then ``after_ar`` as
    (gap before, duration, name, subbucket) in µs, then a gemm to the layer's end."""
    kernels, ranges = [], []
    layer = 1000 * US // layers
    for s in range(steps):
        t0 = s * 1000 * US
        ranges.append((t0, t0 + 1000 * US, "gpu_user_annotation", f"ProfilerStep#{s}", 0))
        for i in range(layers):
            t = t0 + i * layer
            kernels.append((t, t + 100 * US, 0, 7, "nvjet_gemm", "gemm", "dense"))
            t += 100 * US
            kernels.append((t, t + 20 * US, 0, 7, ar[0], "communication", ar[1]))
            t += 20 * US
            for gap, dur, name, sub in after_ar:
                t += gap * US
                kernels.append((t, t + dur * US, 0, 7, name, "other", sub))
                t += dur * US
            kernels.append((t, t0 + (i + 1) * layer, 0, 7, "nvjet_gemm", "gemm", "dense"))
    return make_trace(kernels, ranges=ranges, rank=rank, path=f"rank{rank}.json", device_names={0: "NVIDIA H200"})


def _found(summary, rule: str):  # type: ignore[no-untyped-def]
    return next((f for f in summary.findings if f.id == rule), None)


def test_one_fused_norm_kernel_after_each_allreduce_fires_with_its_pass_and_gap() -> None:
    # 4 all-reduces per step, each followed 2 µs later by one FusedAddRMSNormKernel of 10 µs: folding it into the
    # all-reduce saves at most 2 + 10 µs per all-reduce = 48 µs/step; there is no chain to collapse
    s = ta.summary([_trace([(2, 10, NORM, "norm")])])
    found = _found(s, "allreduce_not_fused")
    assert found is not None and found.impact_ns_per_step == 4 * 12 * US
    ev = found.evidence
    assert ev["allreduces_followed_per_step"] == 4 and ev["median_chain_kernels"] == 1
    assert ev["per_chain_ns"] == {"chain": 12 * US, "gap_after_allreduce": 2 * US, "fused_norm_estimate": 10 * US,
                                  "norm_fusion_alone": 0, "allreduce_fusion_at_most": 12 * US}
    assert "fusing the norm into the all-reduce would save at most" in found.title
    assert _found(s, "norm_not_fused") is None


def test_fused_allreduce_norm_kernel_stays_silent() -> None:
    s = ta.summary([_trace([], ar=(FUSED_AR, "allreduce_fusion"))])
    assert _found(s, "allreduce_not_fused") is None and _found(s, "norm_not_fused") is None
    # a norm after an already-fused all-reduce is not another all-reduce fusion candidate either
    s = ta.summary([_trace([(2, 10, NORM, "norm")], ar=(FUSED_AR, "allreduce_fusion"))])
    assert _found(s, "allreduce_not_fused") is None


def test_decomposed_chain_splits_into_norm_fusion_and_allreduce_fusion() -> None:
    # add 10, pow 8, mean 12 (reduction), rsqrt 5, mul 20, each 1 µs after the previous kernel:
    # chain = 55 + 5 = 60 µs; fused norm ≈ longest = 20; norm fusion alone = 60 − 1 − 20 = 39; all-reduce fusion
    # at most 1 + 20 = 21 — the two add up to the chain, never more
    chain = [(1, 10, "add", "elementwise"), (1, 8, "pow", "elementwise"), (1, 12, "mean", "reduction"),
             (1, 5, "rsqrt", "elementwise"), (1, 20, "mul", "elementwise")]
    s = ta.summary([_trace(chain)])
    ar, alone = _found(s, "allreduce_not_fused"), _found(s, "norm_not_fused")
    assert ar is not None and alone is not None
    assert ar.impact_ns_per_step == 4 * 21 * US and alone.impact_ns_per_step == 4 * 39 * US
    assert ar.evidence["per_step_ns"]["chain"] == 4 * 60 * US
    assert ar.impact_ns_per_step + alone.impact_ns_per_step == ar.evidence["per_step_ns"]["chain"]
    assert "norm_not_fused" in ar.title


def test_gap_after_the_allreduce_counts_at_most_the_cap() -> None:
    # the norm starts 50 µs after the all-reduce (the host issued it late): only fusion_gap_max_ns (5 µs) counts
    s = ta.summary([_trace([(50, 10, NORM, "norm")])])
    found = _found(s, "allreduce_not_fused")
    assert found is not None and found.evidence["per_chain_ns"]["allreduce_fusion_at_most"] == 15 * US


def test_norm_and_quant_kernel_counts_as_a_norm_and_chains_without_norm_do_not() -> None:
    s = ta.summary([_trace([(2, 10, NORM_QUANT, "quantize")])])
    assert _found(s, "allreduce_not_fused") is not None
    s = ta.summary([_trace([(2, 10, "add", "elementwise")])])  # a residual add alone: no norm to fuse
    assert _found(s, "allreduce_not_fused") is None


@pytest.mark.parametrize(("files", "step_range"), [
    (["kineto/tp2_prefill_serial/rank0.json.gz", "kineto/tp2_prefill_serial/rank1.json.gz"], None),
    (["nsys/tp2_prefill_serial.sqlite"], "step"),
    (["kineto/tp2_decode_eager/rank0.json.gz", "kineto/tp2_decode_eager/rank1.json.gz"], None),
    (["kineto/tp2_decode_graphs/rank0.json.gz", "kineto/tp2_decode_graphs/rank1.json.gz"], None),
])
def test_fixture_bounds_never_exceed_the_chain(files: list[str], step_range: str | None) -> None:
    """Eager PyTorch's decomposed add + RMSNorm (9 kernels) follows every all-reduce in the project's fixtures."""
    from traceanalyzer.findings.fusion_rules import unfused_chains

    traces = ta.load_many([FIXTURES / f for f in files])
    s = ta.summary(traces, step_range=step_range)
    ar = _found(s, "allreduce_not_fused")
    assert ar is not None and ar.evidence["median_chain_kernels"] == 9
    assert 0 < ar.impact_ns_per_step < ar.evidence["per_step_ns"]["chain"]
    for dev in s.devices:  # per chain: the two parts add up to the chain, each part ≥ 0
        chains = unfused_chains(next(t for t in traces if t.path == dev.trace), dev, 5_000)
        assert chains is not None and len(chains) > 0
        assert (chains["allreduce_bound_ns"] + chains["norm_alone_ns"] == chains["chain_ns"]).all()
        assert (chains["norm_alone_ns"] > 0).all() and (chains["allreduce_bound_ns"] > 0).all()


def test_measured_fused_norm_is_within_the_bound_basis() -> None:
    """fixtures/truth/rmsnorm_fusion_h200.json (examples/rmsnorm_fusion_cost.py, one H200, hidden 4096, bf16): a
    fused add + RMSNorm kernel takes no longer than the longest kernel of eager's decomposed chain — the fused-norm
    estimate, so the all-reduce fusion part stays an upper bound — and the norm-fusion-alone estimate (chain −
    longest kernel) does not exceed the measured saving (decomposed − fused)."""
    import json

    measured = json.loads((FIXTURES / "truth" / "rmsnorm_fusion_h200.json").read_text())
    assert measured["hidden"] == 4096 and measured["dtype"] == "bfloat16"
    for tokens in ("64", "4096", "16384"):
        run = measured["results"][tokens]
        eager, fused = run["decomposed"], run["fused_add_norm"]
        assert eager["kernels_per_call"] == 9 and fused["kernels_per_call"] == 1
        longest = max(eager["kernels"].values())
        assert fused["gpu_us_median"] <= longest
        assert eager["gpu_us_median"] - longest <= eager["gpu_us_median"] - fused["gpu_us_median"]


def test_decode_without_step_markers_gives_the_same_per_chain_figures() -> None:
    """8 ranks, no NVTX or ProfilerStep: 6 forward passes of 4 identical layers (gemm 30 µs, all-reduce 10 µs, a
    FusedAddRMSNormKernel of 5 µs 2 µs later), 1 ms of scheduler idle between passes. Whatever step the detection
    picks (a layer or a pass), each chain is 2 µs + 5 µs, and the finding fires."""
    traces = []
    for rank in range(8):
        kernels, t = [], 0
        for _ in range(6):
            for _ in range(4):
                kernels += [(t, t + 30 * US, 0, 7, "nvjet_gemm", "gemm", "dense"),
                            (t + 30 * US, t + 40 * US, 0, 7, AR, "communication", "allreduce"),
                            (t + 42 * US, t + 47 * US, 0, 7, NORM, "other", "norm")]
                t += 47 * US
            t += 1000 * US
        traces.append(make_trace(kernels, rank=rank, path=f"rank{rank}.json", device_names={0: "NVIDIA H200"}))
    found = next(f for f in ta.summary(traces).findings if f.id == "allreduce_not_fused")
    assert found.evidence["per_chain_ns"] == {"chain": 7 * US, "gap_after_allreduce": 2 * US,
                                              "fused_norm_estimate": 5 * US, "norm_fusion_alone": 0,
                                              "allreduce_fusion_at_most": 7 * US}
    per_step = found.evidence["per_step_ns"]["allreduce_fusion_at_most"]
    assert per_step == 7 * US * found.evidence["allreduces_followed_per_step"]


# Real names (FlashInfer include/flashinfer/comm/trtllm_mnnvl_allreduce.cuh: the two-shot all-reduce, then with
# rmsNormFusion the norm as a Lamport-buffer kernel that is part of the fused path; vLLM custom all-reduce; FlashInfer
# norm), classified by the default rules rather than labelled by hand.
MNNVL_AR = "void flashinfer::trtllm_mnnvl_allreduce::twoshotAllreduceKernel<2, __nv_bfloat16>(__nv_bfloat16*)"
MNNVL_NORM = "void flashinfer::trtllm_mnnvl_allreduce::rmsNormLamport_fusion<__nv_bfloat16, 0, 1>(__nv_bfloat16*)"
CUSTOM_AR = "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, vllm::RankSignals, vllm::Signal*)"


def _classified(name: str) -> tuple[str, str]:
    from traceanalyzer.classify import classify_names

    c = classify_names([name])[0]
    return c.bucket, c.subbucket


@pytest.mark.parametrize(("ar", "follower", "fires"), [
    (MNNVL_AR, MNNVL_NORM, False),  # all-reduce + RMSNorm fused (its norm half is communication)
    (MNNVL_AR, NORM, True),  # the two-shot all-reduce without norm fusion, then a separate norm
    (CUSTOM_AR, NORM, True),  # custom all-reduce, then a separate FusedAddRMSNormKernel
])
def test_real_kernel_names_fire_or_stay_silent(ar: str, follower: str, fires: bool) -> None:
    ar_bucket, ar_sub = _classified(ar)
    f_bucket, f_sub = _classified(follower)
    assert ar_bucket == "communication"
    kernels, ranges = [], [(0, 1000 * US, "gpu_user_annotation", "ProfilerStep#0", 0)]
    for i in range(4):
        t = i * 250 * US
        kernels += [(t, t + 100 * US, 0, 7, "nvjet_gemm", "gemm", "dense"),
                    (t + 100 * US, t + 120 * US, 0, 7, ar, ar_bucket, ar_sub),
                    (t + 122 * US, t + 132 * US, 0, 7, follower, f_bucket, f_sub),
                    (t + 132 * US, t + 250 * US, 0, 7, "nvjet_gemm", "gemm", "dense")]
    s = ta.summary([make_trace(kernels, ranges=ranges, path="r.json", device_names={0: "NVIDIA H200"})])
    assert (_found(s, "allreduce_not_fused") is not None) is fires
