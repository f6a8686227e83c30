"""A summary reads only part of an nsys export's CUDA API rows (loaders.nsys_api): the same JSON as reading them all,
the same impossible-row counts, and the same rows whatever the chunk size."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, SHARED
from references import decoded

from traceanalyzer.analysis.host_issue import api_span_within, issue_ranges
from traceanalyzer.loaders import SUMMARY_TABLES, nsys_sql
from traceanalyzer.pipeline.loading import load
from traceanalyzer.pipeline.summarize import summarize

SHIPPED = sorted((FIXTURES / "nsys").glob("*.sqlite"))
REAL = [SHARED / p for p in ("h200/nsys/tp2_prefill_serial.sqlite", "nsys-public/fuser_8xh100host_2024.6.2.sqlite",
                             "nsys-public/nsysai_mfu_2xh100_before_2026.2.1.sqlite")]
SERIAL = FIXTURES / "nsys" / "tp2_prefill_serial.sqlite"


def _summary_json(path: Path, tables: frozenset[str] | None) -> dict[str, object]:
    return summarize([load(path, tables=tables)]).to_json()


@pytest.mark.parametrize("path", SHIPPED + REAL, ids=lambda p: p.name)
def test_summary_of_the_needed_api_rows_is_the_summary_of_them_all(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"{path} is absent (real traces are only beside the development checkout)")
    part = load(path, tables=SUMMARY_TABLES, classify=False)
    assert part.api_calls_subset is not None and len(part.api_starts) == part.raw_counts["api_calls"]
    assert _summary_json(path, SUMMARY_TABLES) == _summary_json(path, None)


def test_issuing_range_spans_come_out_the_same() -> None:
    """api_span_within over the outermost issuing ranges (what host_evidence asks): the first call in each and the
    last end among the calls overlapping it are kept."""
    whole = load(SERIAL, classify=False)
    part = load(SERIAL, tables=SUMMARY_TABLES, classify=False)
    assert len(part.api_calls) < len(whole.api_calls) / 2
    s, e, thread = issue_ranges(whole, np.unique(whole.kernels["pid"]))
    outermost, open_until = [], {}
    for i, (lo, hi, th) in enumerate(zip(s.tolist(), e.tolist(), thread.tolist(), strict=True)):
        if lo >= open_until.get(th, lo):
            outermost.append(i)
        open_until[th] = max(open_until.get(th, hi), hi)
    s, e, thread = s[outermost], e[outermost], thread[outermost]
    assert len(s) > 50
    expected, got = api_span_within(whole, s, e, thread), api_span_within(part, s, e, thread)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert (expected[0] >= 0).sum() > 50


def test_chunk_boundaries_do_not_change_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """First/last calls of a range split over chunks, and launches, come out the same with 97-row chunks."""
    big = load(SERIAL, tables=SUMMARY_TABLES, classify=False)
    monkeypatch.setattr(nsys_sql, "CONCAT_ROWS", 97)
    small = load(SERIAL, tables=SUMMARY_TABLES, classify=False)
    for name in ("api_calls", "kernels"):
        a, b = big.tables[name], small.tables[name]
        assert a.columns.keys() == b.columns.keys()
        assert all(np.array_equal(a[c], b[c]) for c in a.columns), name
    for rank in (0, 1):  # every call's start: other blocks, the same starts
        starts = [np.sort(decoded(t.tables["api_start_blocks"], t.api_starts["offset_ns"], rank)) for t in (big, small)]
        assert np.array_equal(*starts) and len(starts[0]) > 1000


def test_impossible_api_rows_are_counted_as_when_all_are_read(tmp_path: Path) -> None:
    path = tmp_path / "bad_api.sqlite"
    shutil.copyfile(SERIAL, path)
    with sqlite3.connect(path) as conn:
        conn.execute('UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET "end" = start - 5 WHERE rowid % 97 = 1')
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = start + 864000000000000, "
                     '"end" = "end" + 864000000000000 WHERE rowid % 101 = 3')
    whole = load(path, classify=False)
    part = load(path, tables=SUMMARY_TABLES, classify=False)
    assert whole.dropped_rows == part.dropped_rows
    assert whole.dropped_rows["api_calls"].beyond_capture > 0
    assert [w for w in whole.warnings if "api_calls" in w] == [w for w in part.warnings if "api_calls" in w] != []
    assert len(part.api_starts) == len(whole.api_calls)
    every = decoded(part.tables["api_start_blocks"], part.api_starts["offset_ns"])
    assert np.array_equal(np.sort(every), np.sort(whole.api_calls["start_ns"]))


def test_a_value_that_is_not_an_integer_is_named_as_before(tmp_path: Path) -> None:
    """group_concat text that does not parse sends the chunk to the tuple reader, which converts 3.0 and names text."""
    from traceanalyzer.model.errors import CorruptFileError

    path = tmp_path / "float.sqlite"
    shutil.copyfile(SERIAL, path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = streamId + 0.0 WHERE rowid = 5")
    assert np.array_equal(load(path, classify=False).kernels["stream"], load(SERIAL, classify=False).kernels["stream"])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 'x' WHERE rowid = 7")
    with pytest.raises(CorruptFileError, match=r"CUPTI_ACTIVITY_KIND_RUNTIME\.correlationId.*row 7 read"):
        load(path, tables=SUMMARY_TABLES, classify=False)


@pytest.mark.parametrize("seed", range(5))
def test_rows_merged_in_place_are_the_sorted_union(seed: int) -> None:
    """The kept API rows and the range-end rows found after the pass, merged by row number in the kept rows' own
    buffer (any block size, with or without spare room), equal sorting the union."""
    from traceanalyzer.loaders.nsys_api import _Filled

    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(10_000, size=3000, replace=False))
    mine = rows[rng.random(len(rows)) < 0.8]
    added = np.setdiff1d(rows, mine)
    for capacity, block in ((len(rows), 7), (len(mine), 1000), (10_000, 1 << 20)):
        filled = _Filled([("row", "i8"), ("value", "i4")], capacity)
        for part in np.array_split(mine, 5):
            filled.append({"row": part, "value": (part * 3).astype(np.int32)})
        filled.merge_rows("row", {"row": added, "value": (added * 3).astype(np.int32)}, block=block)
        got = filled.columns()
        assert np.array_equal(got["row"], rows) and np.array_equal(got["value"], rows * 3)


@pytest.mark.parametrize("spread", [10, 10**12])
def test_launch_lookup_is_membership(spread: int) -> None:
    """A call is a launch when its correlation id is one of the GPU activity's: by table (dense ids) or by
    binary search (sparse ids), the same as np.isin; -1 and ids past the largest are not."""
    from traceanalyzer.loaders.nsys_api import _Launches

    rng = np.random.default_rng(spread % 97)
    launched = np.r_[rng.integers(0, 1000 * spread, size=2000), -1, -1]
    calls = np.r_[rng.choice(launched, size=3000), rng.integers(-3, 1000 * spread + 5, size=3000), -1]
    lookup = _Launches(launched, len(calls))
    assert (lookup.table is not None) == (spread == 10)
    assert np.array_equal(lookup(calls), np.isin(calls, launched[launched >= 0]))
    assert not _Launches(np.array([-1]), 5)(np.array([-1, 0, 3])).any()
