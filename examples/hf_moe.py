"""HF transformers MoE models with random weights (no download) profiled with the PyTorch profiler: real eager MoE
traces for docs/MOE.md (module names from ``with_stack=True`` confirm the stages).

For each configuration that this transformers version has (Mixtral, Qwen2-MoE with a shared expert, DeepSeek-V3),
a small model is built from its config, run on one GPU and profiled: a prefill (``--batch`` × ``--seq`` tokens,
``--steps`` profiled forward passes after a warm-up, ``prof.step()`` between them) and a decode (one token per
sequence against the prefill's KV cache). Traces: ``<outdir>/hf_<model>_<phase>.json.gz``; a ``versions.json``
beside them records torch / transformers / GPU.

    python examples/hf_moe.py --outdir traces            # every model and phase
    python examples/hf_moe.py --models mixtral --phases prefill
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

MODELS = ("mixtral", "qwen2_moe", "deepseek_v3")
PHASES = ("prefill", "decode")


def _config(name: str, layers: int) -> Any:
    """A small config of the model family (random weights), or None when transformers lacks it."""
    import transformers as tf

    common = {"vocab_size": 4096, "hidden_size": 1024, "num_hidden_layers": layers, "num_attention_heads": 16,
              "num_key_value_heads": 4, "max_position_embeddings": 4096}
    if name == "mixtral" and hasattr(tf, "MixtralConfig"):
        return tf.MixtralConfig(**common, intermediate_size=1408, num_local_experts=8, num_experts_per_tok=2)
    if name == "qwen2_moe" and hasattr(tf, "Qwen2MoeConfig"):
        return tf.Qwen2MoeConfig(**common, intermediate_size=2816, moe_intermediate_size=704, num_experts=16,
                                 num_experts_per_tok=4, shared_expert_intermediate_size=2816,
                                 decoder_sparse_step=1, mlp_only_layers=[])
    if name == "deepseek_v3" and hasattr(tf, "DeepseekV3Config"):
        return tf.DeepseekV3Config(**common, intermediate_size=2816, moe_intermediate_size=512, n_routed_experts=16,
                                   num_experts_per_tok=4, n_shared_experts=1, n_group=4, topk_group=2,
                                   first_k_dense_replace=0, q_lora_rank=256, kv_lora_rank=128,
                                   qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64)
    return None


def _profile(fn: Any, steps: int, out: Path) -> None:
    """``steps`` profiled calls of ``fn`` (one warm-up first), exported as gzip'd Chrome-trace JSON."""
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    sched = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)

    def save(prof: torch.profiler.profile) -> None:  # the cycle's trace, when the schedule hands it over
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            with raw.open("rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)

    with torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=save, with_stack=True,
                                record_shapes=True) as prof:
        for _ in range(steps + 1):
            fn()
            torch.cuda.synchronize()
            prof.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--outdir", type=Path, default=Path("traces"))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    try:
        import transformers
    except ImportError:
        print("transformers is not installed here: nothing to do")
        return
    args.outdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    made: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                            "gpu": torch.cuda.get_device_name(0), "traces": []}
    for name in args.models:
        try:
            _run_model(name, args, made)
        except Exception as exc:  # one family failing (an older transformers) leaves the others
            print(f"{name}: failed: {type(exc).__name__}: {exc}", flush=True)
        torch.cuda.empty_cache()  # the model is gone with _run_model's frame
    (args.outdir / "versions.json").write_text(json.dumps(made, indent=1))


def _run_model(name: str, args: argparse.Namespace, made: dict[str, Any]) -> None:
    """Build, run and profile one model family (module doc)."""
    import transformers

    cfg = _config(name, args.layers)
    if cfg is None:
        print(f"{name}: transformers {transformers.__version__} has no config for it; skipped")
        return
    cfg._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    with torch.inference_mode():
        cache = model(ids, use_cache=True).past_key_values
        for phase in args.phases:
            out = args.outdir / f"hf_{name}_{phase}.json.gz"
            if phase == "prefill":
                _profile(lambda: model(ids, use_cache=False), args.steps, out)
            else:
                step_ids = ids[:, -1:]
                pos = torch.full((args.batch, 1), args.seq, device="cuda")

                def decode(step_ids: torch.Tensor = step_ids, pos: torch.Tensor = pos) -> None:
                    cache.crop(-1) if cache.get_seq_length() > args.seq else None  # the same length each step
                    model(step_ids, past_key_values=cache, position_ids=pos, use_cache=True)
                _profile(decode, args.steps, out)
            made["traces"].append({"file": out.name, "model": name, "phase": phase, "layers": args.layers,
                                   "batch": args.batch, "seq": args.seq, "steps": args.steps,
                                   "bytes": os.path.getsize(out)})
            print(f"{out.name}: {os.path.getsize(out)} bytes", flush=True)


if __name__ == "__main__":
    main()
