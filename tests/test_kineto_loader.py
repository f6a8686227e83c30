"""Kineto loader: tiny inline traces with hand-computed answers, exact ns, and the real traces in ../shared."""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kineto_samples import document, event, kernel, raw_number, sample_events, us_text, write

import traceanalyzer as ta
from traceanalyzer.cli import main
from traceanalyzer.loaders import kineto, load_one
from traceanalyzer.model.errors import BadInputError

BASE = 1_790_857_026_000_000_000


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> ta.Trace:
    path = tmp_path_factory.mktemp("kineto") / "trace.json"
    return load_one(write(path, document(sample_events())))


def names(trace: ta.Trace, table: str, column: str = "name_id") -> list[str | None]:
    return list(trace.names(trace.tables[table][column]))


def test_kernels_columns_are_exact(sample: ta.Trace) -> None:
    k = sample.kernels
    assert names(sample, "kernels") == ["sm90_xmma_gemm_bf16", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]
    assert k["start_ns"].tolist() == [2_050_123, 2_090_000]
    assert k["end_ns"].tolist() == [2_050_123 + 30_007, 2_130_000]
    assert k["device"].tolist() == [0, 0]
    assert k["stream"].tolist() == [7, 9]
    assert k["correlation"].tolist() == [100, 101]
    assert k["external_id"].tolist() == [33, 34]
    assert k["grid"].tolist() == [8, 1]
    assert k["block"].tolist() == [256, 128]
    assert k["rank"].tolist() == [0, 0]
    assert k["start_ns"].dtype == np.int64


def test_memops_copy_kinds_and_bytes(sample: ta.Trace) -> None:
    m = sample.memops
    assert names(sample, "memops", "kind_id") == ["memcpy", "memcpy", "memcpy", "memset"]
    assert names(sample, "memops", "copy_kind_id") == ["DtoD", "HtoD", "PtoP", None]
    assert m["bytes"].tolist() == [65536, 8, 4096, 4]
    assert m["correlation"].tolist() == [102, 103, 104, 105]


def test_api_calls_strip_version_suffix(sample: ta.Trace) -> None:
    a = sample.api_calls
    assert names(sample, "api_calls") == ["cudaLaunchKernel", "cuLaunchKernel"]
    assert a["correlation"].tolist() == [100, 101]
    assert a["external_id"].tolist() == [33, 34]
    assert a["end_ns"].tolist() == [2_015_001, 2_024_000]


def test_ranges_kinds_and_every_profiler_step(sample: ta.Trace) -> None:
    df = sample.df("ranges")
    steps = df[df["kind"] == "profiler_step"]
    assert steps["name"].tolist() == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert steps["start_ns"].tolist() == [2_000_000, 3_000_000, 4_000_000]
    by_name = df.set_index("name")
    assert by_name.loc["aten::mm", "kind"] == "cpu_op"
    assert by_name.loc["aten::mm", "tid"] == 11
    assert by_name.loc["aten::mm", "device"] == -1
    assert by_name.loc["model.py(12): forward", "kind"] == "python_function"
    gpu = by_name.loc["nccl:all_reduce"]
    assert (gpu["kind"], gpu["device"], gpu["stream"], gpu["tid"]) == ("gpu_user_annotation", 0, 9, -1)
    assert len(df) == 3 + 2 + 1 + 1  # steps, cpu ops, python function, gpu annotation


def test_collectives_from_record_param_comms(sample: ta.Trace) -> None:
    df = sample.df("collectives")
    assert len(df) == 1
    row = df.iloc[0]
    assert row["name"] == "allreduce" and row["dtype"] == "BFloat16"
    assert (row["in_nelems"], row["out_nelems"], row["bytes"]) == (1024, 1024, 2048)
    assert (row["group_size"], row["pg_name"], row["pg_ranks"], row["seq"]) == (2, "0", "[0, 1]", 5)
    assert (row["start_ns"], row["end_ns"], row["external_id"]) == (2_100_000, 2_150_000, 34)


def test_collectives_fall_back_to_nccl_annotations(tmp_path: Path) -> None:
    events = [event("user_annotation", "nccl:all_reduce", 10_000, 5_000, **{"External id": 3}),
              event("cpu_op", "record_param_comms", 10_100, 1_000, **{"External id": 4}),
              kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 20_000, 9_000)]
    trace = load_one(write(tmp_path / "old.json", document(events)))
    df = trace.df("collectives")
    assert df["name"].tolist() == ["all_reduce"]
    assert df["in_nelems"].tolist() == [-1] and df["bytes"].tolist() == [-1]


