"""Time breakdown of one (rank, device): busy/idle, buckets, exposed vs hidden communication, steps, layers.

Definitions (docs/ARCHITECTURE.md), all on half-open integer-ns intervals of the device:

* span = first kernel/memop start → last end; busy = union of every kernel and memop; idle = span − busy.
* bucket_ns[b] = union of bucket ``b``'s intervals (memops carry their own bucket: ``memory``, or
  ``communication`` for peer-to-peer copies). bucket_exclusive_ns splits busy by precedence
  (``figures.exclusive_precedence``, first claims first) so the parts add up to busy exactly.
* comm = union of communication kernels and peer copies. hidden = comm ∩ union(non-communication **kernels**) —
  memory copies run on copy engines and leave the SMs idle, so they do not hide communication. exposed =
  comm − hidden (the SM-idle time during collectives). overlap_pct = 100 · hidden / comm.
* Per step (windows from :mod:`.steps`): the same quantities restricted to the window. ``step_ns_median`` is the
  median step window length and ``comm_exposed_per_step_ns`` the **median** of the per-step exposed comm (a
  median resists a warm-up or profiler-flush step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..classify.demangle import display_names
from ..classify.rules import rule_set
from ..model.buckets import EXCLUSIVE_PRECEDENCE
from ..model.errors import BadInputError
from ..model.trace import Table, Trace
from .activity import LAUNCH_COLUMNS, DeviceActivity, gather
from .collectives import collective_instances
from .grouped import distinct, run_quantile, sorted_runs
from .moe import device_moe
from .numeric import intervals as iv
from .numeric.frames import array_of, empty_frame, frame
from .results import DeviceFigures, DeviceSummary
from .structure.layers import DEFAULT_LAYER_PATTERN, Layers, layer_table
from .structure.steps import StepStructure, annotation_names, find_steps, has_range
from .what_if.range import HostEvents, host_event_counts

if TYPE_CHECKING:
    from .summary import SummaryOptions

TOP_KERNEL_COLUMNS = ["bucket", "subbucket", "name", "display_name", "rule", "count", "total_ns", "mean_ns", "p50_ns",
                      "p99_ns"]
GAP_COLUMNS = ["start_ns", "end_ns", "duration_ns", "step", "layer"]


def _bucket_sets(act: DeviceActivity) -> dict[str, iv.Intervals]:
    """Union of every bucket present on the device (kernels and memops together), in order of first appearance
    (kernels, then memops); one bucket at a time, so the temporaries are those of the largest bucket."""
    k, m = act.kernels, act.memops
    k_codes, k_names = _factorized(act.trace, k, lambda: act.kernel_bucket)
    m_codes, m_names = _factorized(act.trace, m, lambda: act.memop_bucket)
    k_code = {str(b): c for c, b in enumerate(k_names)}
    m_code = {str(b): c for c, b in enumerate(m_names)}
    sets = {}
    for bucket in dict.fromkeys([*k_code, *m_code]):
        in_k = k_codes == k_code.get(bucket, -1)
        in_m = m_codes == m_code.get(bucket, -1)
        sets[bucket] = iv.union(np.concatenate((k["start_ns"][in_k], m["start_ns"][in_m])),
                                np.concatenate((k["end_ns"][in_k], m["end_ns"][in_m])))
    return sets


def _factorized(trace: Trace, table: Table, bucket: Callable[[], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize`` of the rows' bucket strings (``bucket()``) — of their string ids when every row has one
    (the same codes and order: one id per string), which hashes integers instead of strings."""
    if "bucket_id" in table and len(table) and int(table["bucket_id"].min()) >= 0:
        codes, ids = pd.factorize(table["bucket_id"])
        return codes, trace.names(np.asarray(ids))
    codes, names = pd.factorize(bucket(), use_na_sentinel=False)
    return codes, np.asarray(names, dtype=object)


def _claim_order(sets: dict[str, iv.Intervals], order: tuple[str, ...]) -> list[str]:
    """The buckets present in the order they claim busy time: the stated precedence, then the others by name."""
    return [*[b for b in order if b in sets], *sorted(b for b in sets if b not in order)]


