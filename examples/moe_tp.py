"""A small tensor-parallel MoE transformer that makes real GPU traces for traceanalyzer.

Each layer: RMSNorm → QKV GEMM → SDPA attention → out-proj → all-reduce → RMSNorm → router top-k →
grouped expert GEMMs (``torch._grouped_mm`` when it runs here, else a loop over experts) → all-reduce.
Attention heads and each expert's hidden dimension are split over the ranks (Megatron-style tensor
parallelism), so every layer ends its attention and its MoE block with an all-reduce of the activations.

Ranges ``layer_N`` / ``attention`` / ``moe`` / ``allreduce`` are emitted both as NVTX ranges (for nsys;
through the ``nvtx`` package when installed, else ``torch.cuda.nvtx``) and as ``record_function``
annotations (for the PyTorch profiler); ``prof.step()`` marks ``ProfilerStep#N``.

Modes:
  prefill_serial   16384 tokens (8 sequences × 2048); each all-reduce blocks the compute stream.
  prefill_overlap  the same tokens as two micro-batches; each all-reduce runs on its own stream, ordered by
                   CUDA events, so one micro-batch's all-reduce overlaps the other's compute.
  decode_eager     one new token for each of 64 sequences against a 1024-token KV cache; launch-bound.
  decode_graphs    the decode step captured once as a CUDA graph and replayed.
  decode_hostsync  decode_eager whose MoE block reads the expert loads on the host (``bincount`` and a copy to
                   the CPU: two host syncs per layer), as MoE code that sizes or logs per-expert work does; the
                   host waits for the GPU twice a layer instead of running ahead.

Commands (the fixtures in fixtures/ were made with examples/make_fixtures.sh):
  # profiled: <outdir>/<mode>_rank<N>.json.gz per rank (3 profiled steps after 1 wait + 1 warm-up step)
  torchrun --nproc-per-node 2 examples/moe_tp.py --mode prefill_serial --layers 4 --steps 3 --outdir traces
  # several modes in one process group, one after the other
  torchrun --nproc-per-node 2 examples/moe_tp.py --mode prefill_serial prefill_overlap decode_eager \\
      decode_graphs --layers 4 --steps 3 --outdir traces
  # step times without the profiler (median printed; JSON per rank with --truth-dir)
  torchrun --nproc-per-node 2 examples/moe_tp.py --mode prefill_serial --no-profile --steps 20
  # the same without the all-reduces: (with − without) is what communication costs per step
  torchrun --nproc-per-node 2 examples/moe_tp.py --mode prefill_serial --no-profile --comm-off --steps 20
  # profiled, then 5 rounds of 30 timed steps with / without the all-reduces in the same processes
  torchrun --nproc-per-node 2 examples/moe_tp.py --mode decode_eager --steps 3 --outdir traces \\
      --ab-rounds 5 --ab-steps 30 --truth-dir truth
  # under nsys (both ranks in one report)
  nsys profile -s none --cpuctxsw=none -t cuda,nvtx -o tp2_prefill_serial torchrun --nproc-per-node 2 \\
      examples/moe_tp.py --mode prefill_serial --layers 4 --no-profile --warmup 2 --steps 3

Runs on 1–8 GPUs (heads and the expert hidden size must divide by the world size), and on the CPU with
gloo for a smoke test (``python examples/moe_tp.py --mode prefill_serial --hidden 256 ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

MODES = ("prefill_serial", "prefill_overlap", "decode_eager", "decode_graphs", "decode_hostsync")

try:  # the nvtx package is optional; torch.cuda.nvtx needs a CUDA build
    import nvtx as _nvtx_pkg
except ImportError:
    _nvtx_pkg = None


@dataclass(frozen=True)
class Config:
    """Model and batch sizes (full, before the tensor-parallel split)."""

    layers: int
    hidden: int
    heads: int
    experts: int
    topk: int
    expert_ffn: int
    batch: int
    seq: int
    kv_len: int
    decode: bool
    microbatches: int
    host_routing: bool = False

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """An NVTX range only (for nsys); a no-op without CUDA."""
    if not torch.cuda.is_available():
        yield
        return
    if _nvtx_pkg is not None:
        _nvtx_pkg.push_range(name)
    else:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if _nvtx_pkg is not None:
            _nvtx_pkg.pop_range()
        else:
            torch.cuda.nvtx.range_pop()


@contextlib.contextmanager
def annotate(name: str) -> Iterator[None]:
    """An NVTX range (nsys) and a profiler annotation (Kineto) of the same name."""
    with nvtx_range(name), torch.profiler.record_function(name):
        yield


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def grouped_mm_supported(device: torch.device) -> bool:
    """Whether ``torch._grouped_mm`` exists and runs a tiny BF16 problem on this device."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.randn(32, 16, device=device, dtype=torch.bfloat16)
        b = torch.randn(2, 16, 16, device=device, dtype=torch.bfloat16)
        offs = torch.tensor([16, 32], device=device, dtype=torch.int32)
        torch._grouped_mm(a, b, offs=offs)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def expert_gemm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, grouped: bool) -> torch.Tensor:
    """Rows of ``x`` sorted by expert times that expert's weight; ``offs`` holds each group's end row."""
    if grouped:
        return torch._grouped_mm(x, w, offs=offs)
    out = x.new_empty(x.shape[0], w.shape[-1])
    start = 0
    for e, end in enumerate(offs.tolist()):  # host sync: the fallback is not graph-capturable
        out[start:end] = x[start:end] @ w[e]
        start = end
    return out


