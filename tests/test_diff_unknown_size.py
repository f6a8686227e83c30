"""A diff of an nsys export (message sizes unknown: NCCL kernels carry none) against Kineto traces (sizes on the
collective rows) shows the unknown side as "—", never as 0 MB."""

from __future__ import annotations

from pathlib import Path

import pytest

import traceanalyzer as ta
from traceanalyzer.render.diff import collective_rows

ROOT = Path(__file__).resolve().parents[1]
NSYS = ROOT / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"
KINETO = ROOT / "fixtures" / "kineto" / "tp2_prefill_serial"


def test_unknown_message_size_is_a_dash():
    if not (NSYS.is_file() and KINETO.is_dir()):
        pytest.skip("tp2_prefill_serial fixtures are absent")
    d = ta.diff(NSYS, KINETO)
    # the Kineto side: 8 all-reduces of 16384 × 4096 bf16 (134,217,728 B, "In msg nelems" 67108864 × 2 B) per step
    rows = {r["kind"]: r for r in collective_rows(d)}
    assert rows["allreduce"]["mb"] == "— → 1073.74"
    payload = d.to_json()["collectives"][0]
    assert payload["before_bytes"] is None and payload["after_bytes"] == 8 * 134_217_728
