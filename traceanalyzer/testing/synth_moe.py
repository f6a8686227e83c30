"""An expert-parallel MoE replay as an nsys export, with hand-computable MoE answers (tests of analysis/moe.py).

Every rank is one process (pid ``100 + rank``, device = rank, ``MPI_RANKS`` set) on one clock. Per layer, on the
compute stream: attention, the router (trtllm-gen routing), the permutation (``expandInputRows``), the shared
expert's first GEMM (an ``nvjet`` GEMM in an NVTX range ``shared_experts``), the FP4 grouped expert GEMM, the
shared expert's second GEMM, the un-permute (``finalizeMoeRouting``). DeepEP ``dispatch`` runs on its own stream
beside the first shared-expert GEMM and ``combine`` beside the second; the compute stream waits for each before
the kernel that reads its output (the expert GEMM, the finalize). A dispatch / combine ends ``transfer_ns`` after
the last rank arrived at it, so ranks that arrive early wait there. NVTX ranges ``step`` and ``layer_N`` mark the
steps and layers.

* balanced (default): every rank's expert GEMM takes ``expert_ns``; the shared-expert GEMMs are longer than the
  transfer, so dispatch and combine are hidden.
* ``MoeEpOptions(hot_rank=r, hot_factor=f)``: rank ``r``'s expert GEMM takes ``f · expert_ns``; the other ranks
  wait ``(f − 1) · expert_ns`` in each combine, beyond the second shared-expert GEMM: exposed combine.
* ``MoeEpOptions(overlap=False)``: dispatch and combine on the compute stream, nothing beside them: exposed.

>>> from traceanalyzer.testing.synth_moe import MoeEpOptions, write_moe_ep
>>> write_moe_ep(tmp_path / "moe.sqlite", MoeEpOptions(hot_rank=1, hot_factor=2.0))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .synth_nsys import Row, write_nsys_export

ATTENTION = ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
             "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, "
             "false, false>(flash::Flash_fwd_params)")
ROUTING = ("void moe::dev::routing::routingRenormalize::routingIndicesClusterKernel<moe::dev::routing::"
           "routingRenormalize::KernelParams<__nv_bfloat16, __nv_bfloat16, 128, true> >(moe::dev::routing::"
           "routingRenormalize::KernelParams<__nv_bfloat16, __nv_bfloat16, 128, true>)")
EXPAND_ROWS = ("void tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel<__nv_bfloat16, __nv_fp4_e2m1, 2, "
               "true>(__nv_bfloat16 const*, __nv_fp4_e2m1*, int)")
SHARED_GEMM = "nvjet_sm100_tst_128x128_64x4_2x1_v_bz_TNT"
FP4_GROUPED_GEMM = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<"
                    "cute::tuple<long, long, long> >, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::"
                    "MainloopSm100ArrayTmaUmmaWarpSpecializedBlockScaled<3, 2, 2, cute::tuple<cute::C<1>, cute::C<1>, "
                    "cute::C<1> > >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cute::tuple<cutlass::"
                    "float_e2m1_t, cutlass::float_ue4m3_t>*> > >(cutlass::gemm::kernel::GemmUniversal::Params)")
FINALIZE = ("void tensorrt_llm::kernels::cutlass_kernels::finalizeMoeRoutingKernel<__nv_bfloat16, __nv_bfloat16, 1>("
            "__nv_bfloat16 const*, __nv_bfloat16*)")
DISPATCH = ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, "
            "int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int, int, int, int, "
            "int, void**, int, int, int)")
COMBINE = ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(__nv_bfloat16*, float*, __nv_bfloat16 const*, "
           "float const*, int const*, int const*, int const*, int const*, int, int, int, int, void**, int, int, int)")

COMPUTE_STREAM, COMM_STREAM = 7, 27
GAP_NS = 2_000  # between two kernels of a stream
HOST_LEAD_NS = 5_000  # each launch call starts this long before its kernel


@dataclass(frozen=True)
class MoeEpOptions:
    """The replay's shape; times in ns."""

    ranks: int = 4
    layers: int = 4
    steps: int = 3
    attention_ns: int = 200_000
    router_ns: int = 10_000
    permute_ns: int = 8_000
    shared_ns: int = 80_000  # each of the shared expert's two GEMMs
    expert_ns: int = 300_000
    finalize_ns: int = 9_000
    transfer_ns: int = 60_000  # a dispatch / combine once every rank arrived
    hot_rank: int | None = None
    hot_factor: float = 1.0
    overlap: bool = True  # dispatch / combine on their own stream beside the shared expert
    step_gap_ns: int = 50_000