def _exclusive(sets: dict[str, iv.Intervals], order: tuple[str, ...],
               busy: iv.Intervals | Callable[[], iv.Intervals],
               windows: iv.Intervals | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """The exclusive split of busy time: each bucket gets the busy time no bucket before it claimed, over the whole
    device and (``windows``, a union) inside the windows (``{}`` without them).

    Every bucket's union lies inside busy, which is the union of them all, so "busy minus the buckets before it,
    intersected with it" has the length ``|C_i| - |C_(i-1)|`` with ``C_i`` the union of the first ``i`` buckets:
    one growing union, merged a bucket at a time, instead of a difference per bucket; the last ``C`` is busy
    itself, not merged. ``sets`` is consumed: each bucket's union leaves it once merged; ``busy`` may be a
    function that builds it, called only after the last merge is let go."""
    whole: dict[str, int] = {}
    within: dict[str, int] = {}
    claimed = iv.empty()
    before = before_within = 0
    claim = _claim_order(sets, order)
    for i, bucket in enumerate(claim):
        if i < len(claim) - 1:
            claimed = iv.merge_unions(claimed, sets.pop(bucket))
        else:
            del sets[bucket], claimed
            claimed = busy() if callable(busy) else busy
        now = iv.lengths_sum(claimed)
        whole[bucket], before = now - before, now
        if windows is not None:
            now_within = int(iv.measure_within(claimed, *windows).sum())
            within[bucket], before_within = now_within - before_within, now_within
    return whole, within


def top_kernels(act: DeviceActivity, rows: np.ndarray | None = None) -> pd.DataFrame:
    """Per kernel name: count, total/mean/p50/p99 duration, with bucket, sub-bucket and matching rule; of the
    kernels ``rows`` (a boolean mask) when given, else of all. ``display_name`` is the name demangled where the
    trace left it mangled (``_Z…``)."""
    used = [c for c in ("name_id", "start_ns", "end_ns", "bucket_id", "subbucket_id", "rule_id") if c in act.kernels]
    k = Table("kernels", {c: act.kernels[c] for c in used})
    k = k if rows is None else k.take(np.flatnonzero(rows))
    if len(k) == 0:
        return empty_frame(TOP_KERNEL_COLUMNS)
    name_id = np.asarray(k["name_id"])
    dur = np.asarray(k["end_ns"] - k["start_ns"], dtype=np.int64)
    ids, first_row, by_dur, first = sorted_runs(name_id, dur)
    count = np.diff(np.r_[first, len(by_dur)]).astype(np.int64)
    total = np.add.reduceat(by_dur, first).astype(np.int64)
    p50, p99 = run_quantile(by_dur, first, 0.5), run_quantile(by_dur, first, 0.99)
    trace = act.trace
    names = trace.names(ids)
    # rows in order of each name's first kernel, then by total time (descending) and name, as a stable sort
    rank = sorted(np.argsort(first_row, kind="stable").tolist(),
                  key=lambda i: (-int(total[i]), names[i] is None, names[i] or ""))
    sel = np.asarray(rank, dtype=np.int64)
    at = first_row[sel]

    def column(name: str) -> np.ndarray:
        return trace.names(k[name][at]) if name in k else np.full(len(at), None, dtype=object)

    return frame({"bucket": column("bucket_id"), "subbucket": column("subbucket_id"),
                  "name": names[sel], "display_name": display_names(names[sel].tolist()),
                  "rule": column("rule_id"), "count": count[sel], "total_ns": total[sel],
                  "mean_ns": total[sel] / count[sel], "p50_ns": p50[sel], "p99_ns": p99[sel]}, TOP_KERNEL_COLUMNS)


def comm_idle_gaps(exposed: iv.Intervals, steps: pd.DataFrame, layers: Layers) -> pd.DataFrame:
    """The exposed-communication segments, labelled with the step and layer windows holding their start."""
    s, e = exposed
    return frame({
        "start_ns": s, "end_ns": e, "duration_ns": e - s,
        "step": iv.window_ids(s, array_of(steps, "start_ns"), array_of(steps, "end_ns"), array_of(steps, "step")),
        "layer": layers.layer_at(s),
    }, GAP_COLUMNS)


def _streams(act: DeviceActivity) -> tuple[list[int], list[int], bool, float | None]:
    k = act.kernels
    comm_streams = sorted({int(x) for x in distinct(np.r_[k["stream"][act.kernel_is_comm],
                                                           act.memops["stream"][act.memop_is_comm]])})
    compute_streams = sorted(int(x) for x in distinct(k["stream"][~act.kernel_is_comm]))
    shared = np.isin(k["stream"], compute_streams) & act.kernel_is_comm
    serialized = bool(shared.any())
    comm_total = iv.lengths_sum(act.comm)
    on_shared = iv.total(k["start_ns"][shared], k["end_ns"][shared])
    pct = 100.0 * on_shared / comm_total if comm_total else None
    return comm_streams, compute_streams, serialized, pct


def in_steps(act: DeviceActivity, windows: iv.Intervals, exclusive: dict[str, int], whole_top: pd.DataFrame | None,
             numbers: bool = True) -> tuple[dict[str, Any], pd.DataFrame]:
    """The headline numbers over the step windows only (warm-up, setup and the time between steps left out):
    window (sum of step lengths), busy, busy %, the exclusive bucket split (``exclusive``: :func:`_exclusive`
    within the ``windows``, the union of the steps), and the top kernels of the kernels starting inside a step,
    each with its whole-window total beside it. Without ``numbers`` the numbers are ``{}``; without ``whole_top``
    (None) the table is empty. ``whole_top``: :func:`top_kernels` of all the device's kernels (the steps' own
    table when every kernel starts inside a step)."""
    if whole_top is None and not numbers:
        return {}, empty_frame(TOP_KERNEL_COLUMNS)
    inside = iv.window_of(act.kernels["start_ns"], windows[0], windows[1]) >= 0
    if whole_top is not None:
        top = whole_top.copy() if inside.all() else top_kernels(act, inside)
        whole = dict(zip(whole_top["name"].tolist(), whole_top["total_ns"].tolist(), strict=True))
        top["window_total_ns"] = np.array([whole.get(n, 0) for n in top["name"].tolist()], dtype=np.int64) \
            if len(top) else []
    else:
        top = empty_frame(TOP_KERNEL_COLUMNS)
    if not numbers:
        return {}, top
    window_ns = iv.lengths_sum(windows)
    busy_ns = int(iv.measure_within(act.busy, *windows).sum())  # = |busy ∩ windows|: the windows are disjoint
    lo, hi = act.span
    return {"window_ns": window_ns, "busy_ns": busy_ns, "idle_ns": window_ns - busy_ns,
            "busy_pct": 100.0 * busy_ns / window_ns if window_ns else None,
            # the device's span that belongs to no step (warm-up, partial passes, gaps at the ends), and its busy part
            "outside_ns": max(hi - lo - window_ns, 0), "busy_outside_ns": max(iv.lengths_sum(act.busy) - busy_ns, 0),
            "bucket_exclusive_ns": {b: v for b, v in exclusive.items() if v}, "kernels": int(inside.sum())}, top


def _layers_per_step(table: pd.DataFrame) -> int:
    """The typical number of layers in a step (median over steps holding any), 0 without layers."""
    in_steps = table[table["step"] >= 0] if len(table) else table
    if len(in_steps) == 0:
        return 0
    return int(np.median(in_steps.groupby("step").size().to_numpy()))


def _median(values: pd.Series) -> int | None:
    return int(np.median(values.to_numpy())) if len(values) else None


def _device_name(act: DeviceActivity) -> str | None:
    for info in act.trace.devices:
        if info.device == act.device and (info.rank is None or info.rank == act.rank or act.rank < 0):
            return info.name
    return None


def analyze_device(trace: Trace, rank: int, device: int, *, steps: pd.DataFrame | None = None,
                   layers: Layers | None = None, options: SummaryOptions | None = None) -> DeviceSummary:
    """Every per-device number of :class:`DeviceSummary` for ``(rank, device)`` of a classified trace.

    ``steps`` (columns step, start_ns, end_ns, source) and ``layers`` override the detected ones; ``options``
    supplies ``step_range``, ``layer_pattern`` and ``skip``. :func:`device_work` with the layers kept beside.
    """
    return device_work(trace, rank, device, steps=steps, layers=layers, options=options).summary


#: A device of a summary: (trace path, rank, device).
DeviceKey = tuple[str, int, int]

def device_key(dev: DeviceSummary) -> DeviceKey:
    """The (trace path, rank, device) of a device's summary."""
    return dev.trace, dev.rank, dev.device


@dataclass
class DeviceState:
    """What later work on the same trace reads beside a device's :class:`DeviceSummary` (working state, never in
    a Summary): its ``activity`` (the kernel and memop views it was analysed from: the what-if, the findings
    evidence, the export's rows, the diff's kernel groups), its ``layering`` (the layer of each kernel) and its
    ``host_events`` (the what-if's and the findings' profiler weighing)."""

    activity: DeviceActivity
    layering: Layers
    host_events: HostEvents


@dataclass
class DeviceWork:
    """A device's results (:class:`DeviceSummary`) and its working state (:class:`DeviceState`)."""

    summary: DeviceSummary
    state: DeviceState


def device_work(trace: Trace, rank: int, device: int, *, steps: pd.DataFrame | None = None,
                layers: Layers | None = None, options: SummaryOptions | None = None) -> DeviceWork:
    """:func:`analyze_device`, phase by phase: the steps, the layers, communication (hidden, exposed, the
    collectives), the buckets (unions, exclusive split), the kernel tables. Each phase lets go of the derived
    columns it read last (``DeviceActivity.forget``), so a device's peak holds one phase's unions at a time."""
    act = gather(trace, rank, device)
    layer_pattern = getattr(options, "layer_pattern", DEFAULT_LAYER_PATTERN)
    skip: frozenset[str] = getattr(options, "skip", frozenset())  # SummaryOptions.skip
    structure, warnings = _step_structure(act, steps, getattr(options, "step_range", None), layer_pattern)
    steps = structure.windows
    lo, hi = act.span  # from the busy union the steps were found with, before the layers let it go
    busy_ns = iv.lengths_sum(act.busy)
    if layers is None:
        layers = layer_table(act, steps, layer_pattern, numbers="layer_numbers" not in skip)
    act.forget(*LAUNCH_COLUMNS)  # read by the steps and layers only
    comm = _communication(act, steps, layers, gaps="comm_idle_gaps" not in skip)
    windows = iv.union(steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64))
    buckets = _buckets(act, steps, windows, skip)
    per_step = frame({**_step_columns(steps), "busy_ns": buckets.busy_per_step,
                      "idle_ns": (array_of(steps, "end_ns", np.int64) - array_of(steps, "start_ns", np.int64))
                      - buckets.busy_per_step, **comm.per_step, **buckets.per_step})
    moe = None if "moe" in skip else device_moe(act, steps, layers, rule_set(getattr(options, "rules", None)))
    comm_streams, compute_streams, serialized, on_shared_pct = _streams(act)
    whole_top = None if "top_kernels" in skip else top_kernels(act)
    step_numbers, step_top = in_steps(act, windows, buckets.within, whole_top, numbers="in_steps" not in skip)
    act.forget_derived()  # the unions and launch columns: rebuilt if the findings read them
    summary = DeviceSummary(
        rank=int(rank), device=int(device), name=_device_name(act), trace=str(trace.path),
        span_ns=hi - lo, busy_ns=busy_ns, idle_ns=(hi - lo) - busy_ns,
        bucket_ns=buckets.bucket_ns,
        bucket_exclusive_ns={} if "bucket_exclusive" in skip else buckets.exclusive,
        comm_ns=comm.comm_ns, comm_hidden_ns=comm.hidden_ns, comm_exposed_ns=comm.comm_ns - comm.hidden_ns,
        overlap_pct=100.0 * comm.hidden_ns / comm.comm_ns if comm.comm_ns else None,
        steps=len(steps), step_ns_median=_median(per_step["duration_ns"]),
        comm_exposed_per_step_ns=_median(per_step["comm_exposed_ns"]),
        step_source=structure.source, layer_source=layers.source, step_confidence=structure.confidence,
        step_evidence=structure.evidence, layers_per_step=_layers_per_step(layers.table),
        comm_streams=comm_streams, compute_streams=compute_streams, comm_serialized_with_compute=serialized,
        per_step=per_step, per_layer=layers.table, collectives=comm.collectives,
        top_kernels=empty_frame(TOP_KERNEL_COLUMNS) if whole_top is None else whole_top,
        top_kernels_in_steps=step_top, in_steps=step_numbers, comm_idle_gaps_ns=comm.gaps,
        figures=DeviceFigures(exclusive_precedence=tuple(buckets.claim_order),
                              comm_on_compute_stream_pct=on_shared_pct, kernels=len(act.kernels),
                              memops=len(act.memops), window_ns=(lo, hi), layers=len(layers.table),
                              warnings=tuple(warnings)),
        moe=moe,
    )
    return DeviceWork(summary, DeviceState(act, layers, host_event_counts(trace, rank, per_step)))


