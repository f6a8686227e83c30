"""Hostile inputs, round 3 (issue 30), family 3: pathological kernel names (ReDoS) and demangling bombs.

Every pattern classification runs is linear in the text it reads, and it reads at most ``MAX_NAME_CHARS``
characters of a name (before and after demangling); the demangler copies at most ``MAX_EXPANSION`` characters
by back-references. The rewritten rule patterns answer exactly as the old ones (checked on every kernel name of
the fixtures and by a fuzz), and the crafted names of the issue classify in a time that grows linearly.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceanalyzer.classify.demangle import MAX_EXPANSION, demangle
from traceanalyzer.classify.engine import _template_part, classify_one, infer_arch
from traceanalyzer.classify.normalize import MAX_NAME_CHARS, _drop_rocm_suffix, _drop_truncation, normalize_name
from traceanalyzer.classify.rules import default_rules, rule_set

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)

#: the rule patterns before issue 30 (quadratic: ``A.*B`` and ``A\w*B`` tried from every occurrence of A), each
#: rewritten to an exact linear form: ``^(?:(?!A).)*A.*B`` (the first A is enough) or ``A(?:(?!A)\w)*B`` (the
#: last A of a word run is enough; no suffix of A is a prefix of B, so no A straddles where B starts)
OLD_PATTERNS = {
    "fused_comm.megamoe_fp4": r'mega_?moe.*(nvfp4|mxfp4|fp4|e2m1)|(nvfp4|mxfp4|fp4|e2m1).*mega_?moe',
    "comm.custom_allreduce": (
        r'cross_device_reduce|custom_?all_?reduce|one_?shot_?all_?reduce|two_?shot_?all_?reduce|all_?reduce_(one|'
        r'two)_?shot|oneshotallreduce|twoshotallreduce|lamport\w*all_?reduce|quick_?reduce|allreduce_prototype|'
        r'multimem_(one_shot_)?all_?reduce|reduce_scatter_cross_device|ipc_all_?reduce|mnnvl\w*all_?reduce|(^|'
        r'::|_)all_?reduce_?kernel'),
    "other.kv_cache": (
        r'reshape_and_cache|req_to_token|token_pool|concat_and_cache|kv_?cache|store_?kv|set_(mla_)?kv_buffer|'
        r'write_\w*kv|kv_\w*write|append_?paged|copy_blocks|swap_blocks|update_?kv|store_cache|k_quant_and_cache|'
        r'gather_cache|gather_and_maybe_dequant_cache|cp_gather|save_kv|transfer_kv|destindex_copy_kv|slot_mapping|'
        r'kvcache'),
    "other.moe_routing": (
        r'expandinputrows|expand_input_rows|compute_expert_offsets|compute_arg_sorts|get_cutlass_moe_mm_data|'
        r'moe_align|align_block_size|count_and_sort_expert|sort_expert|expertprefixsum|expert_prefix|'
        r'buildexpertmaps|expertmap|(moe|expert|token)s?_?permute|permute_(tokens|moe|experts)|shuffle_rows|'
        r'shuffleinputrows|shuffle_input_rows|ep_scatter|routing_|_routing|sum_bitmatrix|writeback_idx|'
        r'moe_lora_align|deepep_(permute|pre_reorder)|pre_reorder|tokens_per_expert|seg_indptr|src2dst|'
        r'moe_init_routing|moerouting|moe_routing|moe_?sort|moe\w*_sort_kernel|scatter_to_expert|expert_(count|'
        r'offsets|ids|tokens)|moe_.*_?(index|indices)'),
    "other.quantize": (
        r'quant|cvt_\w*(fp4|fp8|e2m1|e4m3)|to_fp[48]|fp8_cast|cast_to_fp8|float8_copy|mxfp8|scaled_fp[48]|pack_fp8|'
        r'ue8m0|transpose_and_pack|cast_transpose|block_scale_interleave|blockscale_interleave|sf_layout|absmax|'
        r'segmented_max_reduction|repack|awq_to|gptq_shuffle'),
    "attention.metadata": (
        r'mla_metadata|attention_metadata|attn_metadata|kv_indices|kv_indptr|create_flashinfer|flashinfer_\w*indices|'
        r'sparse_indices|get_num_splits|scheduler_metadata|compute_page_indices|decode_plan|prefill_plan'),
    "attention.flash": (
        r'flash_fwd|flash_bwd|flash_attn|flashattn|flash::|flashattention|pytorch_flash|flash_decoding|flashdecoding|'
        r'flashmla|sparse_attn|sparse_attention|mqa_logits|paged_logits|(^|::|_)fa\d?_(prefill|decode|fwd|bwd)|'
        r'(^|_)[gm]qa_\w*(fwd|bwd|attn|decode|prefill)|indexer_\w*logits|sparse_splitk|sparse_\w*gather_with_mask|'
        r'fmha|(^|[^a-z])mha(?![a-z])|_mha_|mha_(fwd|bwd|varlen)|kernel_mha|masked_multihead|multihead_?attention|'
        r'xqa|sdpa|attention|batchprefill|singleprefill|batchdecode|singledecode|prefillwith|decodewith|batchpod|'
        r'podwith|paged_?attn|paged_?attention|efficient_attention|mem_eff|cutlassf|cutlassb|attention_kernel|'
        r'(^|::|_)mla(_|$|\d)|mla_?decode|mla_?prefill|lightning_attn|sageattn|sage_attn|qk_int8_sv|(^|::)attn_|'
        r'_attn_|_attn$|unified_attention|ck_tile::fmha|fmhafwd|fmhabwd|pa_fwd'),
    "moe_fp4.triton_matmul_ogs": r'(^_?p?_matmul_ogs|matmul_ogs|^_p?_?matmul_[nt]{3}_).*(mxfp4|fp4|e2m1)',
    "moe_fp4.cute_dsl_flashinfer": r'flashinfer\w*fused_moe\w*cute_dsl|cute_dsl\w*moe|blackwell_sm12x\w*moe',
    "moe_fp4.grouped": (
        r'^(?=.*(grouped|group_?gemm|groupproblem|ptrarray|arraytma|moe|expert|fmoe|a4w4))(?=.*(e2m1|nvf4|mxf4|'
        r'nvfp4|mxfp4|fp4|float4|a4w4|w4a4|w4a8_mx))|(opus|aiter|mfma)\w*moe\w*a8w4'),
}


def _fixture_names() -> list[str]:
    """Every kernel name of the project's nsys fixtures (the Kineto fixtures hold the same kernels)."""
    names: set[str] = set()
    for path in sorted((REPO / "fixtures" / "nsys").glob("*.sqlite")):
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            names.update(v for (v,) in conn.execute(
                "SELECT value FROM StringIds WHERE id IN (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)"))
        finally:
            conn.close()
    return sorted(names)


