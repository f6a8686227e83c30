"""The communication vocabulary (``traceanalyzer/model/communication.py``): NCCL's bus factors per collective and world
size, one declaration of each concept, and the same bus bandwidth in the export / report table and in the
``low_comm_bandwidth`` finding."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import traceanalyzer
from traceanalyzer.analysis.collectives import with_transfer
from traceanalyzer.model import communication
from traceanalyzer.model.communication import KIND_NAMES, KINDS, bus_factor, bus_factors, kind_of, link_peak_gbps
from traceanalyzer.pipeline.summarize import summarize
from traceanalyzer.testing.synth import make_trace

PACKAGE = Path(traceanalyzer.__file__).resolve().parent
VOCABULARY = PACKAGE / "model" / "communication.py"

# nccl-tests PERFORMANCE.md: busbw = algbw × this
ALLREDUCE = ("allreduce", "all_reduce", "custom_allreduce", "allreduce_fusion")
N_MINUS_1_OVER_N = ("allgather", "reducescatter", "reduce_scatter", "alltoall", "all_to_all")
ONE = ("broadcast", "reduce", "sendrecv", "p2p_copy", "other")


@pytest.mark.parametrize("n", [2, 4, 8, 16])
@pytest.mark.parametrize("kind", [*ALLREDUCE, *N_MINUS_1_OVER_N, *ONE])
def test_bus_factor_per_collective_and_world_size(kind: str, n: int) -> None:
    expected = 2 * (n - 1) / n if kind in ALLREDUCE else (n - 1) / n if kind in N_MINUS_1_OVER_N else 1.0
    assert bus_factor(kind, n) == pytest.approx(expected)


def test_bus_factor_at_eight_ranks_spelled_out() -> None:
    assert [bus_factor(k, 8) for k in ("allreduce_fusion", "allreduce", "allgather", "broadcast", "sendrecv")] == \
        [1.75, 1.75, 0.875, 1.0, 1.0]
    assert bus_factor("allreduce", 1) == 1.0  # one rank moves nothing across a link: busbw = algbw


def test_bus_factors_per_instance_use_the_group_else_the_matched_ranks() -> None:
    kinds = np.array(["allreduce", "broadcast", "allgather", "allreduce_fusion"], dtype=object)
    group = np.array([8, 8, -1, -1])
    assert bus_factors(kinds, group, 4).tolist() == [1.75, 1.0, 0.75, 1.5]
    assert bus_factors(kinds, group, 0).tolist() == [1.75, 1.0, 1.0, 1.0]  # no match, size unknown: one rank
    assert bus_factors(np.array([], dtype=object), np.array([], dtype=np.int64), 2).tolist() == []


def test_every_kind_has_a_title_name_and_kind_of_returns_vocabulary_words() -> None:
    assert set(KIND_NAMES) == set(KINDS)
    assert kind_of("all_to_all", None) == "alltoall" and kind_of(None, "ncclDevKernel_AllGather_RING") == "allgather"
    assert kind_of(None, "fused_allreduce_rmsnorm") == "allreduce_fusion" and kind_of(None, "gemm") == "other"
    assert link_peak_gbps("NVIDIA H200") == 450.0 and link_peak_gbps("NVIDIA H100 PCIe") == 64.0
    assert link_peak_gbps("Synthetic GPU") is None and link_peak_gbps(None) is None


def _module_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _kind_literals(tree: ast.Module) -> list[int]:
    """Lines of tuple/list/set/dict literals naming two or more collective kinds."""
    words = set(KINDS)
    lines = []
    for node in ast.walk(tree):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        named = {i.value for i in items or () if isinstance(i, ast.Constant) and i.value in words}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and len(named) >= 2:
            lines.append(node.lineno)
    return lines


def test_communication_vocabulary_is_declared_once() -> None:
    """No other module defines a name of the vocabulary or lists collective kinds of its own. The loaders name the
    trace's host-side NCCL calls (``ncclAllReduce`` → ``allreduce``: the trace's data) and ``testing/`` builds
    traces, so both are left out."""
    declared = set(communication.__all__)
    assert declared <= _module_level_names(ast.parse(VOCABULARY.read_text(encoding="utf-8")))
    again, spelled = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path == VOCABULARY or rel.parts[0] in ("loaders", "testing"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if names := declared & _module_level_names(tree):
            again[str(rel)] = sorted(names)
        if lines := _kind_literals(tree):
            spelled[str(rel)] = lines
    assert again == {}, f"communication vocabulary declared again: {again}"
    assert spelled == {}, f"lists of collective kinds outside traceanalyzer/model/communication.py: {spelled}"


def _rank(rank: int, kind: str, group: int, nbytes: int, dur_ns: int):
    """One 10 ms ProfilerStep holding one collective of ``kind`` (``group`` ranks, ``nbytes``) of ``dur_ns``."""
    kernels = [(0, 1_000_000, 0, 7, "nvjet_gemm", "gemm", "dense"),
               (1_000_000, 1_000_000 + dur_ns, 0, 7, f"ncclDevKernel_{kind}", "communication", kind, 1, 1),
               (1_000_000 + dur_ns, 10_000_000, 0, 7, "nvjet_gemm", "gemm", "dense")]
    return make_trace(kernels, ranges=[(0, 10_000_000, "gpu_user_annotation", "ProfilerStep#0", 0)],
                      collectives=[(1, kind, nbytes, 1, group)], rank=rank, path=f"rank{rank}.json",
                      device_names={0: "NVIDIA H200"})


@pytest.mark.parametrize(("kind", "factor"), [("allreduce_fusion", 1.75), ("broadcast", 1.0),
                                              ("sendrecv", 1.0), ("allgather", 0.875)])
def test_finding_and_export_share_the_bus_factor(kind: str, factor: float) -> None:
    """A slow 64 MiB collective of an 8-rank group, seen by two of the ranks: ``low_comm_bandwidth`` reports the
    bus bandwidth the export and the report's table compute."""
    nbytes, dur = 64 << 20, 4_000_000
    summary = summarize([_rank(r, kind, 8, nbytes, dur) for r in (0, 1)])
    found = next(f for f in summary.findings if f.id == "low_comm_bandwidth")
    dev = summary.devices[0]
    table = with_transfer(dev.collectives, dev.rank, summary.cross_rank, link_peak_gbps(dev.name))
    assert table["busbw_gbps"].tolist() == pytest.approx([nbytes / dur * factor])
    assert found.evidence["median_busbw_gbps"] == round(float(table["busbw_gbps"].iloc[0]), 1)
    assert found.evidence["group_size"] == 8
