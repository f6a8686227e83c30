"""The one output writer (``traceanalyzer.commands.output``) and the commands that use it: atomic replace, stdout,
special
files, input traces refused, write errors as exit 2 ``cannot write FILE: <reason>``, temporary files cleaned up."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from traceanalyzer.cli import main
from traceanalyzer.commands import output
from traceanalyzer.model.errors import OutputError

REPO = Path(__file__).resolve().parents[1]
KINETO_DIR = REPO / "fixtures" / "kineto" / "tp2_decode_graphs"
NSYS_FILE = REPO / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_replaces_atomically_and_keeps_mode(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "r.html"
    assert output.write_output("first", out) == str(out)
    out.chmod(0o600)
    output.write_output("second", out)
    assert out.read_text() == "second" and stat.S_IMODE(out.stat().st_mode) == 0o600
    with pytest.raises(UnicodeEncodeError):
        output.write_output("bad \ud800 surrogate", out)
    assert out.read_text() == "second" and _leftovers(out.parent) == []


def test_write_error_removes_the_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r.html"
    out.write_text("old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(output.os, "fsync", full)
    with pytest.raises(OutputError, match=r"^cannot write .*r\.html: no space left on device$"):
        output.write_output("new", out)
    assert out.read_text() == "old" and _leftovers(tmp_path) == []


def test_stale_temporary_of_a_killed_writer_is_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    stale = tmp_path / f".r.html.{gone.pid}.abc123.tmp"
    stale.write_bytes(b"")
    other = tmp_path / f".other.html.{gone.pid}.abc123.tmp"  # another target's: left alone
    other.write_bytes(b"")
    output.write_output("x", tmp_path / "r.html")
    assert _leftovers(tmp_path) == [other.name]


def test_symlink_is_written_through(tmp_path: Path) -> None:
    real = tmp_path / "real.html"
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    output.write_output("new", link)
    assert link.is_symlink() and real.read_text() == "new"


@pytest.mark.parametrize(("make", "problem"), [
    (lambda d: d, "is a directory"),
    (lambda d: (d / "f").write_text("") or d / "f" / "x.html", "not a directory"),
    (lambda d: Path("/dev/traceanalyzer-no-such-device"), "not a regular file path"),
])
def test_refused_targets(tmp_path: Path, make: object, problem: str) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(OutputError, match=f"cannot write {target}: .*{problem}"):
        output.write_output("x", target)


def test_input_traces_are_refused(tmp_path: Path) -> None:
    trace = tmp_path / "rank0.json"
    trace.write_text("{}")
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "rank1.json").write_text("{}")
    for target, inputs in ((trace, [trace]), (folder / "rank1.json", [folder]), (tmp_path / "alias.json", [trace])):
        if target.name == "alias.json":
            target.hardlink_to(trace)
        with pytest.raises(OutputError, match="one of the input traces"):
            output.write_output("x", target, inputs=inputs)
    assert trace.read_text() == "{}" and (folder / "rank1.json").read_text() == "{}"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_device_written_in_place_and_disk_full() -> None:
    output.write_output("x", "/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(OutputError, match=r"^cannot write /dev/full: no space left on device$"):
        output.write_output("x" * 100_000, "/dev/full")


def test_fifo_written_in_place_or_refused_without_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="no process is reading"):
        output.write_output("x", fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    for _ in range(500):  # until the reader has the FIFO open
        try:
            output.write_output("through the pipe", fifo)
            break
        except OutputError:
            time.sleep(0.01)
    reader.join(timeout=10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_sigterm_during_the_write_removes_the_temporary_file(tmp_path: Path) -> None:
    script = (
        "import os, sys, time\n"
        "from traceanalyzer.commands import output\n"
        "def slow(fd):\n"
        "    sys.stdout.write('writing\\n'); sys.stdout.flush(); time.sleep(60)\n"
        "output.os.fsync = slow\n"
        f"output.write_output('x' * 1000, {str(tmp_path / 'r.html')!r})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
        assert len(_leftovers(tmp_path)) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert _leftovers(tmp_path) == [] and not (tmp_path / "r.html").exists()


# -- through the commands ----------------------------------------------------------------------------------------
def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, list[str]]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def test_report_to_stdout_puts_the_summary_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, ["report", str(KINETO_DIR), "-o", "-"])
    assert code == 0 and out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>")
    assert any("traceanalyzer summary of" in line for line in err)
    assert not any("report written" in line for line in err)


def test_summary_json_to_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    code, out, err = _run(capsys, ["summary", "--json", "-o", str(target), str(KINETO_DIR)])
    assert code == 0 and out == "" and err == [f"JSON written: {target}"]
    assert json.loads(target.read_text())["devices"]
    code, out, _ = _run(capsys, ["summary", "--json", "-o", "-", str(KINETO_DIR)])
    assert code == 0 and json.loads(out) == json.loads(target.read_text())
    code, _, err = _run(capsys, ["summary", "-o", str(target), str(KINETO_DIR)])
    assert code == 2 and len(err) == 1 and "add --json" in err[0]


@pytest.mark.parametrize("command", [["report", "-o"], ["summary", "--json", "-o"]])
def test_output_naming_an_input_trace_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 command: list[str]) -> None:
    trace = tmp_path / "t.sqlite"
    trace.write_bytes(NSYS_FILE.read_bytes())
    before = trace.read_bytes()
    for target, given in ((trace, trace), (trace, tmp_path)):
        code, out, err = _run(capsys, [*command, str(target), str(given)])
        assert code == 2 and len(err) == 1 and out == ""
        assert err[0].startswith(f"Error: cannot write {target}: it is one of the input traces")
    assert trace.read_bytes() == before


def test_file_size_limit_is_exit_2(tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))\n"
            "from traceanalyzer.cli import main\n"
            f"sys.exit(main(['report', '-o', {str(target)!r}, {str(KINETO_DIR)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[-1] == f"Error: cannot write {target}: file too large", lines
    assert not target.exists() and _leftovers(tmp_path) == []


def test_dev_stdout_is_written_in_place(tmp_path: Path) -> None:
    if not os.path.islink("/dev/stdout"):
        pytest.skip("/dev/stdout is not a link here")
    exe = Path(sys.executable).with_name("traceanalyzer")
    if not exe.exists():
        pytest.skip("console script not installed beside the interpreter")
    proc = subprocess.run([str(exe), "summary", "--json", "-o", "/dev/stdout", str(KINETO_DIR)],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout)["devices"]
    assert os.path.islink("/dev/stdout")
