"""MoE layers (analysis/moe.py, docs/MOE.md): stages by rule, per-layer sub-bucket times that add up, exposed
dispatch / combine, expert-load imbalance, the MoE findings and their rendering.

Expectations on the real traces were counted from the raw Kineto JSON (``traceEvents`` with ``cat == "kernel"``,
times ``ts * 1000`` ns from the written decimals) with the plain-Python interval merge below, not from the tool."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

import traceanalyzer as ta
from traceanalyzer.analysis.moe import LAYER_COLUMNS
from traceanalyzer.classify import classify_names
from traceanalyzer.classify.rules import parse_rules
from traceanalyzer.model.buckets import MOE_STAGES
from traceanalyzer.model.errors import RulesError
from traceanalyzer.testing.synth_moe import MoeEpOptions, write_moe_ep

REPO = Path(__file__).resolve().parents[1]
FOREIGN = REPO.parent / "shared" / "data" / "foreign"
DEEPSEEK = FOREIGN / "deepseekv3_train_dualpipe_ep64_h800_rank0.json.gz"
GPTOSS = FOREIGN / "vllm_gptoss_b200_tp8_rank0.json.gz"
MOE_TP = REPO / "fixtures" / "kineto" / "tp2_prefill_serial"


def _raw_kernels(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]  # the written µs digits, exactly
    return [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]


def _span(e: dict) -> tuple[int, int]:
    return round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(spans: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in _merge(spans))


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of union(a) − union(b)."""
    b = _merge(b)
    total = 0
    for s, e in _merge(a):
        covered = sum(max(0, min(e, be) - max(s, bs)) for bs, be in b)
        total += (e - s) - covered
    return total


def _adds_up(layers) -> None:
    parts = layers[[f"{s}_exclusive_ns" for s in MOE_STAGES]].to_numpy(np.int64).sum(axis=1)
    assert (parts == layers["moe_ns"].to_numpy(np.int64)).all()
    for s in MOE_STAGES:  # an exclusive part never exceeds its stage's own union
        assert (layers[f"{s}_exclusive_ns"] <= layers[f"{s}_ns"]).all()


# -- the taxonomy ----------------------------------------------------------------------------------------------------

STACK_NAMES = {  # one name of each stack the issue names, from the labelled corpora (tests/data, ../shared/kernels)
    "_fused_moe_kernel": "expert",  # vLLM / SGLang Triton fused_moe
    "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int)": "dispatch",
    "void vllm::moe::count_and_sort_expert_tokens_kernel<int>(int const*, int*, int*, int)": "dispatch",
    "topk_gating_softmax_kernel": "router",
    "void vllm::moe::topkGatingSoftmax<4, 128, 4, 16, int>(float const*, bool const*, float*, int, int*)": "router",
    "void vllm::moe::grouped_topk_kernel<float>(float*)": "router",
    "void vllm::shuffleInputRowsKernel<__nv_bfloat16>(__nv_bfloat16 const*, __nv_bfloat16*, long const*)": "dispatch",
    "void vllm::moe_sum_kernel<c10::BFloat16, 2>(c10::BFloat16*, c10::BFloat16 const*, int)": "combine",
    "pre_reorder_triton_kernel": "dispatch",  # SGLang EP MoE runner
    "post_reorder_triton_kernel": "combine",
    "compute_seg_indptr_triton_kernel": "dispatch",
    "deepep_post_reorder_triton_kernel": "combine",
    "void moe::dev::activation::activationKernel<moe::dev::activation::KernelParams<cutlass::bfloat16_t> >("
    "moe::dev::activation::KernelParams<cutlass::bfloat16_t>)": "expert",  # FlashInfer trtllm-gen MoE
    "moe_sum_reduce_warp_per_token_vec_kernel": "combine",  # SGLang
    "void tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel<__nv_bfloat16, __nv_fp4_e2m1, 2, true>"
    "(__nv_bfloat16 const*, __nv_fp4_e2m1*, int)": "dispatch",  # FlashInfer / TRT-LLM cutlass MoE
    "void tensorrt_llm::kernels::cutlass_kernels::finalizeMoeRoutingKernel<__nv_bfloat16, __nv_bfloat16, 1>"
    "(__nv_bfloat16 const*, __nv_bfloat16*)": "combine",
    "void tensorrt_llm::kernels::cutlass_kernels::doActivationKernel<": "expert",
    "void dpsk::gemm::fp8_gemm_kernel<4096u, 7168u, 128u, 112u, 128u, 6u, 128u, 128u, 1u, (dpsk::gemm::GemmType)2>("
    "__nv_bfloat16*, float*, int*, unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st)": "expert",  # DeepGEMM
    "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu": "expert",  # Triton matmul_ogs (gpt-oss)
    "_combined_routing_compute": "router",  # gpt-oss routing
    "_finalize_matmul": "combine",
    "void moe::dev::routing::routingIndicesHistogramKernel<moe::dev::routing::routingRenormalize::KernelParams<"
    "__nv_bfloat16, __nv_bfloat16, 128, true> >(moe::dev::routing::routingRenormalize::KernelParams<__nv_bfloat16, "
    "__nv_bfloat16, 128, true>)": "router",
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*)": "dispatch",
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int const*, int*)": "dispatch",
    "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*)": "combine",
    "void deep_ep::internode_ll::dispatch<false, 3, 10, 7168>(void*, float*, int*)": "dispatch",
    "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*)": None,  # staged by position
    "nvjet_tst_64x8_64x16_4x1_v_bz_TNT": None,  # a dense GEMM: staged only by the ranges it runs in
}