class Layer:
    """One transformer layer's weights (this rank's shard) and its attention / MoE blocks."""

    def __init__(self, cfg: Config, world: int, device: torch.device, grouped: bool) -> None:
        dt = torch.bfloat16
        self.cfg, self.grouped = cfg, grouped
        self.max_load = 0  # the most tokens any expert got (host routing only)
        self.heads = cfg.heads // world
        self.head_dim = cfg.hidden // cfg.heads
        ffn = cfg.expert_ffn // world
        h, d = cfg.hidden, self.heads * self.head_dim

        def init(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=device, dtype=dt) * shape[-2] ** -0.5

        self.norm_attn = torch.ones(h, device=device, dtype=dt)
        self.norm_moe = torch.ones(h, device=device, dtype=dt)
        self.w_qkv = init(h, 3 * d)
        self.w_out = init(d, h)
        self.w_router = init(h, cfg.experts)
        self.w_gate_up = init(cfg.experts, h, 2 * ffn)
        self.w_down = init(cfg.experts, ffn, h)
        if cfg.decode:
            cache = (cfg.batch, self.heads, cfg.kv_len, self.head_dim)
            self.k_cache = torch.randn(cache, device=device, dtype=dt)
            self.v_cache = torch.randn(cache, device=device, dtype=dt)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial attention output (sum over ranks = full output)."""
        seqs = x.shape[0] // self.cfg.seq
        qkv = rms_norm(x, self.norm_attn) @ self.w_qkv
        qkv = qkv.view(seqs, self.cfg.seq, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if self.cfg.decode:
            k, v = self.k_cache[:seqs], self.v_cache[:seqs]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=not self.cfg.decode)
        return o.transpose(1, 2).reshape(x.shape[0], -1) @ self.w_out

    def moe(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial MoE output: top-k routing, grouped expert GEMMs, weighted scatter back."""
        cfg = self.cfg
        xn = rms_norm(x, self.norm_moe)
        probs = (xn @ self.w_router).float().softmax(-1)
        weights, experts = torch.topk(probs, cfg.topk, dim=-1)
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        token = order // cfg.topk
        if cfg.host_routing:  # expert loads read on the host: bincount syncs, and so does the copy
            counts = torch.bincount(flat, minlength=cfg.experts).to(torch.int32)
            self.max_load = max(self.max_load, max(counts.cpu().tolist()))
        else:
            counts = torch.zeros(cfg.experts, device=x.device, dtype=torch.int32)
            counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))  # no host sync
        offs = counts.cumsum(0, dtype=torch.int32)
        gate_up = expert_gemm(xn[token], self.w_gate_up, offs, self.grouped)
        gate, up = gate_up.chunk(2, dim=-1)
        y = expert_gemm(F.silu(gate) * up, self.w_down, offs, self.grouped)
        y = y * weights.flatten()[order].unsqueeze(1).to(y.dtype)
        return torch.zeros_like(x).index_add_(0, token, y)


