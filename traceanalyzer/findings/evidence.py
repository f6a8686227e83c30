"""What the findings rules read from a trace, one (rank, device) at a time: :class:`DeviceEvidence`.

Every rule that needs more than the summary (kernel sequences for fusion chains, launch gaps, blocking host calls,
collective calls without kernels, Tensor Active samples) reads it through here. Each figure is computed from the
trace on first use — the local engine, where the rules run beside the traces — or all at once by
:meth:`DeviceEvidence.materialize` where the trace lives (a Dask worker), after which the evidence holds only these
compact figures and travels to the driver without the trace. Both give the rules the same numbers.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.activity import DeviceActivity, gather
from ..analysis.device import DeviceState
from ..analysis.gpu_metrics import metric_mask, phase_labels
from ..analysis.grouped import distinct
from ..analysis.host_issue import host_only_in_steps
from ..analysis.numeric.intervals import clip_to_windows, gaps, union
from ..analysis.results import DeviceSummary
from ..analysis.what_if.profiler_cost import host_events_per_step, profiler_host_ns
from ..model.api_names import GRAPH_LAUNCH, HOST_BLOCKING
from ..model.buckets import GEMM_BUCKETS
from ..model.communication import ALLREDUCE_KINDS
from ..model.trace import Trace
from .windows import kernel_mask, pct_of_step, per_step_median, step_index, step_windows, steps

# All-reduce kernels (sub-buckets in ALLREDUCE_KINDS) start a chain; already-fused all-reduce + norm kernels
# (allreduce_fusion) start none.

#: Sub-buckets of kernels a fused all-reduce (+ residual add + RMSNorm (+ quant)) kernel would absorb.
FUSABLE_SUBBUCKETS = ("norm", "elementwise", "quantize", "reduction")
#: A chain is an all-reduce + RMSNorm fusion candidate when it holds a norm kernel or, for an RMSNorm decomposed
#: into eager ops (pow → mean → add → rsqrt → mul), a reduction.
NORM_SUBBUCKETS = ("norm", "reduction")
#: Kernels of another sub-bucket that also do the norm (e.g. vLLM's ``fused_add_rms_norm_static_fp8_quant``).
NORM_NAME = re.compile(r"rms_?norm|layer_?norm", re.IGNORECASE)
#: A norm computed by several kernels (eager PyTorch's pow → mean → rsqrt → mul) holds a kernel named so: a chain
#: after any kernel other than an all-reduce counts only with one (a fused norm, a sum reduction or casts after a
#: GEMM are no add + RMSNorm to fuse)
DECOMPOSED_NORM_NAME = re.compile(r"rsqrt", re.IGNORECASE)
MAX_CHAIN = 10  # add + a decomposed RMSNorm (+ dtype copies) + quantize
#: The time of one fused add + RMSNorm kernel as a multiple of the chain's longest kernel, smallest and largest
#: (the norm fusion's range; the point takes 1): measured on H200 0.19 / 0.70 / 0.66 with a FlashInfer-style kernel
#: at 64 / 4096 / 16384 tokens (fixtures/truth/rmsnorm_fusion_h200.json), and 0.69 / 0.78 / 1.92 implied by the
#: eager / graph / prefill A/B runs of docs/METHOD_IMPACTS.md (a Triton kernel; in-sample)
FUSED_NORM_RATIO = (0.19, 2.0)

TENSOR_ACTIVE = "Tensor Active"


class DeviceEvidence:
    """The trace-derived inputs of the findings rules for one (rank, device) (module doc). ``fusion_gap_max_ns``
    and ``long_gap_min_ns`` are the rules' thresholds of the same names."""

    def __init__(self, trace: Trace, dev: DeviceSummary, *, fusion_gap_max_ns: int, long_gap_min_ns: int,
                 state: DeviceState | None = None) -> None:
        self._trace: Trace | None = trace
        self._device: DeviceSummary | None = dev
        self._state = state if state is not None and state.activity.trace is trace else None
        self.fusion_gap_max_ns = fusion_gap_max_ns
        self.long_gap_min_ns = long_gap_min_ns

    def _activity(self) -> DeviceActivity:
        """The device's activity: the one its analysis kept, else gathered from the trace."""
        dev = self._dev
        return self._state.activity if self._state is not None else gather(self.trace, dev.rank, dev.device)

    @property
    def trace(self) -> Trace:
        if self._trace is None:
            raise RuntimeError("evidence materialized without this figure")  # materialize() computes them all
        return self._trace

    @property
    def _dev(self) -> DeviceSummary:
        if self._device is None:
            raise RuntimeError("evidence materialized without this figure")
        return self._device

    def materialize(self, figures: tuple[str, ...] | None = None) -> DeviceEvidence:
        """The ``figures`` (default: every figure but the :data:`LATE_FIGURES`) computed now; the trace and the
        device let go (the object can travel). A figure left out raises when read."""
        for name in EARLY_FIGURES if figures is None else figures:
            getattr(self, name)
        chains = self.__dict__.get("chains")
        if chains is not None:
            chains.attrs.pop("followers", None)
        self.__dict__.pop("_gap_figures", None)  # held by the figures themselves now
        self._trace = self._device = self._state = None
        return self

    def absorb(self, other: DeviceEvidence) -> None:
        """Take the figures ``other`` (of the same device) has computed."""
        for name in FIGURES:
            if name in other.__dict__:
                self.__dict__[name] = other.__dict__[name]

    # -- fusion chains (fusion_rules) ---------------------------------------------------------------------------
    @cached_property
    def chains(self) -> pd.DataFrame | None:
        """:func:`unfused_chains` of the device, None when it has none (or no sub-bucket column)."""
        if "subbucket_id" not in self.trace.kernels:
            return None
        return unfused_chains(self.trace, self._dev, self.fusion_gap_max_ns)

    @cached_property
    def following_kernels(self) -> dict[str, int]:
        """The five most frequent kernel names in the chains, with their counts."""
        chains = self.chains
        if chains is None:
            return {}
        trace = self.trace
        return most_frequent_names(trace, trace.kernels["name_id"][chains.attrs["followers"]], 5)

    # -- launch-bound GPUs (host_rules.host_bound_no_cuda_graphs) -----------------------------------------------
    @cached_property
    def launch_idle(self) -> tuple[int, float]:
        """(median per step of the idle time in gaps shorter than ``long_gap_min_ns``, its % of the step): the
        launch gaps between kernels; longer gaps are the host blocked or busy elsewhere."""
        return self._gap_figures[0]

    @cached_property
    def kernels_in_steps(self) -> tuple[int, int]:
        """(median kernel duration inside steps, median number of kernels per step)."""
        k, dev = self.trace.kernels, self._dev
        mask = kernel_mask(self.trace, dev, in_steps=True)
        durations = (k["end_ns"] - k["start_ns"])[mask]
        median_kernel = int(np.median(durations)) if len(durations) else 0
        per_step = per_step_median(steps(dev), step_index(dev, k["start_ns"][mask]), np.ones(int(mask.sum())))
        return median_kernel, per_step

    @cached_property
    def graph_launched_fraction(self) -> float:
        """:func:`graph_launched_fraction` of the device."""
        return graph_launched_fraction(self.trace, self._dev)

    @cached_property
    def profiler_host(self) -> tuple[tuple[int, int, int], int]:
        """((low, point, high) host ns per step the profiler added, its recorded host events per step):
        :func:`~traceanalyzer.analysis.what_if.profiler_cost.profiler_host_ns`."""
        events = host_events_per_step(self.trace, self._dev, self._state.host_events if self._state else None)
        return profiler_host_ns(self.trace, events), events

    # -- host stalls (host_rules.idle_gaps_host_cause) ----------------------------------------------------------
    @cached_property
    def gaps_with_cause(self) -> tuple[int, int, dict[str, int]] | None:
        """:func:`gaps_with_cause` with ``long_gap_min_ns``."""
        return self._gap_figures[1]

    @cached_property
    def pass_gap(self) -> tuple[int, int]:
        """(median per step of the GPU idle gap that touches the step window's start or end: the gap between two
        forward passes, the number of steps with one)."""
        return self._gap_figures[2]

    @cached_property
    def _gap_figures(self) -> tuple[tuple[int, float], tuple[int, int, dict[str, int]] | None, tuple[int, int]]:
        """``launch_idle``, ``gaps_with_cause`` and ``pass_gap`` from one :func:`_device_gaps` (the rules read all;
        the gaps, about as many as the device's kernels, are not kept)."""
        gaps = _device_gaps(self.trace, self._dev, self._state.activity if self._state is not None else None)
        gs, ge, window = gaps
        pass_gap = _pass_gap(self._dev, gs, ge, window)
        length = ge - gs
        # the short gaps' lengths summed per step: the long ones weigh 0 (no copies of the short ones selected)
        length[length >= self.long_gap_min_ns] = 0
        idle = per_step_median(steps(self._dev), window, length)
        del length
        return (idle, pct_of_step(self._dev, idle) or 0.0), gaps_with_cause(self.trace, self._dev,
                                                                             self.long_gap_min_ns, gaps), pass_gap

    # -- collectives done on the CPU (host_rules.collectives_without_kernels) ----------------------------------
    @cached_property
    def host_only_calls(self) -> pd.DataFrame:
        """Collective calls inside steps that launch no communication kernel
        (:func:`~traceanalyzer.analysis.host_issue.host_only_in_steps`); empty without step windows."""
        dev = self._dev
        if not len(dev.per_step):
            return pd.DataFrame()
        return host_only_in_steps(self.trace, self._activity(), dev.per_step)

    # -- GPU metrics (metric_rules.low_tensor_activity) ---------------------------------------------------------
    @cached_property
    def tensor_active(self) -> tuple[float, int, dict[str, float]] | None:
        """:func:`tensor_active_in_gemms` of the device."""
        return tensor_active_in_gemms(self.trace, self._dev)


