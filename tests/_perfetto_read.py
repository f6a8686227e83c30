"""Read a Perfetto protobuf trace back with the ``perfetto`` package's own protos: tracks and their slices.

Independent of the writer: it follows the TracePacket stream as a trace processor does (interned names, slice
begin/end pairs per track, nesting by a stack), so a test compares what a viewer would show with the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Slice:
    start_ns: int
    end_ns: int
    name: str
    category: str | None
    args: dict[str, Any]
    depth: int
    flows: tuple[int, ...] = ()


@dataclass
class Track:
    uuid: int
    name: str
    parent: int | None
    pid: int | None
    slices: list[Slice] = field(default_factory=list)
    instants: list[Slice] = field(default_factory=list)
    counter: bool = False
    samples: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class ReadTrace:
    tracks: dict[int, Track]
    errors: list[str]

    def group(self, name: str) -> int:
        found = [t.uuid for t in self.tracks.values() if t.parent is None and t.name == name]
        assert len(found) == 1, (name, [t.name for t in self.tracks.values() if t.parent is None])
        return found[0]

    def children(self, group: int) -> list[Track]:
        return [t for t in self.tracks.values() if t.parent == group]

    def slices(self, group: int, name: str) -> list[Slice]:
        """Slices of the track ``name`` under ``group`` and of its extra lanes."""
        out: list[Slice] = []
        for t in self.children(group):
            if t.name == name or t.name.startswith(name + " · lane "):
                out += t.slices
        return sorted(out, key=lambda s: (s.start_ns, -s.end_ns))


def read(path: Path) -> ReadTrace:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace()
    trace.ParseFromString(path.read_bytes())
    tracks: dict[int, Track] = {}
    names: dict[int, str] = {}
    cats: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    strings: dict[int, str] = {}
    open_: dict[int, list[tuple[int, str, str | None, dict[str, Any], tuple[int, ...]]]] = {}
    errors: list[str] = []
    last_ts = -1
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = Track(d.uuid, d.name, d.parent_uuid if d.HasField("parent_uuid") else None,
                                   d.process.pid if d.HasField("process") else None, counter=d.HasField("counter"))
        if p.HasField("interned_data"):
            i = p.interned_data
            names.update({e.iid: e.name for e in i.event_names})
            cats.update({e.iid: e.name for e in i.event_categories})
            arg_names.update({e.iid: e.name for e in i.debug_annotation_names})
            strings.update({e.iid: e.str.decode() for e in i.debug_annotation_string_values})
        if not p.HasField("track_event"):
            continue
        if p.timestamp < last_ts:
            errors.append(f"timestamps out of order at {p.timestamp}")
        last_ts = p.timestamp
        ev = p.track_event
        if ev.type == TrackEvent.TYPE_COUNTER:
            tracks[ev.track_uuid].samples.append((p.timestamp, ev.double_counter_value))
            continue
        stack = open_.setdefault(ev.track_uuid, [])
        if ev.type == TrackEvent.TYPE_SLICE_END:
            if not stack:
                errors.append(f"end without begin on track {ev.track_uuid} at {p.timestamp}")
                continue
            start, name, cat, args, flows = stack.pop()
            tracks[ev.track_uuid].slices.append(Slice(start, p.timestamp, name, cat, args, len(stack), flows))
            continue
        name = names[ev.name_iid] if ev.name_iid else ev.name
        cat = cats[ev.category_iids[0]] if ev.category_iids else None
        args: dict[str, Any] = {}
        for a in ev.debug_annotations:
            key = arg_names[a.name_iid] if a.name_iid else a.name
            kind = a.WhichOneof("value")
            args[key] = strings[a.string_value_iid] if kind == "string_value_iid" else getattr(a, kind)
        if ev.type == TrackEvent.TYPE_INSTANT:
            tracks[ev.track_uuid].instants.append(Slice(p.timestamp, p.timestamp, name, cat, args, len(stack)))
        else:
            stack.append((p.timestamp, name, cat, args, tuple(ev.flow_ids)))
    errors += [f"unclosed slice on track {u}" for u, s in open_.items() if s]
    return ReadTrace(tracks, errors)
