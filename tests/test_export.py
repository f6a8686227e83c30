"""``export``: the summary as a SQLite database, agreeing with ``summary --json``; the docs' queries run."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

import traceanalyzer as ta
from traceanalyzer.cli import main

REPO = Path(__file__).resolve().parents[1]
KINETO_DIR = REPO / "fixtures" / "kineto" / "tp2_prefill_serial"
NSYS_FILE = REPO / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"
CONTRACT = ["rank", "device", "name", "span_ns", "busy_ns", "idle_ns", "comm_ns", "comm_hidden_ns", "comm_exposed_ns",
            "overlap_pct", "steps", "step_ns_median", "comm_exposed_per_step_ns", "step_source", "layer_source",
            "kernels", "memops", "layers"]


def _rows(db: Path, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The fixture exported through the CLI, and ``summary --json`` of the same traces."""
    out = tmp_path_factory.mktemp("export") / "analysis.db"
    assert main(["export", str(KINETO_DIR), "-o", str(out)]) == 0
    summary = json.loads(json.dumps(ta.summary([KINETO_DIR]).to_json()))
    return out, summary


def test_devices_and_findings_agree_with_summary_json(exported, capsys):
    db, summary = exported
    assert main(["summary", "--json", str(KINETO_DIR)]) == 0
    cli_json = json.loads(capsys.readouterr().out)
    rows = _rows(db, "SELECT d.*, t.path FROM devices d JOIN traces t ON t.id = d.trace_id ORDER BY rank, device")
    assert len(rows) == len(cli_json["devices"]) == 2
    for row, dev in zip(rows, cli_json["devices"], strict=True):
        for key in CONTRACT:
            assert row[key] == dev[key], key
        assert json.loads(row["bucket_ns"]) == dev["bucket_ns"]
        assert row["path"] == dev["trace"]
    findings = _rows(db, "SELECT * FROM findings ORDER BY rowid")
    assert [(f["id"], f["title"], f["impact_ns_per_step"]) for f in findings] == \
        [(f["id"], f["title"], f["impact_ns_per_step"]) for f in cli_json["findings"]]
    assert [json.loads(f["evidence"]) for f in findings] == [f["evidence"] for f in cli_json["findings"]]
    run = _rows(db, "SELECT * FROM runs")[0]
    assert run["comm_free_step_saving_ns"] == cli_json["what_if"]["comm_free_step_saving_ns"]
    assert json.loads(run["summary_json"])["devices"] == summary["devices"]


def test_row_tables_add_up_to_the_device_figures(exported):
    db, summary = exported
    for dev in summary["devices"]:
        where = (dev["rank"], dev["device"])
        count = _rows(db, "SELECT count(*) AS n, sum(step >= 0) AS stepped FROM kernels WHERE rank = ? AND device = ?",
                      where)[0]
        assert count["n"] == dev["kernels"] and count["stepped"] > 0
        steps = _rows(db, "SELECT count(*) AS n, sum(comm_exposed_ns) AS exposed FROM steps "
                          "WHERE rank = ? AND device = ?", where)[0]
        assert steps["n"] == dev["steps"] == 3
        assert _rows(db, "SELECT count(*) AS n FROM layers WHERE rank = ? AND device = ?", where)[0]["n"] == \
            dev["layers"]
        comm = _rows(db, "SELECT sum(duration_ns) AS d FROM kernels WHERE bucket = 'communication' AND rank = ?",
                     (dev["rank"],))[0]["d"]
        assert comm == dev["comm_ns"]  # the all-reduces never overlap each other here: sum == union
    # exposed communication per step from the rows equals the device's per-step median
    per_step = [r["comm_exposed_ns"] for r in _rows(db, "SELECT comm_exposed_ns FROM steps WHERE rank = 0 "
                                                        "ORDER BY step")]
    assert sorted(per_step)[1] == summary["devices"][0]["comm_exposed_per_step_ns"]


def test_collectives_carry_bytes_transfer_wait_and_bandwidth(exported):
    db, summary = exported
    rows = _rows(db, "SELECT * FROM collectives WHERE rank = 0")
    assert len(rows) == 24 and all(r["kind"] == "allreduce" for r in rows)
    for r in rows:
        assert r["bytes"] == 128 * 1024 * 1024 and r["matched"] == 1
        assert r["transfer_ns"] + r["wait_ns"] == r["duration_ns"]
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["transfer_ns"])
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])  # 2 ranks: bus factor 2(n-1)/n = 1
    matched = _rows(db, "SELECT count(DISTINCT start_ns) AS n FROM collectives WHERE matched AND rank = 1")[0]["n"]
    assert matched == summary["cross_rank"]["collectives_matched"]


