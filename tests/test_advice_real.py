"""Advice is never inapplicable (issue 26): per real trace in ../shared/data, the findings that must appear and those
that must not, the communication path and platform the trace records. Skips cleanly without ../shared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import traceanalyzer as ta

FOREIGN = "foreign"
DLRM = [f"{FOREIGN}/dlrm_torchrec_v100_8rank_rank{r}.json.gz" for r in range(8)]

#: name → (files, findings that must appear, findings that must not, communication paths in use, platform facts)
CASES: dict[str, tuple[list[str], set[str], set[str], set[str], dict[str, Any]]] = {
    "deepseek_deepep": (
        [f"{FOREIGN}/deepseekv3_train_dualpipe_ep64_h800_rank0.json.gz"],
        {"comm_compute_contention", "cause_deepep_not_nccl"},
        {"allreduce_not_fused", "norm_not_fused", "cause_custom_allreduce_unused_nvlink",
         "cause_allreduce_norm_fusion_available"},
        {"deepep"}, {"gpu_model": "NVIDIA H800", "world_size": 64}),
    "vllm_multimem": (
        [f"{FOREIGN}/vllm_gptoss_b200_tp8_rank0.json.gz"],
        {"comm_serialized_with_compute"},
        {"cause_custom_allreduce_unused_nvlink", "cause_custom_allreduce_off_pcie",
         "cause_allreduce_norm_fusion_gated_arch"},
        {"nccl", "symmetric_memory"}, {"architecture": "sm100", "interconnect": "nvlink", "world_size": 8}),
    "dlrm_no_norm": (
        DLRM, {"exposed_communication"},
        {"allreduce_not_fused", "norm_not_fused", "cause_allreduce_norm_fusion_available",
         "cause_allreduce_norm_fusion_gated_arch", "cause_custom_allreduce_unused_nvlink", "cause_cuda_graphs_off"},
        {"nccl"}, {"architecture": "sm70", "world_size": 8}),
    # eager HF RMSNorm: 70 pow, 70 MeanOps reduce and 70 rsqrt kernels in the trace (2 per layer + a final one)
    "hf_qwen_one_gpu": (
        [f"{FOREIGN}/hf_qwen1.5-0.5b_h100_fwd.json.gz"], {"norm_not_fused"},
        {"exposed_communication", "cause_custom_allreduce_unused_nvlink", "cause_allreduce_norm_fusion_available",
         "slow_rank"},
        set(), {"interconnect": "none", "architecture": "sm90"}),
    "h200_prefill_serial": (
        ["h200/kineto/prefill_serial_rank0.json.gz", "h200/kineto/prefill_serial_rank1.json.gz"],
        {"exposed_communication", "comm_serialized_with_compute", "allreduce_not_fused"},
        # plain PyTorch: no serving framework, so no SGLang / vLLM flags; NCCL runs over NVLink here
        {"cause_custom_allreduce_unused_nvlink", "cause_allreduce_norm_fusion_available",
         "cause_allreduce_norm_fusion_gated_arch", "cause_nccl_not_over_nvlink", "low_comm_bandwidth"},
        {"nccl"}, {"gpu_model": "NVIDIA H200", "architecture": "sm90", "interconnect": "nvlink", "world_size": 2}),
    "h200_nop2p": (  # the same prefill with NCCL_P2P_DISABLE=1: all-reduces through host memory
        ["h200/kineto/nop2p_prefill_serial_rank0.json.gz", "h200/kineto/nop2p_prefill_serial_rank1.json.gz"],
        {"low_comm_bandwidth", "cause_nccl_not_over_nvlink"},
        {"cause_custom_allreduce_unused_nvlink", "cause_allreduce_norm_fusion_available"},
        {"nccl"}, {"interconnect": "nvlink", "world_size": 2}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_advice_applies(shared_data: Path, case: str) -> None:
    files, must, must_not, paths, facts = CASES[case]
    missing = [f for f in files if not (shared_data / f).exists()]
    if missing:
        pytest.skip(f"not in ../shared/data: {missing}")
    summary = ta.summary([shared_data / f for f in files])
    found = {f.id for f in summary.findings}
    assert must <= found, sorted(found)
    assert not (must_not & found), sorted(must_not & found)
    p = summary.platform
    assert set(p.comm) == paths
    for key, value in facts.items():
        assert getattr(p, key) == value, key
    for f in summary.findings:
        assert not f.title.count("(void )"), f.title  # the multimem kernel is named, not cut to "void "
        if "nccl" not in p.comm:
            assert "NCCL_" not in f.recommendation, (f.id, f.recommendation)
        if "allreduce_not_fused" not in found:  # no all-reduce fusion advice without a norm after an all-reduce
            assert "allreduce_fusion" not in f.recommendation and "AllReduceFusion" not in f.recommendation, f.id