class _Replay:
    """The rows of a replay as it is built: each rank's next free time on its compute and communication stream."""

    def __init__(self, o: MoeEpOptions) -> None:
        self.o = o
        self.compute = [1_000_000] * o.ranks
        self.comm = [1_000_000] * o.ranks
        self.kernels: list[Row] = []
        self.runtime: list[Row] = []
        self.nvtx: list[Row] = []

    def launch(self, rank: int, start: int, end: int, stream: int, name: str) -> int:
        """A kernel and the launch call ``HOST_LEAD_NS`` before it; returns the call's start."""
        corr, pid = len(self.kernels) + 1, 100 + rank
        self.kernels.append((start, end, rank, stream, name, pid, corr))
        self.runtime.append((start - HOST_LEAD_NS, start - HOST_LEAD_NS + 1_000, "cudaLaunchKernel_v7000", corr,
                             pid, pid))
        return start - HOST_LEAD_NS

    def run(self, rank: int, name: str, ns: int) -> int:
        """A kernel on the compute stream after the previous one."""
        start = self.compute[rank] + GAP_NS
        self.compute[rank] = start + ns
        return self.launch(rank, start, start + ns, COMPUTE_STREAM, name)

    def collective(self, name: str) -> list[int]:
        """One dispatch / combine: each rank arrives when its compute stream reached it; all end together
        ``transfer_ns`` after the last arrival. Returns the end per rank."""
        o = self.o
        stream = COMM_STREAM if o.overlap else COMPUTE_STREAM
        arrive = [max(self.compute[r], self.comm[r] if o.overlap else 0) + GAP_NS for r in range(o.ranks)]
        end = max(arrive) + o.transfer_ns
        for r in range(o.ranks):
            self.launch(r, arrive[r], end, stream, name)
            if o.overlap:
                self.comm[r] = end
            else:
                self.compute[r] = end
        return [end] * o.ranks

    def ranged(self, rank: int, text: str, lo: int, hi: int) -> None:
        """An NVTX range of the rank's thread around launch calls ``lo`` … ``hi``."""
        self.nvtx.append((lo - 100, hi + 100, text, 100 + rank, None, False, 59, 100 + rank))

    def shared_beside(self, rank: int, ready: int) -> None:
        """The shared-expert GEMM beside a dispatch / combine (overlap only), then wait for it to end at ``ready``."""
        if self.o.overlap:
            at = self.run(rank, SHARED_GEMM, self.o.shared_ns)
            self.ranged(rank, "shared_experts", at, at)
        self.compute[rank] = max(self.compute[rank], ready)

    def layer(self, number: int) -> list[int]:
        """One MoE layer on every rank; returns the launch time of each rank's first kernel."""
        o = self.o
        first = [self.run(r, ATTENTION, o.attention_ns) for r in range(o.ranks)]
        for r in range(o.ranks):
            self.run(r, ROUTING, o.router_ns)
            self.run(r, EXPAND_ROWS, o.permute_ns)
        dispatched = self.collective(DISPATCH)
        for r in range(o.ranks):
            self.shared_beside(r, dispatched[r])
            self.run(r, FP4_GROUPED_GEMM, int(o.expert_ns * (o.hot_factor if r == o.hot_rank else 1.0)))
        combined = self.collective(COMBINE)
        for r in range(o.ranks):
            self.shared_beside(r, combined[r])
            self.ranged(r, f"layer_{number}", first[r], self.run(r, FINALIZE, o.finalize_ns))
        return first


def moe_ep_rows(o: MoeEpOptions) -> tuple[list[Row], list[Row], list[Row]]:
    """(kernels, runtime calls, NVTX ranges) of every rank."""
    replay = _Replay(o)
    for _step in range(o.steps):
        firsts = [replay.layer(layer) for layer in range(o.layers)]
        step_lo = firsts[0]
        for r in range(o.ranks):
            replay.ranged(r, "step", step_lo[r] - 200, replay.compute[r] - HOST_LEAD_NS)
        clock = max(max(replay.compute), max(replay.comm)) + o.step_gap_ns
        replay.compute = [clock] * o.ranks
        replay.comm = [clock] * o.ranks
    return replay.kernels, replay.runtime, replay.nvtx


def write_moe_ep(path: str | Path, options: MoeEpOptions | None = None) -> Path:
    """Write the replay (all ranks in one nsys export) to ``path``; returns the path."""
    o = options or MoeEpOptions()
    kernels, runtime, nvtx = moe_ep_rows(o)
    return write_nsys_export(path, kernels, nvtx=nvtx, runtime=runtime, gpu_name="NVIDIA B200",
                             compute_capability=(10, 0), sm_count=148,
                             mpi_ranks={100 + r: r for r in range(o.ranks)})


__all__ = ["MoeEpOptions", "moe_ep_rows", "write_moe_ep"]
