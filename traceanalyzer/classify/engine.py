"""The classifier: a normalised kernel name → bucket, sub-bucket and tags, by the first matching rule."""

from __future__ import annotations

import multiprocessing
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _escape
from typing import Any

from .normalize import head, is_truncated, normalize_name
from .rules import Rule, RuleSet

FALLBACK_RULE = "fallback.other"


@dataclass(frozen=True)
class KernelClass:
    """How one kernel (or memory-operation) name is classified."""

    name: str
    bucket: str
    subbucket: str
    precision: str
    confidence: str
    rule: str
    fp4_format: str | None = None
    arch: str | None = None
    fused: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    normalized: str = ""
    moe_stage: str | None = None  # the part of an MoE layer by name (buckets.MOE_STAGES), docs/MOE.md

    def to_dict(self) -> dict[str, Any]:
        """The ``classify --json`` contract keys first, then the extra tags."""
        return {
            "name": self.name,
            "bucket": self.bucket,
            "subbucket": self.subbucket,
            "precision": self.precision,
            "confidence": self.confidence,
            "rule": self.rule,
            "fp4_format": self.fp4_format,
            "arch": self.arch,
            "fused": list(self.fused),
            "tags": list(self.tags),
            "normalized": self.normalized,
            "moe_stage": self.moe_stage,
        }


_KEYS = ("name", "bucket", "subbucket", "precision", "confidence", "rule", "fp4_format", "arch", "fused", "tags",
         "normalized", "moe_stage")
_RECORD = "  {\n" + ",\n".join(f'    "{key}": %s' for key in _KEYS) + "\n  }"


def classes_json(classes: Sequence[KernelClass]) -> str:
    """``json.dumps([c.to_dict() for c in classes], indent=2)``, the same text written straight from the classes
    (each string escaped by json's C escaper): ``classify --json`` of 200,000 names in ~0.3 s instead of ~2.5 s."""
    if not classes:
        return "[]"

    def text(value: str | None) -> str:
        return "null" if value is None else _escape(value)

    def strings(values: tuple[str, ...]) -> str:
        return "[\n      " + ",\n      ".join(map(_escape, values)) + "\n    ]" if values else "[]"

    return "[\n" + ",\n".join(_RECORD % (
        _escape(c.name), _escape(c.bucket), _escape(c.subbucket), _escape(c.precision), _escape(c.confidence),
        _escape(c.rule), text(c.fp4_format), text(c.arch), strings(c.fused), strings(c.tags), _escape(c.normalized),
        text(c.moe_stage))
        for c in classes) + "\n]"


# -- tags read from the name ---------------------------------------------------------------------
# Function names that list every dtype they support say nothing about this instance's dtype.
_DTYPE_LIST_IN_NAME = re.compile(r"fp8_fp4|fp8_fp4_gemm|f8f6f4|mxf8f6f4|fp4_fp8", re.IGNORECASE)
_PRECISION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("fp4", re.compile(r"e2m1|nvf4|mxf4|nvfp4|mxfp4|fp4|float4|w4a4", re.IGNORECASE)),
    ("fp8", re.compile(r"e4m3|e5m2|fp8|float8|qqtst|w8a8_block", re.IGNORECASE)),
    ("int4", re.compile(r"int4|uint4|w4a16|w4a8|wna16|u4b8|awq|gptq|marlin|machete|s4_", re.IGNORECASE)),
    ("int8", re.compile(r"int8|imma|i8i8|s8s8|w8a8_int8", re.IGNORECASE)),
    ("bf16", re.compile(r"bf16|bfloat16|bfloat", re.IGNORECASE)),
    ("fp16", re.compile(r"(?<![bB])fp16|(?<![bB])f16(?!\d)|half|float16|h1688|h16816|h884|hgemm|_h\d+x\d+",
                        re.IGNORECASE)),
    ("fp32", re.compile(r"sgemm|tf32|_float(?![a-z0-9])|(?<![a-z0-9])f32(?![a-z0-9])|fp32|float32"
                        r"|[<,] ?float ?[,>]|s1688gemm", re.IGNORECASE)),
)
# The same patterns for lower-cased ASCII text (no IGNORECASE: about 3x faster), and all of them at once: a name
# none of them matches is "unknown" after one search.
_DTYPE_LIST_LOWER = re.compile(_DTYPE_LIST_IN_NAME.pattern.lower())
_PRECISION_LOWER = tuple((p, re.compile(pattern.pattern.lower())) for p, pattern in _PRECISION_PATTERNS)
_ANY_PRECISION = re.compile("|".join(f"(?:{pattern.pattern})" for _, pattern in _PRECISION_LOWER))
_MXFP4 = re.compile(r"mxf4|mxfp4|mxe2m1|mx_?e2m1|ue8m0", re.IGNORECASE)
_NVFP4 = re.compile(r"nvf4|nvfp4|ue4m3|^t?bmm_|^gemm_", re.IGNORECASE)
_ARCH = re.compile(r"(?:^|[^a-zA-Z])(?:sm|SM)_?(\d{2,3})(?![\dx])|Sm(\d{2,3})(?![\dx])|(?:^|[^a-z])cutlass_(\d{2})_")
_ARCH_FAMILY = re.compile(r"(?:^|[^a-zA-Z])sm(\d{1,2})x", re.IGNORECASE)
_ARCH_BY_NAME = (("volta_", "sm70"), ("turing_", "sm75"), ("ampere_", "sm80"), ("hopper_", "sm90"))
_FUSED_OPS = (
    ("residual_add", re.compile(r"residual|fused_add|add_rms", re.IGNORECASE)),
    ("rmsnorm", re.compile(r"rms_?norm|_norm|norm_|Norm", re.IGNORECASE)),
    ("quant_fp8", re.compile(r"fp8|e4m3", re.IGNORECASE)),
    ("quant_fp4", re.compile(r"fp4|e2m1", re.IGNORECASE)),
)


