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
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # the add+RMSNorm then runs as eager ops (several kernels)
    triton = None

TRUTH: dict[str, Any] = {}  # what a maker knows by construction, for --facts

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
        self.fused_norm = True  # False: the add+RMSNorm as eager ops (what torch.compile sees and fuses)
        self.experts = 0
        self.topk = 2
        self.nvtx = False  # True: an NVTX range `decode` per pass and `layer_<i>` per layer (examples/impact_ab.py)

    def use_moe(self, experts: int, expert_ffn: int, topk: int, device: torch.device) -> None:
        """Replace each SwiGLU MLP by a router (top-``topk`` of ``experts``) and a per-expert Python loop.

        Every expert runs on every token, weighted by its (mostly zero) combine weight: the loop launches the same
        kernels whatever the routing, with no host sync, so it is CUDA-graph capturable and its kernel count is
        fixed by construction (what an eager per-expert loop without a device-to-host read looks like).
        """
        g = torch.Generator(device=device).manual_seed(2)
        hidden = self.layers[0]["qkv"].shape[0]

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16) * shape[-2] ** -0.5

        self.experts, self.topk = experts, topk
        for p in self.layers:
            del p["gate_up"], p["down"]
            p["router"] = w(hidden, experts)
            p["w13"] = [w(hidden, 2 * expert_ffn) for _ in range(experts)]
            p["w2"] = [w(expert_ffn, hidden) for _ in range(experts)]

    def _reduce(self, x: torch.Tensor) -> None:
        if self.allreduce:
            dist.all_reduce(x)

    def _norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.fused_norm:
            return add_rmsnorm(x, residual, weight)
        residual.add_(x)
        xf = residual.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: int, n_decode: int) -> torch.Tensor:
        """The first ``n_decode`` tokens decode against the KV cache; the rest are one prefill chunk (causal)."""
        tokens = q.shape[0]
        parts = []
        if n_decode:
            parts.append(F.scaled_dot_product_attention(q[:n_decode].unsqueeze(2), self.k[i][:n_decode],
                                                        self.v[i][:n_decode]).squeeze(2))
        if n_decode < tokens:
            qp, kp, vp = (t[n_decode:].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            parts.append(F.scaled_dot_product_attention(qp, kp, vp, is_causal=True).squeeze(0).transpose(0, 1))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _moe(self, x: torch.Tensor, p: dict) -> torch.Tensor:
        probs = torch.softmax((x @ p["router"]).float(), dim=-1)
        topw, topi = torch.topk(probs, self.topk, dim=-1)
        combine = torch.zeros_like(probs).scatter_(1, topi, topw / topw.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e in range(self.experts):  # the per-expert loop: the same 5 kernels per expert
            gate, up = (x @ p["w13"][e]).chunk(2, dim=-1)
            out.addcmul_((F.silu(gate) * up) @ p["w2"][e], combine[:, e:e + 1])
        return out

    def forward(self, x: torch.Tensor, residual: torch.Tensor, n_decode: int | None = None) -> torch.Tensor:
        """One pass; ``x`` is [tokens, hidden], ``residual`` updated in place.

        ``n_decode``: how many of the tokens (the first ones) are decode tokens, one per sequence, attending to the
        KV cache; the rest are a prefill chunk. Default: all decode when ``tokens`` equals the cache's batch, else
        all prefill (one sequence).
        """
        tokens = x.shape[0]
        if n_decode is None:
            n_decode = tokens if tokens == self.k[0].shape[0] else 0
        if self.nvtx:
            torch.cuda.nvtx.range_push("decode")
        for i, p in enumerate(self.layers):
            if self.nvtx:
                torch.cuda.nvtx.range_push(f"layer_{i}")
            q, k, v = (x @ p["qkv"]).view(tokens, 3, self.heads, self.head_dim).unbind(1)
            a = self._attend(q, k, v, i, n_decode)
            o = a.reshape(tokens, -1) @ p["o"]
            self._reduce(o)
            x = self._norm(o, residual, p["n1"])
            if self.experts:
                m = self._moe(x, p)
            else:
                gate, up = (x @ p["gate_up"]).chunk(2, dim=-1)
                m = (F.silu(gate) * up) @ p["down"]
            self._reduce(m)
            x = self._norm(m, residual, p["n2"])
            if self.nvtx:
                torch.cuda.nvtx.range_pop()
        if self.nvtx:
            torch.cuda.nvtx.range_pop()
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


def cbatch_schedule(steps: int, max_batch: int, chunk: int) -> list[tuple[int, int, int]]:
    """A continuous-batching scheduler's steps, by construction: (decode tokens, prefill tokens, prompts finished).

    Requests (prompts of 64-384 tokens) arrive in bursts during the first two thirds of the steps; each step fills a
    budget of ``chunk`` prefill tokens from the queue (chunked prefill: a long prompt spans steps, short ones share a
    step) next to that step's decode tokens, one per running sequence; a prompt whose last piece was prefilled samples
    its first token in that step and decodes from the next one on, for 8-16 steps. No more than ``max_batch`` run.
    """
    prompts = [384, 96, 160, 64, 320, 128, 96, 200]
    running = [3, 5, 4, 6]  # decode steps left per running sequence
    queue: list[int] = []  # prompt tokens left to prefill per waiting request
    out = []
    for i in range(steps):
        if i < steps * 2 // 3:
            for _ in range((1, 2, 0, 1, 3, 0)[i % 6]):
                queue.append(prompts[(i + len(queue)) % len(prompts)])
        budget, n_chunk, done = chunk, 0, 0
        while queue and budget and len(running) + done < max_batch:
            take = min(budget, queue[0])
            n_chunk, budget, queue[0] = n_chunk + take, budget - take, queue[0] - take
            if queue[0] == 0:
                queue.pop(0)
                done += 1
        out.append((len(running), n_chunk, done))
        running = [r - 1 for r in running if r > 1] + [8 + (i * 5 + k) % 9 for k in range(done)]
    return out


def make_cbatch(args: argparse.Namespace, device: torch.device) -> Callable[[int], None]:
    """Step ``i`` of a continuous-batching serving loop: the scheduler's token ids (host → device), an embedding
    gather, one forward over the decode tokens and the step's prefill tokens together (the prefill tokens attend
    causally among themselves, as one chunk), the LM head on the rows that sample (decode tokens + the last token of
    each prompt finished in this step), a greedy argmax, and the host reading the sampled tokens."""
    model = Decoder(args.layers, args.hidden, args.heads, args.ffn, args.kv_len, args.batch, False, device)
    g = torch.Generator(device=device).manual_seed(1)
    embed = torch.randn(args.vocab, args.hidden, generator=g, device=device, dtype=torch.bfloat16)
    head = torch.randn(args.hidden, args.vocab, generator=g, device=device, dtype=torch.bfloat16) * args.hidden**-0.5
    sched = cbatch_schedule(args.passes, args.batch, args.chunk)
    TRUTH["schedule"] = [{"decode_tokens": d, "prefill_tokens": c, "prompts_finished": f} for d, c, f in sched]
    host = torch.Generator().manual_seed(3)

    def one(i: int) -> None:
        n_decode, n_chunk, done = sched[i % len(sched)]
        ids = torch.randint(0, args.vocab, (n_decode + n_chunk,), generator=host).to(device)
        h = F.embedding(ids, embed)
        out = model.forward(h, torch.zeros_like(h), n_decode=n_decode)
        rows = torch.cat([out[:n_decode], out[-done:]]) if done else out[:n_decode]
        torch.argmax(rows @ head, dim=-1).tolist()  # the scheduler reads the sampled tokens

    return one


def make_graph(args: argparse.Namespace, device: torch.device) -> Callable[[int], None]:
    """The decode pass (with ``--sample``: embedding, 8 layers, LM head, argmax) captured once in a CUDA graph;
    each pass is one replay."""
    eager = make_decode(args, device)[0]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            eager(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        eager(0)
    torch.cuda.synchronize()
    return lambda i: graph.replay()


def make_compiled(args: argparse.Namespace, device: torch.device) -> Callable[[int], None]:
    """The decode pass with the decoder's forward through ``torch.compile`` (Inductor, default mode: no CUDA graphs);
    the add+RMSNorm is written as eager ops there so Inductor generates (and fuses) it."""
    one, model = make_decode(args, device)
    model.fused_norm = False
    model.forward = torch.compile(model.forward, dynamic=False)  # type: ignore[method-assign]
    return one


def make_moe(args: argparse.Namespace, device: torch.device) -> Callable[[int], None]:
    one, model = make_decode(args, device)
    model.use_moe(args.experts, args.expert_ffn, args.topk, device)
    return one


@contextlib.contextmanager
def rng(name: str) -> Iterator[None]:
    """An NVTX range (nsys) and a ``record_function`` of the same name (Kineto's ``user_annotation``)."""
    torch.cuda.nvtx.range_push(name)
    with torch.profiler.record_function(name):
        yield
    torch.cuda.nvtx.range_pop()


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

    ranges = args.shape == "train_ranges"
    mark = rng if ranges else (lambda name: contextlib.nullcontext())

    def one(i: int) -> None:
        with mark("forward"):
            h = x
            for b in model:
                h = h + b(h)
            loss = F.cross_entropy(head(h), y)
        with mark("backward"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with mark("optimizer"):
            opt.step()
        loss.item()

    return one


def make_hf(args: argparse.Namespace, device: torch.device) -> Callable[[int], None]:
    """HF transformers ``generate`` (greedy, exactly ``--passes`` new tokens) of a randomly initialised Llama built
    from a config (no download): one prefill forward over the prompt, then ``--passes`` − 1 decode forwards."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.heads, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt_len), device=device,
                           generator=torch.Generator(device=device).manual_seed(4))
    TRUTH["transformers"] = __import__("transformers").__version__

    def one(i: int) -> None:
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.passes,
                                 min_new_tokens=args.passes, do_sample=False, pad_token_id=0)
        assert out.shape[1] == args.prompt_len + args.passes, out.shape

    return one


@contextlib.contextmanager
def capture(args: argparse.Namespace) -> Iterator[None]:
    """The PyTorch profiler (no schedule, no steps), a cudaProfilerStart/Stop range, or nothing."""
    if args.kineto:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts, with_stack=args.with_stack) as prof:
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


def structure_truth(args: argparse.Namespace) -> dict[str, Any]:
    """What the captured part holds, by construction: passes (steps), layers per pass, what runs once per pass."""
    sample = ["embedding gather", "LM head GEMM", "argmax"]
    layer = ["QKV GEMM", "SDPA", "out-proj GEMM", "add+RMSNorm", "gate/up GEMM", "SiLU*mul", "down GEMM",
             "add+RMSNorm"]
    t: dict[str, Any] = {"layers_per_pass": args.layers, "layer": layer}
    if args.shape in ("decode", "graph", "compile", "moe"):
        t["passes"] = args.passes
        t["once_per_pass"] = sample if args.sample else []
        t["host_gap_before_each_pass_ms"] = args.gap_ms if args.sync or args.gap_ms else 0.0
        t["host_sync_before_each_pass"] = args.sync
    if args.shape == "moe":
        t["layer"] = layer[:4] + ["router GEMM", "softmax", "top-k", "combine weights (sum, div, zeros, scatter, "
                                  "cast)", "zeros (output)"] + [f"expert {e}: gate/up GEMM, SiLU, mul, down GEMM, "
                                                                "addcmul" for e in range(args.experts)] + layer[-1:]
        t["per_expert_loop"] = {"experts": args.experts, "kernels_per_expert": 5, "every_expert_runs": True}
    if args.shape == "graph":
        t["cuda_graph"] = "the whole pass (embedding … argmax when sampled) is one torch.cuda.CUDAGraph replay"
    if args.shape == "compile":
        t["layer"] = "Inductor-generated: GEMMs (extern mm), SDPA, fused Triton kernels for norm/activation"
        t["compiled"] = "Decoder.forward through torch.compile (default mode, no CUDA graphs); embedding, LM head " \
                        "and argmax stay eager"
    if args.shape == "serve":
        t["passes"] = 1 + args.passes
        t["pass_kinds"] = ["prefill"] + ["decode"] * args.passes
        t["once_per_pass"] = []
    if args.shape == "cbatch":
        t["passes"] = args.passes
        t["once_per_pass"] = ["token ids host->device copy", "embedding gather", "zeros (residual)",
                              "LM head GEMM (+ a cat of the sampled rows when a prompt finishes)", "argmax",
                              "device->host copy of the tokens (host sync)"]
        t["attention"] = "decode rows: SDPA against the cache slice [:decode_tokens]; the step's prefill tokens: one " \
                         "causal SDPA over them, then a cat of both (steps without prefill: the decode SDPA only)"
        t["host_gap_before_each_pass_ms"] = args.gap_ms
    if args.shape in ("train", "train_ranges"):
        t["layers_per_pass"] = args.layers
        t["layer"] = ["LayerNorm", "Linear", "GELU", "Linear", "residual add"]
        t["once_per_pass"] = ["cross-entropy", "backward of it all", "AdamW step (foreach)", "loss.item() host sync"]
        t["passes"] = args.passes
    if args.shape == "train_ranges":
        t["passes"] = args.captured_warmup + args.passes
        t["ranges"] = {"warmup": f"iterations 0-{args.captured_warmup - 1}",
                       "benchmark_loop": f"iterations {args.captured_warmup}-{args.captured_warmup + args.passes - 1}",
                       "per_iteration": ["forward", "backward", "optimizer"],
                       "as": "NVTX (nsys) and record_function (Kineto user_annotation) of the same names"}
    if args.shape == "hf_generate":
        t["passes"] = args.passes
        t["pass_kinds"] = ["prefill"] + ["decode"] * (args.passes - 1)
        t["layer"] = "HF LlamaDecoderLayer: RMSNorm, q/k/v/o projections, rotary, SDPA, RMSNorm, gate/up/down MLP"
        t["once_per_pass"] = ["embedding", "rotary cos/sin", "final RMSNorm", "LM head", "logits processing + argmax",
                              "stopping-criteria check (host sync)"]
        t["generate_calls"] = 1
    return t


SHAPES = ("decode", "train", "serve", "cbatch", "compile", "hf_generate", "moe", "graph", "train_ranges")
MAKERS: dict[str, Callable[[argparse.Namespace, torch.device], Callable[[int], None]]] = {
    "decode": lambda a, d: make_decode(a, d)[0], "train": make_train, "serve": make_serve, "cbatch": make_cbatch,
    "compile": make_compiled, "hf_generate": make_hf, "moe": make_moe, "graph": make_graph,
    "train_ranges": make_train}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=SHAPES, required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--passes", type=int, default=12,
                   help="captured forward passes / training iterations / serving steps (hf_generate: new tokens)")
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
    p.add_argument("--experts", type=int, default=8, help="moe: experts per layer")
    p.add_argument("--expert-ffn", type=int, default=1408, help="moe: an expert's hidden size")
    p.add_argument("--topk", type=int, default=2, help="moe: experts per token")
    p.add_argument("--chunk", type=int, default=256, help="cbatch: prefill chunk tokens")
    p.add_argument("--prompt-len", type=int, default=64, help="hf_generate: prompt tokens per sequence")
    p.add_argument("--captured-warmup", type=int, default=2, help="train_ranges: iterations in the `warmup` range")
    p.add_argument("--with-stack", action="store_true", help="Kineto: record Python stacks")
    p.add_argument("--kineto", help="write a gzipped PyTorch-profiler trace here")
    p.add_argument("--cuda-profiler-range", action="store_true", help="capture between cudaProfilerStart/Stop")
    p.add_argument("--facts", help="write the constructed structure (JSON) here")
    args = p.parse_args()

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if args.allreduce:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    one = MAKERS[args.shape](args, device)
    serve = args.shape == "serve"
    for i in range(args.warmup):
        one(i % 2 + 1 if serve else i)  # serve: warm the decode path, and the prefill below
    if serve:
        one(0)
    if args.shape == "cbatch":  # every step's shapes once
        for i in range(args.passes):
            one(i)
    # before the capture: `nsys profile -c cudaProfilerApi` ends the process at cudaProfilerStop
    if args.facts:
        keys = ("shape", "layers", "passes", "warmup", "gap_ms", "hidden", "heads", "ffn", "batch", "kv_len",
                "prefill_tokens", "allreduce", "sample", "vocab", "sync", "experts", "expert_ffn", "topk", "chunk",
                "prompt_len", "captured_warmup", "with_stack")
        facts = {k: getattr(args, k) for k in keys}
        facts.update(TRUTH)
        facts["structure"] = structure_truth(args)
        facts["torch"] = torch.__version__
        facts["gpu"] = torch.cuda.get_device_name()
        Path(args.facts).write_text(json.dumps(facts, indent=1) + "\n")
    torch.cuda.synchronize()
    gaps = args.gap_ms / 1e3 if args.shape not in ("train", "train_ranges", "hf_generate") else 0.0
    with capture(args):
        if args.shape == "hf_generate":
            one(0)
        elif args.shape == "train_ranges":
            with rng("warmup"):
                for i in range(args.captured_warmup):
                    one(i)
            with rng("benchmark_loop"):
                for i in range(args.passes):
                    one(i)
        else:
            for i in range(args.passes + (1 if serve else 0)):
                if args.sync:
                    torch.cuda.synchronize()
                if gaps:
                    time.sleep(gaps)  # the scheduler's host work: the GPU is idle
                one(i)
        torch.cuda.synchronize()
    if args.allreduce:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
