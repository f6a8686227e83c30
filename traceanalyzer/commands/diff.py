"""``diff``: two runs compared (``ta.diff``, ``traceanalyzer diff``). Each side is loaded and summarized as ``summary``
does it, less the parts no diff output reads (:data:`DIFF_SKIPS`); :mod:`.analysis.compare` then compares the two
summaries. Method, limits and cost: docs/DIFF.md.

(Not named ``diff.py``: importing a submodule ``traceanalyzer.diff`` would replace the ``ta.diff`` function on the
package with the module.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..analysis.diff.compare import (
    DIFF_SCHEMA_VERSION,
    MIN_NOISE_PCT,
    VERDICTS,
    DiffResult,
    DiffSide,
    build_side,
    compare,
    diff_summaries,
)
from ..analysis.results import Summary
from ..analysis.summary import SKIPPABLE
from ..classify.engine import classes_shared
from ..model.trace import PathLike, Trace

#: What the summaries inside a diff leave out (``SummaryOptions.skip``): no diff output (JSON, terminal, HTML) and
#: no findings rule reads those parts (docs/DIFF.md, "Cost"); the MoE layers stay (the diff's MoE stages).
DIFF_SKIPS = SKIPPABLE - {"moe"}
__all__ = ["DIFF_SCHEMA_VERSION", "VERDICTS", "DiffResult", "DiffSide", "diff", "diff_summaries"]


def _as_list(side: Any) -> list[Any]:
    return list(side) if isinstance(side, (list, tuple)) else [side]


def _same_input(before: Any, after: Any) -> bool:
    """Whether both sides name the same input, item by item: the same Summary or Trace objects, or equal paths."""
    b, a = _as_list(before), _as_list(after)
    return len(b) == len(a) and all(
        x is y or (isinstance(x, (str, Path)) and isinstance(y, (str, Path)) and Path(x) == Path(y))
        for x, y in zip(b, a, strict=True))


def diff(before: PathLike | Trace | Summary | Sequence[PathLike | Trace], after: PathLike | Trace | Summary
         | Sequence[PathLike | Trace], *, min_noise_pct: float = MIN_NOISE_PCT, **options: Any) -> DiffResult:
    """``ta.diff(before, after)``: each side a trace file, a directory of rank traces, a list of them, loaded
    Traces, or a ready Summary; ``options`` are summary options (``rules``, ``step_range``, ``layer_pattern``,
    ``jobs``, ``progress``). Bad input raises :class:`~traceanalyzer.model.errors.BadInputError` naming the file.

    The sides are summarized one after the other, each as ``summary`` does it (with its decode helper for big
    Kineto files) less the parts no diff output reads (:data:`DIFF_SKIPS`), and reduced by
    :func:`~.analysis.compare.build_side` before the next one is loaded. When both sides name the same input
    (a run diffed against itself) it is loaded and summarized once; kernel names both sides share are classified
    once (:func:`~.classify.engine.classes_shared`).
    """
    from ..pipeline.summarize import summary as summarize_side

    def side(given: Any) -> DiffSide:
        if isinstance(given, Summary):
            return build_side(given)
        return build_side(summarize_side(_as_list(given), **{"skip": DIFF_SKIPS, **options}))

    with classes_shared():  # the kernel names both sides share are classified once
        side_b = side(before)
        side_a = replace(side_b) if _same_input(before, after) else side(after)
    return compare(side_b, side_a, min_noise_pct=min_noise_pct)