def test_rules_name_the_stage_of_each_stack():
    classes = classify_names(list(STACK_NAMES))
    assert {n: c.moe_stage for n, c in zip(STACK_NAMES, classes, strict=True)} == STACK_NAMES
    assert classes[0].to_dict()["moe_stage"] == "expert"


def test_a_bad_moe_stage_is_bad_input():
    with pytest.raises(RulesError, match="moe_stage 'gate' is not one of router"):
        parse_rules('[[rule]]\nid = "x"\nmatch = "a"\nbucket = "other"\nmoe_stage = "gate"\n', "mine.toml")


# -- the constructed expert-parallel fixture --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ep(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_ep")
    paths = {"balanced": write_moe_ep(root / "balanced.sqlite"),
             "hot": write_moe_ep(root / "hot.sqlite", MoeEpOptions(hot_rank=1, hot_factor=2.0)),
             "serial": write_moe_ep(root / "serial.sqlite", MoeEpOptions(overlap=False))}
    return {k: ta.summary([p]) for k, p in paths.items()}


def _ids(s) -> set[str]:
    return {f.id for f in s.findings}


def test_balanced_overlapped_fixture(ep):
    s = ep["balanced"]
    assert len(s.moe.devices) == 4 and s.moe.ranks == [0, 1, 2, 3]
    for d in s.moe.devices:
        t = d.layers
        assert d.layer_source == "nvtx:layer ranges" and len(t) == 12  # 3 steps × 4 layers
        _adds_up(t)
        # synth_moe defaults: router 10 µs, permute 8, 2 shared GEMMs of 80 (each hides a 60 µs dispatch /
        # combine), expert 300, finalize 9: union 487 µs
        row = t.iloc[0]
        assert row["moe_ns"] == 487_000 and row["kernels"] == 8
        assert (row["router_ns"], row["expert_ns"], row["shared_expert_ns"]) == (10_000, 300_000, 160_000)
        assert (row["dispatch_ns"], row["combine_ns"]) == (68_000, 69_000)  # permute + dispatch; finalize + combine
        assert (row["dispatch_exclusive_ns"], row["combine_exclusive_ns"]) == (8_000, 9_000)
        assert (row["dispatch_comm_ns"], row["dispatch_exposed_ns"]) == (60_000, 0)
        assert (row["combine_comm_ns"], row["combine_exposed_ns"]) == (60_000, 0)
        assert (row["expert_fp4_ns"], row["expert_gemm_ns"]) == (300_000, 300_000)
        assert (row["permute_ns"], row["unpermute_ns"]) == (8_000, 9_000)
    assert (s.moe.imbalance["extra_ns"] == 0).all() and len(s.moe.imbalance) == 12
    assert not _ids(s) & {"moe_exposed_dispatch_combine", "moe_expert_imbalance", "moe_routing_overhead"}