def test_metadata_counts_and_devices(sample: ta.Trace) -> None:
    assert sample.format == "kineto-json"
    assert sample.base_time_ns == BASE
    assert sample.world_size == 2
    assert sample.schema_version == "1"
    assert "CUPTI 130001" in (sample.tool_version or "") and "NCCL 2.28.9" in (sample.tool_version or "")
    assert sample.raw_counts["kernels"] == 2
    assert sample.raw_counts["memcpy"] == 3
    assert sample.raw_counts["memset"] == 1
    assert sample.raw_counts["nvtx_ranges"] == 4
    assert sample.raw_counts["gpu_metrics_samples"] == 0
    assert sample.raw_counts["flows_ac2g"] == 2
    assert sample.capabilities["timestamp_conversion"] == "float64-exact"
    assert sample.devices == [ta.DeviceInfo(device=0, name="NVIDIA H200", rank=0, pid=0, sm_count=132,
                                            compute_capability="9.0", memory_bytes=150109880320)]
    assert sample.warnings == []


def test_gzip_equals_plain(tmp_path: Path, sample: ta.Trace) -> None:
    gz = load_one(write(tmp_path / "trace.json.gz", document(sample_events())))
    for table in ("kernels", "memops", "ranges", "api_calls", "collectives"):
        for column, values in sample.tables[table].columns.items():
            assert np.array_equal(gz.tables[table][column], values), (table, column)


def test_tables_argument_limits_optional_tables(tmp_path: Path) -> None:
    trace = load_one(write(tmp_path / "t.json", document(sample_events())), tables=frozenset({"memops"}))
    assert len(trace.kernels) == 2 and len(trace.memops) == 4
    assert len(trace.ranges) == 0 and len(trace.api_calls) == 0 and len(trace.collectives) == 0


def test_progress_is_reported(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    for name in ("p.json", "p.json.gz"):
        calls.clear()
        load_one(write(tmp_path / name, document(sample_events())), progress=lambda d, t: calls.append((d, t)))
        assert calls and calls[-1][0] == calls[-1][1]
        assert [d for d, _ in calls] == sorted(d for d, _ in calls)


@pytest.mark.parametrize(("filename", "doc_rank", "process_name", "expected"), [
    ("t.json", 3, None, 3),
    ("job_rank5.json", None, None, 5),
    ("rank-2.Apr_03.pt.trace.json.gz", None, None, 2),
    ("trace_7.json", None, None, 7),
    ("trace.json", None, "rank 4", 4),
])
def test_rank_sources(tmp_path: Path, filename: str, doc_rank: int | None, process_name: str | None,
                      expected: int) -> None:
    events = [kernel("k", 1_000, 1_000)]
    if process_name:
        events.append({"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0,
                       "args": {"name": process_name}})
    trace = load_one(write(tmp_path / filename, document(events, rank=doc_rank)))
    assert trace.ranks == [expected]
    assert trace.devices[0].rank == expected
    assert trace.warnings == []


def test_rank_unknown_warns(tmp_path: Path) -> None:
    """A long number in the name is a job id or a time, not a rank."""
    path = tmp_path / "benchmark_1694039959.json"
    trace = load_one(write(path, document([kernel("k", 1_000, 1_000)], rank=None)))
    assert trace.ranks == [-1]
    assert trace.devices[0].rank is None
    assert len(trace.warnings) == 1 and "rank unknown" in trace.warnings[0]


def test_trace_without_kernels_loads(tmp_path: Path) -> None:
    trace = load_one(write(tmp_path / "cpu.json", document([event("cpu_op", "aten::add", 0, 10)])))
    assert len(trace.kernels) == 0 and trace.raw_counts["kernels"] == 0
    assert len(trace.ranges) == 1 and trace.devices == []


def test_text_ids_are_parsed(tmp_path: Path) -> None:
    """ROCm traces write ``"stream": "0x0"`` on runtime events; pids can be text ("Spans")."""
    events = [event("cuda_runtime", "hipLaunchKernel", 0, 10, stream="0x1f", correlation=5),
              event("kernel", "k", 20, 10, pid=2, tid=0, device=2, stream=0, correlation=5)]
    trace = load_one(write(tmp_path / "amd_rank0.json", document(events)))
    assert trace.api_calls["correlation"].tolist() == [5]
    assert trace.kernels["device"].tolist() == [2]


# -- timestamps: float path and exact decimal path ------------------------------------------------------------


def test_float_path_keeps_every_ns(tmp_path: Path) -> None:
    """5187961529941.170 µs (a real torch 2.11 ts) and values near 2**43 µs come back to the ns."""
    starts = [5_187_961_529_941_170, 5_187_961_529_941_171, 8_796_093_022_207_999, 1, 999]
    events = [kernel(f"k{i}", ns, 27_428_585) for i, ns in enumerate(starts)]
    trace = load_one(write(tmp_path / "f.json", document(events)))
    assert sorted(trace.kernels["start_ns"].tolist()) == sorted(starts)
    assert set((trace.kernels["end_ns"] - trace.kernels["start_ns"]).tolist()) == {27_428_585}
    assert trace.capabilities["timestamp_conversion"] == "float64-exact"


def test_decimal_path_for_absolute_epoch_us(tmp_path: Path) -> None:
    """Absolute epoch µs with ns decimals (HTA's ns_resolution_trace) exceed float64: decoded exactly."""
    events = [kernel("a", 0, 0), kernel("b", 0, 0)]
    events[0]["ts"], events[0]["dur"] = raw_number("1712195495519689.047"), raw_number("12.345")
    events[1]["ts"], events[1]["dur"] = raw_number("1712195495519695.812"), raw_number("0.001")
    trace = load_one(write(tmp_path / "abs.json", document(events, base_time_ns=None)))
    assert trace.kernels["start_ns"].tolist() == [1_712_195_495_519_689_047, 1_712_195_495_519_695_812]
    assert trace.kernels["end_ns"].tolist() == [1_712_195_495_519_701_392, 1_712_195_495_519_695_813]
    assert trace.capabilities["timestamp_conversion"] == "decimal-exact"
    assert trace.base_time_ns is None


def test_integer_epoch_us(tmp_path: Path) -> None:
    events = [kernel("a", 0, 0)]
    events[0]["ts"], events[0]["dur"] = 1669783687464181, 45
    trace = load_one(write(tmp_path / "int.json", document(events)))
    assert trace.kernels["start_ns"].tolist() == [1_669_783_687_464_181_000]
    assert trace.kernels["end_ns"].tolist() == [1_669_783_687_464_226_000]
    assert trace.capabilities["timestamp_conversion"] == "float64-exact"


_NS = st.integers(min_value=0, max_value=2**43 * 1000 - 1)
_BIG_NS = st.integers(min_value=2**43 * 1000, max_value=4_000_000_000_000_000_000)
_CATS = st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "gpu_memset", "user_annotation",
                         "gpu_user_annotation", "ac2g"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(_CATS, st.one_of(_NS, _BIG_NS), st.integers(0, 10**9)), max_size=40),
       gz=st.booleans())
