"""The what-if's uncertainty: the profiler's share of a rank's GPU idle time, the readings that bound the estimate,
and the range and confidence built from them (docs/METHOD_WHAT_IF.md, "Range and confidence").

Every reading is per step of the rank that sets the step; ``comm_free.estimate_comm_free`` computes the host and GPU
readings, this module weighs and bounds them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...model.call_starts import counts_between
from ...model.trace import Trace
from ..numeric.frames import array_of
from ..results import DeviceSummary, WhatIfRange

#: Host time the profiler adds per recorded host event (Kineto ``cpu_op`` range or CUDA API call): median of
#: (profiled − unprofiled step) / events per step over the host-bound H200 runs, 1.3–4.0 µs (docs/METHOD_WHAT_IF.md).
PROFILER_NS_PER_EVENT = 2_000
#: GPU idle / profiler time of a step at or below which the rank counts as made launch-bound by the profiler
#: (GPU reading alone), and at or above which as launch-bound on its own (host reading as profiled); linear between.
MARGINAL_RATIO = (1.0, 1.5)
RESOLUTION_SHARE = 0.1  # the GPU-transfer reading's error on GPU-bound runs timed with and without: −4 … +11 %
CONFIDENT_RATIO = 1.5  # confidence "high" when the range's high end is at most this many times its low end
SLOWDOWN_SHARE = 1 / 3  # host work measured up to ×1.5 slower with communication: at most 1/3 of it is comm cost
HOST_BOUND_SHARE = 0.25  # a rank whose GPU waits for the host ≥ this share of its unprofiled step is host-bound


def _by_step(per_step: pd.DataFrame, column: str, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``per_step[column]`` at each step id of ``steps`` and whether the step is there (a row of ``per_step``)."""
    ids = array_of(per_step, "step", np.int64)
    order = np.argsort(ids, kind="stable")
    pos = np.minimum(np.searchsorted(ids[order], steps), max(len(ids) - 1, 0))
    if len(ids) == 0:
        return np.zeros(len(steps), dtype=np.int64), np.zeros(len(steps), dtype=bool)
    found = ids[order][pos] == steps
    return np.where(found, array_of(per_step, column)[order][pos], 0), found


def profiler_weighing(steps: np.ndarray, trace: Trace, dev: DeviceSummary, host_part: np.ndarray,
                      as_profiled: np.ndarray, gpu_reading: np.ndarray, host_events: HostEvents | None = None
                      ) -> dict[str, np.ndarray]:
    """Per step of ``steps`` (ids, with their host part, host reading as profiled and GPU reading): ``own_ns``
    (the estimate), ``gpu_weight``, ``profiler_ns`` and ``idle_ns``. A rank the profiler made launch-bound is
    weighed toward its GPU reading by how much of its GPU idle time the profiler's recorded host events explain —
    idle ≤ ``MARGINAL_RATIO[0]`` × profiler time: the GPU reading alone; ≥ ``MARGINAL_RATIO[1]`` ×: the host
    reading as profiled (``as_profiled_ns``); linear between. Only steps whose host reading won a segment are
    weighed. ``host_events``: the device's counts from its analysis, else counted now."""
    known, counts = host_events if host_events is not None else host_event_counts(trace, dev.rank, dev.per_step)
    if len(counts):
        order = np.argsort(known, kind="stable")
        known = known[order]
        pos = np.minimum(np.searchsorted(known, steps), len(known) - 1)
        counts = np.where(known[pos] == steps, counts[order][pos], 0)
    else:
        counts = np.zeros(len(steps), dtype=np.int64)
    profiler = (counts * PROFILER_NS_PER_EVENT).astype(np.int64)
    per = dev.per_step
    idle = _by_step(per, "idle_ns", steps)[0].astype(np.float64) if {"step", "idle_ns"} <= set(per.columns) \
        else np.zeros(len(steps))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = idle / np.where(profiler > 0, profiler, np.nan)
    weight = np.clip((MARGINAL_RATIO[1] - ratio) / (MARGINAL_RATIO[1] - MARGINAL_RATIO[0]), 0, 1)
    weight = np.where(np.isnan(weight), 0.0, weight)
    gpu_weight = np.where(host_part > 0, weight, 0.0)
    own = as_profiled - gpu_weight * (as_profiled - gpu_reading)
    return {"profiler_ns": profiler, "gpu_weight": gpu_weight,
            "own_ns": np.round(np.minimum(own, as_profiled)).astype(np.int64), "idle_ns": idle.astype(np.int64)}


#: (step ids, host events a profiler recorded in each of those steps): counted by :func:`host_event_counts` in the
#: map step, while the trace still holds its API call starts (``analysis.device.DeviceState.host_events``).
HostEvents = tuple[np.ndarray, np.ndarray]


