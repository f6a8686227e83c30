"""nsys SQLite loader: real exports 2021→2026 (when ../shared is present) and tiny synthetic exports."""

from __future__ import annotations

import json
import lzma
import shutil
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, SHARED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceanalyzer.cli import main
from traceanalyzer.loaders import nsys
from traceanalyzer.model.trace import Table
from traceanalyzer.testing.synth_nsys import write_nsys_export

REAL = sorted(p.relative_to(SHARED).as_posix() for pattern in ("nsys-public/*.sqlite", "h200/nsys/*.sqlite")
              for p in SHARED.glob(pattern)) if SHARED.is_dir() else []
SHIPPED = sorted(p.name for p in (FIXTURES / "nsys").glob("*.sqlite"))  # the project's own (redacted) exports
BIG_XZ = "h200/nsys/tp2_decode_eager_gpumetrics.sqlite.xz"


def _has_table(path: Path, table: str) -> bool:
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone() is not None
    finally:
        conn.close()


def _count(path: Path, table: str, where: str = "") -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
            return 0
        return conn.execute(f"SELECT COUNT(*) FROM {table} {where}").fetchone()[0]
    finally:
        conn.close()


def _info_json(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict | None, str]:
    code = main(["info", str(path), "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


# -- real exports ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", REAL)
def test_info_kernel_count_matches_sqlite(shared_data: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_data / name
    kernels = _count(path, "CUPTI_ACTIVITY_KIND_KERNEL")
    code, info, err = _info_json(path, capsys)
    assert code == 0, err
    if not _has_table(path, "CUPTI_ACTIVITY_KIND_KERNEL"):  # tp2_decode_graphs: a real export without a kernel table
        assert info is not None and info["counts"]["kernels"] == 0 and "--cuda-graph-trace=node" in info["hints"][0]
        return
    assert info is not None and info["format"] == "nsys-sqlite"
    assert info["counts"]["kernels"] == kernels
    assert info["counts"]["memcpy"] == _count(path, "CUPTI_ACTIVITY_KIND_MEMCPY")
    assert info["counts"]["nvtx_ranges"] == _count(path, "NVTX_EVENTS", "WHERE eventType IN (59, 60)")


@pytest.mark.parametrize("name", SHIPPED)
def test_info_on_shipped_fixtures(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "nsys" / name
    code, info, err = _info_json(path, capsys)
    assert code == 0, err
    assert info is not None and info["counts"]["kernels"] == _count(path, "CUPTI_ACTIVITY_KIND_KERNEL") > 0
    with closing(sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)) as conn:  # 2 GPUs or 1
        gpus = conn.execute("SELECT COUNT(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert [d["rank"] for d in info["devices"]] == list(range(gpus))


def assert_grouped_by_device(table: Table) -> None:
    """Rows ordered by (rank, device, start): each (rank, device)'s rows consecutive, in start order."""
    key = list(zip(table["rank"].tolist(), table["device"].tolist(), table["start_ns"].tolist(), strict=True))
    assert key == sorted(key)


@pytest.mark.parametrize("name", REAL)
def test_real_export_loads_every_table(shared_data: Path, name: str) -> None:
    path = shared_data / name
    trace = nsys.load(path)
    k = trace.kernels
    assert len(k) == _count(path, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert len(trace.memops) == _count(path, "CUPTI_ACTIVITY_KIND_MEMCPY") + _count(path, "CUPTI_ACTIVITY_KIND_MEMSET")
    assert len(trace.api_calls) == _count(path, "CUPTI_ACTIVITY_KIND_RUNTIME")
    assert len(trace.ranges) == _count(path, "NVTX_EVENTS", "WHERE eventType IN (34, 59, 60)")
    if len(k):
        assert (k["end_ns"] >= k["start_ns"]).all()
        assert_grouped_by_device(k)
        assert (k["name_id"] >= 0).all() and (k["short_name_id"] >= 0).all() and (k["rank"] >= 0).all()
        pairs = {(int(p), int(d)) for p, d in zip(k["pid"], k["device"], strict=True)}
        assert {(d.pid, d.device) for d in trace.devices} == pairs
    assert (trace.api_calls["name_id"] >= 0).all()
    assert not any(trace.names(trace.api_calls["name_id"][:50]).astype(str) == "cudaLaunchKernel_v7000")


def test_real_two_process_export_has_two_ranks_and_nccl_domain(shared_data: Path) -> None:
    trace = nsys.load(shared_data / "h200/nsys/tp2_prefill_serial.sqlite")
    assert [(d.rank, d.device, d.name, d.sm_count) for d in trace.devices] == [
        (0, 0, "NVIDIA H200", 132), (1, 1, "NVIDIA H200", 132)]
    assert trace.world_size == 2 and any("rank inferred from process order" in w for w in trace.warnings)
    r = trace.ranges
    domains = set(trace.names(np.unique(r["domain_id"][r["domain_id"] >= 0])))
    assert {"NCCL", "CCCL"} <= domains
    nccl = r["domain_id"] == trace.strings.get("NCCL")
    assert "ncclAllReduce" in set(trace.names(r["name_id"][nccl]))
    assert set(trace.names(trace.collectives["name_id"])) == {"allreduce"}
    assert trace.base_time_ns is not None and trace.tool_version == "2025.3.2.0"


def test_real_windowed_export_recognises_nccl_domain_by_names(shared_data: Path) -> None:
    # nsys-ai's fixture was cut from a longer capture: NCCL's DomainCreate rows fell outside the window
    trace = nsys.load(shared_data / "nsys-public/nsysai_mfu_2xh100_before_2026.2.1.sqlite")
    nccl = trace.ranges["domain_id"] == trace.strings.get("NCCL")
    assert {"ncclSend", "ncclRecv"} <= set(trace.names(trace.ranges["name_id"][nccl]))
    assert all(d.name is None for d in trace.devices)  # gVisor host: no TARGET_INFO_GPU


def test_real_2021_export_without_meta_table(shared_data: Path) -> None:
    trace = nsys.load(shared_data / "nsys-public/extrap_exgpu_a100_2021era.sqlite")
    assert trace.tool_version is None and trace.capabilities["meta_table"] is None
    assert [(d.name, d.sm_count, d.compute_capability) for d in trace.devices] == [("A100-PCIE-40GB", 108, "8.0")]


@pytest.fixture(scope="module")
def big_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (SHARED / BIG_XZ).is_file():
        pytest.skip("../shared/data is absent")
    out = tmp_path_factory.mktemp("xz") / "tp2_decode_eager_gpumetrics.sqlite"
    with lzma.open(SHARED / BIG_XZ) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return out


def test_big_gpu_metrics_export_info_and_load(big_export: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code, info, err = _info_json(big_export, capsys)
    assert code == 0, err
    assert info is not None and info["counts"]["gpu_metrics_samples"] == _count(big_export, "GPU_METRICS")
    assert info["counts"]["kernels"] == _count(big_export, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert time.monotonic() - started < 10  # info skips the 6.6 M GPU-metric rows
    calls: list[tuple[int, int]] = []
    trace = nsys.load(big_export, progress=lambda done, total: calls.append((done, total)))
    g = trace.gpu_metrics
    assert len(g) == info["counts"]["gpu_metrics_samples"]
    assert set(np.unique(g["device"]).tolist()) == {0, 1}
    assert "SMs Active [Throughput %]" in set(trace.names(np.unique(g["metric_id"])))
    assert len(calls) > 50 and calls[-1][0] == calls[-1][1]
    assert (np.diff([done for done, _ in calls]) > 0).all()


# -- synthetic exports ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("meta_table", "version"), [("META_DATA_EXPORT", "2026.2.1.210"),
                                                     ("EXPORT_META_DATA", "2022.1.1.61"), (None, None)])
def test_meta_table_old_and_new(tmp_path: Path, meta_table: str | None, version: str | None) -> None:
    path = write_nsys_export(tmp_path / "t.sqlite", [(0, 10, 0, 7, "k")], meta_table=meta_table,
                             tool_version=version or "", schema_version="2.9.1")
    trace = nsys.load(path)
    assert trace.capabilities["meta_table"] == meta_table
    assert trace.tool_version == version
    assert trace.schema_version == ("2.9.1" if meta_table else None)


def test_missing_target_info_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_nsys_export(tmp_path / "t.sqlite", [(0, 10, 0, 7, "k")], target_info_gpu=False)
    trace = nsys.load(path)
    assert [(d.device, d.name, d.sm_count, d.rank) for d in trace.devices] == [(0, None, None, 0)]
    assert any("TARGET_INFO_GPU" in w for w in trace.warnings)
    code, info, _ = _info_json(path, capsys)
    assert code == 0 and info is not None and info["devices"] == [{"device": 0, "name": None, "rank": 0}]


def test_latin1_text_is_decoded(tmp_path: Path) -> None:
    path = write_nsys_export(tmp_path / "t.sqlite", [(0, 10, 0, 7, b"Gei\xdf_kernel")],
                             nvtx=[(0, 5, b"Schlu\xdf", 100)])
    trace = nsys.load(path)
    assert trace.names(trace.kernels["name_id"]).tolist() == ["Geiß_kernel"]
    assert trace.names(trace.ranges["name_id"]).tolist() == ["Schluß"]


def test_nvtx_text_textid_domains_per_process(tmp_path: Path) -> None:
    path = write_nsys_export(tmp_path / "t.sqlite", [(0, 10, 0, 7, "k", 100), (0, 10, 1, 7, "k", 101)], nvtx=[
        (100, 200, "layer_0", 100),                          # inline text, default domain
        (110, 120, "ncclAllReduce", 100, "NCCL", True),       # registered string, NCCL = domain 1 in pid 100
        (130, 140, "trt_layer", 101, "TensorRT"),             # TensorRT = domain 1 in pid 101
        (150, 160, "ncclAllGather", 101, "NCCL", True),       # NCCL = domain 2 in pid 101
        (170, None, "mark", 101, None, False, 34),            # a mark: end = start
    ])
    trace = nsys.load(path)
    r = trace.ranges
    got = list(zip(trace.names(r["name_id"]), trace.names(r["domain_id"]), trace.names(r["kind_id"]),
                   r["end_ns"].tolist(), r["rank"].tolist(), strict=True))
    assert got == [("layer_0", None, "nvtx", 200, 0), ("ncclAllReduce", "NCCL", "nvtx", 120, 0),
                   ("trt_layer", "TensorRT", "nvtx", 140, 1), ("ncclAllGather", "NCCL", "nvtx", 160, 1),
                   ("mark", None, "nvtx_mark", 170, 1)]
    assert trace.raw_counts["nvtx_ranges"] == 4
    c = trace.collectives
    assert list(zip(trace.names(c["name_id"]), c["rank"].tolist(), strict=True)) == [("allreduce", 0),
                                                                                      ("allgather", 1)]


def test_unnamed_domain_with_nccl_ranges_is_nccl(tmp_path: Path) -> None:
    path = write_nsys_export(tmp_path / "t.sqlite", [(0, 10, 0, 7, "k")],
                             nvtx=[(1, 2, "ncclSend", 100, "NCCL", True), (3, 4, "other", 100, "Mine")])
    with sqlite3.connect(path) as conn:  # as in a time-windowed export: the DomainCreate rows are gone
        conn.execute("DELETE FROM NVTX_EVENTS WHERE eventType = 75")
    trace = nsys.load(path)
    assert trace.names(trace.ranges["domain_id"]).tolist() == ["NCCL", None]


def test_null_nvtx_end_is_minus_one(tmp_path: Path) -> None:
    path = write_nsys_export(tmp_path / "t.sqlite", [(0, 10, 0, 7, "k")], nvtx=[(5, None, "open", 100)])
    trace = nsys.load(path)
    assert trace.ranges["end_ns"].tolist() == [-1]
    assert any("never closed" in w for w in trace.warnings)


def test_two_processes_are_two_ranks_and_mpi_ranks_win(tmp_path: Path) -> None:
    kernels = [(0, 10, 0, 7, "a", 300), (5, 15, 1, 7, "b", 200), (20, 30, 1, 7, "c", 200)]
    trace = nsys.load(write_nsys_export(tmp_path / "a.sqlite", kernels, memset=[(40, 50, 1, 7, 8, 200)]))
    # stored by (rank, device, start)
    assert trace.kernels["rank"].tolist() == [0, 0, 1] and trace.kernels["pid"].tolist() == [200, 200, 300]
    assert trace.memops["rank"].tolist() == [0]  # sorted pids: 200 → rank 0, 300 → rank 1
    assert [(d.rank, d.pid, d.device) for d in trace.devices] == [(0, 200, 1), (1, 300, 0)]
    assert trace.capabilities["rank_source"] == "process_order" and trace.world_size == 2
    mpi = nsys.load(write_nsys_export(tmp_path / "b.sqlite", kernels, mpi_ranks={200: 1, 300: 0}))
    assert mpi.kernels["rank"].tolist() == [0, 1, 1]
    assert not any("rank inferred" in w for w in mpi.warnings)


def test_graph_trace_only_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_nsys_export(tmp_path / "g.sqlite", kernel_table=False,
                             graph_launches=[(100, 900, 0, 7, 1), (1000, 1800, 0, 7, 1)])
    trace = nsys.load(path)
    assert trace.capabilities["has_kernel_table"] is False and trace.raw_counts["kernels"] == 0
    assert trace.graph_launches["end_ns"].tolist() == [900, 1800]
    assert [(d.device, d.rank) for d in trace.devices] == [(0, 0)]
    assert any("kernels inside 2 graph launches are not itemised" in w for w in trace.warnings)
    code, info, err = _info_json(path, capsys)  # described, not refused: only the analyses need kernels
    assert code == 0, err
    assert info is not None and info["counts"]["kernels"] == 0 and info["graph_launches"] == 2
    assert "2 CUDA graph launches" in info["hints"][0] and "--cuda-graph-trace=node" in info["hints"][0]
    assert info["devices"] == [{"device": 0, "name": "NVIDIA H200", "rank": 0}]


def test_memops_api_calls_and_gpu_metrics(tmp_path: Path) -> None:
    path = write_nsys_export(
        tmp_path / "t.sqlite", [(0, 10, 0, 7, "k")],
        memcpy=[(20, 30, 0, 9, 10, 4096, 100, 0, 1), (40, 50, 0, 7, 1, 64)], memset=[(60, 70, 0, 7, 8)],
        runtime=[(1, 2, "cudaLaunchKernel_v7000", 1000), (3, 4, "cuLaunchKernelEx", 1001)],
        gpu_metrics=[(5, 0, "SMs Active [Throughput %]", 40), (5, 1, "SMs Active [Throughput %]", 7)])
    with sqlite3.connect(path) as conn:  # 2022.x exports have no ENUM tables: the built-in map must do
        conn.execute("DROP TABLE ENUM_CUDA_MEMCPY_OPER")
    trace = nsys.load(path)
    m = trace.memops
    assert trace.names(m["copy_kind_id"]).tolist() == ["PtoP", "HtoD", None]
    assert trace.names(m["name_id"]).tolist() == ["[CUDA memcpy Peer-to-Peer]", "[CUDA memcpy Host-to-Device]",
                                                  "[CUDA memset]"]
    assert m["src_device"].tolist() == [0, -1, -1] and m["dst_device"].tolist() == [1, -1, -1]
    assert m["bytes"].tolist() == [4096, 64, 8]
    assert trace.names(trace.api_calls["name_id"]).tolist() == ["cudaLaunchKernel", "cuLaunchKernelEx"]
    g = trace.gpu_metrics
    assert g["device"].tolist() == [0, 1] and g["value"].tolist() == [40.0, 7.0]
    assert set(trace.names(g["metric_id"])) == {"SMs Active [Throughput %]"}


def test_tables_subset_progress_and_counts(tmp_path: Path) -> None:
    kernels = [(i * 10, i * 10 + 5, 0, 7, f"k{i % 3}") for i in range(200)]
    path = write_nsys_export(tmp_path / "t.sqlite", kernels, nvtx=[(0, 5, "r", 100)], memset=[(1, 2, 0, 7, 4)])
    calls: list[tuple[int, int]] = []
    trace = nsys.load(path, tables=frozenset(), progress=lambda d, t: calls.append((d, t)))
    assert len(trace.kernels) == 200 and len(trace.ranges) == 0 and len(trace.memops) == 0
    assert trace.raw_counts["nvtx_ranges"] == 1 and trace.raw_counts["memset"] == 1
    assert calls[-1] == (200, 200)
    assert len(set(trace.strings.values)) == len(trace.strings)  # each distinct name interned once
    assert sorted(trace.names(np.unique(trace.kernels["name_id"]))) == ["k0", "k1", "k2"]


def test_read_only_directory_and_privacy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = write_nsys_export(folder / "t.sqlite", [(0, 10, 0, 7, "k")], nvtx=[(0, 5, "r", 100)])
    path.chmod(0o444)
    folder.chmod(0o555)
    try:
        trace = nsys.load(path)
        code, info, _ = _info_json(path, capsys)
        assert sorted(p.name for p in folder.iterdir()) == ["t.sqlite"]  # no -journal / -wal / -shm
    finally:
        folder.chmod(0o755)
    assert code == 0 and info is not None
    exposed = json.dumps(info) + repr(trace) + "\n".join(trace.strings.values) + "\n".join(trace.warnings)
    for secret in ("do-not-read", "SECRET_TOKEN", "synthetic-user", "/private/path"):
        assert secret not in exposed


_kernel_rows = st.lists(st.tuples(st.integers(-(2**40), 2**62), st.integers(0, 2**40), st.integers(0, 7),
                                  st.integers(0, 2**40), st.sampled_from(["gemm", "nccl", "élan", "a" * 300]),
                                  st.integers(1, 2**22)), min_size=1, max_size=30)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_kernel_rows)
def test_random_kernels_round_trip_exactly(tmp_path: Path, rows: list[tuple]) -> None:
    kernels = [(s, s + d, dev, stream, name, pid) for s, d, dev, stream, name, pid in rows]
    trace = nsys.load(write_nsys_export(tmp_path / "h.sqlite", kernels))
    k = trace.kernels
    expected = sorted(((s, e, dev, stream, name, pid) for s, e, dev, stream, name, pid in kernels),
                      key=lambda r: r[0])
    got = list(zip(k["start_ns"].tolist(), k["end_ns"].tolist(), k["device"].tolist(), k["stream"].tolist(),
                   trace.names(k["name_id"]).tolist(), k["pid"].tolist(), strict=True))
    assert sorted(got) == sorted(expected)
    assert_grouped_by_device(k)
    assert len(trace.devices) == len({(r[5], r[2]) for r in kernels})


def test_2021_era_shape_without_newer_columns(tmp_path: Path) -> None:
    path = write_nsys_export(tmp_path / "old.sqlite", [(0, 10, 0, 7, "void k<1>(int)")], meta_table=None,
                             nvtx=[(0, 5, "step", 100), (1, 2, "nccl", 100, "NCCL", True)],
                             memcpy=[(20, 30, 0, 7, 2, 8)])
    with sqlite3.connect(path) as conn:  # columns and tables that later versions added are gone
        for table, column in [("CUPTI_ACTIVITY_KIND_KERNEL", "mangledName"), ("CUPTI_ACTIVITY_KIND_KERNEL", "graphId"),
                              ("CUPTI_ACTIVITY_KIND_KERNEL", "greenContextId"), ("NVTX_EVENTS", "binaryData"),
                              ("NVTX_EVENTS", "textId"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "copyCount")]:
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("ALTER TABLE TARGET_INFO_GPU RENAME COLUMN id TO deviceId")
        for table in ("ENUM_NSYS_EVENT_TYPE", "ENUM_CUDA_MEMCPY_OPER", "TARGET_INFO_CUDA_DEVICE",
                      "META_DATA_CAPTURE"):
            conn.execute(f"DROP TABLE {table}")
    trace = nsys.load(path)
    assert trace.capabilities["has_mangled"] is False and trace.capabilities["graph_trace_mode"] is None
    assert trace.names(trace.kernels["name_id"]).tolist() == ["void k<1>(int)"]
    assert trace.names(trace.kernels["short_name_id"]).tolist() == ["k"]
    assert [d.name for d in trace.devices] == ["NVIDIA H200"]
    assert trace.names(trace.ranges["name_id"]).tolist() == ["step", None]  # its text was registered (textId)
    assert trace.names(trace.memops["copy_kind_id"]).tolist() == ["DtoH"]
