"""The trace and its analysis as a Perfetto trace (protobuf ``.pftrace``), written with the ``perfetto`` package's
protos: open it in the Perfetto UI beside the kernels you already know.

One process-like track group per (rank, device) holds, from the top: the analysis tracks — steps, layers, findings
(over the representative step, with their impact per step), exposed communication (SM idle during collectives),
SM idle (no kernel or copy), collectives split into wait and transfer (the cross-rank match), the straggler — then
one track per CUDA stream (kernels and memory operations, category = bucket), the GPU-side annotation ranges and a
counter track per sampled GPU metric.
Host NVTX / annotation ranges go to one group per (rank, process), one track per thread. Every timestamp is the
normalized trace's integer ns, unchanged (each trace keeps its own clock, as in the source); slices that overlap
without nesting on one stream or thread are put on extra lanes (``stream 7 · lane 2``). Names, categories and
argument names are interned once. Track and argument names are in docs/PERFETTO.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..model.units import fmt_ns
from .formatting import device_label, display_names
from .timeline import representative_window

if TYPE_CHECKING:
    from ..analysis.activity import DeviceActivity
    from ..analysis.results import DeviceSummary, Finding, Summary
    from ..model.trace import Trace

#: Range kinds drawn (NVTX and profiler annotations); CPU ops and Python functions are left out.
RANGE_KINDS = ("nvtx", "user_annotation", "gpu_user_annotation", "profiler_step", "nvtx_mark")
#: Track names of the analysis, in the order they appear under a device (docs/PERFETTO.md).
STEPS, LAYERS, FINDINGS = "steps", "layers", "findings"
EXPOSED = "exposed communication (SM idle during collectives)"
SM_IDLE = "SM idle (no kernel or copy)"
COLLECTIVES = "collectives: wait | transfer"
STRAGGLER = "straggler"
WAIT, TRANSFER = "wait", "transfer"
_SEQUENCE = 1  # trusted_packet_sequence_id of every packet (one writer)
_CHUNK = 20_000  # packets serialized per Trace message


Arg = int | float | str | bool


@dataclass
class Slices:
    """Slices of one track: start and end (ns), name, optional category and arguments per slice (``args``: a dict
    per slice; ``columns``: integer arguments as columns, a negative value meaning none — what a million kernels
    need)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    names: Sequence[str]
    categories: Sequence[str] | None = None
    args: Sequence[dict[str, Arg]] | None = None
    instant: bool = False  # marks (end = start) drawn as instants
    flows: Sequence[int] | None = None  # a flow id per slice (> 0): slices of one id are linked, in time order
    columns: dict[str, np.ndarray] | None = None
    values: np.ndarray | None = None  # a counter track: one sample (value at start_ns) per row, no slices

    def __len__(self) -> int:
        return len(self.start_ns)