def host_event_counts(trace: Trace, rank: int, per: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per step of a device's ``per_step`` table (its ids, and a count each): the rank's host events a profiler
    records — Kineto ``cpu_op`` ranges and CUDA API calls — starting in the step window. Computed with the device's
    analysis (``DeviceState.host_events``): an nsys export's call starts are not kept past it."""
    released = trace.call_starts_released
    if released == "all" or rank in released:
        raise ValueError(f"{trace.path}: rank {rank}'s API call starts were let go after its analysis")
    if not len(per) or not {"step", "start_ns", "end_ns"} <= set(per.columns):
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    ws, we = array_of(per, "start_ns", np.int64), array_of(per, "end_ns", np.int64)
    r = trace.ranges
    cpu_op = trace.strings.get("cpu_op")
    starts = []
    if trace.api_calls_subset is not None:
        # an nsys export read for a summary keeps every call's start apart from the few calls analyses read
        counts = counts_between(trace.tables["api_start_blocks"], trace.api_starts["offset_ns"], rank, ws, we)
    else:
        counts = np.zeros(len(ws), dtype=np.int64)
        if len(trace.api_calls):
            starts.append(trace.api_calls["start_ns"][trace.api_calls["rank"] == rank])
    if len(r) and cpu_op is not None and cpu_op >= 0:
        starts.append(r["start_ns"][(r["rank"] == rank) & (r["kind_id"] == cpu_op)])
    for events in starts:  # counted per source, each sorted only when it is not already
        events = events if bool((events[1:] >= events[:-1]).all()) else np.sort(events)
        counts += np.searchsorted(events, we) - np.searchsorted(events, ws)
    return array_of(per, "step", np.int64), counts.astype(np.int64)


def upper_bounds(steps: np.ndarray, per_step: pd.DataFrame, idle: np.ndarray, profiler: np.ndarray,
                 contention: np.ndarray, host_part: np.ndarray, as_profiled: np.ndarray) -> dict[str, np.ndarray]:
    """Per step of ``steps`` (ids): ``ceiling_ns`` — the step's time that is not compute (GPU idle + exposed
    communication, plus contention): no comm-free step is shorter than its compute kernels; and
    ``slowdown_high_ns`` — the host reading plus the host work on the critical path running up to ×1.5 slower with
    communication (measured on runs timed with and without, not visible in a trace with communication):
    ``SLOWDOWN_SHARE`` × (host-critical time − the host part); the host-critical time is the step less the
    profiler's time on a rank whose GPU still idles ≥ ``HOST_BOUND_SHARE`` of it without the profiler, else that
    remaining idle time."""
    if not {"step", "comm_exposed_ns", "duration_ns"} <= set(per_step.columns):
        return {"ceiling_ns": as_profiled, "slowdown_high_ns": as_profiled}
    ceiling = np.maximum(idle + _by_step(per_step, "comm_exposed_ns", steps)[0].astype(np.int64) + contention,
                         as_profiled)
    unprofiled_step = np.maximum(_by_step(per_step, "duration_ns", steps)[0] - profiler, 0)
    remaining = np.maximum(idle - profiler, 0)
    critical = np.where(remaining >= HOST_BOUND_SHARE * unprofiled_step, unprofiled_step, remaining)
    extra = SLOWDOWN_SHARE * np.maximum(critical - host_part, 0)
    high = as_profiled + np.where(host_part > 0, extra, 0)
    return {"ceiling_ns": ceiling, "slowdown_high_ns": np.minimum(high, ceiling).astype(np.int64)}


def step_range(limiting: pd.DataFrame, point: int, basis: str) -> WhatIfRange:
    """``range_ns`` [low, high] with the reading each end comes from (``range_basis``) and a ``confidence``, from
    the per-step readings of the rank that sets each step (docs/METHOD_WHAT_IF.md):

    * low: the smallest over steps of the estimate, the whole calls without the CPU work slowed after them (where
      the host part counts) and the GPU-transfer reading (where it was weighed in);
    * high: the largest over steps of the estimate, the host reading as profiled, the host reading plus host work
      slowed by up to ×1.5 (where the host part counts), and the step's time not spent computing (where it does
      not);
    * both widened by ``RESOLUTION_SHARE`` (the GPU-transfer reading's error on runs timed with and without).

    confidence: ``low`` where a rank's readings were weighed (made launch-bound by the profiler) or the basis is
    ``mixed``; else ``high`` when high ≤ ``CONFIDENT_RATIO`` (1.5) × low; else ``medium``."""
    host = limiting["host_part_ns"] > 0
    weighed = limiting["gpu_weight"] > 0
    # on a tie the first reading named gives the end its name
    low_readings = {"gpu_transfer": limiting["gpu_reading_ns"].where(weighed),
                    "host_calls": limiting["calls_only_ns"].where(host), "estimate": limiting["own_ns"]}
    high_readings = {"host_as_profiled": limiting["as_profiled_ns"],
                     "host_slowdown": limiting["slowdown_high_ns"].where(host),
                     "gpu_not_computing": limiting["ceiling_ns"].where(~host), "estimate": limiting["own_ns"]}
    lows = {k: float(v.min()) for k, v in low_readings.items() if v.notna().any()}
    highs = {k: float(v.max()) for k, v in high_readings.items() if v.notna().any()}
    lo_basis = min(lows, key=lambda k: lows[k])
    hi_basis = max(highs, key=lambda k: highs[k])
    low = int(lows[lo_basis] * (1 - RESOLUTION_SHARE))
    high = int(np.ceil(highs[hi_basis] * (1 + RESOLUTION_SHARE)))
    unsure = bool(weighed.any()) or basis == "mixed"
    confidence = "low" if unsure else "high" if high <= CONFIDENT_RATIO * max(low, 1) else "medium"
    return WhatIfRange((min(low, point), max(high, point)), (lo_basis, hi_basis), confidence, int(weighed.sum()))