FIGURES = ("chains", "following_kernels", "launch_idle", "kernels_in_steps", "graph_launched_fraction",
           "profiler_host", "gaps_with_cause", "pass_gap", "host_only_calls", "tensor_active")
#: Figures a rule reads only for some devices, known once the what-if is done (``collectives_without_kernels``
#: looks for CPU-side collective calls where the what-if found some): computed on request, not by default.
LATE_FIGURES = ("host_only_calls",)
EARLY_FIGURES = tuple(f for f in FIGURES if f not in LATE_FIGURES)


# -- the computations ---------------------------------------------------------------------------------------------
def _id(trace: Trace, value: str) -> int:
    """String-pool id of ``value``; -2 (matching no row, unlike -1 = missing) when the trace never uses it."""
    found = trace.strings.get(value)
    return found if found >= 0 else -2


def _ids(trace: Trace, values: tuple[str, ...]) -> np.ndarray:
    return np.array([_id(trace, v) for v in values], dtype=np.int64)


def _names_match(trace: Trace, name_ids: np.ndarray, pattern: re.Pattern[str]) -> np.ndarray:
    """Per row: whether the kernel name (by string id) matches ``pattern``; each distinct name is tested once, a
    missing one (id < 0) as the text "None" (``str`` of ``trace.names``' None)."""
    return _names_matching(trace, name_ids, pattern) | ((name_ids < 0) & bool(pattern.search("None")))