def lanes(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, lane): the slices in (start, longest first) order and the lane of each, so that on one lane any two
    slices are disjoint or one holds the other (what a Perfetto track can show). One lane when no two overlap."""
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    order = np.lexsort((-end, start))
    s, e = start[order], end[order]
    lane = np.zeros(len(s), dtype=np.int64)
    if len(s) < 2 or bool((s[1:] >= np.maximum.accumulate(e)[:-1]).all()):
        return order, lane
    stacks: list[list[int]] = []  # per lane: ends of the open slices, innermost last
    for i, (a, b) in enumerate(zip(s.tolist(), e.tolist(), strict=True)):
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= a:
                stack.pop()
            if not stack or stack[-1] >= b:
                stack.append(b)
                lane[i] = k
                break
        else:
            stacks.append([b])
            lane[i] = len(stacks) - 1
    return order, lane


@dataclass
class _Track:
    uuid: int
    name: str
    parent: int | None = None
    pid: int | None = None  # a process-like group
    rank: int = 0  # order among its siblings
    slices: Slices | None = None  # what its rows index
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # in (start, longest first) order

    def __len__(self) -> int:
        return len(self.rows)


class PerfettoWriter:
    """Tracks and slices collected, then written as one packet sequence with interned names."""

    def __init__(self) -> None:
        self.tracks: list[_Track] = []
        self._uuid = 0x7A000000

    def group(self, name: str, pid: int) -> int:
        """A process-like group of tracks; its uuid."""
        return self._add(name, None, pid)

    def track(self, name: str, parent: int) -> int:
        """A track under ``parent``; its uuid."""
        return self._add(name, parent, None)

    def _add(self, name: str, parent: int | None, pid: int | None) -> int:
        self._uuid += 1
        rank = sum(1 for t in self.tracks if t.parent == parent)
        self.tracks.append(_Track(self._uuid, name, parent, pid, rank))
        return self._uuid

    def counter(self, name: str, parent: int, ts: np.ndarray, values: np.ndarray) -> int:
        """A counter track of samples (value at each time) under ``parent``; the number of samples."""
        if not len(ts):
            return 0
        self.track(name, parent)
        order = np.argsort(ts, kind="stable")
        self.tracks[-1].slices = Slices(np.asarray(ts, np.int64), np.asarray(ts, np.int64), [name] * len(ts),
                                        values=np.asarray(values, np.float64))
        self.tracks[-1].rows = order
        return len(ts)

    def slices(self, name: str, parent: int, sl: Slices) -> int:
        """``sl`` on a track named ``name`` under ``parent`` (more lanes where slices overlap without nesting);
        the number of slices."""
        if not len(sl):
            return 0
        order, lane = lanes(sl.start_ns, sl.end_ns)
        for ln in range(int(lane.max()) + 1):
            self.track(name if ln == 0 else f"{name} · lane {ln + 1}", parent)
            self.tracks[-1].slices = sl
            self.tracks[-1].rows = order[lane == ln]
        return len(sl)

    # -- writing ---------------------------------------------------------------------------------------------
    def write(self, out: IO[bytes]) -> None:
        """The trace: track descriptors, interned names, then every event in timestamp order."""
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

        ts, kind, track, row = _ordered_events(self.tracks)
        if len(ts) and ts[0] < 0:
            from ..model.errors import BadInputError

            raise BadInputError(None, f"a timestamp before 0 ({int(ts[0])} ns) cannot be written to a Perfetto "
                                "trace (its timestamps are unsigned)", "export to SQLite instead")
        names, cats, arg_names, strings = (i.ids for i in self._descriptors_and_names(out))
        types = (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END, TrackEvent.TYPE_INSTANT,
                 TrackEvent.TYPE_COUNTER)
        trace = Trace()
        needs = trace.packet.add().SEQ_NEEDS_INCREMENTAL_STATE
        del trace.packet[:]
        for lo in range(0, len(ts), _CHUNK):
            hi = min(lo + _CHUNK, len(ts))
            for t_ns, k, ti, i in zip(ts[lo:hi].tolist(), kind[lo:hi].tolist(), track[lo:hi].tolist(),
                                      row[lo:hi].tolist(), strict=True):
                t = self.tracks[ti]
                p = trace.packet.add()
                p.timestamp = t_ns
                p.trusted_packet_sequence_id = _SEQUENCE
                p.sequence_flags = needs
                ev = p.track_event
                ev.track_uuid = t.uuid
                ev.type = types[k]
                if k == 3 and t.slices is not None and t.slices.values is not None:
                    ev.double_counter_value = float(t.slices.values[i])
                elif k != 1 and t.slices is not None:
                    _describe(ev, t.slices, i, names, cats, arg_names, strings)
            out.write(trace.SerializeToString())
            trace = Trace()

    def _descriptors_and_names(self, out: IO[bytes]) -> tuple[_Interner, _Interner, _Interner, _Interner]:
        """Write the track descriptors and one packet interning every slice name, category, argument name and
        string argument (which clears the sequence's state); the interners (names, categories, argument names,
        strings)."""
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackDescriptor

        trace = Trace()
        for t in self.tracks:
            desc = trace.packet.add().track_descriptor
            desc.uuid = t.uuid
            desc.name = t.name
            if t.parent is not None:
                desc.parent_uuid = t.parent
                desc.sibling_order_rank = t.rank
            if t.pid is not None:
                desc.process.pid = t.pid
                desc.process.process_name = t.name
            if t.slices is not None and t.slices.values is not None:
                desc.counter.SetInParent()
            desc.child_ordering = TrackDescriptor.EXPLICIT
        names, cats, arg_names, strings = _Interner(), _Interner(), _Interner(), _Interner()
        for t in self.tracks:
            if t.slices is not None and t.slices.values is None:
                _intern(t.slices, t.rows, names, cats, arg_names, strings)
        first = trace.packet.add()
        first.trusted_packet_sequence_id = _SEQUENCE
        first.sequence_flags = first.SEQ_INCREMENTAL_STATE_CLEARED
        first.first_packet_on_sequence = True
        data = first.interned_data
        for value, iid in names.ids.items():
            data.event_names.add(iid=iid, name=value)
        for value, iid in cats.ids.items():
            data.event_categories.add(iid=iid, name=value)
        for value, iid in arg_names.ids.items():
            data.debug_annotation_names.add(iid=iid, name=value)
        for value, iid in strings.ids.items():
            data.debug_annotation_string_values.add(iid=iid, str=value.encode("utf-8"))
        out.write(trace.SerializeToString())
        return names, cats, arg_names, strings


def _intern(sl: Slices, rows: np.ndarray, names: _Interner, cats: _Interner, arg_names: _Interner,
            strings: _Interner) -> None:
    """The names, categories, argument names and string arguments of the slices ``rows`` of ``sl``."""
    for i in rows.tolist():
        names.add(sl.names[i])
        if sl.categories is not None:
            cats.add(sl.categories[i])
        for key, value in (sl.args[i] if sl.args is not None else {}).items():
            arg_names.add(key)
            if isinstance(value, str):
                strings.add(value)
    for key in sl.columns or {}:
        arg_names.add(key)


def _describe(ev: Any, sl: Slices, i: int, names: dict[str, int], cats: dict[str, int], arg_names: dict[str, int],
              strings: dict[str, int]) -> None:
    """Name, category, arguments and flow of slice ``i`` on its begin (or instant) event."""
    ev.name_iid = names[sl.names[i]]
    if sl.categories is not None:
        ev.category_iids.append(cats[sl.categories[i]])
    for key, value in (sl.args[i] if sl.args is not None else {}).items():
        _annotate(ev.debug_annotations.add(), arg_names[key], value, strings)
    for key, column in (sl.columns or {}).items():
        number = int(column[i])
        if number >= 0:
            _annotate(ev.debug_annotations.add(), arg_names[key], number, strings)
    if sl.flows is not None and sl.flows[i] > 0:
        ev.flow_ids.append(int(sl.flows[i]))


class _Interner:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def add(self, value: str) -> None:
        if value not in self.ids:
            self.ids[value] = len(self.ids) + 1


def _annotate(ann: Any, name_iid: int, value: Arg, string_ids: dict[str, int]) -> None:
    ann.name_iid = name_iid
    if isinstance(value, bool):
        ann.bool_value = value
    elif isinstance(value, (int, np.integer)):
        ann.int_value = int(value)
    elif isinstance(value, float):
        ann.double_value = value
    else:
        ann.string_value_iid = string_ids[str(value)]


def _track_events(t: _Track) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ts, kind: 0 begin · 1 end · 2 instant · 3 counter sample, row) of one track's events in the order they
    happen: an end before a begin at the same time, nested slices closed innermost first (one vectorized pass when
    none nest)."""
    sl = t.slices
    if sl is None or not len(t.rows):
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    rows = t.rows
    s = np.asarray(sl.start_ns, np.int64)[rows]
    e = np.asarray(sl.end_ns, np.int64)[rows]
    if sl.instant or sl.values is not None:
        return s, np.full(len(s), 3 if sl.values is not None else 2, np.int64), rows
    if len(s) < 2 or bool((s[1:] >= e[:-1]).all()):  # one after the other: begin, end, begin, end …
        return (np.column_stack((s, e)).ravel(), np.tile(np.array([0, 1], np.int64), len(s)), np.repeat(rows, 2))
    ts: list[int] = []
    kind: list[int] = []
    row: list[int] = []
    stack: list[int] = []
    for a, b, r in zip(s.tolist(), e.tolist(), rows.tolist(), strict=True):
        while stack and stack[-1] <= a:
            ts.append(stack.pop())
            kind.append(1)
            row.append(-1)
        ts.append(a)
        kind.append(0)
        row.append(r)
        stack.append(b)
    while stack:
        ts.append(stack.pop())
        kind.append(1)
        row.append(-1)
    return np.array(ts, np.int64), np.array(kind, np.int64), np.array(row, np.int64)


