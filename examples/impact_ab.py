"""Measured A/B cases for the impact validation (issue 27, docs/METHOD_IMPACTS.md): one GPU, one process per case.

Each case runs the same decode (or prefill) two ways, A (as found) and B (the fix applied), and measures the step-time
change **unprofiled, in one process, in alternating rounds** (A, B, B, A, A, B, ...: clocks, allocator and CPU state
are the same for both halves). Then it records a Kineto trace of a few steps of A and of B (``--kineto-dir``), and,
run under ``nsys profile -c cudaProfilerApi --capture-range-end=repeat``, an nsys capture of A (range 1) and B
(range 2) (``--nsys-range``). Every profiled step is timed too, so the profiler's own cost per step is measured
beside each capture.

Cases (``--case``; ``--list`` prints them):

* ``graph_*``: eager decode (A) vs one ``torch.cuda.CUDAGraph`` replay of exactly that step (B): the graph is
  captured around the same Python function A calls, so the kernels are identical. Dense (the small decoder of
  ``structure_shapes.py``: hidden 2048, or the big one: hidden 4096) and MoE (8 experts, per-expert loop).
* ``norm_*``: the add + RMSNorm as eager ops (A, 9 kernels) vs one Triton kernel (B), eager or inside CUDA graphs.
* ``sync_*``: a per-token host read of the sampled tokens *before* the host's per-step work (A: the GPU idles while
  the host works) vs the read *after* it (B: the host works while the GPU runs the step).
* ``profcost``: no B; the same eager decode timed unprofiled, under Kineto (CPU + CUDA), Kineto with stacks, and
  (under nsys) nsys ``-t cuda`` or ``-t cuda,nvtx`` with an NVTX range per layer (``--nvtx``): the profiler's own
  host cost per recorded event.

  python3 examples/impact_ab.py --case graph_dense_b8_l8 --out truth.json --kineto-dir kineto/
  nsys profile -s none --cpuctxsw=none -t cuda -c cudaProfilerApi --capture-range-end=repeat -o ab \\
      python3 examples/impact_ab.py --case graph_dense_b8_l8 --nsys-range --out nsys_times.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import structure_shapes as ss

SMALL = {"hidden": 2048, "heads": 16, "ffn": 5632, "kv_len": 1024}
BIG = {"hidden": 4096, "heads": 32, "ffn": 14336, "kv_len": 2048}
CASES: dict[str, dict[str, Any]] = {
    "graph_dense_b8_l8": {"kind": "graph", **SMALL, "batch": 8, "layers": 8},
    "graph_dense_b8_l16": {"kind": "graph", **SMALL, "batch": 8, "layers": 16},
    "graph_dense_b64_l8_big": {"kind": "graph", **BIG, "batch": 64, "layers": 8},
    "graph_moe_b4_l8": {"kind": "graph", **SMALL, "batch": 4, "layers": 8, "experts": 8},
    "graph_moe_b32_l4": {"kind": "graph", **SMALL, "batch": 32, "layers": 4, "experts": 8},
    "norm_eager_big": {"kind": "norm", **BIG, "batch": 64, "layers": 8},
    "norm_graph_big": {"kind": "norm", **BIG, "batch": 64, "layers": 8, "graphs": True},
    "norm_prefill_big": {"kind": "norm", **BIG, "batch": 64, "layers": 4, "prefill": 4096},
    "sync_graph_small": {"kind": "sync", **SMALL, "batch": 8, "layers": 8, "graphs": True, "host_ms": 1.0},
    "sync_eager_big": {"kind": "sync", **BIG, "batch": 64, "layers": 8, "host_ms": 1.0},
    "profcost": {"kind": "profcost", **SMALL, "batch": 8, "layers": 8},
}


def build(cfg: dict[str, Any], fused_norm: bool, nvtx: bool = False) -> Callable[[], torch.Tensor]:
    """One sampled decode pass (embedding → layers → LM head → argmax) or, with ``prefill``, one prefill forward;
    returns the function and leaves the tokens in the tensor it returns."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args = argparse.Namespace(layers=cfg["layers"], hidden=cfg["hidden"], heads=cfg["heads"], ffn=cfg["ffn"],
                              kv_len=cfg["kv_len"], batch=cfg["batch"], allreduce=False, sample=True, vocab=32000)
    torch.manual_seed(0)
    model = ss.Decoder(args.layers, args.hidden, args.heads, args.ffn, args.kv_len, args.batch, False, dev)
    model.fused_norm = fused_norm
    if cfg.get("experts"):
        model.use_moe(cfg["experts"], 1408, 2, dev)
    model.nvtx = nvtx  # an NVTX range per layer (what nsys -t cuda,nvtx then records)
    g = torch.Generator(device=dev).manual_seed(1)
    embed = torch.randn(args.vocab, args.hidden, generator=g, device=dev, dtype=torch.bfloat16)
    head = torch.randn(args.hidden, args.vocab, generator=g, device=dev, dtype=torch.bfloat16) * args.hidden**-0.5
    tokens = torch.zeros(args.batch, dtype=torch.long, device=dev)
    if cfg.get("prefill"):
        xp = torch.randn(cfg["prefill"], args.hidden, device=dev, dtype=torch.bfloat16)
        rp = torch.zeros_like(xp)

        def prefill() -> torch.Tensor:
            out = model.forward(xp, rp)
            torch.argmax(out[-args.batch:] @ head, dim=-1, out=tokens)
            return tokens

        return prefill
    residual = torch.zeros(args.batch, args.hidden, device=dev, dtype=torch.bfloat16)

    def decode() -> torch.Tensor:
        h = torch.nn.functional.embedding(tokens, embed)
        residual.zero_()
        out = model.forward(h, residual)
        torch.argmax(out @ head, dim=-1, out=tokens)
        return tokens

    return decode


