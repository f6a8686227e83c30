"""Bad input through every command: exit code 2, exactly one ``Error: <file>: <problem>`` line, no traceback,
no HTML file from ``report``; internal errors exit 1 with one line."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from traceanalyzer.cli import main
from traceanalyzer.testing.synth_nsys import write_nsys_export

REPO = Path(__file__).resolve().parents[1]
KINETO_DIR = REPO / "fixtures" / "kineto" / "tp2_prefill_serial"
NSYS_FILE = REPO / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"
ZERO_KERNEL_KINETO = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2,
                                       "pid": 1, "tid": 1}]}


def _write(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        (d / name).write_bytes(data)
        return d / name
    return make


def _mixed_dir(d: Path) -> Path:
    (d / "mixed").mkdir()
    shutil.copy(NSYS_FILE, d / "mixed" / "a.sqlite")
    shutil.copy(KINETO_DIR / "rank0.json.gz", d / "mixed" / "b.json.gz")
    return d / "mixed"


def _empty_dir(d: Path) -> Path:
    (d / "emptydir").mkdir()
    return d / "emptydir"


def _other_sqlite(d: Path) -> Path:
    conn = sqlite3.connect(d / "other.sqlite")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    return d / "other.sqlite"


def _truncated_sqlite(d: Path) -> Path:
    data = NSYS_FILE.read_bytes()
    (d / "trunc.sqlite").write_bytes(data[: len(data) // 3])
    return d / "trunc.sqlite"


def _truncated_gzip(d: Path) -> Path:
    raw = gzip.decompress((KINETO_DIR / "rank0.json.gz").read_bytes())
    (d / "trunc.json.gz").write_bytes(gzip.compress(raw)[:5000])
    return d / "trunc.json.gz"


def _no_kernel_table(d: Path) -> Path:
    return write_nsys_export(d / "nokernels.sqlite", kernel_table=False)


GARBAGE = bytes(range(256)) * 2
# name → (maker, regex of the problem; alternatives cover per-command wording, e.g. `info` takes one file)
BAD_TRACES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing": (lambda d: d / "missing.json", "no such file"),
    "empty": (_write("empty.json", b""), "empty file"),
    "garbage": (_write("garbage.bin", GARBAGE), "not a trace"),
    "truncated_json": (_write("trunc.json", b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1'), "truncated JSON"),
    "truncated_gzip": (_truncated_gzip, "truncated gzip"),
    "gzip_of_garbage": (_write("gzgarbage.json.gz", gzip.compress(GARBAGE)), "gzip file does not contain"),
    "json_not_a_trace": (_write("notrace.json", b'{"hello": 1}'), "not a Kineto trace"),
    "json_list": (_write("list.json", b"[1, 2, 3]"), "not a trace"),
    "latin1_json": (_write("latin1.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "caf\xe9", '
                                          b'"ts": 1, "dur": 2, "pid": 0, "tid": 7}]}'), "not valid UTF-8"),
    "mixed_dir": (_mixed_dir, "mixes trace formats|is a directory"),
    "empty_dir": (_empty_dir, "no trace files|is a directory"),
    "sqlite_not_nsys": (_other_sqlite, "not an nsys export|reads PyTorch profiler"),
    "truncated_sqlite": (_truncated_sqlite, "corrupt or truncated|truncated SQLite database|reads PyTorch profiler"),
    "nsys_without_kernel_table": (_no_kernel_table, "no kernel table|reads PyTorch profiler"),
    "xz_compressed": (lambda d: REPO / "fixtures" / "nsys" / "tp2_prefill_overlap.sqlite.xz", "xz-compressed.*xz -dk"),
    "zip_archive": (_write("traces.json", b"PK\x03\x04" + GARBAGE), "zip-compressed"),
    "kineto_zero_kernels": (_write("zerok.json", json.dumps(ZERO_KERNEL_KINETO).encode()), "no kernel activity"),
}
COMMANDS = {"info": ["info"], "info_json": ["info", "--json"], "summary": ["summary"],
            "summary_json": ["summary", "--json"], "hta_compat": ["summary", "--hta-compat"],
            "report": ["report"]}
# `info` describes what a file holds: a Kineto trace without kernels is answered (counts.kernels == 0), see below
# and so is an nsys export without a kernel table (counts.kernels == 0 and the hint)
NOT_AN_ERROR = {("kineto_zero_kernels", "info"), ("kineto_zero_kernels", "info_json"),
                ("nsys_without_kernel_table", "info"), ("nsys_without_kernel_table", "info_json")}
KNOWN_BUGS: dict[tuple[str, str], str] = {}  # (case, command) → reason, run as strict xfail


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, list[str]]:
    """Exit code, stdout and the non-blank stderr lines of ``traceanalyzer argv``."""
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def assert_one_error_line(code: int, err: list[str], path: Path | str, problem: str) -> None:
    import re

    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith("Error: "), err
    assert str(path) in err[0] and re.search(problem, err[0]), err
    assert "Traceback" not in err[0]


BAD_TRACE_PARAMS = [
    pytest.param(case, command, id=f"{case}-{command}",
                 marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[(case, command)])]
                 if (case, command) in KNOWN_BUGS else [])
    for case in BAD_TRACES for command in COMMANDS if (case, command) not in NOT_AN_ERROR]


@pytest.mark.parametrize(("case", "command"), BAD_TRACE_PARAMS)
def test_bad_trace_gives_one_error_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str,
                                        command: str) -> None:
    maker, problem = BAD_TRACES[case]
    path = maker(tmp_path)
    out_dir = tmp_path / "out"
    argv = [*COMMANDS[command], *(["-o", str(out_dir / "report.html")] if command == "report" else []), str(path)]
    code, _, err = run_cli(capsys, argv)
    assert_one_error_line(code, err, path, problem)
    assert not out_dir.exists() or not any(out_dir.iterdir())  # nothing written, not even half a file


def test_info_answers_a_trace_without_kernels(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "zerok.json"
    path.write_text(json.dumps(ZERO_KERNEL_KINETO))
    code, out, _ = run_cli(capsys, ["info", "--json", str(path)])
    assert code == 0 and json.loads(out)["counts"]["kernels"] == 0


def test_synthetic_export_with_empty_kernel_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_nsys_export(tmp_path / "zero.sqlite")  # the kernel table exists, with no rows
    for argv in (["summary", str(path)], ["report", "-o", str(tmp_path / "r.html"), str(path)]):
        code, _, err = run_cli(capsys, argv)
        assert_one_error_line(code, err, path, "no kernel activity")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["summary", "report"])
def test_real_export_without_kernel_table(capsys: pytest.CaptureFixture[str], shared_data: Path, tmp_path: Path,
                                          command: str) -> None:
    path = shared_data / "h200" / "nsys" / "tp2_decode_graphs.sqlite"
    out_html = tmp_path / "r.html"
    code, _, err = run_cli(capsys, [command, *(["-o", str(out_html)] if command == "report" else []), str(path)])
    assert_one_error_line(code, err, path, "no kernel (table|activity)")
    assert not out_html.exists()


# -- options ----------------------------------------------------------------------------------------------------
def _rules(d: Path, text: str) -> Path:
    (d / "rules.toml").write_text(text)
    return d / "rules.toml"


def _gpu_log(d: Path, data: bytes) -> Path:
    (d / "gpu.csv").write_bytes(data)
    return d / "gpu.csv"


OPTION_CASES: dict[str, tuple[Callable[[Path], tuple[list[str], str]], str]] = {
    "layer_pattern": (lambda d: (["--layer-pattern", "(unclosed"], "--layer-pattern"), "not a valid regular"),
    "rules_bad_toml": (lambda d: (["--rules", str(p := _rules(d, "this is = not [toml"))], str(p)),
                       "invalid TOML"),
    "rules_bad_rule": (lambda d: (["--rules", str(p := _rules(d, '[[rule]]\nbucket = "gemm"\nmatch = "("\n'))],
                                  str(p)), "rule #1"),
    "rules_missing": (lambda d: (["--rules", str(d / "nope.toml")], str(d / "nope.toml")), "no such rules file"),
    "gpu_log_binary": (lambda d: (["--gpu-log", str(p := _gpu_log(d, GARBAGE))], str(p)), "not a CSV"),
    "gpu_log_not_smi": (lambda d: (["--gpu-log", str(p := _gpu_log(d, b"hello world\nfoo\n"))], str(p)),
                        "needs 'timestamp'"),
    "gpu_log_missing": (lambda d: (["--gpu-log", str(d / "nope.csv")], str(d / "nope.csv")), "no such file"),
}


@pytest.mark.parametrize("command", ["summary", "report"])
@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_bad_option_gives_one_error_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str,
                                         command: str) -> None:
    make, problem = OPTION_CASES[case]
    options, named = make(tmp_path)
    out_html = tmp_path / "r.html"
    argv = [command, *options, *(["-o", str(out_html)] if command == "report" else []), str(KINETO_DIR)]
    code, _, err = run_cli(capsys, argv)
    assert_one_error_line(code, err, named, problem)
    assert not out_html.exists()


NAMES_CASES: dict[str, tuple[bytes | None, str]] = {
    "missing": (None, "no such file"),
    "empty": (b"", "no kernel names"),
    "blank_lines_only": (b"\n  \n", "no kernel names"),
    "latin1": (b"ampere_gemm\ncaf\xe9_kernel\n", "not UTF-8"),
    "garbage": (GARBAGE, "not UTF-8|binary data"),
    "binary_utf8": (b"SQLite format 3\x00abc\n", "binary data"),
}


@pytest.mark.parametrize("case", list(NAMES_CASES))
def test_bad_names_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str) -> None:
    data, problem = NAMES_CASES[case]
    path = tmp_path / "names.txt"
    if data is not None:
        path.write_bytes(data)
    code, _, err = run_cli(capsys, ["classify", "--json", str(path)])
    assert_one_error_line(code, err, path, problem)


def test_names_directory_and_bad_rules(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, ["classify", str(tmp_path)])
    assert_one_error_line(code, err, tmp_path, "is a directory")
    names = tmp_path / "names.txt"
    names.write_text("ampere_bf16_gemm\n")
    rules = _rules(tmp_path, "this is = not [toml")
    code, _, err = run_cli(capsys, ["classify", str(names), "--rules", str(rules)])
    assert_one_error_line(code, err, rules, "invalid TOML")


def test_jobs_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, ["summary", "-j", "0", str(KINETO_DIR)])
    assert code == 2 and any("--jobs" in line for line in err)


def test_internal_error_gives_exit_1_and_one_line(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import traceanalyzer.pipeline.loading as api

    def boom(path: object) -> None:
        raise ZeroDivisionError("synthetic")

    monkeypatch.setattr(api, "info", boom)
    code, _, err = run_cli(capsys, ["info", str(NSYS_FILE)])
    assert code == 1 and len(err) == 1
    assert err[0].startswith("Error: internal error: ZeroDivisionError: synthetic") and "--traceback" in err[0]
    with pytest.raises(ZeroDivisionError):
        main(["--traceback", "info", str(NSYS_FILE)])


def test_console_script_exit_code_and_stderr(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("traceanalyzer")
    if not exe.exists():
        pytest.skip("console script not installed beside the interpreter")
    path = tmp_path / "garbage.bin"
    path.write_bytes(GARBAGE)
    proc = subprocess.run([str(exe), "summary", str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"Error: {path}: not a trace: expected an nsys SQLite export (nsys export --type sqlite) or a Kineto "
        "JSON trace"]


@pytest.mark.parametrize("option", [["--rules", "x.toml"], ["--step-range", "step"], ["--gpu-log", "x.csv"],
                                    ["--layer-pattern", "blk"]])
def test_hta_compat_refuses_options_it_would_ignore(capsys: pytest.CaptureFixture[str], option: list[str]) -> None:
    code, _, err = run_cli(capsys, ["summary", "--hta-compat", *option, str(KINETO_DIR)])
    assert code == 2 and err[-1] == f"Error: --hta-compat follows HTA's own conventions; drop {option[0]}"


@pytest.mark.parametrize("command", ["summary", "report"])
def test_same_trace_twice_is_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str) -> None:
    twice = KINETO_DIR / "rank1.json.gz"
    out_html = tmp_path / "r.html"
    argv = [command, *(["-o", str(out_html)] if command == "report" else []), str(KINETO_DIR), str(twice)]
    code, _, err = run_cli(capsys, argv)
    assert_one_error_line(code, err, twice, "given more than once")
    assert not out_html.exists()


def test_report_to_a_directory_is_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "kineto" / "tp2_decode_graphs"
    code, _, err = run_cli(capsys, ["report", str(fixture), "-o", str(tmp_path)])
    assert code == 2 and len(err) == 1 and err[0].startswith("Error: ") and "is a directory" in err[0]
