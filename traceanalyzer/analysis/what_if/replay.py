"""Replay a dependency graph (:mod:`.dep_graph`) with its durations and delays, and walk its critical path.

A node's start is the latest of its enabled start in-edges (source time + delay) plus its slack; a node without
in-edges (the first call of a thread, the first op of a stream launched from nowhere) keeps its traced start. Its
end is its start plus its duration, or, where edges enter its end (a collective's transfer, a sync's GPU op), the
latest of its start plus its least duration and those edges. Points are visited in traced-time order (every edge
runs forward in traced time by construction, ties ordered by depth), one pass, so the replay costs one visit per
node and edge. Unchanged, it returns the traced times exactly.

The **critical path** of a step is walked back from the step's last end through each point's binding edge (the one
that set its time) to the step's start; its segments tile the step, so their lengths add up to it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dep_graph import (
    ARRIVAL,
    EDGE_TYPES,
    EVENT,
    HOST,
    HOSTGAP,
    LAUNCH,
    NODE_BUCKETS,
    OP,
    STREAM,
    SYNC,
    TRANSFER,
    WAIT,
    DepGraph,
    StepWindow,
)

#: Critical-path categories (what a stretch of the path is spent on).
CATEGORIES = ("compute", "transfer", "wait", "launch", "host_gap")
_EDGE_CATEGORY = {STREAM: "launch", LAUNCH: "launch", HOSTGAP: "host_gap", SYNC: "wait", WAIT: "wait",
                  ARRIVAL: "wait", TRANSFER: "transfer", EVENT: "wait"}
_NEG = -(1 << 62)


@dataclass
class Inputs:
    """What a replay may change: durations, least durations, slacks, edge delays and which edges hold."""

    duration_ns: np.ndarray
    floor_ns: np.ndarray
    slack_ns: np.ndarray
    delay_ns: np.ndarray
    enabled: np.ndarray  # bool per edge
    src: np.ndarray  # source node per edge: a change may move an edge to an earlier point (never a later one)

    @classmethod
    def traced(cls, g: DepGraph) -> Inputs:
        return cls(g.duration_ns.copy(), g.floor_ns.copy(), g.slack_ns.copy(), g.delay_ns.copy(),
                   np.ones(len(g.src), dtype=bool), g.src.copy())


@dataclass
class Order:
    """The visiting order of a graph's points and its in-edges grouped by destination point."""

    events: np.ndarray  # point ids in visiting order: node v's start is v, its end (if it has one) n + end_slot[v]
    end_node: np.ndarray  # node of each end point
    has_end: np.ndarray  # bool per node
    ptr: np.ndarray  # CSR offsets into ``edges`` per point
    edges: np.ndarray  # edge ids sorted by destination point
    dropped: int  # edges that ran backward in traced time (none expected), left out


def order_of(g: DepGraph) -> Order:
    """Points, their in-edges and a topological visiting order (traced time, then depth for equal times)."""
    n = len(g)
    has_end = np.zeros(n, dtype=bool)
    has_end[g.dst[g.dst_end]] = True
    end_node = np.flatnonzero(has_end)
    slot = np.full(n, -1, np.int64)
    slot[end_node] = np.arange(len(end_node))
    m = n + len(end_node)
    point_time = np.r_[g.start_ns, g.end_ns[end_node]]
    src_pt = np.where(g.src_end & has_end[g.src], n + slot[g.src], g.src)
    dst_pt = np.where(g.dst_end, n + slot[g.dst], g.dst)
    ok = point_time[src_pt] <= point_time[dst_pt]
    dropped = int((~ok).sum())
    # implicit edges: a node's start before its end point
    a = np.r_[src_pt[ok], end_node]
    b = np.r_[dst_pt[ok], n + np.arange(len(end_node))]
    depth = np.zeros(m, np.int64)
    tie = point_time[a] == point_time[b]
    ta, tb = a[tie], b[tie]
    for _ in range(64):
        new = depth.copy()
        np.maximum.at(new, tb, depth[ta] + 1)
        if (new == depth).all():
            break
        depth = new
    events = np.lexsort((depth, point_time))
    rank_of = np.empty(m, np.int64)
    rank_of[events] = np.arange(m)
    keep = np.flatnonzero(ok)
    by_dst = keep[np.argsort(dst_pt[keep], kind="stable")]
    counts = np.bincount(dst_pt[by_dst], minlength=m)
    ptr = np.r_[0, np.cumsum(counts)]
    return Order(events, end_node, has_end, ptr, by_dst, dropped)


@dataclass
class Replay:
    """Start and end of every node after a replay, and the edge that set each (-1: its own duration / a root)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    bound_start: np.ndarray
    bound_end: np.ndarray
    src: np.ndarray  # the edges' sources as replayed


def replay(g: DepGraph, inputs: Inputs, order: Order | None = None) -> Replay:
    """The graph's times with ``inputs`` (one pass over the points in topological order)."""
    o = order if order is not None else order_of(g)
    n = len(g)
    ts = g.start_ns.tolist()
    te = g.end_ns.tolist()
    dur = inputs.duration_ns.tolist()
    floor = inputs.floor_ns.tolist()
    slack = inputs.slack_ns.tolist()
    src = inputs.src.tolist()
    src_end = g.src_end.tolist()
    delay = inputs.delay_ns.tolist()
    enabled = inputs.enabled.tolist()
    has_end = o.has_end.tolist()
    end_node = o.end_node.tolist()
    ptr = o.ptr.tolist()
    edges = o.edges.tolist()
    bound_s = [-1] * n
    bound_e = [-1] * n
    for ev in o.events.tolist():
        lo, hi = ptr[ev], ptr[ev + 1]
        if ev < n:
            v = ev
            if lo < hi:
                best, arg = _NEG, -1
                for k in range(lo, hi):
                    e = edges[k]
                    if enabled[e]:
                        s = src[e]
                        x = (te[s] if src_end[e] else ts[s]) + delay[e]
                        if x > best:
                            best, arg = x, e
                if arg >= 0:
                    ts[v] = best + slack[v]
                    bound_s[v] = arg
            if not has_end[v]:
                te[v] = ts[v] + dur[v]
        else:
            v = end_node[ev - n]
            best, arg = ts[v] + floor[v], -1
            for k in range(lo, hi):
                e = edges[k]
                if enabled[e]:
                    s = src[e]
                    x = (te[s] if src_end[e] else ts[s]) + delay[e]
                    if x > best:
                        best, arg = x, e
            te[v] = best
            bound_e[v] = arg
    return Replay(np.asarray(ts, np.int64), np.asarray(te, np.int64), np.asarray(bound_s, np.int64),
                  np.asarray(bound_e, np.int64), inputs.src)