def test_random_events_round_trip(tmp_path: Path, rows: list[tuple[str, int, int]], gz: bool) -> None:
    events = []
    for i, (cat, start, dur) in enumerate(rows):
        e = event(cat, f"op{i % 5}", 0, 0, correlation=i, **{"External id": i})
        e["ts"], e["dur"] = raw_number(us_text(start)), raw_number(us_text(dur))
        events.append(e)
    path = write(tmp_path / ("r.json.gz" if gz else "r.json"), document(events))
    trace = kineto.load(path)  # the decoder alone: times days apart would be dropped by load_one's sanity pass
    expected = {cat: sorted((s, s + d) for c, s, d in rows if c == cat) for cat, _, _ in rows}
    tables = {"kernel": "kernels", "cpu_op": "ranges", "cuda_runtime": "api_calls", "gpu_memcpy": "memops"}
    for cat, table in tables.items():
        t = trace.tables[table]
        got = sorted(zip(t["start_ns"].tolist(), t["end_ns"].tolist(), strict=True))
        want = expected.get(cat, [])
        if table == "memops":
            want = sorted(want + expected.get("gpu_memset", []))
        if table == "ranges":
            want = sorted(want + expected.get("user_annotation", []) + expected.get("gpu_user_annotation", []))
        assert got == want, table
    assert trace.raw_counts["kernels"] == len(expected.get("kernel", []))
    assert trace.raw_counts["nvtx_ranges"] == sum(c in ("user_annotation", "gpu_user_annotation") for c, _, _ in rows)
    assert trace.raw_counts["flows_ac2g"] == sum(c == "ac2g" for c, _, _ in rows)


# -- directories of rank files ----------------------------------------------------------------------------------


def test_load_many_directory_of_ranks(tmp_path: Path) -> None:
    for rank in (0, 1):
        write(tmp_path / f"step_rank{rank}.json.gz", document([kernel("k", 1_000, 500)], rank=rank))
    (tmp_path / "step_rank0.truth.json").write_text("{}")  # sidecar: skipped
    traces = ta.load_many([tmp_path], classify=False)
    assert [t.ranks for t in traces] == [[0], [1]]


