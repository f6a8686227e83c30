"""Hostile inputs, round 3 (issue 30), family 1: an SQLite file is a program and a shared, live object. Every case
is built in tmp_path from the project's nsys fixture: views over recursive CTEs in place of the tables the loader
reads, columns computed when read, an un-checkpointed write-ahead log, a crashed writer's journal; and for
``export --append``: a looping trigger, a WAL-mode target, a foreign schema, concurrent appends."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traceanalyzer.cli import main
from traceanalyzer.loaders.nsys_sql import connect

REPO = Path(__file__).resolve().parents[1]
NSYS_FILE = REPO / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"
KINETO_FILE = REPO / "fixtures" / "kineto" / "tp2_prefill_serial" / "rank0.json.gz"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n"
pytestmark = pytest.mark.timeout(120)


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, list[str]]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def assert_error(code: int, err: list[str], path: Path, problem: str) -> None:
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith(f"Error: {path}: ") and problem in err[0], err


def _copy(tmp_path: Path, name: str = "export.sqlite") -> Path:
    out = tmp_path / name
    shutil.copyfile(NSYS_FILE, out)
    return out


def _edit(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    try:
        for sql in statements:
            conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


# -- views, virtual tables and computed columns in place of the tables read -------------------------------------------
def _as_view(table: str, select: str) -> list[str]:
    return [f'ALTER TABLE "{table}" RENAME TO "{table}_data"', f'CREATE VIEW "{table}" AS {select}']


STORED_PROGRAMS = {
    # the kernel table as endless rows: the columns of the real table over a recursive CTE
    "kernel_view_endless": (KERNEL, _as_view(KERNEL, f'SELECT k.* FROM "{KERNEL}_data" k, ({ENDLESS}) n')),
    "string_ids_view_endless": ("StringIds", _as_view("StringIds", f"SELECT s.* FROM StringIds_data s, ({ENDLESS})")),
    "kernel_view_plain": (KERNEL, _as_view(KERNEL, f'SELECT * FROM "{KERNEL}_data"')),
}


@pytest.mark.parametrize("case", list(STORED_PROGRAMS))
def test_a_view_in_place_of_a_table_read_is_refused_at_once(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            case: str) -> None:
    table, statements = STORED_PROGRAMS[case]
    path = _copy(tmp_path)
    _edit(path, *statements)
    for command in (["info", "--json"], ["summary", "--json"]):
        started = time.monotonic()
        code, out, err = run_cli(capsys, [*command, str(path)])
        assert_error(code, err, path, f"{table} is a view, not a table: reading it would run a query stored")
        assert out == "" and time.monotonic() - started < 30


def test_a_table_with_columns_computed_when_read_is_refused(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    """A VIRTUAL generated column is an expression run on every read (``zeroblob(1e9)`` per row is a memory bomb)."""
    path = _copy(tmp_path)
    _edit(path, f'ALTER TABLE "{KERNEL}" ADD COLUMN bomb BLOB GENERATED ALWAYS AS (zeroblob(1000000000)) VIRTUAL')
    code, _, err = run_cli(capsys, ["info", "--json", str(path)])
    assert_error(code, err, path, f"{KERNEL} is a table with columns computed when read")


def test_views_of_other_names_are_left_alone(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Extra-P adds views of its own names to real exports (../shared/data/nsys-public/extrap_*): never read, so
    never refused, even an endless one."""
    path = _copy(tmp_path)
    _edit(path, f"CREATE VIEW EXTRAP_ENDLESS AS {ENDLESS}", "CREATE VIRTUAL TABLE notes USING fts5(x)")
    code, out, err = run_cli(capsys, ["info", "--json", str(path)])
    assert code == 0, err
    assert json.loads(out)["counts"]["kernels"] == 2398  # SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL


def test_the_connection_runs_no_stored_program(tmp_path: Path) -> None:
    """The backstop under the schema check: an export's connection refuses, when a statement is prepared, a
    recursive query and any read made through a view of the file."""
    path = _copy(tmp_path)
    _edit(path, f"CREATE VIEW endless AS {ENDLESS}", "CREATE VIEW plain AS SELECT id FROM StringIds")
    conn = connect(path)
    try:
        for sql in (ENDLESS, "SELECT * FROM endless LIMIT 1", "SELECT * FROM plain LIMIT 1"):
            with pytest.raises(sqlite3.DatabaseError, match=r"not authorized|is prohibited"):
                conn.execute(sql)
        assert conn.execute("SELECT COUNT(*) FROM StringIds").fetchone()[0] > 0
    finally:
        conn.close()