def _old_and_new() -> list[tuple[str, re.Pattern[str], re.Pattern[str], bool, bool]]:
    rules = {r.id: r for r in default_rules()}
    return [(rid, re.compile(text, rules[rid].pattern.flags), rules[rid].pattern, rules[rid].lowercase,
             rules[rid].on_head) for rid, text in OLD_PATTERNS.items()]


def test_rewritten_rules_answer_as_before_on_real_names() -> None:
    from traceanalyzer.classify.normalize import head

    names = _fixture_names()
    assert len(names) > 50
    for rid, old, new, lowercase, on_head in _old_and_new():
        for raw in names:
            norm = normalize_name(raw)
            text = head(norm) if on_head else norm
            text = text.lower() if lowercase else text
            assert bool(old.search(text)) == bool(new.search(text)), (rid, raw)


def _tokens() -> list[str]:
    words = {w for text in OLD_PATTERNS.values() for w in re.findall(r"[a-z0-9]+(?:_[a-z0-9]+)*", text)}
    return sorted(words | {"_", "__", "::", " ", "<", ">", "x", "a", "moe_", "kv_", "_gqa_", "mqa_"})


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_tokens()), max_size=8).map("".join))
def test_rewritten_rules_answer_as_before_fuzz(text: str) -> None:
    for rid, old, new, _lowercase, _on_head in _old_and_new():
        assert bool(old.search(text)) == bool(new.search(text)), (rid, text)