def _ordered_events(tracks: list[_Track]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ts, kind, track index, row) of every track's events, in timestamp order; a track's own order kept."""
    parts = [(*_track_events(t), ti) for ti, t in enumerate(tracks)]
    if not parts:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    ts = np.concatenate([p[0] for p in parts])
    kind = np.concatenate([p[1] for p in parts])
    track = np.concatenate([np.full(len(p[0]), p[3], np.int64) for p in parts])
    row = np.concatenate([p[2] for p in parts])
    order = np.argsort(ts, kind="stable")
    return ts[order], kind[order], track[order], row[order]


# -- what is drawn ---------------------------------------------------------------------------------------------
def build(summary: Summary, activity_of: Callable[[DeviceSummary], DeviceActivity]) -> PerfettoWriter:
    """The tracks of ``summary``'s devices (``activity_of``: each device's kernels and memops) and of the host
    ranges of their traces."""
    from ..analysis.collectives import with_transfer
    from ..model.communication import link_peak_gbps

    w = PerfettoWriter()
    traces: dict[int, Trace] = {}
    owners: dict[int, list[DeviceSummary]] = {}
    straggler = summary.cross_rank.straggler_rank if summary.cross_rank is not None else None
    for i, dev in enumerate(summary.devices):
        act = activity_of(dev)
        traces[id(act.trace)] = act.trace
        owners.setdefault(id(act.trace), []).append(dev)
        root = w.group(device_label(dev.rank, dev.device, dev.name, with_name=True), i + 1)
        window = representative_window(dev)
        w.slices(STEPS, root, _steps(dev))
        w.slices(LAYERS, root, _layers(dev))
        mine = [f for f in summary.findings if _finding_device(f) == (dev.rank, dev.device)]
        w.slices(FINDINGS, root, _findings(mine, window.start_ns, window.end_ns))
        w.slices(EXPOSED, root, _plain(dev.comm_idle_gaps_ns, "exposed communication"))
        w.slices(SM_IDLE, root, _idle(act))
        coll = with_transfer(dev.collectives, dev.rank, summary.cross_rank, link_peak_gbps(dev.name)) \
            if len(dev.collectives) else dev.collectives
        w.slices(COLLECTIVES, root, _collectives(coll, summary, dev.rank))
        if straggler is not None and dev.rank == straggler and summary.cross_rank is not None:
            lo, hi = dev.window_ns
            waits: dict[str, Arg] = {f"wait_ns_rank{r}": int(v) for r, v in summary.cross_rank.wait_ns_by_rank.items()}
            w.slices(STRAGGLER, root, Slices(np.array([lo]), np.array([hi]), [f"straggler: rank {dev.rank}"],
                                             args=[waits]))
        for stream, sl in _streams(act):
            w.slices(f"stream {stream}", root, sl)
        for stream, sl in _gpu_ranges(act.trace, dev):
            w.slices(f"annotations · stream {stream}", root, sl)
        for metric, (ts, values) in _gpu_metrics(act.trace, dev.device):
            w.counter(f"GPU metric: {metric}", root, ts, values)
    unowned = [f for f in summary.findings if _finding_device(f) not in
               {(d.rank, d.device) for d in summary.devices}]
    if unowned and summary.devices:
        window = representative_window(summary.devices[0])
        root = w.group("findings (whole run)", len(summary.devices) + 1)
        w.slices(FINDINGS, root, _findings(unowned, window.start_ns, window.end_ns))
    pid = len(summary.devices) + 2
    for key, trace in traces.items():
        ranks = sorted({d.rank for d in owners[key]})
        for (rank, proc), by_thread in _host_ranges(trace, ranks):
            root = w.group(f"rank {rank} · host (pid {proc})" if rank >= 0 else f"host (pid {proc})", pid)
            pid += 1
            for tid, sl in by_thread:
                w.slices(f"thread {tid}", root, sl)
    return w


def write_perfetto(summary: Summary, activity_of: Callable[[DeviceSummary], DeviceActivity],
                   out: IO[bytes]) -> PerfettoWriter:
    """:func:`build`, written to ``out``; the writer (its tracks) is returned."""
    w = build(summary, activity_of)
    w.write(out)
    return w


def _ints(df: Any, column: str) -> np.ndarray:
    return df[column].to_numpy(dtype=np.int64) if len(df) and column in df.columns else np.zeros(0, np.int64)


def _plain(df: Any, name: str) -> Slices:
    s, e = _ints(df, "start_ns"), _ints(df, "end_ns")
    return Slices(s, e, [name] * len(s))


def _steps(dev: DeviceSummary) -> Slices:
    ps = dev.per_step
    s, e = _ints(ps, "start_ns"), _ints(ps, "end_ns")
    steps = _ints(ps, "step") if "step" in getattr(ps, "columns", ()) else np.arange(len(s))
    return Slices(s, e, [f"step {k}" for k in steps.tolist()], args=[
        {"step": int(k), "duration_ns": int(b - a), "source": dev.step_source}
        for k, a, b in zip(steps.tolist(), s.tolist(), e.tolist(), strict=True)])


def _layers(dev: DeviceSummary) -> Slices:
    pl = dev.per_layer
    s, e = _ints(pl, "start_ns"), _ints(pl, "end_ns")
    if not len(s):
        return Slices(s, e, [])
    names = [str(n) for n in pl["name"].tolist()] if "name" in pl.columns else [f"layer {k}" for k in
                                                                                _ints(pl, "layer").tolist()]
    extra = [c for c in ("comm_ns", "comm_exposed_ns", "compute_ns") if c in pl.columns]
    values = {c: _ints(pl, c).tolist() for c in ("step", "layer", *extra) if c in pl.columns}
    args: list[dict[str, Arg]] = []
    for i in range(len(s)):
        row: dict[str, Arg] = {k: int(v[i]) for k, v in values.items()}
        row["duration_ns"] = int(e[i] - s[i])
        args.append(row)
    return Slices(s, e, names, args=args)


def _finding_device(f: Finding) -> tuple[int, int] | None:
    rank, device = f.evidence.get("rank"), f.evidence.get("device")
    if isinstance(rank, (int, np.integer)) and isinstance(device, (int, np.integer)):
        return int(rank), int(device)
    return None


def _findings(findings: Sequence[Finding], lo: int, hi: int) -> Slices:
    """Each finding as a slice over the representative step: its title, with its impact per step as arguments."""
    if hi <= lo or not findings:
        return Slices(np.zeros(0, np.int64), np.zeros(0, np.int64), [])
    args: list[dict[str, Arg]] = []
    for f in findings:
        a: dict[str, Arg] = {"id": f.id, "severity": f.severity, "impact": fmt_ns(f.impact_ns_per_step) + "/step"
                             if f.impact_ns_per_step is not None else "not quantified"}
        if f.impact_ns_per_step is not None:
            a["impact_ns_per_step"] = int(f.impact_ns_per_step)
        if f.impact_pct_of_step is not None:
            a["impact_pct_of_step"] = float(f.impact_pct_of_step)
        if f.recommendation:
            a["recommendation"] = f.recommendation
        args.append(a)
    n = len(findings)
    return Slices(np.full(n, lo, np.int64), np.full(n, hi, np.int64), [f.title for f in findings], args=args)


def _idle(act: DeviceActivity) -> Slices:
    from ..analysis.numeric import intervals as iv

    s, e = iv.gaps(act.busy)
    return Slices(s, e, ["SM idle"] * len(s))


def _collectives(coll: Any, summary: Summary, rank: int) -> Slices:
    """Each collective instance with its wait (from its start, until the last rank arrived) and transfer (the
    rest) nested inside it; unmatched instances are all transfer. The instances matched across ranks carry one flow
    per matched instance (id = its row of the match + 1), which links the ranks' slices in the Perfetto UI."""
    if not len(coll):
        return Slices(np.zeros(0, np.int64), np.zeros(0, np.int64), [])
    s, e = _ints(coll, "start_ns"), _ints(coll, "end_ns")
    wait, transfer = _ints(coll, "wait_ns"), _ints(coll, "transfer_ns")
    kinds = [str(k) for k in coll["kind"].tolist()]
    raw_names = [str(n) for n in coll["name"].tolist()]
    shown = [str(n) for n in display_names(raw_names)]
    nbytes = _ints(coll, "bytes")
    busbw = coll["busbw_gbps"].to_numpy(dtype=np.float64)
    row = _match_rows(coll, summary, rank)
    last = _last_arrival(row, summary)
    matched = coll["matched"].to_numpy(dtype=bool)
    starts, ends, names, args, flows = [], [], [], [], []
    for i in range(len(s)):
        a: dict[str, Arg] = {"kernel": shown[i], "wait_ns": int(wait[i]), "transfer_ns": int(transfer[i]),
                             "exposed_ns": int(coll["exposed_ns"].iloc[i]) if "exposed_ns" in coll.columns and
                             coll["exposed_ns"].iloc[i] == coll["exposed_ns"].iloc[i] else -1,
                             "matched_across_ranks": bool(matched[i])}
        a["bytes"] = int(nbytes[i]) if nbytes[i] >= 0 else "unknown"
        if busbw[i] == busbw[i]:
            a["busbw_gbps"] = float(busbw[i])
        if last[i] >= 0:
            a["last_arrival_rank"] = int(last[i])
        if row[i] >= 0:
            a["matched_instance"] = int(row[i])
        cut = min(int(s[i] + wait[i]), int(e[i]))
        parts = [(int(s[i]), int(e[i]), kinds[i], a, int(row[i]) + 1)]
        if wait[i] > 0:
            parts.append((int(s[i]), cut, WAIT, {"wait_ns": int(wait[i])}, 0))
        parts.append((cut, int(e[i]), TRANSFER, {"transfer_ns": int(e[i]) - cut}, 0))
        for lo, hi, name, arg, flow in parts:
            starts.append(lo)
            ends.append(hi)
            names.append(name)
            args.append(arg)
            flows.append(flow)
    return Slices(np.array(starts, np.int64), np.array(ends, np.int64), names, args=args, flows=flows)


