"""The comm-free what-if on an 8-rank seed-like replay (issue 27, item 1): 78 layers × 2 serialized NCCL
all-reduces per forward pass, a 2.5 ms host gap between passes, as one nsys export written here
(``traceanalyzer.testing.synth_nsys``) with the exact comm-free step time known by construction.

Construction, per pass: every rank runs the same kernel sequence on one stream — per layer an attention GEMM, the
first all-reduce, an MLP GEMM, the second all-reduce — with a usual gap of ``GAP`` between kernels. Rank 7 is the
slowest (compute × 1.03) and every rank's compute carries a small deterministic jitter, so who arrives last varies a
little. An all-reduce starts on each rank when that rank gets there and ends on all ranks at the last arrival plus
its transfer time. The pass ends with the last all-reduce (no kernel after it, as a decode pass whose sampling runs
elsewhere); the host then needs 2.5 ms before the next pass's first kernel on every rank (NVTX ``step`` range per
pass, no CUDA API rows: a replay of kernels alone, as the seeds are). With communication free the kernels of each
rank run back to back (one usual gap where two were), so the exact comm-free step is the slowest rank's own pass.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import traceanalyzer as ta
from traceanalyzer.pipeline.summarize import summarize
from traceanalyzer.testing.synth_nsys import write_nsys_export

RANKS, LAYERS, PASSES = 8, 78, 5
GAP = 1_500  # ns between kernels on a busy stream
HOST_GAP = 2_500_000  # ns between the last kernel of a pass and the first of the next (the host's work)
TRANSFER = 95_000  # ns an all-reduce takes once the last rank has arrived
ATTN, MLP = 40_000, 55_000  # ns of the compute kernel before each all-reduce
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def _replay(path: Path) -> tuple[Path, float]:
    """Write the replay; returns the export and the exact saving per pass (with − without communication, ns)."""
    rng = np.random.default_rng(27)
    slow = np.where(np.arange(RANKS) == RANKS - 1, 1.03, 1.0)
    kernels: list[tuple[object, ...]] = []
    nvtx: list[tuple[object, ...]] = []
    t = np.zeros(RANKS)  # each rank's clock (ns): when its stream is free
    with_comm, without = [], []
    for _ in range(PASSES):
        start = t.copy()
        alone = np.zeros(RANKS)  # each rank's pass with communication free
        for layer in range(LAYERS):
            for which, base in enumerate((ATTN, MLP)):
                dur = np.round(base * slow * (1 + 0.01 * rng.standard_normal(RANKS)))
                for r in range(RANKS):
                    kernels.append((int(t[r]), int(t[r] + dur[r]), r, 7, "sm90_xmma_gemm_bf16bf16_bf16f32", 1000 + r))
                t += dur + GAP
                alone += dur + GAP
                arrive = t.copy()
                end = arrive.max() + TRANSFER
                for r in range(RANKS):
                    kernels.append((int(arrive[r]), int(end), r, 7, NCCL, 1000 + r))
                t[:] = end + (GAP if (layer, which) != (LAYERS - 1, 1) else 0)
        with_comm.append(float((t - start).max()))
        without.append(float((alone - GAP).max()))  # the pass's last kernel has no gap after it
        for r in range(RANKS):
            nvtx.append((int(start[r]) - 1_000, int(t[r]) + 1_000, "step", 1000 + r))
        t += HOST_GAP
    write_nsys_export(path, kernels, nvtx=nvtx, mpi_ranks={1000 + r: r for r in range(RANKS)})
    return path, float(np.median(np.array(with_comm) - np.array(without)))


@pytest.fixture(scope="module")
def seed_what_if(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path, exact = _replay(tmp_path_factory.mktemp("seed") / "seed_replay.sqlite")
    summary = summarize([ta.load(path)])
    return summary.what_if, exact


def test_seed_replay_what_if_within_5_percent_of_exact(seed_what_if) -> None:  # type: ignore[no-untyped-def]
    w, exact = seed_what_if
    assert exact == pytest.approx(LAYERS * 2 * (TRANSFER + GAP), rel=0.02)  # the construction's own check
    assert w.comm_free_step_saving_ns == pytest.approx(exact, rel=0.05)


def test_seed_replay_charges_no_inter_pass_gap_to_an_all_reduce(seed_what_if) -> None:  # type: ignore[no-untyped-def]
    w, _ = seed_what_if
    for rank in w.to_json()["ranks"].values():
        assert rank["dependency_latency_ns"] < 10_000  # µs-scale, not the 2.5 ms host gap
        assert rank["step_gap_after_comm_ns"] >= HOST_GAP * 0.9  # the gap is its own component
    low, high = w.to_json()["range_ns"]
    assert low <= w.comm_free_step_saving_ns <= high