def _template_part(name: str) -> str:
    """The name without its trailing parameter list (parameter types like ``int4*`` mislead dtype tags)."""
    plain = name.replace("(anonymous namespace)", "{anon}")
    if plain.find("(", 1) < 0:
        return plain
    depth = 0
    for m in _BRACKETS.finditer(plain):  # only the brackets, not every character
        ch = m.group()
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0 and m.start() > 0:
            return plain[:m.start()]
    return plain


_BRACKETS = re.compile(r"[<>(]")


_NVJET_TYPES = re.compile(r"^nvjet_(?:sm\d+_)?(qq|[a-z])[a-z]{1,3}_\d")
_NVJET_CODES = {"qq": "fp8", "q": "fp8", "e": "fp8", "h": "fp16", "t": "bf16", "s": "fp32"}


def infer_precision(name: str) -> str:
    """Operand precision spelled in a normalised name (lowest precision wins), else ``unknown``."""
    nvjet = _NVJET_TYPES.match(name)
    if nvjet:  # cuBLAS nvjet_<types>_...: first letter(s) = input type (t bf16, h fp16, s fp32, qq fp8)
        return _NVJET_CODES.get(nvjet.group(1), "unknown")
    text = _template_part(name)
    if text.isascii():  # lower-casing keeps every position, so the lower-case patterns find the same matches
        low = _DTYPE_LIST_LOWER.sub("", text.lower())
        if _ANY_PRECISION.search(low) is None:
            return "unknown"
        return next((p for p, pattern in _PRECISION_LOWER if pattern.search(low)), "unknown")
    text = _DTYPE_LIST_IN_NAME.sub("", text)
    for precision, pattern in _PRECISION_PATTERNS:
        if pattern.search(text):
            return precision
    return "unknown"


def infer_fp4_format(name: str) -> str | None:
    """``mxfp4`` (E2M1 + UE8M0 per 32) or ``nvfp4`` (E2M1 + UE4M3 per 16) when the name says which."""
    if _MXFP4.search(name):
        return "mxfp4"
    if _NVFP4.search(name):
        return "nvfp4"
    return None


def infer_arch(name: str) -> str | None:
    """Target architecture spelled in the name (``sm90``, ``sm100``, ``sm120``…), else None."""
    lower = name.lower()
    if "sm" in lower or "cutlass_" in name:  # every spelling the two patterns read holds one of these
        m = _ARCH.search(name)
        if m:
            digits = next(g for g in m.groups() if g)
            return f"sm{digits}"
        m = _ARCH_FAMILY.search(name)
        if m:
            return f"sm{m.group(1)}0"
    for prefix, arch in _ARCH_BY_NAME:
        if lower.startswith(prefix):
            return arch
    return None


