"""What-ifs by replay: change durations and delays of a run's dependency graph and recompute its steps.

Changes (``Change.kind``), each with the assumption it makes (listed in every result):

* ``scale``: the kernels of a bucket (or whose name matches a regex) take ``factor`` × their time; for the
  ``communication`` bucket, the transfer after the last arrival too.
* ``comm``: ``free`` — collectives cost nothing and join no ranks (their kernels take no time, no rank waits for
  another) and the host time of the collective calls (the outermost issuing ranges, ``host_issue.issue_ranges``)
  goes from the host threads; ``<N>GB/s`` — each matched instance's transfer is its bytes × NCCL's bus factor / N.
* ``graphs``: CUDA graphs — a host segment (between host syncs) launches once: the other launches cost no host time
  and hold no kernel back, the host's work between them goes (it was the eager model's Python), the GPU runs the
  kernels back to back at its least traced stream latency; host work right after a sync (reading results) stays.
* ``rank_like_median``: one rank's kernels take, per kernel name, the median of the other ranks' durations (where
  shorter), and its host gaps the other ranks' median gap (where shorter).
* ``fuse``: each run of consecutive kernels on a stream whose names match a regex becomes one kernel as long as the
  run's longest member (one pass over the data; or ``factor`` × the run's total), launched once.

The step of a run is its slowest rank's step (ranks matched by the step's place on each device); a change's
effect is the median over steps of (simulated − traced).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...model.buckets import BUCKETS
from .dep_graph import ARRIVAL, HOST, HOSTGAP, LAUNCH, NODE_BUCKETS, OP, STREAM, TRANSFER, DepGraph
from .replay import (
    CATEGORIES,
    Inputs,
    Order,
    PathSegment,
    Replay,
    StepTimes,
    critical_path,
    order_of,
    replay,
    step_ops,
    step_times,
)

COMM_BUCKET = "communication"
WHATIF_SCHEMA_VERSION = 1  # of WhatIfResult.to_json(): fields may be added, never renamed or dropped


@dataclass(frozen=True)
class Change:
    """One change to replay: ``kind`` in scale | comm | graphs | rank_like_median | fuse."""

    kind: str
    target: str = ""  # bucket or name regex (scale), "free" or bandwidth (comm), regex (fuse)
    factor: float | None = None  # scale factor; fuse: fused / total; comm: GB/s; rank_like_median: the rank

    def label(self) -> str:
        if self.kind == "scale":
            return f"scale {self.target}×{self.factor:g}"
        if self.kind == "comm":
            return "communication free" if self.target == "free" else f"communication at {self.factor:g} GB/s"
        if self.kind == "graphs":
            return "CUDA graphs (launch gaps removed)"
        if self.kind == "unprofiled":
            return "profiler's host cost removed"
        if self.kind == "rank_like_median":
            return f"rank {int(self.factor or 0)} like the median rank"
        return f"fuse /{self.target}/" + (f" at {self.factor:g}× the chain" if self.factor is not None else "")


_ASSUMPTIONS = {
    "scale": "the scaled kernels keep their dependencies; nothing else runs faster or slower beside them",
    "comm_free": "collectives take no time and synchronise no ranks; the host time of the collective calls "
                 "(outermost issuing ranges) goes from the host threads; compute kernels that ran beside "
                 "communication take their median time with none beside (contention goes)",
    "comm_bw": "each matched instance's transfer after the last arrival = bytes × bus factor / bandwidth; unmatched "
               "communication kernels keep their time",
    "graphs": "one launch per host segment (between host syncs); the host's work between launches goes; kernels run "
              "back to back at the device's least traced stream latency; the profiler's own host cost goes with the "
              "launches it slowed",
    "rank_like_median": "the rank's kernels take the other ranks' median duration per kernel name where shorter, its "
                        "host gaps the other ranks' median gap at the same place of the step where shorter",
    "fuse": "the run of matching kernels becomes one kernel as long as its longest member (or factor × its total), "
            "launched by one call; the host work between the fused launches goes",
    "unprofiled": "the profiler slows the host by a fixed time per recorded host event (Kineto 3.5 µs per CPU op or "
                  "CUDA call, nsys 6.66 µs per CUDA call: the medians measured, analysis/what_if/profiler_cost.py); "
                  "that time "
                  "goes from every host gap, in the baseline and with the changes",
    "always": "dependencies as traced (stream order, launches, host order, syncs, recorded or inferred "
              "cross-stream waits, collectives); unexplained delays (slack) stay with their node; profiler "
              "overhead in the trace stays unless a change removes the host work it slowed",
}


@dataclass
class StepPath:
    """The critical path of one step of one rank, summed by category, bucket, rank and edge type (ns; each
    sums to ``step_ns``)."""

    rank: int
    step: int
    ordinal: int
    step_ns: int
    by_category: dict[str, int]
    by_bucket: dict[str, int]
    by_rank: dict[str, int]
    by_edge: dict[str, int]
    segments: list[PathSegment] = field(default_factory=list, repr=False)

    def to_json(self, with_segments: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.rank, "step": self.step, "ordinal": self.ordinal, "step_ns": self.step_ns,
                               "by_category_ns": self.by_category, "by_bucket_ns": self.by_bucket,
                               "by_rank_ns": self.by_rank, "by_edge_ns": self.by_edge}
        if with_segments:
            out["segments"] = [{"start_ns": s.start_ns, "end_ns": s.end_ns, "category": s.category,
                                "bucket": s.bucket, "rank": s.rank, "edge": s.edge} for s in self.segments]
        return out

    def limiter(self) -> str:
        """What limits the step, in words: its largest category and bucket."""
        cat = max(self.by_category, key=lambda k: self.by_category[k])
        compute = {k: v for k, v in self.by_bucket.items() if k not in ("host", "idle")}
        top = max(compute, key=lambda k: compute[k]) if compute else None
        share = 100.0 * self.by_category[cat] / self.step_ns if self.step_ns else 0.0
        what = f"{cat} {share:.0f} %"
        return what + (f" (largest bucket on the path: {top})" if top else "")


@dataclass
class WhatIfStep:
    """One run step (its slowest rank) traced and simulated."""

    ordinal: int
    rank: int
    traced_ns: int
    baseline_ns: int  # the traced step, or with ``unprofiled`` the step replayed without the profiler's host cost
    simulated_ns: int
    traced_period_ns: int | None  # to the next step's start (None for the last)
    baseline_period_ns: int | None
    simulated_period_ns: int | None


@dataclass
class WhatIfResult:
    """A replay of a run with some changes (none: the no-change replay), and the critical paths."""

    changes: list[str]
    assumptions: list[str]
    steps: list[WhatIfStep]
    traced_step_ns: int | None  # median over run steps
    baseline_step_ns: int | None
    simulated_step_ns: int | None
    change_ns: int | None  # median over steps of (simulated - baseline)
    change_period_ns: int | None  # the same over step-to-step periods, where steps follow each other
    no_change_error_pct: float | None  # the unchanged replay's largest step error (%)
    paths: list[StepPath]  # the traced critical path of each run step (its slowest rank)
    simulated_paths: list[StepPath]
    graph: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": WHATIF_SCHEMA_VERSION, "changes": self.changes, "assumptions": self.assumptions,
            "traced_step_ns": self.traced_step_ns, "baseline_step_ns": self.baseline_step_ns,
            "simulated_step_ns": self.simulated_step_ns,
            "change_ns": self.change_ns, "change_period_ns": self.change_period_ns,
            "change_pct": (100.0 * self.change_ns / self.baseline_step_ns
                           if self.change_ns is not None and self.baseline_step_ns else None),
            "no_change_error_pct": self.no_change_error_pct,
            "steps": [s.__dict__ for s in self.steps],
            "critical_path": [p.to_json() for p in self.paths],
            "simulated_critical_path": [p.to_json() for p in self.simulated_paths],
            "graph": self.graph,
        }


def _sums(segments: list[PathSegment], key: str, keys: tuple[str, ...] = ()) -> dict[str, int]:
    out: dict[str, int] = {k: 0 for k in keys}
    for s in segments:
        k = str(getattr(s, key))
        out[k] = out.get(k, 0) + s.end_ns - s.start_ns
    return out


def step_path(g: DepGraph, r: Replay, i: int, ops: np.ndarray) -> StepPath:
    """The critical path of step window ``i`` of ``g`` under ``r``, summed."""
    w = g.steps[i]
    segs = critical_path(g, r, w, ops)
    total = sum(s.end_ns - s.start_ns for s in segs)
    return StepPath(w.rank, w.step, w.ordinal, total, _sums(segs, "category", CATEGORIES), _sums(segs, "bucket"),
                    _sums(segs, "rank"), _sums(segs, "edge"), segs)


def _name_mask(g: DepGraph, pattern: str) -> np.ndarray:
    rx = re.compile(pattern)
    names = g.name
    uniq, inv = np.unique(np.array([n if isinstance(n, str) else "" for n in names], dtype=object),
                          return_inverse=True)
    hit = np.array([bool(rx.search(u)) if u else False for u in uniq], dtype=bool)
    return hit[inv] if len(names) else np.zeros(0, bool)


def _disable(g: DepGraph, inp: Inputs, edges: np.ndarray) -> None:
    """Disable ``edges`` (bool mask); the nodes whose start they bound lose the slack that came with them."""
    inp.enabled &= ~edges
    bound = np.zeros(len(g), dtype=bool)
    bound[g.dst[edges & ~g.dst_end]] = True
    inp.slack_ns[bound & (g.kind == OP)] = 0


def apply_changes(g: DepGraph, changes: list[Change], ops_of: list[np.ndarray] | None = None
                  ) -> tuple[Inputs, list[str]]:
    """The replay inputs for ``changes`` and the assumptions they make (``ops_of``: :func:`replay.step_ops`)."""
    inp = Inputs.traced(g)
    step = node_steps(g, ops_of if ops_of is not None else step_ops(g))
    notes = [_ASSUMPTIONS["always"]]
    is_op = g.kind == OP
    bucket_names = np.asarray(NODE_BUCKETS, dtype=object)[g.bucket]
    for c in changes:
        if c.kind == "scale":
            f = float(c.factor if c.factor is not None else 1.0)
            sel = is_op & (bucket_names == c.target) if c.target in BUCKETS else is_op & _name_mask(g, c.target)
            inp.duration_ns[sel] = np.rint(inp.duration_ns[sel] * f).astype(np.int64)
            inp.floor_ns[sel] = np.rint(inp.floor_ns[sel] * f).astype(np.int64)
            if c.target == COMM_BUCKET:
                tr = g.etype == TRANSFER
                inp.delay_ns[tr] = np.rint(inp.delay_ns[tr] * f).astype(np.int64)
            notes.append(_ASSUMPTIONS["scale"])
        elif c.kind == "comm" and c.target == "free":
            comm = is_op & g.is_comm
            inp.duration_ns[comm] = 0
            inp.floor_ns[comm] = 0
            _disable(g, inp, (g.etype == TRANSFER) | (g.etype == ARRIVAL))
            inp.slack_ns[comm] = 0
            inp.delay_ns -= np.where(g.etype == HOSTGAP, g.issue_edge_ns, 0)
            inp.duration_ns -= g.issue_node_ns
            inp.duration_ns -= g.contention_ns
            inp.floor_ns = np.minimum(inp.floor_ns, inp.duration_ns)
            notes.append(_ASSUMPTIONS["comm_free"])
        elif c.kind == "comm":
            bw = float(c.factor or 0.0)
            inst = g.etype == TRANSFER
            src = g.src[inst]
            size = g.instance_bytes[src]
            new = np.where(size > 0, np.rint(size * g.instance_factor[src] / max(bw, 1e-9)), inp.delay_ns[inst])
            inp.delay_ns[inst] = new.astype(np.int64)
            dst = g.dst[inst]
            inp.floor_ns[dst] = np.minimum(inp.floor_ns[dst], inp.delay_ns[inst])
            notes.append(_ASSUMPTIONS["comm_bw"])
        elif c.kind == "graphs":
            _graphs(g, inp, step)
            notes.append(_ASSUMPTIONS["graphs"])
        elif c.kind == "unprofiled":
            hg = g.etype == HOSTGAP
            inp.delay_ns[hg] -= np.minimum(g.profiler_edge_ns[hg], inp.delay_ns[hg])
            notes.append(_ASSUMPTIONS["unprofiled"])
        elif c.kind == "rank_like_median":
            _like_median(g, inp, int(c.factor or 0), step)
            notes.append(_ASSUMPTIONS["rank_like_median"])
        elif c.kind == "fuse":
            _fuse(g, inp, c.target, c.factor)
            notes.append(_ASSUMPTIONS["fuse"])
        else:
            raise ValueError(f"unknown change {c.kind!r}")
    np.maximum(inp.duration_ns, 0, out=inp.duration_ns)
    np.maximum(inp.floor_ns, 0, out=inp.floor_ns)
    np.maximum(inp.delay_ns, 0, out=inp.delay_ns, where=g.etype == HOSTGAP)
    return inp, list(dict.fromkeys(notes))


def node_steps(g: DepGraph, ops_of: list[np.ndarray]) -> np.ndarray:
    """Step window index of each node (-1 outside steps): an op's by its start; a host node's by the first op it
    launched, else the host node before it on its thread."""
    step = np.full(len(g), -1, np.int64)
    for i, ops in enumerate(ops_of):
        step[ops] = i
    launched = np.flatnonzero((g.launcher >= 0) & (step >= 0))
    host_step = np.full(len(g), -1, np.int64)
    first = launched[np.argsort(g.start_ns[launched], kind="stable")][::-1]  # the earliest op wins (last write)
    host_step[g.launcher[first]] = step[first]
    host = np.flatnonzero(g.kind == HOST)
    order = host[np.lexsort((g.start_ns[host], g.thread[host]))]
    if len(order):
        pos = np.arange(len(order))
        new_thread = np.r_[True, g.thread[order][1:] != g.thread[order][:-1]]
        has = (host_step[order] >= 0) | new_thread
        fill = np.maximum.accumulate(np.where(has, pos, 0))
        step[order] = host_step[order][fill]
    return step


def _segments(g: DepGraph, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host nodes in steps that start a host segment (first of their step on their thread, or first after a host
    sync), and each host node's segment head (-1 outside steps)."""
    host = np.flatnonzero((g.kind == HOST) & (step >= 0))
    order = host[np.lexsort((g.start_ns[host], g.thread[host]))]
    heads = np.full(len(g), -1, np.int64)
    kept = np.zeros(len(g), dtype=bool)
    if not len(order):
        return kept, heads
    prev = np.r_[-1, order[:-1]]
    new_seg = np.r_[True, (g.thread[order][1:] != g.thread[order][:-1]) | (step[order][1:] != step[order][:-1])]
    new_seg |= (prev >= 0) & g.is_sync[np.maximum(prev, 0)]
    new_seg &= ~g.is_sync[order]
    pos = np.arange(len(order))
    seg_start = np.maximum.accumulate(np.where(new_seg, pos, 0))
    kept[order[new_seg]] = True
    heads[order] = order[seg_start]
    return kept, heads


