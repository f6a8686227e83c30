"""Literal prefilter for rule regexes: substrings every match must contain, found from the parsed pattern.

A rule is tried (its regex searched) only when its text holds one of its required literals; a plain ``in`` test
costs a fraction of a regex search, and most rules fail it. The answer never changes: a literal is required
only when every match of the pattern contains it (``tests/test_classify_prefilter.py`` checks both on the corpus).
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

# the standard library's own regex parser (re._parser since Python 3.11, sre_parse before)
_c: Any = importlib.import_module("re._constants" if sys.version_info >= (3, 11) else "sre_constants")
_p: Any = importlib.import_module("re._parser" if sys.version_info >= (3, 11) else "sre_parse")

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT} | ({_c.POSSESSIVE_REPEAT} if hasattr(_c, "POSSESSIVE_REPEAT") else set())
_ATOMIC = getattr(_c, "ATOMIC_GROUP", None)


def _best(options: list[frozenset[str]]) -> frozenset[str] | None:
    """The most selective requirement: longest shortest literal, then fewest alternatives."""
    if not options:
        return None
    return max(options, key=lambda s: (min(map(len, s)), -len(s)))


def _sequence(items: Any) -> frozenset[str] | None:
    """Literals one of which every match of this parsed sequence contains (None: no such requirement)."""
    options: list[frozenset[str]] = []
    run: list[str] = []
    for op, av in items:
        if op is _c.LITERAL:
            run.append(chr(av))
            continue
        if run:
            options.append(frozenset(["".join(run)]))
            run = []
        need: frozenset[str] | None = None
        if op is _c.SUBPATTERN:
            _group, add_flags, _del_flags, sub = av
            need = None if add_flags & (re.IGNORECASE | re.VERBOSE) else _sequence(sub)
        elif op is _c.BRANCH:
            branches = [_sequence(b) for b in av[1]]
            need = None if any(b is None for b in branches) else frozenset[str]().union(*branches)  # type: ignore[arg-type]
        elif op in _REPEATS:
            low, _high, sub = av
            need = _sequence(sub) if low >= 1 else None
        elif _ATOMIC is not None and op is _ATOMIC:
            need = _sequence(av)
        elif op is _c.ASSERT:  # a positive lookaround: what it requires is in the text too
            need = _sequence(av[1])
        if need:
            options.append(need)
    if run:
        options.append(frozenset(["".join(run)]))
    return _best(options)


def required_literals(pattern: re.Pattern[str]) -> tuple[str, ...] | None:
    """Substrings one of which is in every text that ``pattern.search`` matches, or None when none is known
    (case-insensitive patterns get None: compile them for lower-cased text instead, as rules do)."""
    if pattern.flags & (re.IGNORECASE | re.VERBOSE) or not isinstance(pattern.pattern, str):
        return None
    try:
        need = _sequence(_p.parse(pattern.pattern, pattern.flags))
    except Exception:  # a construct this reader does not know: no prefilter, same answers
        return None
    return tuple(sorted(need)) if need else None


def nested_repeat(pattern: str, flags: int = 0) -> str | None:
    """The part of a user's regex that repeats a repetition without bound (``(a+)+``, ``(\\w*x?)*``), whose
    backtracking can take exponential time on a text that almost matches; None when there is none (or the
    pattern does not parse: :func:`re.compile` says why). Bounded repeats (``{2}``, ``?``) are harmless."""
    try:
        parsed = _p.parse(pattern, flags)
    except Exception:
        return None
    return _nested(parsed, inside=False, pattern=pattern)


def _unbounded(op: Any, av: Any) -> bool:
    return op in _REPEATS and av[1] is _c.MAXREPEAT


def _nested(items: Any, *, inside: bool, pattern: str) -> str | None:
    for op, av in items:
        subs: list[Any] = []
        if op in _REPEATS:
            if inside and _unbounded(op, av):
                return "an unbounded repetition inside another"
            found = _nested(av[2], inside=inside or _unbounded(op, av), pattern=pattern)
            if found:
                return found
            continue
        if op is _c.SUBPATTERN:
            subs = [av[3]]
        elif op is _c.BRANCH:
            subs = list(av[1])
        elif op is _c.ASSERT or op is _c.ASSERT_NOT:
            subs = [av[1]]
        elif _ATOMIC is not None and op is _ATOMIC:
            subs = [av]
        for sub in subs:
            found = _nested(sub, inside=inside, pattern=pattern)
            if found:
                return found
    return None
