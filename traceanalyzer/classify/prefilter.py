"""Literal prefilter for rule regexes: substrings every match must contain, found from the parsed pattern.

A rule is tried (its regex searched) only when its text holds one of its required literals; a plain ``in`` test
costs a fraction of a regex search, and most rules fail it. The answer never changes: a literal is required
only when every match of the pattern contains it (``tests/test_classify_prefilter.py`` checks both on the corpus).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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


def backtracking_hazard(pattern: str, flags: int = 0) -> str | None:
    """What in a user's regex can take exponential time on a text that almost matches, or None when nothing
    does (or the pattern does not parse: :func:`re.compile` says why):

    * a repetition repeated without bound (``(a+)+``, ``(\\w*x?)*``); bounded repeats (``{2}``, ``?``) are
      harmless;
    * an unbounded repetition of an alternation that can spell one text two ways (``(a|a)*``, ``(a|aa)+``,
      ``(.|\\s)*``, ``(\\d\\d|[0-9])*``): ``w`` read two ways makes ``w`` repeated n times read 2**n ways.
      Decided by the Sardinas–Patterson test on the body's texts (at most ``_MAX_WORDS``), each character class
      spelled by one representative character per set of classes it falls in (:class:`_Alphabet`); a body with a
      lookaround, a back-reference or too many texts is not judged. Plain groups of literals (``(ab)+``,
      ``(?:er|ne)+``, ``(foo|foobar)+``) are fine."""
    try:
        parsed = _p.parse(pattern, flags)
    except Exception:
        return None
    shared = _BUDGET.get()
    budget = shared if shared is not None else [MAX_CHECKED_CLASSES]
    try:
        return _nested(parsed, inside=False, flags=parsed.state.flags, budget=budget)
    except _OverBudget:
        return OVER_BUDGET


class _OverBudget(Exception):
    """The patterns hold more one-character items in repeated bodies than :data:`MAX_CHECKED_CLASSES`."""


_MAX_WORDS = 512  # texts of a repeated body read exactly; a larger body is not judged
#: distinct one-character items (sets, ``.``, literals) of repeated bodies the check reads per pattern, or per
#: rules file inside :func:`class_budget` (about 0.3 ms each: the check stays under ~1 s however crafted)
MAX_CHECKED_CLASSES = 4096
_BUDGET: ContextVar[list[int] | None] = ContextVar("hazard_class_budget", default=None)
OVER_BUDGET = f"more character classes in repeated groups than the check reads ({MAX_CHECKED_CLASSES:,} in all)"


@contextmanager
def class_budget() -> Iterator[None]:
    """Inside the block every :func:`backtracking_hazard` call draws on one budget of
    :data:`MAX_CHECKED_CLASSES` (a rules file's patterns together)."""
    token = _BUDGET.set([MAX_CHECKED_CLASSES])
    try:
        yield
    finally:
        _BUDGET.reset(token)


#: characters tried as representatives of the classes: ASCII and a few that fall in other Unicode classes
#: (accented letter, Arabic-Indic digit, no-break and line-separator spaces, CJK, long s, Kelvin sign)
_SAMPLES = [chr(i) for i in range(128)] + ["é", "٣", "\u00a0", "\u2028", "中", "ſ", "\u212a"]
_CATEGORY_TESTS: dict[Any, re.Pattern[str]] = {  # each category as the engine reads it (Unicode str patterns)
    _c.CATEGORY_DIGIT: re.compile(r"\d"), _c.CATEGORY_NOT_DIGIT: re.compile(r"\D"),
    _c.CATEGORY_WORD: re.compile(r"\w"), _c.CATEGORY_NOT_WORD: re.compile(r"\W"),
    _c.CATEGORY_SPACE: re.compile(r"\s"), _c.CATEGORY_NOT_SPACE: re.compile(r"\S"),
}


class _Alphabet:
    """The characters a repeated body's one-character items (literals, sets, ``.``) can match, as
    representatives: one per distinct answer of all those items together, so two texts of representatives are
    equal exactly when some real texts can be read both ways (for the characters tried: ``_SAMPLES`` and the
    pattern's literals)."""

    def __init__(self, items: Any, flags: int, budget: list[int]) -> None:
        self.fold = bool(flags & re.IGNORECASE)
        self.dotall = bool(flags & re.DOTALL)
        found: list[tuple[Any, Any]] = []
        literals: set[str] = set()
        _collect(items, found, literals)
        tests = list({repr(t): t for t in found}.values())  # one test per distinct item
        budget[0] -= len(tests)
        if budget[0] < 0:
            raise _OverBudget
        candidates = list(dict.fromkeys([*_SAMPLES, *sorted(literals)]))
        seen: dict[tuple[bool, ...], str] = {}
        for ch in candidates:
            signature = tuple(bool(self.matches(op, av, ch)) for op, av in tests)
            if any(signature):
                seen.setdefault(signature, ch)
        self.chars = list(seen.values())

    def matches(self, op: Any, av: Any, ch: str) -> bool | None:
        """Whether the one-character item matches ``ch`` (None: not a one-character item this reads)."""
        if op is _c.LITERAL or op is _c.NOT_LITERAL:
            same = ch == chr(av) or (self.fold and ch.lower() == chr(av).lower())
            return same if op is _c.LITERAL else not same
        if op is _c.ANY:
            return self.dotall or ch != "\n"
        if op is _c.IN:
            negate = False
            hit = False
            for kind, value in av:
                if kind is _c.NEGATE:
                    negate = True
                elif kind is _c.LITERAL:
                    hit |= ch == chr(value) or (self.fold and ch.lower() == chr(value).lower())
                elif kind is _c.RANGE:
                    hit |= any(value[0] <= ord(c) <= value[1] for c in {ch, ch.lower(), ch.upper()}
                               if self.fold or c == ch)
                elif kind is _c.CATEGORY and value in _CATEGORY_TESTS:
                    hit |= _CATEGORY_TESTS[value].match(ch) is not None
                else:
                    return None
            return hit != negate
        return None

    def of(self, op: Any, av: Any) -> list[str] | None:
        """The representatives the item matches, or None when it is not a one-character item this reads."""
        if self.matches(op, av, "a") is None:
            return None
        return [ch for ch in self.chars if self.matches(op, av, ch)]


def _has_choice(items: Any) -> bool:
    """Whether the items can match in more than one shape: an alternation, or a repeat of varying count (a body
    without either reads every text one way: its texts all have one length, one item per position)."""
    for op, av in items:
        if op is _c.BRANCH or (op in _REPEATS and av[0] != av[1]):
            return True
        if op is _c.SUBPATTERN and _has_choice(av[3]):
            return True
        if op in _REPEATS and _has_choice(av[2]):
            return True
    return False


def _collect(items: Any, tests: list[tuple[Any, Any]], literals: set[str]) -> None:
    """The one-character items under ``items`` (and the literal characters among them), for :class:`_Alphabet`."""
    for op, av in items:
        if op in (_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN):
            tests.append((op, av))
            if op is _c.LITERAL or op is _c.NOT_LITERAL:
                literals.add(chr(av))
            elif op is _c.IN:
                literals.update(chr(v) for k, v in av if k is _c.LITERAL)
        elif op is _c.SUBPATTERN:
            _collect(av[3], tests, literals)
        elif op is _c.BRANCH:
            for branch in av[1]:
                _collect(branch, tests, literals)
        elif op in _REPEATS:
            _collect(av[2], tests, literals)


def _words(items: Any, alphabet: _Alphabet) -> list[str] | None:
    """Every text (in ``alphabet``'s representatives) the item sequence matches, one entry per way of matching
    it (so ``a|a`` gives two), or None when the texts are not few (a lookaround, a back-reference, too many)."""
    out = [""]
    for op, av in items:
        part = _item_words(op, av, alphabet)
        if part is None:
            return None
        out = [a + b for a in out for b in part]
        if len(out) > _MAX_WORDS:
            return None
    return out


def _item_words(op: Any, av: Any, alphabet: _Alphabet) -> list[str] | None:
    """:func:`_words` of one parsed item."""
    if op in (_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN):
        return alphabet.of(op, av)  # a character class matches each character one way
    if op is _c.SUBPATTERN:
        return _words(av[3], alphabet)
    if op is _c.BRANCH:
        part: list[str] = []
        for branch in av[1]:
            sub = _words(branch, alphabet)
            if sub is None:
                return None
            part.extend(sub)
        return part
    if op in _REPEATS and av[1] is not _c.MAXREPEAT and av[1] <= 8:
        return _bounded_repeat_words(av[0], av[1], av[2], alphabet)
    return None


def _bounded_repeat_words(low: int, high: int, items: Any, alphabet: _Alphabet) -> list[str] | None:
    """:func:`_words` of ``items{low,high}``."""
    body = _words(items, alphabet)
    if body is None:
        return None
    part: list[str] = []
    power = [""]
    for k in range(high + 1):
        if k >= low:
            part.extend(power)
        power = [a + b for a in power for b in body]
        if len(power) > _MAX_WORDS:
            return None
    return part


def _reads_two_ways(words: list[str]) -> bool:
    """Whether some text is a concatenation of ``words`` in two ways: a word listed twice, or the code is not
    uniquely decodable (Sardinas–Patterson: a dangling suffix that is itself a word). The empty word is left
    out: the regex engine does not iterate on an empty match."""
    if len(set(words)) < len(words):
        return True
    code = {w for w in words if w}
    dangling = {b[len(a):] for a in code for b in code if a != b and b.startswith(a)}
    seen: set[str] = set()
    while dangling:
        if dangling & code or "" in dangling:
            return True
        seen |= dangling
        step = {b[len(a):] for a in code for b in dangling if b.startswith(a)} | \
               {b[len(a):] for a in dangling for b in code if b.startswith(a)}
        dangling = step - seen
    return False


def _unbounded(op: Any, av: Any) -> bool:
    return op in _REPEATS and av[1] is _c.MAXREPEAT


def _nested(items: Any, *, inside: bool, flags: int, budget: list[int]) -> str | None:
    for op, av in items:
        subs: list[Any] = []
        if op in _REPEATS:
            if inside and _unbounded(op, av):
                return "an unbounded repetition inside another"
            if _unbounded(op, av) and op is not getattr(_c, "POSSESSIVE_REPEAT", None):
                words = _words(av[2], _Alphabet(av[2], flags, budget)) if _has_choice(av[2]) else None
                if words is not None and _reads_two_ways(words):
                    return "a repeated alternation that can read one text two ways"
            found = _nested(av[2], inside=inside or _unbounded(op, av), flags=flags, budget=budget)
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
            found = _nested(sub, inside=inside, flags=flags, budget=budget)
            if found:
                return found
    return None
