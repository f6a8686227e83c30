"""Reading a Kineto trace file into typed events: bytes (plain files mapped, gzip inflated and bomb-guarded) →
msgspec Structs, batch by batch (:func:`split_events`), so only one batch of structs is alive at a time.

Only the fields the loader uses are declared; msgspec skips everything else without building objects (the 377 MB
test trace decodes in ~1.7 s of CPU here, where ``json.loads`` needs ~11 s). Every failure becomes one
``BadInputError`` line.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, Union

import msgspec

from ..model.errors import BadInputError, CorruptFileError, FileChangedError, UnknownFormatError
from .detect import GZIP_MAGIC, ProgressFn, open_regular

READ_CHUNK = 8 << 20  # bytes decompressed per step; progress is reported after each
MAX_JSON_BYTES_ENV = "TRACEANALYZER_MAX_JSON_BYTES"
_NON_SPACE = re.compile(rb"\S")


@dataclass(frozen=True)
class GzipLimits:
    """How far a ``.json.gz`` may expand: ``min(hard_cap, max(ratio × compressed size, floor))`` bytes.

    Real Kineto traces expand 10–21×; the ratio guards against gzip bombs, the floor keeps small files legal,
    the hard cap bounds memory. ``TRACEANALYZER_MAX_JSON_BYTES`` (bytes), when set, is the limit instead.
    """

    ratio: int = 50
    floor_bytes: int = 256 << 20
    hard_cap_bytes: int = 8 << 30

    def limit_for(self, compressed_bytes: int) -> int:
        env = os.environ.get(MAX_JSON_BYTES_ENV, "").strip()
        if env.isdigit():
            return int(env)
        return min(self.hard_cap_bytes, max(self.ratio * compressed_bytes, self.floor_bytes))


# -- typed event model (only what the loader reads) ----------------------------------------------------------


Num = int | str
# Every event phase of the Chrome trace-event format: decoded as shared literals, not one string per event.
Phase = Literal["B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "S", "T", "p", "F", "P", "O", "N", "D",
                "M", "V", "v", "R", "c", "(", ")", ""]


class Args(msgspec.Struct, frozen=True, gc=False):
    """The few ``args`` keys used; ``-1``/``None`` = absent. Numbers may come as text (ROCm writes
    ``"stream": "0x0"``), so the loader coerces them; rare keys stay ``Any``."""

    device: Num = -1
    stream: Num = -1
    correlation: Num = -1
    external_id: Num = msgspec.field(default=-1, name="External id")
    bytes: Num = -1
    grid: Any = None
    block: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    seq_lower: Any = msgspec.field(default=None, name="seq")
    wait_on_stream: Num = -1  # cuda_sync "Stream Wait Event": the stream the event was recorded on
    wait_on_record: Num = msgspec.field(default=-1, name="wait_on_cuda_event_record_corr_id")  # its record's corr.
    name: Any = None  # metadata events: process_name / thread_name
    labels: Any = None  # metadata events: process_labels


NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    """One entry of ``traceEvents``; ``ts``/``dur`` are µs as written (int or float), ``None`` when absent."""

    ph: Phase = ""
    cat: str = ""
    name: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: int | float | None = None
    dur: int | float | None = None
    args: Args = NO_ARGS


class DistributedInfo(msgspec.Struct, gc=False):
    rank: Any = None
    world_size: Any = None
    nccl_version: Any = None


class Document(msgspec.Struct, gc=False):
    """The top-level trace object."""

    traceEvents: list[Event]  # the format's camelCase spelling
    distributedInfo: DistributedInfo | None = None
    deviceProperties: list[Any] | None = None
    baseTimeNanoseconds: Any = None
    schemaVersion: Any = None
    cupti_version: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    torch_version: Any = None
    pytorch_version: Any = None


class ExactTimes(msgspec.Struct, gc=False):
    """``ts``/``dur`` decoded exactly (for absolute-epoch µs values a float64 cannot hold to the ns)."""

    ts: Decimal | None = None
    dur: Decimal | None = None


class ExactDocument(msgspec.Struct, gc=False):
    traceEvents: list[ExactTimes]


# Every category Kineto is known to write (libkineto's activity types, its flow and span categories, older
# PyTorch spellings): decoded as shared literals rather than one string per event.
Category = Literal["cpu_op", "user_annotation", "gpu_user_annotation", "gpu_memcpy", "gpu_memset", "kernel",
                   "external_correlation", "cuda_runtime", "cuda_driver", "cuda_profiler_range", "cuda_sync",
                   "glow_runtime", "cpu_instant_event", "python_function", "overhead", "mtia_runtime",
                   "mtia_ccp_events", "hpu_op", "xpu_runtime", "xpu_driver", "collective_comm",
                   "privateuse1_runtime", "privateuse1_driver", "ac2g", "fwdbwd", "async_cpu_to_gpu", "Trace",
                   "Operator", "Runtime", "Kernel", "Memcpy", "Memset", ""]


def _lean_event() -> Any:
    """The lean decoding of one event: a Struct per phase, tagged by ``ph``. Complete events (``X``) carry
    :class:`Event`'s fields, metadata (``M``) its name and args, every other phase (flows, instants, counters:
    40–60 % of a trace's events) only its category. Each type has ``ph`` as a class attribute, so the loader
    reads lean and plain events alike. Events without ``ph``, with another category or a phase outside
    :data:`Phase` do not decode this way (see :class:`Batch`)."""
    fields = {f.name: (f.name, Category if f.name == "cat" else f.type, f.default)
              for f in msgspec.structs.fields(Event) if f.name != "ph"}
    phases: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]
    types = []
    for ph in filter(None, phases):
        wanted = list(fields) if ph == "X" else ["cat", "name", "args"] if ph == "M" else ["cat"]
        types.append(msgspec.defstruct(f"Lean{ph if ph.isalpha() else ord(ph)}", [fields[f] for f in wanted],
                                       tag=ph, tag_field="ph", gc=False, frozen=True, namespace={"ph": ph}))
    return Union[tuple(types)]  # noqa: UP007 - a union built at run time


_DECODER = msgspec.json.Decoder(Document)
_LEAN_EVENTS_DECODER = msgspec.json.Decoder(list[_lean_event()])  # type: ignore[misc]
LEAN_DECODE = True  # tests turn it off to compare both decodings
_EXACT_DECODER = msgspec.json.Decoder(ExactDocument)
_EVENTS_DECODER = msgspec.json.Decoder(list[Event])
_EXACT_EVENTS_DECODER = msgspec.json.Decoder(list[ExactTimes])
BATCH_BYTES = 16 << 20  # JSON text per event batch: bounds the decoded structs alive at once
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENT_BOUNDARY = re.compile(rb"\}[ \t\n\r]*(,)[ \t\n\r]*\{")  # between two events (validated by decoding each piece)


# -- bytes -----------------------------------------------------------------------------------------------------


def read_bytes(path: Path, *, progress: ProgressFn | None = None,
               limits: GzipLimits | None = None) -> bytearray:
    """The JSON text of ``path`` (gunzipped when it starts with the gzip magic), reporting progress in bytes.

    A plain file is read whole into one buffer (not memory-mapped: a mapped file truncated by another process
    kills the reader with SIGBUS). The few bytes the batch decoder patches in place (see :class:`Batch`) never
    reach the file. A file whose size changes while it is read is :class:`FileChangedError` (exit 2).
    """
    try:
        with open_regular(path) as fh:
            total = os.fstat(fh.fileno()).st_size
            head = fh.read(2)
            fh.seek(0)
            if head == GZIP_MAGIC:
                return _gunzip(fh, path, total, progress, (limits or GzipLimits()).limit_for(total))
            data = _read_exactly(fh, path, total, progress)
            if progress:
                progress(total, total)
            return data
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc.strerror or exc}") from None


def _read_exactly(fh: Any, path: Path, total: int, progress: ProgressFn | None) -> bytearray:
    """``total`` bytes of ``fh`` into one buffer, in :data:`READ_CHUNK` pieces; the file must still have exactly
    that size afterwards (shorter, longer or resized meanwhile: :class:`FileChangedError`)."""
    data = bytearray(total)
    view = memoryview(data)
    done = 0
    while done < total:
        got = fh.readinto(view[done:done + READ_CHUNK])
        if not got:
            break
        done += got
        if progress:
            progress(done, total)
    view.release()
    if done != total or fh.read(1) or os.fstat(fh.fileno()).st_size != total:
        raise FileChangedError(path, "file changed while reading (its size changed)",
                               "wait until the profiler has finished writing it")
    return data


def _gunzip(fh: Any, path: Path, total: int, progress: ProgressFn | None, limit: int) -> bytearray:
    out = bytearray()
    inflater = zlib.decompressobj(wbits=31)
    pending = b""
    read = 0
    while True:
        if not pending:
            pending = fh.read(READ_CHUNK)
            read += len(pending)
            if progress:
                progress(min(read, total), total)
            if not pending:
                break
        try:
            out += inflater.decompress(pending, READ_CHUNK)
        except zlib.error as exc:
            raise CorruptFileError(path, f"corrupt gzip data ({exc})") from None
        pending = inflater.unconsumed_tail
        if len(out) > limit:
            raise CorruptFileError(path, f"decompressed size exceeds {limit:,} bytes (from {total:,} compressed "
                                   "bytes): refusing a possible gzip bomb",
                                   f"set {MAX_JSON_BYTES_ENV} (bytes) if the trace is genuine")
        if inflater.eof:  # a member ended: another may follow (concatenated gzip)
            pending = inflater.unused_data
            if not pending:
                pending = fh.read(READ_CHUNK)
                read += len(pending)
                if not pending:
                    return out
            inflater = zlib.decompressobj(wbits=31)
    raise CorruptFileError(path, "truncated gzip data: the file ends before the compressed stream does",
                           "was the copy interrupted?")


# -- decoding --------------------------------------------------------------------------------------------------


def decode(data: bytearray, path: Path) -> Document:
    """Typed decode of the whole trace; any JSON or type problem becomes a one-line ``BadInputError``."""
    body = _strip_bom(data)
    if _NON_SPACE.search(body) is None:
        raise CorruptFileError(path, "empty trace: the file holds no JSON")
    try:
        return _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(path, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise _decode_error(path, body, str(exc)) from None


class SplitFailed(Exception):
    """A piece of a split trace did not decode: decode the whole document instead (see :func:`split_events`)."""


@dataclass
class LeanChoice:
    """Shared by the batches of one file: whether lean decoding still applies (once a batch needs the plain
    decoding, e.g. for a category not in :data:`Category`, the later batches go straight to it)."""

    usable: bool = True


class Batch:
    """Consecutive events of ``traceEvents``: either a whole document, or a run of events in the file's buffer
    whose neighbouring bytes (the ``[`` or ``,`` before, the byte after the last ``}``) are briefly patched to
    ``[`` and ``]`` to decode it in place, without a copy."""

    def __init__(self, text: bytes | bytearray | memoryview, *, document: bool,
                 events: list[Event] | None = None, lean: LeanChoice | None = None) -> None:
        self.text, self.document, self._events = text, document, events
        self.lean = lean or LeanChoice()

    def events(self) -> list[Any]:
        """The decoded events (decoded once, here), lean (see :func:`_lean_event`) while the batches of this file
        allow it, else as :class:`Event`; :class:`SplitFailed` when the text is not a run of events."""
        events = self._events
        if events is None and self.lean.usable and LEAN_DECODE:
            events = self._framed(lambda view: _try_decode(_LEAN_EVENTS_DECODER, view))
            self.lean.usable = events is not None
        if events is None:
            events = self._framed(lambda view: _try_decode(_EVENTS_DECODER, view))
            if events is None:
                raise SplitFailed
        self._events = []  # the caller owns them now: freed with its last reference
        return events

    def exact_times(self) -> list[ExactTimes]:
        """``ts``/``dur`` of the same events as exact Decimals."""
        if self.document:
            return decode_exact_times(self.text)
        exact: list[ExactTimes] = self._framed(_EXACT_EVENTS_DECODER.decode)
        return exact

    def _framed(self, decode: Callable[[memoryview], Any]) -> Any:
        view = memoryview(self.text)
        saved = view[0], view[-1]
        view[0], view[-1] = ord("["), ord("]")
        try:
            return decode(view)
        finally:
            view[0], view[-1] = saved


def split_events(data: bytearray, path: Path,
                 batch_bytes: int | None = None) -> tuple[Document, list[Batch]]:
    """The top-level fields and ``traceEvents`` in batches of about ``batch_bytes`` of JSON, decoded lazily.

    Pieces are cut between two events (``}`` ``,`` ``{``) and each is decoded on its own: the prefix up to the
    array as ``prefix + "]}"``, the middle pieces as ``"[" + piece + "]"``, the last with the rest of the document
    as ``'{"traceEvents":[' + rest``. Concatenated, the pieces are the file, so when every piece decodes the
    events are exactly the file's. A piece that does not decode means a cut was not between events (or the file
    is malformed): the batch raises :class:`SplitFailed` and the caller must use :func:`decode`, which reports the
    real error. The head (its ``traceEvents`` empty) and the last batch are decoded here.
    """
    body = _strip_bom(data)
    if _NON_SPACE.search(body) is None:
        raise CorruptFileError(path, "empty trace: the file holds no JSON")
    found = _EVENTS_KEY.search(body)
    head = _try_decode(_DECODER, bytes(body[:found.end()]) + b"]}") if found else None
    if found is None or head is None:
        return decode_whole(data, path)
    pieces, start, step, lean = [], found.end(), batch_bytes or BATCH_BYTES, LeanChoice()
    while (m := _EVENT_BOUNDARY.search(body, start + step)) is not None:
        pieces.append(Batch(body[start - 1:m.start() + 2], document=False, lean=lean))  # "[" or "," … "}" + 1 byte
        start = m.start(1) + 1  # after the comma
    tail_text = b'{"traceEvents":[' + bytes(body[start:])
    tail = _try_decode(_DECODER, tail_text)
    if tail is None:
        return decode_whole(data, path)
    for field in head.__struct_fields__:
        if field != "traceEvents" and getattr(tail, field) is not None:
            setattr(head, field, getattr(tail, field))
    head.traceEvents = []
    return head, [*pieces, Batch(tail_text, document=True, events=tail.traceEvents)]


def _try_decode(decoder: msgspec.json.Decoder[Any], text: bytes | memoryview) -> Any:
    try:
        return decoder.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def decode_whole(data: bytearray, path: Path) -> tuple[Document, list[Batch]]:
    """:func:`decode` as a head (``traceEvents`` empty) and one batch of every event."""
    doc = decode(data, path)
    events, doc.traceEvents = doc.traceEvents, []
    return doc, [Batch(data, document=True, events=events)]


def decode_exact_times(data: bytearray | memoryview | bytes) -> list[ExactTimes]:
    """``ts``/``dur`` of every event as exact Decimals (same order as ``decode``'s events)."""
    return _EXACT_DECODER.decode(_strip_bom(data)).traceEvents


def _strip_bom(data: bytearray | memoryview | bytes) -> memoryview:
    view = memoryview(data)
    return view[3:] if data[:3] == b"\xef\xbb\xbf" else view


def _validation_error(path: Path, message: str) -> BadInputError:
    first = message.splitlines()[0] if message else "unexpected structure"
    top_level = "- at `" not in first
    if "missing required field `traceEvents`" in first or (top_level and first.startswith("Expected `object`")):
        return UnknownFormatError(path, "valid JSON but not a Kineto trace: no \"traceEvents\" list")
    if first.endswith("at `$.traceEvents`"):
        return UnknownFormatError(path, f"not a Kineto trace: \"traceEvents\" is not a list ({first})")
    return CorruptFileError(path, f"not a valid Kineto trace: {first}")


def _decode_error(path: Path, body: memoryview, message: str) -> BadInputError:
    if "truncated" in message:
        return CorruptFileError(path, "truncated JSON: the file ends before the trace does",
                                "was the profiler still writing it?")
    if "UTF-8" in message:
        try:
            bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            return CorruptFileError(path, f"not valid UTF-8 text (first bad byte at offset {exc.start:,})")
        return CorruptFileError(path, "not valid UTF-8 text")
    first = message.splitlines()[0] if message else "malformed"
    return CorruptFileError(path, f"not valid JSON ({first})")
