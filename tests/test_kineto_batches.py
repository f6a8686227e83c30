"""The Kineto loader decodes ``traceEvents`` in batches: any batch size must give exactly the one-batch result."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from kineto_samples import document, event, kernel, raw_number, sample_events, write

import traceanalyzer as ta
from traceanalyzer.loaders import beside, kineto_read, load_one
from traceanalyzer.model.errors import BadInputError

TABLES = ("kernels", "memops", "ranges", "api_calls", "collectives")


def many_events(copies: int = 40) -> list[dict]:
    """The sample events repeated, each copy shifted by 10 ms (so tables sort the same way however cut)."""
    out = []
    for c in range(copies):
        for e in sample_events():
            e = json.loads(json.dumps(e))
            if isinstance(e.get("ts"), float):
                e["ts"] = round(e["ts"] + 10_000 * c, 3)
            out.append(e)
    return out


def assert_same(a: ta.Trace, b: ta.Trace) -> None:
    assert a.strings.values == b.strings.values
    assert a.raw_counts == b.raw_counts and a.capabilities == b.capabilities and a.devices == b.devices
    for table in TABLES:
        assert a.tables[table].columns.keys() == b.tables[table].columns.keys(), table
        for column, values in a.tables[table].columns.items():
            assert np.array_equal(b.tables[table][column], values), (table, column)


def load_with_batch(path: Path, batch_bytes: int, monkeypatch: pytest.MonkeyPatch) -> ta.Trace:
    monkeypatch.setattr(kineto_read, "BATCH_BYTES", batch_bytes)
    return load_one(path)


@pytest.mark.parametrize("indent", [None, 2])
def test_any_batch_size_gives_the_same_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             indent: int | None) -> None:
    doc = document(many_events())
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=indent))
    whole = load_with_batch(path, 1 << 40, monkeypatch)
    assert len(whole.kernels) == 80 and whole.raw_counts["events"] == 40 * len(sample_events())
    for batch_bytes in (1, 700, 5_000):
        assert_same(whole, load_with_batch(path, batch_bytes, monkeypatch))


@pytest.mark.parametrize("odd", ["none", "unknown category", "no ph", "empty ph"])
def test_lean_and_plain_decoding_give_the_same_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     odd: str) -> None:
    """Batches decode lean (one Struct per phase, categories as literals) until one needs the plain decoding."""
    events = many_events()
    late = len(events) * 3 // 4
    if odd == "unknown category":
        events[late]["cat"] = "vendor_runtime"
    elif odd == "no ph":
        events[late].pop("ph", None)
    elif odd == "empty ph":
        events[late]["ph"] = ""
    path = write(tmp_path / "t.json", document(events))
    monkeypatch.setattr(kineto_read, "LEAN_DECODE", False)
    plain = load_with_batch(path, 700, monkeypatch)
    monkeypatch.setattr(kineto_read, "LEAN_DECODE", True)
    for batch_bytes in (700, 5_000):
        assert_same(plain, load_with_batch(path, batch_bytes, monkeypatch))
    data = kineto_read.read_bytes(path)
    _, batches = kineto_read.split_events(data, path, batch_bytes=700)
    kinds = [type(batch.events()[0]).__name__ for batch in batches[:-1]]
    assert kinds[0].startswith("Lean")
    assert all(k.startswith("Lean") for k in kinds) == (odd == "none")


def test_a_cut_inside_a_string_falls_back_to_one_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = many_events(3)
    events.insert(5, kernel('weird}, {"name": "x', 2_000_000, 10, correlation=9))
    path = write(tmp_path / "t.json", document(events))
    whole = load_with_batch(path, 1 << 40, monkeypatch)
    assert 'weird}, {"name": "x' in whole.strings.values
    for batch_bytes in (1, 300):
        assert_same(whole, load_with_batch(path, batch_bytes, monkeypatch))


def test_keys_after_the_events_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = document(many_events(2), rank=None)
    events = doc.pop("traceEvents")
    text = json.dumps({"traceEvents": events, **doc, "distributedInfo": {"rank": 3, "world_size": 4}})
    path = write(tmp_path / "t.json", text)
    for batch_bytes in (1, 1 << 40):
        trace = load_with_batch(path, batch_bytes, monkeypatch)
        assert trace.world_size == 4 and trace.ranks == [3] and trace.base_time_ns is not None


def test_decimal_times_and_missing_counts_span_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = [event("kernel", f"k{i}", 0, 1_000, device=0, stream=7) for i in range(30)]
    for i, e in enumerate(events):
        e["ts"] = raw_number(f"17121954955{i:05d}.047")
    path = write(tmp_path / "t.json", document(events, base_time_ns=None))
    for batch_bytes in (1, 1 << 40):
        trace = load_with_batch(path, batch_bytes, monkeypatch)
        assert trace.capabilities["timestamp_conversion"] == "decimal-exact"
        assert trace.kernels["start_ns"].tolist() == [(1712195495500000 + i) * 1000 + 47 for i in range(30)]
    for e in events[3:]:
        del e["dur"]
    path = write(tmp_path / "m.json", document(events, base_time_ns=None))
    for batch_bytes in (1, 1 << 40):
        monkeypatch.setattr(kineto_read, "BATCH_BYTES", batch_bytes)
        with pytest.raises(BadInputError, match=r"\$\.traceEvents\[3\] has no \"dur\" \(27 such events\)"):
            load_one(path)


def test_a_malformed_middle_reports_the_whole_document_error(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    text = json.dumps(document(many_events(5)))
    cut = len(text) // 2
    cut = text.index('"pid": ', cut)
    path = write(tmp_path / "t.json", text[:cut] + '"pid": [1, 2], ' + text[cut + len('"pid": '):]
                 .split(",", 1)[1])
    monkeypatch.setattr(kineto_read, "BATCH_BYTES", 1 << 40)
    with pytest.raises(BadInputError) as whole:
        load_one(path)
    monkeypatch.setattr(kineto_read, "BATCH_BYTES", 200)
    with pytest.raises(BadInputError) as batched:
        load_one(path)
    assert str(batched.value) == str(whole.value) and "$.traceEvents[" in str(whole.value)


@pytest.mark.parametrize("indent", [None, 2])
def test_helper_process_gives_the_same_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             indent: int | None) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(document(many_events()), indent=indent))
    monkeypatch.setenv(beside.PROCESSES_ENV, "1")
    serial = load_with_batch(path, 700, monkeypatch)
    monkeypatch.setenv(beside.PROCESSES_ENV, "2")
    assert_same(serial, load_with_batch(path, 700, monkeypatch))


def test_missing_times_in_the_helpers_half_name_the_first_event(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    events = many_events()
    late = [i for i, e in enumerate(events) if e.get("cat") == "kernel"][-5:]
    for i in late:
        del events[i]["ts"]
    path = write(tmp_path / "t.json", document(events))
    monkeypatch.setenv(beside.PROCESSES_ENV, "2")
    for batch_bytes in (700, 1 << 40):
        monkeypatch.setattr(kineto_read, "BATCH_BYTES", batch_bytes)
        with pytest.raises(BadInputError, match=rf"\$\.traceEvents\[{late[0]}\] has no \"ts\" \(5 such events\)"):
            load_one(path)


def test_share_uses_a_helper_and_falls_back_to_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(beside.PROCESSES_ENV, "2")
    here = os.getpid()

    def slow_pid(i: int) -> tuple[int, int]:
        time.sleep(0.02)
        return i, os.getpid()

    shared = beside.share(20, slow_pid)
    assert [i for i, _ in shared] == list(range(20))
    assert {pid for _, pid in shared} - {here}, "no item was computed in a helper"

    def fails_at(bad: set[int]) -> Callable[[int], int]:
        def work(i: int) -> int:
            if i in bad:
                raise ValueError(f"item {i}")
            return i
        return work

    for bad in ({3}, {17}, {5, 15}):  # whichever process meets it, the first bad item in order is reported
        with pytest.raises(ValueError, match=f"item {min(bad)}$"):
            beside.share(20, fails_at(bad))
    assert beside.share(6, lambda i: (lambda: i))[4]() == 4  # lambdas do not pickle: computed here instead
    ran: list[str] = []
    with beside.meanwhile(lambda: ran.append("first")):
        assert beside.share(8, lambda i: i * i) == [i * i for i in range(8)]
    assert ran == ["first"]
    monkeypatch.setenv(beside.PROCESSES_ENV, "1")
    assert not beside.helper_allowed()
    assert beside.share(3, lambda i: os.getpid()) == [here] * 3


def test_a_file_that_changes_while_read_is_bad_input(tmp_path: Path) -> None:
    """Read, not mapped: a file truncated (or grown) under the reader is exit 2, never SIGBUS."""
    from traceanalyzer.model.errors import FileChangedError

    text = json.dumps(document(many_events(3))).encode()
    path = tmp_path / "t.json"

    def grow() -> None:
        with path.open("ab") as fh:
            fh.write(b" " * 10)

    for change in (lambda: os.truncate(path, len(text) // 2), grow):
        path.write_bytes(text)
        calls: list[int] = []

        def progress(done: int, total: int, change: object = change, calls: list[int] = calls) -> None:
            if not calls:
                change()  # type: ignore[operator]
            calls.append(done)

        with pytest.raises(FileChangedError, match="file changed while reading"):
            kineto_read.read_bytes(path, progress=progress)
