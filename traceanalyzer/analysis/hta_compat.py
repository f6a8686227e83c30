"""HolisticTraceAnalysis 0.5.0 compatible temporal breakdown and comm/comp overlap (``summary --hta-compat``).

Reproduces ``TraceAnalysis.get_temporal_breakdown()`` and ``get_comm_comp_overlap()`` of HTA 0.5.0 (read from its
source: ``hta/common/trace_parser.py``, ``hta/common/trace.py``, ``hta/analyzers/breakdown_analysis.py``,
``communication_analysis.py``, ``hta/utils/utils.py``) so users can compare numbers. Its conventions:

* **µs**: a fractional (ns-resolution) trace has every event rounded inward in float64, as HTA does —
  ``ts = ceil(ts_us)``, ``end = floor(ts_us + dur_us)`` — so an event shorter than 1 µs can get a zero or
  negative length; integer-µs traces are unchanged.
* **GPU events** = kernels + memcpy + memset of the rank's file (every device of the file together).
* **last ProfilerStep dropped**: when the trace set names more than one ``ProfilerStep`` overall, a GPU event is
  kept only if the host event sharing its correlation id (the launch) starts before the start of the rank's last
  ProfilerStep; an event without a correlation id is kept if it starts before it.
* **kernel time** = last end − first start of the kept GPU events; **idle** = kernel time − their merged length;
  **compute** = merged length of kernels whose name does not match HTA's
  ``(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)`` nor ``^dma``; **non-compute** = kernel − compute − idle.
* **overlap %** = time with both a communication kernel (``^nccl.*Kernel``) and a compute kernel running /
  merged communication time, rounded to 2 decimals (``None`` without NCCL kernels).

HTA merges intervals by sorting on start and opening a group where a start exceeds every earlier end; that
exact procedure is reproduced (not :mod:`.intervals`, which drops empty intervals), so sub-µs rounding artefacts
count as they do in HTA.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model.trace import Table, Trace

COMM_RE = re.compile(r"^nccl.*Kernel")  # hta.utils.utils.NCCL_KERNEL_RE
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")  # MEMORY_KERNEL_RE
NON_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")  # NCCL_COMPUTE_KERNEL_RE
STEP_MARK = "ProfilerStep"
#: The optional tables these numbers read (kernels are always loaded): load only these.
HTA_TABLES = frozenset({"memops", "api_calls", "ranges"})


@dataclass
class HtaRank:
    """HTA's per-rank numbers (µs), with what was counted."""

    rank: int
    path: str
    kernel_us: int | None
    idle_us: int | None
    compute_us: int | None
    non_compute_us: int | None
    comm_us: int | None
    overlap_pct: float | None
    gpu_events: int
    gpu_events_dropped: int
    last_step: str | None

    def pct(self, part: int | None) -> float | None:
        """``part`` as % of kernel time, rounded to 2 decimals like HTA's ``*_pctg`` columns."""
        if part is None or not self.kernel_us:
            return None
        return hta_pct(part, self.kernel_us)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "kernel_us": self.kernel_us, "idle_us": self.idle_us,
            "compute_us": self.compute_us, "non_compute_us": self.non_compute_us, "overlap_pct": self.overlap_pct,
            "idle_pct": self.pct(self.idle_us), "compute_pct": self.pct(self.compute_us),
            "non_compute_pct": self.pct(self.non_compute_us), "comm_us": self.comm_us,
            "gpu_events": self.gpu_events, "gpu_events_dropped": self.gpu_events_dropped,
            "last_step_dropped": self.last_step, "trace": self.path,
        }


@dataclass
class HtaCompatResult:
    """The ``--hta-compat`` result: one row per rank file, in rank order."""

    ranks: list[HtaRank]
    last_step_filter: bool
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": [r.to_json() for r in self.ranks],
            "conventions": "HolisticTraceAnalysis 0.5.0: µs, ns rounded inward, last ProfilerStep dropped "
                           "(when more than one), comm = ^nccl.*Kernel, memcpy/memset non-compute, per rank",
            "last_step_filter": self.last_step_filter,
            "notes": list(self.notes),
        }


