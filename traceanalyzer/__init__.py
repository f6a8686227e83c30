"""traceanalyzer: make GPU traces of LLM serving and training explain themselves.

>>> import traceanalyzer as ta
>>> trace = ta.load("trace.sqlite")          # or a Kineto .json / .json.gz
>>> trace.df("kernels")                        # pandas DataFrame
>>> s = ta.summary(["rank0.json.gz", "rank1.json.gz"])
>>> html_path, s = ta.report(["rank0.json.gz", "rank1.json.gz"], output="run.html")
>>> ta.export(s, "analysis.db")              # SQLite: kernels, steps, layers, collectives, findings
>>> ta.export(s, "analysis.pftrace")         # Perfetto: the trace with the analysis as tracks
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .api import classify_names, diff, export, report, summary, whatif
    from .model.errors import BadInputError, ExitCode, TraceAnalyzerError
    from .model.trace import DeviceInfo, StringPool, Table, Trace
    from .pipeline.loading import detect_format, info, load, load_many

#: Each public name and the module that defines it, imported on first use (``import traceanalyzer`` stays cheap).
_HOMES = {
    "BadInputError": "model.errors",
    "DeviceInfo": "model.trace",
    "ExitCode": "model.errors",
    "StringPool": "model.trace",
    "Table": "model.trace",
    "Trace": "model.trace",
    "TraceAnalyzerError": "model.errors",
    "classify_names": "api",
    "detect_format": "pipeline.loading",
    "diff": "api",
    "export": "api",
    "info": "pipeline.loading",
    "load": "pipeline.loading",
    "load_many": "pipeline.loading",
    "report": "api",
    "summary": "api",
    "whatif": "api",
}


def __getattr__(name: str) -> Any:
    """``ta.NAME``: the public name from its module, imported now and kept."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


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
    "diff",
    "export",
    "info",
    "load",
    "load_many",
    "report",
    "summary",
    "whatif",
]
