"""The platform a trace was recorded on, from what the trace itself records: GPU model and compute capability,
GPU count and world size, the interconnect (NVLink, PCIe or unknown, each with its evidence), the communication
paths in use (:mod:`.comm_path`) and the libraries / frameworks whose kernel families appear.

Two steps, like every analysis of a summary: :func:`trace_platform` per trace (where the trace is: the map step),
:func:`platform_facts` over every trace's part plus the cross-rank result (the reduce). Nothing here reads command
lines, environment variables or process tables: a trace's environment rows are never looked at. What the trace does
not record is listed in ``PlatformFacts.unknown`` with how to capture it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model.communication import NON_NCCL_ALLREDUCE_PATHS
from .comm_path import PathUse, comm_paths, merge_paths

if TYPE_CHECKING:
    from ..model.trace import Trace
    from .results import CrossRankSummary, DeviceSummary

#: Architecture names by compute capability (NVIDIA).
ARCHITECTURES = {"7.0": "Volta", "7.5": "Turing", "8.0": "Ampere", "8.6": "Ampere", "8.7": "Ampere", "8.9": "Ada",
                 "9.0": "Hopper", "10.0": "Blackwell", "10.3": "Blackwell Ultra", "11.0": "Blackwell (Thor)",
                 "12.0": "Blackwell (RTX / workstation)", "12.1": "Blackwell (GB10)"}

#: GPU models by their scale-up link, matched as substrings of the device name in this order (vendor product
#: pages: the RTX PRO 6000 Blackwell Server Edition, L40S, L4 and A10 have no NVLink; SXM / HGX parts have it).
LINK_BY_MODEL: tuple[tuple[str, str], ...] = (
    ("RTX PRO 6000", "pcie"), ("RTX 6000 Ada", "pcie"), ("L40S", "pcie"), ("L40", "pcie"), ("L4", "pcie"),
    ("A10", "pcie"), ("RTX 4090", "pcie"), ("RTX 5090", "pcie"),
    ("GB300", "nvlink"), ("GB200", "nvlink"), ("B300", "nvlink"), ("B200", "nvlink"), ("H200", "nvlink"),
    ("H100 80GB HBM3", "nvlink"), ("H100 SXM", "nvlink"), ("H800", "nvlink"), ("A100-SXM", "nvlink"),
    ("V100-SXM", "nvlink"),
)

#: PCIe Gen5 x16 peak per direction, GB/s: a measured bus bandwidth above it cannot have gone over PCIe.
PCIE_GEN5_GBPS = 64.0

_FAMILIES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("SGLang", "sgl-kernel (sglang::)", re.compile(r"\bsglang::|sgl_kernel|sgl_per_")),
    ("vLLM", "vLLM kernels (vllm::)", re.compile(r"\bvllm::")),
    ("FlashInfer", "FlashInfer kernels (flashinfer::)", re.compile(r"\bflashinfer::|flashinfer_")),
    ("TensorRT-LLM", "TensorRT-LLM kernels (tensorrt_llm::; FlashInfer ships some of them)",
     re.compile(r"\btensorrt_llm::|trtllm")),
    ("DeepEP", "DeepEP kernels (deep_ep::, dpsk::ep::)", re.compile(r"\bdeep_ep::|\bdpsk::ep::")),
    ("DeepGEMM", "DeepGEMM kernels (deep_gemm::)", re.compile(r"\bdeep_gemm::")),
    ("torch.compile", "Inductor-generated Triton kernels (triton_poi_/triton_red_/triton_per_)",
     re.compile(r"^triton_(?:poi|red|per)_")),
    ("FBGEMM / TorchRec", "FBGEMM kernels (fbgemm_gpu)", re.compile(r"fbgemm")),
    ("Megatron / Transformer Engine", "Transformer Engine kernels (transformer_engine::)",
     re.compile(r"transformer_engine")),
)
_RANGE_HINTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("SGLang", re.compile(r"\bsglang[/.]")), ("vLLM", re.compile(r"\bvllm[/.]")),
    ("TensorRT-LLM", re.compile(r"\btensorrt_llm[/.]")), ("Megatron", re.compile(r"\bmegatron[/.]")),
    ("TorchRec", re.compile(r"\btorchrec[/.]")),
)


@dataclass
class TracePlatform:
    """One trace's share of the platform facts (small, travels from a worker to the driver)."""

    path: str
    format: str
    gpus: list[dict[str, Any]]  # rank, device, name, compute_capability, sm_count
    world_size: int | None
    comm: dict[str, PathUse]
    families: dict[str, int]  # family → kernels
    range_hints: dict[str, int]  # framework → range names mentioning its modules
    nvlink_metric_nonzero: bool  # nsys GPU metrics recorded NVLink traffic
    tool_version: str | None = None