def infer_fused(name: str, defaults: tuple[str, ...]) -> tuple[str, ...]:
    """Ops fused into an all-reduce kernel: the rule's defaults plus those the name spells."""
    ops = list(defaults)
    for op, pattern in _FUSED_OPS:
        if op not in ops and pattern.search(name):
            ops.append(op)
    return tuple(ops)


def classify_one(raw: str, rules: RuleSet) -> KernelClass:
    """Classify one raw kernel name with ``rules`` (first match wins; no match → ``other``, low)."""
    norm = normalize_name(raw)
    fn = head(norm)
    lname, lfn = norm.lower(), fn.lower()
    rule: Rule | None = rules.first_match(norm, fn, lname, lfn)
    truncated = is_truncated(raw)
    extra_tags = ("truncated",) if truncated else ()
    if rule is None:
        return KernelClass(raw, "other", "unknown", infer_precision(norm), "low", FALLBACK_RULE,
                           arch=infer_arch(norm), tags=extra_tags, normalized=norm)
    precision = rule.precision or infer_precision(norm)
    fp4_format = rule.fp4_format or (infer_fp4_format(norm) if precision == "fp4" else None)
    fused = infer_fused(norm, rule.fused) if rule.fused else ()
    return KernelClass(
        name=raw,
        bucket=rule.bucket,
        subbucket=rule.subbucket,
        precision=precision,
        confidence=rule.confidence,
        rule=rule.id,
        fp4_format=fp4_format,
        arch=infer_arch(norm),
        fused=fused,
        tags=rule.tags + extra_tags,
        normalized=norm,
        moe_stage=rule.moe_stage,
    )


PARALLEL_MIN_NAMES = 50_000  # distinct names from which classification is split across processes


# per rules tuple (by identity, kept alive beside its classes): the classes met inside :func:`classes_shared`
_SHARED: ContextVar[dict[int, tuple[tuple[Rule, ...], dict[str, KernelClass]]] | None] = ContextVar(
    "shared_classes", default=None)


@contextmanager
def classes_shared() -> Iterator[None]:
    """Inside the block, :func:`classify_many` classifies a name once per rules tuple and reuses its class
    (``classify_one`` depends on nothing else): ``diff`` classifies the names its two sides share once."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def classify_many(names: list[str], rules: RuleSet, *, parallel_min: int = PARALLEL_MIN_NAMES) -> list[KernelClass]:
    """``classify_one`` of every name, in order. From ``parallel_min`` names on (and with more than one CPU, in
    a main process on a platform that forks), halves of the list are classified in forked processes. Inside
    :func:`classes_shared`, only the names not met before with the same rules are classified."""
    shared = _SHARED.get()
    if shared is None:
        return _classify_all(names, rules, parallel_min)
    entry = shared.get(id(rules.rules))
    if entry is None or entry[0] is not rules.rules:
        entry = shared[id(rules.rules)] = (rules.rules, {})
    known = entry[1]
    new = [n for n in dict.fromkeys(names) if n not in known]
    known.update(zip(new, _classify_all(new, rules, parallel_min), strict=True))
    return [known[n] for n in names]


def _classify_all(names: list[str], rules: RuleSet, parallel_min: int) -> list[KernelClass]:
    workers = min(os.cpu_count() or 1, 8)
    if len(names) < max(parallel_min, 2) or workers < 2 or multiprocessing.parent_process() is not None \
            or "fork" not in multiprocessing.get_all_start_methods():
        return [classify_one(n, rules) for n in names]
    size = -(-len(names) // workers)
    chunks = [names[i:i + size] for i in range(0, len(names), size)]
    ctx = multiprocessing.get_context("fork")
    global _FORK_RULES
    _FORK_RULES = rules  # inherited by the forked workers: no rule set is pickled
    try:
        with ctx.Pool(len(chunks)) as pool:
            parts = pool.map(_classify_chunk, chunks)
    finally:
        _FORK_RULES = None
    return [c for part in parts for c in part]


_FORK_RULES: RuleSet | None = None


def _classify_chunk(names: list[str]) -> list[KernelClass]:
    assert _FORK_RULES is not None
    return [classify_one(n, _FORK_RULES) for n in names]


def classify_unique(names: list[str], rules: RuleSet) -> dict[str, KernelClass]:
    """Each distinct name classified once."""
    distinct = list(dict.fromkeys(names))
    return dict(zip(distinct, classify_many(distinct, rules), strict=True))
