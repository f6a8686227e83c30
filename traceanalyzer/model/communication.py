"""The communication vocabulary, declared once: collective kinds, their names in titles, NCCL's bus-bandwidth
factors and the scale-up link peaks.

The collectives analysis names each communication instance with a kind (:func:`kind_of`); the cross-rank match,
the HTML report, the SQLite export and the findings compute bus bandwidth with :func:`bus_factors` and compare it
with :func:`link_peak_gbps`. ``tests/test_communication.py`` fails if another module of the package spells these
out again. (The loaders keep the trace's own names of host-side NCCL calls, ``ncclAllReduce`` → ``allreduce``:
data of the trace, not this vocabulary.)
"""

from __future__ import annotations

import re

import numpy as np

#: Collective kinds a communication kernel can have (:func:`kind_of`), besides :data:`PEER_COPY` and :data:`OTHER`.
KINDS: tuple[str, ...] = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv", "broadcast", "reduce",
                          "custom_allreduce", "allreduce_fusion")
#: The kind of a peer-to-peer memory copy that counts as communication.
PEER_COPY = "p2p_copy"
#: The kind of a communication kernel whose collective is not known.
OTHER = "other"

#: Kinds (and classifier sub-buckets) of plain all-reduces, not fused with a norm: what a one-shot all-reduce or an
#: all-reduce + RMSNorm fusion would replace. Fused ones are ``allreduce_fusion``.
ALLREDUCE_KINDS: tuple[str, ...] = ("allreduce", "all_reduce", "custom_allreduce")

#: Plural, human names of collective kinds for titles.
KIND_NAMES: dict[str, str] = {
    "allreduce": "all-reduces", "custom_allreduce": "custom all-reduces", "allreduce_fusion": "fused all-reduces",
    "allgather": "all-gathers", "reducescatter": "reduce-scatters", "alltoall": "all-to-alls",
    "sendrecv": "send/recv", "broadcast": "broadcasts", "reduce": "reduces"}

# kernel-name patterns, first match wins (fused and custom all-reduces before plain ones, reduce last)
_NAME_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("allreduce_fusion", re.compile(r"allreduce_?fusion|fused_?allreduce|all_?reduce.*(rms|norm)", re.I)),
    ("custom_allreduce", re.compile(r"cross_device_reduce|custom_?all_?reduce|quick_?all_?reduce|"
                                    r"one_?shot|two_?shot", re.I)),
    ("allreduce", re.compile(r"all_?reduce", re.I)),
    ("reducescatter", re.compile(r"reduce_?scatter", re.I)),
    ("allgather", re.compile(r"all_?gather", re.I)),
    ("alltoall", re.compile(r"all_?to_?all|dispatch|combine", re.I)),
    ("broadcast", re.compile(r"broadcast|bcast", re.I)),
    ("sendrecv", re.compile(r"send|recv|p2p|peer", re.I)),
    ("reduce", re.compile(r"reduce", re.I)),
)

#: Peak unidirectional bandwidth per GPU of the scale-up link, GB/s (vendor figures), matched in name order.
LINK_PEAK_GBPS: tuple[tuple[str, float], ...] = (
    ("GB300", 900.0), ("GB200", 900.0), ("B300", 900.0), ("B200", 900.0), ("H200", 450.0), ("H100 PCIe", 64.0),
    ("H100", 450.0), ("H800", 200.0), ("A100-PCIE", 32.0), ("A100", 300.0), ("A800", 200.0), ("V100", 150.0))


def kind_of(subbucket: str | None, name: str | None) -> str:
    """Collective kind from a sub-bucket (``all_reduce``, ``allreduce_fusion``…) or else the kernel name."""
    if subbucket:
        key = subbucket.lower().replace("-", "_")
        flat = key.replace("_", "")
        for kind in KINDS:
            if key == kind or flat == kind.replace("_", ""):
                return kind
        if flat in ("alltoallv", "all2all"):
            return "alltoall"
    for kind, pattern in _NAME_KINDS:
        if name and pattern.search(name):
            return kind
    return OTHER


def _normal_kind(kind: object) -> str:
    return str(kind).lower().replace("_", "").replace("-", "").replace(" ", "")


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw for a collective of ``n`` ranks, NCCL's convention (nccl-tests' PERFORMANCE.md): all-reduce
    (plain, custom or fused with a norm) 2(n−1)/n; all-gather, reduce-scatter and all-to-all (n−1)/n; broadcast,
    reduce, send/recv, peer copies and unknown kinds 1; 1 for fewer than two ranks."""
    k = _normal_kind(kind)
    if n < 2:
        return 1.0
    if "allreduce" in k:
        return 2.0 * (n - 1) / n
    if any(word in k for word in ("allgather", "reducescatter", "alltoall")):
        return (n - 1) / n
    return 1.0


def group_sizes(group_size: np.ndarray, ranks: int) -> np.ndarray:
    """Ranks in each instance's group: its own ``group_size`` where the trace knows it (> 0), else ``ranks`` (the
    ranks matched across files, at least 1)."""
    group = np.asarray(group_size, dtype=np.int64)
    return np.where(group > 0, group, max(int(ranks), 1))


def bus_factors(kinds: np.ndarray, group_size: np.ndarray, ranks: int) -> np.ndarray:
    """:func:`bus_factor` per instance (float64), of its kind and its group (:func:`group_sizes`); computed once
    per distinct (kind, group) pair."""
    kinds = np.asarray(kinds).astype(str)
    group = group_sizes(group_size, ranks)
    if not len(kinds):
        return np.zeros(0, dtype=np.float64)
    distinct, kind_codes = np.unique(kinds, return_inverse=True)
    pairs, inverse = np.unique(np.c_[kind_codes.ravel(), group], axis=0, return_inverse=True)
    factor = np.array([bus_factor(str(distinct[k]), int(n)) for k, n in pairs], dtype=np.float64)
    return factor[inverse.ravel()]


def link_peak_gbps(gpu_name: str | None) -> float | None:
    """Vendor peak unidirectional scale-up bandwidth for a GPU name, GB/s (None when unknown)."""
    if not gpu_name:
        return None
    for key, peak in LINK_PEAK_GBPS:
        if key.lower() in gpu_name.lower():
            return peak
    return None


#: Kinds of collective instances that all-reduce, the fused all-reduce + norm included.
ALLREDUCE_LIKE_KINDS: tuple[str, ...] = (*ALLREDUCE_KINDS, "allreduce_fusion")

#: The communication paths a trace can show (:mod:`traceanalyzer.analysis.comm_path`): NCCL and those beside it.
COMM_PATHS: tuple[str, ...] = ("nccl", "custom_allreduce", "allreduce_fusion", "symmetric_memory", "deepep", "nvshmem",
                               "mscclpp", "other")
#: The all-reduce paths that bypass NCCL, reported as missing when the trace shows none of them.
NON_NCCL_ALLREDUCE_PATHS: tuple[str, ...] = ("custom_allreduce", "allreduce_fusion", "symmetric_memory")

__all__ = ["ALLREDUCE_KINDS", "ALLREDUCE_LIKE_KINDS", "COMM_PATHS", "KINDS", "KIND_NAMES", "LINK_PEAK_GBPS",
           "NON_NCCL_ALLREDUCE_PATHS", "OTHER", "PEER_COPY", "bus_factor", "bus_factors", "group_sizes", "kind_of",
           "link_peak_gbps"]