def _graphs(g: DepGraph, inp: Inputs, step: np.ndarray) -> None:
    kept, heads = _segments(g, step)
    host = g.kind == HOST
    in_step = step >= 0
    launch = (g.etype == LAUNCH) & ~kept[g.src] & (heads[g.src] >= 0)
    inp.src[launch] = heads[g.src[launch]]  # every launch of the segment happens with its first
    hg = (g.etype == HOSTGAP) & in_step[g.src] & (step[g.src] == step[g.dst]) & ~g.is_sync[g.src]
    inp.delay_ns[hg] = 0
    drop = host & in_step & ~kept & ~g.is_sync
    inp.duration_ns[drop] = 0
    inp.floor_ns[drop] = 0
    op = (g.kind == OP) & ~g.is_comm & in_step
    inp.slack_ns[op] = 0
    stream = (g.etype == STREAM) & in_step[g.dst]
    inp.delay_ns[stream] = np.minimum(inp.delay_ns[stream], g.stream_gap_ns[g.dst[stream]])


def _like_median(g: DepGraph, inp: Inputs, rank: int, step: np.ndarray) -> None:
    ops = (g.kind == OP) & ~g.is_comm
    mine = ops & (g.rank == rank)
    others = ops & (g.rank != rank) & (g.rank >= 0)
    if not mine.any() or not others.any():
        return
    names = np.array([n if isinstance(n, str) else "" for n in g.name], dtype=object)
    dur = g.duration_ns
    uniq, inv = np.unique(names, return_inverse=True)
    ratio = np.ones(len(uniq))
    for code in np.unique(inv[mine]):
        o = dur[others & (inv == code)]
        m = dur[mine & (inv == code)]
        if len(o) and len(m) and np.median(m) > 0:
            ratio[code] = min(1.0, float(np.median(o)) / float(np.median(m)))
    sel = np.flatnonzero(mine)
    inp.duration_ns[sel] = np.rint(inp.duration_ns[sel] * ratio[inv[sel]]).astype(np.int64)
    inp.floor_ns[sel] = np.minimum(inp.floor_ns[sel], inp.duration_ns[sel])
    _gaps_like_median(g, inp, rank, step)