def test_schema_keys_indexes_and_full_text_search(exported):
    db, _ = exported
    conn = sqlite3.connect(db)
    try:
        for table in ("devices", "kernels", "memops", "steps", "layers", "collectives", "findings"):
            targets = {row[2] for row in conn.execute(f"PRAGMA foreign_key_list([{table}])")}
            assert "traces" in targets, table
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        for table in ("kernels", "memops", "steps", "layers", "collectives"):
            columns = [[row[2] for row in conn.execute(f"PRAGMA index_info([{idx[1]}])")]
                       for idx in conn.execute(f"PRAGMA index_list([{table}])")]
            assert ["trace_id", "rank", "device", "start_ns"] in columns, table
        plan = " ".join(str(r) for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM kernels WHERE trace_id = 1 AND rank = 0 AND device = 0 "
            "AND start_ns > 0"))
        assert "idx_kernels_where_start" in plan
        hits = conn.execute("SELECT k.bucket FROM kernels k JOIN kernels_fts f ON f.rowid = k.rowid "
                            "WHERE kernels_fts MATCH 'AllReduce'").fetchall()
        assert len(hits) == 48 and {h[0] for h in hits} == {"communication"}
    finally:
        conn.close()


def _doc_queries() -> list[str]:
    text = (REPO / "docs" / "EXPORT.md").read_text()
    return re.findall(r"```sql\n(.*?)```", text, flags=re.S)


def test_docs_queries_run_and_answer(exported):
    db, summary = exported
    queries = _doc_queries()
    assert len(queries) >= 4
    results = [_rows(db, q) for q in queries]
    assert all(results), "every documented query returns rows"
    fts, top, per_layer, bandwidth, history = results
    assert "AllReduce" in fts[0]["name"]
    # top kernels: at most 3 per (device, step, bucket); place 1 is the heaviest of its group
    groups: dict[tuple, list] = {}
    for r in top:
        groups.setdefault((r["rank"], r["step"], r["bucket"]), []).append(r["total_ns"])
    assert all(len(v) <= 3 and v == sorted(v, reverse=True) for v in groups.values())
    assert {k[2] for k in groups} >= {"gemm", "attention", "communication", "moe_gemm"}
    # exposed communication per layer sums to the devices' per-layer exposed time
    for dev in summary["devices"]:
        mine = [r for r in per_layer if r["rank"] == dev["rank"]]
        assert len(mine) == 4 and all(r["steps"] == 3 for r in mine)
    assert sum(r["exposed_ns"] for r in per_layer) == \
        _rows(db, "SELECT sum(comm_exposed_ns) AS s FROM layers WHERE step >= 0")[0]["s"]
    assert bandwidth[0]["kind"] == "allreduce" and bandwidth[0]["link_peak_gbps"] == 450.0
    assert 0 < bandwidth[0]["pct_of_peak"] < 100
    assert [(h["rank"], h["comm_exposed_per_step_ns"]) for h in history] == \
        [(d["rank"], d["comm_exposed_per_step_ns"]) for d in summary["devices"]]


