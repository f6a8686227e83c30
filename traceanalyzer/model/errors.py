"""Typed errors and exit codes: the one place where failures become messages."""

from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path

#: what a terminal acts on instead of showing: C0 and C1 controls (newlines, ESC of ANSI/OSC sequences, BEL), DEL,
#: and the Unicode controls that reorder or break what follows (bidi embeddings, overrides and isolates U+202A–202E,
#: U+2066–2069, the marks U+200E, U+200F, U+061C; line and paragraph separators U+2028, U+2029)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object, *, keep: str = "") -> str:
    """``text`` made inert for a terminal, the one sanitizer of everything shown there: each control character
    (newlines, ANSI/OSC escapes, C1 codes, bidi controls) shown as ``\\n``, ``\\x1b``, ``\\u202e`` instead of
    acting on the terminal. ``keep``: characters left as they are (the line breaks of rendered tables)."""
    def escape(m: re.Match[str]) -> str:
        char = m.group()
        if char in keep:
            return char
        return repr(char)[1:-1] if ord(char) < 0x100 else f"\\u{ord(char):04x}"

    return _CONTROL.sub(escape, str(text))


class ExitCode(IntEnum):
    """Process exit codes of the ``traceanalyzer`` command (a stable contract)."""

    OK = 0
    INTERNAL_ERROR = 1
    BAD_INPUT = 2
    SLOWER = 3  # ``diff --fail-if-slower``: the after run is slower than allowed


class TraceAnalyzerError(Exception):
    """Base class of every error traceanalyzer raises on purpose."""

    exit_code: ExitCode = ExitCode.INTERNAL_ERROR

    def __reduce__(self) -> tuple[object, ...]:
        """Pickled as its class, message and attributes (a Dask worker's error reaches the driver as raised)."""
        return _restore, (type(self), self.args, dict(self.__dict__))


def _restore(cls: type[TraceAnalyzerError], args: tuple[object, ...], state: dict[str, object]
             ) -> TraceAnalyzerError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class BadInputError(TraceAnalyzerError):
    """A file or argument the user gave cannot be used; the message names it and the problem."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, path: str | Path | None, problem: str, hint: str | None = None) -> None:
        self.path = None if path is None else str(path)
        self.problem = problem
        self.hint = hint
        where = f"{self.path}: " if self.path is not None else ""
        message = f"{where}{problem}"
        if hint:
            message += f" — {hint}"
        super().__init__(message)


class UnknownFormatError(BadInputError):
    """The file is neither an nsys SQLite export nor a Kineto JSON trace."""


class CorruptFileError(BadInputError):
    """The file has the right format but is truncated, corrupt, oversized or malformed."""


class FileChangedError(BadInputError):
    """The file changed (was truncated, rewritten or grew) while it was being read."""


class EmptyTraceError(BadInputError):
    """The file is a trace but holds nothing to analyse (for example no kernel activity)."""


class RulesError(BadInputError):
    """A user rules file cannot be read or has an invalid rule."""


class OutputError(BadInputError):
    """An output file cannot be written (no space, permission, a special file, an input trace)."""

    def __init__(self, path: str | Path, reason: str, hint: str | None = None) -> None:
        super().__init__(None, f"cannot write {path}: {reason}", hint)
        self.path = str(path)
