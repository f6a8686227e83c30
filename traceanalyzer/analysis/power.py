"""Power and clocks from an ``nvidia-smi --query-gpu=... --format=csv -lms N`` log, aligned with a trace.

nvidia-smi writes local wall-clock timestamps without a zone; traceanalyzer assumes UTC (the default on servers and
containers) unless ``utc_offset_s`` says otherwise. Traces give their own clock's UTC origin
(``Trace.base_time_ns``: Kineto ``baseTimeNanoseconds``, nsys ``TARGET_INFO_SESSION_START_TIME``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import BadInputError

_FIELD_ALIASES = {
    "timestamp": "timestamp",
    "index": "gpu",
    "power.draw": "power_w",
    "power.draw.instant": "power_w",
    "power.draw.average": "power_w",
    "power.limit": "power_limit_w",
    "enforced.power.limit": "power_limit_w",
    "clocks.current.sm": "sm_clock_mhz",
    "clocks.sm": "sm_clock_mhz",
    "clocks.max.sm": "sm_clock_max_mhz",
    "utilization.gpu": "util_pct",
    "temperature.gpu": "temp_c",
}


@dataclass(frozen=True)
class PowerLog:
    """Samples of one nvidia-smi log: ``utc_ns`` int64, ``gpu`` int, and numeric columns (W, MHz, %)."""

    path: str
    samples: pd.DataFrame


def _number(series: pd.Series) -> pd.Series:
    """'78.27 W' / '345 MHz' / '[N/A]' → float (NaN when not a number)."""
    text = series.astype(str).str.strip().str.extract(r"^([-+]?\d+(?:\.\d+)?)", expand=False)
    return pd.to_numeric(text, errors="coerce")


def read_power_log(path: str | Path, *, utc_offset_s: int = 0) -> PowerLog:
    """Parse an nvidia-smi CSV log (with or without units); raise BadInputError naming the file when unusable."""
    p = Path(path)
    if not p.exists():
        raise BadInputError(p, "no such file (expected an nvidia-smi --format=csv log)")
    if not p.is_file():
        raise BadInputError(p, "is not a file (expected an nvidia-smi --format=csv log)")
    try:
        raw = pd.read_csv(p, skipinitialspace=True, dtype=str, encoding="utf-8")
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise BadInputError(p, f"not a CSV log: {str(exc).splitlines()[0]}") from None
    columns: dict[str, str] = {}
    for col in raw.columns:
        key = re.sub(r"\s*\[.*\]\s*$", "", str(col)).strip().lower()
        if key in _FIELD_ALIASES:
            columns[col] = _FIELD_ALIASES[key]
    if "timestamp" not in columns.values() or "power_w" not in columns.values():
        raise BadInputError(p, "nvidia-smi log needs 'timestamp' and 'power.draw' columns",
                            "log with --query-gpu=timestamp,index,power.draw,power.limit,clocks.sm --format=csv")
    df = raw[list(columns)].rename(columns=columns)
    stamps = pd.to_datetime(df["timestamp"].str.strip(), format="%Y/%m/%d %H:%M:%S.%f", errors="coerce")
    ok = stamps.notna()
    if not ok.any():
        raise BadInputError(p, "no readable timestamps (expected 'YYYY/MM/DD HH:MM:SS.mmm')")
    utc_ns = stamps[ok].astype("datetime64[ns]").astype("int64").to_numpy() - utc_offset_s * 1_000_000_000
    out = pd.DataFrame({"utc_ns": utc_ns})
    out["gpu"] = _number(df.loc[ok, "gpu"]).fillna(0).astype(int).to_numpy() if "gpu" in df else 0
    for col in df.columns:
        if col not in ("timestamp", "gpu"):
            out[col] = _number(df.loc[ok, col]).to_numpy()
    return PowerLog(str(p), out.sort_values(["gpu", "utc_ns"], kind="stable").reset_index(drop=True))


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
