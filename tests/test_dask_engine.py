"""The Dask engine gives the local engine's answer, byte for byte, on a scheduler and workers started with dask's
own command line, and fails like the local engine on bad input (exit 2, one line).

The ranks are the project's own two-rank eager decode fixture replicated to 34 ranks (``benchmarks/gen_ranks.py``),
so the test needs no ../shared data. The local cluster variant is a smaller version for ``ta.summary``.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from traceanalyzer.model.errors import BadInputError, OutputError
from traceanalyzer.pipeline.summarize import summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gen_ranks import replicate_files

REPO = Path(__file__).resolve().parents[1]
EAGER = sorted((REPO / "fixtures" / "kineto" / "tp2_decode_eager").glob("rank*.json.gz"))
BIN = Path(sys.executable).parent
RANKS = 34


def _dask_cli(*args: str) -> list[str]:
    found = BIN / "dask"
    return [str(found) if found.exists() else shutil.which("dask") or "dask", *args]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A scheduler and two single-threaded worker processes started with ``dask scheduler`` / ``dask worker``."""
    tmp = tmp_path_factory.mktemp("dask")
    scheduler_file = tmp / "scheduler.json"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
    procs = [subprocess.Popen(_dask_cli("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                        "--scheduler-file", str(scheduler_file)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scheduler_file.exists(), "dask scheduler did not start"
        address = json.loads(scheduler_file.read_text())["address"]
        procs.append(subprocess.Popen(_dask_cli("worker", address, "--nworkers", "2", "--nthreads", "1",
                                                "--no-dashboard", "--memory-limit", "4GiB"),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                      start_new_session=True))
        from distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def ranks34(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks34")
    replicate_files(out, RANKS, EAGER)
    return out


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "traceanalyzer"), *args], capture_output=True, text=True, timeout=600,
                          env=env)


def test_dask_cli_gives_the_local_json_on_34_ranks(cluster: str, ranks34: Path) -> None:
    local = _cli("summary", "--json", "-j", "2", str(ranks34))
    assert local.returncode == 0, local.stderr
    on_dask = _cli("summary", "--json", "--engine", "dask", "--scheduler", cluster, str(ranks34))
    assert on_dask.returncode == 0, on_dask.stderr
    assert on_dask.stdout == local.stdout
    doc = json.loads(on_dask.stdout)
    assert len(doc["devices"]) == RANKS and doc["cross_rank"]["collectives_matched"] > 0
    assert doc["findings"] and doc["what_if"]["comm_free_step_saving_ns"] is not None


def test_dask_scheduler_from_the_environment(cluster: str, ranks34: Path) -> None:
    files = sorted(ranks34.glob("rank*.json"))[:4]
    env = {**os.environ, "DASK_SCHEDULER_ADDRESS": cluster}
    local = _cli("summary", "--json", *map(str, files), env=env)  # the local engine ignores the variable
    on_dask = _cli("summary", "--json", "--engine", "dask", *map(str, files), env=env)
    assert local.returncode == on_dask.returncode == 0, on_dask.stderr
    assert on_dask.stdout == local.stdout


def test_bad_rank_file_on_dask_exits_2_with_one_line(cluster: str, ranks34: Path, tmp_path: Path) -> None:
    for f in sorted(ranks34.glob("rank*.json"))[:3]:
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "rank00003.json").write_text('{"traceEvents": [{"ph": "X", "na')
    result = _cli("summary", "--json", "--engine", "dask", "--scheduler", cluster, str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank00003.json" in lines[0], result.stderr
    assert result.stdout == ""


def test_unreachable_scheduler_exits_2(ranks34: Path) -> None:
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}  # dask's own setting, honoured
    result = _cli("summary", "--json", "--engine", "dask", "--scheduler", "tcp://127.0.0.1:9", str(ranks34), env=env)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "scheduler" in result.stderr


def test_scheduler_needs_the_dask_engine(ranks34: Path) -> None:
    result = _cli("summary", "--scheduler", "tcp://127.0.0.1:9", str(ranks34))
    assert result.returncode == 2 and "--engine dask" in result.stderr


def test_library_dask_engine_on_a_local_cluster(ranks34: Path) -> None:
    """``ta.summary(paths, engine="dask")`` without a scheduler starts (and stops) a LocalCluster of ``jobs``."""
    files = sorted(ranks34.glob("rank*.json"))[:6]
    local = summary(files).to_json()
    on_dask = summary(files, engine="dask", jobs=2).to_json()
    assert json.dumps(on_dask, sort_keys=True) == json.dumps(local, sort_keys=True)


