"""The rule prefilter (required literals) gives the same first matching rule as trying every regex in order."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from traceanalyzer.classify import classify_names, classify_one, rule_set
from traceanalyzer.classify.engine import classify_many
from traceanalyzer.classify.normalize import head, normalize_name
from traceanalyzer.classify.prefilter import required_literals
from traceanalyzer.classify.rules import Rule, RuleSet, parse_rules

DATA = Path(__file__).parent / "data"


def _reference(rules: RuleSet, name: str) -> Rule | None:
    """The classifier's definition: every rule's ``matches`` in order, no prefilter."""
    norm = normalize_name(name)
    fn = head(norm)
    return next((r for r in rules.rules if r.matches(norm, fn, norm.lower(), fn.lower())), None)


def _fast(rules: RuleSet, name: str) -> Rule | None:
    norm = normalize_name(name)
    fn = head(norm)
    return rules.first_match(norm, fn, norm.lower(), fn.lower())


def _corpus(shared: Path | None) -> list[str]:
    paths = [DATA / "kernel_names_extra.csv"]
    if shared is not None:
        paths.append(shared.parent / "kernels" / "kernel_names_dev.csv")
    names = [row["name"] for p in paths if p.is_file() for row in csv.DictReader(p.open(encoding="utf-8"))]
    variants = [f"{n}<{i}>" for i, n in enumerate(names)] + [n.upper() for n in names] + \
        [n.replace("_", "") for n in names] + [f"void {n.split('(')[0]}_{i}(int)" for i, n in enumerate(names)]
    return names + variants


@pytest.mark.parametrize(("pattern", "expected"), [
    (r"^nccl(dev)?kernel_allreduce", ("kernel_allreduce",)),
    (r"ab?c", ("a",)),  # an optional letter breaks the run: "ac" need not appear
    (r"(foo|bar)baz", ("baz",)),
    (r"(foo|bar)x", ("bar", "foo")),
    (r"(foo|)xy?", ("x",)),
    (r"x*|y", None),  # an empty match is possible: nothing is required
    (r"(?:abc){2,}", ("abc",)),
    (r"a[bc]d|e", ("a", "e")),  # a character class breaks the run; either branch's literal
    (r"(?<![a-z])rope", ("rope",)),  # lookarounds require nothing themselves
])
def test_required_literals_of_patterns(pattern: str, expected: tuple[str, ...] | None) -> None:
    assert required_literals(re.compile(pattern)) == expected


def test_case_insensitive_patterns_get_no_prefilter() -> None:
    assert required_literals(re.compile("nccl", re.IGNORECASE)) is None
    assert required_literals(re.compile("(?i)nccl")) is None
    assert required_literals(re.compile("a(?i:b)c")) in {("a",), ("c",)}  # never "abc": b may be upper case


def test_literals_are_in_every_matched_text(shared_data_optional: Path | None) -> None:
    """Soundness on the corpus: whenever a rule's regex matches, its text holds one of its literals."""
    rules = rule_set().rules
    checked = 0
    for name in _corpus(shared_data_optional):
        norm = normalize_name(name)
        fn = head(norm)
        for rule in rules:
            text = (fn if rule.on_head else norm)
            text = text.lower() if rule.lowercase else text
            if rule.literals and rule.pattern.search(text):
                assert any(lit in text for lit in rule.literals), (rule.id, name)
                checked += 1
    assert checked > 1000


def test_fast_path_gives_the_reference_answers_on_the_corpus(shared_data_optional: Path | None) -> None:
    rules = rule_set()
    names = _corpus(shared_data_optional)
    assert len(names) > 1000
    assert sum(r.literals is not None for r in rules.rules) > len(rules.rules) // 2  # the prefilter is in use
    for name in names:
        assert _fast(rules, name) is _reference(rules, name), name


def test_fast_path_honours_not_match_not_prefix_and_case() -> None:
    rules = RuleSet(parse_rules('''
[[rule]]
id = "a"
match = "gemm"
not_match = "Skip"
bucket = "gemm"

[[rule]]
id = "b"
match = "Gemm"
case_sensitive = true
not_prefix = ["x"]
bucket = "attention"

[[rule]]
id = "c"
match = "gemm"
on = "head"
bucket = "other"
''', "test.toml"))
    for name in ["my_gemm", "my_gemm_skip", "xGemm_skip", "Gemm_skip", "GEMM", "f<gemm>(int)", "gem"]:
        assert _fast(rules, name) is _reference(rules, name), name