def as_graph(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``fn`` captured once in a CUDA graph (after warm-up on a side stream); each call is one replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            out = fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


def variants(cfg: dict[str, Any]) -> dict[str, Callable[[], None]]:
    """The case's step functions: ``a`` (as found) and ``b`` (the fix); each step ends with the host holding the
    sampled tokens (a read, so a host sync) as a decode loop does."""
    kind = cfg["kind"]
    if kind in ("graph", "profcost"):
        eager = build(cfg, fused_norm=True, nvtx=bool(cfg.get("nvtx")))
        out = {"a": lambda: eager().tolist() and None}
        if kind == "graph":
            graph = as_graph(eager)  # around exactly the function A calls: the same kernels
            out["b"] = lambda: graph().tolist() and None
        return out
    if kind == "norm":
        fa, fb = build(cfg, fused_norm=False), build(cfg, fused_norm=True)
        if cfg.get("graphs"):
            fa, fb = as_graph(fa), as_graph(fb)
        return {"a": lambda: fa().tolist() and None, "b": lambda: fb().tolist() and None}
    if kind == "sync":
        fn = build(cfg, fused_norm=True)
        if cfg.get("graphs"):
            fn = as_graph(fn)
        host_s = cfg["host_ms"] / 1e3

        def host_work() -> None:  # the scheduler's per-step work (a fixed busy wait: no sleep granularity)
            end = time.perf_counter() + host_s
            while time.perf_counter() < end:
                pass

        def a() -> None:
            fn().tolist()  # the host waits for the tokens, then works: the GPU idles meanwhile
            host_work()

        def b() -> None:
            t = fn()
            host_work()  # the host works while the GPU runs the step
            t.tolist()

        return {"a": a, "b": b}
    raise ValueError(kind)


def timed(fn: Callable[[], None], steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def kineto(fn: Callable[[], None], steps: int, path: Path | None, with_stack: bool = False) -> dict[str, Any]:
    """``steps`` steps under the PyTorch profiler (CPU + CUDA, no schedule), timed; the trace gzipped to ``path``."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, with_stack=with_stack) as prof:
        ms = timed(fn, steps)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        events = json.loads(raw.read_text())["traceEvents"]
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with raw.open("rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
    cats: dict[str, int] = {}
    for e in events:
        cats[str(e.get("cat"))] = cats.get(str(e.get("cat")), 0) + 1
    return {"step_ms": [round(x, 4) for x in ms], "step_ms_median": round(statistics.median(ms), 4),
            "events_per_step": {k: round(v / steps, 1) for k, v in sorted(cats.items())
                                if k in ("kernel", "cpu_op", "cuda_runtime", "cuda_driver", "python_function",
                                         "gpu_memcpy", "gpu_memset", "user_annotation")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES))
    p.add_argument("--list", action="store_true")
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds (A, B, B, A, ...)")
    p.add_argument("--steps", type=int, default=25, help="timed steps per round and variant")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--profiled-steps", type=int, default=6, help="steps per Kineto / nsys capture")
    p.add_argument("--out", help="JSON with the timings")
    p.add_argument("--kineto-dir", help="write <dir>/a/rank0.json.gz and <dir>/b/rank0.json.gz")
    p.add_argument("--nsys-range", action="store_true",
                   help="capture A then B, each between cudaProfilerStart/Stop (nsys --capture-range-end=repeat)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nvtx", action="store_true", help="profcost: an NVTX range per layer and per pass")
    args = p.parse_args()
    if args.list:
        print(json.dumps(CASES, indent=1))
        return
    cfg = dict(CASES[args.case], nvtx=args.nvtx)
    if args.tiny:  # a CPU smoke test of the script itself
        cfg.update(hidden=256, heads=4, ffn=512, kv_len=64, prefill=min(cfg.get("prefill", 0), 128))
    fns = variants(cfg)
    for fn in fns.values():
        for _ in range(args.warmup):
            fn()
    torch.cuda.synchronize()
    out: dict[str, Any] = {"case": args.case, "config": cfg, "gpu": torch.cuda.get_device_name(),
                           "torch": torch.__version__, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.nsys_range:
        for name, fn in fns.items():
            torch.cuda.cudart().cudaProfilerStart()
            ms = timed(fn, args.profiled_steps)
            torch.cuda.cudart().cudaProfilerStop()
            out[f"nsys_{name}_step_ms"] = [round(x, 4) for x in ms]
            out[f"nsys_{name}_step_ms_median"] = round(statistics.median(ms), 4)
        after = {name: timed(fn, args.steps) for name, fn in fns.items()}  # unprofiled, in the nsys process
        for name, ms in after.items():
            out[f"after_capture_{name}_step_ms_median"] = round(statistics.median(ms), 4)
    else:
        order = [("a", "b"), ("b", "a")]
        rounds = []
        for r in range(args.rounds):
            for name in order[r % 2] if "b" in fns else ("a",):
                rounds.append({"round": r, "variant": name, "step_ms": [round(x, 4) for x in
                                                                        timed(fns[name], args.steps)]})
        out["rounds"] = rounds
        for name in fns:
            every = [x for rd in rounds if rd["variant"] == name for x in rd["step_ms"]]
            out[f"{name}_step_ms_median"] = round(statistics.median(every), 4)
            out[f"{name}_round_medians"] = [round(statistics.median(rd["step_ms"]), 4) for rd in rounds
                                            if rd["variant"] == name]
        if "b" in fns:
            per_round = [statistics.median(rb["step_ms"]) - statistics.median(ra["step_ms"])
                         for ra, rb in zip((rd for rd in rounds if rd["variant"] == "a"),
                                           (rd for rd in rounds if rd["variant"] == "b"), strict=False)]
            out["change_ms"] = round(out["b_step_ms_median"] - out["a_step_ms_median"], 4)
            out["change_ms_per_round"] = [round(x, 4) for x in per_round]
        kdir = Path(args.kineto_dir) if args.kineto_dir else None
        for name, fn in fns.items():
            out[f"kineto_{name}"] = kineto(fn, args.profiled_steps, kdir / name / "rank0.json.gz" if kdir else None)
        if cfg["kind"] == "profcost":  # Kineto with Python stacks, not kept
            out["kineto_stack_a"] = kineto(fns["a"], args.profiled_steps, None, with_stack=True)
            out["unprofiled_after_a_step_ms_median"] = round(statistics.median(timed(fns["a"], args.steps)), 4)
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: v for k, v in out.items() if "median" in k or k == "change_ms"}))


if __name__ == "__main__":
    main()
