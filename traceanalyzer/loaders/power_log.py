"""nvidia-smi CSV logs (``nvidia-smi --query-gpu=... --format=csv -lms N``): power, clocks, utilisation samples.

nvidia-smi writes local wall-clock timestamps without a zone; they are read as UTC (the default on servers and
containers) unless ``utc_offset_s`` says otherwise. :mod:`traceanalyzer.analysis.power` aligns them with traces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..model.errors import BadInputError

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
    # a stamp outside int64 nanoseconds (years before 1678 or after 2261) is unreadable as one before it
    ok = stamps.notna() & (stamps >= pd.Timestamp.min) & (stamps <= pd.Timestamp.max)
    if not ok.any():
        raise BadInputError(p, "no readable timestamps (expected 'YYYY/MM/DD HH:MM:SS.mmm')")
    utc_ns = stamps[ok].astype("datetime64[ns]").astype("int64").to_numpy() - utc_offset_s * 1_000_000_000
    out = pd.DataFrame({"utc_ns": utc_ns})
    out["gpu"] = _number(df.loc[ok, "gpu"]).fillna(0).astype(int).to_numpy() if "gpu" in df else 0
    for col in df.columns:
        if col not in ("timestamp", "gpu"):
            out[col] = _number(df.loc[ok, col]).to_numpy()
    return PowerLog(str(p), out.sort_values(["gpu", "utc_ns"], kind="stable").reset_index(drop=True))