def test_many_distinct_names_classify_like_the_reference() -> None:
    """5,000 distinct names (template variants of the researched corpus): whole results equal the reference."""
    base = _corpus(None)
    names = [f"{base[i % len(base)]}<{i}>" for i in range(5000)]
    got = classify_names(names)
    rules = rule_set()
    assert len({c.name for c in got}) == 5000
    for c in got:
        ref = _reference(rules, c.name)
        assert c.rule == (ref.id if ref else "fallback.other"), c.name


def test_names_split_across_processes_classify_as_in_one() -> None:
    base = _corpus(None)
    names = [f"{base[i % len(base)]}<{i}>" for i in range(3000)]
    rules = rule_set()
    split = classify_many(names, rules, parallel_min=1000)
    assert split == [classify_one(n, rules) for n in names]


# -- the gated normalisation and the lower-case precision patterns against their plain definitions ---------------
# the regex definitions of the two suffix steps (normalize.py now does them in linear time, issue 30)
_ROCM_SUFFIX = re.compile(r"(?:\s*\[clone [^\]]*\])+$|\.kd$")
_TRUNCATED = re.compile(r"\s*(?:\.\.\.|…)\s*$")


def _normalize_reference(raw: str) -> str:
    from traceanalyzer.classify import normalize as n

    name = _ROCM_SUFFIX.sub("", raw.strip())
    name = _ROCM_SUFFIX.sub("", name)
    if name.startswith("_Z"):
        name = n.demangle(name)
    name = _TRUNCATED.sub("", name)
    name = n._SPACES.sub(" ", name)
    name = n._strip_enable_if(n._RETURN_TYPE.sub("", name))
    name = n._ANON.sub("(anonymous namespace)", name)
    if "<" in name or "(" in name:
        text = n._BOOL_CAST.sub(lambda m: "true" if m.group(1) == "1" else "false", name)
        name = n._INT_SUFFIX.sub(r"\1", n._BUILTIN_CAST.sub(r"\1", text))
        while True:
            collapsed = n._CLOSE.sub(">>", name)
            if collapsed == name:
                break
            name = collapsed
        name = n._PTR_SPACE.sub(r"\1", name)
    return name.strip()


def _precision_reference(name: str) -> str:
    from traceanalyzer.classify import engine as e

    nvjet = e._NVJET_TYPES.match(name)
    if nvjet:
        return e._NVJET_CODES.get(nvjet.group(1), "unknown")
    text = e._DTYPE_LIST_IN_NAME.sub("", e._template_part(name))
    return next((p for p, pattern in e._PRECISION_PATTERNS if pattern.search(text)), "unknown")


def _tricky(names: list[str]) -> list[str]:
    extra = ["void f<(bool)1, 4096ul>(T1 const *, int &) [clone .kd]", "k<a >  > ...", "x\tgemm  (int)\n*",
             "{anonymous}::k<<unnamed>::T>", "{anonymous}::kernel_a<int>", "ſgemm_kernel", "Kernel_fp16\u212a",
             "__nv_bfloat16 … ",
             "cutlass::Kernel<float, 2> *", "gemm<half >(half *)", "foo.kd", "a  &b"]
    return names + extra + [f" {n}  ..." for n in names[:200]] + [n.replace("_", " _") for n in names[:200]]


def test_gated_normalisation_gives_the_plain_result(shared_data_optional: Path | None) -> None:
    from traceanalyzer.classify.normalize import normalize_name

    for name in _tricky(_corpus(shared_data_optional)):
        assert normalize_name(name) == _normalize_reference(name), name


def test_lower_case_precision_patterns_give_the_plain_result(shared_data_optional: Path | None) -> None:
    from traceanalyzer.classify.engine import infer_precision
    from traceanalyzer.classify.normalize import normalize_name

    names = _tricky(_corpus(shared_data_optional))
    got = [infer_precision(normalize_name(n)) for n in names]
    assert got == [_precision_reference(normalize_name(n)) for n in names]
    assert {"unknown", "fp4", "fp8", "bf16", "fp16", "fp32"} <= set(got)


def test_positive_lookarounds_require_their_literals_negative_ones_nothing() -> None:
    assert required_literals(re.compile(r"^(?=.*(grouped|moe))(?=.*fp4)")) == ("fp4",)
    assert required_literals(re.compile(r"(?!nccl)x")) == ("x",)
    assert required_literals(re.compile(r"(?!nccl)")) is None
