"""Power and clocks from an ``nvidia-smi --query-gpu=... --format=csv -lms N`` log, aligned with a trace.

nvidia-smi writes local wall-clock timestamps without a zone; traceanalyzer assumes UTC (the default on servers and
containers) unless ``utc_offset_s`` says otherwise. Traces give their own clock's UTC origin
(``Trace.base_time_ns``: Kineto ``baseTimeNanoseconds``, nsys ``TARGET_INFO_SESSION_START_TIME``). The log is
read by :func:`traceanalyzer.loaders.power_log.read_power_log`; this module only aligns it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..loaders.power_log import PowerLog


def power_during(log: PowerLog, windows_utc_ns: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """Power/clock statistics per GPU over each GPU's trace window (UTC ns), against the power limit.

    ``windows_utc_ns`` maps GPU index → (start, end) of its kernel activity in UTC ns.
    """
    s = log.samples
    per_gpu: list[dict[str, Any]] = []
    for gpu, (start, end) in sorted(windows_utc_ns.items()):
        mine = s[s["gpu"] == gpu]
        # A sample describes the interval around it: widen the window by half the sampling period.
        half_period = int(np.median(np.diff(mine["utc_ns"].to_numpy())) // 2) if len(mine) > 1 else 0
        rows = mine[(mine["utc_ns"] >= start - half_period) & (mine["utc_ns"] <= end + half_period)]
        entry: dict[str, Any] = {"gpu": gpu, "samples": len(rows), "window_utc_ns": [int(start), int(end)],
                                 "sample_period_ns": 2 * half_period}
        if len(rows):
            power = rows["power_w"].to_numpy(dtype=float)
            entry["power_mean_w"] = float(np.nanmean(power))
            entry["power_max_w"] = float(np.nanmax(power))
            if "power_limit_w" in rows and rows["power_limit_w"].notna().any():
                limit = float(rows["power_limit_w"].dropna().iloc[-1])
                entry["power_limit_w"] = limit
                entry["power_mean_pct_of_limit"] = 100.0 * entry["power_mean_w"] / limit if limit else None
            for col in ("sm_clock_mhz", "util_pct", "temp_c"):
                if col in rows and rows[col].notna().any():
                    entry[f"{col}_mean"] = float(rows[col].mean())
        per_gpu.append(entry)
    return {"log": Path(log.path).name, "assumed_timezone": "UTC", "gpus": per_gpu,
            "matched": any(g["samples"] for g in per_gpu)}
