"""Kernel classification: names → bucket / sub-bucket / precision / rule, from rules kept as data.

>>> from traceanalyzer.classify import classify_names
>>> [c.bucket for c in classify_names(["nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "ncclDevKernel_SendRecv"])]
['gemm', 'communication']

See docs/CLASSIFY.md for the buckets, the rules and how to extend them, ``rules/default.toml`` for the rules.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..model.buckets import BUCKETS, EXCLUSIVE_PRECEDENCE
from ..model.errors import BadInputError
from ..model.trace import Trace
from .context import refine_with_context
from .engine import FALLBACK_RULE, KernelClass, classify_one, classify_unique
from .normalize import normalize_name
from .rules import PRECISIONS, Rule, RuleSet, load_rules, rule_set
from .trace_columns import MEMOP_SUBBUCKETS, classify_trace


def read_names(path: Path | str) -> list[str]:
    """Kernel names, one per line, from a file (``-`` = stdin); blank lines are skipped. Raises BadInputError for
    a missing/unreadable file, non-UTF-8 or binary data, or no names at all."""
    label = str(path)
    try:
        if label == "-":
            data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
            label = "<stdin>"
        else:
            data = Path(path).read_bytes()
    except FileNotFoundError:
        raise BadInputError(label, "no such file") from None
    except IsADirectoryError:
        raise BadInputError(label, "is a directory, expected a file of kernel names") from None
    except OSError as exc:
        raise BadInputError(label, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadInputError(label, f"not UTF-8 text (byte {exc.start})") from None
    if "\x00" in text:
        raise BadInputError(label, f"binary data (NUL byte at {text.index(chr(0))}), expected kernel names as text")
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise BadInputError(label, "no kernel names (the input is empty)", "give one kernel name per line")
    return names


def classified(trace: Trace, rules: Path | str | None = None) -> Trace:
    """Kernel/memop bucket columns from the rules (user ``rules`` first), then the context pass."""
    return refine_with_context(classify_trace(trace, rules=rules))


def classify_names(names: list[str], rules: Path | str | None = None) -> list[KernelClass]:
    """Classify kernel names (user ``rules`` file checked before the defaults), in input order."""
    ruleset = rule_set(rules)
    unique = classify_unique(names, ruleset)
    return [unique[n] for n in names]


__all__ = [
    "BUCKETS",
    "EXCLUSIVE_PRECEDENCE",
    "FALLBACK_RULE",
    "MEMOP_SUBBUCKETS",
    "PRECISIONS",
    "KernelClass",
    "Rule",
    "RuleSet",
    "classified",
    "classify_names",
    "classify_one",
    "classify_trace",
    "load_rules",
    "normalize_name",
    "read_names",
    "refine_with_context",
    "rule_set",
]
