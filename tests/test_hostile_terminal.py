"""Hostile inputs, round 3 (issue 30), family 2: terminal injection. ANSI/OSC escapes, C1 codes and Unicode bidi
controls in kernel names, NVTX/annotation names, GPU names, rule ids, file names and option values never reach a
terminal raw from any command: every console prints through ``errors.printable`` (``render/terminal.py``), and the
CLI's own lines use it too."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from traceanalyzer.cli import main
from traceanalyzer.model.errors import printable

REPO = Path(__file__).resolve().parents[1]
KINETO_FILE = REPO / "fixtures" / "kineto" / "tp2_prefill_serial" / "rank0.json.gz"
#: an OSC window title, clear screen, a C1 CSI, bidi override and isolate, a rich markup link
EVIL = "\u202e\u2066\x1b]0;pwned\x07\x1b[2J\x9b31m[link=http://x]y[/link]\u2069\u202c"
#: what a terminal acts on: C0 but newline, DEL, C1, bidi embeddings/overrides/isolates and marks
ACTIVE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
pytestmark = pytest.mark.timeout(180)


def assert_inert(*texts: str) -> None:
    for text in texts:
        found = ACTIVE.findall(text)
        assert not found, found[:5]
        assert "\x1b" not in text and "]8;" not in text  # no escape, no OSC 8 hyperlink from markup


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def evil_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Kineto fixture with EVIL in every kernel name, every annotation name and the GPU name, in a file whose
    name holds it too."""
    doc = json.loads(gzip.decompress(KINETO_FILE.read_bytes()))
    for event in doc["traceEvents"]:
        if event.get("cat") in ("kernel", "user_annotation", "gpu_user_annotation"):
            event["name"] = event["name"] + EVIL
    for prop in doc.get("deviceProperties", []):
        prop["name"] = EVIL + prop.get("name", "")
    path = tmp_path_factory.mktemp("evil") / f"rank0{EVIL.replace('/', '_')}.json"
    path.write_text(json.dumps(doc))
    return path


def test_printable_escapes_every_active_character() -> None:
    shown = printable("a\u202eb\u2066c\x1b[2Jd\x9be\u200ff\u2028g\nh")
    assert shown == "a\\u202eb\\u2066c\\x1b[2Jd\\x9be\\u200ff\\u2028g\\nh"
    assert printable("x\ny", keep="\n") == "x\ny"
    assert printable("MoE GEMM · 128×128 — ok") == "MoE GEMM · 128×128 — ok"  # printable Unicode is left alone


def test_summary_of_a_hostile_trace_is_inert(capsys: pytest.CaptureFixture[str], evil_trace: Path) -> None:
    code, out, err = run_cli(capsys, ["summary", str(evil_trace)])
    assert code == 0, err
    assert_inert(out, err)
    assert "\\u202e" in out and "\\x1b]0;pwned" in out  # shown escaped, not dropped
    assert "[link=http://x]" in out  # markup stays text


def test_diff_of_hostile_traces_is_inert(capsys: pytest.CaptureFixture[str], evil_trace: Path) -> None:
    code, out, err = run_cli(capsys, ["diff", str(evil_trace), "--vs", str(KINETO_FILE)])
    assert code == 0, err
    assert_inert(out, err)


def test_classify_names_and_rule_ids_are_inert(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    names = tmp_path / "names.txt"
    names.write_text(f"ncclDevKernel_AllReduce_Sum_bf16_RING_LL{EVIL}\nmy_kernel{EVIL}\n")
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nid = "evil\\u202e\\u001b]0;x\\u0007"\nbucket = "gemm"\nmatch = "my_kernel"\n')
    code, out, err = run_cli(capsys, ["classify", str(names), "--rules", str(rules)])
    assert code == 0, err
    assert_inert(out, err)
    assert "evil\\u202e" in out


def test_export_line_with_a_hostile_output_path_is_inert(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    """The issue's loop ``-o "$f.db"``: an escape in the output path reached the terminal in "PATH: run N"."""
    db = tmp_path / "t\x1b]0;pwned\x07\u202e.db"
    code, out, err = run_cli(capsys, ["export", str(KINETO_FILE), "-o", str(db)])
    assert code == 0, err
    assert_inert(out, err)
    assert out.startswith(printable(db)) and ": run 1 — " in out


def test_report_default_path_and_errors_are_inert(capsys: pytest.CaptureFixture[str], evil_trace: Path,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, ["report", str(evil_trace)])
    assert code == 0, err
    assert_inert(out, err)
    assert "report written: reports/rank0\\u202e" in err
    code, out, err = run_cli(capsys, ["summary", str(tmp_path / f"missing{EVIL}.json")])
    assert code == 2 and len(err.splitlines()) == 1
    assert_inert(out, err)


def test_an_option_value_is_inert_in_its_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, ["summary", "--step-range", f"step{EVIL}", str(KINETO_FILE)])
    assert code == 2 and len(err.splitlines()) == 1, err
    assert_inert(out, err)