@dataclass
class StepTimes:
    """Each step window's time after a replay: from its first op's start less the traced lead to its last end
    plus the traced tail; ``period_ns`` to the next step of the same device's start (-1 for the last)."""

    duration_ns: np.ndarray
    start_ns: np.ndarray
    period_ns: np.ndarray


def step_ops(g: DepGraph) -> list[np.ndarray]:
    """Op nodes starting inside each step window of ``g.steps``."""
    out = []
    ops = np.flatnonzero(g.kind == OP)
    for w in g.steps:
        mine = ops[(g.rank[ops] == w.rank) & (g.device[ops] == w.device)]
        out.append(mine[(g.start_ns[mine] >= w.start_ns) & (g.start_ns[mine] < w.end_ns)])
    return out


def step_times(g: DepGraph, r: Replay, ops_of: list[np.ndarray]) -> StepTimes:
    """Step durations and periods after replay ``r``."""
    n = len(g.steps)
    dur = np.zeros(n, np.int64)
    start = np.zeros(n, np.int64)
    for i, (w, ops) in enumerate(zip(g.steps, ops_of, strict=True)):
        head = int(g.start_ns[w.first_op]) - w.start_ns
        tail = w.end_ns - int(g.end_ns[ops].max())
        start[i] = int(r.start_ns[ops].min()) - head
        dur[i] = int(r.end_ns[ops].max()) + tail - start[i]
    period = np.full(n, -1, np.int64)
    for i in range(n - 1):
        a, b = g.steps[i], g.steps[i + 1]
        if (a.rank, a.device) == (b.rank, b.device) and b.ordinal == a.ordinal + 1:
            period[i] = start[i + 1] - start[i]
    return StepTimes(dur, start, period)


@dataclass
class PathSegment:
    """A stretch of a critical path: ``[start_ns, end_ns)``, what it is spent on, on which rank."""

    start_ns: int
    end_ns: int
    category: str  # one of CATEGORIES
    bucket: str  # a kernel bucket, "host" or "idle"
    rank: int
    edge: str  # the edge type that led here, or "node" for a node's own duration
    node: int


def critical_path(g: DepGraph, r: Replay, w: StepWindow, ops: np.ndarray) -> list[PathSegment]:
    """The critical path of step ``w`` under replay ``r``, latest first reversed into time order; the segments
    tile the step's replayed window exactly (start: its first op's start less the traced lead)."""
    head = int(g.start_ns[w.first_op]) - w.start_ns
    tail = w.end_ns - int(g.end_ns[ops].max())
    lo = int(r.start_ns[ops].min()) - head
    last = int(ops[np.argmax(r.end_ns[ops])])
    hi = int(r.end_ns[last]) + tail
    segs: list[PathSegment] = []

    def add(a: int, b: int, category: str, bucket: str, rank: int, edge: str, node: int) -> None:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            segs.append(PathSegment(a, b, category, bucket, rank, edge, node))

    if tail > 0:
        add(hi - tail, hi, "host_gap", "idle", w.rank, "tail", last)
    v, at_end = last, True
    t = int(r.end_ns[last])
    rank_of = g.rank
    for _ in range(4 * len(g) + 4):
        if t <= lo:
            break
        if at_end:
            e = int(r.bound_end[v])
            if e < 0:
                t0 = int(r.start_ns[v])
                add(t0, t, *_own(g, v), "node", v)
                t, at_end = t0, False
                continue
        else:
            e = int(r.bound_start[v])
            if e < 0:
                break
        s = int(r.src[e])
        t0 = int(r.end_ns[s]) if g.src_end[e] else int(r.start_ns[s])
        et = int(g.etype[e])
        who = int(rank_of[v]) if rank_of[v] >= 0 else int(rank_of[s])
        add(t0, t, _EDGE_CATEGORY[et], "idle" if et != TRANSFER else "communication", who, EDGE_TYPES[et], v)
        v, at_end, t = s, bool(g.src_end[e]), t0
    if t > lo:
        add(lo, t, "host_gap", "idle", w.rank, "before", v)
    segs.reverse()
    return segs


def _own(g: DepGraph, v: int) -> tuple[str, str, int]:
    """Category, bucket and rank of a node's own duration."""
    bucket = NODE_BUCKETS[int(g.bucket[v])]
    if g.kind[v] == HOST:
        return ("host_gap" if g.is_sync[v] else "launch"), "host", int(g.rank[v])
    if g.is_comm[v]:
        return "transfer", "communication", int(g.rank[v])
    return "compute", bucket, int(g.rank[v])
