"""A replay of the story of issue 26 as an nsys export: 8 tensor-parallel ranks serving a large MoE in NVFP4.

The default is the platform the story happened on: 8 RTX PRO 6000 Blackwell Server GPUs (SM120, compute capability
12.0, PCIe only), 78 layers per forward pass with 2 NCCL ``RING_LL`` all-reduces each (156 per pass) on the compute
stream, a separate add + RMSNorm kernel after every all-reduce, NVFP4 grouped-GEMM MoE kernels, rank 5's attention
kernels slower than the others' (45 vs 35 µs), a host gap between passes, no NVTX ranges. Variants flip one cause
each, so every cause both fires and stays silent on some replay:

* ``StoryOptions.nvlink_custom()``: B200 (SM100, NVLink), the all-reduces run as SGLang's custom
  ``cross_device_reduce_1stage`` kernel;
* ``StoryOptions.fused()``: the story's GPUs, but each all-reduce + add + RMSNorm is one FlashInfer
  ``allreduce_fusion`` kernel;
* ``StoryOptions.sm100()``: B200 (SM100), otherwise the story (NCCL, unfused norm).

>>> from traceanalyzer.testing.synth_story import StoryOptions, write_story
>>> write_story(tmp_path / "story.sqlite")                     # doctest: +SKIP
>>> write_story(tmp_path / "fused.sqlite", StoryOptions.fused())  # doctest: +SKIP

Every rank is one process (pid ``100 + rank``) on its own GPU (device = rank), all on one clock: an all-reduce
ends on every rank ``transfer_ns`` after the last rank arrives, so the others wait for the slow rank there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .synth_nsys import Row, write_nsys_export

RTX_PRO_6000 = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
B200 = "NVIDIA B200"

QKV_GEMM = "nvjet_sm120_tst_128x128_64x4_2x1_v_bz_TNT"
ATTENTION = ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
             "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, "
             "false, false>(flash::Flash_fwd_params)")
NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
CUSTOM_ALLREDUCE = ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*, sglang::RankSignals, "
                    "sglang::Signal*, __nv_bfloat16*, int, int)")
FUSED_ALLREDUCE = ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<"
                   "__nv_bfloat16, 8, true, false>(flashinfer::trtllm_allreduce_fusion::"
                   "AllReduceFusionParams<__nv_bfloat16>)")
ADD_RMSNORM = ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, "
               "__nv_bfloat16*, unsigned int, unsigned int, unsigned int, float, float)")
ROUTER_GEMM = "nvjet_sm120_tst_64x8_64x16_2x4_h_bz_TNT"
ROUTING = ("void moe::dev::routing::routingRenormalize::routingIndicesClusterKernel<moe::dev::routing::"
           "routingRenormalize::KernelParams<__nv_bfloat16, __nv_bfloat16, 128, true> >(moe::dev::routing::"
           "routingRenormalize::KernelParams<__nv_bfloat16, __nv_bfloat16, 128, true>)")
EXPAND_ROWS = ("void tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel<__nv_bfloat16, __nv_fp4_e2m1, 2, "
               "true>(__nv_bfloat16 const*, __nv_fp4_e2m1*, int)")
FP4_GROUPED_GEMM = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<"
                    "cute::tuple<long, long, long> >, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::"
                    "MainloopSm120ArrayTmaUmmaWarpSpecializedBlockScaled<3, 2, 2, cute::tuple<cute::C<1>, cute::C<1>, "
                    "cute::C<1> > >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cute::tuple<cutlass::"
                    "float_e2m1_t, cutlass::float_ue4m3_t>*> > >(cutlass::gemm::kernel::GemmUniversal::Params)")
ACT_AND_MUL = ("void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>(__nv_bfloat16*, "
               "__nv_bfloat16 const*, int)")
FINALIZE = ("void tensorrt_llm::kernels::cutlass_kernels::finalizeMoeRoutingKernel<__nv_bfloat16, __nv_bfloat16, 1>("
            "__nv_bfloat16 const*, __nv_bfloat16*)")

LAUNCH_GAP_NS = 2_000  # idle between two kernels of a pass
STREAM = 7  # every kernel: compute and communication serialized on one stream


@dataclass(frozen=True)
class StoryOptions:
    """What the replay holds. Durations in ns."""

    gpu_name: str = RTX_PRO_6000
    compute_capability: tuple[int, int] = (12, 0)
    sm_count: int = 188
    ranks: int = 8
    layers: int = 78
    passes: int = 6
    allreduce: str = "nccl"  # nccl | custom | fused
    transfer_ns: int = 95_000  # an all-reduce once the last rank arrived
    attention_ns: int = 35_000
    slow_rank: int | None = 5
    slow_attention_ns: int = 45_000
    host_gap_ns: int = 2_500_000  # GPU idle between two forward passes

    @classmethod
    def nvlink_custom(cls) -> StoryOptions:
        """B200 (SM100, NVLink) with SGLang's custom all-reduce kernel."""
        return cls(gpu_name=B200, compute_capability=(10, 0), sm_count=148, allreduce="custom", transfer_ns=20_000)

    @classmethod
    def fused(cls) -> StoryOptions:
        """The story's GPUs with one fused all-reduce + add + RMSNorm kernel per all-reduce."""
        return cls(allreduce="fused")

    @classmethod
    def sm100(cls) -> StoryOptions:
        """B200 (SM100), NCCL all-reduces followed by a separate add + RMSNorm, as in the story."""
        return cls(gpu_name=B200, compute_capability=(10, 0), sm_count=148)

    def but(self, **changes: object) -> StoryOptions:
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


