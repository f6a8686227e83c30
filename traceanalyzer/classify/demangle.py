"""A light Itanium C++ demangler: enough to turn mangled kernel symbols (``_Z…``) into readable names.

Kernel names reach traces mangled when a profiler could not demangle them (Kineto does this for some
CUTLASS instantiations). Classification needs the qualified function name and the text of the
template arguments, not a byte-exact ``c++filt``; so this covers the grammar kernels use (nested and
local names, template arguments, literals, substitutions, lambdas, function parameters) and, when a
symbol uses something outside it, falls back to the identifiers it contains.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

_BUILTIN = {
    "v": "void", "w": "wchar_t", "b": "bool", "c": "char", "a": "signed char", "h": "unsigned char",
    "s": "short", "t": "unsigned short", "i": "int", "j": "unsigned int", "l": "long",
    "m": "unsigned long", "x": "long long", "y": "unsigned long long", "n": "__int128",
    "o": "unsigned __int128", "f": "float", "d": "double", "e": "long double", "g": "__float128",
    "z": "...",
}
_D_BUILTIN = {"Dh": "half", "Di": "char32_t", "Ds": "char16_t", "Du": "char8_t", "Dn": "decltype(nullptr)",
              "Da": "auto", "Dc": "decltype(auto)", "Df": "decimal32", "Dd": "decimal64"}
_STD_SUBS = {"St": "std", "Sa": "std::allocator", "Sb": "std::basic_string", "Ss": "std::string",
             "Si": "std::istream", "So": "std::ostream", "Sd": "std::iostream"}
_LITERAL_SUFFIX = {"j": "u", "m": "ul", "l": "l", "y": "ull", "x": "ll"}
_SOURCE_NAME = re.compile(r"(\d+)")
_MANGLING_CODE = re.compile(r"^E*L[a-z]\d|^[A-Z]E$|^S\d*_")


#: characters that substitutions and template parameters may copy into one demangled name: a symbol whose
#: back-references double the text at each step (a demangling bomb: 465 bytes → gigabytes) falls back to the
#: identifiers it contains instead (real kernel symbols copy a few thousand)
MAX_EXPANSION = 1 << 17


class _Fail(Exception):
    """The symbol uses grammar this light demangler does not cover (or expands past :data:`MAX_EXPANSION`)."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.subs: list[str] = []
        self.template_args: list[str] = []
        self.expanded = 0  # characters copied by back-references so far

    def copied(self, text: str) -> str:
        """``text`` copied by a back-reference, counted against :data:`MAX_EXPANSION`."""
        self.expanded += len(text)
        if self.expanded > MAX_EXPANSION:
            raise _Fail("expands too far")
        return text

    # -- low level -------------------------------------------------------------------------------
    def peek(self, n: int = 1) -> str:
        return self.s[self.i:self.i + n]

    def eat(self, token: str) -> bool:
        if self.s.startswith(token, self.i):
            self.i += len(token)
            return True
        return False

    def expect(self, token: str) -> None:
        if not self.eat(token):
            raise _Fail(f"expected {token!r} at {self.i}")

    def number(self) -> int:
        m = _SOURCE_NAME.match(self.s, self.i)
        if not m:
            raise _Fail("number")
        self.i = m.end()
        return int(m.group(1))

    def seq_id(self) -> int:
        """Base-36 index of S<seq>_ / T<seq>_ (empty = 0, else value + 1)."""
        j = self.s.find("_", self.i)
        if j < 0:
            raise _Fail("seq")
        raw = self.s[self.i:j]
        self.i = j + 1
        return 0 if raw == "" else int(raw, 36) + 1

    # -- names -----------------------------------------------------------------------------------
    def source_name(self) -> str:
        n = self.number()
        ident = self.s[self.i:self.i + n]
        if len(ident) != n:
            raise _Fail("short identifier")
        self.i += n
        if ident.startswith("_GLOBAL__N"):
            return "(anonymous namespace)"
        return ident

    def unqualified_name(self) -> str:
        c = self.peek()
        if c.isdigit():
            return self.source_name()
        if c == "U":
            return self.unnamed_type()
        if c in "CD" and self.peek(2)[1:].isdigit():
            self.i += 2
            return "{ctor/dtor}"
        if c == "L":  # internal linkage marker before a source name
            self.i += 1
            return self.source_name()
        return self.operator_name()

    def operator_name(self) -> str:
        code = self.peek(2)
        if len(code) == 2 and code.isalpha() and code[0].islower():
            self.i += 2
            if code == "cv":
                return "operator " + self.type_()
            return "operator" + {"cl": "()", "ix": "[]", "eq": "==", "pl": "+", "mi": "-", "ml": "*"}.get(code, code)
        raise _Fail(f"name at {self.i}")

    def unnamed_type(self) -> str:
        if self.eat("Ut"):
            idx = self.seq_id()
            return f"{{unnamed type#{idx + 1}}}"
        if self.eat("Ul"):
            params = self.bare_params("E")
            self.expect("E")
            idx = self.seq_id()
            return f"{{lambda({params})#{idx + 1}}}"
        raise _Fail("unnamed")

    def substitution(self) -> str:
        for key, text in _STD_SUBS.items():
            if self.eat(key):
                return text
        self.expect("S")
        idx = self.seq_id()
        if idx >= len(self.subs):
            raise _Fail("substitution out of range")
        return self.copied(self.subs[idx])

    def nested_name(self) -> str:
        self.expect("N")
        while self.peek() in ("r", "V", "K"):
            self.i += 1
        self.eat("R") or self.eat("O")
        parts = ""
        pending = False  # every prefix but the complete name is a substitution candidate
        while not self.eat("E"):
            c = self.peek()
            if not c:
                raise _Fail("unterminated nested name")
            if pending:
                self.subs.append(parts)
                pending = False
            if c == "S":
                piece = self.substitution()
                parts = piece if not parts else f"{parts}::{piece}"
                pending = False
                continue
            if c == "I":
                parts += self.template_args_()
            elif c == "T":
                parts = self.template_param()
            elif c == "D" and self.peek(2) in ("DT", "Dt"):
                raise _Fail("decltype prefix")
            else:
                piece = self.unqualified_name()
                parts = piece if not parts else f"{parts}::{piece}"
            pending = True
        return parts

    def local_name(self) -> str:
        self.expect("Z")
        outer = self.encoding()
        self.expect("E")
        if self.eat("s"):
            return outer + "::string literal"
        inner = self.name()
        if self.eat("_"):
            if self.peek() == "_":
                self.i += 1
                self.number()
                self.expect("_")
            elif self.peek().isdigit():
                self.i += 1
        return f"{outer}::{inner}"

    def name(self) -> str:
        c = self.peek()
        if c == "N":
            return self.nested_name()
        if c == "Z":
            return self.local_name()
        if c == "S" and self.peek(2) != "St":
            base = self.substitution()
            if self.peek() == "I":
                base += self.template_args_()
            return base
        base = "std::" + self.unqualified_name() if self.eat("St") else self.unqualified_name()
        if self.peek() == "I":
            self.subs.append(base)
            base += self.template_args_()
        return base

    # -- template arguments ----------------------------------------------------------------------
    def template_args_(self) -> str:
        self.expect("I")
        args: list[str] = []
        while not self.eat("E"):
            args.append(self.template_arg())
        self.template_args = args
        return "<" + ", ".join(a for a in args if a != "") + ">"

    def template_arg(self) -> str:
        c = self.peek()
        if c == "L":
            return self.literal()
        if c == "J":
            self.i += 1
            parts: list[str] = []
            while not self.eat("E"):
                parts.append(self.template_arg())
            return ", ".join(p for p in parts if p)
        if c == "X":
            raise _Fail("expression argument")
        return self.type_()

    def template_param(self) -> str:
        self.expect("T")
        idx = self.seq_id()
        if idx < len(self.template_args):
            return self.copied(self.template_args[idx])
        return f"T{idx + 1}"

    def literal(self) -> str:
        self.expect("L")
        if self.peek() == "_" and self.peek(2) == "_Z":
            self.i += 1
            self.expect("_Z")
            text = self.encoding()
            self.expect("E")
            return text
        if self.peek(2) == "_Z":
            self.i += 2
            text = self.encoding()
            self.expect("E")
            return text
        code = self.peek()
        if code in _BUILTIN and code != "z":
            self.i += 1
            end = self.s.index("E", self.i)
            value = self.s[self.i:end].replace("n", "-", 1) if self.s[self.i:end].startswith("n") \
                else self.s[self.i:end]
            self.i = end + 1
            if code == "b":
                return "true" if value == "1" else "false"
            return value + _LITERAL_SUFFIX.get(code, "")
        typ = self.type_()
        end = self.s.index("E", self.i)
        value = self.s[self.i:end]
        self.i = end + 1
        if value.startswith("n"):
            value = "-" + value[1:]
        return f"({typ}){value}"

    # -- types -----------------------------------------------------------------------------------
    def type_(self) -> str:
        c = self.peek()
        if c in _BUILTIN:
            self.i += 1
            return _BUILTIN[c]
        two = self.peek(2)
        if two in _D_BUILTIN:
            self.i += 2
            return _D_BUILTIN[two]
        if two == "DF":  # _Float16 and friends
            self.i += 2
            bits = self.number()
            self.eat("_")
            return f"_Float{bits}"
        if two == "Dp":
            self.i += 2
            return self.type_()
        if two == "Dv":
            self.i += 2
            n = self.number()
            self.expect("_")
            inner = self.type_()
            out = f"{inner} __vector({n})"
            self.subs.append(out)
            return out
        if c in "PROK" or c == "V":
            self.i += 1
            inner = self.type_()
            out = {"P": f"{inner}*", "R": f"{inner}&", "O": f"{inner}&&", "K": f"{inner} const",
                   "V": f"{inner} volatile"}[c]
            self.subs.append(out)
            return out
        if c == "F":
            self.i += 1
            self.eat("Y")
            ret = self.type_()
            params = self.bare_params("E")
            self.expect("E")
            out = f"{ret} ({params})"
            self.subs.append(out)
            return out
        if c == "A":
            self.i += 1
            size = str(self.number()) if self.peek().isdigit() else ""
            self.expect("_")
            inner = self.type_()
            out = f"{inner} [{size}]"
            self.subs.append(out)
            return out
        if c == "T":
            out = self.template_param()
            if self.peek() == "I":
                self.subs.append(out)
                out += self.template_args_()
            self.subs.append(out)
            return out
        if c == "S" and two not in _STD_SUBS:
            out = self.substitution()
            if self.peek() == "I":
                out += self.template_args_()
                self.subs.append(out)
            return out
        if c == "u":  # vendor extended type
            self.i += 1
            return self.source_name()
        out = self.name()
        self.subs.append(out)
        return out

    def bare_params(self, stop: str) -> str:
        params: list[str] = []
        while self.i < len(self.s) and not self.s.startswith(stop, self.i) and self.peek() != ".":
            params.append(self.type_())
        if params == ["void"]:
            return ""
        return ", ".join(params)

    def encoding(self) -> str:
        fname = self.name()
        saved_args = self.template_args
        params = ""
        if self.i < len(self.s) and self.peek() not in ("E", "."):
            if fname.endswith(">") and not fname.endswith("operator>"):
                self.type_()  # return type of a function template
            params = self.bare_params("E")
        self.template_args = saved_args
        return f"{fname}({params})"