def hta_compat_traces(traces: Sequence[Trace]) -> HtaCompatResult:
    """HTA's numbers for already loaded traces (Kineto, at least :data:`HTA_TABLES`), one per rank; files are
    loaded by :func:`traceanalyzer.pipeline.summarize.hta_compat`."""
    step_names = set().union(*(_step_names(t) for t in traces)) if traces else set()
    filter_steps = len(step_names) > 1  # HTA filters only when its symbol table has several ProfilerStep names
    rows = [_rank_numbers(t, i, filter_steps) for i, t in enumerate(traces)]
    rows.sort(key=lambda r: (r.rank, r.path))
    notes = [] if filter_steps else ["fewer than two ProfilerStep names: no step filtering (as HTA)"]
    notes += [f"{r.path}: no ProfilerStep in this rank, nothing kept" for r in rows
              if filter_steps and r.last_step is None]
    return HtaCompatResult(rows, filter_steps, notes)


# -- per rank -------------------------------------------------------------------------------------------------
def _step_names(trace: Trace) -> set[str]:
    ids = np.unique(trace.ranges["name_id"])
    return {trace.strings[i] for i in ids.tolist() if i >= 0 and STEP_MARK in trace.strings[i]}


def _rank_of(trace: Trace, index: int) -> int:
    ranks = [d.rank for d in trace.devices if d.rank is not None and d.rank >= 0]
    if ranks:
        return ranks[0]
    known = trace.kernels["rank"][trace.kernels["rank"] >= 0]
    return int(known[0]) if len(known) else index


def _rank_numbers(trace: Trace, index: int, filter_steps: bool) -> HtaRank:
    kernels, memops, syncs = trace.kernels, trace.memops, _stream_syncs(trace)
    start, end = hta_us(np.concatenate([kernels["start_ns"], memops["start_ns"], syncs["start_ns"]]),
                        np.concatenate([kernels["end_ns"], memops["end_ns"], syncs["end_ns"]]))
    corr = np.concatenate([kernels["correlation"], memops["correlation"], syncs["correlation"]])
    name_id = np.concatenate([kernels["name_id"], memops["name_id"], syncs["name_id"]])
    keep = np.ones(len(start), dtype=bool)
    last_step = None
    if filter_steps:
        keep, last_step = _launched_before_last_step(trace, start, corr)
    start, end, name_id = start[keep], end[keep], name_id[keep]
    base = HtaRank(_rank_of(trace, index), trace.path, None, None, None, None, None, None,
                   int(keep.sum()), int((~keep).sum()), last_step)
    if len(start) == 0:
        return base
    comm, compute = _kernel_types(trace, name_id)
    busy_s, busy_e = hta_merge(start, end)
    kernel_us = int(busy_e[-1] - busy_s[0])
    idle_us = kernel_us - int((busy_e - busy_s).sum())
    comp = hta_merge(start[compute], end[compute])
    comm_u = hta_merge(start[comm], end[comm])
    compute_us = int((comp[1] - comp[0]).sum())
    comm_us = int((comm_u[1] - comm_u[0]).sum())
    base.kernel_us, base.idle_us, base.compute_us = kernel_us, idle_us, compute_us
    base.non_compute_us = kernel_us - compute_us - idle_us
    base.comm_us = comm_us
    base.overlap_pct = hta_pct(hta_overlap(comm_u, comp), comm_us) if comm_us else None
    return base


def _stream_syncs(trace: Trace) -> Table:
    """Kineto ``cuda_sync`` events on a stream (Stream Wait Event, Stream Sync): HTA keeps every event whose
    ``stream`` is not -1 as a GPU event, so these count like kernels (device-wide syncs have stream -1)."""
    r = trace.ranges
    kind = trace.strings.get("cuda_sync")
    return r.take((r["kind_id"] == kind) & (r["stream"] >= 0)) if kind >= 0 else r.take(np.zeros(len(r), bool))


