"""``diff``: two runs compared (``ta.diff``, ``traceanalyzer diff``). Each side is loaded and summarized exactly as
``summary`` does it; :mod:`.analysis.compare` then compares the two summaries. Method and limits: docs/DIFF.md.

(Not named ``diff.py``: importing a submodule ``traceanalyzer.diff`` would replace the ``ta.diff`` function on the
package with the module.)
"""

from __future__ import annotations

import os
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

    The two sides are independent: where a second CPU is free, one is loaded and summarized in a forked helper
    while this process does the other (``loaders.beside.share``; errors are those of a serial run).
    """
    from .loaders.beside import PROCESSES_ENV, share
    from .pipeline import summary as summarize_side

    inputs = (before, after)
    progress = options.pop("progress", None)
    parent = os.getpid()

    def side(i: int) -> DiffSide:
        given = inputs[i]
        if isinstance(given, Summary):
            return build_side(given)
        if os.getpid() != parent:  # the helper: the second CPU is taken now, no decode helper of its own
            os.environ[PROCESSES_ENV] = "1"
        mine = {"progress": progress} if progress is not None and os.getpid() == parent else {}
        return build_side(summarize_side(_as_list(given), **options, **mine))

    needs_work = sum(not isinstance(x, Summary) for x in inputs)
    side_b, side_a = share(2, side, min_items=2 if needs_work == 2 else 3)
    return compare(side_b, side_a, min_noise_pct=min_noise_pct)
