"""A step's ``rl.log`` event written straight into the run folder's ``logs.jsonl``.

A step of 250 scalars is otel-rl's commonest event and, through the SDK's log pipeline, its
dearest: an SDK ``LogRecord`` (attribute cleaning, copies), the batch processor's queue and thread,
then a dict tree per record for the encoder. When every place events go has a direct writer (the
run folder: this one; the OTLP spool: ``step_events_proto``; no tracker), the telemetry worker
hands each such step to them instead, and the records of one drain of the worker's queue go out
as one line of ``ExportLogsServiceRequest`` OTLP/JSON (``StepEventWriters`` feeds both).

The keys are written once per key set. The first record of a key set carries the whole key ->
value map (built from a template of its keys around the numbers orjson formats in one call) and
the attribute ``rl.log.key_set``, a hash of the keys (and of which values are ints); later records
of that key set carry the same attribute and, as the body, the values alone: a ``bytesValue``
holding them in key order, 8 bytes each, little-endian: an IEEE 754 double, or a two's-complement
int64 where the map has an ``intValue`` (one ``struct`` call and one base64 call, the exact value
logged). A step of
250 keys is then ~2.8 KB instead of ~24 KB. ``otel_rl.runs.read_log_records`` restores the map, so every
reader of the run folder (show, trace, replay, analyze, export) gets the record the SDK path would
have written (a test holds them equal). Any other OTLP/JSON reader (the collector's
``otlpjsonfile`` receiver) reads every line, with the values of later steps as those bytes.

Used from the worker thread only; the file's own lock keeps its lines whole against the SDK
exporter's lines for other events.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from typing import Any, Protocol

import orjson

from otel_rl.exporters.otlp_json import OtlpJsonLogExporter
from otel_rl.exporters.otlp_json_encoders import envelope

# What Pipeline.emit_event gives every event: SeverityNumber.INFO.
_SEVERITY_INFO = 9
# Key sets whose map a file is known to hold (later records carry their values alone).
_KEY_SETS_KEPT = 4096
# A body of doubles: their little-endian bytes, base64 (OTLP/JSON's form of a bytesValue).
_BYTES_HEAD = b'{"bytesValue":"'
_BYTES_TAIL = b'"}'


class KeyTemplate:
    """The bytes around the numbers of a ``kvlistValue`` body of doubles (and, at the positions
    ``ints``, int64s) with these keys, in order: ``pieces[0] + n0 + pieces[1] + n1 + ... +
    pieces[-1]``, the numbers as orjson formats them; ``packer`` packs the numbers alone."""

    __slots__ = ("pieces", "size", "key_set", "packer")

    def __init__(self, keys: list[str], ints: tuple[int, ...] = ()) -> None:
        # The same in every process and file: the hash of the keys in order (and of which are ints).
        named = orjson.dumps(keys) if not ints else orjson.dumps([keys, list(ints)])
        self.key_set = hashlib.blake2b(named, digest_size=8).hexdigest()
        int_positions = set(ints)
        pieces: list[bytes] = []
        close = b""
        for index, key in enumerate(keys):
            # OTLP/JSON writes an int64 as a decimal string, a double as a number
            kind = b'{"intValue":"' if index in int_positions else b'{"doubleValue":'
            prefix = b'{"key":' + orjson.dumps(key) + b',"value":' + kind
            pieces.append(close + b"," + prefix if pieces else b'{"kvlistValue":{"values":[' + prefix)
            pieces.append(b"")  # the number's place
            close = b'"}}' if index in int_positions else b"}}"
        pieces.append(close + b"]}}")
        self.pieces = pieces
        self.size = len(keys)
        self.packer = struct.Struct("<" + "".join("q" if i in int_positions else "d" for i in range(len(keys))))


class PendingRecords:
    """The encoded records added since the last write, kept for the process that made the writer."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._pid = os.getpid()

    @property
    def pending(self) -> bool:
        """Whether records were added since the last write."""
        return bool(self._pending)

    def take(self) -> list[bytes] | None:
        """The records added since the last call; None in a forked child (the parent's file or
        spool is not its to write)."""
        pending, self._pending = self._pending, []
        return pending if os.getpid() == self._pid else None


