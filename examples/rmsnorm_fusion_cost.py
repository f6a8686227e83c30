"""GPU time of a residual add + RMSNorm after an all-reduce: eager PyTorch's decomposed ops vs fused kernels.

One GPU, hidden 4096, bf16, at decode (64 tokens) and prefill (4096, 16384 tokens) sizes. Three ways to compute
``r = x + residual; y = rmsnorm(r) * w``:

* ``decomposed``: as ``examples/moe_tp.py`` writes it (add, float copy, pow, mean, add eps, rsqrt, mul, bf16
  copy, mul weight: 9 kernels);
* ``add_fused_norm``: the add, then ``F.rms_norm`` (one fused norm kernel in PyTorch ≥ 2.8);
* ``fused_add_norm``: one Triton kernel doing both (as vLLM's ``fused_add_rms_norm`` / FlashInfer's
  ``FusedAddRMSNormKernel``: reads x and residual, writes the new residual and the normed output).

Per variant: the median over timed iterations of the summed kernel durations (torch.profiler, CUPTI) and of the
kernel count. Used as the measured basis of the ``allreduce_not_fused`` finding (docs/FINDINGS.md); output in
``fixtures/truth/rmsnorm_fusion_h200.json``. Run: ``python3 examples/rmsnorm_fusion_cost.py OUT.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

H, EPS, ITERS = 4096, 1e-6, 30


@triton.jit
def _fused_add_rmsnorm(x_ptr, res_ptr, w_ptr, out_ptr, n: tl.constexpr, eps: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, n)
    r = tl.load(x_ptr + row * n + cols).to(tl.float32) + tl.load(res_ptr + row * n + cols).to(tl.float32)
    tl.store(res_ptr + row * n + cols, r.to(tl.bfloat16))
    y = r * tl.rsqrt(tl.sum(r * r, 0) / n + eps) * tl.load(w_ptr + cols).to(tl.float32)
    tl.store(out_ptr + row * n + cols, y.to(tl.bfloat16))


def decomposed(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    r = x + res
    rf = r.float()
    return (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + EPS)).to(r.dtype) * w


def add_fused_norm(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x + res, (H,), w, EPS)


def fused_add_norm(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _fused_add_rmsnorm[(x.shape[0],)](x, res, w, out, H, EPS, num_warps=8)
    return out


def measure(fn, tokens: int) -> dict:
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    w = torch.rand(H, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        fn(x, res.clone(), w)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(ITERS):
            with torch.profiler.record_function(f"iter{i}"):
                fn(x, res, w)
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/t.json")
        with open(f"{tmp}/t.json") as fh:
            trace = json.load(fh)["traceEvents"]
    events = sorted((e for e in trace if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    per_iter = len(events) // ITERS
    totals = [sum(e["dur"] for e in events[i * per_iter:(i + 1) * per_iter]) for i in range(ITERS)]
    kernels: dict[str, list[float]] = {}
    for e in events:
        kernels.setdefault(e["name"][:90], []).append(e["dur"])
    return {"kernels_per_call": per_iter, "gpu_us_median": round(statistics.median(totals), 2),
            "gpu_us_min": round(min(totals), 2),
            "kernels": {n: round(statistics.median(d), 2) for n, d in kernels.items()}}


def main() -> None:
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "hidden": H, "dtype": "bfloat16", "iterations": ITERS, "results": {}}
    for tokens in (64, 4096, 16384):
        out["results"][str(tokens)] = {f.__name__: measure(f, tokens)
                                       for f in (decomposed, add_fused_norm, fused_add_norm)}
    text = json.dumps(out, indent=1)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
