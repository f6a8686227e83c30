"""The hostile-input corpus (issue 16), generated at test time in tmp_path from the project's fixtures (and the
shared real traces when present). Every case has its exit code and a one-line message check; nothing may hang
(subprocess timeouts, pytest-timeout). Categories: format, truncation, shape, bombs, SQLite content, paths,
special files, races, impossible values (output paths: test_output.py; scale: the scale tests)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traceanalyzer.cli import main
from traceanalyzer.model.trace import RowChecks
from traceanalyzer.testing.hostile import KINETO_MUTATIONS, NSYS_MUTATIONS, mutate_kineto, mutate_nsys

REPO = Path(__file__).resolve().parents[1]
NSYS_FILE = REPO / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"
KINETO_DIR = REPO / "fixtures" / "kineto" / "tp2_prefill_serial"
KINETO_FILE = KINETO_DIR / "rank0.json.gz"
pytestmark = pytest.mark.timeout(300)


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, list[str]]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def assert_error(code: int, err: list[str], path: Path | str, problem: str) -> None:
    """Exit 2 and exactly one line: ``Error: <path>: …<problem>…``."""
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith(f"Error: {path}: "), err
    assert re.search(problem, err[0]), err


# -- SQLite content -----------------------------------------------------------------------------------------------
NSYS_BAD = {
    "kernel_start_null": r"CUPTI_ACTIVITY_KIND_KERNEL\.start: NULL where an integer is expected",
    "kernel_start_text": r"CUPTI_ACTIVITY_KIND_KERNEL\.start: the text 'abc' where an integer",
    "kernel_start_blob": r"CUPTI_ACTIVITY_KIND_KERNEL\.start: a BLOB where an integer",
    "kernel_end_column_dropped": r"CUPTI_ACTIVITY_KIND_KERNEL\.end: column missing",
    "kernel_device_text": r"CUPTI_ACTIVITY_KIND_KERNEL\.deviceId: the text 'gpu0'",
    "nvtx_start_null": r"NVTX_EVENTS\.start: NULL",
    "memcpy_start_null": r"CUPTI_ACTIVITY_KIND_MEMCPY\.start: NULL",
    "runtime_start_null": r"CUPTI_ACTIVITY_KIND_RUNTIME\.start: NULL",
    "string_value_blob": r"StringIds\.value: a BLOB for id \d+",
    "string_value_null": r"StringIds\.value: NULL for id \d+",
    "session_start_text": r"TARGET_INFO_SESSION_START_TIME\.utcEpochNs: the text 'abc'",
    "event_type_id_text": r"ENUM_NSYS_EVENT_TYPE\.id: the text 'x'",
    "mpi_rank_text": r"MPI_RANKS\.rank: the text 'r0'",
}


@pytest.mark.parametrize("mutation", list(NSYS_BAD))
def test_bad_sqlite_content_is_exit_2_naming_table_and_column(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path, mutation: str) -> None:
    path = mutate_nsys(NSYS_FILE, tmp_path, mutation)
    code, out, err = run_cli(capsys, ["summary", "--json", str(path)])
    assert_error(code, err, path, "bad value in " + NSYS_BAD[mutation])
    assert out == ""


def test_sqlite_mutations_across_real_schema_versions(capsys: pytest.CaptureFixture[str], shared_data: Path,
                                                      tmp_path: Path) -> None:
    """The same damage in exports of every nsys version in ../shared (2021 era … 2026.2)."""
    checked = 0
    for source in sorted((shared_data / "nsys-public").glob("*.sqlite")):
        for mutation in ("kernel_start_text", "string_value_blob"):
            folder = tmp_path / source.stem
            folder.mkdir(exist_ok=True)
            try:
                path = mutate_nsys(source, folder, mutation)
            except Exception:  # the export lacks that table (e.g. no kernels): nothing to damage
                continue
            code, _, err = run_cli(capsys, ["info", "--json", str(path)])
            assert_error(code, err, path, "bad value in " + NSYS_BAD[mutation])
            checked += 1
    assert checked >= 20


# -- Kineto content: bombs, shape -----------------------------------------------------------------------------------
KINETO_BAD = {
    "args_nested_1000_deep": "nested too deeply",
    "pid_2_pow_63": r"pid = 9223372036854775808 is out of range",
    "tid_2_pow_64": r"tid = 18446744073709551616 is out of range",
    "correlation_2_pow_64": r"args\.correlation = \d+ is out of range",
    "stream_2_pow_63": r"args\.stream = \d+ is out of range",
    "grid_2_pow_63": r"args\.grid = \[9223372036854775808, 1, 1\] is out of range",
    "block_product_overflow": r"args\.block = .* is out of range",
    "rank_2_pow_63": r"distributedInfo\.rank = 9223372036854775808 is out of range",
}


@pytest.mark.parametrize("mutation", list(KINETO_BAD))
def test_bad_kineto_content_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, mutation: str) -> None:
    path = mutate_kineto(KINETO_FILE, tmp_path, mutation)
    for command in (["info"], ["summary", "--json"]):
        code, _, err = run_cli(capsys, [*command, str(path)])
        assert_error(code, err, path, KINETO_BAD[mutation])


def _kineto_text() -> bytes:
    return gzip.decompress(KINETO_FILE.read_bytes())


SHAPES = {
    "events_not_a_list": (b'{"traceEvents": {"ph": "X"}}', "not a Kineto trace"),
    "args_a_string": (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, '
                      b'"args": "x"}]}', "not a valid Kineto trace"),
    "ts_missing": (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1}]}', 'has no "ts"'),
    "ts_text": (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1}]}',
                "not a valid Kineto trace"),
    "nul_bytes": (b'{"traceEvents": [\x00\x00]}', "not valid JSON"),
    "top_level_array": (b"[]", "not a trace|not a Kineto trace"),
}


@pytest.mark.parametrize("case", list(SHAPES))
def test_wrong_shape_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str) -> None:
    data, problem = SHAPES[case]
    path = tmp_path / f"{case}.json"
    path.write_bytes(data)
    code, _, err = run_cli(capsys, ["summary", "--json", str(path)])
    assert_error(code, err, path, problem)


def test_gzip_bomb_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (4 << 20) + b"]}", 9))
    monkeypatch.setenv("TRACEANALYZER_MAX_JSON_BYTES", str(1 << 20))  # the same guard as 256 MiB, cheaper
    code, _, err = run_cli(capsys, ["info", str(path)])
    assert_error(code, err, path, "refusing a possible gzip bomb")


# -- truncation -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fraction", [0.001, 0.5, 0.999])
@pytest.mark.parametrize("kind", ["json", "json.gz", "sqlite"])
def test_truncated_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, fraction: float, kind: str) -> None:
    data = {"json": _kineto_text, "json.gz": KINETO_FILE.read_bytes, "sqlite": NSYS_FILE.read_bytes}[kind]()
    path = tmp_path / f"cut.{kind}"
    path.write_bytes(data[: max(1, int(len(data) * fraction))])
    code, _, err = run_cli(capsys, ["summary", "--json", str(path)])
    assert_error(code, err, path, "truncated|corrupt|not a trace|not an nsys export|not valid")


# -- paths ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["new\nline.json", "ansi\x1b[31mred.json", "tab\there.json", "bell\x07.json"])
def test_control_characters_in_names_stay_on_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                      name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"garbage that is not a trace")
    code, _, err = run_cli(capsys, ["summary", str(path)])
    assert code == 2 and len(err) == 1 and "not a trace" in err[0]
    assert not re.search(r"[\x00-\x1f\x7f]", err[0])
    assert repr(name)[1:-1] in err[0]  # shown escaped, e.g. \n and \x1b


def test_control_characters_in_names_of_a_good_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "evil\x1b[2J\nname.json.gz"
    path.write_bytes(KINETO_FILE.read_bytes())
    code, out, _ = run_cli(capsys, ["summary", str(path)])
    assert code == 0 and "\x1b" not in out and "evil\\x1b[2J\\nname.json.gz" in out


@pytest.mark.parametrize(("make", "problem"), [
    (lambda d: d / "missing.json", "no such file"),
    (lambda d: (d / "dangling.json").symlink_to(d / "nowhere") or d / "dangling.json", "no such file"),
    (lambda d: d / ("x" * 300 + ".json"), "cannot read: File name too long|no such file"),
    (lambda d: (d / "f").write_text("") or d / "f" / "child.json", "cannot read: Not a directory|no such file"),
])
def test_bad_paths(capsys: pytest.CaptureFixture[str], tmp_path: Path, make: object, problem: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    code, _, err = run_cli(capsys, ["summary", str(path)])
    assert_error(code, err, path, problem)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "secret.json"
    path.write_bytes(b"{}")
    path.chmod(0)
    code, _, err = run_cli(capsys, ["summary", str(path)])
    assert_error(code, err, path, "Permission denied")


# -- special files ----------------------------------------------------------------------------------------------------
def _cli(*args: str, timeout: float = 60, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traceanalyzer.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, **kwargs)  # type: ignore[call-overload]


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/null"])
def test_special_files_are_refused_without_opening(tmp_path: Path, special: str) -> None:
    path = tmp_path / "rank0.json" if special == "fifo" else Path(special)
    if special == "fifo":
        os.mkfifo(path)
    elif not path.exists():
        pytest.skip(f"{special} absent")
    proc = _cli("summary", "--json", str(path))
    lines = proc.stderr.strip().splitlines()
    kind = "a FIFO (named pipe)" if special == "fifo" else "a character device"
    assert proc.returncode == 2 and lines == [
        f"Error: {path}: is {kind}, not a regular file — traces are read from regular files"]


def test_special_files_inside_a_directory_are_skipped_and_named(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json.gz").write_bytes((KINETO_DIR / f"rank{rank}.json.gz").read_bytes())
    os.mkfifo(tmp_path / "rank2.json")
    code, out, _ = run_cli(capsys, ["summary", "--json", str(tmp_path)])
    assert code == 0
    assert any(f"skipped {tmp_path / 'rank2.json'}: a FIFO (named pipe), not a regular file" in w
               for w in json.loads(out)["warnings"])


# -- races: worker pool, Ctrl-C ---------------------------------------------------------------------------------------
_POOL_SCRIPT = """
import os, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
os.environ["TRACEANALYZER_DECODE_PROCESSES"] = "2"  # each worker forks a decode helper, as on a big file
from traceanalyzer.loaders import kineto, kineto_read
kineto_read.BATCH_BYTES = 20_000  # many batches from a small file
real_add = kineto._Events.add
def slow_add(self, batch, path):  # every batch of the good ranks is slow: they are still loading when the bad fails
    (folder / "started").touch()
    time.sleep(1)
    return real_add(self, batch, path)
