"""``diff``: two runs compared (``ta.diff``, ``traceanalyzer diff``). Each side is loaded and summarized exactly as
``summary`` does it; :mod:`.analysis.compare` then compares the two summaries. Method and limits: docs/DIFF.md.

(Not named ``diff.py``: importing a submodule ``traceanalyzer.diff`` would replace the ``ta.diff`` function on the
package with the module.)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .analysis.compare import (
    DIFF_SCHEMA_VERSION,
    MIN_NOISE_PCT,
    VERDICTS,
    DiffResult,
    DiffSide,
    build_side,
    compare,
    diff_summaries,
)
from .analysis.results import Summary
from .trace import Trace

PathLike = str | Path
__all__ = ["DIFF_SCHEMA_VERSION", "VERDICTS", "DiffResult", "DiffSide", "diff", "diff_summaries"]


def _as_list(side: Any) -> list[Any]:
    return list(side) if isinstance(side, (list, tuple)) else [side]


def diff(before: PathLike | Trace | Summary | Sequence[PathLike | Trace], after: PathLike | Trace | Summary
         | Sequence[PathLike | Trace], *, min_noise_pct: float = MIN_NOISE_PCT, **options: Any) -> DiffResult:
    """``ta.diff(before, after)``: each side a trace file, a directory of rank traces, a list of them, loaded
    Traces, or a ready Summary; ``options`` are summary options (``rules``, ``step_range``, ``layer_pattern``,
    ``jobs``, ``progress``). Bad input raises :class:`~traceanalyzer.errors.BadInputError` naming the file.

    The sides are summarized one after the other, each exactly as ``summary`` does it (with its decode helper for
    big Kineto files), and reduced by :func:`~.analysis.compare.build_side` before the next one is loaded.
    """
    from .pipeline import summary as summarize_side

    def side(given: Any) -> DiffSide:
        if isinstance(given, Summary):
            return build_side(given)
        return build_side(summarize_side(_as_list(given), **options))

    side_b = side(before)
    return compare(side_b, side(after), min_noise_pct=min_noise_pct)
