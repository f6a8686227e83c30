"""nvidia-smi power log parsing and alignment with a trace window."""

from __future__ import annotations

import pytest

from traceanalyzer.analysis.power import power_during
from traceanalyzer.cli import main
from traceanalyzer.loaders.power_log import read_power_log
from traceanalyzer.model.errors import BadInputError

LOG = """timestamp, index, power.draw [W], power.limit [W], clocks.current.sm [MHz], utilization.gpu [%]
2026/11/30 13:22:51.800, 0, 100.00, 700.00, 1980, 50
2026/11/30 13:22:51.900, 0, 300.00, 700.00, 1980, 100
2026/11/30 13:22:52.000, 0, 200.00, 700.00, 1970, 100
2026/11/30 13:22:51.900, 1, [N/A], 700.00, 345, 0
"""
T0 = 1_796_044_971_800_000_000  # 2026-11-30 13:22:51.800 UTC in ns


def test_parse_units_and_alignment(tmp_path):
    p = tmp_path / "power.csv"
    p.write_text(LOG)
    log = read_power_log(p)
    assert log.samples["utc_ns"].min() == T0
    out = power_during(log, {0: (T0 + 100_000_000, T0 + 150_000_000)})
    gpu0 = out["gpus"][0]
    # half the 100 ms sampling period widens the window: samples at +100 ms and +200 ms count, +0 ms does not
    assert gpu0["samples"] == 2 and gpu0["power_mean_w"] == 250.0
    assert gpu0["power_mean_pct_of_limit"] == pytest.approx(250 / 7)


def test_bad_log_is_refused(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(BadInputError, match=r"power\.draw"):
        read_power_log(p)
    assert main(["summary", str(tmp_path / "missing.json"), "--gpu-log", str(p)]) == 2


def test_real_power_log(shared_data):
    log = read_power_log(shared_data / "h200" / "gpu" / "power_log.csv")
    assert set(log.samples["gpu"]) == {0, 1}
    assert (log.samples["power_limit_w"] == 700.0).all()


def test_clock_metrics_exported_in_hz_are_shown_in_mhz():
    import pandas as pd

    from traceanalyzer.analysis.gpu_metrics import _clocks_in_mhz

    agg = pd.DataFrame({"metric": ["GPC Clock Frequency [MHz]", "SMs Active [Throughput %]"],
                        "mean": [1.98e9, 40.0], "p50": [1.98e9, 40.0], "max": [1.98e9, 90.0], "samples": [3, 3]})
    out = _clocks_in_mhz(agg)
    assert out["mean"].tolist() == [1980.0, 40.0] and out["max"].tolist() == [1980.0, 90.0]
