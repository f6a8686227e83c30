"""Which communication path a trace's collectives take, from the kernel names: NCCL (with its algorithm and
protocol), custom all-reduce, fused all-reduce + norm, torch symmetric memory, DeepEP, NVSHMEM / MSCCL++.

The paths, and the kernel families that identify them:

* ``nccl``: ``ncclDevKernel_<Coll>_<Op>_<type>_<ALGO>_<PROTO>`` (NCCL 2.19+) and ``ncclKernel_<Coll>_<ALGO>_<PROTO>_
  <Op>_<type>`` (older); algorithm RING / TREE / NVLS / NVLS_TREE / COLLNET_DIRECT / COLLNET_CHAIN / PAT, protocol
  LL / LL128 / SIMPLE. ``ncclDevKernel_SendRecv`` carries neither.
* ``custom_allreduce``: vLLM / SGLang ``cross_device_reduce_1stage`` / ``_2stage`` (one-shot / two-shot over P2P),
  quick all-reduce (``quickreduce``), TRT-LLM ``oneShotAllReduceKernel`` / ``twoShotAllReduceKernel``.
* ``allreduce_fusion``: the classifier's ``communication/allreduce_fusion`` kernels (FlashInfer / TRT-LLM
  ``allreduce_fusion``, ``reduce_fusion::``, MNNVL ``*AllreduceFusion*``).
* ``symmetric_memory``: torch symmetric memory (``multimem_all_reduce_kernel``, ``one_shot_all_reduce_kernel``,
  ``two_shot_all_reduce_kernel`` in ``c10d::symmetric_memory`` or an anonymous namespace).
* ``deepep``: ``deep_ep::`` dispatch / combine (intranode NVLink, internode RDMA through NVSHMEM).
* ``nvshmem``, ``mscclpp``: their own kernels.

Everything here is a pure function of names and their counts; :func:`comm_paths` takes the distinct kernel names
of a trace's communication kernels with their counts and total time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..model.communication import COMM_PATHS

PATHS = COMM_PATHS

NCCL_ALGOS = ("NVLS_TREE", "NVLS", "COLLNET_DIRECT", "COLLNET_CHAIN", "RING", "TREE", "PAT")
NCCL_PROTOS = ("LL128", "LL", "SIMPLE")

#: What the algorithm / protocol in an NCCL kernel's name is (NVIDIA/nccl PRs #2223 / #2224).
NCCL_NAME_NOTE = ("as the kernel symbol names them: NCCL names a kernel after the body it inlines, so the protocol "
                  "tuned for a message may differ; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING prints the choice")

_NCCL = re.compile(r"\bnccl(?:Dev)?Kernel_(\w+)", re.IGNORECASE)
_ALGO_PROTO = re.compile(r"(?:^|_)(" + "|".join(NCCL_ALGOS) + r")_(" + "|".join(NCCL_PROTOS) + r")(?:_|$)")
_FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("deepep", re.compile(r"deep_ep::|dpsk::ep::", re.IGNORECASE)),  # dpsk::ep: an in-house DeepEP build
    ("symmetric_memory", re.compile(r"multimem_|symmetric_memory::|(?:one|two)_shot_all_reduce_kernel")),
    ("custom_allreduce", re.compile(r"cross_device_reduce_|quickreduce|quick_all_reduce|"
                                    r"(?:one|two)ShotAllReduceKernel|custom_?all_?reduce", re.IGNORECASE)),
    ("nvshmem", re.compile(r"nvshmem", re.IGNORECASE)),
    ("mscclpp", re.compile(r"mscclpp", re.IGNORECASE)),
)
_COLLECTIVE = re.compile(r"^(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|AllToAll)", re.IGNORECASE)


@dataclass(frozen=True)
class NcclKernel:
    """What an NCCL kernel's name says: the collective, algorithm and protocol (None when it does not say)."""

    collective: str | None
    algorithm: str | None
    protocol: str | None


def parse_nccl(name: str) -> NcclKernel | None:
    """The collective, algorithm and protocol in an NCCL kernel name, None for a name that is not NCCL's.

    >>> parse_nccl("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
    NcclKernel(collective='AllReduce', algorithm='RING', protocol='LL')
    >>> parse_nccl("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)")
    NcclKernel(collective='AllReduce', algorithm='RING', protocol='LL')
    """
    m = _NCCL.search(name)
    if m is None:
        return None
    body = m.group(1)
    coll = _COLLECTIVE.match(body)
    algo = _ALGO_PROTO.search(body)
    return NcclKernel(coll.group(1) if coll else None, algo.group(1) if algo else None,
                      algo.group(2) if algo else None)


def path_of(name: str, subbucket: str | None = None) -> str:
    """The communication path of one communication kernel (:data:`PATHS`)."""
    if subbucket == "allreduce_fusion":
        return "allreduce_fusion"
    if _NCCL.search(name):
        return "nccl"
    for path, pattern in _FAMILIES:
        if pattern.search(name):
            return path
    return "other"


@dataclass
class PathUse:
    """One path's kernels in a trace: how many, their total time, and the NCCL algorithm/protocol mix."""

    path: str
    kernels: int = 0
    total_ns: int = 0
    names: dict[str, int] = field(default_factory=dict)  # distinct kernel name → count (the most frequent kept)
    algorithms: dict[str, int] = field(default_factory=dict)  # "RING_LL" → kernels (NCCL only)

    def to_json(self) -> dict[str, Any]:
        top = dict(sorted(self.names.items(), key=lambda kv: -kv[1])[:5])
        return {"path": self.path, "kernels": self.kernels, "total_ns": self.total_ns, "kernel_names": top,
                **({"nccl_algorithm_protocol": self.algorithms, "nccl_algorithm_protocol_note": NCCL_NAME_NOTE}
                   if self.path == "nccl" else {})}


def comm_paths(rows: Iterable[tuple[str, str | None, int, int]]) -> dict[str, PathUse]:
    """Paths in use from (kernel name, sub-bucket, count, total ns) of distinct communication kernels."""
    out: dict[str, PathUse] = {}
    for name, sub, count, total in rows:
        path = path_of(name, sub)
        use = out.setdefault(path, PathUse(path))
        use.kernels += int(count)
        use.total_ns += int(total)
        use.names[name] = use.names.get(name, 0) + int(count)
        if path == "nccl" and (parsed := parse_nccl(name)) is not None:
            key = f"{parsed.algorithm}_{parsed.protocol}" if parsed.algorithm else "unspecified"
            use.algorithms[key] = use.algorithms.get(key, 0) + int(count)
    return out


def merge_paths(parts: Iterable[dict[str, PathUse]]) -> dict[str, PathUse]:
    """Several traces' paths added up."""
    out: dict[str, PathUse] = {}
    for part in parts:
        for path, use in part.items():
            got = out.setdefault(path, PathUse(path))
            got.kernels += use.kernels
            got.total_ns += use.total_ns
            for name, n in use.names.items():
                got.names[name] = got.names.get(name, 0) + n
            for key, n in use.algorithms.items():
                got.algorithms[key] = got.algorithms.get(key, 0) + n
    return {p: out[p] for p in PATHS if p in out}


__all__ = ["NCCL_ALGOS", "NCCL_NAME_NOTE", "NCCL_PROTOS", "PATHS", "NcclKernel", "PathUse", "comm_paths",
           "merge_paths", "parse_nccl", "path_of"]
