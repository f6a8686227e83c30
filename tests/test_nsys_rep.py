"""``.nsys-rep`` in: exported to SQLite by nsys once, reused while newer than the report; without nsys, exit 2
with the command to run. A stand-in ``nsys`` (a Python script) copies the SQLite export named inside the fake report
to ``--output`` and logs each call, so the tests see when an export runs."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from traceanalyzer.cli import main
from traceanalyzer.loaders import nsys_rep
from traceanalyzer.testing.synth_nsys import write_nsys_export

FAKE_NSYS = """#!{python}
import shutil, sys
args = sys.argv[1:]
assert args[:5] == ["export", "--type", "sqlite", "--force-overwrite", "true"], args
out, report = args[args.index("--output") + 1], args[-1]
with open({log!r}, "a") as log:
    log.write(report + "\\n")
source = open(report).read().strip()
if source == "fail":
    sys.stderr.write("ERROR: the report is corrupt\\n")
    sys.exit(1)
shutil.copyfile(source, out)
"""


def _fake_nsys(folder: Path, log: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nsys"
    exe.write_text(FAKE_NSYS.format(python=sys.executable, log=str(log)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


@pytest.fixture
def report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake report whose export is a two-kernel synthetic nsys export; no nsys on PATH, no --nsys."""
    (tmp_path / "source").mkdir()
    source = write_nsys_export(tmp_path / "source" / "src.sqlite",
                               [(1000, 2000, 0, 7, "gemm_kernel"), (2500, 4000, 0, 7, "gemm_kernel")])
    rep = tmp_path / "run" / "profile.nsys-rep"
    rep.parent.mkdir()
    rep.write_text(str(source))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(nsys_rep.NSYS_ENV, raising=False)
    monkeypatch.setenv(nsys_rep.CACHE_ENV, str(tmp_path / "cache"))
    return rep


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_without_nsys_exit_2_with_the_command(report: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["summary", str(report)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert f"nsys export --type sqlite --output {report.with_suffix('.sqlite')} {report}" in err[0]
    assert err[0].startswith(f"Error: {report}: an Nsight Systems report")
    assert not report.with_suffix(".sqlite").exists()


def test_nsys_on_path_exports_once_and_reuses(report: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", str(_fake_nsys(tmp_path / "bin", log).parent))
    assert main(["summary", str(report), "--json"]) == 0
    out = capsys.readouterr()
    export = report.with_name("profile.sqlite")
    assert export.is_file() and _calls(log) == 1
    assert "exporting profile.nsys-rep to SQLite" in out.err
    assert '"kernels": 2' in out.out
    assert main(["info", str(report)]) == 0  # reused: fresh
    assert _calls(log) == 1
    later = time.time() + 5
    os.utime(report, (later, later))  # the report is newer than its export: exported again
    assert main(["summary", str(report)]) == 0
    assert _calls(log) == 2


def test_nsys_option(report: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    log = tmp_path / "calls.log"
    exe = _fake_nsys(tmp_path / "elsewhere", log)
    try:
        assert main(["summary", str(report), "--nsys", str(exe)]) == 0
    finally:
        os.environ.pop(nsys_rep.NSYS_ENV, None)  # set by the option for the process
    assert _calls(log) == 1
    assert main(["summary", str(report), "--nsys", str(tmp_path / "no-such-nsys")]) == 0  # fresh: nsys not needed
    os.environ.pop(nsys_rep.NSYS_ENV, None)


def test_failed_export_is_bad_input(report: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]):
    report.write_text("fail")
    monkeypatch.setenv("PATH", str(_fake_nsys(tmp_path / "bin", tmp_path / "calls.log").parent))
    assert main(["report", str(report), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "nsys export failed (exit 1): ERROR: the report is corrupt" in err
    assert not report.with_suffix(".sqlite").exists() and not list(report.parent.glob(".*tmp*"))


def test_unwritable_folder_uses_the_cache(report: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(_fake_nsys(tmp_path / "bin", tmp_path / "calls.log").parent))
    monkeypatch.setattr(nsys_rep, "_writable", lambda folder: False)
    export = nsys_rep.as_export(report)
    assert export.parent == tmp_path / "cache" and export.name.startswith("profile-")
    assert nsys_rep.as_export(report) == export and _calls(tmp_path / "calls.log") == 1


def test_directory_with_report_and_export_counts_once(report: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    from traceanalyzer.loaders import expand_paths

    monkeypatch.setenv("PATH", str(_fake_nsys(tmp_path / "bin", tmp_path / "calls.log").parent))
    nsys_rep.as_export(report)
    assert expand_paths([report.parent]) == [report.with_suffix(".sqlite")]


def test_report_content_without_its_suffix(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # the first bytes of a real report written by nsys 2025.3.1 on the GPU machine (examples/nsys_rep_device.sh)
    odd = tmp_path / "capture.bin"
    odd.write_bytes(b"NVIDIA Tegra Profiler Report 363988880.\n\x0bLocal (CLI)")
    assert main(["summary", str(odd)]) == 2
    err = capsys.readouterr().err
    assert "an Nsight Systems report without the .nsys-rep suffix" in err and "capture.nsys-rep" in err
