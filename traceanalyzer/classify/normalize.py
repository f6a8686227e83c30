"""Kernel-name normalisation (TAXONOMY decision 15): one spelling per kernel, whatever the demangler.

Demanglers and profilers spell the same kernel differently: ``<4096ul>`` vs ``<(unsigned long)4096>``,
``(anonymous namespace)`` vs ``<unnamed>``, ``> >`` vs ``>>``, ``T1 const*`` vs ``const T1 *``; names
may still be mangled (``_Z…``), cut short (``...``), carry a ROCm ``.kd`` suffix or a ``void`` return
type. :func:`normalize_name` maps all of these to one canonical text, used both for matching rules and
for grouping kernels. It is cached, so a trace pays once per unique name.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .demangle import demangle

_BUILTIN_CAST = re.compile(
    r"\((?:unsigned |signed )?(?:char|short|int|long|long long|__int128|bool)\)\s*(-?\d+)"
)
_INT_SUFFIX = re.compile(r"(?<![\w.])(-?\d+)(?:ull|ul|ll|u|l)\b", re.IGNORECASE)
_BOOL_CAST = re.compile(r"\(bool\)\s*([01])")
_ANON = re.compile(r"<unnamed>|\{anonymous\}|\(anonymous namespace\)")
_SPACES = re.compile(r"\s+")
_CLOSE = re.compile(r">\s+>")
_PTR_SPACE = re.compile(r"(?<!\s)\s+([*&]+)")  # tried only where a run of whitespace starts: linear
_RETURN_TYPE = re.compile(r"^(?:void|int|float|double|auto|__global__ void)\s+(?=[\w:(<~])")

#: characters of a name that classification reads: 1.6x the longest kernel name of the 244 real traces in ../shared
#: and fixtures/ (5,160, a Kineto name of xDiT on MI300X), so no real name is cut; a longer one (a crafted or
#: damaged trace) is classified on its first MAX_NAME_CHARS characters, before and after demangling, which bounds
#: the time of every pattern per name (every pattern is linear in what it reads: tests/test_hostile_names.py)
MAX_NAME_CHARS = 8192


def _drop_truncation(name: str) -> str:
    r"""``name`` without a trailing ``...`` or ``…`` and the whitespace around it (once): what
    ``re.sub(r"\s*(?:\.\.\.|…)\s*$", "", name)`` does, in linear time (that pattern is quadratic in a run of
    whitespace before the dots)."""
    cut = name.rstrip()
    for mark in ("...", "…"):
        if cut.endswith(mark):
            return cut[:-len(mark)].rstrip()
    return name


def _drop_rocm_suffix(name: str) -> str:
    r"""``name`` without trailing ``[clone …]`` groups (and the whitespace before them) or a ``.kd`` suffix, twice:
    ``re.sub(r"(?:\s*\[clone [^\]]*\])+$|\.kd$", "", name)`` applied twice, in linear time (the pattern is
    quadratic in the number of groups and in whitespace runs)."""
    for _ in range(2):
        tail = "\n" if name.endswith("\n") else ""  # "$" also matches before a final newline
        body = name[:len(name) - len(tail)]
        end = len(body)
        while end and body[end - 1] == "]":
            start = body.find("[clone ", body.rfind("]", 0, end - 1) + 1, end)  # the group's text holds no "]"
            if start < 0:
                break
            end = len(body[:start].rstrip())
        if end < len(body):
            name = body[:end] + tail
        elif body.endswith(".kd"):
            name = body[:-3] + tail
    return name


def _strip_enable_if(name: str) -> str:
    """Drop a ``std::enable_if<...>::type`` return type (some demanglers print it before the name)."""
    if not name.startswith("std::enable_if<"):
        return name
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
            if depth == 0:
                rest = name[i + 1:]
                return rest[len("::type "):] if rest.startswith("::type ") else name
    return name


def _canonical_args(text: str) -> str:
    if "(bool)" in text:
        text = _BOOL_CAST.sub(lambda m: "true" if m.group(1) == "1" else "false", text)
    text = _BUILTIN_CAST.sub(r"\1", text)
    return _INT_SUFFIX.sub(r"\1", text)


@lru_cache(maxsize=65536)
def normalize_name(raw: str) -> str:
    """The canonical spelling of a kernel name (demangled, no return type, uniform template text)."""
    # each substitution runs only where its pattern can match (the literal it needs is there): same result
    name = raw[:MAX_NAME_CHARS].strip()
    if "[clone " in name or name.endswith(".kd"):
        name = _drop_rocm_suffix(name)
    if name.startswith("_Z"):
        name = demangle(name)[:MAX_NAME_CHARS]
    if "..." in name or "…" in name:
        name = _drop_truncation(name)
    name = _SPACES.sub(" ", name)
    name = _strip_enable_if(_RETURN_TYPE.sub("", name))
    if "<unnamed>" in name or "anonymous" in name:
        name = _ANON.sub("(anonymous namespace)", name)
    if "<" in name or "(" in name:
        name = _canonical_args(name)
        if ">" in name:
            while True:
                collapsed = _CLOSE.sub(">>", name)
                if collapsed == name:
                    break
                name = collapsed
        if " *" in name or " &" in name:  # whitespace is single spaces by now
            name = _PTR_SPACE.sub(r"\1", name)
    return name.strip()


def is_truncated(raw: str) -> bool:
    """Whether the profiler (or a person) cut the name short or elided part of it with ``...``, or it is longer
    than classification reads (:data:`MAX_NAME_CHARS`)."""
    return "..." in raw or "…" in raw or len(raw) > MAX_NAME_CHARS


#: Launch wrappers whose own name says nothing: the kernel is their first template argument.
WRAPPERS = frozenset({"ck_tile::kentry", "cutlass::device_kernel", "cutlass::Kernel", "cutlass::Kernel2",
                      "fused_moe::run_global", "kernel_entry"})
_LEADING_LITERALS = re.compile(r"^(?:-?\d+|true|false)\s*,\s*")


def _plain_head(plain: str) -> str:
    cut = len(plain)
    for sep in ("<", "("):
        j = plain.find(sep)
        if 0 < j < cut:
            cut = j
    return plain[:cut]


def head(name: str) -> str:
    """The qualified function name of a normalised name, without template arguments or parameters.

    For launch wrappers (``cutlass::device_kernel<Op>``, ``ck_tile::kentry<1, Op>``) it is the wrapped
    operation's name.
    """
    plain = name.replace("(anonymous namespace)", "{anon}")
    fn = _plain_head(plain)
    if fn in WRAPPERS and plain[len(fn):len(fn) + 1] == "<":
        inner = plain[len(fn) + 1:]
        while True:
            stripped = _LEADING_LITERALS.sub("", inner, count=1)
            if stripped == inner:
                break
            inner = stripped
        inner_fn = _plain_head(inner).strip()
        if inner_fn:
            fn = inner_fn
    return fn.replace("{anon}", "(anonymous namespace)")
