"""What a big export's summary keeps narrow or lets go, and that the answers stay the same: id columns int32 where
they fit (int64 where one does not), class columns int16 while the string pool allows, the device activity's
derived columns dropped after its analysis, the API call starts released after the map step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import traceanalyzer as ta
from traceanalyzer.analysis.activity import LAUNCH_COLUMNS, gather
from traceanalyzer.analysis.device import device_key
from traceanalyzer.classify.rules import rule_set
from traceanalyzer.classify.trace_columns import classify_name_ids
from traceanalyzer.model.schema import NARROW_IDS, fits_int16, fits_int32
from traceanalyzer.model.trace import StringPool
from traceanalyzer.pipeline.stages import MAP_ONLY_TABLES
from traceanalyzer.pipeline.summarize import load_for_summary
from traceanalyzer.testing.synth_nsys import write_nsys_export

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"
BIG = 3_000_000_000  # past int32: a CUPTI correlation id or stream id is 32 bits unsigned


def _export(path: Path, stream: int, correlation: int) -> Path:
    kernels = [(1_000 + 10_000 * i, 6_000 + 10_000 * i, 0, stream, "ampere_bf16_gemm" if i % 2 else
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 100, correlation + i) for i in range(40)]
    runtime = [(500 + 10_000 * i, 900 + 10_000 * i, "cudaLaunchKernel_v7000", correlation + i) for i in range(40)]
    runtime += [(5_000 + 10_000 * i, 5_400 + 10_000 * i, "cudaStreamSynchronize_v3020", -1) for i in range(40)]
    return write_nsys_export(path, kernels, runtime=runtime)


def _summary_json(path: Path) -> str:
    out = ta.summary(path).to_json()
    out.pop("traces", None)  # sizes differ between the exports
    return json.dumps(out, sort_keys=True, default=str).replace(path.name, "trace.sqlite")


def test_fits_int16_and_int32() -> None:
    assert fits_int16(np.array([-1, 32_767])) and not fits_int16(np.array([32_768]))
    assert fits_int32(np.array([-1, 2**31 - 1], dtype=np.int64))
    assert not fits_int32(np.array([2**31], dtype=np.int64))
    assert not fits_int32(np.array([-(2**31) - 1], dtype=np.int64))
    assert fits_int32(np.empty(0, dtype=np.int64))
    assert fits_int32(np.array([7], dtype=np.int16))
    assert not fits_int32(np.array([1.0]))


def test_id_columns_are_int32_where_they_fit_and_int64_where_not(tmp_path: Path) -> None:
    small = load_for_summary([_export(tmp_path / "small.sqlite", 7, 1_000)])[0]
    big = load_for_summary([_export(tmp_path / "big.sqlite", BIG, BIG)])[0]
    _export(tmp_path / "wide_correlation.sqlite", 7, BIG)
    for name, table in small.tables.items():
        for key in NARROW_IDS & set(table.columns):
            if table[key].strides != (0,):  # an absent column is a repeated -1 of the declared dtype
                assert table[key].dtype == np.int32, (name, key)
    assert big.kernels["stream"].dtype == np.int64 and big.kernels["correlation"].dtype == np.int64
    assert int(big.kernels["stream"][0]) == BIG
    assert big.kernels["pid"].dtype == np.int32  # 24 bits in an nsys export, whatever else is wide
    for name in ("kernels", "api_calls"):  # ranks and GPU indices: int16
        assert small.tables[name]["rank"].dtype == np.int16
    assert small.kernels["device"].dtype == np.int16
    # the same trace but for the correlation ids' width (int32 here, int64 there): the same summary
    assert _summary_json(tmp_path / "small.sqlite") == _summary_json(tmp_path / "wide_correlation.sqlite")
    assert ta.summary(tmp_path / "big.sqlite").devices[0].comm_streams == [BIG]


def test_a_plain_load_keeps_short_names_and_a_summary_load_leaves_them_out(tmp_path: Path) -> None:
    path = write_nsys_export(tmp_path / "t.sqlite", [(1_000, 2_000, 0, 7, "ampere_bf16_gemm_long_name", 100, 1,
                                                      "gemm_short")])
    assert ta.load(path).kernels["short_name_id"][0] >= 0
    summary_trace = load_for_summary([path])[0]
    assert int(summary_trace.kernels["short_name_id"][0]) == -1


def test_class_columns_int16_while_the_pool_allows() -> None:
    pool = StringPool(["ampere_bf16_gemm", "ncclDevKernel_AllReduce"])
    cols = classify_name_ids(pool, np.array([0, 1, 0], dtype=np.int32), rule_set())
    assert cols["bucket_id"].dtype == np.int16
    assert [pool[int(i)] for i in cols["bucket_id"]] == ["gemm", "communication", "gemm"]
    crowded = StringPool([f"kernel_{i}" for i in range(33_000)])
    cols = classify_name_ids(crowded, np.array([0, 1], dtype=np.int32), rule_set())
    assert cols["bucket_id"].dtype == np.int32


@pytest.mark.skipif(not FIXTURE.exists(), reason="fixture missing")
def test_derived_columns_cached_during_analysis_then_built_per_read() -> None:
    trace = load_for_summary([FIXTURE])[0]
    act = gather(trace, 0, int(trace.kernels["device"][0]))
    first = act.launch_ns
    assert act.launch_ns is first  # cached while the device is analysed
    act.forget(*LAUNCH_COLUMNS)
    again = act.launch_ns
    assert again is not first and np.array_equal(again, first)
    busy = act.busy
    act.forget_derived()
    assert "busy" not in act.__dict__ and "launch_ns" not in act.__dict__
    rebuilt = act.busy
    assert rebuilt is not act.busy  # built per read, not kept
    assert np.array_equal(rebuilt[0], busy[0]) and np.array_equal(rebuilt[1], busy[1])


@pytest.mark.skipif(not FIXTURE.exists(), reason="fixture missing")
def test_api_starts_released_after_the_map_step_with_the_same_answer() -> None:
    from traceanalyzer.analysis.summary import SummaryOptions
    from traceanalyzer.pipeline.summarize import _summarize

    loaded = load_for_summary([FIXTURE])
    assert len(loaded[0].api_starts)
    kept = json.dumps(ta.summary(loaded).to_json(), sort_keys=True, default=str)  # the user's traces: untouched
    assert len(loaded[0].api_starts)
    owned = load_for_summary([FIXTURE])
    released = _summarize(owned, SummaryOptions(), {}, own=True).summary
    for name in MAP_ONLY_TABLES:
        assert len(owned[0].tables[name]) == 0
    assert owned[0].call_starts_released == "all"
    assert json.dumps(released.to_json(), sort_keys=True, default=str) == kept
    assert all(released.states[device_key(d)].host_events is not None for d in released.devices)


def test_without_rank_keeps_the_other_ranks_counts() -> None:
    from references import decoded

    from traceanalyzer.model.call_starts import counts_between, start_blocks, without_rank

    rng = np.random.default_rng(7)
    parts, offsets, row = [], [], 0
    for _ in range(3):  # chunks of calls of three processes (ranks 0, 1, 2), as the loader reads them
        pid = rng.integers(0, 3, 500)
        start = rng.integers(0, 5 * 2**31, 500)  # past one block's span: several blocks per process
        block, offset = start_blocks(start, pid, row)
        block["rank"] = block["pid"].astype(np.int32)
        parts.append(block)
        offsets.append(offset)
        row += len(offset)
    blocks = {k: np.concatenate([b[k] for b in parts]) for k in parts[0]}
    flat = np.concatenate(offsets)
    lo = np.sort(rng.integers(0, 5 * 2**31, 50))
    hi = lo + rng.integers(0, 2**31, 50)
    kept, rest = without_rank(blocks, flat, 1)
    assert len(rest) == int(blocks["rows"][blocks["rank"] != 1].sum())
    assert not (kept["rank"] == 1).any()
    for rank in (0, 2):
        assert counts_between(kept, rest, rank, lo, hi).tolist() == counts_between(blocks, flat, rank, lo, hi).tolist()
        assert np.array_equal(np.sort(decoded(kept, rest, rank)), np.sort(decoded(blocks, flat, rank)))
    assert counts_between(kept, rest, 1, lo, hi).sum() == 0
