"""Durations and percentages as text, for every renderer (terminal, HTML, notebooks): one unit per number."""

from __future__ import annotations

import math
from typing import SupportsFloat


def fmt_ns(ns: SupportsFloat | None, *, unit: str | None = None) -> str:
    """A duration in the most readable unit (``12.3 ms``); ``—`` when unknown."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "—"
    value = float(ns)
    if unit is None:
        mag = abs(value)
        unit = "s" if mag >= 1e9 else "ms" if mag >= 1e6 else "µs" if mag >= 1e3 else "ns"
    scale = {"s": 1e9, "ms": 1e6, "µs": 1e3, "us": 1e3, "ns": 1.0}[unit]
    scaled = value / scale
    if unit == "ns":
        return f"{scaled:.0f} ns"
    digits = 3 if abs(scaled) < 10 else 2 if abs(scaled) < 100 else 1
    return f"{scaled:.{digits}f} {unit}"


def fmt_pct(value: float | None, digits: int = 1) -> str:
    """A percentage (``42.0 %``); ``—`` when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f} %"