def _match_rows(coll: Any, summary: Summary, rank: int) -> np.ndarray:
    """The row of the cross-rank match (``CrossRankSummary.per_collective``) of each of the device's collective
    instances, by this rank's start (-1 where unmatched)."""
    out = np.full(len(coll), -1, dtype=np.int64)
    cross = summary.cross_rank
    column = f"start_ns_r{rank}"
    if cross is None or column not in cross.per_collective.columns or not len(cross.per_collective):
        return out
    starts = cross.per_collective[column].to_numpy(dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    mine = _ints(coll, "start_ns")
    pos = np.minimum(np.searchsorted(starts[order], mine), len(starts) - 1)
    hit = starts[order][pos] == mine
    out[hit] = order[pos][hit]
    return out


def _last_arrival(rows: np.ndarray, summary: Summary) -> np.ndarray:
    """The rank that arrived last at each matched instance (``rows`` of the match; -1 where unmatched or unknown)."""
    cross = summary.cross_rank
    out = np.full(len(rows), -1, dtype=np.int64)
    if cross is None or "last_arrival_rank" not in cross.per_collective.columns:
        return out
    last = cross.per_collective["last_arrival_rank"].to_numpy(dtype=np.float64)
    hit = rows >= 0
    value = np.where(hit, last[np.maximum(rows, 0)] if len(last) else -1, -1)
    return np.where(np.isnan(value), -1, value).astype(np.int64)


def _streams(act: DeviceActivity) -> Iterable[tuple[int, Slices]]:
    """Kernels and memory operations per stream: display name, category = bucket, correlation id, and the CUDA
    graph id of kernels launched from a graph."""
    trace = act.trace
    parts = []
    for table, bucket in ((act.kernels, act.kernel_bucket), (act.memops, act.memop_bucket)):
        if not len(table):
            continue
        ids, inverse = np.unique(table["name_id"], return_inverse=True)
        shown = np.array([n if n is not None else "(unnamed)" for n in display_names(trace.names(ids).tolist())],
                         dtype=object)[inverse.ravel()]
        cats = np.array(["unclassified" if b is None else str(b) for b in bucket], dtype=object)
        graph = table["graph_id"] if "graph_id" in table else np.full(len(table), -1, np.int64)
        parts.append((table["start_ns"], table["end_ns"], table["stream"], shown, cats, table["correlation"], graph))
    if not parts:
        return []
    start, end, stream, name, cat, corr, graph = (np.concatenate([p[i] for p in parts]) for i in range(7))
    out = []
    for st in np.unique(stream).tolist():
        sel = np.flatnonzero(stream == st)
        out.append((int(st), Slices(start[sel], end[sel], name[sel].tolist(), cat[sel].tolist(),
                                    columns={"correlation": corr[sel], "cuda_graph_id": graph[sel]})))
    return out


def _gpu_metrics(trace: Trace, device: int) -> list[tuple[str, tuple[np.ndarray, np.ndarray]]]:
    """The GPU's sampled metrics (nsys GPU_METRICS), per metric: sample times and values."""
    g = trace.gpu_metrics
    if not len(g):
        return []
    mine = g["device"] == device
    out = []
    for mid in np.unique(g["metric_id"][mine]).tolist():
        sel = mine & (g["metric_id"] == mid)
        out.append((str(trace.strings[mid]) if mid >= 0 else "metric", (g["timestamp_ns"][sel], g["value"][sel])))
    return out


def _range_rows(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the trace's ranges of :data:`RANGE_KINDS` that were closed, and whether each is a mark."""
    r = trace.ranges
    if not len(r):
        return np.zeros(0, np.int64), np.zeros(0, bool)
    kind_ids = [trace.strings.get(k) for k in RANGE_KINDS]
    keep = np.isin(r["kind_id"], [k for k in kind_ids if k >= 0]) & (r["end_ns"] >= r["start_ns"])
    rows = np.flatnonzero(keep)
    mark = trace.strings.get("nvtx_mark")
    return rows, (r["kind_id"][rows] == mark) if mark >= 0 else np.zeros(len(rows), bool)


def _range_slices(trace: Trace, rows: np.ndarray, marks: np.ndarray) -> Slices:
    r = trace.ranges
    names = ["(unnamed)" if n is None else str(n) for n in trace.names(r["name_id"][rows]).tolist()]
    domains = trace.names(r["domain_id"][rows]).tolist() if "domain_id" in r else [None] * len(rows)
    kinds = trace.names(r["kind_id"][rows]).tolist()
    cats = [f"{k}:{d}" if d else str(k) for k, d in zip(kinds, domains, strict=True)]
    return Slices(r["start_ns"][rows], np.where(marks, r["start_ns"][rows], r["end_ns"][rows]), names, cats)


def _gpu_ranges(trace: Trace, dev: DeviceSummary) -> list[tuple[int, Slices]]:
    rows, marks = _range_rows(trace)
    r = trace.ranges
    mine = (r["device"][rows] == dev.device) & ((r["rank"][rows] == dev.rank) | (dev.rank < 0)) & ~marks
    out = []
    for st in np.unique(r["stream"][rows][mine]).tolist():
        sel = rows[mine][r["stream"][rows][mine] == st]
        out.append((int(st), _range_slices(trace, sel, np.zeros(len(sel), bool))))
    return out


def _host_ranges(trace: Trace, ranks: list[int]) -> list[tuple[tuple[int, int], list[tuple[int, Slices]]]]:
    """Host (CPU-side) ranges of the device ranks' processes, per (rank, pid) and thread."""
    rows, marks = _range_rows(trace)
    r = trace.ranges
    host = r["device"][rows] < 0
    if len(ranks) and min(ranks) >= 0:
        host &= np.isin(r["rank"][rows], ranks) | (r["rank"][rows] < 0)
    rows, marks = rows[host], marks[host]
    out = []
    keys = np.unique(np.stack([r["rank"][rows].astype(np.int64), r["pid"][rows].astype(np.int64)], axis=1),
                     axis=0) if len(rows) else np.zeros((0, 2), np.int64)
    for rank, pid in keys.tolist():
        sel = (r["rank"][rows] == rank) & (r["pid"][rows] == pid)
        threads = []
        for tid in np.unique(r["tid"][rows][sel]).tolist():
            t_sel = sel & (r["tid"][rows] == tid)
            threads.append((int(tid), _range_slices(trace, rows[t_sel], marks[t_sel])))
        out.append(((int(rank), int(pid)), threads))
    return out