def _gaps_like_median(g: DepGraph, inp: Inputs, rank: int, step: np.ndarray) -> None:
    """Rank ``rank``'s host gaps as the other ranks' median gap at the same place of the same step (ranks run the
    same program: their host calls line up one for one), where shorter; a step whose gap counts differ between ranks
    takes the other ranks' median gap over the step, where shorter."""
    hg = np.flatnonzero((g.etype == HOSTGAP) & (step[g.dst] >= 0))
    if not len(hg):
        return
    ordinal = np.array([w.ordinal for w in g.steps], dtype=np.int64)[step[g.dst[hg]]]
    r_dst = g.rank[g.dst[hg]]
    def gaps(k: int, r: int) -> np.ndarray:
        e = hg[(ordinal == k) & (r_dst == r)]
        return e[np.argsort(g.start_ns[g.dst[e]], kind="stable")]

    for k in np.unique(ordinal[r_dst == rank]).tolist():
        mine = gaps(k, rank)
        others = [gaps(k, int(r)) for r in np.unique(r_dst[(ordinal == k) & (r_dst != rank)]).tolist()]
        if not others or not len(mine):
            continue
        if all(len(o) == len(mine) for o in others):
            median = np.median(np.stack([g.delay_ns[o] for o in others]), axis=0)
        else:
            median = np.full(len(mine), float(np.median(np.concatenate([g.delay_ns[o] for o in others]))))
        inp.delay_ns[mine] = np.minimum(inp.delay_ns[mine], np.rint(median).astype(np.int64))


