"""The shipped fixtures (real 2×H200 runs of examples/moe_tp.py) load and hold what fixtures/README.md says."""

from __future__ import annotations

import importlib.util
import json
import lzma
import shutil
import sqlite3
import statistics
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KINETO = FIXTURES / "kineto"
NSYS = FIXTURES / "nsys"
TRUTH = FIXTURES / "truth"
MODES = ("prefill_serial", "prefill_overlap", "decode_eager", "decode_graphs")
WORLD = 2
LAYERS = 4
PROFILED_STEPS = 3
LAYER_NAMES = {f"layer_{i}" for i in range(LAYERS)}
REDACT_SCRIPT = FIXTURES.parent / "examples" / "redact_nsys.py"


def _loader(module: str) -> None:
    """Skip when the loader module for a format is not importable yet."""
    try:
        importlib.import_module(f"traceanalyzer.loaders.{module}")
    except ImportError as exc:
        pytest.skip(f"traceanalyzer.loaders.{module} is not importable yet ({exc})")


def _range_names(trace, kinds: set[str]) -> set[str]:
    ranges = trace.ranges
    wanted = np.isin(trace.names(ranges["kind_id"]).astype(str), sorted(kinds))
    return {str(n) for n in trace.names(np.unique(ranges["name_id"][wanted]))}


KINETO_FILES = [(mode, rank) for mode in MODES for rank in range(WORLD)]


NSYS_FILES = ["tp2_prefill_serial.sqlite", "tp2_prefill_overlap.sqlite.xz"]


def _nsys_path(name: str, tmp_path: Path) -> Path:
    """The export itself, or an .xz one unpacked into ``tmp_path``."""
    path = NSYS / name
    if path.suffix != ".xz":
        return path
    out = tmp_path / path.stem
    with lzma.open(path) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def test_every_expected_fixture_file_exists():
    for mode, rank in KINETO_FILES:
        assert (KINETO / f"tp{WORLD}_{mode}" / f"rank{rank}.json.gz").is_file()
    for name in NSYS_FILES:
        assert (NSYS / name).is_file()


def test_fixture_sizes_stay_small():
    for path in KINETO.rglob("*.json.gz"):
        assert path.stat().st_size <= 1_000_000, path
    for path in NSYS.iterdir():
        assert path.stat().st_size <= 2 * 1024 * 1024, path


@pytest.mark.parametrize(("mode", "rank"), KINETO_FILES, ids=[f"{m}-rank{r}" for m, r in KINETO_FILES])
def test_kineto_fixture_loads(mode: str, rank: int):
    _loader("kineto")
    import traceanalyzer as ta

    trace = ta.load(KINETO / f"tp{WORLD}_{mode}" / f"rank{rank}.json.gz", classify=False)
    kernels = trace.kernels
    assert len(kernels) > 0
    assert set(np.unique(kernels["rank"]).tolist()) == {rank}
    assert set(np.unique(kernels["device"]).tolist()) == {rank}  # one GPU per rank, cuda:<local rank>
    assert trace.world_size == WORLD
    steps = _range_names(trace, {"profiler_step"})
    assert len(steps) == PROFILED_STEPS and all(s.startswith("ProfilerStep#") for s in steps)
    annotations = _range_names(trace, {"user_annotation", "gpu_user_annotation"})
    if mode == "decode_graphs":  # annotations are host-side: a replayed graph has none inside
        assert not annotations & LAYER_NAMES
    else:
        assert annotations >= LAYER_NAMES
        assert {"attention", "moe", "allreduce"} <= annotations


@pytest.mark.parametrize("name", NSYS_FILES)
def test_nsys_fixture_loads(name: str, tmp_path: Path):
    _loader("nsys")
    import traceanalyzer as ta

    trace = ta.load(_nsys_path(name, tmp_path), classify=False)
    kernels = trace.kernels
    assert set(np.unique(kernels["device"]).tolist()) == set(range(WORLD))  # both ranks in one file
    assert len(np.unique(kernels["pid"])) == WORLD
    nvtx = _range_names(trace, {"nvtx"})
    assert nvtx >= LAYER_NAMES
    assert {"attention", "moe", "allreduce", "step"} <= nvtx


@pytest.mark.parametrize("name", NSYS_FILES)
def test_nsys_fixture_is_redacted(name: str, tmp_path: Path):
    path = _nsys_path(name, tmp_path)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        env = db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV "
                         "WHERE name IN ('DeviceEnvironment', 'Hostname')").fetchall()
        captured = db.execute("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'").fetchall()
        export = db.execute("SELECT value FROM META_DATA_EXPORT "
                            "WHERE name IN ('EXPORT_USER', 'EXPORT_HOST')").fetchall()
        streams = db.execute("SELECT count(*) FROM ProcessStreams").fetchone()[0]
    finally:
        db.close()
    assert env and captured and export
    assert {v for (v,) in env + captured + export} == {"<redacted>"}
    assert streams == 0


