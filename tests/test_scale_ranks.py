"""Many ranks: replicating real ranks changes no per-rank answer, and one-kernel ranks match by hand.

The real 2-rank CUDA-graph decode is replicated to 32 ranks (rank r = source rank r % 2, so the transfer of every
collective, the minimum over ranks, is the 2-rank one): every device, wait, what-if and finding must equal the
2-rank run's. ``benchmarks/bench_scale.py`` measures the cost; the 256-rank and 1,000-file versions are ``slow``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from traceanalyzer.pipeline.summarize import summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gen_ranks import replicate, tiny

slow = pytest.mark.skipif(not os.environ.get("TRACEANALYZER_SLOW"),
                          reason="minutes on 2 cores: set TRACEANALYZER_SLOW=1")


def _device(d: Any) -> dict[str, Any]:
    out = d.to_json()
    for key in ("rank", "trace"):
        out.pop(key)
    return out


def _finding(f: Any) -> tuple[str, int | None]:
    return f.id, f.impact_ns_per_step


def _check_replicated(shared_data: Path, tmp: Path, n: int) -> None:
    source = shared_data / "h200" / "kineto" / "decode_serial_graphs"
    pair = summary(sorted(source.parent.glob(f"{source.name}_rank*.json.gz")))
    many = summary(replicate(tmp, n, source), jobs=2)
    assert [d.rank for d in many.devices] == list(range(n))
    for d in many.devices:
        assert _device(d) == _device(pair.devices[d.rank % 2]), d.rank
    cr, cr2 = many.cross_rank, pair.cross_rank
    assert cr is not None and cr2 is not None
    assert cr.collectives_matched == cr2.collectives_matched > 0
    assert cr.match_method == cr2.match_method
    assert cr.transfer_ns_per_step == cr2.transfer_ns_per_step
    assert cr.wait_ns_by_rank == {r: cr2.wait_ns_by_rank[r % 2] for r in range(n)}
    assert cr.detail is not None and cr2.detail is not None
    assert cr.detail.wait_ns_per_step_by_rank == {r: cr2.detail.wait_ns_per_step_by_rank[r % 2] for r in range(n)}
    assert many.what_if.comm_free_step_saving_ns == pair.what_if.comm_free_step_saving_ns is not None
    assert many.what_if.basis == pair.what_if.basis
    assert {r: v for r, v in many.what_if.to_json()["ranks"].items() if int(r) < 2} == pair.what_if.to_json()["ranks"]
    assert [_finding(f) for f in many.findings] == [_finding(f) for f in pair.findings]
    assert many.findings, "the serial decode has exposed communication"


def test_32_replicated_ranks_give_the_2_rank_answers(shared_data: Path, tmp_path: Path) -> None:
    _check_replicated(shared_data, tmp_path, 32)


@pytest.mark.slow
@slow
def test_256_replicated_ranks_give_the_2_rank_answers(shared_data: Path, tmp_path: Path) -> None:
    _check_replicated(shared_data, tmp_path, 256)


def _check_tiny(tmp: Path, n: int) -> None:
    """Rank r's one all-reduce lasts 100 − r % 50 µs: the transfer is 51 µs, rank r waits the rest."""
    s = summary(tiny(tmp, n), jobs=2)
    cr = s.cross_rank
    assert cr is not None and cr.collectives_matched == 1
    assert cr.wait_ns_by_rank == {r: (100 - r % 50 - 51) * 1000 for r in range(n)}
    assert cr.per_collective["transfer_ns"].tolist() == [51_000]
    assert cr.detail is not None and cr.detail.least_wait_counts[49] == 1
    assert len(s.devices) == n


def test_64_one_kernel_ranks_match_by_hand(tmp_path: Path) -> None:
    _check_tiny(tmp_path, 64)


@pytest.mark.slow
@slow
def test_1000_one_kernel_ranks_match_by_hand(tmp_path: Path) -> None:
    _check_tiny(tmp_path, 1000)
