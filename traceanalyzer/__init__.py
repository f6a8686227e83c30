"""traceanalyzer: make GPU traces of LLM serving and training explain themselves.

>>> import traceanalyzer as ta
>>> trace = ta.load("trace.sqlite")          # or a Kineto .json / .json.gz
>>> trace.df("kernels")                        # pandas DataFrame
"""

from __future__ import annotations

from .api import detect_format, info, load, load_many
from .errors import BadInputError, ExitCode, TraceAnalyzerError
from .trace import DeviceInfo, StringPool, Table, Trace

__version__ = "0.1.0"

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
]