def _launched_before_last_step(trace: Trace, gpu_start_us: np.ndarray,
                               corr: np.ndarray) -> tuple[np.ndarray, str | None]:
    """HTA's ``_filter_irrelevant_gpu_kernels``: GPU events whose launching host event precedes the last step."""
    ranges = trace.ranges
    names = trace.strings
    step_ids = [i for i in np.unique(ranges["name_id"]).tolist() if i >= 0 and STEP_MARK in names[i]]
    is_step = np.isin(ranges["name_id"], step_ids)
    if not is_step.any():
        return np.zeros(len(gpu_start_us), dtype=bool), None
    step_start, _ = hta_us(ranges["start_ns"][is_step], ranges["end_ns"][is_step])
    last = int(np.argmax(step_start))
    last_start = step_start[last]
    api, rng = trace.api_calls, ranges
    host_corr = np.concatenate([api["correlation"], rng["correlation"]])
    host_start, _ = hta_us(np.concatenate([api["start_ns"], rng["start_ns"]]),
                           np.concatenate([api["end_ns"], rng["end_ns"]]))
    launched = np.unique(host_corr[(host_start < last_start) & (host_corr >= 0)])
    keep = np.where(corr >= 0, np.isin(corr, launched), gpu_start_us < last_start)
    return keep, names[int(ranges["name_id"][is_step][last])]


def _kernel_types(trace: Trace, name_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Masks (communication, computation) by HTA's regexes, evaluated once per distinct name."""
    ids, inverse = np.unique(name_id, return_inverse=True)
    texts = [trace.strings[i] if i >= 0 else "" for i in ids.tolist()]
    comm = np.array([COMM_RE.match(s) is not None for s in texts], dtype=bool)
    compute = np.array([not comm_ and MEMORY_RE.match(s) is None and NON_COMPUTE_RE.match(s) is None
                        for s, comm_ in zip(texts, comm.tolist(), strict=True)], dtype=bool)
    return comm[inverse], compute[inverse]


# -- HTA's arithmetic -----------------------------------------------------------------------------------------
def hta_us(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer µs ``(ceil(ts), floor(ts + dur))`` computed on float64 µs exactly as HTA's parser does.

    ``ts`` is rebuilt as the float64 nearest to the written µs value (whole µs + ns fraction, one rounding) and
    ``dur`` likewise; their float sum is what HTA floors. Whole-µs events come back unchanged.
    """
    s = np.asarray(start_ns, dtype=np.int64)
    e = np.asarray(end_ns, dtype=np.int64)
    ts_f = (s // 1000).astype(np.float64) + (s % 1000) / 1000.0
    dur_f = (e - s).astype(np.float64) / 1000.0
    return np.ceil(ts_f).astype(np.int64), np.floor(ts_f + dur_f).astype(np.int64)


def hta_pct(part: int, whole: int) -> float:
    """``round(100 * (part / whole), 2)`` in the order and with the rounding (numpy's) HTA's pandas code uses."""
    return float(np.round(100 * np.float64(part / whole), 2))


def hta_merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``hta.utils.utils.merge_kernel_intervals``: sort by start; a start beyond every earlier end opens a group;
    each group spans (min start, max end). Zero/negative-length intervals are kept, as in HTA."""
    if len(start) == 0:
        return start[:0], end[:0]
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    group_end = np.full(len(first), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(group_end, group, e)
    return s[first], group_end


def hta_overlap(comm: tuple[np.ndarray, np.ndarray], comp: tuple[np.ndarray, np.ndarray]) -> int:
    """``get_comm_comp_overlap``'s sweep: comm boundaries count ±1, compute ±2; time spent at a running total
    of 3 (both active) is the overlap (µs)."""
    times = np.concatenate([comm[0], comm[1], comp[0], comp[1]])
    n, m = len(comm[0]), len(comp[0])
    delta = np.concatenate([np.ones(n), -np.ones(n), np.full(m, 2), np.full(m, -2)]).astype(np.int64)
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.cumsum(delta[order])
    both = running[:-1] == 3
    return int((times[1:] - times[:-1])[both].sum())