def _name_counts(trace: Trace) -> tuple[list[str], np.ndarray]:
    """Distinct kernel names with their counts (one sorted copy of the name-id column, no per-row temporaries)."""
    k = trace.kernels
    if not len(k):
        return [], np.zeros(0, np.int64)
    ids, counts = np.unique(k["name_id"], return_counts=True)
    return [trace.strings[int(i)] if i >= 0 else "" for i in ids.tolist()], counts.astype(np.int64)


def _comm_rows(trace: Trace) -> list[tuple[str, str | None, int, int]]:
    """(name, sub-bucket, count, total ns) of the distinct communication kernels (only their rows are read)."""
    k = trace.kernels
    comm_id = trace.strings.get("communication")
    if not len(k) or "bucket_id" not in k or comm_id < 0:
        return []
    rows = np.flatnonzero(k["bucket_id"] == comm_id)
    if not len(rows):
        return []
    subs = k["subbucket_id"][rows].astype(np.int64) if "subbucket_id" in k else np.full(len(rows), -1, np.int64)
    keys = np.column_stack([k["name_id"][rows].astype(np.int64), subs])
    uniq, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    total = np.bincount(inverse.ravel(), weights=(k["end_ns"][rows] - k["start_ns"][rows]).astype(np.float64),
                        minlength=len(uniq))
    return [(trace.strings[int(n)] if n >= 0 else "", trace.strings[int(sb)] if sb >= 0 else None, int(c), int(t))
            for (n, sb), c, t in zip(uniq.tolist(), counts.tolist(), total.tolist(), strict=True)]


def trace_platform(trace: Trace) -> TracePlatform:
    """The platform evidence in one classified trace: its GPUs, the kernel families, the communication paths."""
    names, counts = _name_counts(trace)
    comm = comm_paths(_comm_rows(trace))
    families: dict[str, int] = {}
    for i, name in enumerate(names):
        for family, _, pattern in _FAMILIES:
            if pattern.search(name):
                families[family] = families.get(family, 0) + int(counts[i])
    hints: dict[str, int] = {}
    r = trace.ranges
    if len(r):
        for i in np.unique(r["name_id"]).tolist():
            if i < 0:
                continue
            text = trace.strings[int(i)]
            for framework, pattern in _RANGE_HINTS:
                if pattern.search(text):
                    hints[framework] = hints.get(framework, 0) + 1
    gpus = [{"rank": d.rank, "device": d.device, "name": d.name, "compute_capability": d.compute_capability,
             "sm_count": d.sm_count} for d in trace.devices]
    return TracePlatform(path=str(trace.path), format=trace.format, gpus=gpus, world_size=trace.world_size,
                         comm=comm, families=families, range_hints=hints,
                         nvlink_metric_nonzero=_nvlink_traffic(trace), tool_version=trace.tool_version)


def _nvlink_traffic(trace: Trace) -> bool:
    m = trace.gpu_metrics
    if not len(m) or "metric_id" not in m:
        return False
    ids = [i for i in np.unique(m["metric_id"]).tolist() if i >= 0 and "nvlink" in trace.strings[int(i)].lower()]
    return bool(ids) and bool((m["value"][np.isin(m["metric_id"], ids)] > 0).any())


