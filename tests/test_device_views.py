"""Each (rank, device)'s activity taken as views of a table stored by (rank, device, start), equal to the plain
definition (the device's rows, stable-sorted by start) on any row order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from traceanalyzer.analysis.activity import _rows_of
from traceanalyzer.model.trace import Table

_rows = st.lists(st.tuples(st.integers(-1, 2), st.integers(0, 2), st.integers(0, 50)), min_size=0, max_size=40)


def _table(rows: list[tuple[int, int, int]]) -> Table:
    return Table.from_columns("kernels", len(rows), rank=[r for r, _, _ in rows], device=[d for _, d, _ in rows],
                              start_ns=[s for _, _, s in rows], end_ns=[s + 1 for _, _, s in rows],
                              correlation=np.arange(len(rows)))


def _plain(table: Table, rank: int, device: int) -> np.ndarray:
    """Correlation ids (row identity) of the device's rows, stable-sorted by start."""
    idx = np.flatnonzero((table["rank"] == rank) & (table["device"] == device))
    return table["correlation"][idx[np.argsort(table["start_ns"][idx], kind="stable")]]


@settings(max_examples=60, deadline=None)
@given(rows=_rows)
def test_rows_of_a_device_match_the_plain_definition_grouped_or_not(rows: list[tuple[int, int, int]]) -> None:
    table = _table(rows)
    grouped = _table(rows)
    grouped.group_by_device()
    for rank in (-1, 0, 1, 2):
        for device in (0, 1, 2):
            want = _plain(table, rank, device)
            assert _rows_of(table, rank, device)["correlation"].tolist() == want.tolist()
            got = _rows_of(grouped, rank, device)
            assert got["correlation"].tolist() == want.tolist()
            if len(got) and len(got) < len(grouped):  # a slice of the stored columns, not a copy
                assert np.shares_memory(got["start_ns"], grouped["start_ns"])
