"""``--window START:END`` and the memory estimate before loading (issue 14 item 4)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from traceanalyzer import load
from traceanalyzer.loaders.limits import Window, json_size, kineto_estimate, nsys_estimate, parse_window
from traceanalyzer.model.errors import BadInputError

REPO = Path(__file__).resolve().parents[1]
NSYS = REPO / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"
KINETO = REPO / "fixtures" / "kineto" / "tp2_prefill_serial"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "traceanalyzer.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("text", "window"), [("10:12.5", Window(10, 12.5)), (" 0 : 1 ", Window(0, 1)),
                                              (":2", Window(0, 2)), ("3:", Window(3, float("inf")))])
def test_parse_window(text: str, window: Window) -> None:
    assert parse_window(text) == window


@pytest.mark.parametrize("text", ["", "5", "2:1", "1:1", "-1:2", "a:b", "1:2:3"])
def test_bad_windows_name_the_option(text: str) -> None:
    with pytest.raises(BadInputError, match="--window"):
        parse_window(text)


def test_nsys_window_reads_exactly_the_rows_starting_inside_it() -> None:
    con = sqlite3.connect(f"file:{NSYS}?mode=ro", uri=True)
    lo, hi = con.execute("SELECT MIN(start), MAX(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    mid = (lo + hi) // 2
    window = Window(mid / 1e9, (mid + 200_000_000) / 1e9)
    full, part = load(NSYS), load(NSYS, window=f"{window.start_s!r}:{window.end_s!r}")
    for name in ("kernels", "memops", "api_calls", "ranges"):
        start = full.tables[name]["start_ns"]
        keep = (start >= window.start_ns) & (start < window.end_ns)
        assert 0 < keep.sum() < len(start), name
        assert np.array_equal(part.tables[name]["start_ns"], start[keep]), name
    names = lambda t: t.names(t.kernels["name_id"]).tolist()  # noqa: E731
    keep = (full.kernels["start_ns"] >= window.start_ns) & (full.kernels["start_ns"] < window.end_ns)
    assert names(part) == list(np.asarray(names(full), dtype=object)[keep])
    assert part.raw_counts["kernels"] == int(keep.sum())


def test_kineto_window_counts_from_the_first_event() -> None:
    path = sorted(KINETO.glob("*.json.gz"))[0]
    full, part = load(path), load(path, window="0.01:0.03")
    origin = min(int(t["start_ns"].min()) for t in full.tables.values() if "start_ns" in t and len(t))
    start = full.kernels["start_ns"]
    keep = (start >= origin + 10_000_000) & (start < origin + 30_000_000)
    assert 0 < keep.sum() < len(start)
    assert np.array_equal(part.kernels["start_ns"], start[keep])


def test_estimates_grow_with_rows_and_bytes(tmp_path: Path) -> None:
    assert nsys_estimate({"kernels": 2_000, "api_calls": 10}) == 2 * nsys_estimate({"kernels": 1_000, "api_calls": 5})
    path = sorted(KINETO.glob("*.json.gz"))[0]
    import gzip

    assert json_size(path) == len(gzip.decompress(path.read_bytes()))
    assert kineto_estimate(json_size(path)) > path.stat().st_size
    assert json_size(tmp_path / "absent.json") == 0


@pytest.mark.parametrize("trace", [NSYS, KINETO])
def test_too_little_memory_stops_before_loading_and_names_window(trace: Path) -> None:
    done = _cli("summary", str(trace), env={"TRACEANALYZER_MEMORY_LIMIT": "500K"})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--window" in lines[0] and "MiB available" in lines[0]
    assert done.stdout == ""


def test_a_window_that_fits_the_memory_loads() -> None:
    con = sqlite3.connect(f"file:{NSYS}?mode=ro", uri=True)
    lo = con.execute("SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    window = f"{lo / 1e9}:{lo / 1e9 + 0.05}"
    budget = {"TRACEANALYZER_MEMORY_LIMIT": "500K"}  # the whole export needs about 0.75 MB, 50 ms of it far less
    assert _cli("summary", str(NSYS), env=budget).returncode == 2
    done = _cli("summary", "--json", str(NSYS), "--window", window, env=budget)
    assert done.returncode == 0, done.stderr


def test_bad_memory_limit_and_bad_window_exit_2_with_one_line() -> None:
    for args, env in ((["summary", str(NSYS)], {"TRACEANALYZER_MEMORY_LIMIT": "lots"}),
                      (["summary", str(NSYS), "--window", "9:3"], {}),
                      (["report", str(NSYS), "--window", "x", "-o", "/tmp/never-written.html"], {})):
        done = _cli(*args, env=env)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert not Path("/tmp/never-written.html").exists()


def test_budget_is_the_smaller_of_meminfo_and_the_cgroup_room(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from traceanalyzer.loaders import limits

    monkeypatch.delenv("TRACEANALYZER_MEMORY_LIMIT", raising=False)
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable:    8000 kB\n")
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    monkeypatch.setattr(limits, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(limits, "CGROUP", cgroup)
    assert limits.memory_budget() == 8000 * 1024  # no cgroup files
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("123\n")
    assert limits.memory_budget() == 8000 * 1024  # no limit
    (cgroup / "memory.max").write_text(f"{4000 * 1024 + 123}\n")
    assert limits.memory_budget() == 4000 * 1024  # the container's room is smaller
    monkeypatch.setenv("TRACEANALYZER_MEMORY_LIMIT", "1G")
    assert limits.memory_budget() == 1 << 30


def test_window_travels_to_worker_processes() -> None:
    from traceanalyzer.pipeline.summarize import summary

    one = summary([KINETO], window="0.005:0.06")
    two = summary([KINETO], window="0.005:0.06", jobs=2)
    whole = summary([KINETO])
    assert one.to_json() == two.to_json()
    assert [d.busy_ns for d in one.devices] != [d.busy_ns for d in whole.devices]
