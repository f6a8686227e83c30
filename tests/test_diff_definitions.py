"""``diff``'s fast paths against their plain definitions, and its lean summaries (``SummaryOptions.skip``) against
full ones: the same diff, byte for byte, so the parts a diff skips are provably unused by every diff output."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceanalyzer.analysis.activity import COMMUNICATION, DeviceActivity
from traceanalyzer.analysis.device import device_key
from traceanalyzer.analysis.diff.attribution import _wait_intervals, step_components
from traceanalyzer.analysis.diff.compare import diff_summaries
from traceanalyzer.analysis.diff.kernel_match import _group_rows, collective_table, kernel_groups
from traceanalyzer.analysis.numeric import intervals as iv
from traceanalyzer.analysis.results import CrossRankSummary, DeviceSummary, Summary
from traceanalyzer.analysis.summary import SKIPPABLE, SummaryOptions
from traceanalyzer.classify.normalize import normalize_name
from traceanalyzer.commands.diff import DIFF_SKIPS, diff
from traceanalyzer.model.buckets import EXCLUSIVE_PRECEDENCE
from traceanalyzer.pipeline.summarize import summarize, summary
from traceanalyzer.render.diff import print_diff, render_diff_html
from traceanalyzer.render.terminal import make_console
from traceanalyzer.testing.synth import make_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PAIRS = [([FIX / "kineto/tp2_prefill_serial"], [FIX / "kineto/tp2_prefill_serial"]),
         ([FIX / "nsys/tp2_prefill_serial.sqlite"], [FIX / "kineto/tp2_prefill_serial"]),
         ([FIX / "kineto/ab/tp2_decode_eager_c"], [FIX / "kineto/ab/tp2_decode_eager_c_nocomm"])]
AR = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication", "allreduce")


def _plain_step_components(dev: DeviceSummary, activity: DeviceActivity, cross: CrossRankSummary | None
                           ) -> pd.DataFrame:
    """The attribution's definition, one set operation at a time (attribution.py's module doc)."""
    act, steps = activity, dev.per_step
    ws, we = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    out = pd.DataFrame({"step": steps["step"].to_numpy(np.int64), "duration_ns": we - ws})
    names = act.kernel_bucket.astype(str)
    compute = [b for b in EXCLUSIVE_PRECEDENCE if b != COMMUNICATION]
    claimed = iv.empty()
    for bucket in compute + sorted(set(names[~act.kernel_is_comm].tolist()) - set(compute)):
        sel = (names == bucket) & ~act.kernel_is_comm
        if sel.any():
            own = iv.difference(iv.union(act.kernels["start_ns"][sel], act.kernels["end_ns"][sel]), claimed)
            out["compute:" + bucket] = iv.measure_within(own, ws, we)
            claimed = iv.union(np.r_[claimed[0], own[0]], np.r_[claimed[1], own[1]])
    exposed = iv.difference(act.comm, claimed)
    wait = iv.measure_within(iv.intersect(exposed, _wait_intervals(dev, cross)), ws, we)
    out["comm:wait"] = wait
    out["comm:exposed_transfer"] = iv.measure_within(exposed, ws, we) - wait
    claimed = iv.union(np.r_[claimed[0], act.comm[0]], np.r_[claimed[1], act.comm[1]])
    out["memory:copies"] = iv.measure_within(iv.difference(act.busy, claimed), ws, we)
    gs, ge = iv.gaps(act.busy, min(int(ws.min()), act.span[0]), max(int(we.max()), act.span[1]))
    starts = np.r_[act.kernels["start_ns"], act.memops["start_ns"]]
    launch = np.r_[act.launch_ns, act.memop_launch_ns]
    # a gap is host-bound when the latest-launched work starting at its end was launched after it began
    host = np.array([bool((starts == e).any()) and launch[starts == e].max() >= max(s, 0)
                     for s, e in zip(gs.tolist(), ge.tolist(), strict=True)], dtype=bool)
    host_ns = iv.measure_within((gs[host], ge[host]), ws, we) if len(gs) else np.zeros(len(ws), dtype=np.int64)
    out["idle:host"] = host_ns
    out["idle:other"] = iv.measure_within((gs, ge), ws, we) - host_ns if len(gs) else host_ns
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 900), st.integers(1, 120), st.sampled_from(["gemm", "attention", "other",
                                                                                     "communication", "custom"]),
                          st.sampled_from([7, 9]), st.integers(-200, 200)), min_size=1, max_size=40),
       st.lists(st.tuples(st.integers(0, 950), st.integers(1, 60), st.sampled_from(["HtoD", "PtoP"])), max_size=5),
       st.integers(1, 4))
def test_step_components_match_the_plain_definition(kernels, memops, n_steps) -> None:
    rows = [(s, s + d, 0, stream, *(AR if b == "communication" else (f"k_{b}", b, "")), i)
            for i, (s, d, b, stream, _) in enumerate(kernels)]
    rows.append((kernels[0][0], kernels[0][0], 0, 7, "k_empty", "empty", "", len(rows)))  # no time: a zero column
    api = [(max(s + lag, 0), max(s + lag, 0) + 1, i) for i, (s, _, _, _, lag) in enumerate(kernels)]
    width = 1000 // n_steps
    ranges = [(i * width, (i + 1) * width, "gpu_user_annotation", f"ProfilerStep#{i}", 0) for i in range(n_steps)]
    trace = make_trace(kernels=rows, api_calls=api, ranges=ranges,
                       memops=[(s, s + d, 0, 3, kind) for s, d, kind in memops])
    result = summarize([trace])
    for dev in (d for d in result.devices if len(d.per_step)):
        act = result.states[device_key(dev)].activity
        fast = step_components(dev, act, result.cross_rank, list(EXCLUSIVE_PRECEDENCE))
        pd.testing.assert_frame_equal(fast, _plain_step_components(dev, act, result.cross_rank), check_dtype=False)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 3), st.integers(0, 2), st.integers(-1, 2**40)), max_size=60))
def test_group_rows_numbers_groups_by_first_appearance(rows) -> None:
    columns = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(3)] if rows else \
        [np.empty(0, dtype=np.int64)] * 3
    group, first = _group_rows(columns)
    seen: dict[tuple[int, ...], int] = {}
    expected = [seen.setdefault(r, len(seen)) for r in rows]
    assert group.tolist() == expected
    assert first.tolist() == [rows.index(r) for r in seen]


def _lean_and_full(paths: list[Path]) -> tuple[Summary, Summary]:
    return summary(paths, skip=DIFF_SKIPS), summary(paths)


@pytest.mark.parametrize("paths", [PAIRS[0][0], PAIRS[1][0], PAIRS[2][0]], ids=["kineto", "nsys", "decode"])
def test_kernel_and_collective_tables_match_pandas(paths: list[Path]) -> None:
    lean, _ = _lean_and_full(paths)
    frames, steps = [], 0
    for dev in lean.devices:
        act = lean.states[device_key(dev)].activity
        k, trace = act.kernels, act.trace
        inside = iv.window_of(k["start_ns"], dev.per_step["start_ns"].to_numpy(), dev.per_step["end_ns"].to_numpy())
        sel = inside >= 0
        steps += len(dev.per_step)
        frames.append(pd.DataFrame({
            "name": [normalize_name(str(n)) for n in trace.names(k["name_id"][sel])],
            "bucket": trace.names(k["bucket_id"][sel]).astype(str),
            "subbucket": ["" if s is None else str(s) for s in trace.names(k["subbucket_id"][sel])],
            "grid": k["grid"][sel], "block": k["block"][sel], "dur": (k["end_ns"] - k["start_ns"])[sel]}))
    by = pd.concat(frames).groupby(["name", "bucket", "subbucket", "grid", "block"])["dur"]
    plain = pd.DataFrame({"count": by.size() / steps, "ns": by.sum() / steps}).reset_index()
    fast = kernel_groups(lean.devices, lean.states).sort_values(["name", "bucket", "subbucket", "grid", "block"])
    pd.testing.assert_frame_equal(fast.reset_index(drop=True), plain, check_dtype=False)

    coll = pd.concat([d.collectives[d.collectives["step"] >= 0] for d in lean.devices])
    per = lean.cross_rank.per_collective if lean.cross_rank else None
    table = collective_table(lean.devices, per).set_index("kind")
    kinds = coll.groupby(coll["kind"].astype(str))
    assert np.allclose(table["count"], kinds.size() / steps)
    sized = coll["bytes"].where(coll["bytes"] >= 0)  # -1: unknown, and a kind with an unknown size has no total
    assert np.allclose(table["bytes"], sized.groupby(coll["kind"].astype(str)).sum(min_count=1)
                       .where(kinds["bytes"].min() >= 0) / steps, equal_nan=True)
    assert np.allclose(table["duration_ns"], kinds["duration_ns"].sum() / steps)
    if per is not None and len(per):
        stepped = per[per["step"] >= 0]
        by_kind = stepped.groupby(stepped["kind"].astype(str))
        transfer = (by_kind["transfer_ns"].sum() / stepped["step"].nunique()).reindex(table.index)
        assert np.allclose(table["transfer_ns"], transfer, equal_nan=True)
        assert np.allclose(table["busbw_gbps"], by_kind["busbw_gbps"].median().reindex(table.index), equal_nan=True)


def _within(lean: object, full: object) -> bool:
    """Whether ``lean`` is ``full`` with some dict keys left out, at any depth."""
    if isinstance(lean, dict) and isinstance(full, dict):
        return all(k in full and _within(v, full[k]) for k, v in lean.items())
    return lean == full


def _assert_lean_findings(lean: Summary, full: Summary) -> None:
    """The same findings (ids, titles, impacts, severities, recommendations, order); the lean evidence is the full
    evidence less some figures, and smaller only for the fusion rules and the predictions read off the what-if."""
    def bare(s: Summary) -> list[dict[str, object]]:
        return [{k: v for k, v in f.to_json().items() if k != "evidence"} for f in s.findings]

    assert bare(lean) == bare(full)
    for fl, ff in zip(lean.findings, full.findings, strict=True):
        assert _within(fl.evidence, ff.evidence)
        left_out = set(ff.evidence) - set(fl.evidence)  # the what-if's prediction: lean summaries skip its range
        assert fl.evidence == ff.evidence or fl.id in ("allreduce_not_fused", "norm_not_fused") or \
            left_out == {"predicted_change_ns", "range_ns", "range_basis", "confidence"}


@pytest.mark.parametrize("paths", [PAIRS[0][0], PAIRS[1][0], PAIRS[2][0]], ids=["kineto", "nsys", "decode"])
def test_lean_finding_evidence_keeps_every_finding(paths: list[Path]) -> None:
    lean = summary(paths, skip={"finding_evidence"})
    full = summary(paths)
    assert {"allreduce_not_fused", "norm_not_fused"} <= {f.id for f in full.findings}  # the lean path is taken
    _assert_lean_findings(lean, full)
    fused = next(f for f in lean.findings if f.id == "allreduce_not_fused")
    assert "per_chain_ns" not in fused.evidence and "per_chain_ns" in next(
        f for f in full.findings if f.id == "allreduce_not_fused").evidence


@pytest.mark.parametrize(("before", "after"), PAIRS, ids=["self", "nsys_vs_kineto", "ab_decode_nocomm"])
def test_a_diff_of_lean_summaries_is_the_diff_of_full_ones(before: list[Path], after: list[Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    lean = diff(before, after)  # lean summaries; a run diffed against itself summarized once
    full = diff_summaries(summary(before), summary(after))
    assert lean.to_json() == full.to_json()
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert render_diff_html(lean, when) == render_diff_html(full, when)
    texts = []
    for result in (lean, full):
        print_diff(result, make_console())
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1]
    # the lean summary's findings, what-if estimate and steps are the full summary's
    lean_b, full_b = _lean_and_full(before)
    _assert_lean_findings(lean_b, full_b)
    assert lean_b.what_if.comm_free_step_saving_ns == full_b.what_if.comm_free_step_saving_ns
    assert replace(full_b.what_if.details, range=None) == lean_b.what_if.details
    for dl, df in zip(lean_b.devices, full_b.devices, strict=True):
        pd.testing.assert_frame_equal(dl.per_step, df.per_step)
        assert dl.top_kernels.empty and dl.in_steps == {} and dl.bucket_exclusive_ns == {}
        # the lean per-layer table: the full one less its time columns (layers, steps and windows alike)
        pd.testing.assert_frame_equal(dl.per_layer, df.per_layer[list(dl.per_layer.columns)])
        assert dl.layers_per_step == df.layers_per_step
        if len(df.per_layer):
            assert set(df.per_layer.columns) - set(dl.per_layer.columns) == {"comm_ns", "comm_exposed_ns",
                                                                             "compute_ns"}
        assert not df.top_kernels.empty and df.in_steps and df.bucket_exclusive_ns


def test_skip_names_only_known_parts() -> None:
    assert SummaryOptions(skip=frozenset({"top_kernels"})).skip == {"top_kernels"}
    assert DIFF_SKIPS <= SKIPPABLE
    with pytest.raises(ValueError, match="unknown summary part"):
        SummaryOptions(skip=frozenset({"findings"}))


def test_shared_classes_classify_each_name_once_and_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    from traceanalyzer.classify import engine
    from traceanalyzer.classify.rules import rule_set

    names = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "sm90_xmma_gemm_bf16_128x256x64_tn", "flash_fwd_kernel",
             "sm90_xmma_gemm_bf16_128x256x64_tn", "elementwise_kernel"]
    plain = engine.classify_many(names, rule_set())
    calls: list[str] = []
    original = engine.classify_one
    monkeypatch.setattr(engine, "classify_one", lambda n, r: calls.append(n) or original(n, r))
    with engine.classes_shared():
        first = engine.classify_many(names[:3], rule_set())  # a fresh RuleSet over the same default rules
        second = engine.classify_many(names, rule_set())
    assert first == plain[:3] and second == plain
    assert sorted(calls) == sorted(set(names))  # the names of the first call were not classified again
    calls.clear()
    engine.classify_many(names[:2], rule_set())  # outside the block nothing is shared
    assert calls == names[:2]