def most_frequent_names(trace: Trace, ids: np.ndarray, n: int) -> dict[str, int]:
    """The ``n`` most frequent names of the string ids with their counts (``value_counts`` of the names: ties in
    order of first appearance), counted by id — one per name, met in the same order — not by text."""
    if (ids < 0).any():  # a missing name reads "None", as a name might
        names = pd.Series(trace.names(ids).astype(str))
        return {str(name): int(c) for name, c in names.value_counts().head(n).items()}
    top = pd.Series(ids).value_counts().head(n)
    return {str(name): int(c) for name, c in zip(trace.names(top.index.to_numpy()), top.tolist(), strict=True)}


def unfused_chains(trace: Trace, dev: DeviceSummary, gap_cap_ns: int) -> pd.DataFrame | None:
    """One row per chain that holds a norm (:mod:`.fusion_rules`), anchored inside a step on the kernel before
    it on its stream — an all-reduce, or any other kernel that is not itself fusable (the GEMM before the residual
    add on one GPU): ``start_ns`` (of the anchor), ``after_allreduce``, ``kernels``, ``chain_ns``, ``gap_ns``
    (g₁), ``fused_norm_ns``, ``norm_alone_ns``, ``allreduce_bound_ns``; ``followers`` (attribute
    ``attrs["followers"]``) holds the kernel indices of the chains. None when there is none."""
    k = trace.kernels
    idx = np.flatnonzero(kernel_mask(trace, dev))
    if not len(idx):
        return None
    idx = idx[np.lexsort((k["start_ns"][idx], k["stream"][idx]))]
    sub, bucket = k["subbucket_id"][idx], k["bucket_id"][idx]
    stream, start_ns, end_ns = k["stream"][idx], k["start_ns"][idx], k["end_ns"][idx]
    is_ar = (bucket == _id(trace, "communication")) & np.isin(sub, _ids(trace, ALLREDUCE_KINDS))
    fusable = (bucket == _id(trace, "other")) & np.isin(sub, _ids(trace, FUSABLE_SUBBUCKETS))
    if not fusable.any():  # no chain can hold a norm
        return None
    is_norm = fusable & (np.isin(sub, _ids(trace, NORM_SUBBUCKETS)) |
                         _names_match(trace, k["name_id"][idx], NORM_NAME))
    is_decomposed = fusable & _names_match(trace, k["name_id"][idx], DECOMPOSED_NORM_NAME)
    # anchors: a kernel that is not fusable followed on its stream by one that is (a chain's start)
    starts = np.zeros(len(idx), dtype=bool)
    starts[:-1] = ~fusable[:-1] & fusable[1:] & (stream[:-1] == stream[1:])
    ar_pos = np.flatnonzero(starts)
    ar_pos = ar_pos[step_index(dev, start_ns[ar_pos]) >= 0]
    if not len(ar_pos):
        return None
    busy = np.zeros(len(ar_pos), dtype=np.int64)
    gaps_ = np.zeros(len(ar_pos), dtype=np.int64)
    first_gap = np.zeros(len(ar_pos), dtype=np.int64)
    length = np.zeros(len(ar_pos), dtype=np.int64)
    longest = np.zeros(len(ar_pos), dtype=np.int64)
    has_norm = np.zeros(len(ar_pos), dtype=bool)
    decomposed = np.zeros(len(ar_pos), dtype=bool)
    alive = np.ones(len(ar_pos), dtype=bool)
    chain: list[tuple[np.ndarray, np.ndarray]] = []
    for offset in range(1, MAX_CHAIN + 1):
        nxt = np.minimum(ar_pos + offset, len(idx) - 1)
        alive &= (ar_pos + offset < len(idx)) & (stream[nxt] == stream[ar_pos]) & fusable[nxt]
        gap = np.where(alive, np.clip(start_ns[nxt] - end_ns[nxt - 1], 0, gap_cap_ns), 0)
        dur = np.where(alive, end_ns[nxt] - start_ns[nxt], 0)
        busy += dur
        gaps_ += gap
        if offset == 1:
            first_gap = gap
        length += alive
        longest = np.maximum(longest, dur)
        has_norm |= alive & is_norm[nxt]
        decomposed |= alive & is_decomposed[nxt]
        chain.append((nxt, alive.copy()))
    # an all-reduce + RMSNorm fusion needs the norm in the chain; after another kernel, a norm in several kernels
    found = (length > 0) & has_norm & (is_ar[ar_pos] | decomposed)
    if not found.any():
        return None
    chain_ns = busy + gaps_
    out = pd.DataFrame({
        "start_ns": start_ns[ar_pos], "after_allreduce": is_ar[ar_pos], "kernels": length, "chain_ns": chain_ns,
        "gap_ns": first_gap,
        "fused_norm_ns": longest, "norm_alone_ns": chain_ns - first_gap - longest,
        "norm_alone_low_ns": np.maximum(chain_ns - first_gap - (FUSED_NORM_RATIO[1] * longest).astype(np.int64), 0),
        "norm_alone_high_ns": chain_ns - first_gap - (FUSED_NORM_RATIO[0] * longest).astype(np.int64),
        "allreduce_bound_ns": first_gap + longest,
    })[found].reset_index(drop=True)
    out.attrs["followers"] = np.concatenate([idx[nxt[ok & found]] for nxt, ok in chain])
    return out


