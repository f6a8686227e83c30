"""Issue 26 on the SM120 replay (testing/synth_story.py) and its variants: the platform, the communication path,
the known causes firing and staying silent, the slow rank's cause, findings that share time."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

import traceanalyzer as ta
from traceanalyzer.analysis.results import Finding
from traceanalyzer.testing.synth_story import StoryOptions, story_kernels, write_story

VARIANTS = {"story": StoryOptions(), "nvlink_custom": StoryOptions.nvlink_custom(), "fused": StoryOptions.fused(),
            "sm100": StoryOptions.sm100(), "even": StoryOptions(slow_rank=None, host_gap_ns=50_000)}
SMALL = {"layers": 12, "passes": 4}  # the variants need not be 78 layers deep


@pytest.fixture(scope="module")
def summaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ta.Summary]:
    root = tmp_path_factory.mktemp("story")
    out = {"story": ta.summary(write_story(root / "story.sqlite"))}
    for name, opts in VARIANTS.items():
        if name != "story":
            out[name] = ta.summary(write_story(root / f"{name}.sqlite", opts.but(**SMALL)))
    return out


def ids(summary: ta.Summary) -> set[str]:
    return {f.id for f in summary.findings}


def finding(summary: ta.Summary, fid: str) -> Finding:
    return next(f for f in summary.findings if f.id == fid)


def test_replay_holds_the_story() -> None:
    rows = story_kernels(StoryOptions(passes=1))
    rank0 = [r for r in rows if r[2] == 0]
    assert sum("AllReduce" in r[4] for r in rank0) == 156
    attention = {r[2]: r[1] - r[0] for r in rows if "flash_fwd" in r[4]}
    assert attention[5] == 45_000 and attention[0] == 35_000


def test_platform_facts(summaries: dict[str, ta.Summary]) -> None:
    p = summaries["story"].platform
    assert p.gpu_model == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert (p.compute_capability, p.architecture, p.gpu_count, p.world_size) == ("12.0", "sm120", 8, 8)
    assert p.interconnect == "pcie" and any("no NVLink" in e for e in p.interconnect_evidence)
    assert list(p.comm) == ["nccl"] and p.nccl_algorithms() == {"RING_LL": 156 * 6 * 8}
    assert {"FlashInfer", "TensorRT-LLM"} <= {f["name"] for f in p.frameworks}
    assert any(u["what"].startswith("collective message sizes") and "nsys profile -t cuda,nvtx" in u["how_to_capture"]
               for u in p.unknown)
    b200 = summaries["nvlink_custom"].platform
    assert (b200.architecture, b200.interconnect) == ("sm100", "nvlink")
    assert list(b200.comm) == ["custom_allreduce"]
    assert list(summaries["fused"].platform.comm) == ["allreduce_fusion"]


def test_json_carries_platform_and_no_environment(summaries: dict[str, ta.Summary]) -> None:
    doc = summaries["story"].to_json()
    text = json.dumps(doc)
    assert doc["platform"]["interconnect"] == "pcie"
    assert doc["platform"]["communication_paths_missing"] == ["custom_allreduce", "allreduce_fusion",
                                                              "symmetric_memory"]
    assert "SECRET_TOKEN" not in text and "ENVIRONMENT_VARIABLE" not in text  # synth_nsys writes both


CAUSES = {  # variant → causes that must fire; every other cause must stay silent
    "story": {"cause_custom_allreduce_off_pcie", "cause_allreduce_norm_fusion_gated_arch"},
    "even": {"cause_custom_allreduce_off_pcie", "cause_allreduce_norm_fusion_gated_arch"},
    "nvlink_custom": {"cause_allreduce_norm_fusion_available"},
    "fused": set(),
    "sm100": {"cause_custom_allreduce_unused_nvlink", "cause_allreduce_norm_fusion_available"},
}


@pytest.mark.parametrize("variant", list(CAUSES))
def test_each_cause_fires_and_stays_silent(summaries: dict[str, ta.Summary], variant: str) -> None:
    causes = {i for i in ids(summaries[variant]) if i.startswith("cause_")}
    assert causes == CAUSES[variant]


def test_no_fusion_flag_where_it_is_gated(summaries: dict[str, ta.Summary]) -> None:
    gated = finding(summaries["story"], "allreduce_not_fused")
    assert "--enable-flashinfer-allreduce-fusion" not in gated.recommendation
    assert gated.evidence["advice_from_cause"] == "cause_allreduce_norm_fusion_gated_arch"
    cause = finding(summaries["story"], "cause_allreduce_norm_fusion_gated_arch")
    assert "sm120" in cause.title and cause.evidence["alternative"]
    assert all(s.startswith("https://github.com/") for s in cause.evidence["sources"])
    supported = finding(summaries["sm100"], "cause_allreduce_norm_fusion_available")
    assert "--enable-flashinfer-allreduce-fusion" in supported.evidence["settings"]["sglang"]


def test_custom_allreduce_cause_names_the_path(summaries: dict[str, ta.Summary]) -> None:
    f = finding(summaries["story"], "cause_custom_allreduce_off_pcie")
    assert "156 all-reduces per step" in f.title and "RING_LL" in f.title and "PCIe" in f.title
    assert set(f.evidence["explains"]) >= {"comm_serialized_with_compute", "exposed_communication"}


def test_slow_rank_gets_a_cause(summaries: dict[str, ta.Summary]) -> None:
    s = summaries["story"]
    assert s.cross_rank is not None and s.cross_rank.straggler_rank == 5
    f = finding(s, "slow_rank")
    cls = f.evidence["classes"][0]
    assert f.evidence["straggler_rank"] == 5 and cls["class"] == "attention"
    assert (cls["straggler_median_ns"], cls["others_median_ns"]) == (45_000, 35_000)
    assert f.impact_ns_per_step == 78 * 10_000  # +10 µs on each of 78 attention kernels per step
    assert "Rank 5" in f.title and "attention kernels +29%" in f.title and "0.78 ms/step" in f.title
    assert "slow_rank" not in ids(summaries["even"])


def test_shared_time_is_not_added(summaries: dict[str, ta.Summary]) -> None:
    s = summaries["story"]
    combined = s.findings_combined
    assert combined is not None
    timed = [f for f in s.findings if f.impact_ns_per_step is not None]
    assert combined["sum_of_impacts_ns"] == sum(f.impact_ns_per_step or 0 for f in timed)
    exposed = finding(s, "exposed_communication").impact_ns_per_step
    chain = finding(s, "allreduce_not_fused").impact_ns_per_step
    gap = finding(s, "host_gap_between_passes").impact_ns_per_step
    assert combined["at_most_ns_per_step"] == exposed + chain + gap < combined["sum_of_impacts_ns"]
    assert "exposed_communication" in finding(s, "comm_serialized_with_compute").evidence["shares_time_with"]
    assert "shares_time_with" not in finding(s, "allreduce_not_fused").evidence


def test_first_screen(summaries: dict[str, ta.Summary]) -> None:
    from rich.console import Console

    from traceanalyzer.render.terminal import print_summary

    buf = io.StringIO()
    print_summary(summaries["story"], Console(file=buf, width=200, color_system=None), Console(file=io.StringIO()))
    text = buf.getvalue()
    first = text[:text.index("Per device")]
    for needle in ("compute capability 12.0 (sm120)", "PCIe, no NVLink", "nccl (RING_LL 100% by kernel name)",
                   "none of: custom allreduce", "gated to SM90 / SM100", "156 all-reduces per step go through NCCL",
                   "Rank 5 is the slow rank: attention kernels", "Together the findings save at most 19.66 ms/step"):
        assert needle in first, needle
    assert re.search(r"wait per step \(median\): rank 0: 780\.0 µs", text)


def test_html_escapes_platform_strings(tmp_path: Path) -> None:
    path = write_story(tmp_path / "evil.sqlite", StoryOptions(gpu_name="<script>alert(1)</script> GPU", **SMALL))
    out = tmp_path / "r.html"
    ta.report(path, output=out)
    html = out.read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Why (known causes)" in html


def test_host_gap_between_passes(summaries: dict[str, ta.Summary]) -> None:
    f = finding(summaries["story"], "host_gap_between_passes")
    assert f.impact_ns_per_step == 2_500_000 + 2_000  # the gap, and the launch gap before the next pass's first kernel
    assert f.evidence["steps_with_gap"] == 5 and round(f.impact_pct_of_step or 0, 1) == 6.5
    assert "--disable-overlap-schedule" in f.recommendation  # FlashInfer kernels: a serving framework
    assert "host_gap_between_passes" not in ids(summaries["even"])  # 50 µs between passes is not worth a finding


def test_nvlink_from_gpu_metrics(tmp_path: Path) -> None:
    """NVLink traffic in nsys GPU metrics says NVLink even where the GPU model does not (and disagrees with a
    PCIe-only model: then the link is unknown)."""
    from traceanalyzer.testing.synth_nsys import write_nsys_export

    kernels = [(i * 1000, i * 1000 + 500, d, 7, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 100 + d)
               for i in range(20) for d in (0, 1)]
    metrics = [(i * 1000, d, "NVLink RX Bandwidth [Throughput %]", 40) for i in range(20) for d in (0, 1)]
    unknown_model = ta.summary(write_nsys_export(tmp_path / "a.sqlite", kernels, gpu_metrics=metrics,
                                                 gpu_name="NVIDIA Some GPU")).platform
    assert unknown_model.interconnect == "nvlink"
    assert unknown_model.interconnect_evidence == ["nsys GPU metrics recorded NVLink traffic"]
    clash = ta.summary(write_nsys_export(tmp_path / "b.sqlite", kernels, gpu_metrics=metrics,
                                         gpu_name=StoryOptions().gpu_name)).platform
    assert clash.interconnect == "unknown" and "the evidence disagrees" in clash.interconnect_evidence
    none = ta.summary(write_nsys_export(tmp_path / "c.sqlite", kernels, gpu_name="NVIDIA Some GPU")).platform
    assert none.interconnect == "unknown" and any(u["what"].startswith("interconnect") for u in none.unknown)