@dataclass
class PlatformFacts:
    """The platform, as the traces record it. ``None`` / ``"unknown"`` where they do not say."""

    gpu_model: str | None
    gpu_models: dict[str, int]  # model → devices
    compute_capability: str | None
    architecture: str | None  # "sm120"
    architecture_name: str | None  # "Blackwell (RTX / workstation)"
    gpu_count: int
    world_size: int | None
    interconnect: str  # nvlink | pcie | unknown | none (one GPU)
    interconnect_evidence: list[str]
    comm: dict[str, PathUse]
    frameworks: list[dict[str, Any]]  # {"name", "evidence"}
    message_sizes_known: bool
    bus_bandwidth_gbps: float | None
    tool_versions: list[str] = field(default_factory=list)
    unknown: list[dict[str, str]] = field(default_factory=list)  # {"what", "how_to_capture"}

    @property
    def paths_in_use(self) -> list[str]:
        return [p for p, use in self.comm.items() if use.kernels]

    def nccl_algorithms(self) -> dict[str, int]:
        use = self.comm.get("nccl")
        return dict(use.algorithms) if use else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu_model": self.gpu_model, "gpu_models": self.gpu_models,
            "compute_capability": self.compute_capability, "architecture": self.architecture,
            "architecture_name": self.architecture_name, "gpu_count": self.gpu_count, "world_size": self.world_size,
            "interconnect": self.interconnect, "interconnect_evidence": self.interconnect_evidence,
            "communication_paths": {p: use.to_json() for p, use in self.comm.items()},
            "communication_paths_missing": [p for p in NON_NCCL_ALLREDUCE_PATHS if p not in self.comm],
            "frameworks": self.frameworks, "message_sizes_known": self.message_sizes_known,
            "bus_bandwidth_gbps": self.bus_bandwidth_gbps, "tool_versions": self.tool_versions,
            "unknown": self.unknown,
        }


def architecture_of(cc: str | None) -> str | None:
    """``"12.0"`` → ``"sm120"``."""
    if not cc or not re.fullmatch(r"\d+\.\d+", cc):
        return None
    major, minor = cc.split(".")
    return f"sm{int(major)}{int(minor)}"


def link_of_model(name: str | None) -> str | None:
    """``nvlink`` / ``pcie`` for GPU models whose scale-up link is known by the model alone, else None."""
    if not name:
        return None
    for key, link in LINK_BY_MODEL:
        if key.lower() in name.lower():
            return link
    return None


def _interconnect(model: str | None, parts: list[TracePlatform], comm: dict[str, PathUse],
                  busbw: float | None, multi_gpu: bool) -> tuple[str, list[str]]:
    evidence: list[str] = []
    votes: set[str] = set()
    if any(p.nvlink_metric_nonzero for p in parts):
        votes.add("nvlink")
        evidence.append("nsys GPU metrics recorded NVLink traffic")
    if busbw is not None and busbw > PCIE_GEN5_GBPS:
        votes.add("nvlink")
        evidence.append(f"measured all-reduce bus bandwidth {busbw:.0f} GB/s exceeds PCIe Gen5 x16 "
                        f"({PCIE_GEN5_GBPS:.0f} GB/s)")
    nvls = [a for a in (comm["nccl"].algorithms if "nccl" in comm else {}) if a.startswith("NVLS")]
    if nvls:
        votes.add("nvlink")
        evidence.append(f"NCCL ran the NVLink SHARP algorithm ({', '.join(nvls)}), which needs NVSwitch")
    by_model = link_of_model(model)
    if by_model == "pcie":
        votes.add("pcie")
        evidence.append(f"the GPU model ({model}) has no NVLink")
    elif by_model == "nvlink":
        votes.add("nvlink")
        evidence.append(f"the GPU model ({model}) is an NVLink (SXM) part")
    if not multi_gpu:
        return "none", ["one GPU: no scale-up link in use", *evidence]
    if len(votes) == 1:
        return next(iter(votes)), evidence
    if len(votes) > 1:
        evidence.append("the evidence disagrees")
    return "unknown", evidence


