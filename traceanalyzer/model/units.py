"""Durations and percentages as text, for every renderer (terminal, HTML, notebooks) and the findings' titles: the
one home of duration formatting (a number with its unit: :func:`fmt_ns`; in a column headed "ms": :func:`fmt_ms`;
in a sentence: :func:`fmt_brief_ns`; on a chart axis: :func:`fmt_round_ns`)."""

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


def fmt_ms(ns: SupportsFloat | None, signed: bool = False) -> str:
    """A duration in milliseconds with 3 decimals and no unit, for columns headed "ms" (``12.345``; with
    ``signed`` a sign on gains too: ``+0.120``); ``—`` when unknown."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "—"
    value = float(ns) / 1e6
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def fmt_brief_ns(ns: float | int | None) -> str:
    """A duration for a sentence (finding titles; JSON keeps ns): ``1.23 s``, ``3.81 ms`` from 0.1 ms up,
    ``9.5 µs`` below; ``n/a`` when unknown."""
    if ns is None:
        return "n/a"
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.2f} s"
    return f"{ns / 1e6:.2f} ms" if abs(ns) >= 100_000 else f"{ns / 1e3:.1f} µs"


def fmt_round_ns(ns: float) -> str:
    """A round duration as briefly as it goes, for chart axes and bin edges (``5 µs``, ``1.5 ms``, ``200 ns``)."""
    return f"{ns / 1e6:g} ms" if ns >= 1e6 else f"{ns / 1e3:g} µs" if ns >= 1e3 else f"{ns:g} ns"


def fmt_pct(value: float | None, digits: int = 1) -> str:
    """A percentage (``42.0 %``); ``—`` when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f} %"
