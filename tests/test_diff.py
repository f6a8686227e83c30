"""``diff`` on hand-built traces with hand-computed answers, and its command-line contract."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceanalyzer.analysis.device import device_key
from traceanalyzer.analysis.diff.compare import DIFF_SCHEMA_VERSION, VERDICTS, _round_parts
from traceanalyzer.analysis.diff.kernel_match import match_kernels, role_key
from traceanalyzer.cli import main
from traceanalyzer.commands.diff import diff
from traceanalyzer.testing.synth import make_trace

REPO = Path(__file__).resolve().parents[1]
AB = REPO / "fixtures" / "kineto" / "ab"
AR = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication", "allreduce")


def stepped_trace(step: int, comm: int, gemm: str = "sm90_xmma_gemm_bf16_128x256x64_tn", steps: int = 3):
    """``steps`` GPU-annotated steps of ``step`` ns: gemm [s, s+40), all-reduce [s+40, s+40+comm), a 10 ns gap
    whose end (attention) is launched after the gap began (host-bound), attention 25 ns, then idle until the next
    step, whose gemm was launched long before (other idle)."""
    kernels, api, ranges = [], [], []
    for i in range(steps):
        s = i * step
        gap_end = s + 40 + comm + 10
        kernels += [(s, s + 40, 0, 7, gemm, "gemm", "cublas", 3 * i),
                    (s + 40, s + 40 + comm, 0, 7, *AR, 3 * i + 1),
                    (gap_end, gap_end + 25, 0, 7, "flash_fwd_kernel", "attention", "flash", 3 * i + 2)]
        api += [(s - 50 if i else 0, s - 45 if i else 1, 3 * i), (s + 1, s + 2, 3 * i + 1),
                (gap_end - 5, gap_end - 4, 3 * i + 2)]
        ranges.append((s, s + step, "gpu_user_annotation", f"ProfilerStep#{i}", 0))
    return make_trace(kernels=kernels, api_calls=api, ranges=ranges)


def components(result) -> dict[str, tuple[int, int, int]]:
    return {a["component"]: (a["before_ns"], a["after_ns"], a["delta_ns"]) for a in result.attribution}


def test_attribution_is_exact_and_adds_up() -> None:
    result = diff(stepped_trace(100, 20), stepped_trace(110, 30))
    assert result.step["before_ns"] == 100 and result.step["after_ns"] == 110 and result.step["delta_ns"] == 10
    parts = components(result)
    assert parts["compute:gemm"] == (40, 40, 0) and parts["compute:attention"] == (25, 25, 0)
    assert parts["comm:exposed_transfer"] == (20, 30, 10) and parts["comm:wait"] == (0, 0, 0)
    assert parts["idle:host"] == (10, 10, 0) and parts["idle:other"] == (5, 5, 0)
    assert sum(d for _, _, d in parts.values()) == result.step["delta_ns"]
    assert result.step["verdict"] == "slower" and result.comparable and result.reasons == []
    assert result.step["noise_ns"] == 1  # no step-to-step spread: the 1 % floor of the before step


def test_same_trace_is_same_with_zero_deltas() -> None:
    trace = stepped_trace(100, 20)
    result = diff(trace, trace)
    assert result.step["verdict"] == "same" and result.step["delta_ns"] == 0
    assert all(a["delta_ns"] == 0 for a in result.attribution)
    assert set(result.kernels["match"]) == {"name"} and result.kernel_overlap == 1.0
    assert not result.slower_than(0)


def test_faster_and_the_gate() -> None:
    result = diff(stepped_trace(110, 30), stepped_trace(100, 20))
    assert result.step["verdict"] == "faster" and not result.slower_than(0)
    slower = diff(stepped_trace(100, 20), stepped_trace(110, 30))
    assert slower.slower_than(9.9) and not slower.slower_than(10.0)  # +10 %


def test_renamed_gemm_matches_by_role_and_retile_by_key() -> None:
    assert role_key("sm90_xmma_gemm_bf16_128x256x64_tn") == role_key("sm90_xmma_gemm_bf16_256x128x64_tn")
    result = diff(stepped_trace(100, 20), stepped_trace(100, 20, gemm="nvjet_tst_128x256_64x4_2x1_v_bz_TNT"))
    gemm = result.kernels[result.kernels["bucket"] == "gemm"]
    assert list(gemm["match"]) == ["bucket"] and result.kernel_overlap == 1.0
    retiled = diff(stepped_trace(100, 20), stepped_trace(100, 20, gemm="sm90_xmma_gemm_bf16_256x128x64_tn"))
    assert list(retiled.kernels.loc[retiled.kernels["bucket"] == "gemm", "match"]) == ["role"]


def test_added_and_removed_kernels_largest_change_first() -> None:
    b = pd.DataFrame({"name": ["a", "gone"], "bucket": ["gemm", "other"], "subbucket": ["", ""], "grid": -1,
                      "block": -1, "count": [1.0, 2.0], "ns": [10.0, 30.0]})
    a = pd.DataFrame({"name": ["a", "new"], "bucket": ["gemm", "attention"], "subbucket": ["", ""], "grid": -1,
                      "block": -1, "count": [1.0, 1.0], "ns": [12.0, 5.0]})
    table = match_kernels(b, a)
    assert list(table["match"]) == ["removed", "added", "name"]
    assert list(table["delta_ns"]) == [-30.0, 5.0, 2.0]


def test_different_world_size_and_kernels_are_not_comparable() -> None:
    other = make_trace(kernels=[(i * 100, i * 100 + 90, 0, 7, "totally_different_kernel", "other", "", i)
                                for i in range(3)],
                       ranges=[(i * 100, i * 100 + 100, "gpu_user_annotation", f"ProfilerStep#{i}", 0)
                               for i in range(3)])
    result = diff(stepped_trace(100, 20), replace(other, world_size=8))
    assert result.step["verdict"] == "not comparable" and not result.comparable
    assert any("world size differs: 1 vs 8" in r for r in result.reasons)
    assert any("kernel sets differ" in r for r in result.reasons)
    assert result.step["delta_ns"] == 0  # the numbers are still there


@pytest.mark.parametrize("values", [[1.5, 2.5, 3.0], [0.2, 0.2, 0.2, 0.4], [7.0], [1 / 3] * 6])
def test_rounded_parts_keep_the_total(values: list[float]) -> None:
    parts = _round_parts({str(i): v for i, v in enumerate(values)})
    assert sum(parts.values()) == round(sum(values))
    assert all(abs(parts[str(i)] - v) < 1 for i, v in enumerate(values))


def test_even_step_count_uses_the_two_middle_steps() -> None:
    base = stepped_trace(100, 20, steps=4)
    result = diff(base, base)
    assert result.before.steps == 4 and result.step["before_ns"] == 100
    assert sum(result.before.components.values()) == result.step["before_ns"]


def test_cli_json_contract_html_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = AB / "tp2_decode_eager_c_nocomm", AB / "tp2_decode_eager_c"
    out = tmp_path / "diff.html"
    assert main(["diff", str(before), "--vs", str(after), "--json", "-o", str(out), "--fail-if-slower", "5"]) == 3
    captured = capsys.readouterr()
    payload = json.loads(captured.out)
    assert payload["schema_version"] == DIFF_SCHEMA_VERSION
    step = payload["step"]
    assert set(step) == {"before_ns", "after_ns", "delta_ns", "delta_pct", "noise_ns", "verdict"}
    assert step["verdict"] in VERDICTS and step["verdict"] == "slower"
    assert sum(a["delta_ns"] for a in payload["attribution"]) == step["delta_ns"]
    assert {"component", "before_ns", "after_ns", "delta_ns"} == set(payload["attribution"][0])
    assert "slower than allowed" in captured.err
    page = out.read_text(encoding="utf-8")
    assert "<script" not in page and "default-src 'none'" in page and "attribution waterfall" in page
    # the same pair the other way round is faster: the gate passes
    assert main(["diff", str(after), "--vs", str(before), "--fail-if-slower", "5"]) == 0
    assert "faster" in capsys.readouterr().out


def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{not json", encoding="utf-8")
    out = tmp_path / "diff.html"
    assert main(["diff", str(AB / "tp2_decode_eager_c"), "--vs", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and "broken.json" in err[0]
    assert not out.exists()
    assert main(["diff", str(AB / "tp2_decode_eager_c"), "--vs", str(AB / "tp2_decode_eager_c"),
                 "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["diff", str(AB / "tp2_decode_eager_c")]) == 2  # --vs is required
    assert "--vs" in capsys.readouterr().err


def test_repr_html_is_compact() -> None:
    result = diff(stepped_trace(100, 20), stepped_trace(110, 30))
    text = result._repr_html_()
    assert "slower" in text and "comm:exposed_transfer" in text and len(text) < 5000
    assert np.isclose(result.step["delta_pct"], 10.0)


def test_after_side_takes_every_path_after_vs(capsys: pytest.CaptureFixture[str]) -> None:
    ranks = sorted((AB / "tp2_decode_eager_c").glob("rank*.json.gz"))
    assert main(["diff", *map(str, ranks), "--vs", *map(str, ranks), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["before"]["traces"]) == len(payload["after"]["traces"]) == 2
    assert payload["step"]["verdict"] == "same"


def test_html_escapes_trace_strings() -> None:
    from traceanalyzer.render.diff import render_diff_html

    evil = '<script>alert("x")</script>'
    page = render_diff_html(diff(stepped_trace(100, 20), stepped_trace(110, 30, gemm=evil)))
    assert "<script" not in page and "&lt;script&gt;" in page


def test_findings_delta_statuses() -> None:
    from traceanalyzer.analysis.diff.kernel_match import compare_findings
    from traceanalyzer.analysis.results import Finding

    def f(fid: str, ns: int) -> Finding:
        return Finding(fid, fid, ns, {})

    rows = compare_findings([f("gone", 5), f("moved", 10), f("moved", 3), f("steady", 7)],
                            [f("moved", 30), f("steady", 8), f("fresh", 2)], tolerance_ns=2)
    status = {r["id"]: (r["status"], r["delta_impact_ns"]) for r in rows}
    assert status == {"moved": ("changed", 20), "gone": ("resolved", -5), "fresh": ("new", 2),
                      "steady": ("persists", 1)}
    assert [r["id"] for r in rows] == ["moved", "gone", "fresh", "steady"]


def two_rank_traces(wait: int) -> list:
    """Rank 0 reaches each all-reduce ``wait`` ns before rank 1; both finish it together (transfer 20 ns)."""
    traces = []
    for rank, gemm_end in ((0, 40), (1, 40 + wait)):
        kernels, ranges = [], []
        for i in range(3):
            s = i * 100
            kernels += [(s, s + gemm_end, 0, 7, "gemm_kernel", "gemm", "cublas"),
                        (s + gemm_end, s + 60 + wait, 0, 7, *AR),
                        (s + 60 + wait, s + 95, 0, 7, "flash_fwd_kernel", "attention", "flash")]
            ranges.append((s, s + 100, "gpu_user_annotation", f"ProfilerStep#{i}", 0))
        traces.append(make_trace(kernels=kernels, ranges=ranges, rank=rank, pid=100 + rank,
                                 path=f"rank{rank}.json"))
    return traces


def test_wait_and_transfer_split_across_ranks() -> None:
    result = diff(two_rank_traces(10), two_rank_traces(0))
    parts = components(result)
    # before: rank 0 waits 10 ns of its 30 ns all-reduce, rank 1 none; the side is the mean of the two ranks
    assert parts["comm:wait"] == (5, 0, -5)
    assert parts["comm:exposed_transfer"] == (20, 20, 0)
    assert parts["compute:gemm"] == (45, 40, -5) and parts["compute:attention"] == (25, 35, 10)
    assert sum(d for _, _, d in parts.values()) == result.step["delta_ns"] == 0


def test_ta_diff_stays_a_function_after_the_cli_is_imported() -> None:
    import importlib

    import traceanalyzer as ta

    importlib.import_module("traceanalyzer.cli")
    importlib.import_module("traceanalyzer.commands.diff")
    assert callable(ta.diff) and ta.diff.__module__ == "traceanalyzer.api"


def test_a_run_without_steps_is_not_comparable() -> None:
    flat = make_trace(kernels=[(0, 40, 0, 7, "gemm_kernel", "gemm", "cublas"), (50, 90, 0, 7, *AR)])
    result = diff(flat, flat)
    assert result.before.step_source == "none" and result.step["verdict"] == "not comparable"
    assert any("whole trace counts as one step" in r for r in result.reasons)
    assert result.before.step_confidence == "low" and any("low confidence" in w for w in result.warnings)
    assert diff(stepped_trace(100, 20), stepped_trace(100, 20)).before.step_confidence in ("medium", "high")
    assert sum(a["delta_ns"] for a in result.attribution) == result.step["delta_ns"] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 900), st.integers(1, 120), st.sampled_from(["gemm", "attention", "other",
                                                                                     "communication"]),
                          st.sampled_from([7, 9]), st.integers(-200, 200)), min_size=1, max_size=40),
       st.lists(st.tuples(st.integers(0, 950), st.integers(1, 60), st.sampled_from(["HtoD", "PtoP"])), max_size=5),
       st.integers(1, 4))
def test_step_components_always_add_up(kernels, memops, n_steps) -> None:
    from references import component_columns

    from traceanalyzer.analysis.diff.attribution import step_components
    from traceanalyzer.model.buckets import EXCLUSIVE_PRECEDENCE
    from traceanalyzer.pipeline.summarize import summarize

    rows = [(s, s + d, 0, stream, *(AR if b == "communication" else (f"k_{b}", b, "")), i)
            for i, (s, d, b, stream, _) in enumerate(kernels)]
    api = [(max(s + lag, 0), max(s + lag, 0) + 1, i) for i, (s, _, _, _, lag) in enumerate(kernels)]
    width = 1000 // n_steps
    ranges = [(i * width, (i + 1) * width, "gpu_user_annotation", f"ProfilerStep#{i}", 0) for i in range(n_steps)]
    trace = make_trace(kernels=rows, api_calls=api, ranges=ranges,
                       memops=[(s, s + d, 0, 3, kind) for s, d, kind in memops])
    summary = summarize([trace])
    for dev in summary.devices:
        frame = step_components(dev, summary.states[device_key(dev)].activity, summary.cross_rank,
                                list(EXCLUSIVE_PRECEDENCE))
        parts = frame[component_columns(frame)].to_numpy()
        assert (parts >= 0).all()
        assert (parts.sum(axis=1) == frame["duration_ns"].to_numpy()).all()
        busy = frame[[c for c in component_columns(frame) if not c.startswith("idle:")]].sum(axis=1)
        assert (busy.to_numpy() == dev.per_step["busy_ns"].to_numpy()).all()
        exposed = frame["comm:wait"] + frame["comm:exposed_transfer"]
        assert (exposed.to_numpy() == dev.per_step["comm_exposed_ns"].to_numpy()).all()


def test_kernel_labels_name_one_kernel_or_a_rename() -> None:
    from traceanalyzer.render.diff import kernel_rows

    result = diff(stepped_trace(100, 20), stepped_trace(100, 20, gemm="nvjet_tst_128x256_64x4_2x1_v_bz_TNT"))
    labels = {r["match"]: r["label"] for r in kernel_rows(result)}
    assert labels["bucket"] == "sm90_xmma_gemm_bf16_128x256x64_tn → nvjet_tst_128x256_64x4_2x1_v_bz_TNT"
    assert labels["name"] in {AR[0], "flash_fwd_kernel"}
    gone = diff(stepped_trace(100, 20), make_trace(kernels=[(0, 50, 0, 7, "flash_fwd_kernel", "attention", "flash")],
                                                   ranges=[(0, 100, "gpu_user_annotation", "ProfilerStep#0", 0)]))
    removed = [r["label"] for r in kernel_rows(gone) if r["match"] == "removed"]
    assert removed and all("nan" not in label and "→" not in label for label in removed)


def test_pass_three_needs_a_real_bucket_and_comparable_time() -> None:
    def groups(rows: list[tuple[str, str, float, float]]) -> pd.DataFrame:
        return pd.DataFrame([(n, b, "x", -1, -1, c, t) for n, b, c, t in rows],
                            columns=["name", "bucket", "subbucket", "grid", "block", "count", "ns"])

    table = match_kernels(groups([("add", "other", 1.0, 1e9), ("gemm_a", "gemm", 4.0, 100.0),
                                  ("gemm_b", "gemm", 2.0, 100.0)]),
                          groups([("arange", "other", 1.0, 3e4), ("nvjet_a", "gemm", 4.0, 120.0),
                                  ("nvjet_b", "gemm", 2.0, 10_000.0)]))
    matched = table[table["match"] == "bucket"]
    assert list(zip(matched["before_name"], matched["after_name"], strict=True)) == [("gemm_a", "nvjet_a")]
    assert set(table.loc[table["match"] == "removed", "before_name"]) == {"add", "gemm_b"}


def test_a_ready_summary_is_a_side_and_is_left_intact() -> None:
    from traceanalyzer.pipeline.summarize import summarize

    summary = summarize([stepped_trace(100, 20)])
    result = diff(summary, stepped_trace(110, 30))
    assert result.step["delta_ns"] == 10 and summary.states
    assert result.before.summary.states == {}  # the side keeps no loaded trace


def test_a_side_holding_two_runs_is_not_comparable() -> None:
    one = stepped_trace(100, 20)
    other = replace(stepped_trace(100, 20), path="other_run.json")  # rank 0 again: another run
    result = diff([one, other], one)
    assert len(result.before.summary.runs or []) == 2
    assert any("before side holds 2 different runs" in r for r in result.reasons)
    assert result.step["verdict"] == "not comparable"


def test_different_layer_counts_are_not_comparable() -> None:
    from traceanalyzer.analysis.diff.compare import build_side, compare
    from traceanalyzer.pipeline.summarize import summarize

    side = build_side(summarize([stepped_trace(100, 20)]))
    result = compare(replace(side, layers_per_step=4), replace(side, layers_per_step=8))
    assert result.reasons == ["layers per step differ: 4 vs 8"] and result.step["verdict"] == "not comparable"
    assert compare(replace(side, layers_per_step=4), replace(side, layers_per_step=None)).comparable



def test_html_to_stdout_and_never_over_an_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = AB / "tp2_decode_eager_c", AB / "tp2_decode_eager_c_nocomm"
    assert main(["diff", str(before), "--vs", str(after), "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("<!DOCTYPE html>") and "traceanalyzer diff — faster" in captured.err
    victim = tmp_path / "rank0.json.gz"
    victim.write_bytes((after / "rank0.json.gz").read_bytes())
    assert main(["diff", str(before), "--vs", str(victim), "-o", str(victim)]) == 2
    assert "one of the input traces" in capsys.readouterr().err
    assert victim.read_bytes() == (after / "rank0.json.gz").read_bytes()
    assert main(["diff", str(before), "--vs", str(after), "-o", "-", "--json"]) == 2