def _step_structure(act: DeviceActivity, given: pd.DataFrame | None, step_range: str | None,
                    layer_pattern: str | None) -> tuple[StepStructure, list[str]]:
    """The steps phase: the step windows (``given``, else found: :func:`~.steps.find_steps`), and a warning when
    ``step_range`` names a range that launched no GPU work (:class:`BadInputError` when the trace has no such
    range at all)."""
    trace = act.trace
    if given is None:
        structure = find_steps(act, step_range, layer_pattern)
    else:
        structure = StepStructure(given, str(given["source"].iloc[0]) if len(given) else "none", "high",
                                  {"method": "given"})
    steps = structure.windows
    warnings: list[str] = []
    if step_range and len(steps) and not str(steps["source"].iloc[0]).startswith("nvtx:"):
        if not has_range(trace, step_range):
            names = annotation_names(trace)
            raise BadInputError(trace.path, f"--step-range {step_range!r} matches no range in the trace",
                                f"ranges it has: {', '.join(names)}" if names else
                                "it has no NVTX / record_function ranges; leave --step-range out")
        warnings.append(f"rank {act.rank} GPU {act.device}: no range named {step_range!r} launched GPU work; "
                        f"steps from {steps['source'].iloc[0]} instead")
    return structure, warnings


def _step_columns(steps: pd.DataFrame) -> dict[str, np.ndarray]:
    ws, we = array_of(steps, "start_ns", np.int64), array_of(steps, "end_ns", np.int64)
    return {"step": array_of(steps, "step", np.int64), "start_ns": ws, "end_ns": we, "duration_ns": we - ws}


