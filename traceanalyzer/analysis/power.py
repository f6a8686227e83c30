"""Power and clocks from an ``nvidia-smi --query-gpu=... --format=csv -lms N`` log, aligned with a trace.

nvidia-smi writes local wall-clock timestamps without a zone; traceanalyzer assumes UTC (the default on servers and
containers) unless ``utc_offset_s`` says otherwise. Traces give their own clock's UTC origin
(``Trace.base_time_ns``: Kineto ``baseTimeNanoseconds``, nsys ``TARGET_INFO_SESSION_START_TIME``). The log is
read by :func:`traceanalyzer.loaders.power_log.read_power_log`; this module only aligns it.
"""

from __future__ import annotations

import re
from dataclasses import replace
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


#: UTC offsets a local-time log may carry, seconds (every quarter hour from UTC−12 to UTC+14).
UTC_OFFSETS_S = tuple(q * 900 for q in range(-12 * 4, 14 * 4 + 1))


def _covered(log_ns: np.ndarray, windows: dict[int, tuple[int, int]], shift_ns: int) -> int:
    """Samples of the log, shifted by ``-shift_ns``, that fall inside any capture window."""
    shifted = log_ns - shift_ns
    return int(sum(((shifted >= lo) & (shifted <= hi)).sum() for lo, hi in windows.values()))


def power_aligned(log: PowerLog, windows_utc_ns: dict[int, tuple[int, int]], utc_offset_s: int | None = None,
                  names: dict[int, str | None] | None = None) -> dict[str, Any]:
    """:func:`power_during` with the log's time zone settled: ``utc_offset_s`` when given (the log's local time
    minus UTC, e.g. 3600 for UTC+1); else UTC when that matches samples, else the quarter-hour offset
    (:data:`UTC_OFFSETS_S`) under which the most samples fall inside the capture windows — nvidia-smi writes local
    time without a zone. Every GPU gets its ``name`` (from the trace); a log that matches no sample says so in
    ``warning``."""
    stamps = log.samples["utc_ns"].to_numpy(dtype=np.int64)
    detected = False
    offset = utc_offset_s
    if offset is None:
        offset = 0
        if _covered(stamps, windows_utc_ns, 0) == 0:
            counts = {o: _covered(stamps, windows_utc_ns, o * 1_000_000_000) for o in UTC_OFFSETS_S}
            best = max(counts.values())
            winners = [o for o, n in counts.items() if n == best]
            if best > 0 and len(winners) == 1:
                offset, detected = winners[0], True
    shifted = replace(log, samples=log.samples.assign(utc_ns=stamps - offset * 1_000_000_000))
    out = power_during(shifted, windows_utc_ns)
    hours, rest = divmod(abs(offset), 3600)
    zone = "UTC" if offset == 0 else f"UTC{'+' if offset > 0 else '-'}{hours:02d}:{rest // 60:02d}"
    out["assumed_timezone"] = zone
    out["utc_offset_s"] = offset
    out["timezone_source"] = "given" if utc_offset_s is not None else "detected from the capture window" \
        if detected else "assumed (UTC)"
    for g in out["gpus"]:
        g["name"] = (names or {}).get(g["gpu"])
    if not out["matched"]:
        lo, hi = (int(stamps.min()), int(stamps.max())) if len(stamps) else (0, 0)
        cap_lo = min(w[0] for w in windows_utc_ns.values())
        cap_hi = max(w[1] for w in windows_utc_ns.values())
        out["warning"] = (f"{Path(log.path).name}: no power sample falls inside the capture window "
                          f"({_utc(cap_lo)} – {_utc(cap_hi)} UTC) at any time zone; the log covers {_utc(lo)} – "
                          f"{_utc(hi)} as written")
    elif detected:
        out["warning"] = (f"{Path(log.path).name}: timestamps read as local time {zone} (no sample matched them as "
                          "UTC); pass the zone explicitly if that is wrong")
    return out


_FIXED_ZONE = re.compile(r"^(?:UTC|GMT)?\s*([+-])(\d{1,2})(?::?(\d{2}))?$", re.IGNORECASE)


def zone_offset_s(zone: str, local_ns: int) -> int:
    """The offset in seconds (local − UTC) of ``zone`` at the local wall-clock time ``local_ns`` (ns since the epoch
    as if it were UTC, as :func:`~traceanalyzer.loaders.power_log.read_power_log` reads nvidia-smi's stamps):
    ``UTC``, ``UTC+01:00``, ``+0530``, ``-3``, or an IANA name (``Europe/Berlin``, daylight saving applied).
    ValueError for anything else."""
    import datetime as _dt

    text = zone.strip()
    if text.upper() in ("UTC", "GMT", "Z"):
        return 0
    if m := _FIXED_ZONE.match(text):
        sign = 1 if m.group(1) == "+" else -1
        hours, minutes = int(m.group(2)), int(m.group(3) or 0)
        if hours > 14 or minutes >= 60:
            raise ValueError(f"time zone offset out of range: {zone!r}")
        return sign * (hours * 3600 + minutes * 60)
    try:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        info = ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"unknown time zone {zone!r} (use UTC±HH:MM or an IANA name such as Europe/Berlin)") \
            from exc
    naive = _dt.datetime(1970, 1, 1) + _dt.timedelta(microseconds=local_ns // 1000)
    offset = naive.replace(tzinfo=info).utcoffset()
    return int(offset.total_seconds()) if offset is not None else 0


def _utc(ns: int) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
