"""A summary keeps the garbage collector off its long-lived objects while it runs and hands everything back."""

from __future__ import annotations

import gc

from conftest import FIXTURES

from traceanalyzer.pipeline.summarize import _long_lived, summarize_paths

RUN = FIXTURES / "kineto" / "tp2_decode_eager"


def test_summary_unfreezes_what_it_froze() -> None:
    before = gc.get_freeze_count()
    plain = summarize_paths([RUN], jobs=1).to_json()
    assert gc.get_freeze_count() == before
    assert summarize_paths([RUN], jobs=2).to_json() == plain
    assert gc.get_freeze_count() == before


def test_callers_frozen_objects_stay_frozen() -> None:
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with _long_lived() as settled:
            keep = [[i] for i in range(1000)]
            settled()
        assert gc.get_freeze_count() == before
        assert len(keep) == 1000
    finally:
        gc.unfreeze()


def test_frozen_while_inside_and_handed_back() -> None:
    with _long_lived() as settled:
        keep = [[i] for i in range(1000)]
        settled()
        assert gc.get_freeze_count() >= len(keep)
    assert gc.get_freeze_count() == 0
