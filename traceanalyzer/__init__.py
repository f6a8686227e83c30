"""traceanalyzer: make GPU traces of LLM serving and training explain themselves.

>>> import traceanalyzer as ta
>>> trace = ta.load("trace.sqlite")          # or a Kineto .json / .json.gz
>>> trace.df("kernels")                        # pandas DataFrame
"""

from __future__ import annotations

from typing import Any

from .api import detect_format, info, load, load_many
from .errors import BadInputError, ExitCode, TraceAnalyzerError
from .trace import DeviceInfo, StringPool, Table, Trace

__version__ = "0.1.0"


def summary(traces_or_paths: Any, **options: Any) -> Any:
    """Summarize loaded Traces or trace files into a ``Summary`` (see ``traceanalyzer.analysis.summary.summary``).

    >>> s = ta.summary(["rank0.json.gz", "rank1.json.gz"], step_range=None)   # doctest: +SKIP
    """
    from .analysis.summary import summary as _summary

    return _summary(traces_or_paths, **options)


__all__ = [
    "BadInputError",
    "DeviceInfo",
    "ExitCode",
    "StringPool",
    "Table",
    "Trace",
    "TraceAnalyzerError",
    "__version__",
    "detect_format",
    "info",
    "load",
    "load_many",
    "summary",
]
