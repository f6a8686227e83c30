"""A --gpu-log written in local time (nvidia-smi's default) is aligned with the capture: the zone detected from the
capture window or given; every GPU named; a log that matches no sample is a warning (issue 26, item 8)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

import traceanalyzer as ta
from traceanalyzer.testing.synth_nsys import write_nsys_export

SESSION_UTC_NS = 1_796_045_593_920_696_427  # synth_nsys's TARGET_INFO_SESSION_START_TIME
KERNELS = [(i * 10_000_000, i * 10_000_000 + 8_000_000, d, 7, "gemm_kernel", 100)
           for i in range(100) for d in (0, 1)]  # one second of GEMMs on two GPUs


def _log(path: Path, offset_s: int) -> Path:
    lines = ["timestamp, index, power.draw [W], power.limit [W]"]
    for i in range(-5, 15):
        when = dt.datetime.fromtimestamp(SESSION_UTC_NS / 1e9 + i * 0.1 + offset_s, tz=dt.timezone.utc)
        for gpu in (0, 1):
            lines.append(f"{when.strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {gpu}, {200 + gpu}.00, 600.00")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_nsys_export(tmp_path / "t.sqlite", KERNELS, gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition")


def test_local_time_log_is_detected(tmp_path: Path, trace: Path) -> None:
    s = ta.summary(trace, gpu_log=_log(tmp_path / "local.csv", 3600))  # written in UTC+1
    assert s.power is not None and s.power["matched"]
    assert (s.power["utc_offset_s"], s.power["assumed_timezone"]) == (3600, "UTC+01:00")
    assert s.power["timezone_source"] == "detected from the capture window"
    assert [g["name"] for g in s.power["gpus"]] == ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 2
    assert all(g["samples"] >= 10 for g in s.power["gpus"])
    assert any("read as local time UTC+01:00" in w for w in s.warnings)


def test_utc_log_and_given_zone(tmp_path: Path, trace: Path) -> None:
    utc = ta.summary(trace, gpu_log=_log(tmp_path / "utc.csv", 0))
    assert utc.power is not None and utc.power["timezone_source"] == "assumed (UTC)" and utc.power["matched"]
    given = ta.summary(trace, gpu_log=_log(tmp_path / "ist.csv", 19800), extra={"gpu_log_utc_offset_s": 19800})
    assert given.power is not None and given.power["matched"]
    assert (given.power["assumed_timezone"], given.power["timezone_source"]) == ("UTC+05:30", "given")


def test_log_matching_nothing_is_a_warning(tmp_path: Path, trace: Path) -> None:
    s = ta.summary(trace, gpu_log=_log(tmp_path / "old.csv", 3 * 86400))  # three days off: no zone explains it
    assert s.power is not None and not s.power["matched"]
    assert any("no power sample falls inside the capture window" in w for w in s.warnings)


def test_zone_offsets() -> None:
    from traceanalyzer.analysis.power import zone_offset_s

    assert [zone_offset_s(z, 0) for z in ("UTC", "UTC+01:00", "+0530", "-3", "GMT-05:30")] == \
        [0, 3600, 19800, -10800, -19800]
    july, january = 1_782_900_000 * 10**9, 1_767_300_000 * 10**9  # 2026-07-01, 2026-01-01
    assert zone_offset_s("Europe/Berlin", july) == 7200 and zone_offset_s("Europe/Berlin", january) == 3600
    with pytest.raises(ValueError):
        zone_offset_s("Mars/Olympus", 0)


def test_cli_gpu_log_tz(tmp_path: Path, trace: Path) -> None:
    import json

    from click.testing import CliRunner

    from traceanalyzer.cli import cli

    log = _log(tmp_path / "ist.csv", 19800)
    ok = CliRunner().invoke(cli, ["summary", str(trace), "--json", "--gpu-log", str(log), "--gpu-log-tz", "+05:30"])
    assert ok.exit_code == 0, ok.output
    power = json.loads(ok.stdout)["power"]
    assert (power["assumed_timezone"], power["timezone_source"], power["matched"]) == ("UTC+05:30", "given", True)
    bad = CliRunner().invoke(cli, ["summary", str(trace), "--gpu-log", str(log), "--gpu-log-tz", "Mars/Olympus"])
    assert bad.exit_code == 2 and "unknown time zone" in bad.output