def _frameworks(parts: list[TracePlatform]) -> list[dict[str, Any]]:
    families: dict[str, int] = {}
    hints: dict[str, int] = {}
    for p in parts:
        for k, v in p.families.items():
            families[k] = families.get(k, 0) + v
        for k, v in p.range_hints.items():
            hints[k] = hints.get(k, 0) + v
    out: dict[str, list[str]] = {}
    for family, text, _ in _FAMILIES:
        if family in families:
            out.setdefault(family, []).append(f"{families[family]} kernels: {text}")
    for framework, n in hints.items():
        out.setdefault(framework, []).append(f"{n} range names mention its modules")
    return [{"name": name, "evidence": "; ".join(evidence)} for name, evidence in out.items()]


def platform_facts(parts: list[TracePlatform], cross: CrossRankSummary | None = None,
                   devices: list[DeviceSummary] | None = None) -> PlatformFacts:
    """The platform over every trace of a summary (the reduce of :func:`trace_platform`)."""
    gpus = {(g["rank"], g["device"], p.path if g["rank"] is None else ""): g for p in parts for g in p.gpus}
    models: dict[str, int] = {}
    ccs: dict[str, int] = {}
    for g in gpus.values():
        if g["name"]:
            models[g["name"]] = models.get(g["name"], 0) + 1
        if g["compute_capability"]:
            ccs[g["compute_capability"]] = ccs.get(g["compute_capability"], 0) + 1
    model = max(models, key=lambda m: models[m]) if models else None
    cc = max(ccs, key=lambda c: ccs[c]) if ccs else None
    sizes = {p.world_size for p in parts if p.world_size}
    ranks = {g["rank"] for g in gpus.values() if g["rank"] is not None}
    world = max(sizes) if sizes else (len(ranks) if ranks else None)
    comm = merge_paths(p.comm for p in parts)
    busbw = cross.detail.busbw_gbps_median if cross is not None and cross.detail is not None else None
    sized = any(len(d.collectives) and "bytes" in d.collectives and (d.collectives["bytes"] > 0).any()
                for d in devices or [])
    link, link_evidence = _interconnect(model, parts, comm, busbw, len(gpus) > 1 or (world or 1) > 1)
    unknown = []
    if model is None:
        unknown.append({"what": "GPU model", "how_to_capture": "an nsys export (TARGET_INFO_GPU) or a Kineto trace "
                        "from torch.profiler with CUDA activities (deviceProperties)"})
    if cc is None:
        unknown.append({"what": "compute capability", "how_to_capture": "nsys export TARGET_INFO_GPU, or Kineto "
                        "deviceProperties (torch 2.0+ records computeMajor/computeMinor)"})
    if link == "unknown" and (world or 1) > 1:
        unknown.append({"what": "interconnect (NVLink or PCIe)",
                        "how_to_capture": "nsys profile --gpu-metrics-devices=all records NVLink throughput; NCCL "
                                          "message sizes (nsys -t cuda,nvtx) let the bus bandwidth be compared with "
                                          "link peaks"})
    if comm and not sized:
        unknown.append({"what": "collective message sizes (without them the bus bandwidth, nccl_small_messages and "
                                "low_comm_bandwidth cannot be computed)",
                        "how_to_capture": "nsys profile -t cuda,nvtx records NCCL's NVTX payloads (message sizes); "
                                          "torch.profiler(record_shapes=True) records them in record_param_comms"})
    unknown.append({"what": "framework version and launch settings",
                    "how_to_capture": "not in the trace: note the framework's version and server arguments "
                                      "beside the capture"})
    return PlatformFacts(
        gpu_model=model, gpu_models=models, compute_capability=cc, architecture=architecture_of(cc),
        architecture_name=ARCHITECTURES.get(cc or ""), gpu_count=len(gpus), world_size=world,
        interconnect=link, interconnect_evidence=link_evidence, comm=comm, frameworks=_frameworks(parts),
        message_sizes_known=sized, bus_bandwidth_gbps=busbw,
        tool_versions=sorted({p.tool_version for p in parts if p.tool_version}), unknown=unknown)


__all__ = ["ARCHITECTURES", "LINK_BY_MODEL", "PlatformFacts", "TracePlatform", "architecture_of", "link_of_model",
           "platform_facts", "trace_platform"]