def test_hot_rank_fixture(ep):
    s = ep["hot"]
    imb = s.moe.imbalance
    assert set(imb["hot_rank"]) == {1} and (imb["extra_ns"] == 300_000).all()  # 2 × 300 µs against 300 µs
    assert (imb["expert_max_ns"] - imb["expert_min_ns"] == 300_000).all()
    first = imb.iloc[0]  # each of the 3 others waits 300 µs for rank 1 in the first layer's combine
    assert (first["combine_wait_ns"], first["dispatch_wait_ns"]) == (900_000, 0)
    cold = next(d for d in s.moe.devices if d.rank == 0).layers.iloc[0]
    # the combine lasts 300 + 60 µs, of which the second shared GEMM (80 µs) hides 80
    assert (cold["combine_comm_ns"], cold["combine_exposed_ns"]) == (360_000, 280_000)
    hot = next(d for d in s.moe.devices if d.rank == 1).layers.iloc[0]
    assert (hot["expert_ns"], hot["combine_exposed_ns"]) == (600_000, 0)
    found = {f.id: f for f in s.findings}
    f = found["moe_expert_imbalance"]
    assert f.evidence["hot_rank"] == 1 and f.impact_ns_per_step == 4 * 300_000 and f.evidence["hot_layers"] == 12
    e = found["moe_exposed_dispatch_combine"]
    assert e.evidence["rank"] in (0, 2, 3) and e.evidence["exposed_by_stage_ns_per_step"]["dispatch"] == 0
    assert e.impact_ns_per_step == 280_000 + 3 * 300_000  # layer 0: 280 µs; layers 1-3 also wait the 20 µs carry
    for d in s.moe.devices:
        _adds_up(d.layers)


def test_serial_fixture_exposes_dispatch_and_combine(ep):
    s = ep["serial"]
    row = s.moe.devices[0].layers.iloc[0]
    assert (row["dispatch_exposed_ns"], row["combine_exposed_ns"]) == (60_000, 60_000)
    assert row["shared_expert_ns"] == 0 and row["moe_ns"] == 10_000 + 68_000 + 300_000 + 69_000
    f = next(f for f in s.findings if f.id == "moe_exposed_dispatch_combine")
    assert f.impact_ns_per_step == 4 * 120_000 and f.evidence["wait_ns_per_step"] == 0
    assert "moe_expert_imbalance" not in _ids(s)


def test_moe_outputs(ep, tmp_path):
    s = ep["hot"]
    out = s.to_json()["moe"]
    assert out["stages"] == list(MOE_STAGES) and out["ranks"] == [0, 1, 2, 3]
    assert out["devices"][1]["per_step_median"]["expert_ns"] == 4 * 600_000
    assert set(out["devices"][0]["layers"][0]) == set(LAYER_COLUMNS)
    assert out["imbalance"][0]["hot_rank"] == 1
    from traceanalyzer.render.html import render_html
    from traceanalyzer.render.terminal import make_console, print_summary

    con = make_console(file=None)
    with con.capture() as cap:
        print_summary(s, con)
    text = cap.get()
    assert "MoE layers per step" in text and "combine exposed" in text
    page = render_html(s)
    assert 'id="moe"' in page and "Expert time, rank × layer" in page
    db = tmp_path / "moe.db"
    ta.export(s, db)
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT rank, layer, moe_ns, expert_ns FROM moe_layers WHERE step = 0 AND layer = 0 "
                         "ORDER BY rank").fetchall()
        stages = dict(c.execute("SELECT moe_stage, COUNT(*) FROM kernels WHERE rank = 0 GROUP BY moe_stage"))
    assert rows[1] == (1, 0, 787_000, 600_000) and len(rows) == 4
    # rank 0's 12 layers: routing, expandInputRows + dispatch, shared GEMM x 2, grouped GEMM, combine + finalize
    assert stages == {None: 12, "router": 12, "dispatch": 24, "shared_expert": 24, "expert": 12, "combine": 24}