@dataclass
class _Communication:
    """The communication phase: totals, per step window (``comm_ns``, ``comm_hidden_ns``, ``comm_exposed_ns``
    columns), the collective instances and the exposed segments."""

    comm_ns: int
    hidden_ns: int
    per_step: dict[str, np.ndarray]
    collectives: pd.DataFrame
    gaps: pd.DataFrame


def _communication(act: DeviceActivity, steps: pd.DataFrame, layers: Layers, *, gaps: bool) -> _Communication:
    """hidden = comm ∩ compute (the non-communication kernels), exposed = comm − hidden, over the device and per
    step window; the collective instances; the exposed segments (``gaps``). Reads the compute union for the last
    time in a summary."""
    hidden, exposed = iv.split(act.comm, act.compute)
    collectives = collective_instances(act, steps, layers.kernel_layer(), layers.layer_at(act.memops["start_ns"]))
    act.forget("compute")
    ws, we = array_of(steps, "start_ns", np.int64), array_of(steps, "end_ns", np.int64)
    per_step = {"comm_ns": iv.measure_within(act.comm, ws, we), "comm_hidden_ns": iv.measure_within(hidden, ws, we),
                "comm_exposed_ns": iv.measure_within(exposed, ws, we)}
    return _Communication(comm_ns=iv.lengths_sum(act.comm), hidden_ns=iv.lengths_sum(hidden), per_step=per_step,
                          collectives=collectives,
                          gaps=comm_idle_gaps(exposed, steps, layers) if gaps else empty_frame(GAP_COLUMNS))


