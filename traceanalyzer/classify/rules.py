"""Classification rules as data: load, validate and compile the ordered rules of a TOML file.

A rules file is a list of ``[[rule]]`` tables, checked top to bottom; the first that matches wins::

    [[rule]]
    id = "comm.nccl.allreduce"          # unique, shown in reports as the rule that matched
    match = '^nccl(Dev)?Kernel_AllReduce' # regex searched in the normalised kernel name
    bucket = "communication"
    subbucket = "allreduce"
    # optional:
    on = "name"                 # "name" (default) or "head" (qualified function name only)
    case_sensitive = false      # default false
    not_match = 'regex'         # rule does not apply when this also matches
    not_prefix = ["triton_"]    # ... or when the name starts with one of these
    precision = "fp4"           # else inferred from the name
    fp4_format = "nvfp4"        # nvfp4 | mxfp4, else inferred
    fused = ["allreduce", "rmsnorm"]
    tags = ["fused_comm"]
    confidence = "low"          # default "high"
    moe_stage = "router"        # the part of an MoE layer the kernel is (buckets.MOE_STAGES; docs/MOE.md)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..model.buckets import BUCKETS, MOE_BUCKETS, MOE_STAGES
from ..model.errors import RulesError
from .prefilter import OVER_BUDGET, backtracking_hazard, class_budget, required_literals

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

PRECISIONS: tuple[str, ...] = ("fp4", "fp8", "int4", "int8", "bf16", "fp16", "fp32", "unknown")
FP4_FORMATS: tuple[str, ...] = ("nvfp4", "mxfp4")
CONFIDENCES: tuple[str, ...] = ("high", "low")

#: bytes a user rules file may hold (the shipped rules are 23 kB): a bigger one is refused, not parsed
MAX_RULES_BYTES = 1 << 20

_KEYS = {"id", "match", "bucket", "subbucket", "on", "case_sensitive", "not_match", "not_prefix", "precision",
         "fp4_format", "fused", "tags", "confidence", "note", "moe_stage"}


@dataclass(frozen=True)
class Rule:
    """One compiled rule."""

    id: str
    pattern: re.Pattern[str]
    bucket: str
    subbucket: str
    on_head: bool = False
    exclude: re.Pattern[str] | None = None
    not_prefix: tuple[str, ...] = ()
    precision: str | None = None
    fp4_format: str | None = None
    fused: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    confidence: str = "high"
    source: str = "default"
    lowercase: bool = False  # case-insensitive rule compiled for lower-cased text (3x faster than IGNORECASE)
    literals: tuple[str, ...] | None = None  # one of them is in every text the pattern matches (prefilter)
    moe_stage: str | None = None  # the part of an MoE layer (buckets.MOE_STAGES), None: not MoE work by name

    def matches(self, name: str, head: str, lname: str, lhead: str) -> bool:
        """Whether this rule applies to a normalised name.

        ``head`` is its qualified function name; ``lname`` / ``lhead`` are both lower-cased.
        """
        if self.not_prefix and name.startswith(self.not_prefix):
            return False
        if self.lowercase:
            name, head = lname, lhead
        if not self.pattern.search(head if self.on_head else name):
            return False
        return self.exclude is None or not self.exclude.search(name)


@dataclass(frozen=True)
class RuleSet:
    """Ordered rules: user rules first, then the defaults."""

    rules: tuple[Rule, ...]
    sources: tuple[str, ...] = field(default_factory=tuple)

    @property
    def _plan(self) -> _Plan:
        """Which text each rule reads (0 name, 1 head, 2 lower name, 3 lower head); the bit mask of rules without
        literals (always tried); per text, a regex finding the literals in it and literal → mask of the rules
        it admits (see :meth:`first_match`). Built once per rules tuple (every trace's RuleSet shares it)."""
        cached = _PLANS.get(id(self.rules))
        if cached is None or cached[0] is not self.rules:
            if len(_PLANS) >= 8:  # user rule sets come and go; the default one is rebuilt at most now and then
                _PLANS.clear()
            cached = _PLANS[id(self.rules)] = (self.rules, _build_plan(self.rules))
        return cached[1]

    def first_match(self, name: str, head: str, lname: str, lhead: str) -> Rule | None:
        """The first rule that applies (as ``Rule.matches`` tried in order), trying only the rules whose text
        holds one of their required literals (found for all rules at once: one regex pass per text, which
        reports the longest literal starting at each position) and the rules without literals."""
        texts = (name, head, lname, lhead)
        kinds, candidates, index = self._plan
        for text, (finder, masks) in zip(texts, index, strict=True):
            if finder is not None:
                for lit in set(finder.findall(text)):
                    candidates |= masks[lit]
        while candidates:
            low = candidates & -candidates
            candidates ^= low
            i = low.bit_length() - 1
            rule, text = self.rules[i], texts[kinds[i]]
            if rule.not_prefix and name.startswith(rule.not_prefix):
                continue
            if rule.pattern.search(text) and (rule.exclude is None
                                              or not rule.exclude.search(lname if rule.lowercase else name)):
                return rule
        return None


_Plan = tuple[tuple[int, ...], int, tuple[tuple[re.Pattern[str] | None, dict[str, int]], ...]]
_PLANS: dict[int, tuple[tuple[Rule, ...], _Plan]] = {}


def _build_plan(rules: tuple[Rule, ...]) -> _Plan:
    """See :attr:`RuleSet._plan`."""
    kinds = tuple((2 if r.lowercase else 0) + (1 if r.on_head else 0) for r in rules)
    always = sum(1 << i for i, r in enumerate(rules) if not r.literals)
    index = []
    for kind in range(4):
        owners: dict[str, int] = {}
        for i, r in enumerate(rules):
            if kinds[i] == kind and r.literals:
                for lit in r.literals:
                    owners[lit] = owners.get(lit, 0) | (1 << i)
        # a literal found admits the rules of every literal that is a prefix of it (they occur there too)
        masks = {lit: _or(m for p, m in owners.items() if lit.startswith(p)) for lit in owners}
        index.append((re.compile(f"(?=({_trie(owners)}))") if owners else None, masks))
    return kinds, always, tuple(index)


def _or(masks: Iterable[int]) -> int:
    out = 0
    for m in masks:
        out |= m
    return out


def _trie(words: Iterable[str]) -> str:
    """A regex matching the longest of ``words`` that starts where it is tried (a trie: one branch per letter,
    greedy optional tails)."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(root)


def _fail(path: str, problem: str) -> RulesError:
    return RulesError(path, problem)


def _str_list(value: Any, key: str, where: str, path: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, f"{where}: '{key}' must be a string or a list of strings")
    return tuple(value)


def _choice(raw: dict[str, Any], key: str, allowed: tuple[str, ...], where: str, path: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if value not in allowed:
        raise _fail(path, f"{where}: {key} {value!r} is not one of {', '.join(allowed)}")
    return str(value)


_UPPER_ESCAPE = re.compile(r"\\[A-Z]|\\[pPN]\{")


def _compile(text: Any, flags: int, key: str, where: str, path: str, lowercase: bool = False) -> re.Pattern[str]:
    if not isinstance(text, str) or not text:
        raise _fail(path, f"{where}: '{key}' must be a non-empty regex string")
    try:
        pattern = re.compile(text.lower()) if lowercase else re.compile(text, flags)
    except (re.error, RecursionError, OverflowError) as exc:
        raise _fail(path, f"{where}: bad regex in '{key}': {exc}") from None
    nested = backtracking_hazard(pattern.pattern, pattern.flags)
    if nested == OVER_BUDGET:
        raise _fail(path, f"{where}: the regex in '{key}' takes the rules past what the backtracking check reads: "
                    f"{nested}")
    if nested:
        raise _fail(path, f"{where}: the regex in '{key}' has {nested}, whose backtracking can take exponential "
                    "time on a long name — repeat a plain group instead (e.g. '(ab)+', not '(a+b)+')")
    return pattern


def compile_rule(raw: Any, index: int, path: str) -> Rule:
    """A validated :class:`Rule` from one ``[[rule]]`` table (``path`` names the file in errors)."""
    if not isinstance(raw, dict):
        raise _fail(path, f"rule #{index + 1} is not a table")
    rid = raw.get("id")
    where = f"rule #{index + 1}" + (f" ({rid})" if isinstance(rid, str) else "")
    if not isinstance(rid, str) or not rid:
        raise _fail(path, f"{where}: missing 'id'")
    unknown = set(raw) - _KEYS
    if unknown:
        raise _fail(path, f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    bucket = _choice(raw, "bucket", BUCKETS, where, path)
    if bucket is None:
        raise _fail(path, f"{where}: missing 'bucket'")
    subbucket = raw.get("subbucket", bucket)
    if not isinstance(subbucket, str) or not subbucket:
        raise _fail(path, f"{where}: 'subbucket' must be a non-empty string")
    on = raw.get("on", "name")
    if on not in ("name", "head"):
        raise _fail(path, f"{where}: 'on' must be \"name\" or \"head\"")
    flags = 0 if raw.get("case_sensitive", False) is True else re.IGNORECASE
    texts = [t for t in (raw.get("match"), raw.get("not_match")) if isinstance(t, str)]
    lowercase = flags == re.IGNORECASE and not any(_UPPER_ESCAPE.search(t) for t in texts)
    pattern = _compile(raw.get("match"), flags, "match", where, path, lowercase)
    exclude = _compile(raw["not_match"], flags, "not_match", where, path, lowercase) if "not_match" in raw else None
    return Rule(
        id=rid,
        pattern=pattern,
        bucket=bucket,
        subbucket=subbucket,
        on_head=on == "head",
        exclude=exclude,
        not_prefix=_str_list(raw.get("not_prefix", []), "not_prefix", where, path),
        precision=_choice(raw, "precision", PRECISIONS, where, path),
        fp4_format=_choice(raw, "fp4_format", FP4_FORMATS, where, path),
        fused=_str_list(raw.get("fused", []), "fused", where, path),
        tags=_str_list(raw.get("tags", []), "tags", where, path),
        confidence=_choice(raw, "confidence", CONFIDENCES, where, path) or "high",
        source=path,
        lowercase=lowercase,
        literals=required_literals(pattern),
        moe_stage=_choice(raw, "moe_stage", MOE_STAGES, where, path) or _default_stage(bucket),
    )


def _default_stage(bucket: str) -> str | None:
    """The MoE stage of a rule that names none: expert GEMM buckets are the experts (docs/MOE.md)."""
    return "expert" if bucket in MOE_BUCKETS else None


def parse_rules(text: str, path: str) -> tuple[Rule, ...]:
    """Rules from TOML text; raises :class:`RulesError` naming ``path`` and the first problem."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _fail(path, f"invalid TOML: {exc}") from None
    except RecursionError:
        raise _fail(path, "invalid TOML: arrays or tables nested too deeply") from None
    raw_rules = doc.get("rule")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise _fail(path, "no [[rule]] tables")
    with class_budget():  # the backtracking check reads a bounded number of classes over the whole file
        rules = tuple(compile_rule(r, i, path) for i, r in enumerate(raw_rules))
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise _fail(path, f"duplicate rule id {rule.id!r}")
        seen.add(rule.id)
    return rules


@lru_cache(maxsize=1)
def default_rules() -> tuple[Rule, ...]:
    """The rules shipped inside the package (``traceanalyzer/rules/default.toml``)."""
    text = resources.files("traceanalyzer").joinpath("rules/default.toml").read_text(encoding="utf-8")
    return parse_rules(text, "default.toml")


def load_rules(path: Path | str) -> tuple[Rule, ...]:
    """User rules from a TOML file; any problem is a :class:`RulesError` (exit code 2)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:  # a stream (a pipe, /dev/zero) is read only up to the limit
            data = fh.read(MAX_RULES_BYTES + 1)
        if len(data) > MAX_RULES_BYTES:
            raise _fail(str(p), f"rules file larger than {MAX_RULES_BYTES >> 20} MiB — a rules file holds a few "
                        "[[rule]] tables (the shipped ones are 23 kB)")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise _fail(str(p), "no such rules file") from None
    except UnicodeDecodeError:
        raise _fail(str(p), "rules file is not UTF-8 text") from None
    except OSError as exc:
        raise _fail(str(p), f"cannot read rules file: {exc.strerror or exc}") from None
    return parse_rules(text, str(p))


def rule_set(user_rules: Path | str | None = None) -> RuleSet:
    """User rules (if any) ahead of the defaults."""
    defaults = default_rules()
    if user_rules is None:
        return RuleSet(defaults, ("default.toml",))
    return RuleSet(load_rules(user_rules) + defaults, (str(user_rules), "default.toml"))