def _fuse(g: DepGraph, inp: Inputs, pattern: str, factor: float | None) -> None:
    hit = (g.kind == OP) & ~g.is_comm & _name_mask(g, pattern)
    st = g.etype == STREAM
    # consecutive matching kernels on one stream: a stream edge between two hits
    link = st & hit[g.src] & hit[g.dst]
    follower = np.zeros(len(g), bool)
    follower[g.dst[link]] = True
    heads = np.flatnonzero(hit & ~follower)
    nxt = np.full(len(g), -1, np.int64)
    nxt[g.src[link]] = g.dst[link]
    for h in heads.tolist():
        chain = [h]
        while nxt[chain[-1]] >= 0:
            chain.append(int(nxt[chain[-1]]))
        if len(chain) < 2:
            continue
        d = g.duration_ns[chain]
        fused = int(d.max()) if factor is None else round(float(d.sum()) * factor)
        inp.duration_ns[h] = fused
        inp.floor_ns[h] = fused
        rest = np.asarray(chain[1:], np.int64)
        inp.duration_ns[rest] = 0
        inp.floor_ns[rest] = 0
        inp.slack_ns[rest] = 0
        into = np.isin(g.dst, rest) & (st | (g.etype == LAUNCH))
        inp.delay_ns[into & st] = 0
        _disable(g, inp, into & (g.etype == LAUNCH))
        launchers = g.launcher[rest]
        launchers = launchers[launchers >= 0]
        inp.duration_ns[launchers] = 0
        inp.floor_ns[launchers] = 0
        inp.delay_ns[np.isin(g.dst, launchers) & (g.etype == HOSTGAP)] = 0