def test_the_window_views_of_the_loader_still_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--window`` reads an export through TEMP views the loader makes: the authorizer lets those through."""
    code, out, err = run_cli(capsys, ["summary", "--json", "--window", "7.8:8.3", str(NSYS_FILE)])
    assert code == 0, err
    assert json.loads(out)["devices"]


# -- write-ahead log and rollback journal beside an export -------------------------------------------------------
def _devices(conn: sqlite3.Connection) -> int:
    return int(conn.execute(f"SELECT COUNT(DISTINCT deviceId) FROM {KERNEL}").fetchone()[0])


def test_an_uncheckpointed_wal_is_refused_and_a_checkpointed_one_reads(capsys: pytest.CaptureFixture[str],
                                                                       tmp_path: Path) -> None:
    """The issue's case: the file says 2 devices, its WAL (the committed data) 1. Read alone it would report 2."""
    path = _copy(tmp_path)
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")  # the change stays in the -wal, as under a live writer
    assert _devices(writer) == 2
    writer.execute(f"DELETE FROM {KERNEL} WHERE deviceId = (SELECT MAX(deviceId) FROM {KERNEL})")
    writer.commit()
    assert _devices(writer) == 1 and Path(f"{path}-wal").stat().st_size > 32
    try:
        code, out, err = run_cli(capsys, ["info", "--json", str(path)])
        assert_error(code, err, path, f"has a write-ahead log beside it ({path.name}-wal")
        assert out == ""
    finally:
        writer.close()  # the last connection checkpoints and removes the -wal
    assert not Path(f"{path}-wal").exists()
    code, out, err = run_cli(capsys, ["info", "--json", str(path)])
    assert code == 0, err
    assert len(json.loads(out)["devices"]) == 1  # the committed data


def _crash_copy(tmp_path: Path) -> tuple[Path, int]:
    """An export and the hot journal of a writer that died mid-transaction with half its pages written (copied
    while the transaction was open and its cache spilled), and the kernel count of the committed data."""
    live = _copy(tmp_path, "live.sqlite")
    crashed = tmp_path / "crashed.sqlite"
    writer = sqlite3.connect(live, isolation_level=None)
    committed = int(writer.execute(f"SELECT COUNT(*) FROM {KERNEL}").fetchone()[0])
    writer.execute("PRAGMA cache_size = 1")  # a tiny cache spills changed pages into the file before the commit
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute(f'UPDATE {KERNEL} SET "end" = "end" + 1000000000, start = start + 7')
    writer.execute(f"DELETE FROM {KERNEL} WHERE rowid % 3 = 0")
    shutil.copyfile(live, crashed)
    shutil.copyfile(f"{live}-journal", f"{crashed}-journal")
    writer.execute("ROLLBACK")
    writer.close()
    return crashed, committed