def _attention_ns(o: StoryOptions, rank: int) -> int:
    return o.slow_attention_ns if rank == o.slow_rank else o.attention_ns


def _allreduce(o: StoryOptions) -> tuple[str, int]:
    """The all-reduce kernel's name and the time it takes once every rank arrived."""
    if o.allreduce == "custom":
        return CUSTOM_ALLREDUCE, o.transfer_ns
    if o.allreduce == "fused":
        return FUSED_ALLREDUCE, o.transfer_ns + 6_000  # the epilogue's norm pass
    if o.allreduce == "nccl":
        return NCCL_ALLREDUCE, o.transfer_ns
    raise ValueError(f"allreduce must be nccl, custom or fused, not {o.allreduce!r}")


#: the MoE half of a layer, between the two all-reduces: (name, ns)
MOE_KERNELS = ((ROUTER_GEMM, 8_000), (ROUTING, 6_000), (EXPAND_ROWS, 5_000), (FP4_GROUPED_GEMM, 60_000),
               (ACT_AND_MUL, 10_000), (FP4_GROUPED_GEMM, 40_000), (FINALIZE, 5_000))


def story_kernels(o: StoryOptions) -> list[Row]:
    """Kernel rows (start, end, device, stream, name, pid) of every rank."""
    clock = [10_000_000] * o.ranks  # each rank's next free time on its stream
    rows: list[Row] = []
    ar_name, ar_ns = _allreduce(o)

    def run(rank: int, name: str, ns: int) -> None:
        start = clock[rank] + LAUNCH_GAP_NS
        rows.append((start, start + ns, rank, STREAM, name, 100 + rank))
        clock[rank] = start + ns

    def allreduce() -> None:
        arrive = [c + LAUNCH_GAP_NS for c in clock]
        end = max(arrive) + ar_ns
        for rank in range(o.ranks):
            rows.append((arrive[rank], end, rank, STREAM, ar_name, 100 + rank))
            clock[rank] = end
            if o.allreduce != "fused":
                run(rank, ADD_RMSNORM, 8_000)

    for _ in range(o.passes):
        for _layer in range(o.layers):
            for rank in range(o.ranks):
                run(rank, QKV_GEMM, 30_000)
                run(rank, ATTENTION, _attention_ns(o, rank))
                run(rank, QKV_GEMM, 20_000)
            allreduce()
            for rank in range(o.ranks):
                for name, ns in MOE_KERNELS:
                    run(rank, name, ns)
            allreduce()
        last = max(clock)
        clock = [last + o.host_gap_ns] * o.ranks
    return rows


def write_story(path: str | Path, options: StoryOptions | None = None) -> Path:
    """Write the replay (all ranks in one nsys export, no NVTX) to ``path``; returns the path."""
    o = options or StoryOptions()
    return write_nsys_export(path, story_kernels(o), gpu_name=o.gpu_name, compute_capability=o.compute_capability,
                             sm_count=o.sm_count)


__all__ = ["StoryOptions", "story_kernels", "write_story"]
