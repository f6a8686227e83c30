"""Every finding with a time impact states what it predicts (issue 27): the unprofiled step-time change if its fix
were applied (``predicted_change_ns``, a saving is negative), a range holding it with the reading behind each end
(``range_ns``, ``range_basis``) and a confidence. Checked on every finding the project's traces and the shared
real traces produce, whatever the rule."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import traceanalyzer as ta
from traceanalyzer.analysis.results import Finding
from traceanalyzer.testing.synth_moe import MoeEpOptions, write_moe_ep
from traceanalyzer.testing.synth_story import write_story

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = [ROOT / "fixtures" / p for p in ("kineto/tp2_decode_eager", "kineto/tp2_prefill_serial",
                                            "kineto/tp2_decode_graphs", "nsys/tp2_prefill_serial.sqlite")]
SHARED = ["foreign/hf_qwen1.5-0.5b_h100_fwd.json.gz", "hf/hf_llama_decode.json.gz",
          "h200/kineto/decode_serial_rank0.json.gz", "foreign/dlrm_torchrec_v100_8rank_rank0.json.gz"]


def _findings(paths: list[Path]) -> list[Finding]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ta.summary(paths).findings


def _check(findings: list[Finding]) -> set[str]:
    checked = set()
    for f in findings:
        if f.impact_ns_per_step is None or f.id.startswith("cause_"):
            continue  # no time impact; a known cause explains another finding and carries its prediction
        ev = f.evidence
        assert {"predicted_change_ns", "range_ns", "range_basis", "confidence"} <= set(ev), f.id
        low, high = ev["range_ns"]
        assert 0 <= low <= -ev["predicted_change_ns"] <= high, (f.id, ev["range_ns"], ev["predicted_change_ns"])
        assert set(ev["range_basis"]) == {"point", "low", "high"} and all(ev["range_basis"].values()), f.id
        assert ev["confidence"] in ("high", "medium", "low"), f.id
        checked.add(f.id)
    return checked


def test_every_time_impact_is_a_prediction_with_a_range(tmp_path: Path) -> None:
    story = write_story(tmp_path / "story.sqlite")
    checked = _check(_findings([story]))
    # the expert-parallel MoE replay: its imbalance and exposed dispatch / combine
    checked |= _check(_findings([write_moe_ep(tmp_path / "hot.sqlite", MoeEpOptions(hot_rank=1, hot_factor=2.0))]))
    checked |= _check(_findings([write_moe_ep(tmp_path / "serial.sqlite", MoeEpOptions(overlap=False))]))
    for path in FIXTURES:
        checked |= _check(_findings([path]))
    # the rules these traces exercise: communication, fusion, host, the pass gap, the straggler
    assert {"exposed_communication", "comm_serialized_with_compute", "allreduce_not_fused", "norm_not_fused",
            "host_bound_no_cuda_graphs", "collective_host_cost", "straggler_wait", "moe_expert_imbalance",
            "moe_exposed_dispatch_combine"} <= checked, sorted(checked)


@pytest.mark.parametrize("name", SHARED)
def test_real_traces_findings_are_predictions(shared_data: Path, name: str) -> None:
    path = shared_data / name
    if not path.exists():
        pytest.skip(f"not in ../shared/data: {name}")
    _check(_findings([path]))