def test_no_moe_no_key():
    from traceanalyzer.testing.synth import make_trace

    t = make_trace(kernels=[(0, 10_000, 0, 7, "nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "gemm", "cublas"),
                            (12_000, 20_000, 0, 7, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication",
                             "allreduce")])
    s = ta.summary(t)
    assert s.moe is None and "moe" not in s.to_json()


# -- real traces -------------------------------------------------------------------------------------------------------

def _needs(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared is only beside the development checkout)")


def test_vllm_gptoss_mxfp4_tp8():
    _needs(GPTOSS)
    raw = _raw_kernels(GPTOSS)
    spans = {k: [_span(e) for e in raw if re.search(p, e["name"])] for k, p in
             {"bmm": r"^bmm_", "routing": r"moe::dev::routing", "finalize": r"moe::dev::finalize"}.items()}
    # raw: 72 bmm_*MxE2m1* (2 per layer), 108 routing (3 per layer), 36 finalize, on one stream
    assert [len(v) for v in spans.values()] == [72, 108, 36]
    d = ta.summary([GPTOSS]).moe.devices[0]
    t = d.layers
    assert len(t) == 36 and d.layer_source == "collective_period" and (t["kernels"] == 9).all()
    _adds_up(t)
    assert int(t["expert_fp4_ns"].sum()) == _length(spans["bmm"]) == 5_178_036  # bmm sum 5,214,837: PDL overlap
    assert int(t["expert_ns"].sum()) == int(t["expert_gemm_ns"].sum()) == 5_178_036
    assert int(t["router_ns"].sum()) == _length(spans["routing"]) == 442_340
    assert int(t["combine_ns"].sum()) == _length(spans["finalize"]) == 253_471
    # quantize_with_block_size and two torch kernels launched inside vllm::moe_forward, 3 per layer
    assert d.stage_sources == {"name": 216, "position": 0, "range": 108}
    assert int(t["dispatch_comm_ns"].sum() + t["combine_comm_ns"].sum()) == 0  # TP8: no expert-parallel comm
    assert not {f.id for f in ta.summary([GPTOSS]).findings} & {"moe_routing_overhead", "moe_expert_imbalance"}


def test_deepseek_v3_ep64_deepep():
    _needs(DEEPSEEK)
    raw = sorted(_raw_kernels(DEEPSEEK), key=lambda e: e["ts"])
    stream27 = [e for e in raw if e["args"]["stream"] == 27]
    ep = [e for e in stream27 if "dpsk::ep::" in e["name"]]
    # stream 27 in order: each bare cached_notify precedes the dispatch or combine it serves (4 + 8)
    dispatch, combine = [], []
    for i, e in enumerate(ep):
        served = next(x["name"] for x in ep[i:] if re.search(r"internode::(dispatch|combine)<", x["name"]))
        (dispatch if "dispatch" in (e["name"] if "cached_notify" not in e["name"] else served) else combine).append(e)
    # dispatch: 8 dispatch + 4 notify_dispatch + 4 get_dispatch_layout + 4 cached_notify; combine: 8 + 8 cached_notify
    assert (len(dispatch), len(combine)) == (20, 16)
    compute = [_span(e) for e in raw if "dpsk::ep::" not in e["name"]]
    s = ta.summary([DEEPSEEK])
    d = s.moe.devices[0]
    t = d.layers
    assert d.layer_source == "step" and len(t) == 1 and t["layer"].iloc[0] == -1
    _adds_up(t)
    row = t.iloc[0]
    assert row["dispatch_comm_ns"] == _length([_span(e) for e in dispatch]) == 48_757_000
    assert row["combine_comm_ns"] == _length([_span(e) for e in combine]) == 64_683_000
    assert row["dispatch_exposed_ns"] == _minus([_span(e) for e in dispatch], compute) == 1_640_000
    assert row["combine_exposed_ns"] == _minus([_span(e) for e in combine], compute) == 2_550_000
    grouped = [_span(e) for e in raw if re.search(r"dpsk::grouped_gemm::cuda::\w+::GemmKernel", e["name"])]
    assert len(grouped) == 140 and row["expert_fp8_ns"] == _length(grouped) == 69_258_000  # streams 7 and 23
    assert d.stage_sources["position"] == 12  # the bare cached_notify kernels
    # raw: every dpsk::ep kernel runs on stream 27; the grouped GEMMs on 7 (and 16 wgrad ones on 23)
    assert d.comm_streams == [27] and d.expert_streams == [7, 23]
    hidden = 1 - (row["dispatch_exposed_ns"] + row["combine_exposed_ns"]) / (row["dispatch_comm_ns"]
                                                                             + row["combine_comm_ns"])
    assert round(100 * hidden, 1) == 96.3
    # 96% of the all-to-all hides behind the other micro-batch: 4.19 ms of a 129 ms step, under the 5% threshold
    assert "moe_exposed_dispatch_combine" not in {f.id for f in s.findings}


def test_moe_tp_fixture_eager_moe_block():
    raw = _raw_kernels(MOE_TP / "rank0.json.gz")
    grouped = [_span(e) for e in raw if "GroupProblemShape" in e["name"]]
    gate = [_span(e) for e in raw if e["name"].startswith("nvjet_sm90_tst_32x128")]  # x @ w_router, N = 8 experts
    assert (len(grouped), len(gate)) == (24, 12)  # 2 × 4 layers × 3 steps; 1 per layer
    s = ta.summary([MOE_TP])
    d = s.moe.devices[0]
    t = d.layers
    assert d.layer_source == "nvtx:layer ranges" and len(t) == 12 and (t["kernels"] == 42).all()
    _adds_up(t)
    assert int(t["expert_gemm_ns"].sum()) == _length(grouped)
    softmax_topk = [_span(e) for e in raw if re.search(r"softmax_warp_forward|gatherTopK", e["name"])]
    assert int(t["router_ns"].sum()) == _length(gate + softmax_topk)
    # the index_add_ that scatters the expert outputs back is the combine (after the last expert GEMM)
    index_add = [_span(e) for e in raw if "indexFuncLargeIndex" in e["name"]]
    assert len(index_add) == 12 and int(t["unpermute_ns"].sum()) >= _length(index_add)
    assert "moe_routing_overhead" in {f.id for f in s.findings}


def test_all_to_all_by_position_and_notify_by_the_next_kernel():
    """NCCL all-to-all names no stage: before the layer's first expert kernel it is the dispatch, after it the
    combine; a DeepEP notify kernel takes the stage of the next dispatch / combine on its stream."""
    from traceanalyzer.classify import classified
    from traceanalyzer.testing.synth import make_trace

    a2a, gemm = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "_fused_moe_kernel"
    notify = "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*)"
    combine = "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*)"
    rows = []
    for layer in range(2):
        t0 = layer * 1_000_000
        rows += [(t0, t0 + 50_000, 0, 9, a2a, "other"), (t0 + 60_000, t0 + 260_000, 0, 7, gemm, "other"),
                 (t0 + 270_000, t0 + 300_000, 0, 9, notify, "other"),
                 (t0 + 300_000, t0 + 380_000, 0, 9, combine, "other"),
                 (t0 + 400_000, t0 + 450_000, 0, 9, a2a, "other")]
    ranges = [(layer * 1_000_000, layer * 1_000_000 + 500_000, "gpu_user_annotation", f"layer_{layer}", 0)
              for layer in range(2)]
    ranges += [(0, 2_000_000, "gpu_user_annotation", "ProfilerStep#1", 0)]
    # torch.distributed.all_to_all_single's annotation: the context pass makes its SendRecv kernels all_to_all
    ranges += [(t0, t0 + 50_000, "gpu_user_annotation", "nccl:all_to_all", 0) for layer in range(2)
               for t0 in (layer * 1_000_000, layer * 1_000_000 + 400_000)]
    t = ta.summary(classified(make_trace(kernels=rows, ranges=ranges)))
    layers = t.moe.devices[0].layers
    assert len(layers) == 2 and t.moe.devices[0].stage_sources == {"name": 4, "position": 6, "range": 0}
    # dispatch: the first SendRecv (50 µs); combine: notify + combine (30 + 80) and the last SendRecv (50)
    assert list(layers["dispatch_comm_ns"]) == [50_000, 50_000]
    assert list(layers["combine_comm_ns"]) == [160_000, 160_000]
    assert list(layers["expert_ns"]) == [200_000, 200_000]
    _adds_up(layers)


HF = REPO / "fixtures" / "kineto" / "moe_hf"  # examples/hf_moe.py on one H200, transformers 5.17, random weights


@pytest.mark.parametrize("name, block", [("mixtral_prefill", "MixtralSparseMoeBlock"),
                                         ("mixtral_decode", "MixtralSparseMoeBlock"),
                                         ("qwen2_moe_prefill", "Qwen2MoeSparseMoeBlock"),
                                         ("qwen2_moe_decode", "Qwen2MoeSparseMoeBlock")])
def test_hf_moe_blocks(name: str, block: str):
    """HF MoE models (grouped ``torch._grouped_mm`` experts, ``with_stack``): the kernels staged are exactly those
    launched inside the ``nn.Module: <block>`` frames (raw: launch call by correlation, cuda_runtime or
    cuda_driver, on the module's thread inside its [ts, ts + dur)), and no attention or norm kernel of the
    ``Qwen2Moe*`` modules around them."""
    path = HF / name / "rank0.json.gz"
    with gzip.open(path) as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    blocks = [e for e in events if e.get("cat") == "python_function" and e["name"].startswith(f"nn.Module: {block}")]
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    inside = [k for k in kernels if (c := calls.get(k["args"].get("correlation"))) is not None
              and any(b["tid"] == c["tid"] and b["ts"] <= c["ts"] < b["ts"] + b["dur"] for b in blocks)]
    assert len(blocks) == 8  # 4 layers x 2 profiled steps
    d = ta.summary([path]).moe.devices[0]
    t = d.layers
    assert len(t) == 8 and int(t["kernels"].sum()) == len(inside)
    assert d.stage_sources["name"] == 32  # 2 grouped GEMMs + 2 prepare_grouped_gemm_data per layer
    _adds_up(t)
    grouped = [_span(e) for e in inside if "GroupProblemShape" in e["name"]]
    assert len(grouped) == 16 and int(t["expert_gemm_ns"].sum()) == int(t["expert_bf16_ns"].sum()) == _length(grouped)
    # the router's gate GEMM (an nvjet GEMM, N = the expert count, in nn.Module: *TopKRouter) is the router's
    router = [e for e in events if e.get("cat") == "python_function" and "TopKRouter" in e["name"]]
    gate = [_span(k) for k in inside if k["name"].startswith("nvjet") and any(
        r["tid"] == calls[k["args"]["correlation"]]["tid"]
        and r["ts"] <= calls[k["args"]["correlation"]]["ts"] < r["ts"] + r["dur"] for r in router)]
    assert len(gate) == 8 and int(t["router_ns"].sum()) >= _length(gate)
    # the block's other cuBLAS kernels: Qwen2MoeMLP (the shared expert: gate, up, down projections) and
    # shared_expert_gate; Mixtral has none. In decode the down projection is split-K (+ splitKreduce) and the
    # 1-wide shared_expert_gate a dot_kernel + reduce_1Block_kernel.
    cublas = re.compile(r"^nvjet|splitKreduce|dot_kernel|reduce_1Block_kernel")
    shared = [_span(k) for k in inside if cublas.search(k["name"]) and _span(k) not in gate]
    assert len(shared) == {"qwen2_moe_prefill": 32, "qwen2_moe_decode": 48}.get(name, 0)
    assert int(t["shared_expert_ns"].sum()) == _length(shared)


def test_diff_attributes_the_moe_change_to_the_stages(ep):
    d = ta.diff(ep["balanced"], ep["hot"])
    rows = {r["stage"]: r for r in d.moe}
    assert list(rows) == [*MOE_STAGES, "moe"]
    assert sum(r["delta_ns"] for s, r in rows.items() if s != "moe") == rows["moe"]["delta_ns"]
    # per step, mean over the 4 ranks: rank 1's 4 expert GEMMs take 300 µs more each: +1.2 ms / 4
    assert rows["expert"]["delta_ns"] == 300_000 and rows["router"]["delta_ns"] == 0
    assert rows["combine"]["delta_ns"] > 0  # the others' combine waits for rank 1
    assert d.to_json()["moe"] == d.moe
    from traceanalyzer.render.diff import print_diff, render_diff_html
    from traceanalyzer.render.terminal import make_console

    assert "<h3>MoE stages</h3>" in render_diff_html(d)
    con = make_console(file=None)
    with con.capture() as cap:
        print_diff(d, con)
    assert "MoE stages" in cap.get()
    for s in ep.values():  # every side's representative step adds up
        for dev in s.moe.devices:
            m = dev.step_median()
            assert sum(m[f"{st}_exclusive_ns"] for st in MOE_STAGES) == m["moe_ns"]