@pytest.mark.parametrize("mode", MODES)
def test_truth_files_pair_with_and_without_comm(mode: str):
    for rank in range(WORLD):
        with_comm = json.loads((TRUTH / f"{mode}_rank{rank}.json").read_text())
        without = json.loads((TRUTH / f"{mode}_nocomm_rank{rank}.json").read_text())
        for truth, comm in ((with_comm, True), (without, False)):
            assert truth["mode"] == mode and truth["rank"] == rank and truth["world"] == WORLD
            assert truth["comm"] is comm and truth["layers"] == LAYERS
            assert truth["graphs"] is (mode == "decode_graphs")
            assert len(truth["step_ms"]) >= 10
            assert truth["step_ms_median"] == pytest.approx(statistics.median(truth["step_ms"]))
            assert truth["device"] == "NVIDIA H200"


def _redact_module():
    spec = importlib.util.spec_from_file_location("redact_nsys", REDACT_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_redact_nsys_blanks_environment_and_streams(tmp_path: Path):
    path = tmp_path / "r.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE ProcessStreams (globalPid INT, filenameId INT, contentId INT);
        CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INT, devStateName TEXT, name TEXT, nameEnum INT, value TEXT);
        CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT);
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
        INSERT INTO StringIds VALUES (1, '/tmp/x/stdout.log'), (2, 'secret output'), (3, 'layer_0');
        INSERT INTO ProcessStreams VALUES (7, 1, 2);
        INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, 'Local', 'DeviceEnvironment', 610, 'HOME=/root'),
            (0, 'Local', 'Hostname', 619, 'box'), (0, 'Local', 'CpuCores', 1, '32');
        INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'TOKEN=abc'),
            ('PROCESS_0:COMMAND', 'torchrun');
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_USER', 'me'), ('EXPORT_PARAM_INPUT_PATH_ABS', '/home/me'),
            ('EXPORT_PRODUCT_VERSION', '2025.3.2.0');
    """)
    db.commit()
    db.close()
    _redact_module().redact(path)
    db = sqlite3.connect(path)
    rows = {
        "strings": dict(db.execute("SELECT id, value FROM StringIds")),
        "env": dict(db.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV")),
        "capture": dict(db.execute("SELECT name, value FROM META_DATA_CAPTURE")),
        "export": dict(db.execute("SELECT name, value FROM META_DATA_EXPORT")),
        "streams": db.execute("SELECT count(*) FROM ProcessStreams").fetchone()[0],
    }
    db.close()
    assert rows["strings"] == {1: "<redacted>", 2: "<redacted>", 3: "layer_0"}
    assert rows["env"] == {"DeviceEnvironment": "<redacted>", "Hostname": "<redacted>", "CpuCores": "32"}
    assert rows["capture"] == {"PROCESS_0:ENVIRONMENT_VARIABLE": "<redacted>", "PROCESS_0:COMMAND": "torchrun"}
    assert rows["export"] == {"EXPORT_USER": "<redacted>", "EXPORT_PARAM_INPUT_PATH_ABS": "<redacted>",
                              "EXPORT_PRODUCT_VERSION": "2025.3.2.0"}
    assert rows["streams"] == 0


def test_notebook_tour_runs_on_the_fixtures(capsys: pytest.CaptureFixture[str]):
    _loader("kineto")
    _loader("nsys")
    import runpy

    runpy.run_path(str(FIXTURES.parent / "examples" / "notebook_tour.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "moe_gemm" in out and "communication" in out
    assert "layer_3" in out and "comm_cost_ms" in out
    assert "[exposed_communication]" in out and "report: prefill_serial.html" in out  # summary, findings, report
    assert "export: analysis.db {'runs': 1, 'traces': 2, 'devices': 2, 'kernels': 1368" in out


def test_shipped_nsys_exports_hold_no_environment_block(tmp_path: Path) -> None:
    """Every nsys export in fixtures/ went through examples/redact_nsys.py: no process environment block
    (``OLDPWD=… PATH=…``, NUL-separated in StringIds) and no environment table values remain."""
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("redact_nsys", root / "examples" / "redact_nsys.py")
    assert spec is not None and spec.loader is not None
    redact = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(redact)
    exports = sorted((root / "fixtures" / "nsys").glob("*.sqlite*"))
    assert exports
    for path in exports:
        if path.suffix == ".xz":
            plain = tmp_path / path.stem
            plain.write_bytes(lzma.decompress(path.read_bytes()))
            path = plain
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            values = [v for (v,) in db.execute("SELECT value FROM StringIds")]
            env = [v for (v,) in db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name IN "
                                            "('DeviceEnvironment', 'Hostname')")]
        finally:
            db.close()
        assert not [v for v in values if redact.looks_like_environment(v)], path.name
        assert all(v == redact.REDACTED for v in env), path.name
    assert redact.looks_like_environment("OLDPWD=/\x00PATH=/usr/bin\x00HOME=/root")
