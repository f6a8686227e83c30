"""Where a device's steps are: its step windows, which window holds a time, per-step medians, its kernels.

Shared by the findings rules (:mod:`.context`) and the trace-derived evidence they read (:mod:`.evidence`).
"""

from __future__ import annotations

import numpy as np

from ..analysis.numeric import intervals as iv
from ..analysis.numeric.frames import array_of
from ..analysis.results import DeviceSummary
from ..model.trace import Trace


def steps(dev: DeviceSummary) -> int:
    """Number of step windows (1 when none was found: the whole span is then one window)."""
    return max(len(dev.per_step), 1)


def step_ns(dev: DeviceSummary) -> int:
    """Median step time, or the whole span when no steps were found."""
    return int(dev.step_ns_median) if dev.step_ns_median else int(dev.span_ns)


def pct_of_step(dev: DeviceSummary, ns: float | None) -> float | None:
    """``ns`` as a percentage of the device's median step (None without a step or a value)."""
    step = step_ns(dev)
    return None if ns is None or step <= 0 else 100.0 * float(ns) / step


def step_windows(dev: DeviceSummary) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the device's step windows; the whole activity window when no step was found."""
    ps = dev.per_step
    if len(ps):
        return array_of(ps, "start_ns", np.int64), array_of(ps, "end_ns", np.int64)
    lo, hi = dev.window_ns
    return np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64)


def step_index(dev: DeviceSummary, times: np.ndarray) -> np.ndarray:
    """Index (0-based, into ``step_windows``) of the step window holding each time, -1 outside every step."""
    return iv.window_index(times, *step_windows(dev))


def per_step_median(n_steps: int, step_idx: np.ndarray, values: np.ndarray) -> int:
    """Median over ``n_steps`` steps of the per-step sum of ``values`` (steps without any row count as 0);
    rows with a negative step index are ignored."""
    ok = step_idx >= 0
    weights = np.asarray(values, dtype=np.float64)
    if not ok.all():  # else the rows as they are: no copies of them all
        step_idx, weights = step_idx[ok], weights[ok]
    sums = np.bincount(step_idx, weights=weights, minlength=n_steps)
    return int(np.median(sums)) if len(sums) else 0


def kernel_mask(trace: Trace, dev: DeviceSummary, *, in_steps: bool = False) -> np.ndarray:
    """Boolean mask of the kernels of one (rank, device); only those starting inside a step with ``in_steps``."""
    k = trace.kernels
    mask = k["device"] == dev.device
    if dev.rank >= 0:
        mask &= k["rank"] == dev.rank
    if in_steps and mask.any():
        idx = np.flatnonzero(mask)
        mask[idx[step_index(dev, k["start_ns"][idx]) < 0]] = False
    return mask
