"""Known causes: the table in ``rules/causes.toml`` matched against the platform facts (``analysis.platform``)
and the evidence the other rules found, so a finding says *why* and which setting changes it, never advice that
cannot apply on the recorded platform.

An entry fires when every token of its ``evidence`` holds (:data:`EVIDENCE`) and every condition of ``when`` holds
on the platform facts; a condition on a fact the trace does not record (architecture, link, world size) keeps it
silent. A fired entry becomes a finding ``cause_<id>`` (no time impact of its own: ``evidence.explains`` names the
findings whose time it explains), and the findings it ``silences`` get its advice in place of theirs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from ..analysis.platform import PCIE_GEN5_GBPS
from ..analysis.results import Finding
from ..model.communication import ALLREDUCE_LIKE_KINDS, NON_NCCL_ALLREDUCE_PATHS
from . import rule_ids as ids
from .context import FindingContext, count_kinds_per_step

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib



@dataclass(frozen=True)
class Cause:
    """One entry of the causes table."""

    id: str
    title: str
    evidence: tuple[str, ...]
    when: dict[str, Any]
    settings: dict[str, str]
    alternative: str
    sources: tuple[str, ...]
    silences: tuple[str, ...] = field(default=())


CONDITIONS = ("architectures", "not_architectures", "link", "world_size_min", "world_size_max", "frameworks")


@lru_cache(maxsize=1)
def load_causes() -> tuple[Cause, ...]:
    """The packaged causes table (``traceanalyzer/rules/causes.toml``)."""
    text = resources.files("traceanalyzer").joinpath("rules/causes.toml").read_text(encoding="utf-8")
    return parse_causes(text)


def parse_causes(text: str) -> tuple[Cause, ...]:
    """Causes from TOML text; ValueError on an entry without evidence, source or a known condition."""
    out = []
    for raw in tomllib.loads(text).get("cause", []):
        cause = Cause(id=raw["id"], title=raw["title"], evidence=tuple(raw.get("evidence", ())),
                      when=dict(raw.get("when", {})), settings=dict(raw.get("settings", {})),
                      alternative=raw.get("alternative", ""), sources=tuple(raw.get("sources", ())),
                      silences=tuple(raw.get("silences", ())))
        unknown = [t for t in cause.evidence if t not in EVIDENCE]
        bad = [k for k in cause.when if k not in CONDITIONS]
        if not cause.evidence or unknown:
            raise ValueError(f"cause {cause.id}: evidence {list(cause.evidence)} (unknown: {unknown})")
        if bad:
            raise ValueError(f"cause {cause.id}: unknown conditions {bad}")
        if not cause.sources or not all(s.startswith("https://") for s in cause.sources):
            raise ValueError(f"cause {cause.id}: needs https sources")
        out.append(cause)
    return tuple(out)


@dataclass
class _Facts:
    """What the evidence tokens and title placeholders read."""

    ctx: FindingContext
    found: dict[str, Finding]

    @property
    def platform(self) -> Any:
        return self.ctx.summary.platform

    def paths(self) -> dict[str, Any]:
        return dict(self.platform.comm) if self.platform is not None else {}

    def allreduces_per_step(self) -> int:
        best = 0
        for dev in self.ctx.summary.devices:
            kinds = self.ctx.collective_column(dev, "kind").astype(str)
            start = self.ctx.collective_column(dev, "start_ns").astype(np.int64)
            counts = count_kinds_per_step(self.ctx, dev, start, kinds)
            best = max(best, sum(n for k, n in counts.items() if k in ALLREDUCE_LIKE_KINDS))
        return best


def _nccl_allreduce(f: _Facts) -> bool:
    use = f.paths().get("nccl")
    return use is not None and any("allreduce" in n.lower() for n in use.names)


EVIDENCE: dict[str, Callable[[_Facts], bool]] = {
    "nccl_allreduce": _nccl_allreduce,
    "no_custom_allreduce": lambda f: not any(p in f.paths() for p in NON_NCCL_ALLREDUCE_PATHS),
    "no_allreduce_fusion": lambda f: "allreduce_fusion" not in f.paths(),
    "unfused_allreduce_norm": lambda f: ids.ALLREDUCE_NOT_FUSED in f.found,
    "launch_bound": lambda f: ids.HOST_BOUND_NO_CUDA_GRAPHS in f.found,
    "deepep_kernels": lambda f: "deepep" in f.paths(),
    "comm_contention": lambda f: ids.COMM_COMPUTE_CONTENTION in f.found or ids.EXPOSED_COMMUNICATION in f.found,
    "bandwidth_below_link": lambda f: ids.LOW_COMM_BANDWIDTH in f.found,
    "bandwidth_below_pcie": lambda f: f.platform is not None and f.platform.bus_bandwidth_gbps is not None
    and f.platform.bus_bandwidth_gbps < PCIE_GEN5_GBPS,
}
EVIDENCE_TEXT = {
    "nccl_allreduce": "NCCL all-reduce kernels in the trace",
    "no_custom_allreduce": "no custom all-reduce, symmetric-memory or fused all-reduce kernel in the trace",
    "no_allreduce_fusion": "no fused all-reduce + norm kernel in the trace",
    "unfused_allreduce_norm": "all-reduces followed by a separate add + RMSNorm (finding allreduce_not_fused)",
    "launch_bound": "launch gaps between short kernels without CUDA graphs (host_bound_no_cuda_graphs)",
    "deepep_kernels": "DeepEP dispatch / combine kernels in the trace",
    "comm_contention": "communication slows or blocks compute (comm_compute_contention / exposed_communication)",
    "bandwidth_below_link": "collectives far below the link's bandwidth (finding low_comm_bandwidth)",
    "bandwidth_below_pcie": f"measured all-reduce bus bandwidth below PCIe Gen5 x16 ({PCIE_GEN5_GBPS:.0f} GB/s)",
}


def conditions_hold(when: dict[str, Any], platform: Any) -> bool:
    """Every condition of ``when`` holds on ``platform`` (a fact that is unknown fails its condition)."""
    if not when:
        return True
    if platform is None:
        return False
    arch, link, world = platform.architecture, platform.interconnect, platform.world_size
    if "architectures" in when and arch not in when["architectures"]:
        return False
    if "not_architectures" in when and (arch is None or arch in when["not_architectures"]):
        return False
    if "link" in when and link not in when["link"]:
        return False
    if "frameworks" in when and not {f["name"] for f in platform.frameworks} & set(when["frameworks"]):
        return False
    if "world_size_min" in when and (world is None or world < when["world_size_min"]):
        return False
    return not ("world_size_max" in when and (world is None or world > when["world_size_max"]))


def _placeholders(f: _Facts) -> dict[str, Any]:
    p = f.platform
    algos = p.nccl_algorithms() if p is not None else {}
    total = sum(algos.values())
    algo_text = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(algos.items(), key=lambda kv: -kv[1])) \
        if total else "algorithm not in the kernel names"
    if len(algos) == 1:
        algo_text = f"every one {next(iter(algos))}"
    chains = f.found.get(ids.ALLREDUCE_NOT_FUSED)
    deepep = f.paths().get("deepep")
    return {"allreduces_per_step": f.allreduces_per_step(), "nccl_algorithms": algo_text,
            "architecture": (p.architecture if p is not None else None) or "unknown",
            "compute_capability": (p.compute_capability if p is not None else None) or "unknown",
            "chains_per_step": chains.evidence.get("allreduces_followed_per_step") if chains else 0,
            "deepep_kernels": deepep.kernels if deepep is not None else 0,
            "bus_bandwidth": f"{p.bus_bandwidth_gbps:.0f}" if p is not None and p.bus_bandwidth_gbps else "unknown"}


def _settings_text(settings: dict[str, str]) -> str:
    names = {"sglang": "SGLang", "vllm": "vLLM", "tensorrt_llm": "TensorRT-LLM", "nccl_env": "NCCL environment",
             "deepep": "DeepEP"}
    return "; ".join(f"{names.get(k, k)}: {v}" for k, v in settings.items())


def known_causes(ctx: FindingContext, found: list[Finding]) -> list[Finding]:
    """The causes table's entries that fire on this summary, as findings; the findings they silence get their
    advice instead (changed in place)."""
    by_id = {f.id: f for f in found}
    facts = _Facts(ctx, by_id)
    out = []
    for cause in load_causes():
        if not all(EVIDENCE[t](facts) for t in cause.evidence):
            continue
        if not conditions_hold(cause.when, ctx.summary.platform):
            continue
        values = _placeholders(facts)
        title = cause.title.format(**values)
        explains = {f.id: f.impact_ns_per_step for f in found
                    if f.id in _EXPLAINS.get(cause.id, ()) or f.id in cause.silences}
        recommendation = f"{_settings_text(cause.settings)}. {cause.alternative}".strip()
        out.append(Finding(
            id=f"cause_{cause.id}", title=title, impact_ns_per_step=None, severity="info",
            recommendation=recommendation,
            evidence={"cause": cause.id, "evidence": [EVIDENCE_TEXT[t] for t in cause.evidence],
                      "conditions": cause.when, "settings": cause.settings, "alternative": cause.alternative,
                      "sources": list(cause.sources), "explains": explains,
                      "platform": _platform_brief(ctx.summary.platform)}))
        for fid in cause.silences:
            if fid in by_id:
                silenced = by_id[fid]
                silenced.recommendation = f"The usual advice does not apply here (cause_{cause.id}): " \
                                          f"{cause.alternative}"
                silenced.evidence["advice_from_cause"] = f"cause_{cause.id}"
    _no_nccl_knobs_without_nccl(found, facts)
    return out


def _no_nccl_knobs_without_nccl(found: list[Finding], facts: _Facts) -> None:
    """NCCL environment knobs only where NCCL runs the collectives: a finding whose advice names ``NCCL_*`` on a
    trace whose communication kernels are not NCCL's (custom all-reduce, symmetric memory, DeepEP) gets advice
    about the kernels in use instead (changed in place)."""
    paths = facts.paths()
    if not paths or "nccl" in paths:
        return
    used = ", ".join(p.replace("_", " ") for p in paths)
    for f in found:
        if "NCCL_" in f.recommendation and "advice_from_cause" not in f.evidence:
            f.recommendation = (f"The collectives here are not NCCL's ({used}), so NCCL environment knobs do not "
                                "change them: give those kernels fewer SMs through their own configuration, or "
                                "overlap them with memory-bound rather than compute-bound kernels.")
            f.evidence["advice_from_cause"] = "communication path is not NCCL"


#: Findings whose time a cause explains (besides those it silences).
_EXPLAINS: dict[str, tuple[str, ...]] = {
    "custom_allreduce_off_pcie": (ids.COMM_SERIALIZED_WITH_COMPUTE, ids.EXPOSED_COMMUNICATION, ids.NCCL_SMALL_MESSAGES),
    "custom_allreduce_unused_nvlink": (ids.COMM_SERIALIZED_WITH_COMPUTE, ids.EXPOSED_COMMUNICATION,
                                       ids.NCCL_SMALL_MESSAGES),
    "allreduce_norm_fusion_gated_arch": (ids.ALLREDUCE_NOT_FUSED,),
    "allreduce_norm_fusion_available": (ids.ALLREDUCE_NOT_FUSED,),
    "cuda_graphs_off": (ids.HOST_BOUND_NO_CUDA_GRAPHS,),
    "deepep_not_nccl": (ids.COMM_COMPUTE_CONTENTION, ids.EXPOSED_COMMUNICATION),
    "nccl_not_over_nvlink": (ids.LOW_COMM_BANDWIDTH, ids.COMM_SERIALIZED_WITH_COMPUTE, ids.EXPOSED_COMMUNICATION),
}


def _platform_brief(p: Any) -> dict[str, Any]:
    if p is None:
        return {}
    return {"gpu_model": p.gpu_model, "architecture": p.architecture, "compute_capability": p.compute_capability,
            "interconnect": p.interconnect, "world_size": p.world_size}


__all__ = ["CONDITIONS", "EVIDENCE", "Cause", "conditions_hold", "known_causes", "load_causes", "parse_causes"]
