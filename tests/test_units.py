"""Durations and percentages as text (``traceanalyzer/model/units.py``, their one home): the exact strings the
terminal, the HTML pages, the diff and the finding titles show."""

from __future__ import annotations

import math

import pytest

from traceanalyzer.model.units import fmt_brief_ns, fmt_ms, fmt_ns, fmt_pct, fmt_round_ns


@pytest.mark.parametrize(("ns", "text"), [(512, "512 ns"), (1_234, "1.234 µs"), (12_345_678, "12.35 ms"),
                                          (123_456_789, "123.5 ms"), (2_500_000_000, "2.500 s"), (None, "—"),
                                          (math.nan, "—")])
def test_fmt_ns_picks_the_unit_and_three_significant_digits(ns: float | None, text: str) -> None:
    assert fmt_ns(ns) == text


def test_fmt_ns_in_a_given_unit() -> None:
    assert fmt_ns(1_500_000, unit="µs") == "1500.0 µs" and fmt_ns(1_500_000, unit="s") == "0.002 s"


@pytest.mark.parametrize(("ns", "signed", "text"), [(12_345_678, False, "12.346"), (120_000, True, "+0.120"),
                                                    (-120_000, True, "-0.120"), (None, True, "—"),
                                                    (math.nan, False, "—")])
def test_fmt_ms_for_columns_headed_ms(ns: float | None, signed: bool, text: str) -> None:
    assert fmt_ms(ns, signed) == text


@pytest.mark.parametrize(("ns", "text"), [(9_500, "9.5 µs"), (99_999, "100.0 µs"), (100_000, "0.10 ms"),
                                          (3_806_112, "3.81 ms"), (-2_000_000, "-2.00 ms"), (1_230_000_000, "1.23 s"),
                                          (None, "n/a")])
def test_fmt_brief_ns_for_finding_titles(ns: float | None, text: str) -> None:
    assert fmt_brief_ns(ns) == text


def test_fmt_round_ns_for_chart_axes_and_percentages() -> None:
    assert [fmt_round_ns(v) for v in (200, 5_000, 1_500_000)] == ["200 ns", "5 µs", "1.5 ms"]
    assert fmt_pct(42.0) == "42.0 %" and fmt_pct(3.14159, 0) == "3 %" and fmt_pct(None) == "—"