@dataclass
class HostClock:
    """Host wall time within the current step: the all-reduce calls (each with its ``allreduce`` range) and the
    whole step before its closing device sync."""

    call_s: float = 0.0
    issue_s: float = 0.0


CLOCK = HostClock()


class Comm:
    """All-reduce of partial outputs: on the compute stream (serial) or on a side stream with events."""

    def __init__(self, enabled: bool, side_stream: torch.cuda.Stream | None) -> None:
        self.enabled, self.side = enabled, side_stream

    def start(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Begin the all-reduce of ``t``; returns ``t`` and the event that marks it done (None: done in order)."""
        if not self.enabled:
            return t, None
        started = time.perf_counter()
        if self.side is None:
            with annotate("allreduce"):
                dist.all_reduce(t)
            CLOCK.call_s += time.perf_counter() - started
            return t, None
        ready = torch.cuda.Event()
        ready.record()
        with annotate("allreduce"), torch.cuda.stream(self.side):
            self.side.wait_event(ready)
            dist.all_reduce(t)
            t.record_stream(self.side)
            done = torch.cuda.Event()
            done.record()
        CLOCK.call_s += time.perf_counter() - started
        return t, done

    @staticmethod
    def finish(x: torch.Tensor, pending: tuple[torch.Tensor, torch.cuda.Event | None] | None) -> torch.Tensor:
        """Residual add of a finished all-reduce (the compute stream waits for its event first)."""
        if pending is None:
            return x
        reduced, done = pending
        if done is not None:
            torch.cuda.current_stream().wait_event(done)
        return x + reduced


def forward(layers: list[Layer], xs: list[torch.Tensor], comm: Comm) -> list[torch.Tensor]:
    """All layers over the micro-batches; block k of micro-batch m overlaps the all-reduce of m − 1."""
    pending: list[tuple[torch.Tensor, torch.cuda.Event | None] | None] = [None] * len(xs)
    for i, layer in enumerate(layers):
        with annotate(f"layer_{i}"):
            for block_name, block in (("attention", layer.attention), ("moe", layer.moe)):
                for m in range(len(xs)):
                    xs[m] = Comm.finish(xs[m], pending[m])
                    with annotate(block_name):
                        partial = block(xs[m])
                    pending[m] = comm.start(partial)
    return [Comm.finish(x, p) for x, p in zip(xs, pending, strict=True)]


def build_step(cfg: Config, mode: str, comm_on: bool, device: torch.device) -> Callable[[], None]:
    """The model for ``mode`` and a function that runs one step of it (ending with a device sync)."""
    world = dist.get_world_size()
    grouped = grouped_mm_supported(device)
    layers = [Layer(cfg, world, device, grouped) for _ in range(cfg.layers)]
    side = torch.cuda.Stream() if mode == "prefill_overlap" and device.type == "cuda" else None
    comm = Comm(comm_on, side)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(cfg.tokens, cfg.hidden, device=device, dtype=torch.bfloat16, generator=gen)
    chunks = list(x.chunk(cfg.microbatches))

    def eager() -> None:
        started = time.perf_counter()
        forward(layers, list(chunks), comm)
        CLOCK.issue_s += time.perf_counter() - started
        sync(device)

    if mode != "decode_graphs":
        return eager
    if device.type != "cuda":
        raise SystemExit("decode_graphs needs CUDA")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(3):
            forward(layers, list(chunks), comm)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward(layers, list(chunks), comm)

    def replay() -> None:
        started = time.perf_counter()
        graph.replay()
        CLOCK.issue_s += time.perf_counter() - started
        sync(device)

    return replay


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def config_for(mode: str, args: argparse.Namespace) -> Config:
    decode = mode.startswith("decode")
    return Config(
        layers=args.layers, hidden=args.hidden, heads=args.heads, experts=args.experts, topk=args.topk,
        expert_ffn=args.expert_ffn, batch=args.decode_batch if decode else args.prefill_batch,
        seq=1 if decode else args.prefill_seq, kv_len=args.kv_len, decode=decode,
        microbatches=2 if mode == "prefill_overlap" else 1, host_routing=mode == "decode_hostsync",
    )


def profile_mode(step: Callable[[], None], mode: str, args: argparse.Namespace, rank: int, tag: str = "") -> None:
    """1 wait + 1 warm-up + ``--steps`` profiled steps; the Chrome trace goes to <outdir>/<mode><tag>_rank<N>."""
    out = Path(args.outdir) / f"{mode}{tag}_rank{rank}.json.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(
        activities=acts,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=args.steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out)),
        record_shapes=True,
    ) as prof:
        for _ in range(args.steps + 2):
            step()
            prof.step()
    print(f"[rank {rank}] {mode}: wrote {out} ({out.stat().st_size} bytes)", flush=True)


def timed_steps(step: Callable[[], None], steps: int, host: dict[str, list[float]] | None = None) -> list[float]:
    """Wall ms of ``steps`` steps (each ends with a device sync and is an NVTX range ``step``), after a barrier.
    ``host`` gets per step the ms spent before the closing sync (``issue_ms``) and in all-reduce calls
    (``call_ms``)."""
    dist.barrier()
    times: list[float] = []
    for _ in range(steps):
        CLOCK.call_s = CLOCK.issue_s = 0.0
        t0 = time.perf_counter()
        with nvtx_range("step"):
            step()
        times.append((time.perf_counter() - t0) * 1e3)
        if host is not None:
            host.setdefault("issue_ms", []).append(CLOCK.issue_s * 1e3)
            host.setdefault("call_ms", []).append(CLOCK.call_s * 1e3)
    return times


def run_facts(cfg: Config, mode: str, rank: int) -> dict[str, Any]:
    return {"rank": rank, "world": dist.get_world_size(), "mode": mode,
            "phase": "decode" if cfg.decode else "prefill", **asdict(cfg), "tokens": cfg.tokens,
            "graphs": mode == "decode_graphs",
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "nccl": nccl_version()}


def write_truth(args: argparse.Namespace, name: str, truth: dict[str, Any]) -> None:
    if args.truth_dir:
        path = Path(args.truth_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(truth, indent=1) + "\n")


def time_mode(step: Callable[[], None], cfg: Config, mode: str, args: argparse.Namespace, rank: int) -> None:
    """Wall time of ``--steps`` steps, no profiler; median printed."""
    times = timed_steps(step, args.steps)
    median = statistics.median(times)
    tag = "" if args.comm else " (comm off)"
    print(f"[rank {rank}] {mode}{tag}: median step {median:.3f} ms over {len(times)} steps", flush=True)
    write_truth(args, f"{mode}{'' if args.comm else '_nocomm'}_rank{rank}.json",
                {**run_facts(cfg, mode, rank), "comm": args.comm, "step_ms": times, "step_ms_median": median})


def time_ab(steps: dict[bool, Callable[[], None]], cfg: Config, mode: str, args: argparse.Namespace,
            rank: int) -> None:
    """``--ab-rounds`` rounds, each timing ``--ab-steps`` steps with the all-reduces, then as many without, in the
    same processes: (with − without) per round, free of launch-to-launch differences (CPU placement, clocks)."""
    rounds = []
    for r in range(args.ab_rounds):
        host_with: dict[str, list[float]] = {}
        host_without: dict[str, list[float]] = {}
        with_comm = timed_steps(steps[True], args.ab_steps, host_with)
        without = timed_steps(steps[False], args.ab_steps, host_without)
        rounds.append({"comm_step_ms": with_comm, "nocomm_step_ms": without,
                       "comm_median_ms": statistics.median(with_comm),
                       "nocomm_median_ms": statistics.median(without),
                       "comm_issue_ms": host_with["issue_ms"], "comm_call_ms": host_with["call_ms"],
                       "nocomm_issue_ms": host_without["issue_ms"]})
        print(f"[rank {rank}] {mode} round {r}: median step {rounds[-1]['comm_median_ms']:.3f} ms with, "
              f"{rounds[-1]['nocomm_median_ms']:.3f} ms without the all-reduces", flush=True)
    write_truth(args, f"{mode}_ab_rank{rank}.json", {**run_facts(cfg, mode, rank), "rounds": rounds})


def nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def init_distributed() -> tuple[int, torch.device]:
    """Join the torchrun process group (or a 1-rank group when started with plain python)."""
    for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                         ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
        os.environ.setdefault(key, default)
    local = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), device


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", nargs="+", choices=MODES, required=True, help="one or more modes, run in order")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="profiled steps, or timed steps with --no-profile")
    p.add_argument("--warmup", type=int, default=3, help="untimed, unprofiled steps before")
    p.add_argument("--outdir", default="traces", help="where <mode>_rank<N>.json.gz go")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="time steps, no profiler")
    p.add_argument("--comm-off", dest="comm", action="store_false", help="skip the all-reduces")
    p.add_argument("--truth-dir", help="with --no-profile: write <mode>[_nocomm]_rank<N>.json step times")
    p.add_argument("--ab-rounds", type=int, default=0,
                   help="after profiling (or instead of --no-profile timing): this many rounds of --steps timed "
                        "steps with, then without the all-reduces, in the same processes (<mode>_ab_rank<N>.json)")
    p.add_argument("--ab-steps", type=int, default=30, help="timed steps per --ab-rounds half")
    p.add_argument("--ab-profile-both", action="store_true",
                   help="with --ab-rounds: also profile the other variant (<mode>_nocomm_rank<N>.json.gz)")
    p.add_argument("--pin-cpus", type=int, default=0, metavar="N",
                   help="pin local rank r to CPUs [r*N, (r+1)*N) of those allowed (host-bound steps vary less)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--expert-ffn", type=int, default=2048, help="each expert's hidden size (split over ranks)")
    p.add_argument("--prefill-batch", type=int, default=8, help="sequences per prefill step (even for overlap)")
    p.add_argument("--prefill-seq", type=int, default=2048)
    p.add_argument("--decode-batch", type=int, default=64)
    p.add_argument("--kv-len", type=int, default=1024)
    return p.parse_args(argv)


def pin_cpus(per_rank: int) -> None:
    """Keep this rank's threads on its own ``per_rank`` CPUs (no migration, no sharing with the other ranks)."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    allowed = sorted(os.sched_getaffinity(0))
    mine = allowed[local * per_rank:(local + 1) * per_rank]
    if len(mine) == per_rank:
        os.sched_setaffinity(0, mine)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.pin_cpus:
        pin_cpus(args.pin_cpus)
    rank, device = init_distributed()
    world = dist.get_world_size()
    if args.heads % world or args.expert_ffn % world:
        raise SystemExit(f"--heads {args.heads} and --expert-ffn {args.expert_ffn} must divide by {world}")
    if rank == 0:
        print(f"world {world}, torch {torch.__version__}, nccl {nccl_version()}, device "
              f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
              f"grouped_mm {grouped_mm_supported(device)}, nvtx package {_nvtx_pkg is not None}", flush=True)
    try:
        for mode in args.mode:
            cfg = config_for(mode, args)
            torch.manual_seed(0)
            step = build_step(cfg, mode, args.comm, device)
            for _ in range(args.warmup):
                step()
            if args.profile:
                profile_mode(step, mode, args, rank)
            if args.ab_rounds:
                other = build_step(cfg, mode, not args.comm, device)
                for _ in range(args.warmup):
                    other()
                if args.profile and args.ab_profile_both:
                    profile_mode(other, mode, args, rank, "_nocomm" if args.comm else "_comm")
                time_ab({args.comm: step, not args.comm: other}, cfg, mode, args, rank)
                del other
            elif not args.profile:
                time_mode(step, cfg, mode, args, rank)
            del step
            if device.type == "cuda":
                torch.cuda.empty_cache()
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
