"""Hostile inputs, round 3 (issue 30): secrets planted in the metadata of both formats — the environment table,
the capture's process command line, arguments, user, working directory and environment rows of an nsys export; a
Kineto trace's own top-level metadata and a process's environment — never reach stdout, stderr, the JSON, the
HTML report, the export database or the diff, from any command."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from traceanalyzer.cli import main

REPO = Path(__file__).resolve().parents[1]
NSYS_FILE = REPO / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"
KINETO_FILE = REPO / "fixtures" / "kineto" / "tp2_prefill_serial" / "rank0.json.gz"
SECRET = "hf_PLANTEDsecretTOKEN0123456789"
pytestmark = pytest.mark.timeout(300)


def _planted_nsys(folder: Path) -> Path:
    path = folder / "planted.sqlite"
    shutil.copyfile(NSYS_FILE, path)
    conn = sqlite3.connect(path)
    try:
        conn.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ?, name = name || ?", (SECRET, "_" + SECRET))
        # every capture row but the export versions and the graph-trace mode the loader reads
        conn.execute("UPDATE META_DATA_CAPTURE SET value = value || ? WHERE name NOT LIKE '%CUDA_GRAPH_TRACE%'",
                     (" " + SECRET,))
        conn.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENV_0', ?)", (f"HF_TOKEN={SECRET}",))
        conn.execute("UPDATE META_DATA_EXPORT SET value = value || ? WHERE name NOT LIKE 'EXPORT_%VERSION'",
                     (" " + SECRET,))
        conn.commit()
    finally:
        conn.close()
    return path


def _planted_kineto(folder: Path) -> Path:
    doc = json.loads(gzip.decompress(KINETO_FILE.read_bytes()))
    doc["environment"] = {"HF_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET}
    doc["traceName"] = f"/home/{SECRET}/trace.json"
    doc.setdefault("distributedInfo", {})["master_addr_token"] = SECRET
    doc["traceEvents"].append({"ph": "M", "name": "process_env", "pid": 0, "tid": 0, "args": {"env": SECRET}})
    path = folder / "planted.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("fmt", ["nsys", "kineto"])
def test_planted_secrets_reach_no_output(capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str) -> None:
    trace = _planted_nsys(tmp_path) if fmt == "nsys" else _planted_kineto(tmp_path)
    other = NSYS_FILE if fmt == "nsys" else KINETO_FILE
    html, db, diff_html = tmp_path / "r.html", tmp_path / "a.db", tmp_path / "d.html"
    commands = [["info", str(trace)], ["info", "--json", str(trace)], ["summary", str(trace)],
                ["summary", "--json", str(trace)], ["report", str(trace), "-o", str(html)],
                ["export", str(trace), "-o", str(db)], ["diff", str(trace), "--vs", str(other)],
                ["diff", str(trace), "--vs", str(other), "--json", "-o", str(diff_html)]]
    seen = []
    for argv in commands:
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0, (argv, err)
        seen.append(out + err)
    files = [html.read_bytes(), db.read_bytes(), diff_html.read_bytes()]
    for text in seen:
        assert SECRET not in text
    for data in files:
        assert SECRET.encode() not in data
