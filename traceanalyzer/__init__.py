"""traceanalyzer: make GPU traces of LLM serving and training explain themselves.

>>> import traceanalyzer as ta
>>> trace = ta.load("trace.sqlite")          # or a Kineto .json / .json.gz
>>> trace.df("kernels")                        # pandas DataFrame
"""

from __future__ import annotations

from typing import Any

from ._version import __version__
from .api import detect_format, info, load, load_many
from .errors import BadInputError, ExitCode, TraceAnalyzerError
from .trace import DeviceInfo, StringPool, Table, Trace


def summary(traces_or_paths: Any, **options: Any) -> Any:
    """Summarize loaded Traces or trace files into a ``Summary`` (see ``traceanalyzer.pipeline.summary``).

    >>> s = ta.summary(["rank0.json.gz", "rank1.json.gz"], step_range=None)   # doctest: +SKIP
    """
    from .pipeline import summary as _summary

    return _summary(traces_or_paths, **options)


def report(paths: Any, **options: Any) -> Any:
    """Write the single-file HTML report for trace files; returns ``(html_path, Summary)``
    (see ``traceanalyzer.report.report`` for the options: ``output``, ``rules``, ``step_range``, ``cdn``, ...)."""
    from .report import report as _report

    return _report(list(paths) if isinstance(paths, (list, tuple)) else [paths], **options)


def classify_names(names: list[str], rules: Any = None) -> Any:
    """Classify kernel names into buckets (see ``traceanalyzer.classify.classify_names``)."""
    from .classify import classify_names as _classify_names

    return _classify_names(names, rules=rules)


__all__ = [
    "BadInputError",
    "DeviceInfo",
    "ExitCode",
    "StringPool",
    "Table",
    "Trace",
    "TraceAnalyzerError",
    "__version__",
    "classify_names",
    "detect_format",
    "info",
    "load",
    "load_many",
    "report",
    "summary",
]