def _fallback(symbol: str) -> str:
    """The identifiers of a mangled symbol: ``a::b<c, d>``-like text good enough to classify."""
    idents: list[str] = []
    i = 0
    while i < len(symbol):
        m = _SOURCE_NAME.match(symbol, i)
        if m:
            n = int(m.group(1))
            ident = symbol[m.end():m.end() + n]
            if len(ident) == n and n > 1 and (ident[:1].isalpha() or ident[:1] == "_") \
                    and not _MANGLING_CODE.match(ident):
                idents.append("(anonymous namespace)" if ident.startswith("_GLOBAL__N") else ident)
                i = m.end() + n
                continue
            i = m.end()
            continue
        i += 1
    if not idents:
        return symbol
    return "::".join(idents[:2]) + ("<" + ", ".join(idents[2:]) + ">" if len(idents) > 2 else "")


def demangle(symbol: str) -> str:
    """Readable text of an Itanium-mangled symbol (``_Z…``); other strings come back unchanged."""
    if not symbol.startswith("_Z"):
        return symbol
    core = symbol.split(".", 1)[0]  # .clone / .constprop suffixes
    parser = _Parser(core[2:])
    try:
        text = parser.encoding()
    except (_Fail, ValueError, IndexError, RecursionError):
        return _fallback(core)
    if parser.i < len(parser.s):
        return _fallback(core)
    return text