def test_dask_engine_needs_paths() -> None:
    from traceanalyzer import load

    with pytest.raises(TypeError, match="pass paths"):
        summary([load(EAGER[0])], engine="dask")


def test_errors_cross_processes_as_raised() -> None:
    for error in (BadInputError("/x.json", "truncated", "re-export it"), OutputError("/y.html", "no space left")):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert (back.path, back.problem, back.hint, back.exit_code) == (error.path, error.problem, error.hint,
                                                                        error.exit_code)


def test_colliding_ranks_are_renumbered_as_locally(cluster: str, tmp_path: Path) -> None:
    """Rank files without torch.distributed's rank (all rank 0): the driver renumbers them by file order on the
    workers, as the local engine does, before the analysis."""
    import gzip

    doc = json.loads(gzip.decompress(EAGER[0].read_bytes()))
    doc.pop("distributedInfo", None)
    for i in range(3):
        (tmp_path / f"part{i}.json").write_text(json.dumps(doc))
    local = _cli("summary", "--json", str(tmp_path))
    on_dask = _cli("summary", "--json", "--engine", "dask", "--scheduler", cluster, str(tmp_path))
    assert local.returncode == on_dask.returncode == 0, on_dask.stderr
    assert on_dask.stdout == local.stdout
    assert [d["rank"] for d in json.loads(on_dask.stdout)["devices"]] == [0, 1, 2]
    assert "assigned from file order" in on_dask.stdout


def test_late_evidence_of_cpu_side_collectives(cluster: str) -> None:
    """Collective calls without kernels: the what-if finds them, then the findings ask the workers for those
    devices' calls (the late evidence); the same finding as locally."""
    ab = REPO / "fixtures" / "kineto" / "ab"
    files = [str(ab / run / "rank0.json.gz") for run in ("tp1_decode_hostsync_d", "tp1_decode_hostsync_e")]
    local = _cli("summary", "--json", *files)
    on_dask = _cli("summary", "--json", "--engine", "dask", "--scheduler", cluster, *files)
    assert local.returncode == on_dask.returncode == 0, on_dask.stderr
    assert on_dask.stdout == local.stdout
    assert "collectives_without_kernels" in [f["id"] for f in json.loads(on_dask.stdout)["findings"]]


def test_bad_rank_file_on_a_local_cluster_is_one_line(ranks34: Path, tmp_path: Path) -> None:
    """Without a scheduler the engine's own LocalCluster workers share our stderr: dask's log of the failed task
    must not reach it, only the one error line."""
    shutil.copy(sorted(ranks34.glob("rank*.json"))[0], tmp_path / "rank00000.json")
    (tmp_path / "rank00001.json").write_text('{"traceEvents": [')
    result = _cli("summary", "--json", "--engine", "dask", "-j", "1", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank00001.json" in lines[0], result.stderr


def _rows(db: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table's rows in insertion order, the run's time stamp masked (run metadata)."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        out = {name: conn.execute(f"SELECT * FROM [{name}] ORDER BY rowid").fetchall() for name in names
               if not name.startswith("kernels_fts_")}
    out["runs"] = [(r[0], "T", *r[2:]) for r in out["runs"]]
    return out


@pytest.mark.parametrize("inputs", [["kineto/tp2_decode_graphs"], ["nsys/tp2_prefill_serial.sqlite"]])
def test_a_dask_summary_exports_the_local_database(cluster: str, tmp_path: Path, inputs: list[str]) -> None:
    """A Dask engine's Summary holds results only and exports: its kernel and memop rows (each with its step and
    layer) read from its files again, into the very database the local engine's export writes. Layers by
    collective period (found from the steps) and by NVTX ranges; memops on the nsys file."""
    from traceanalyzer import export

    paths = [str(REPO / "fixtures" / p) for p in inputs]
    local = export(paths, tmp_path / "local.db")
    on_dask = export(summary(paths, engine="dask", scheduler=cluster), tmp_path / "dask.db")
    assert on_dask.rows == local.rows and local.rows["kernels"] > 0 and local.rows["layers"] > 0
    assert _rows(tmp_path / "dask.db") == _rows(tmp_path / "local.db")