class StepEventWriter(PendingRecords):
    """Builds ``rl.log`` records of numeric steps (floats, and ints in int64's range) and appends them to the run folder's logs file,
    one line per :meth:`write` (the worker calls it after each drain of its queue)."""

    def __init__(self, exporter: OtlpJsonLogExporter, resource: Any, scope: Any, event_name: str, step_key: str, key_set_key: str) -> None:
        self._out = exporter.lines
        head, tail = envelope(resource, scope, "logRecords")  # the SDK path's request, around its records
        self._head, self._tail = head.encode(), tail.encode()
        self._severity = b'","severityNumber":' + str(_SEVERITY_INFO).encode() + b',"body":'
        self._event_tail = b',"eventName":' + orjson.dumps(event_name) + b"}"
        self._step_head = b',"attributes":[{"key":' + orjson.dumps(step_key) + b',"value":{"intValue":"'
        self._key_set_key = orjson.dumps(key_set_key)[1:-1]
        self._key_set_attributes: dict[str, bytes] = {}  # key sets whose map this file holds -> their attribute
        super().__init__()

    def template(self, keys: list[str], ints: tuple[int, ...] = ()) -> KeyTemplate:
        return KeyTemplate(keys, ints)

    def add(self, template: KeyTemplate, values: list[float] | bytes, step: int | None, time_ns: int, span_context: Any) -> None:
        """One record: ``values`` are the step's finite floats (ints at the template's int
        positions), in the template's key order, or (a template without ints) those floats packed
        as little-endian doubles; ``step`` an int or None; ``time_ns`` the event's time."""
        key_set = self._key_set_attributes.get(template.key_set)
        if key_set is not None:  # the values alone
            packed = values if type(values) is bytes else template.packer.pack(*values)
            body: Any = (_BYTES_HEAD, base64.b64encode(packed), _BYTES_TAIL)
        else:  # the key set's first record in this file: the whole map
            if type(values) is bytes:
                values = list(template.packer.unpack(values))
            key_set = b'{"key":"' + self._key_set_key + b'","value":{"stringValue":"' + template.key_set.encode() + b'"}}]'
            if len(self._key_set_attributes) >= _KEY_SETS_KEPT:  # key sets that change every step: start over
                self._key_set_attributes.clear()  # (a key set's next record then carries its map again)
            self._key_set_attributes[template.key_set] = key_set
            body = list(template.pieces)
            body[1:-1:2] = orjson.dumps(values)[1:-1].split(b",")
        stamp = str(time_ns).encode()
        head = b'{"timeUnixNano":"' + stamp + self._severity
        tail = b',"attributes":[' + key_set if step is None else self._step_head + str(step).encode() + b'"}},' + key_set
        if span_context is not None:
            flags = int(span_context.trace_flags)
            if flags:
                tail += b',"flags":' + str(flags).encode()
            if span_context.trace_id:
                tail += b',"traceId":"' + format(span_context.trace_id, "032x").encode() + b'"'
            if span_context.span_id:
                tail += b',"spanId":"' + format(span_context.span_id, "016x").encode() + b'"'
        tail += b',"observedTimeUnixNano":"' + stamp + b'"' + self._event_tail
        pending = self._pending
        if pending:
            pending.append(b",")
        pending.append(head)
        pending += body
        pending.append(tail)

    def write(self) -> bool:
        """Append the records added since the last call as one line; True when written (or none)."""
        pending = self.take()
        if not pending:
            return pending is not None
        # a record's pieces: its head (the one that opens with the time stamp), body pieces, tail, a comma
        records = sum(1 for piece in pending if piece[:16] == b'{"timeUnixNano":')
        written = self._out.write_bytes(b"".join((self._head, *pending, self._tail, b"\n")), records)
        if not written:  # the maps of this line's new key sets are not in the file: write them again
            self._key_set_attributes.clear()
        return written


class DirectStepWriter(Protocol):
    """What the telemetry worker hands numeric steps to: a writer of one destination's format."""

    def template(self, keys: list[str], ints: tuple[int, ...] = ()) -> Any:
        """What the writer keeps per key set (built once per key set, passed back to ``add``);
        ``ints``: the positions whose values are Python ints in int64's range (the rest are floats)."""
        ...

    def add(self, template: Any, values: list[Any] | bytes, step: int | None, time_ns: int, span_context: Any) -> None:
        """One step's record; ``values``: its numbers in key order, or, for a template without
        ints, its floats packed as little-endian doubles (one ``struct`` call on the caller's thread)."""
        ...

    @property
    def pending(self) -> bool: ...

    def write(self) -> bool: ...


class StepEventWriters:
    """Several direct writers of step events (the run folder's and the spool's) as one: each gets
    every record, with the template it made for the key set."""

    def __init__(self, writers: list[DirectStepWriter]) -> None:
        self.writers = writers

    def template(self, keys: list[str], ints: tuple[int, ...] = ()) -> tuple[Any, ...]:
        return tuple(writer.template(keys, ints) for writer in self.writers)

    def add(self, template: tuple[Any, ...], values: list[Any] | bytes, step: int | None, time_ns: int, span_context: Any) -> None:
        for writer, each in zip(self.writers, template):
            writer.add(each, values, step, time_ns, span_context)

    @property
    def pending(self) -> bool:
        return any(writer.pending for writer in self.writers)

    def write(self) -> bool:
        return all([writer.write() for writer in self.writers])  # a list: every writer writes