def _names_matching(trace: Trace, ids: np.ndarray, pattern: re.Pattern[str]) -> np.ndarray:
    """Boolean mask of rows whose string id matches ``pattern`` (regex run once per unique id)."""
    if not len(ids):
        return np.zeros(0, dtype=bool)
    valid = ids >= 0
    pool = trace.strings
    if 0 < len(pool) <= len(ids):  # every string of the pool tested: fewer than the rows' distinct ids' sort
        hit = np.array([bool(pattern.search(text)) for text in pool.values], dtype=bool)
    else:
        present = distinct(ids[valid])  # no inverse: a lookup table by id replaces it (no sort of all rows)
        hit = np.zeros(int(present[-1]) + 1 if len(present) else 1, dtype=bool)
        hit[present] = [bool(pattern.search(pool[u])) for u in present.tolist()]
    return valid & hit[np.where(valid, ids, 0)]


def graph_launched_fraction(trace: Trace, dev: DeviceSummary) -> float:
    """Share of the device's kernels that came from CUDA graphs (graph id, or launched by cudaGraphLaunch)."""
    k = trace.kernels
    mask = kernel_mask(trace, dev)
    n = int(mask.sum())
    if n == 0:
        return 0.0
    from_graph = k["graph_id"][mask] >= 0
    a = trace.api_calls
    if len(a):
        launches = _names_matching(trace, a["name_id"], GRAPH_LAUNCH)
        if launches.any():
            mine = a["pid"] == _pid_of(trace, dev)
            if not mine.any():  # Kineto: a kernel's pid is its device, a call's the process (one per file)
                mine = np.ones(len(a), dtype=bool)
            graph_corr = np.unique(a["correlation"][launches & mine])
            from_graph |= np.isin(k["correlation"][mask], graph_corr)
    g = trace.graph_launches
    graph_time = 0 if not len(g) else int((g["end_ns"] - g["start_ns"])[g["device"] == dev.device].sum())
    kernel_time = int((k["end_ns"] - k["start_ns"])[mask].sum())
    frac = float(from_graph.mean())
    if graph_time:
        frac = max(frac, graph_time / max(graph_time + kernel_time, 1))
    return frac


