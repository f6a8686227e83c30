"""Plain definitions the tests check the package's fast paths and tables against (test-only: the package never
needs them)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from traceanalyzer.model.call_starts import Columns


def decoded(blocks: Columns, offsets: np.ndarray, rank: int | None = None) -> np.ndarray:
    """The starts (int64 ns) of every call of ``traceanalyzer.model.call_starts`` blocks, or of ``rank``'s, block by
    block (each block in start order)."""
    sel = np.arange(len(blocks["first"])) if rank is None else np.flatnonzero(np.asarray(blocks["rank"]) == rank)
    parts = [blocks["start_ns"][i] + offsets[blocks["first"][i]:blocks["first"][i] + blocks["rows"][i]]
             .astype(np.int64) for i in sel.tolist()]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def component_columns(frame: pd.DataFrame) -> list[str]:
    """The component columns of an ``analysis.attribution.step_components`` frame, in attribution order."""
    return [c for c in frame.columns if c not in ("step", "duration_ns")]