_OLD_TRUNCATED = re.compile(r"\s*(?:\.\.\.|…)\s*$")
_OLD_ROCM = re.compile(r"(?:\s*\[clone [^\]]*\])+$|\.kd$")


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from([" ", "\t", "\n", ".", "…", "...", "[clone ", "]", "[", "x", ".kd", "a]"]),
                max_size=10).map("".join))
def test_linear_suffix_helpers_equal_the_old_patterns(text: str) -> None:
    text = text.strip()
    assert _drop_truncation(text) == _OLD_TRUNCATED.sub("", text)
    assert _drop_rocm_suffix(text) == _OLD_ROCM.sub("", _OLD_ROCM.sub("", text))


def _old_template_part(name: str) -> str:
    """``_template_part`` before it skipped to the brackets (a loop over every character)."""
    depth = 0
    plain = name.replace("(anonymous namespace)", "{anon}")
    for i, ch in enumerate(plain):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            return plain[:i]
    return plain


_OLD_ARCH = (re.compile(r"(?:^|[^a-zA-Z])(?:sm|SM)_?(\d{2,3})(?![\dx])|Sm(\d{2,3})(?![\dx])"
                        r"|(?:^|[^a-z])cutlass_(\d{2})_"),
             re.compile(r"(?:^|[^a-zA-Z])sm(\d{1,2})x", re.IGNORECASE))


def _old_arch(name: str) -> str | None:
    m = _OLD_ARCH[0].search(name)
    if m:
        return "sm" + next(g for g in m.groups() if g)
    m = _OLD_ARCH[1].search(name)
    if m:
        return f"sm{m.group(1)}0"
    return next((arch for prefix, arch in (("volta_", "sm70"), ("turing_", "sm75"), ("ampere_", "sm80"),
                                           ("hopper_", "sm90")) if name.lower().startswith(prefix)), None)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(["<", ">", "(", ")", "(anonymous namespace)", "x", "sm", "SM", "Sm", "_", "90",
                                 "100", "x", "cutlass_", "80", "volta_", "hopper_", "ſm", "İ"]),
                max_size=12).map("".join))
def test_bracket_and_arch_shortcuts_equal_the_old_loops(text: str) -> None:
    assert _template_part(text) == _old_template_part(text)
    assert infer_arch(text) == _old_arch(text)


def test_bracket_and_arch_shortcuts_on_real_names() -> None:
    names = _fixture_names()
    assert names
    for name in names:
        assert _template_part(name) == _old_template_part(name), name
        assert infer_arch(name) == _old_arch(name), name


