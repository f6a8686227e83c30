"""One-GPU traces of step/layer shapes the corpus lacks, with no NVTX ranges and no ``ProfilerStep`` marks.

Each shape's structure is known by construction, so a tool's step / layer detection can be checked against it
(tests/data/structure_expectations.toml; fixtures/README.md says how the committed traces were made).

Shapes:
  decode  ``--passes`` forward passes of ``--layers`` identical decoder layers on ``--batch`` tokens (one new token
          per sequence against a fixed ``--kv-len`` KV cache). A layer: QKV GEMM → SDPA → out-proj → [all-reduce] →
          add+RMSNorm → gate/up GEMM → SiLU·mul → down GEMM → [all-reduce] → add+RMSNorm, the add+RMSNorm one
          separate Triton kernel (``fused_add_rmsnorm_kernel``). No embedding, no sampling (``--sample`` adds an
          embedding gather before and an LM head + argmax after each pass). Between passes the host synchronizes and
          sleeps ``--gap-ms`` (a scheduler's work), so the GPU is idle there; ``--no-sync --gap-ms 0`` queues the passes
          back to back instead.
  train   ``--passes`` training iterations of a ``--layers``-block MLP model: forward, loss, backward, AdamW step,
          ``loss.item()`` (one host sync per iteration, as a logging loop has). Single GPU, no communication.
  serve   one prefill pass over ``--prefill-tokens`` tokens, then ``--passes`` decode passes, each after a
          ``--gap-ms`` host gap, all through the same ``--layers`` layers as ``decode``.

``--allreduce`` puts a ``torch.distributed`` all-reduce (NCCL, world size 1) where tensor parallelism has one;
on one GPU NCCL may launch no kernel for it (the trace then shows none: that is what one GPU can show).

Capture: the PyTorch profiler with no schedule and no ``prof.step()`` (``--kineto OUT.json.gz``), or, with
``--cuda-profiler-range``, only the part between cudaProfilerStart/Stop for ``nsys profile -c cudaProfilerApi``.
Warm-up passes (``--warmup``) run before the capture starts.

  python examples/structure_shapes.py --shape decode --kineto decode.json.gz
  nsys profile -s none --cpuctxsw=none -t cuda,nvtx -c cudaProfilerApi -o decode \\
      python examples/structure_shapes.py --shape decode --cuda-profiler-range
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # the add+RMSNorm then runs as eager ops (several kernels)
    triton = None

if triton is not None:

    @triton.jit
    def fused_add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
        """out = RMSNorm(x + res) * w; res = x + res (in place), one row per program."""
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        s = x + r
        tl.store(res_ptr + row * n_cols + cols, s.to(res_ptr.dtype.element_ty), mask=mask)
        var = tl.sum(s * s, axis=0) / n_cols
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = s * tl.rsqrt(var + eps) * w
        tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """residual += x; return RMSNorm(residual) * weight — one kernel with Triton, else eager ops."""
    if triton is not None and x.is_cuda:
        out = torch.empty_like(x)
        n = x.shape[-1]
        fused_add_rmsnorm_kernel[(x.numel() // n,)](x, residual, weight, out, n, eps,
                                                    BLOCK=triton.next_power_of_2(n))
        return out
    residual.add_(x)
    xf = residual.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class Decoder:
    """``layers`` identical decoder layers (attention against a fixed KV cache + SwiGLU MLP), bf16."""

    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, kv_len: int, batch: int,
                 allreduce: bool, device: torch.device) -> None:
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16) * shape[0] ** -0.5

        self.heads, self.head_dim, self.allreduce = heads, hidden // heads, allreduce
        self.layers = [{"qkv": w(hidden, 3 * hidden), "o": w(hidden, hidden), "gate_up": w(hidden, 2 * ffn),
                        "down": w(ffn, hidden), "n1": torch.ones(hidden, device=device, dtype=torch.bfloat16),
                        "n2": torch.ones(hidden, device=device, dtype=torch.bfloat16)} for _ in range(layers)]
        kv = (batch, heads, kv_len, self.head_dim)
        self.k = [torch.randn(*kv, generator=g, device=device, dtype=torch.bfloat16) for _ in range(layers)]
        self.v = [torch.randn(*kv, generator=g, device=device, dtype=torch.bfloat16) for _ in range(layers)]

    def _reduce(self, x: torch.Tensor) -> None:
        if self.allreduce:
            dist.all_reduce(x)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """One pass; ``x`` is [tokens, hidden] (decode: one token per sequence), ``residual`` updated in place."""
        tokens = x.shape[0]
        for i, p in enumerate(self.layers):
            q, k, v = (x @ p["qkv"]).view(tokens, 3, self.heads, self.head_dim).unbind(1)
            if tokens == self.k[i].shape[0]:  # decode: the new token attends to the cache
                a = F.scaled_dot_product_attention(q.unsqueeze(2), self.k[i], self.v[i]).squeeze(2)
            else:  # prefill: causal attention over the tokens as one sequence
                a = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                                   v.transpose(0, 1).unsqueeze(0), is_causal=True)
                a = a.squeeze(0).transpose(0, 1)
            o = a.reshape(tokens, -1) @ p["o"]
            self._reduce(o)
            x = add_rmsnorm(o, residual, p["n1"])
            gate, up = (x @ p["gate_up"]).chunk(2, dim=-1)
            m = (F.silu(gate) * up) @ p["down"]
            self._reduce(m)
            x = add_rmsnorm(m, residual, p["n2"])
        return x


def make_decode(args: argparse.Namespace, device: torch.device) -> tuple[Callable[[int], None], Decoder]:
    """A function running pass ``i`` (decode passes only) and the model.

    With ``--sample`` each pass also embeds the previous pass's tokens (an embedding gather) and ends with the LM head
    GEMM and a greedy argmax: kernels that occur once per pass, the next pass depending on them on the GPU only.
    """
    model = Decoder(args.layers, args.hidden, args.heads, args.ffn, args.kv_len, args.batch, args.allreduce, device)
    x = torch.randn(args.batch, args.hidden, device=device, dtype=torch.bfloat16)
    residual = torch.zeros_like(x)
    g = torch.Generator(device=device).manual_seed(1)
    embed = torch.randn(args.vocab, args.hidden, generator=g, device=device, dtype=torch.bfloat16)
    head = torch.randn(args.hidden, args.vocab, generator=g, device=device, dtype=torch.bfloat16) * args.hidden**-0.5
    tokens = torch.zeros(args.batch, dtype=torch.long, device=device)

    def one(i: int) -> None:
        if not args.sample:
            model.forward(x, residual)
            return
        h = F.embedding(tokens, embed)
        residual.zero_()
        out = model.forward(h, residual)
        torch.argmax(out @ head, dim=-1, out=tokens)

    return one, model


def make_serve(args: argparse.Namespace, device: torch.device) -> Callable[[int], None]:
    """Pass 0 is a prefill over ``--prefill-tokens`` tokens, later passes decode ``--batch`` tokens."""
    decode, model = make_decode(args, device)
    xp = torch.randn(args.prefill_tokens, args.hidden, device=device, dtype=torch.bfloat16)
    rp = torch.zeros_like(xp)

    def one(i: int) -> None:
        if i == 0:
            model.forward(xp, rp)
        else:
            decode(i)

    return one


def make_train(args: argparse.Namespace, device: torch.device) -> Callable[[int], None]:
    """One training iteration of a ``--layers``-block residual MLP (LayerNorm → Linear → GELU → Linear)."""
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.LayerNorm(args.hidden), torch.nn.Linear(args.hidden, args.ffn),
                                  torch.nn.GELU(), torch.nn.Linear(args.ffn, args.hidden))
              for _ in range(args.layers)]
    model = torch.nn.ModuleList(blocks).to(device)
    head = torch.nn.Linear(args.hidden, 16).to(device)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    x = torch.randn(args.batch, args.hidden, device=device)
    y = torch.randint(0, 16, (args.batch,), device=device)

    def one(i: int) -> None:
        h = x
        for b in model:
            h = h + b(h)
        loss = F.cross_entropy(head(h), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()

    return one


@contextlib.contextmanager
def capture(args: argparse.Namespace) -> Iterator[None]:
    """The PyTorch profiler (no schedule, no steps), a cudaProfilerStart/Stop range, or nothing."""
    if args.kineto:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            yield
        torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            with raw.open("rb") as src, gzip.open(args.kineto, "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
    elif args.cuda_profiler_range:
        torch.cuda.cudart().cudaProfilerStart()
        yield
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    else:
        yield


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=("decode", "train", "serve"), required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--passes", type=int, default=12, help="captured forward passes / training iterations")
    p.add_argument("--warmup", type=int, default=3, help="passes before the capture starts")
    p.add_argument("--gap-ms", type=float, default=3.0, help="host gap (GPU idle) before each pass")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--ffn", type=int, default=5632)
    p.add_argument("--batch", type=int, default=32, help="sequences (decode) / rows (train)")
    p.add_argument("--kv-len", type=int, default=1024)
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--sample", action="store_true", help="decode/serve: embedding gather + LM head + argmax per pass")
    p.add_argument("--vocab", type=int, default=32000, help="with --sample: vocabulary size")
    p.add_argument("--no-sync", dest="sync", action="store_false",
                   help="do not synchronize before each pass (with --gap-ms 0: passes back to back on the GPU)")
    p.add_argument("--allreduce", action="store_true", help="NCCL all-reduce (world size 1) where TP has one")
    p.add_argument("--kineto", help="write a gzipped PyTorch-profiler trace here")
    p.add_argument("--cuda-profiler-range", action="store_true", help="capture between cudaProfilerStart/Stop")
    p.add_argument("--facts", help="write the constructed structure (JSON) here")
    args = p.parse_args()

    device = torch.device("cuda", torch.cuda.current_device())
    if args.allreduce:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    if args.shape == "decode":
        one = make_decode(args, device)[0]
    elif args.shape == "serve":
        one = make_serve(args, device)
    else:
        one = make_train(args, device)
    for i in range(args.warmup):
        one(i % 2 + 1 if args.shape == "serve" else i)  # serve: warm the decode path, and the prefill below
    if args.shape == "serve":
        one(0)
    torch.cuda.synchronize()
    gaps = args.gap_ms / 1e3 if args.shape != "train" else 0.0
    with capture(args):
        for i in range(args.passes + (1 if args.shape == "serve" else 0)):
            if args.sync:
                torch.cuda.synchronize()
            if gaps:
                time.sleep(gaps)  # the scheduler's host work: the GPU is idle
            one(i)
        torch.cuda.synchronize()
    if args.facts:
        keys = ("shape", "layers", "passes", "warmup", "gap_ms", "hidden", "heads", "ffn", "batch", "kv_len",
                "prefill_tokens", "allreduce", "sample", "vocab", "sync")
        facts = {k: getattr(args, k) for k in keys}
        facts["torch"] = torch.__version__
        facts["gpu"] = torch.cuda.get_device_name()
        Path(args.facts).write_text(json.dumps(facts, indent=1) + "\n")
    if args.allreduce:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