@dataclass
class _Buckets:
    """The buckets phase: each bucket's union length, the order they claim busy time, the exclusive split (whole
    device, and within the step windows), busy and each bucket's union per step window (``<bucket>_ns``)."""

    bucket_ns: dict[str, int]
    claim_order: list[str]
    exclusive: dict[str, int]
    within: dict[str, int]
    busy_per_step: np.ndarray
    per_step: dict[str, np.ndarray]


def _buckets(act: DeviceActivity, steps: pd.DataFrame, windows: iv.Intervals, skip: frozenset[str]) -> _Buckets:
    """Bucket unions (:func:`_bucket_sets`), measured whole and per step, then consumed by the exclusive split
    (:func:`_exclusive`), which builds busy again only after its largest merges."""
    sets = _bucket_sets(act)
    ws, we = array_of(steps, "start_ns", np.int64), array_of(steps, "end_ns", np.int64)
    busy_per_step = iv.measure_within(act.busy, ws, we)
    per_step = {f"{bucket}_ns": iv.measure_within(u, ws, we) for bucket, u in sorted(sets.items())}
    bucket_ns = {b: iv.lengths_sum(u) for b, u in sorted(sets.items())}
    claim_order = _claim_order(sets, EXCLUSIVE_PRECEDENCE)
    numbers = "in_steps" not in skip
    act.forget("busy")
    exclusive, within = ({}, {}) if "bucket_exclusive" in skip and not numbers else \
        _exclusive(sets, EXCLUSIVE_PRECEDENCE, lambda: act.busy, windows if numbers else None)
    return _Buckets(bucket_ns, claim_order, exclusive, within, busy_per_step, per_step)