def _pass_gap(dev: DeviceSummary, gap_start: np.ndarray, gap_end: np.ndarray, window: np.ndarray
              ) -> tuple[int, int]:
    """(median per step, steps with one) of the idle gaps (cut to step windows) that touch their window's start or
    end: the GPU idle between one step and the next."""
    if not len(gap_start) or not len(dev.per_step):
        return 0, 0
    ws, we = step_windows(dev)
    at_edge = (gap_start <= ws[window]) | (gap_end >= we[window])
    length = np.where(at_edge, gap_end - gap_start, 0)
    with_gap = len(np.unique(window[at_edge & (length > 0)]))
    return per_step_median(steps(dev), window, length), with_gap


def _pid_of(trace: Trace, dev: DeviceSummary) -> int:
    k = trace.kernels
    pids = k["pid"][kernel_mask(trace, dev)]
    return int(np.bincount(pids - pids.min()).argmax() + pids.min()) if len(pids) else -1


def _device_gaps(trace: Trace, dev: DeviceSummary, act: DeviceActivity | None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPU idle gaps of the device (between kernels / memory operations) cut to the step windows:
    (starts, ends, step window index); ``act``: the device's activity where its analysis kept it."""
    if act is not None and dev.rank >= 0:
        s, e = act.busy  # the union below, gathered already
    else:
        k, m = trace.kernels, trace.memops
        kmask = kernel_mask(trace, dev)
        mmask = m["device"] == dev.device
        if dev.rank >= 0:
            mmask &= m["rank"] == dev.rank
        s, e = union(np.concatenate([k["start_ns"][kmask], m["start_ns"][mmask]]),
                     np.concatenate([k["end_ns"][kmask], m["end_ns"][mmask]]))
    ws, we = step_windows(dev)
    order = np.argsort(ws, kind="stable")
    lo, hi = (int(s[0]), int(e[-1])) if len(s) else (0, 0)
    gs, ge = gaps((s, e), min(lo, int(ws.min())), max(hi, int(we.max())))
    del s, e  # the union (built for this read: not cached after the device's analysis)
    gap_start, gap_end, window, _ = clip_to_windows(gs, ge, ws[order], we[order])
    return gap_start, gap_end, order[window]


def gaps_with_cause(trace: Trace, dev: DeviceSummary, min_gap_ns: int,
                    device_gaps: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                    ) -> tuple[int, int, dict[str, int]] | None:
    """Total ns and count of long idle gaps (inside step windows) overlapped by a blocking host call of the same
    process, with the names of those calls. ``device_gaps``: :func:`_device_gaps` if at hand."""
    if not len(trace.api_calls):  # no host call, none blocking
        return None
    gap_start, gap_end, _ = _device_gaps(trace, dev, None) if device_gaps is None else device_gaps  # in steps
    long_gap = (gap_end - gap_start) >= min_gap_ns
    if not long_gap.any():
        return None
    gap_start, gap_end = gap_start[long_gap], gap_end[long_gap]
    a = trace.api_calls
    blocking = _names_matching(trace, a["name_id"], HOST_BLOCKING) & (a["pid"] == _pid_of(trace, dev))
    if not blocking.any():
        return None
    c_start, c_end, c_name = a["start_ns"][blocking], a["end_ns"][blocking], a["name_id"][blocking]
    order = np.argsort(c_start, kind="stable")
    c_start, c_end, c_name = c_start[order], c_end[order], c_name[order]
    # For each gap, the calls starting before its end; any of those ending after its start overlaps it.
    hi = np.searchsorted(c_start, gap_end, side="left")
    running_max_end = np.maximum.accumulate(c_end)
    overlapped = (hi > 0) & (running_max_end[np.clip(hi - 1, 0, None)] > gap_start)
    if not overlapped.any():
        return None
    total = int((gap_end - gap_start)[overlapped].sum())
    last_call = np.clip(hi[overlapped] - 1, 0, None)
    names = pd.Series(trace.names(c_name[last_call]).astype(str)).value_counts()
    return total, int(overlapped.sum()), {str(n): int(c) for n, c in names.items()}


def tensor_active_in_gemms(trace: Trace, dev: DeviceSummary) -> tuple[float, int, dict[str, float]] | None:
    """(mean Tensor Active % over samples taken inside steps while a GEMM bucket ran, samples, mean by bucket)."""
    if not len(trace.gpu_metrics):
        return None
    g = trace.gpu_metrics
    sel = metric_mask(trace, (TENSOR_ACTIVE,)) & (g["device"] == dev.device)
    if not sel.any():
        return None
    t = g["timestamp_ns"][sel]
    inside = step_index(dev, t) >= 0
    t, values = t[inside], g["value"][sel][inside]
    phases = pd.Series(phase_labels(trace, dev.device, t))
    gemm = phases.isin(GEMM_BUCKETS).to_numpy()
    if not gemm.any():
        return None
    by_phase = pd.Series(values[gemm]).groupby(phases[gemm].to_numpy()).mean().round(1)
    return float(values[gemm].mean()), int(gemm.sum()), {str(p): float(v) for p, v in by_phase.items()}


__all__: list[Any] = ["EARLY_FIGURES", "FIGURES", "LATE_FIGURES", "DeviceEvidence", "gaps_with_cause",
                      "graph_launched_fraction", "tensor_active_in_gemms", "unfused_chains"]
