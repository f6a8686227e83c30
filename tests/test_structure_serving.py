"""Structure of an 8-rank tensor-parallel serving export whose passes are known by construction: every forward pass
is embedding → 78 layers (attention, all-reduce, MoE, all-reduce) → final norm, LM head, sampling, then a host gap.
A window over one pass is one step, over two passes two steps, each with its 78 layers (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest

import traceanalyzer as ta
from traceanalyzer.testing.synth_nsys import write_nsys_export

RANKS = 8
LAYERS = 78
PASSES = 4
HOST_GAP = 2_500_000  # ns between passes (scheduler, sampling sync)
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ATTENTION = [("rms_norm_kernel", 4_000), ("nvjet_qkv_gemm", 9_000), ("rotary_embedding_kernel", 2_000),
             ("flash_fwd_splitkv_kernel", 12_000), ("nvjet_o_proj_gemm", 6_000), (AR, 15_000)]
MOE = [("fused_add_rms_norm_kernel", 4_000), ("router_gemm", 3_000), ("topk_softmax_kernel", 2_000),
       ("cutlass_moe_fp4_grouped_gemm_up", 14_000), ("silu_and_mul_kernel", 3_000),
       ("cutlass_moe_fp4_grouped_gemm_down", 12_000), ("moe_unpermute_kernel", 2_000), (AR, 15_000)]
PROLOGUE = [("vectorized_gather_kernel", 5_000)]  # embedding
EPILOGUE = [("rms_norm_kernel", 4_000), ("nvjet_lm_head_gemm", 30_000), ("argmax_kernel", 3_000),
            ("sampling_from_probs_kernel", 4_000)]


def _pass_kernels() -> list[tuple[str, int]]:
    return [*PROLOGUE, *(ATTENTION + MOE) * LAYERS, *EPILOGUE]


def _export(path: Path) -> tuple[Path, list[int]]:
    """The export and the start time of each pass (the same on every rank)."""
    kernels = []
    starts = []
    t = 1_000_000
    for _ in range(PASSES):
        starts.append(t)
        for name, dur in _pass_kernels():
            for rank in range(RANKS):
                kernels.append((t, t + dur, rank, 7, name, 1000 + rank))
            t += dur + 500
        t += HOST_GAP
    starts.append(t)
    return write_nsys_export(path, kernels, gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition"), starts


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    return _export(tmp_path_factory.mktemp("serving") / "serve8.sqlite")


def _window(starts: list[int], first: int, passes: int) -> str:
    """A --window (seconds from the capture start) holding exactly ``passes`` passes from pass ``first``."""
    origin = starts[0] - 1_000_000  # the capture starts at the first kernel's time minus the lead-in
    lo = (starts[first] - 1_000 - origin) / 1e9
    hi = (starts[first + passes] - HOST_GAP // 2 - origin) / 1e9
    return f"{lo:.9f}:{hi:.9f}"


def _structure(summary: ta.Summary) -> set[tuple[int, int]]:
    return {(d.steps if d.step_source != "none" else 0, d.layers_per_step) for d in summary.devices}


def test_every_pass_is_a_step_with_its_layers(serving: tuple[Path, list[int]]):
    path, _ = serving
    summary = ta.summary([str(path)], findings=False)
    assert len(summary.devices) == RANKS
    assert _structure(summary) == {(PASSES, LAYERS)}
    for d in summary.devices:
        assert d.step_source == "kernel_period" and d.layer_source == "collective_period"


@pytest.mark.parametrize("passes", [1, 2])
def test_a_window_of_one_or_two_passes(serving: tuple[Path, list[int]], passes: int):
    path, starts = serving
    summary = ta.summary([str(path)], findings=False, window=_window(starts, 1, passes))
    assert _structure(summary) == {(passes, LAYERS)}, [(d.step_source, d.step_evidence) for d in summary.devices]