def test_a_hot_journal_is_refused_until_sqlite_rolls_it_back(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    path, committed = _crash_copy(tmp_path)
    code, out, err = run_cli(capsys, ["summary", "--json", str(path)])
    assert_error(code, err, path, f"has a live rollback journal beside it ({path.name}-journal)")
    assert "open the file once with sqlite3" in err[0]
    sqlite3.connect(path).execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # what the hint says: rolled back
    assert not Path(f"{path}-journal").exists() or not any(Path(f"{path}-journal").read_bytes()[:28])
    code, out, err = run_cli(capsys, ["info", "--json", str(path)])
    assert code == 0, err
    assert json.loads(out)["counts"]["kernels"] == committed


def test_a_finished_journal_is_no_obstacle(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """journal_mode=PERSIST leaves a journal with a zeroed header, TRUNCATE an empty one: nothing to roll back."""
    path = _copy(tmp_path)
    Path(f"{path}-journal").write_bytes(b"")
    code, _, err = run_cli(capsys, ["info", "--json", str(path)])
    assert code == 0, err
    Path(f"{path}-journal").write_bytes(bytes(512))
    code, _, err = run_cli(capsys, ["info", "--json", str(path)])
    assert code == 0, err


def test_a_writer_starting_during_the_read_is_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from traceanalyzer.loaders import nsys

    path = _copy(tmp_path)
    real = nsys._load

    def writer_meanwhile(*args: object, **kwargs: object) -> object:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        Path(f"{path}-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + bytes(504))
        return out

    monkeypatch.setattr(nsys, "_load", writer_meanwhile)
    code, _, err = run_cli(capsys, ["info", "--json", str(path)])
    assert_error(code, err, path, "changed while reading: it now has a live rollback journal")


# -- export --append into hostile and shared databases --------------------------------------------------------------
@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with one run of the Kineto fixture (copied by each test that changes it)."""
    import traceanalyzer as ta

    db = tmp_path_factory.mktemp("history") / "analysis.db"
    ta.export([KINETO_FILE], db)
    return db


def _runs(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
    finally:
        conn.close()


def _append(capsys: pytest.CaptureFixture[str], db: Path) -> tuple[int, str, list[str]]:
    return run_cli(capsys, ["export", str(KINETO_FILE), "-o", str(db), "--append"])


def test_append_into_a_database_with_a_looping_trigger_is_refused(capsys: pytest.CaptureFixture[str],
                                                                  history: Path, tmp_path: Path) -> None:
    db = tmp_path / "trigger.db"
    shutil.copyfile(history, db)
    _edit(db, "CREATE TABLE log (x)",
          f"CREATE TRIGGER spin AFTER INSERT ON runs BEGIN INSERT INTO log {ENDLESS}; END",
          "CREATE TRIGGER again AFTER INSERT ON kernels BEGIN INSERT INTO kernels SELECT * FROM kernels; END")
    before = db.read_bytes()
    started = time.monotonic()
    code, out, err = _append(capsys, db)
    assert_error(code, err, db, "has a trigger (spin on runs) that appending would run")
    assert time.monotonic() - started < 30 and db.read_bytes() == before and out == ""


def test_append_into_a_foreign_schema_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The issue's AlterError: tables named like the export's, without its keys."""
    db = tmp_path / "foreign.db"
    _edit(db, "CREATE TABLE runs (name TEXT)", "CREATE TABLE traces (path TEXT)", "CREATE TABLE kernels (k TEXT)")
    code, _, err = _append(capsys, db)
    assert_error(code, err, db, "is not a traceanalyzer export: runs has no id primary key")
    db.unlink()
    _edit(db, "CREATE TABLE runs (id INTEGER PRIMARY KEY)", "CREATE TABLE traces (x)", "CREATE VIEW kernels AS "
          "SELECT 1")
    code, _, err = _append(capsys, db)
    assert_error(code, err, db, "is not a traceanalyzer export: kernels is a view")


def test_append_into_a_wal_database_keeps_every_run(capsys: pytest.CaptureFixture[str], history: Path,
                                                    tmp_path: Path) -> None:
    """The issue's lost run and malformed file: a WAL-mode target whose last run is still in its -wal."""
    import traceanalyzer as ta

    db = tmp_path / "wal.db"
    shutil.copyfile(history, db)
    keeper = sqlite3.connect(db)  # another process's connection, keeping the log un-checkpointed
    keeper.execute("PRAGMA journal_mode = WAL")
    keeper.execute("PRAGMA wal_autocheckpoint = 0")
    keeper.close()
    keeper = sqlite3.connect(db)
    keeper.execute("PRAGMA wal_autocheckpoint = 0")
    keeper.execute("SELECT COUNT(*) FROM runs").fetchone()
    try:
        ta.export([KINETO_FILE], db, append=True)  # run 2, in the -wal
        assert Path(f"{db}-wal").stat().st_size > 32
        code, out, err = _append(capsys, db)  # run 3
        assert code == 0, err
        assert out.strip().startswith(f"{db}: run 3 — ")
    finally:
        keeper.close()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY id")] == [1, 2, 3]
        kernels = [r[0] for r in conn.execute("SELECT COUNT(*) FROM kernels GROUP BY trace_id ORDER BY trace_id")]
        assert len(kernels) == 3 and len(set(kernels)) == 1
    finally:
        conn.close()


def test_a_replaced_database_loses_the_old_wal_with_it(history: Path, tmp_path: Path) -> None:
    """Without --append the file is replaced; the old file's -wal must not be applied to the new one."""
    import traceanalyzer as ta

    db = tmp_path / "replaced.db"
    shutil.copyfile(history, db)
    keeper = sqlite3.connect(db)
    keeper.execute("PRAGMA journal_mode = WAL")
    keeper.execute("PRAGMA wal_autocheckpoint = 0")
    keeper.execute("DELETE FROM kernels")
    keeper.commit()
    try:
        ta.export([KINETO_FILE], db)
    finally:
        keeper.close()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT COUNT(*) FROM kernels").fetchone()[0] > 0
    finally:
        conn.close()


_APPEND_SCRIPT = """
import sys, time
from pathlib import Path
import traceanalyzer.commands.export
export = sys.modules['traceanalyzer.commands.export']
real = export._write
def slow(*args, **kwargs):  # hold the write lock a while, so the appends overlap
    out = real(*args, **kwargs)
    time.sleep(0.5)
    return out
export._write = slow
from traceanalyzer.cli import main
sys.exit(main(["export", sys.argv[1], "-o", sys.argv[2], "--append"]))
"""


@pytest.mark.parametrize("existing", [True, False], ids=["existing", "absent"])
def test_concurrent_appends_lose_no_run(history: Path, tmp_path: Path, existing: bool) -> None:
    """Three appends at once into one database (the issue: a run lost); also when none of them finds the file."""
    db = tmp_path / "shared.db"
    if existing:
        shutil.copyfile(history, db)
    script = tmp_path / "append.py"
    script.write_text(_APPEND_SCRIPT)
    procs = [subprocess.Popen([sys.executable, str(script), str(KINETO_FILE), str(db)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO) for _ in range(3)]
    results = [(*p.communicate(timeout=100), p.returncode) for p in procs]
    results = [(code, out, err) for out, err, code in results]
    assert all(code == 0 for code, _, _ in results), results
    assert _runs(db) == 3 + existing
    assert sorted(int(out.split(": run ")[1].split()[0]) for _, out, _ in results) == \
        list(range(1 + existing, 4 + existing))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["append.py", "shared.db"]  # no temporary file left
