"""Kernel classifier: real labelled names, the TAXONOMY hard-case decisions, normalisation, rules, trace columns."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from traceanalyzer.classify import (
    BUCKETS,
    EXCLUSIVE_PRECEDENCE,
    classify_names,
    classify_trace,
    normalize_name,
    read_names,
    refine_with_context,
)
from traceanalyzer.classify.demangle import demangle
from traceanalyzer.model.errors import BadInputError, RulesError
from traceanalyzer.model.trace import StringPool, Table, Trace

DATA = Path(__file__).parent / "data"
LABEL_ALIASES = {"moe_gemm_other": "moe_gemm"}


def _one(name: str):
    return classify_names([name])[0]


def _accuracy(rows: list[dict[str, str]]) -> tuple[float, dict[str, float], list[str]]:
    got = classify_names([r["name"] for r in rows])
    total: Counter[str] = Counter()
    ok: Counter[str] = Counter()
    misses = []
    for row, cls in zip(rows, got, strict=True):
        expected = LABEL_ALIASES.get(row["bucket"], row["bucket"])
        total[expected] += 1
        if cls.bucket == expected:
            ok[expected] += 1
        else:
            misses.append(f"expected {expected}, got {cls.bucket} ({cls.rule}): {row['name'][:120]}")
    per_bucket = {b: ok[b] / total[b] for b in total}
    return sum(ok.values()) / sum(total.values()), per_bucket, misses


def _check_labelled(rows: list[dict[str, str]]) -> None:
    overall, per_bucket, misses = _accuracy(rows)
    print("\n".join(misses))
    assert overall >= 0.98, misses
    for bucket, acc in per_bucket.items():
        assert acc >= 0.95, (bucket, acc, misses)


# -- labelled real names --------------------------------------------------------------------------
def test_dev_names_accuracy(shared_data: Path) -> None:
    path = shared_data.parent / "kernels" / "kernel_names_dev.csv"
    if not path.exists():
        pytest.skip("kernel_names_dev.csv is absent")
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    assert len(rows) == 136
    _check_labelled(rows)


def test_researched_names_accuracy() -> None:
    """240+ names seen in public profiles/issues (source per row), none of them in the dev set."""
    rows = list(csv.DictReader((DATA / "kernel_names_extra.csv").open(encoding="utf-8")))
    assert len(rows) >= 150
    assert all(r["source"] for r in rows)
    assert {r["bucket"] for r in rows} <= set(BUCKETS)
    _check_labelled(rows)


# -- the hard-case decisions of TAXONOMY.md, one test each ----------------------------------------
def test_decision_01_allreduce_rmsnorm_fusion_is_communication_with_fused_ops() -> None:
    c = _one("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<"
             "(flashinfer::trtllm_allreduce_fusion::AllReduceFusionPattern)1, __nv_bfloat16, 4, false, false>"
             "(flashinfer::trtllm_allreduce_fusion::AllReduceFusionParams<__nv_bfloat16>)")
    assert (c.bucket, c.subbucket) == ("communication", "allreduce_fusion")
    assert c.fused[0] == "allreduce"
    norm = _one("void flashinfer::trtllm_allreduce::details::reduce_fusion::"
                "lamport_style_one_shot_all_reduce_norm_kernel<")
    assert norm.subbucket == "allreduce_fusion" and "rmsnorm" in norm.fused


def test_decision_02_collectives_are_communication_whatever_the_implementation() -> None:
    names = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
             "ncclSymkDevKernel_AllReduce", "void sglang::cross_device_reduce_1stage<__nv_bfloat16, 2>",
             "one_shot_all_reduce_kernel_optimized"]
    assert {c.bucket for c in classify_names(names)} == {"communication"}


def test_decision_03_sendrecv_subbucket_from_all_to_all_range() -> None:
    c = _one("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
    assert (c.bucket, c.subbucket) == ("communication", "sendrecv")
    trace = _context_trace([("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 0, 10)],
                           gpu_ranges=[("nccl:all_to_all", 0, 20)])
    out = refine_with_context(classify_trace(trace)).df("kernels")
    assert list(out["subbucket"]) == ["all_to_all"]
    assert list(out["rule"]) == ["context.all_to_all_range"]


def test_decision_04_inductor_names_are_other_even_when_they_say_allreduce_or_moe() -> None:
    names = ["triton_poi_fused_all_reduce_moe_align_0", "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0",
             "triton_per_fused_copy__mul_sum_0", "triton_poi_fused_cat_fp4_gemm_expert_1"]
    got = classify_names(names)
    assert [c.bucket for c in got] == ["other"] * 4
    assert got[1].subbucket == "norm"


def test_decision_05_generic_triton_attention_names_are_low_confidence() -> None:
    c = _one("_fwd_kernel_stage2")
    assert (c.bucket, c.confidence) == ("attention", "low")
    assert _one("_fwd_kernel_something_else").bucket == "other"


def test_decision_06_eager_expert_gemm_rebucketed_from_moe_range_only_without_grouped_kernels() -> None:
    nvjet = "nvjet_sm90_tst_64x32_64x16_1x2_h_bz_NNT"
    grouped = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<"
    assert _one(nvjet).bucket == "gemm"
    trace = _context_trace([(nvjet, 0, 10), (nvjet, 100, 110), (grouped, 120, 130), (nvjet, 300, 310)],
                           gpu_ranges=[("layers.0.mlp.experts", 0, 50), ("moe", 90, 200)])
    out = refine_with_context(classify_trace(trace)).df("kernels")
    # eager loop in a range without grouped GEMMs -> moe_gemm; router GEMM next to a grouped GEMM stays;
    # a GEMM outside any MoE range stays
    assert list(out["bucket"]) == ["moe_gemm", "gemm", "moe_gemm", "gemm"]


def test_decision_06_cpu_ranges_joined_by_correlation() -> None:
    nvjet = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"
    trace = _context_trace([(nvjet, 1000, 1010), (nvjet, 2000, 2010)], cpu_ranges=[("moe_block", 0, 50)],
                           launches=[(1, 10), (2, 500)])
    out = refine_with_context(classify_trace(trace)).df("kernels")
    assert list(out["bucket"]) == ["moe_gemm", "gemm"]


def test_decision_07_dense_fp4_gemm_is_gemm_with_fp4_precision() -> None:
    for name in ("gemm_Bfloat16_E2m1E2m1_Fp32_t128x128x128_s3_et128x128_m128x128x64_cga1x1x1_16dp256b_TN_transOut",
                 "DeviceGemmFp4GemmSm100",
                 "cutlass3x_sm100_bstensorop_s256x128x64gemm_ue4m3xe2m1_ue4m3xe2m1_f32_bf16_bf16_256x128x256_2x1x1_0"):
        c = _one(name)
        assert (c.bucket, c.precision) == ("gemm", "fp4"), name


def test_decision_08_deepgemm_and_trtllm_gen_decided_from_template_arguments() -> None:
    base = ("void deep_gemm::sm100_fp8_fp4_gemm_1d1d_impl<(cute::UMMA::Major)0, (cute::UMMA::Major)0, 128u, 128u, 0u, "
            "0u, 0u, 240u, 128u, 128u, 1u, 128u, 128u, 128u, 6u, 128u, 128u, 2u, true, 148u, true, "
            "(deep_gemm::GemmType){kind}, false, cutlass::float_e4m3_t, {b}, cutlass::bfloat16_t>")
    dense = _one(base.format(kind=0, b="cutlass::float_e4m3_t"))
    masked = _one(base.format(kind=2, b="cutlass::float_e4m3_t"))
    fp4 = _one(base.format(kind=1, b="cutlass::detail::float_e2m1_unpacksmem_t"))
    assert (dense.bucket, dense.precision) == ("gemm", "fp8")
    assert (masked.bucket, masked.precision) == ("moe_gemm", "fp8")
    assert (fp4.bucket, fp4.precision) == ("moe_fp4_gemm", "fp4")
    cut = _one("void deep_gemm::sm100_fp8_fp4_gemm_1d1d_impl<(cute::UMMA::Major)0, (cute::UMMA::Major)0, 1")
    assert (cut.bucket, cut.confidence) == ("gemm", "low")
    assert _one("bmm_E4m3_E4m3E4m3_Fp32_t128x128x128u2_s5_et64x128").bucket == "moe_gemm"
    mx = _one("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_Ab32_Bb32_Cb32_t128x8x512_s3_et128x8")
    assert (mx.bucket, mx.fp4_format) == ("moe_fp4_gemm", "mxfp4")
    nv = _one("bmm_E2m1_E2m1E2m1_Fp32_Ab16_Bb16_Cb16_t128x32x512u2_s4_et128x32_m128x32x64_c1x1x1_rM_TN")
    assert (nv.bucket, nv.fp4_format) == ("moe_fp4_gemm", "nvfp4")


def test_decision_09_grouped_gemm_over_attention_heads_is_gemm() -> None:
    c = _one("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c_outfmt_head::GemmKernel>"
             "(dpsk::grouped_gemm::cuda::fp8_ptp128c_outfmt_head::GemmKernel::Params)")
    assert c.bucket == "gemm"
    batched = _one("void deep_gemm::sm90_bf16_gemm_impl<0u, 0u, 128u, 64u, 64u, 4u, (deep_gemm::GemmType)4>")
    assert batched.bucket == "gemm"


def test_decision_10_peer_memcpy_is_communication_other_copies_memory() -> None:
    # Memset *names* follow the labelled corpus (other/memset, dev row "Memset (Unknown)"); memset activities in a
    # trace's memops table are `memory` (see test_trace_columns* / classify_trace).
    got = classify_names(["Memcpy PtoP (Device -> Device)", "Memcpy HtoD (Pinned -> Device)",
                          "[CUDA memcpy Device-to-Device]", "Memset (Device)", "[CUDA memset]"])
    assert [(c.bucket, c.subbucket) for c in got] == [
        ("communication", "memcpy_p2p"), ("memory", "memcpy_htod"), ("memory", "memcpy_dtod"),
        ("other", "memset"), ("other", "memset")]


def test_decision_11_gemm_communication_megakernel_keeps_flop_bucket_and_tags_fused_comm() -> None:
    mega = _one("kernel_cutlass_kernel_flashinfermoe_epkernel_srccutedsl_megamoesrcmoe_nvfp4_swapabmegamoe_"
                "kernelSm100MegaMoEKernel_object_at_")
    assert mega.bucket == "moe_fp4_gemm" and "fused_comm" in mega.tags
    flux = _one("void flux::GemmRS<cutlass::bfloat16_t>")
    assert flux.bucket == "gemm" and "fused_comm" in flux.tags


def test_decision_12_moe_setup_kernels_are_routing_even_when_they_say_gemm() -> None:
    names = ["void tensorrt_llm::kernels::cutlass_kernels::computeStridesTmaWarpSpecializedKernel<__nv_bfloat16>",
             "void __get_group_gemm_starts<cutlass::float_e2m1_t, cutlass::bfloat16_t, cutlass::float_ue4m3_t>",
             "void at::cuda::detail::prepare_grouped_gemm_data<cutlass::bfloat16_t, cutlass::bfloat16_t>",
             "expandInputRowsKernel", "finalizeMoeRoutingKernel", "void vllm::moe::moe_align_block_size_kernel<int>"]
    assert {(c.bucket, c.subbucket) for c in classify_names(names)} == {("other", "moe_routing")}


def test_decision_13_kv_cache_rope_qknorm_are_other_merge_and_metadata_are_attention() -> None:
    other = classify_names(["void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, "
                            "(vllm::Fp8KVCacheDataType)0>",
                            "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(",
                            "void tensorrt_llm::kernels::fusedQKNormRopeKernel<128, false>"])
    assert [c.bucket for c in other] == ["other"] * 3
    assert other[0].subbucket == "kv_cache"
    attn = classify_names(["void flashinfer::MergeStatesKernel<8u>", "void get_mla_metadata_kernel(",
                           "void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<"])
    assert [c.bucket for c in attn] == ["attention"] * 3


def test_decision_14_spin_kernels_are_sync_spin() -> None:
    c = _one("at::cuda::(anonymous namespace)::spin_kernel(long)")
    assert (c.bucket, c.subbucket) == ("other", "sync_spin")


def test_decision_15_demangler_spellings_classify_and_group_alike() -> None:
    a = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    b = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"
    assert normalize_name(a) == normalize_name(b)
    assert normalize_name("void at::native::<unnamed>::k<(bool)1, (int)8>(T1 *)") == \
        normalize_name("at::native::(anonymous namespace)::k<true, 8>(T1*)")
    assert normalize_name("void f<a<b> >()") == "f<a<b>>()"


# -- normalisation --------------------------------------------------------------------------------
def test_normalize_strips_rocm_suffix_clone_truncation_and_return_type() -> None:
    assert normalize_name("fused_recurrent_kda_fwd_kernel.kd") == "fused_recurrent_kda_fwd_kernel"
    assert normalize_name("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>) [clone .kd]") == \
        "ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096>)"
    assert normalize_name("void flash::flash_fwd_splitkv_combine_kernel<...>") == \
        "flash::flash_fwd_splitkv_combine_kernel<...>"
    assert normalize_name("void at::native::index_elementwise_kernel<128, 4, at...") == \
        "at::native::index_elementwise_kernel<128, 4, at"
    assert "truncated" in _one("void flash::flash_fwd_splitkv_combine_kernel<...>").tags
    assert "truncated" not in _one("nvjet_tst_64x8_64x16_4x1_v_bz_TNT").tags


def test_normalize_is_idempotent_on_real_names() -> None:
    rows = list(csv.DictReader((DATA / "kernel_names_extra.csv").open(encoding="utf-8")))
    for row in rows:
        once = normalize_name(row["name"])
        assert normalize_name(once) == once, row["name"]


def test_demangle_itanium_names_without_cxxfilt() -> None:
    assert demangle("_ZN5flash16flash_fwd_kernelI23Flash_fwd_kernel_traitsILi128ELi128ELi64ELi4ELb0ELb0EN7cutlass"
                    "6half_tE19Flash_kernel_traitsILi128ELi128ELi64ELi4ES3_EELb0ELb1ELb0ELb0ELb1ELb1ELb0ELb0EEEvNS_"
                    "16Flash_fwd_paramsE") == (
        "flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::half_t, "
        "Flash_kernel_traits<128, 128, 64, 4, cutlass::half_t>>, false, true, false, false, true, true, false, "
        "false>(flash::Flash_fwd_params)")
    lam = demangle("_ZN2at6native27unrolled_elementwise_kernelIZZZNS0_15add_kernel_cudaERNS_14TensorIteratorEN3c10"
                   "6ScalarEENKUlvE_clEvENKUlvE8_clEvEUlNS4_4HalfES8_E_NS_6detail5ArrayIPcLi3EEE16OffsetCalculatorI"
                   "Li2EjESE_ILi1EjENS0_6memory15LoadWithoutCastENSH_16StoreWithoutCastEEEviT_T0_T1_T2_T3_T4_")
    assert lam.startswith("at::native::unrolled_elementwise_kernel<at::native::add_kernel_cuda(")
    assert "{lambda(c10::Half, c10::Half)#1}" in lam
    assert demangle("plain_name") == "plain_name"


def test_mangled_truncated_grouped_gemm_still_classified() -> None:
    name = ("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS1_17GroupProblemShapeIN4cute5tupleIJlllEEEEE"
            "NS1_10collective13CollectiveMmaINS1_39MainloopSm90ArrayTmaGmmaWarpSpec")
    c = _one(name)
    assert c.bucket == "moe_gemm"
    assert "GroupProblemShape" in c.normalized


# -- tags -----------------------------------------------------------------------------------------
def test_precision_and_arch_tags() -> None:
    got = classify_names(["sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128",
                          "ampere_s16816gemm_bf16_64x64_sliced1x2_ldg8_stages_64x6_nn",
                          "ampere_sgemm_32x32_sliced1x4_tn",
                          "void marlin_moe_wna16::Marlin<(long)1125899906909960, (int)128>",
                          "nvjet_sm100_tst_16x64_64x16_2x1_v_bz_TNN",
                          "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1"])
    assert [c.precision for c in got] == ["fp8", "bf16", "fp32", "int4", "bf16", "fp4"]
    assert [c.arch for c in got] == ["sm90", "sm80", "sm80", None, "sm100", None]
    assert got[-1].fp4_format == "mxfp4"


# -- rules files ----------------------------------------------------------------------------------
def test_user_rules_override_defaults(tmp_path: Path) -> None:
    rules = tmp_path / "mine.toml"
    rules.write_text('[[rule]]\nid = "mine.nvjet_is_moe"\nmatch = "^nvjet_"\nbucket = "moe_gemm"\n'
                     'subbucket = "eager_experts"\nprecision = "bf16"\n', encoding="utf-8")
    c = classify_names(["nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "fused_moe_kernel"], rules=rules)
    assert (c[0].bucket, c[0].subbucket, c[0].rule, c[0].precision) == \
        ("moe_gemm", "eager_experts", "mine.nvjet_is_moe", "bf16")
    assert c[1].rule == "moe.grouped"  # defaults still apply after the user rules


def test_user_rules_case_insensitive_with_upper_case_escapes(tmp_path: Path) -> None:
    rules = tmp_path / "mine.toml"
    rules.write_text('[[rule]]\nid = "a"\nmatch = \'^NVJET_\\S+_TNT$\'\nbucket = "gemm"\n'
                     '[[rule]]\nid = "b"\nmatch = \'^Fused_MoE\'\ncase_sensitive = true\nbucket = "other"\n',
                     encoding="utf-8")
    got = classify_names(["nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "fused_moe_kernel", "Fused_MoE_x"], rules=rules)
    assert [c.rule for c in got] == ["a", "moe.grouped", "b"]


@pytest.mark.parametrize("text, problem", [
    ("[[rule]]\nid = 'x'\nmatch = '('\nbucket = 'gemm'\n", "bad regex"),
    ("[[rule]]\nid = 'x'\nmatch = 'a'\nbucket = 'gpu'\n", "is not one of"),
    ("[[rule]]\nmatch = 'a'\nbucket = 'gemm'\n", "missing 'id'"),
    ("[[rule]]\nid = 'x'\nmatch = 'a'\nbucket = 'gemm'\ncolour = 1\n", "unknown key"),
    ("not toml [", "invalid TOML"),
    ("title = 'no rules'\n", "no [[rule]]"),
])
def test_invalid_user_rules_raise_rules_error(tmp_path: Path, text: str, problem: str) -> None:
    rules = tmp_path / "bad.toml"
    rules.write_text(text, encoding="utf-8")
    with pytest.raises(RulesError, match=re.escape(problem)) as err:
        classify_names(["x"], rules=rules)
    assert err.value.path == str(rules)


def test_unmatched_names_fall_back_to_other_low() -> None:
    c = _one("some_future_kernel_xyz")
    assert (c.bucket, c.confidence, c.rule) == ("other", "low", "fallback.other")


def test_exclusive_precedence_covers_every_bucket_compute_first_comm_last() -> None:
    assert sorted(EXCLUSIVE_PRECEDENCE) == sorted(BUCKETS)
    assert EXCLUSIVE_PRECEDENCE[0] == "moe_fp4_gemm" and EXCLUSIVE_PRECEDENCE[-1] == "communication"


# -- read_names and the CLI contract ---------------------------------------------------------------
def test_read_names_skips_blank_lines_and_reports_bad_files(tmp_path: Path) -> None:
    good = tmp_path / "names.txt"
    good.write_text("a\n\n  b  \n", encoding="utf-8")
    assert read_names(good) == ["a", "b"]
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9\n")
    with pytest.raises(BadInputError, match="not UTF-8"):
        read_names(bad)
    with pytest.raises(BadInputError, match="no such file"):
        read_names(tmp_path / "missing.txt")


def test_cli_classify_stdin_json_contract(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from traceanalyzer.cli import main

    names = ["ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "", "fused_moe_kernel",
             "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(names).encode())))
    assert main(["classify", "-", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["bucket"] for r in out] == ["communication", "moe_gemm", "attention"]
    for row in out:
        assert list(row)[:6] == ["name", "bucket", "subbucket", "precision", "confidence", "rule"]


def test_cli_bad_rules_file_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from traceanalyzer.cli import main

    names = tmp_path / "n.txt"
    names.write_text("nvjet_tst_1\n", encoding="utf-8")
    rules = tmp_path / "r.toml"
    rules.write_text("[[rule]]\nid = 'x'\n", encoding="utf-8")
    assert main(["classify", str(names), "--rules", str(rules), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: {rules}:")


# -- Trace columns ----------------------------------------------------------------------------------
def _context_trace(kernels: list[tuple[str, int, int]], gpu_ranges=(), cpu_ranges=(), launches=()) -> Trace:
    """A one-device trace: kernels (name, start, end), GPU/CPU ranges (name, start, end), launches (corr, t)."""
    strings = StringPool()
    n = len(kernels)
    k = Table.from_columns("kernels", n, start_ns=[s for _, s, _ in kernels], end_ns=[e for _, _, e in kernels],
                           pid=1, rank=0, device=0, stream=7, correlation=np.arange(1, n + 1),
                           name_id=strings.intern_many([nm for nm, _, _ in kernels]))
    rows = [(nm, s, e, "gpu_user_annotation", 0, -1) for nm, s, e in gpu_ranges]
    rows += [(nm, s, e, "user_annotation", -1, 5) for nm, s, e in cpu_ranges]
    r = Table.from_columns("ranges", len(rows), start_ns=[x[1] for x in rows], end_ns=[x[2] for x in rows],
                           pid=1, rank=0, tid=[x[5] for x in rows], device=[x[4] for x in rows],
                           kind_id=strings.intern_many([x[3] for x in rows]),
                           name_id=strings.intern_many([x[0] for x in rows]))
    a = Table.from_columns("api_calls", len(launches), start_ns=[t for _, t in launches],
                           end_ns=[t + 5 for _, t in launches], pid=1, rank=0, tid=5,
                           correlation=[c for c, _ in launches], name_id=strings.intern("cudaLaunchKernel"))
    return Trace("synthetic", "kineto-json", strings, {"kernels": k, "ranges": r, "api_calls": a})


def test_classify_trace_adds_string_id_columns_per_unique_name() -> None:
    strings = StringPool()
    names = ["nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "device_kernel"]
    name_ids = strings.intern_many([names[0], names[1], names[0], None])
    short = strings.intern_many([None, None, None, names[2]])
    k = Table.from_columns("kernels", 4, start_ns=[0, 10, 20, 30], end_ns=[5, 15, 25, 35], name_id=name_ids,
                           short_name_id=short)
    m = Table.from_columns("memops", 3, start_ns=[0, 1, 2], end_ns=[1, 2, 3],
                           kind_id=strings.intern_many(["memcpy", "memcpy", "memset"]),
                           copy_kind_id=strings.intern_many(["PtoP", "HtoD", None]),
                           src_device=[0, -1, -1], dst_device=[1, -1, -1])
    trace = classify_trace(Trace("t", "nsys-sqlite", strings, {"kernels": k, "memops": m}))
    for col in ("bucket_id", "subbucket_id", "precision_id", "rule_id"):
        assert trace.kernels[col].dtype == np.int16  # a pool this small: 2 bytes a row (int32 past 32,704 strings)
    assert trace.kernels["confidence_low"].dtype == bool
    df = trace.df("kernels")
    assert list(df["bucket"]) == ["gemm", "communication", "gemm", "gemm"]
    # the last row has only the nsys shortName: CUTLASS's generic "device_kernel" is a low-confidence guess
    assert list(df["rule"]) == ["gemm.cublas_nvjet", "comm.nccl.allreduce", "gemm.cublas_nvjet",
                                "gemm.cutlass_short_name"]
    assert list(df["confidence_low"]) == [False, False, False, True]
    mem = trace.df("memops")
    assert list(mem["bucket"]) == ["communication", "memory", "memory"]
    assert list(mem["subbucket"]) == ["memcpy_p2p", "memcpy_htod", "memset"]


# -- every real H200 trace --------------------------------------------------------------------------
def test_real_h200_traces_show_every_expected_bucket(shared_data: Path) -> None:
    from traceanalyzer import load

    files = sorted((shared_data / "h200" / "kineto").glob("*.json.gz"))
    files += [p for p in sorted((shared_data / "h200" / "nsys").glob("*.sqlite")) if "decode_graphs" not in p.name]
    assert files
    for path in files:
        df = load(path).df("kernels")
        assert len(df)
        by_rule = df.groupby(["bucket", "rule"], observed=True).size()
        rules = {r for _, r in by_rule.index}
        buckets = set(df["bucket"].astype(str))
        assert {"communication", "gemm", "other"} <= buckets, path.name
        assert "comm.nccl.allreduce" in rules and "gemm.cublas_nvjet" in rules, path.name
        names = df["name"].astype(str)
        sdpa = names.str.startswith("cudnn_generated_fort_native_sdpa")
        grouped = names.str.contains("GroupProblemShape|device_kernel", regex=True) & ~sdpa
        if sdpa.any():
            assert set(df["bucket"][sdpa].astype(str)) == {"attention"}, path.name
        if "decode_serial_graphs" not in path.name:  # graph replays show neither SDPA nor every GEMM
            assert sdpa.any() and grouped.any(), path.name
        assert set(df["bucket"][grouped].astype(str)) <= {"moe_gemm"}, path.name
        assert "fallback.other" not in rules, path.name  # every kernel of these traces is known
