"""The dependency graph of a run: GPU operations, host calls and collective instances as numpy arrays.

Nodes (``DepGraph.kind``): every kernel and memory operation of the run's devices (``OP``), the host API calls that
launched them plus the host syncs on those threads (``HOST``), and one node per collective instance matched across
ranks (``INSTANCE``, its time the last rank's arrival). Each node has a start and an end on one common clock.

Edges run from a source point (a node's start or end) to a destination point (a node's start, or for ends that
wait on something else, its end), with a delay. A point's time is the latest of its in-edges' source time plus
delay; the traced graph keeps, per node, the ``slack`` by which the traced start exceeds that (delays are each
edge type's least latency, so the slack is what the trace shows and the dependencies do not explain). Replaying the
graph unchanged therefore gives back the traced times exactly. Edge types and where they come from (docs/
METHOD_WHATIF_SIM.md):

* ``STREAM``: the previous operation on the same (device, stream) → this one (both formats: the activity's stream
  column); from its end, or from its start where the two overlap in the trace (programmatic dependent launch).
* ``LAUNCH``: the host call that launched an operation (the runtime-API row sharing its correlation id, both
  formats) → the operation's start.
* ``HOST``: the previous host node on the same thread → this one: the CPU work between two calls.
* ``SYNC``: a GPU operation's end → the end of a host call that returned only after it: a ``cuda*Synchronize`` call,
  the call that launched it (a blocking copy), or a call held up ``BLOCKED_NS`` or more that returned right after
  a GPU operation of its thread ended (a launch waiting for room in the launch queue).
* ``EVENT``: a recorded cross-stream wait (the trace's ``stream_waits``: nsys ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION``
  stream-wait rows joined to the ``CUPTI_ACTIVITY_KIND_CUDA_EVENT`` record they wait on; Kineto ``cuda_sync``
  "Stream Wait Event" events naming their record): the last operation submitted to the recording stream before the
  record → the first one submitted to the waiting stream after the wait.
* ``WAIT``: where the trace records no waits (Kineto without ``cuda_sync`` events, nsys without CUDA event
  tracing): an operation on another stream of the device → this one, where the operation starts later than both
  its stream predecessor and its launch allow and another stream's operation ended just before (inferred).
* ``ARRIVAL`` / ``TRANSFER``: each participating rank's communication kernel start → the instance (the last arrival);
  the instance → each rank's kernel end, delayed by that rank's transfer after the last arrival.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...model.api_names import HOST_SYNC
from ...model.buckets import BUCKETS
from ...model.trace import Table, Trace
from ..activity import DeviceActivity
from ..device import DeviceKey, device_key
from ..host_issue import issue_ranges, thread_key
from ..numeric import intervals as iv
from ..results import CrossRankSummary, DeviceSummary, rank_column
from .comm_free import kernel_contention_ns
from .profiler_cost import ns_per_event

#: ``(thread, lo, hi) -> per-interval measure`` (ns covered, or events counted), one host thread per interval
IntervalMeasure = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

OP, HOST, INSTANCE = 0, 1, 2
STREAM, LAUNCH, HOSTGAP, SYNC, WAIT, ARRIVAL, TRANSFER, EVENT = range(8)
EDGE_TYPES = ("stream", "launch", "host", "sync", "wait", "arrival", "transfer", "event")
#: Bucket codes of nodes: the kernel buckets, then these.
NODE_BUCKETS = (*BUCKETS, "host", "instance")
HOST_BUCKET, INSTANCE_BUCKET = len(BUCKETS), len(BUCKETS) + 1

LATENCY_PERCENTILE = 5.0  # a device's least stream / launch latency: this percentile of the traced ones
WAIT_LATE_NS = 2_000  # an op starting this much later than its stream and launch allow waited on something else
#: a launch holds its kernel back by the least traced launch latency, at most this (a host always far ahead shows
#: no latency below its lead; CUDA's launch latency, host call to kernel start on an idle GPU, is a few µs)
LAUNCH_LATENCY_MAX_NS = 10_000
#: the least gap between two kernels of a stream, at most this: the node gap of CUDA-graph replays measured on
#: H200 (0.4 µs; 2.3 µs before an NCCL kernel, docs/METHOD_WHAT_IF.md); a launch-bound trace's gaps hide it
STREAM_LATENCY_MAX_NS = 1_000
BLOCKED_NS = 50_000  # a host call this long that returns right after a GPU op ended waited for it ...
RETURN_NEAR_NS = 20_000  # ... returning at most this long after that op's end
WAIT_NEAR_NS = 1_000_000  # ... on an op of another stream that ended at most this long before it started


@dataclass
class StepWindow:
    """One traced step of one (rank, device): its window and the ops that anchor it (common clock)."""

    rank: int
    device: int
    step: int  # the step's number as the device's analysis gave it
    ordinal: int  # its place among the device's steps
    start_ns: int
    end_ns: int
    first_op: int  # node of the first op starting in the step (its start anchors the step)
    last_op: int  # node of the op ending last in the step (its end anchors the step)


@dataclass
class DepGraph:
    """Nodes and edges of a run (all int64 ns on one clock; see the module docstring)."""

    kind: np.ndarray  # int8: OP, HOST, INSTANCE
    start_ns: np.ndarray
    end_ns: np.ndarray
    rank: np.ndarray
    device: np.ndarray  # -1 for host nodes and instances
    stream: np.ndarray  # -1 for host nodes and instances
    thread: np.ndarray  # host nodes: thread key; -1 otherwise
    bucket: np.ndarray  # int16 code into NODE_BUCKETS
    name: np.ndarray  # object: kernel / API names (None for instances)
    is_comm: np.ndarray
    is_sync: np.ndarray  # host nodes that synchronise with the GPU
    launcher: np.ndarray  # op nodes: the host node that launched it, -1 if none
    floor_ns: np.ndarray  # least duration of a node whose end has in-edges (else its duration)
    slack_ns: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    src_end: np.ndarray  # bool: the edge leaves the source's end (else its start)
    dst_end: np.ndarray  # bool: the edge enters the destination's end (else its start)
    etype: np.ndarray  # int8 into EDGE_TYPES
    delay_ns: np.ndarray
    instance_bytes: np.ndarray  # per node: bytes of an instance (-1 elsewhere)
    instance_factor: np.ndarray  # per node: NCCL bus factor of an instance (0 elsewhere)
    issue_node_ns: np.ndarray  # per node: its time inside collective calls' issuing ranges (host nodes)
    issue_edge_ns: np.ndarray  # per edge: a host gap's time inside collective calls' issuing ranges
    profiler_edge_ns: np.ndarray  # per edge: a host gap's profiler cost (recorded host events × the per-event cost)
    stream_gap_ns: np.ndarray  # per node: its device's least traced stream latency (ops; 0 elsewhere)
    contention_ns: np.ndarray  # per node: a compute kernel's excess over its median with no communication beside
    steps: list[StepWindow] = field(default_factory=list)
    stream_latency_ns: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, device) -> least gap
    clock_offset_ns: dict[int, int] = field(default_factory=dict)  # rank -> added to its trace's times
    notes: list[str] = field(default_factory=list)

    @property
    def duration_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns

    def __len__(self) -> int:
        return len(self.kind)

    def edge_counts(self) -> dict[str, int]:
        """Edges of each type."""
        counts = np.bincount(self.etype, minlength=len(EDGE_TYPES))
        return {name: int(c) for name, c in zip(EDGE_TYPES, counts, strict=True)}


@dataclass
class _Parts:
    """Columns of nodes and edges collected device by device, concatenated once."""

    nodes: dict[str, list[np.ndarray]] = field(default_factory=dict)
    edges: dict[str, list[np.ndarray]] = field(default_factory=dict)
    floors: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (nodes, least duration) set later
    count: int = 0

    def add_nodes(self, **cols: np.ndarray) -> np.ndarray:
        n = len(next(iter(cols.values())))
        for k, v in cols.items():
            self.nodes.setdefault(k, []).append(np.asarray(v))
        ids = np.arange(self.count, self.count + n, dtype=np.int64)
        self.count += n
        return ids

    def add_edges(self, src: np.ndarray, dst: np.ndarray, etype: int, delay: np.ndarray,
                  src_end: bool | np.ndarray, dst_end: bool = False, issue: np.ndarray | None = None,
                  profiler: np.ndarray | None = None) -> None:
        n = len(src)
        if not n:
            return
        for k, v in (("src", src), ("dst", dst), ("delay_ns", delay),
                     ("issue", np.zeros(n, np.int64) if issue is None else issue),
                     ("profiler", np.zeros(n, np.int64) if profiler is None else profiler),
                     ("src_end", np.broadcast_to(src_end, (n,))), ("dst_end", np.full(n, dst_end)),
                     ("etype", np.full(n, etype, dtype=np.int8))):
            self.edges.setdefault(k, []).append(np.asarray(v))

    def column(self, table: str, key: str, dtype: type | str) -> np.ndarray:
        parts = (self.nodes if table == "nodes" else self.edges).get(key, [])
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype=dtype)


def _bucket_codes(act: DeviceActivity) -> tuple[np.ndarray, np.ndarray]:
    index = {b: i for i, b in enumerate(NODE_BUCKETS)}
    other = index["other"]

    def code(values: np.ndarray) -> np.ndarray:
        return np.array([index.get(str(v), other) for v in values], dtype=np.int16) if len(values) else \
            np.empty(0, dtype=np.int16)

    kb = act.kernel_bucket
    uniq, inv = np.unique(kb.astype(str), return_inverse=True) if len(kb) else (np.empty(0, str), np.empty(0, int))
    mb = act.memop_bucket
    muniq, minv = np.unique(mb.astype(str), return_inverse=True) if len(mb) else (np.empty(0, str),
                                                                                  np.empty(0, int))
    return code(uniq)[inv], code(muniq)[minv]


def _percentile(values: np.ndarray, default: int) -> int:
    return int(np.percentile(values, LATENCY_PERCENTILE)) if len(values) else default


def _end_aligned_offsets(cross: CrossRankSummary | None, ranks: list[int]) -> dict[int, int]:
    """Clock offset per rank that lines up the ends of the matched collectives (a collective ends on every rank
    within its last step, so the median end difference is the clocks' offset): 0 for the first rank."""
    if cross is None or not len(cross.per_collective):
        return {}
    per = cross.per_collective
    ref = ranks[0]

    def ends(r: int) -> np.ndarray:
        return (per[rank_column("start_ns", r)] + per[rank_column("duration_ns", r)]).to_numpy(np.int64)

    return {r: int(np.median(ends(ref) - ends(r))) if r != ref else 0 for r in cross.ranks}


def _step_windows(dev: DeviceSummary, op_ids: np.ndarray, start: np.ndarray, end: np.ndarray,
                  offset: int) -> list[StepWindow]:
    steps = dev.per_step
    out: list[StepWindow] = []
    if not len(steps) or not len(op_ids):
        return out
    order = np.argsort(start, kind="stable")
    s_sorted = start[order]
    for i, (num, lo, hi) in enumerate(zip(steps["step"].to_numpy(np.int64), steps["start_ns"].to_numpy(np.int64),
                                          steps["end_ns"].to_numpy(np.int64), strict=True)):
        a, b = np.searchsorted(s_sorted, [lo + offset, hi + offset], side="left")
        if b <= a:
            continue
        inside = order[a:b]
        last = inside[np.argmax(end[inside])]
        out.append(StepWindow(dev.rank, dev.device, int(num), i, int(lo + offset), int(hi + offset),
                              int(op_ids[inside[0]]), int(op_ids[last])))
    return out


def build_graph(traces: Sequence[Trace], devices: Sequence[DeviceSummary],
                cross: CrossRankSummary | None, activities: Mapping[DeviceKey, DeviceActivity]) -> DepGraph:
    """The dependency graph of one run: ``devices`` of ``traces`` with their ``activities`` (by
    ``analysis.device.device_key``; a device without one is left out), collectives joined through ``cross`` (the
    summary's cross-rank matching)."""
    by_path = {t.path: t for t in traces}
    parts = _Parts()
    paths = sorted({d.trace for d in devices})
    ranks = sorted({d.rank for d in devices})
    offsets = {r: 0 for r in ranks} if len(paths) <= 1 else _end_aligned_offsets(cross, ranks)
    notes: list[str] = []
    if len(paths) > 1:
        notes.append("rank clocks lined up on the ends of the matched collectives" if offsets else
                     "rank files without matched collectives: their clocks are taken as they are")
    op_lookup: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # rank -> (comm starts, node ids, ends)
    steps: list[StepWindow] = []
    latency: dict[tuple[int, int], int] = {}
    host_parts: dict[str, list[tuple[DeviceActivity, np.ndarray, np.ndarray, np.ndarray]]] = {}
    explicit: set[tuple[int, int]] = set()  # devices whose trace records its cross-stream waits
    for dev in devices:
        found = activities.get(device_key(dev))
        if found is None:
            continue
        act: DeviceActivity = found
        off = offsets.get(dev.rank, 0)
        k, m = act.kernels, act.memops
        start = np.r_[k["start_ns"], m["start_ns"]].astype(np.int64) + off
        end = np.r_[k["end_ns"], m["end_ns"]].astype(np.int64) + off
        end = np.maximum(end, start)
        stream = np.r_[k["stream"], m["stream"]].astype(np.int64)
        kb, mb = _bucket_codes(act)
        names = np.r_[act.trace.names(k["name_id"]), act.trace.names(m["name_id"])].astype(object)
        is_comm = np.r_[act.kernel_is_comm, act.memop_is_comm]
        rows = np.r_[act.launch_row, act.memop_launch_row].astype(np.int64)
        n = len(start)
        ids = parts.add_nodes(kind=np.full(n, OP, np.int8), start=start, end=end, rank=np.full(n, dev.rank),
                              device=np.full(n, dev.device), stream=stream, thread=np.full(n, -1),
                              bucket=np.r_[kb, mb], name=names, is_comm=is_comm, is_sync=np.zeros(n, bool),
                              floor=end - start, bytes=np.full(n, -1), factor=np.zeros(n),
                              issue=np.zeros(n, np.int64), gap=np.zeros(n, np.int64),
                              contention=np.r_[np.rint(kernel_contention_ns(act)), np.zeros(len(m))])
        # per-stream order: sort by (stream, start)
        order = np.lexsort((start, stream))
        same = stream[order][1:] == stream[order][:-1]
        a, b = order[:-1][same], order[1:][same]
        gap = start[b] - end[a]
        g0 = min(max(_percentile(gap[gap >= 0], 0), 0), STREAM_LATENCY_MAX_NS)
        latency[(dev.rank, dev.device)] = g0
        parts.nodes["gap"][-1] = np.full(n, g0, np.int64)
        overlap = gap < 0
        parts.add_edges(ids[a], ids[b], STREAM, np.where(overlap, start[b] - start[a], np.minimum(gap, g0)),
                        src_end=~overlap)
        host_parts.setdefault(dev.trace, []).append((act, ids, rows, start))
        recorded = by_path[dev.trace].tables.get("stream_waits")
        if recorded is not None and len(recorded):
            _event_edges(parts, recorded, dev, act, ids, start, end, stream, g0)
            explicit.add((dev.rank, dev.device))
        if cross is not None and (dev.rank not in op_lookup) and is_comm.any():
            cm = np.flatnonzero(is_comm)
            order_c = np.argsort(start[cm], kind="stable")
            op_lookup[dev.rank] = (start[cm][order_c] - off, ids[cm][order_c], end[cm][order_c])
        steps += _step_windows(dev, ids, start, end, off)
    n_ops = parts.count
    node_end = parts.column("nodes", "end", np.int64)
    launcher = np.full(n_ops, -1, np.int64)
    # host nodes, per trace: the launching calls and the syncs on their threads
    for path, items in host_parts.items():
        trace = by_path[path]
        _host_nodes(trace, items, parts, offsets, node_end, launcher)
    node_start = parts.column("nodes", "start", np.int64)
    node_end = parts.column("nodes", "end", np.int64)
    node_stream = parts.column("nodes", "stream", np.int64)
    node_device = parts.column("nodes", "device", np.int64)
    node_rank = parts.column("nodes", "rank", np.int64)
    _wait_edges(parts, node_start, node_end, node_stream, node_device, node_rank, latency, explicit)
    skew = _collective_edges(parts, cross, op_lookup, offsets, node_start, node_end)
    if skew:
        notes.append(f"{skew} rank(s)-instances whose kernel ends before the last arrival on the common clock: "
                     "their end keeps its own duration")
    return _finish(parts, launcher, steps, latency, offsets, notes)


def _host_nodes(trace: Trace, items: list[tuple[DeviceActivity, np.ndarray, np.ndarray, np.ndarray]],
                parts: _Parts, offsets: dict[int, int], node_end: np.ndarray, launcher: np.ndarray) -> None:
    """Host nodes of one trace: its ops' launching calls and the host syncs on their threads; launch, host-order
    and sync edges."""
    api = trace.api_calls
    if not len(api):
        return
    off = offsets.get(items[0][0].rank, 0)
    all_rows = np.concatenate([rows for _, _, rows, _ in items])
    launched = np.unique(all_rows[all_rows >= 0])
    threads = np.unique(thread_key(api["pid"][launched], api["tid"][launched]))
    names = trace.strings.values
    sync_ids = [i for i, s in enumerate(names) if HOST_SYNC.search(s)]
    api_thread = thread_key(api["pid"], api["tid"])
    is_sync_row = np.isin(api["name_id"], np.array(sync_ids, dtype=np.int64)) & np.isin(api_thread, threads)
    rows = np.union1d(launched, np.flatnonzero(is_sync_row))
    hs = api["start_ns"][rows].astype(np.int64) + off
    he = np.maximum(api["end_ns"][rows].astype(np.int64) + off, hs)
    th = api_thread[rows]
    rank = items[0][0].rank
    n = len(rows)
    hnames = trace.names(api["name_id"][rows]).astype(object)
    ids = parts.add_nodes(kind=np.full(n, HOST, np.int8), start=hs, end=he, rank=np.full(n, rank),
                          device=np.full(n, -1), stream=np.full(n, -1), thread=th,
                          bucket=np.full(n, HOST_BUCKET, np.int16), name=hnames, is_comm=np.zeros(n, bool),
                          is_sync=is_sync_row[rows], floor=he - hs, bytes=np.full(n, -1), factor=np.zeros(n),
                          issue=np.zeros(n, np.int64), gap=np.zeros(n, np.int64), contention=np.zeros(n))
    # host order per thread
    order = np.lexsort((hs, th))
    same = th[order][1:] == th[order][:-1]
    a, b = order[:-1][same], order[1:][same]
    gap = hs[b] - he[a]
    nested = gap < 0
    covered = _issue_cover(trace, np.unique(api["pid"][rows]), off)
    events = _profiled_events(trace, threads, off)
    parts.add_edges(ids[a], ids[b], HOSTGAP, np.where(nested, hs[b] - hs[a], gap), src_end=~nested,
                    issue=np.where(nested, 0, covered(th[a], he[a], hs[b])),
                    profiler=np.where(nested, 0, events(th[a], he[a], he[b]) * ns_per_event(trace)[1]))
    parts.nodes["issue"][-1] = covered(th, hs, he)
    # launch edges and blocking-launch syncs
    for _, op_ids, op_rows, op_start in items:
        linked = op_rows >= 0
        pos = np.searchsorted(rows, op_rows[linked])
        h = ids[pos]
        o = op_ids[linked]
        launcher[o] = h
        lat = op_start[linked] - hs[pos]
        ok = lat >= 0
        l0 = min(int(lat[ok].min()) if ok.any() else 0, LAUNCH_LATENCY_MAX_NS)
        parts.add_edges(h[ok], o[ok], LAUNCH, np.minimum(lat[ok], l0), src_end=False)
        e_op = node_end[o]
        blocking = (e_op <= he[pos]) & (e_op > hs[pos])
        parts.add_edges(o[blocking], h[blocking], SYNC, he[pos][blocking] - e_op[blocking], src_end=True,
                        dst_end=True)
    # syncs, and calls held up by the GPU (a launch waiting for a free slot in the launch queue): the latest-ending
    # op launched from the same thread that ended inside the call; a call not named as a sync counts when it took
    # BLOCKED_NS or more and returned within RETURN_NEAR_NS of that op's end
    named_sync = is_sync_row[rows]
    sync_pos = np.flatnonzero(named_sync | (he - hs >= BLOCKED_NS))
    if not len(sync_pos):
        return
    op_all = np.concatenate([op_ids[op_rows >= 0] for _, op_ids, op_rows, _ in items])
    op_thread = np.concatenate([api_thread[op_rows[op_rows >= 0]] for _, _, op_rows, _ in items])
    op_e = node_end[op_all]
    _, lane = np.unique(np.r_[op_thread, th[sync_pos]], return_inverse=True)
    span = int(max(op_e.max(initial=0), he.max(initial=0)) - min(op_e.min(initial=0), hs.min(initial=0))) + 1
    base = int(min(op_e.min(initial=0), hs.min(initial=0)))
    key_op = (op_e - base) + lane[: len(op_all)].astype(np.int64) * span
    order_o = np.argsort(key_op, kind="stable")
    key_sync = (he[sync_pos] - base) + lane[len(op_all):].astype(np.int64) * span
    at = np.searchsorted(key_op[order_o], key_sync, side="right") - 1
    found = at >= 0
    cand = np.where(found, order_o[np.maximum(at, 0)], 0)
    same_lane = found & (lane[: len(op_all)][cand] == lane[len(op_all):])
    hit = same_lane & (op_e[cand] > hs[sync_pos])
    hit &= named_sync[sync_pos] | (he[sync_pos] - op_e[cand] <= RETURN_NEAR_NS)
    s_ids = ids[sync_pos][hit]
    srcs = op_all[cand[hit]]
    parts.add_edges(srcs, s_ids, SYNC, he[sync_pos][hit] - node_end[srcs], src_end=True, dst_end=True)


def _issue_cover(trace: Trace, pids: np.ndarray, offset: int) -> IntervalMeasure:
    """A function ``(thread, lo, hi) -> ns`` of each interval's time inside the union of the collective calls'
    issuing ranges on its thread (``host_issue.issue_ranges``)."""
    s, e, th = issue_ranges(trace, pids)
    if not len(s):
        return lambda thread, lo, hi: np.zeros(len(lo), np.int64)
    s, e = s + offset, e + offset
    lanes, lane = np.unique(th, return_inverse=True)
    base = int(s.min())
    span = int(e.max()) - base + 1
    u = iv.union((s - base) + lane * span, (e - base) + lane * span)

    def covered(thread: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        pos = np.minimum(np.searchsorted(lanes, thread), len(lanes) - 1)
        known = lanes[pos] == thread
        shift = pos.astype(np.int64) * span - base
        lo_l = np.clip(lo + shift, pos * span, pos * span + span - 1)
        hi_l = np.clip(hi + shift, pos * span, pos * span + span - 1)
        out = iv.cumulative(u, hi_l) - iv.cumulative(u, lo_l)
        return np.where(known, np.maximum(out, 0), 0).astype(np.int64)

    return covered


def _profiled_events(trace: Trace, threads: np.ndarray, offset: int) -> IntervalMeasure:
    """A function ``(thread, lo, hi) -> count`` of the host events a profiler recorded on the thread starting in
    ``[lo, hi)``: Kineto ``cpu_op`` ranges and CUDA API calls, as ``range.host_event_counts`` counts them
    (an nsys export read for a summary: the API calls it kept)."""
    api, r = trace.api_calls, trace.ranges
    starts = [api["start_ns"]]
    keys = [thread_key(api["pid"], api["tid"])]
    cpu_op = trace.strings.get("cpu_op")
    if len(r) and cpu_op >= 0:
        sel = r["kind_id"] == cpu_op
        starts.append(r["start_ns"][sel])
        keys.append(thread_key(r["pid"][sel], r["tid"][sel]))
    t = np.concatenate(starts).astype(np.int64) + offset
    k = np.concatenate(keys)
    keep = np.isin(k, threads)
    t, k = t[keep], k[keep]
    lanes, lane = np.unique(k, return_inverse=True)
    if not len(t):
        return lambda thread, lo, hi: np.zeros(len(lo), np.int64)
    base = int(t.min())
    span = int(t.max()) - base + 1
    lifted = np.sort((t - base) + lane.astype(np.int64) * span)

    def count(thread: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        pos = np.minimum(np.searchsorted(lanes, thread), len(lanes) - 1)
        known = lanes[pos] == thread
        shift = pos.astype(np.int64) * span - base
        lo_l = np.clip(lo + shift, pos * span, pos * span + span)
        hi_l = np.clip(hi + shift, pos * span, pos * span + span)
        n = np.searchsorted(lifted, hi_l) - np.searchsorted(lifted, lo_l)
        return np.where(known, np.maximum(n, 0), 0).astype(np.int64)

    return count


def _event_edges(parts: _Parts, waits: Table, dev: DeviceSummary, act: DeviceActivity, ids: np.ndarray,
                 start: np.ndarray, end: np.ndarray, stream: np.ndarray, g0: int) -> None:
    """Recorded cross-stream waits (``stream_waits``): the last op submitted to the recording stream before the event
    record → the first op submitted to the waiting stream after the wait (ops ordered by their launch's correlation
    id)."""
    # by process, not by the row's device: the exports seen give every wait the first GPU's deviceId (tp2 runs:
    # rank 1's waits name device 0); a process's stream ids are its own
    mine = np.isin(waits["pid"], act.pids)
    if not mine.any():
        return
    corr = np.r_[act.kernels["correlation"], act.memops["correlation"]].astype(np.int64)
    ok = corr >= 0
    lanes, lane = np.unique(stream[ok], return_inverse=True)
    big = int(corr.max(initial=0)) + 2
    key = lane.astype(np.int64) * big + corr[ok]
    order = np.argsort(key, kind="stable")
    key_sorted, op_sorted = key[order], np.flatnonzero(ok)[order]

    def lane_of(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.minimum(np.searchsorted(lanes, s), max(len(lanes) - 1, 0))
        return pos, lanes[pos] == s if len(lanes) else np.zeros(len(s), bool)

    r_lane, r_ok = lane_of(waits["record_stream"][mine].astype(np.int64))
    w_lane, w_ok = lane_of(waits["wait_stream"][mine].astype(np.int64))
    r_at = np.searchsorted(key_sorted, r_lane * big + waits["record_correlation"][mine], side="left") - 1
    w_at = np.searchsorted(key_sorted, w_lane * big + waits["wait_correlation"][mine], side="right")
    good = r_ok & w_ok & (r_at >= 0) & (w_at < len(key_sorted))
    r_at, w_at = np.where(good, r_at, 0), np.where(good, np.minimum(w_at, len(key_sorted) - 1), 0)
    good &= (key_sorted[r_at] // big == r_lane) & (key_sorted[w_at] // big == w_lane)
    src, dst = op_sorted[r_at[good]], op_sorted[w_at[good]]
    keep = (src != dst) & (end[src] <= start[dst])
    pairs = np.unique(np.column_stack([src[keep], dst[keep]]), axis=0) if keep.any() else np.empty((0, 2), int)
    a, b = pairs[:, 0], pairs[:, 1]
    parts.add_edges(ids[a], ids[b], EVENT, np.minimum(start[b] - end[a], g0), src_end=True)


def _wait_edges(parts: _Parts, start: np.ndarray, end: np.ndarray, stream: np.ndarray, device: np.ndarray,
                rank: np.ndarray, latency: dict[tuple[int, int], int], explicit: set[tuple[int, int]]) -> None:
    """Inferred cross-stream waits: an op starting ``WAIT_LATE_NS`` later than its stream predecessor and its launch
    allow, right after (``WAIT_NEAR_NS``) an op of another stream of the device ended."""
    src = parts.column("edges", "src", np.int64)
    dst = parts.column("edges", "dst", np.int64)
    et = parts.column("edges", "etype", np.int8)
    se = parts.column("edges", "src_end", bool)
    delay = parts.column("edges", "delay_ns", np.int64)
    starts_in = (et == STREAM) | (et == LAUNCH)
    ready = np.full(len(start), np.iinfo(np.int64).min, np.int64)
    t_src = np.where(se, end[src], start[src])
    np.maximum.at(ready, dst[starts_in], t_src[starts_in] + delay[starts_in])
    ready = np.where(ready == np.iinfo(np.int64).min, start, ready)
    ops = np.flatnonzero(device >= 0)
    late = ops[(start[ops] - ready[ops] > WAIT_LATE_NS)]
    if not len(late):
        return
    for key in {(int(r), int(d)) for r, d in zip(rank[late], device[late], strict=True)} - explicit:
        mine = ops[(rank[ops] == key[0]) & (device[ops] == key[1])]
        want = late[(rank[late] == key[0]) & (device[late] == key[1])]
        for s in np.unique(stream[want]):
            others = mine[stream[mine] != s]
            if not len(others):
                continue
            o_sorted = others[np.argsort(end[others], kind="stable")]
            w = want[stream[want] == s]
            at = np.searchsorted(end[o_sorted], start[w], side="right") - 1
            ok = at >= 0
            cand = o_sorted[np.maximum(at, 0)]
            ok &= (end[cand] >= ready[w]) & (start[w] - end[cand] <= WAIT_NEAR_NS)
            g0 = latency.get(key, 0)
            parts.add_edges(cand[ok], w[ok], WAIT, np.minimum(start[w][ok] - end[cand][ok], g0), src_end=True)


def _collective_edges(parts: _Parts, cross: CrossRankSummary | None,
                      lookup: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]], offsets: dict[int, int],
                      start: np.ndarray, end: np.ndarray) -> int:
    """Instance nodes, arrival and transfer edges; returns how many (rank, instance) transfer edges were left out
    because the rank's kernel ends before the last arrival on the common clock."""
    if cross is None or not len(cross.per_collective) or len(lookup) < 2:
        return 0
    per = cross.per_collective
    ranks = [r for r in cross.ranks if r in lookup]
    members = []
    for r in ranks:
        starts, ids, _ = lookup[r]
        want = per[rank_column("start_ns", r)].to_numpy(np.int64)
        pos = np.minimum(np.searchsorted(starts, want), max(len(starts) - 1, 0))
        hit = starts[pos] == want if len(starts) else np.zeros(len(want), bool)
        members.append(np.where(hit, ids[pos], -1))
    mem = np.column_stack(members)
    full = (mem >= 0).all(axis=1)
    mem = mem[full]
    if not len(mem):
        return 0
    arrival = start[mem].max(axis=1)
    transfer = per["transfer_ns"].to_numpy(np.int64)[full]
    n = len(mem)
    size = per["bytes"].to_numpy(np.int64)[full] if "bytes" in per else np.full(n, -1)
    from ...model.communication import bus_factors

    factor = bus_factors(per["kind"].to_numpy()[full], np.full(n, len(ranks)), len(ranks))
    inst = parts.add_nodes(kind=np.full(n, INSTANCE, np.int8), start=arrival, end=arrival,
                           rank=np.full(n, -1), device=np.full(n, -1), stream=np.full(n, -1),
                           thread=np.full(n, -1), bucket=np.full(n, INSTANCE_BUCKET, np.int16),
                           name=np.full(n, None, dtype=object), is_comm=np.ones(n, bool),
                           is_sync=np.zeros(n, bool), floor=np.zeros(n, np.int64), bytes=size,
                           factor=np.asarray(factor, dtype=np.float64), issue=np.zeros(n, np.int64),
                           gap=np.zeros(n, np.int64), contention=np.zeros(n))
    skew = 0
    for j in range(mem.shape[1]):
        m = mem[:, j]
        parts.add_edges(m, inst, ARRIVAL, np.zeros(n, np.int64), src_end=False)
        t = end[m] - arrival
        ok = t >= 0
        skew += int((~ok).sum())
        parts.add_edges(inst[ok], m[ok], TRANSFER, t[ok], src_end=False, dst_end=True)
        parts.floors.append((m, np.minimum(end[m] - start[m], transfer)))
    del offsets
    return skew


def _finish(parts: _Parts, launcher: np.ndarray, steps: list[StepWindow], latency: dict[tuple[int, int], int],
            offsets: dict[int, int], notes: list[str]) -> DepGraph:
    col = parts.column
    start, end = col("nodes", "start", np.int64), col("nodes", "end", np.int64)
    floor = col("nodes", "floor", np.int64).copy()
    for nodes, least in parts.floors:  # a collective kernel's least duration: at most the instance's transfer
        floor[nodes] = least
    src, dst = col("edges", "src", np.int64), col("edges", "dst", np.int64)
    src_end, dst_end = col("edges", "src_end", bool), col("edges", "dst_end", bool)
    delay = col("edges", "delay_ns", np.int64)
    etype = col("edges", "etype", np.int8)
    n = len(start)
    full_launcher = np.full(n, -1, np.int64)
    full_launcher[: len(launcher)] = launcher
    # sync ends: the least duration is the return latency (the call's own cost), not the wait
    sync_in = dst_end & (etype == SYNC)
    if sync_in.any():
        np.minimum.at(floor, dst[sync_in], np.maximum(delay[sync_in], 0))
    t_src = np.where(src_end, end[src], start[src])
    best = np.full(n, np.iinfo(np.int64).min, np.int64)
    starts_in = ~dst_end
    np.maximum.at(best, dst[starts_in], t_src[starts_in] + delay[starts_in])
    slack = np.where(best > np.iinfo(np.int64).min, np.maximum(start - best, 0), 0)
    return DepGraph(kind=col("nodes", "kind", np.int8), start_ns=start, end_ns=end,
                    rank=col("nodes", "rank", np.int64), device=col("nodes", "device", np.int64),
                    stream=col("nodes", "stream", np.int64), thread=col("nodes", "thread", np.int64),
                    bucket=col("nodes", "bucket", np.int16), name=col("nodes", "name", object),
                    is_comm=col("nodes", "is_comm", bool), is_sync=col("nodes", "is_sync", bool),
                    launcher=full_launcher, floor_ns=floor, slack_ns=slack, src=src, dst=dst, src_end=src_end,
                    dst_end=dst_end, etype=etype, delay_ns=delay,
                    instance_bytes=col("nodes", "bytes", np.int64),
                    instance_factor=col("nodes", "factor", np.float64),
                    issue_node_ns=col("nodes", "issue", np.int64), issue_edge_ns=col("edges", "issue", np.int64),
                    profiler_edge_ns=col("edges", "profiler", np.int64),
                    stream_gap_ns=col("nodes", "gap", np.int64),
                    contention_ns=col("nodes", "contention", np.int64), steps=steps,
                    stream_latency_ns=latency, clock_offset_ns=offsets, notes=notes)