def test_mixed_format_directory_is_bad_input(tmp_path: Path) -> None:
    write(tmp_path / "a_rank0.json", document([kernel("k", 1_000, 500)]))
    (tmp_path / "b.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(100))
    with pytest.raises(BadInputError, match="mixes trace formats") as err:
        ta.load_many([tmp_path], classify=False)
    assert err.value.exit_code == 2


# -- real traces in ../shared --------------------------------------------------------------------------------

REAL = [f"h200/kineto/{n}_rank{r}.json.gz" for n in ("prefill_serial", "prefill_overlap", "decode_serial",
                                                      "decode_serial_graphs", "nop2p_prefill_serial")
        for r in (0, 1)] + [f"hta/tests/data/{p}" for p in (
            "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
            "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
            "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
            "critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
            "df_index_resolver/df_index_resolver.json.gz",
            "nccl_parser_config/nccl_data.json.gz",
            "negative_queue_length_values_check/rank0.json.gz",
            "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
            "trace_diff/control/control.json.gz",
            "trace_diff/test/test.json.gz",
            "trace_filter/sampled_rank-0.json.gz",
            "trace_filter/sampled_rank-1.json.gz")]


def _decimal_events(path: Path) -> list[dict]:
    with gzip.open(path, "rb") as fh:
        return json.loads(fh.read(), parse_float=Decimal)["traceEvents"]


@pytest.mark.parametrize("rel", REAL)
def test_info_counts_every_kernel(shared_data: Path, rel: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``info --json`` counts match a plain text count of ``"cat": "kernel"`` in the gunzipped file."""
    with gzip.open(shared_data / rel, "rb") as fh:
        text = fh.read()
    assert main(["info", str(shared_data / rel), "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts["kernels"] == len(re.findall(rb'"cat":\s*"kernel"', text))
    assert counts["memcpy"] == len(re.findall(rb'"cat":\s*"gpu_memcpy"', text))
    assert counts["memset"] == len(re.findall(rb'"cat":\s*"gpu_memset"', text))


@pytest.mark.parametrize("rel", ["hta/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
                                 "hta/tests/data/nccl_parser_config/nccl_data.json.gz",
                                 "h200/kineto/prefill_serial_rank0.json.gz",
                                 "hta/tests/data/trace_filter/sampled_rank-0.json.gz"])
def test_real_times_match_decimal_parse(shared_data: Path, rel: str) -> None:
    """Every kernel and CPU-op interval equals an exact Decimal parse of the same file, to the ns."""
    events = _decimal_events(shared_data / rel)
    trace = load_one(shared_data / rel)

    def exact(cat: str) -> list[tuple[int, int]]:
        rows = [(int(Decimal(e["ts"]) * 1000), int((Decimal(e["ts"]) + Decimal(e["dur"])) * 1000))
                for e in events if e.get("cat") == cat and e.get("ph") == "X"]
        return sorted(rows)

    def loaded(table: str, kind: str | None = None) -> list[tuple[int, int]]:
        t = trace.tables[table]
        if kind is not None:
            t = t.take(t["kind_id"] == trace.strings.get(kind))
        return sorted(zip(t["start_ns"].tolist(), t["end_ns"].tolist(), strict=True))

    assert loaded("kernels") == exact("kernel")
    assert loaded("ranges", "cpu_op") == exact("cpu_op")
    assert loaded("api_calls") == sorted(exact("cuda_runtime") + exact("cuda_driver"))


def test_real_h200_prefill(shared_data: Path) -> None:
    trace = load_one(shared_data / "h200/kineto/prefill_serial_rank1.json.gz")
    assert trace.ranks == [1] and trace.world_size == 2
    assert [(d.name, d.sm_count, d.compute_capability) for d in trace.devices] == [("NVIDIA H200", 132, "9.0")]
    steps = trace.ranges.take(trace.ranges["kind_id"] == trace.strings.get("profiler_step"))
    assert len(steps) == 3
    coll = trace.df("collectives")
    assert len(coll) == 48 and set(coll["name"]) == {"allreduce"}
    assert set(coll["bytes"]) == {16_777_216 * 2}  # BFloat16
    kernel_ext = set(trace.kernels["external_id"].tolist())
    assert set(coll["external_id"]) <= kernel_ext  # each collective links to its NCCL kernel


def test_real_base_time_is_utc(shared_data: Path) -> None:
    """baseTimeNanoseconds + ts = UTC epoch: the nop2p run starts minutes around the logged wall clock."""
    trace = load_one(shared_data / "h200/kineto/nop2p_prefill_serial_rank0.json.gz", tables=frozenset())
    logged_s = float((shared_data / "h200/gpu/clock_nop2p_runs.txt").read_text().split()[0])
    assert trace.base_time_ns is not None
    first_utc_s = (int(trace.kernels["start_ns"].min()) + trace.base_time_ns) / 1e9
    assert abs(first_utc_s - logged_s) < 3600