kineto._Events.add = slow_add
from traceanalyzer.cli import run  # the console script's entry point (it leaves with os._exit)
sys.argv = ["traceanalyzer", "summary", "-j", "2", "--json", str(folder / "ranks")]
run()
"""


def _pool_case(tmp_path: Path, bad: bool) -> Path:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in range(4):
        (ranks / f"rank{rank}.json").write_bytes(_kineto_text())
    if bad:
        (ranks / "a_bad.json").write_bytes(b'{"traceEvents": [')
    script = tmp_path / "pool_script.py"
    script.write_text(_POOL_SCRIPT)
    return script


def _survivors(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (killed, so a failing test leaves none behind)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir() or sys.platform != "linux", reason="needs Linux /proc and fork")
def test_bad_rank_file_under_jobs_leaves_no_worker(tmp_path: Path) -> None:
    """summary -j 2 … | cat must return promptly: no worker may survive holding the pipe."""
    script = _pool_case(tmp_path, bad=True)
    started = time.monotonic()
    try:
        proc = subprocess.run(["bash", "-c", f'"{sys.executable}" "{script}" "{tmp_path}" bad 2>&1 | cat'],
                              capture_output=True, text=True, timeout=90)
    finally:
        left = _survivors(str(script))
    assert time.monotonic() - started < 60 and left == []
    assert proc.stdout.strip().splitlines()[-1].startswith(f"Error: {tmp_path / 'ranks' / 'a_bad.json'}: truncated")


@pytest.mark.skipif(not Path("/proc").is_dir() or sys.platform != "linux", reason="needs Linux /proc and fork")
def test_ctrl_c_under_jobs_stops_the_workers(tmp_path: Path) -> None:
    script = _pool_case(tmp_path, bad=False)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), "ctrl-c"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the whole process group
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        left = _survivors(str(script))
    assert proc.returncode == 130 and err.strip().splitlines() == ["Interrupted."] and left == []


def test_file_truncated_while_read_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from traceanalyzer.loaders import kineto_read

    path = tmp_path / "rank0.json"
    path.write_bytes(_kineto_text())
    real = kineto_read._read_exactly

    def truncated_meanwhile(fh: object, p: Path, total: int, progress: object) -> bytearray:
        os.truncate(p, total // 2)  # another process cuts the file after it was opened and sized
        return real(fh, p, total, progress)  # type: ignore[arg-type]

    monkeypatch.setattr(kineto_read, "_read_exactly", truncated_meanwhile)
    code, _, err = run_cli(capsys, ["summary", "--json", str(path)])
    assert_error(code, err, path, "file changed while reading")


def test_truncation_racing_the_reader_never_kills_it(shared_data: Path, tmp_path: Path) -> None:
    """The issue's SIGBUS: a big plain .json truncated while loading. Exit 0 (read before the cut) or 2, never a
    signal; with 2, one line."""
    text = gzip.decompress((shared_data / "h200" / "kineto" / "nop2p_prefill_serial_rank0.json.gz").read_bytes())
    for delay in (0.05, 0.2, 0.5, 1.0):
        path = tmp_path / "rank0.json"
        path.write_bytes(text)
        proc = subprocess.Popen([sys.executable, "-m", "traceanalyzer.cli", "summary", "--json", str(path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
        time.sleep(delay)
        os.truncate(path, len(text) // 3)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 2), (delay, proc.returncode, err)
        if proc.returncode == 2:
            assert len(err.strip().splitlines()) == 1 and str(path) in err


# -- impossible values ---------------------------------------------------------------------------------------------
IMPOSSIBLE_NSYS = {
    "kernel_end_before_start_20pct": r"dropped 479 of 2,398 kernels rows that cannot be true: 479 ending before",
    "kernel_end_int64_max": r"dropped 1 of 2,398 kernels rows that cannot be true: 1 beyond the capture",
    "string_ids_dropped": r"2,398 of 2,398 kernels have names that cannot be resolved",
    "pid_labelled_two_ranks": r"MPI_RANKS labels process \d+ as ranks 3, 5: using rank 3",
}
IMPOSSIBLE_KINETO = {
    "ts_9e15_us": r"dropped 1 of 684 kernels rows that cannot be true: 1 beyond the capture",
    "dur_9e12_us": r"dropped 1 of 684 kernels rows that cannot be true: 1 beyond the capture",
    "dur_negative": r"dropped 1 of 684 kernels rows that cannot be true: 1 ending before they start",
    "pid_labelled_two_ranks": r"process labelled rank 5 in its metadata but distributedInfo\.rank is 3: using 3",
}


@pytest.mark.parametrize(("fmt", "mutation"), [("nsys", m) for m in IMPOSSIBLE_NSYS]
                         + [("kineto", m) for m in IMPOSSIBLE_KINETO])
def test_impossible_values_are_dropped_and_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str,
                                                    mutation: str) -> None:
    if fmt == "nsys":
        path, expected = mutate_nsys(NSYS_FILE, tmp_path, mutation), IMPOSSIBLE_NSYS[mutation]
    else:
        path, expected = mutate_kineto(KINETO_FILE, tmp_path, mutation), IMPOSSIBLE_KINETO[mutation]
    code, out, _ = run_cli(capsys, ["summary", "--json", str(path)])
    assert code == 0
    summary = json.loads(out)
    assert any(re.search(expected, w) for w in summary["warnings"]), summary["warnings"]
    span_ns = max(d["span_ns"] for d in summary["devices"])
    assert 0 < span_ns < 10**10  # no 292-year span from the bad row
    code, out, _ = run_cli(capsys, ["info", "--json", str(path)])
    assert code == 0 and any(re.search(expected, w) for w in json.loads(out)["warnings"])


def test_dropped_rows_change_the_numbers_only_by_what_was_dropped(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    """The INT64_MAX kernel is gone; everything else is as in the good file."""
    import traceanalyzer as ta

    good = ta.load(NSYS_FILE, classify=False)
    bad = ta.load(mutate_nsys(NSYS_FILE, tmp_path, "kernel_end_int64_max"), classify=False)
    assert len(bad.kernels) == len(good.kernels) - 1
    assert bad.dropped_rows == {"kernels": RowChecks(end_before_start=0, beyond_capture=1)}
    assert int(bad.kernels["end_ns"].max()) == int(good.kernels["end_ns"][good.kernels["end_ns"] < 2**62].max())


def test_every_mutation_is_exercised() -> None:
    assert set(NSYS_MUTATIONS) == set(NSYS_BAD) | set(IMPOSSIBLE_NSYS)
    assert set(KINETO_MUTATIONS) == set(KINETO_BAD) | set(IMPOSSIBLE_KINETO)


# -- messages ------------------------------------------------------------------------------------------------------
def test_readability_is_left_to_the_loader(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """click no longer pre-checks readability (its usage error is 4 lines); an unreadable file is the loader's one
    line (test_unreadable_file_is_one_line, not as root)."""
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
    code, out, _ = run_cli(capsys, ["info", "--json", str(NSYS_FILE)])
    assert code == 0 and json.loads(out)["counts"]["kernels"] > 0


def test_library_warnings_do_not_reach_the_user() -> None:
    """A pandas PerformanceWarning raised during a summary is not printed (run in a subprocess: pytest would
    capture the warning itself)."""
    script = (
        "import sys, warnings\n"
        "import pandas as pd\n"
        "import traceanalyzer.pipeline.summarize as pipeline\n"
        "real = pipeline.summarize_paths\n"
        "def noisy(*a, **k):\n"
        "    warnings.warn('DataFrame is highly fragmented', pd.errors.PerformanceWarning, stacklevel=1)\n"
        "    return real(*a, **k)\n"
        "pipeline.summarize_paths = noisy\n"
        "from traceanalyzer.cli import main\n"
        f"sys.exit(main(['summary', '--json', {str(KINETO_DIR)!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "fragmented" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["devices"]


@pytest.mark.parametrize("ranks", [1, 2])
def test_kernels_of_zero_duration_are_summarized(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 ranks: int) -> None:
    """Every kernel lasting 0 ns (a clock too coarse, a profiler that lost the end): no busy interval at all, so
    the what-if's host evidence has nothing to index; the summary still answers (exit 0, no communication time)."""
    for rank in range(ranks):
        doc = json.loads(gzip.decompress((KINETO_DIR / f"rank{rank}.json.gz").read_bytes()))
        for event in doc["traceEvents"]:
            if event.get("cat") == "kernel":
                event["dur"] = 0
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(doc))
    code, out, err = run_cli(capsys, ["summary", "--json", str(tmp_path)])
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["devices"]) == ranks and all(d["comm_ns"] == 0 for d in doc["devices"])
    assert all(d["kernels"] > 0 for d in doc["devices"])