#: the issue's shapes: runs of spaces and dots, tabs and ellipses, templates, DeepGEMM-like and MoE-like names,
#: ROCm clone suffixes, and a repeated literal of each rewritten rule
SHAPES: dict[str, Callable[[int], str]] = {
    "spaces_then_dots": lambda n: "k" + " " * n + "...x",
    "tabs_then_ellipsis": lambda n: "k" + "\t" * n + "…x",
    "dots": lambda n: "k" + "." * n + "x",
    "template": lambda n: "void cutlass::Kernel<" + "T<" * (n // 3) + ">" * (n // 3) + ">(Params)",
    "deepgemm": lambda n: "deep_gemm::fp8_gemm_kernel<" + ", ".join(["128"] * (n // 5)) + ">",
    "moe": lambda n: "fused_moe_kernel_" + "moe_" * (n // 4),
    "clones": lambda n: "k" + " [clone .x]" * (n // 11) + "y",
    "spaces_then_clone": lambda n: "k" + " " * n + "[clone x]y",
    "kv": lambda n: "kv_" * (n // 3),
    "cvt": lambda n: "cvt_" * (n // 4),
    "mega_moe": lambda n: "megamoe" * (n // 7),
    "matmul_ogs": lambda n: "matmul_ogs" * (n // 10),
    "gqa": lambda n: "_gqa_" * (n // 5),
    "cute_dsl": lambda n: "cute_dsl" * (n // 8),
    "pointers": lambda n: "k(float" + " " * n + "x)",
}


def _seconds(name: str) -> float:
    rules = rule_set(None)
    best = float("inf")
    for _ in range(3):
        normalize_name.cache_clear()
        start = time.perf_counter()
        classify_one(name, rules)
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize("shape", list(SHAPES))
def test_crafted_names_classify_in_linear_time(shape: str) -> None:
    """Before: 0.5–3 s for one 10–20 k-character name, growing 4–7x per doubling. Now linear up to the cap and
    flat beyond it: 4x the length costs < 10x the time (quadratic would be 16x), and 40 k characters < 0.5 s."""
    small, large = _seconds(SHAPES[shape](MAX_NAME_CHARS // 4)), _seconds(SHAPES[shape](MAX_NAME_CHARS))
    assert large < 10 * small + 0.02, (small, large)
    assert _seconds(SHAPES[shape](40_000)) < 0.5


def test_names_past_the_cap_are_classified_on_their_start_and_tagged() -> None:
    name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" + "_" * MAX_NAME_CHARS
    cls = classify_one(name, rule_set(None))
    assert cls.bucket == "communication" and "truncated" in cls.tags
    assert len(cls.normalized) <= MAX_NAME_CHARS


def _seq_id(i: int) -> str:
    if i == 0:
        return "S_"
    i, digits, out = i - 1, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", ""
    while True:
        out, i = digits[i % 36] + out, i // 36
        if not i:
            return f"S{out}_"


def doubling_symbol(steps: int) -> str:
    """``f(a, p<a, a>, p<p<a, a>, p<a, a>>, …)``: each parameter names the previous one twice by substitution
    (the 2k-th substitution), so the demangled text doubles at every step: 2^steps characters from 12·steps."""
    return "_Z1f1a" + "".join(f"1pI{_seq_id(2 * k)}{_seq_id(2 * k)}E" for k in range(steps))


def test_a_demangling_bomb_is_bounded() -> None:
    assert len(demangle(doubling_symbol(8))) > 2000  # the grammar is real: small cases demangle in full
    bomb = doubling_symbol(40)  # ~2^40 characters demangled; 500 bytes
    start = time.perf_counter()
    text = demangle(bomb)
    assert time.perf_counter() - start < 1.0 and len(text) <= len(bomb) + MAX_EXPANSION
    cls = classify_one(bomb, rule_set(None))
    assert len(cls.normalized) <= MAX_NAME_CHARS


def test_a_kineto_trace_with_a_demangling_bomb_is_summarized(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's 465-byte trace that used all memory: one kernel whose mangled name is a bomb."""
    import json

    from traceanalyzer.cli import main

    path = tmp_path / "bomb.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": doubling_symbol(40), "pid": 0, "tid": 7, "ts": 1.0, "dur": 5.0,
         "args": {"device": 0, "stream": 7, "correlation": 1}}]}))
    assert main(["summary", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["devices"][0]["kernels"] == 1


@pytest.mark.slow
def test_every_rule_is_linear_on_its_own_literals() -> None:
    """The full scan behind TRACEANALYZER_SLOW=1: every pattern of the default rules, on each literal it names
    (plain, with an underscore, upper-cased) repeated to 4 k and 16 k characters."""
    patterns = [(r.id, p) for r in default_rules() for p in (r.pattern, r.exclude) if p is not None]
    slow = []
    for rid, pattern in patterns:
        words = set(re.findall(r"[A-Za-z0-9_:]{2,}", pattern.pattern)) | {"_", ":", "<", " ", "(", ",", ".", "0"}
        for word in sorted(words | {w + "_" for w in words}):
            def timed(n: int, w: str = word, pat: re.Pattern[str] = pattern) -> float:
                text = (w * (n // len(w) + 1))[:n]
                start = time.perf_counter()
                pat.search(text)
                return time.perf_counter() - start
            small = min(timed(4000) for _ in range(3))
            if small > 0.001 and min(timed(16000) for _ in range(3)) > 10 * small:
                slow.append((rid, word))
    assert not slow
