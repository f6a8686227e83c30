"""Bad nsys inputs become one-line errors with exit code 2, never tracebacks."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from traceanalyzer.cli import main
from traceanalyzer.loaders import nsys
from traceanalyzer.model.errors import CorruptFileError, UnknownFormatError
from traceanalyzer.testing.synth_nsys import write_nsys_export


def _run_info(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["info", str(path), "--json"])
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: "), err
    assert "Traceback" not in err
    return code, lines[0]


def test_sqlite_that_is_not_an_nsys_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER, body TEXT)")
    code, line = _run_info(path, capsys)
    assert code == 2 and "not an nsys export" in line
    with pytest.raises(UnknownFormatError):
        nsys.load(path)


@pytest.mark.parametrize("keep", [0.5, 0.9, 40 / 500_000])
def test_truncated_export(tmp_path: Path, capsys: pytest.CaptureFixture[str], keep: float) -> None:
    full = write_nsys_export(tmp_path / "full.sqlite", [(i * 10, i * 10 + 5, 0, 7, f"k{i % 40}") for i in range(4000)],
                             nvtx=[(i, i + 2, f"range {i}") for i in range(2000)])
    data = full.read_bytes()
    path = tmp_path / "cut.sqlite"
    path.write_bytes(data[:max(20, int(len(data) * keep))])
    code, line = _run_info(path, capsys)
    assert code == 2 and ("corrupt or truncated" in line or "truncated SQLite database" in line)
    with pytest.raises(CorruptFileError):
        nsys.load(path)


def test_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.sqlite"
    path.write_bytes(b"")
    code, line = _run_info(path, capsys)
    assert code == 2 and "empty file" in line


def test_export_without_kernel_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_nsys_export(tmp_path / "nokernels.sqlite", kernel_table=False, nvtx=[(0, 10, "layer_0")],
                             runtime=[(1, 2, "cudaGetDeviceProperties_v12000", 5)])
    trace = nsys.load(path)
    assert trace.capabilities["has_kernel_table"] is False and trace.raw_counts["kernels"] == 0
    assert len(trace.ranges) == 1 and len(trace.api_calls) == 1
    assert main(["info", str(path), "--json"]) == 0  # info describes it: only the analyses need kernels
    info = json.loads(capsys.readouterr().out)
    assert info["counts"]["kernels"] == 0 and info["counts"]["nvtx_ranges"] == 1 and info["graph_launches"] == 0
    assert len(info["hints"]) == 1 and "no kernel table" in info["hints"][0]
    assert "--cuda-graph-trace=node" in info["hints"][0]


def test_info_counts_graph_launches_of_an_export_without_kernel_table(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = write_nsys_export(tmp_path / "graphs.sqlite", kernel_table=False,
                             graph_launches=[(100, 900, 0, 7, 1), (1000, 1800, 0, 7, 1), (2000, 2500, 0, 7, 1)])
    assert main(["info", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "cuda_graph_launches" in out and "its 3 CUDA graph launches were traced at graph level" in out
    assert "Error" not in err


def test_real_export_without_kernel_table(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_data / "h200/nsys/tp2_decode_graphs.sqlite"
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["counts"] == {"kernels": 0, "memcpy": 0, "memset": 0, "nvtx_ranges": 794, "gpu_metrics_samples": 0}
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in info["hints"][0] and "--cuda-graph-trace=node" in info["hints"][0]