def _run_steps(g: DepGraph, durations: np.ndarray) -> dict[int, int]:
    """Run step ordinal -> the step window index of its slowest rank."""
    best: dict[int, int] = {}
    for i, w in enumerate(g.steps):
        j = best.get(w.ordinal)
        if j is None or durations[i] > durations[j]:
            best[w.ordinal] = i
    return best


def _median(values: list[int]) -> int | None:
    return int(np.median(values)) if values else None


def simulate(g: DepGraph, changes: list[Change], *, order: Order | None = None) -> WhatIfResult:
    """Replay ``g`` unchanged (its critical paths, the no-change check) and with ``changes``. The baseline a change
    is measured against is the traced run, or with ``unprofiled`` among the changes the run with only that one."""
    o = order if order is not None else order_of(g)
    ops = step_ops(g)
    traced = replay(g, Inputs.traced(g), o)
    t_steps = step_times(g, traced, ops)
    window = np.array([w.end_ns - w.start_ns for w in g.steps], dtype=np.int64)
    err = float(np.max(np.abs(t_steps.duration_ns - window) / np.maximum(window, 1)) * 100) if len(window) else None
    inp, notes = apply_changes(g, changes, ops)
    sim = replay(g, inp, o) if changes else traced
    s_steps = step_times(g, sim, ops) if changes else t_steps
    base_changes = [c for c in changes if c.kind == "unprofiled"]
    b_steps = t_steps
    if base_changes and len(base_changes) < len(changes):
        b_steps = step_times(g, replay(g, apply_changes(g, base_changes, ops)[0], o), ops)
    run = _run_steps(g, t_steps.duration_ns)
    base_run = _run_steps(g, b_steps.duration_ns)
    sim_run = _run_steps(g, s_steps.duration_ns)
    steps: list[WhatIfStep] = []
    for k in sorted(run):
        i, b, j = run[k], base_run[k], sim_run[k]

        def period(st: StepTimes, x: int) -> int | None:
            return int(st.period_ns[x]) if st.period_ns[x] >= 0 else None

        steps.append(WhatIfStep(k, g.steps[i].rank, int(t_steps.duration_ns[i]), int(b_steps.duration_ns[b]),
                                int(s_steps.duration_ns[j]), period(t_steps, i), period(b_steps, b),
                                period(s_steps, j)))
    paths = [step_path(g, traced, run[k], ops[run[k]]) for k in sorted(run)]
    sim_paths = [step_path(g, sim, sim_run[k], ops[sim_run[k]]) for k in sorted(sim_run)] if changes else []
    deltas = [s.simulated_ns - s.baseline_ns for s in steps]
    periods = [s.simulated_period_ns - s.baseline_period_ns for s in steps
               if s.simulated_period_ns is not None and s.baseline_period_ns is not None]
    info = {"nodes": len(g), "edges": len(g.src), "edges_by_type": g.edge_counts(), "dropped_edges": o.dropped,
            "clock_offset_ns_by_rank": {str(k): v for k, v in g.clock_offset_ns.items()}, "notes": g.notes}
    return WhatIfResult([c.label() for c in changes], notes if changes else [_ASSUMPTIONS["always"]], steps,
                        _median([s.traced_ns for s in steps]), _median([s.baseline_ns for s in steps]),
                        _median([s.simulated_ns for s in steps]), _median(deltas), _median(periods), err, paths,
                        sim_paths, info)


_BANDWIDTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:GB/s|gbps|GBps)?\s*$", re.IGNORECASE)


def parse_changes(*, scale: tuple[str, ...] | list[str] = (), comm: str | None = None, graphs: bool = False,
                  rank_like_median: int | None = None, fuse: tuple[str, ...] | list[str] = (),
                  unprofiled: bool = False) -> list[Change]:
    """Changes from the ``whatif`` command's option texts; ``ValueError`` names a text that does not parse.

    ``scale``: ``BUCKET=F`` or ``REGEX=F`` (F ≥ 0); ``comm``: ``free`` or a bandwidth such as ``100GB/s``;
    ``fuse``: ``REGEX`` or ``REGEX=F`` (the fused kernel = F × the chain's total)."""
    out: list[Change] = [Change("unprofiled")] if unprofiled else []
    for text in scale:
        target, sep, value = text.rpartition("=")
        try:
            factor = float(value)
        except ValueError:
            factor = -1.0
        if not sep or not target or factor < 0:
            raise ValueError(f"--scale {text!r}: expected BUCKET=FACTOR or REGEX=FACTOR with FACTOR ≥ 0 "
                             f"(buckets: {', '.join(BUCKETS)})")
        if target not in BUCKETS:
            _check_regex(target, "--scale")
        out.append(Change("scale", target, factor))
    if comm is not None:
        if comm.strip().lower() == "free":
            out.append(Change("comm", "free"))
        else:
            m = _BANDWIDTH.match(comm)
            if not m or float(m.group(1)) <= 0:
                raise ValueError(f"--comm {comm!r}: expected 'free' or a bandwidth such as 100GB/s")
            out.append(Change("comm", "bandwidth", float(m.group(1))))
    if graphs:
        out.append(Change("graphs"))
    if rank_like_median is not None:
        out.append(Change("rank_like_median", "", float(rank_like_median)))
    for text in fuse:
        target, sep, value = text.rpartition("=")
        share: float | None = None
        if sep:
            try:
                share = float(value)
            except ValueError:
                target, share = text, None
        else:
            target = text
        if share is not None and share < 0:
            raise ValueError(f"--fuse {text!r}: the factor must be ≥ 0")
        _check_regex(target, "--fuse")
        out.append(Change("fuse", target, share))
    return out


def _check_regex(text: str, option: str) -> None:
    try:
        re.compile(text)
    except re.error as exc:
        raise ValueError(f"{option} {text!r}: not a regular expression ({exc})") from None