def test_append_keeps_a_history_and_plain_export_replaces(tmp_path):
    db = tmp_path / "history.db"
    first = ta.export([KINETO_DIR], db)
    summary = ta.summary([KINETO_DIR])
    second = ta.export(summary, db, append=True)  # a Summary is written as it is, not recomputed
    assert (first.run_id, second.run_id) == (1, 2)
    assert set(first.trace_ids).isdisjoint(second.trace_ids)
    assert _rows(db, "SELECT count(*) AS n FROM kernels")[0]["n"] == 2 * first.rows["kernels"]
    fts = _rows(db, "SELECT count(*) AS n FROM kernels_fts WHERE kernels_fts MATCH 'AllReduce'")[0]["n"]
    assert fts == 2 * 48
    history = _rows(db, "SELECT t.run_id, d.comm_exposed_ns FROM devices d JOIN traces t ON t.id = d.trace_id "
                        "ORDER BY t.run_id, d.rank")
    assert [h["comm_exposed_ns"] for h in history[:2]] == [h["comm_exposed_ns"] for h in history[2:]]
    ta.export([KINETO_DIR], db)  # without append: a new database
    assert _rows(db, "SELECT count(*) AS n FROM runs")[0]["n"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.db"]  # no temporary file left


def test_export_of_an_nsys_file_and_the_cli_line(tmp_path, capsys):
    db = tmp_path / "nsys.db"
    assert main(["export", str(NSYS_FILE), "-o", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{db}: run 1 — 1 traces, 2 devices,")
    assert _rows(db, "SELECT format FROM traces")[0]["format"] == "nsys-sqlite"
    assert _rows(db, "SELECT count(DISTINCT rank) AS n FROM kernels")[0]["n"] == 2


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


def test_refuses_to_overwrite_an_input_trace(tmp_path, capsys):
    trace = tmp_path / "run.sqlite"
    shutil.copy(NSYS_FILE, trace)
    before = trace.read_bytes()
    assert main(["export", str(trace), "-o", str(trace)]) == 2
    assert "is one of the input traces" in _one_error_line(capsys)
    assert trace.read_bytes() == before
    ranks = tmp_path / "ranks"
    shutil.copytree(KINETO_DIR, ranks)
    assert main(["export", str(ranks), "-o", str(ranks / "rank0.json.gz"), "--append"]) == 2
    assert "rank0.json.gz" in _one_error_line(capsys)


def test_bad_input_leaves_nothing_written(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = tmp_path / "x.db"
    assert main(["export", str(bad), "-o", str(out)]) == 2
    assert "bad.json" in _one_error_line(capsys)
    assert list(tmp_path.iterdir()) == [bad]
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    assert main(["export", str(KINETO_DIR), "-o", str(other), "--append"]) == 2
    assert "notes.txt: is not a SQLite database" in _one_error_line(capsys)
    assert other.read_text() == "hello"
    assert main(["export", str(KINETO_DIR), "-o", str(tmp_path / "missing" / "x.db")]) == 2
    assert "does not exist" in _one_error_line(capsys)
    assert main(["export", str(KINETO_DIR), "-o", "-"]) == 2
    assert "cannot be written to stdout" in _one_error_line(capsys) and not Path("-").exists()
    assert main(["export", str(KINETO_DIR), "-o", str(tmp_path)]) == 2
    assert "is a directory" in _one_error_line(capsys)


def test_a_failed_write_keeps_the_previous_database(tmp_path, monkeypatch):
    ex = importlib.import_module("traceanalyzer.commands.export")

    db = tmp_path / "a.db"
    summary = ta.summary([KINETO_DIR])
    ta.export(summary, db)
    before = db.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ex, "_insert_findings", boom)
    with pytest.raises(RuntimeError):
        ta.export(summary, db)
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["a.db"]
    with pytest.raises(RuntimeError):
        ta.export(summary, db, append=True)  # the copy is dropped
    assert _rows(db, "SELECT count(*) AS n FROM runs")[0]["n"] == 1
    assert _rows(db, "SELECT count(*) AS n FROM kernels")[0]["n"] == 2 * 684


def test_opens_in_datasette(exported):
    datasette_app = pytest.importorskip("datasette.app")
    import asyncio

    db, _ = exported

    async def fetch() -> tuple[int, dict]:
        ds = datasette_app.Datasette([str(db)])
        response = await ds.client.get(f"/{db.stem}/kernels.json?_search=AllReduce&_shape=objects&_size=5")
        return response.status_code, response.json()

    status, payload = asyncio.run(fetch())
    assert status == 200
    assert payload["rows"] and all("AllReduce" in r["name"] for r in payload["rows"])


def test_loaded_traces_export_and_a_summary_without_activity_is_refused(tmp_path):

    traces = [ta.load(p) for p in sorted(KINETO_DIR.glob("*.json.gz"))]
    result = ta.export(traces, tmp_path / "t.db")
    assert result.rows["kernels"] == 1368 and result.rows["devices"] == 2
    summary = result.summary
    assert summary is not None
    summary.states = {}
    with pytest.raises(ValueError, match="keeps no working state"):
        ta.export(summary, tmp_path / "u.db")
    assert not (tmp_path / "u.db").exists()


def test_a_database_that_cannot_be_written_is_bad_input(tmp_path, capsys, monkeypatch):
    ex = importlib.import_module("traceanalyzer.commands.export")

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(ex, "_populate_fts", full)
    assert main(["export", str(KINETO_DIR), "-o", str(tmp_path / "x.db")]) == 2
    assert "x.db: cannot write the database (database or disk is full)" in _one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_one_analysis_pass(tmp_path, monkeypatch):
    """The export writes the summary's own results: one summary (one reduce), no second analysis of its own."""
    pipeline = importlib.import_module("traceanalyzer.pipeline.summarize")
    calls = []
    original = pipeline.reduce_parts

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(pipeline, "reduce_parts", counting)
    result = ta.export([KINETO_DIR], tmp_path / "one.db")
    assert len(calls) == 1 and result.summary is not None
    assert _rows(tmp_path / "one.db", "SELECT sum(comm_exposed_ns) AS s FROM devices")[0]["s"] == \
        sum(d.comm_exposed_ns for d in result.summary.devices)


def test_window_applies_as_in_summary(tmp_path, capsys):
    db = tmp_path / "w.db"
    assert main(["export", "--window", "0:0.05", str(KINETO_DIR), "-o", str(db)]) == 0
    capsys.readouterr()
    assert main(["summary", "--json", "--window", "0:0.05", str(KINETO_DIR)]) == 0
    devices = json.loads(capsys.readouterr().out)["devices"]
    kernels = [r["n"] for r in _rows(db, "SELECT count(*) AS n FROM kernels GROUP BY rank ORDER BY rank")]
    assert kernels == [d["kernels"] for d in devices] and sum(kernels) < 1368


def test_special_files_are_refused_through_the_shared_writer(tmp_path, capsys):
    assert main(["export", str(KINETO_DIR), "-o", "/dev/null"]) == 2
    assert "cannot write /dev/null: not a regular file" in _one_error_line(capsys)
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "real.db")
    assert main(["export", str(KINETO_DIR), "-o", str(link)]) == 0  # through a symlink: its target written
    capsys.readouterr()
    assert link.is_symlink() and (tmp_path / "real.db").stat().st_size > 0