def display_name(name: str | None) -> str | None:
    """A kernel name as shown to people: mangled C++ symbols (``_Z…``, as Kineto leaves some CUTLASS kernels)
    demangled, others unchanged. The raw name stays in the data (``name`` columns, JSON evidence)."""
    if not name or not name.startswith("_Z"):
        return name
    return _demangled(name)


@lru_cache(maxsize=65536)
def _demangled(name: str) -> str:
    return demangle(name) or name


def display_names(names: Iterable[str | None]) -> list[str | None]:
    """:func:`display_name` of many names (each distinct name demangled once)."""
    return [display_name(n) for n in names]


_ANON = ("(anonymous namespace)", "{anonymous}", "<unnamed>")


def base_name(name: str | None) -> str:
    """A kernel's name without return type, template arguments and parameter list, for short labels:
    ``void (anonymous namespace)::multimem_all_reduce_kernel<__nv_bfloat16, 16>(…)`` →
    ``(anonymous namespace)::multimem_all_reduce_kernel``; ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(…)`` →
    ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``. The first ``<`` or ``(`` outside an anonymous-namespace marker
    ends the name; a leading return type (``void ``) is dropped."""
    text = str(display_name(name) or "")
    i = 0
    out = []
    while i < len(text):
        marker = next((m for m in _ANON if text.startswith(m, i)), None)
        if marker is not None:
            out.append(marker)
            i += len(marker)
            continue
        if text[i] in "<(":
            break
        out.append(text[i])
        i += 1
    short = "".join(out).strip()
    for k, marker in enumerate(_ANON):  # markers hold spaces: kept whole while the return type is cut off
        short = short.replace(marker, f"\x00{k}\x00")
    short = short.rsplit(" ", 1)[-1]
    for k, marker in enumerate(_ANON):
        short = short.replace(f"\x00{k}\x00", marker)
    return short or text
