"""A step's ``rl.log`` event encoded straight into the OTLP protobuf request the disk spool sends.

Through the SDK, a step of 250 float scalars costs an SDK ``LogRecord`` on the telemetry worker,
then ~1.3 ms on the batch thread for the SDK's protobuf encoder (a message object per key and per
value). At ~100 steps/s that encoder runs behind, and a process killed during an outage loses its
backlog. When the collector (through the spool) is where events go, the telemetry worker hands
each numeric step here instead: a step's record is the bytes the SDK encoder would make, built
from a template of its keys around the doubles that one ``struct`` call packs (and its ints); the records of one
drain of the worker's queue become ``ExportLogsServiceRequest``s in the spool, each of at most
``max_records`` records (the SDK batch processor's ``OTEL_BLRP_MAX_EXPORT_BATCH_SIZE``) and about
``max_bytes``: the spool drops its oldest segments when full, and a request bigger than a segment
would take newer steps with it. A test holds the bytes equal to the SDK encoder's, record for record.

Protobuf fields are written in field-number order, as the SDK's encoder (upb) writes them: for a
``LogRecord``, 1 time, 2 severity number, 5 body, 6 attributes, 8 flags, 9 trace id, 10 span id,
11 observed time, 12 event name. A body is a ``kvlistValue`` of ``doubleValue`` entries, each a
fixed number of bytes for its key, so a float-only key set's whole body has a fixed layout; an
``intValue`` is a varint, so a body with ints is put together per record around them.

Used from the worker thread only.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from otel_rl.exporters.protobuf_wire import field, varint
from otel_rl.exporters.step_events import PendingRecords

# What Pipeline.emit_event gives every event: SeverityNumber.INFO.
_SEVERITY_INFO = 9
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")


def _double_entry_heads(keys: list[str]) -> list[bytes]:
    """Per key, the bytes of its ``KeyValue`` entry up to its double (8 bytes, fixed64, follow)."""
    heads = []
    for key in keys:
        # KeyValue{key=1: key, value=2: AnyValue{double_value=4 (fixed64): number}}
        kv_head = field(1, key.encode("utf-8")) + b"\x12\x09\x21"
        heads.append(varint(1 << 3 | 2) + varint(len(kv_head) + 8) + kv_head)
    return heads


def _body_head(kvlist_size: int) -> bytes:
    # LogRecord.body=5: AnyValue{kvlist_value=6: KeyValueList{values=1: KeyValue...}}
    any_value_size = len(varint(kvlist_size)) + 1 + kvlist_size
    return varint(5 << 3 | 2) + varint(any_value_size) + varint(6 << 3 | 2) + varint(kvlist_size)


class ProtoKeyTemplate:
    """The bytes of a numeric ``kvlistValue`` body with these keys, the numbers left out.

    Doubles only: the body has a fixed layout, and ``packer.pack(*args)`` with the numbers put in
    ``args[1::2]`` gives the record's body field. With ints at the positions ``ints`` (an int64 is a
    varint, of varying length): ``runs`` holds, per stretch of doubles before each int (and after
    the last), its start and end, a packer of its entries and the packer's arguments, the doubles
    left out; ``int_keys`` the bytes of each int's key; :meth:`body` builds the field."""

    __slots__ = ("args", "packer", "ints", "runs", "int_keys")

    def __init__(self, keys: list[str], ints: tuple[int, ...] = ()) -> None:
        self.ints = ints
        heads = _double_entry_heads(keys)
        if ints:
            self.args, self.packer = [], struct.Struct("")
            self.int_keys = [field(1, keys[i].encode("utf-8")) + b"\x12" for i in ints]
            self.runs = []
            for start, end in zip((0, *(i + 1 for i in ints)), (*ints, len(keys))):
                run = heads[start:end]
                packer = struct.Struct("<" + "".join(f"{len(h)}sd" for h in run))
                self.runs.append((start, end, packer, [x for h in run for x in (h, 0.0)]))
            return
        self.runs, self.int_keys = [], []
        head = _body_head(sum(len(e) + 8 for e in heads))
        args: list[Any] = []
        fmt = ["<"]
        for index, entry in enumerate(heads):
            piece = head + entry if index == 0 else entry
            args += (piece, 0.0)
            fmt.append(f"{len(piece)}sd")
        if not heads:  # an empty map: the body field alone
            args.append(head)
            fmt.append(f"{len(head)}s")
        self.args = args
        self.packer = struct.Struct("".join(fmt))

    def body(self, values: list[Any] | bytes) -> bytes:
        """The record's body field for ``values`` (in key order; or, without ints, packed as
        little-endian doubles)."""
        if not self.ints:
            args = self.args.copy()
            args[1::2] = struct.unpack(f"<{len(values) // 8}d", values) if isinstance(values, bytes) else values
            return self.packer.pack(*args)
        parts = []
        for (start, end, packer, run_args), key in zip(self.runs, [*self.int_keys, None]):
            if end > start:
                args = run_args.copy()
                args[1::2] = values[start:end]
                parts.append(packer.pack(*args))
            if key is not None:  # KeyValue{key, value=2: AnyValue{int_value=3: varint}}
                number = varint(values[end])
                kv = key + varint(len(number) + 1) + b"\x18" + number
                parts += (b"\x0a", varint(len(kv)), kv)
        kvlist = b"".join(parts)
        return _body_head(len(kvlist)) + kvlist


class StepEventProtoWriter(PendingRecords):
    """Builds ``rl.log`` records of numeric steps as OTLP protobuf and stores them at each
    :meth:`write` through ``store(payload, records)``, as requests of at most ``max_records``
    records and (but for a single bigger record) ``max_bytes`` bytes."""

    def __init__(
        self,
        store: Callable[[bytes, int], bool],
        resource_message: bytes,
        scope_message: bytes,
        resource_schema_url: str,
        scope_schema_url: str,
        event_name: str,
        step_key: str,
        max_records: int = 512,
        max_bytes: int = 4 * 2**20,
    ) -> None:
        """``resource_message`` / ``scope_message``: the serialized ``Resource`` and
        ``InstrumentationScope`` the SDK's encoder writes for this telemetry (``otel_rl._sdk.otlp.sdk_compat.log_request_parts`` reads them off the SDK encoder)."""
        self._store = store
        self._resource = field(1, resource_message)
        self._resource_tail = field(3, resource_schema_url.encode()) if resource_schema_url else b""
        self._scope = field(1, scope_message)
        self._scope_tail = field(3, scope_schema_url.encode()) if scope_schema_url else b""
        self._severity = b"\x10" + varint(_SEVERITY_INFO)
        self._event_name = field(12, event_name.encode("utf-8"))
        # attributes=6: KeyValue{key=1: step_key, value=2: AnyValue{int_value=3: varint}}
        self._step_key = field(1, step_key.encode("utf-8"))
        self._max_records = max(1, max_records)
        self._max_bytes = max_bytes
        super().__init__()

    def template(self, keys: list[str], ints: tuple[int, ...] = ()) -> ProtoKeyTemplate:
        return ProtoKeyTemplate(keys, ints)

    def add(self, template: ProtoKeyTemplate, values: list[Any] | bytes, step: int | None, time_ns: int, span_context: Any) -> None:
        """One record: ``values`` are the step's finite floats (ints at the template's int
        positions) in the template's key order."""
        stamp = _FIXED64.pack(time_ns)
        parts = [b"\x09", stamp, self._severity, template.body(values)]
        if step is not None:
            any_value = b"\x18" + varint(step)
            kv = self._step_key + b"\x12" + varint(len(any_value)) + any_value
            parts += (b"\x32", varint(len(kv)), kv)
        if span_context is not None:
            flags = int(span_context.trace_flags)
            if flags:
                parts += (b"\x45", _FIXED32.pack(flags))
            if span_context.trace_id:
                parts += (b"\x4a\x10", span_context.trace_id.to_bytes(16, "big"))
            if span_context.span_id:
                parts += (b"\x52\x08", span_context.span_id.to_bytes(8, "big"))
        parts += (b"\x59", stamp, self._event_name)
        record = b"".join(parts)
        self._pending += (b"\x12", varint(len(record)), record)  # ScopeLogs.log_records=2

    def write(self) -> bool:
        """Store the records added since the last call; True when all were stored (or none)."""
        pending = self.take()
        if not pending:
            return pending is not None
        stored = True
        start, size = 0, 0
        for end in range(0, len(pending), 3):  # each record is three pieces: tag, length, bytes
            record_size = len(pending[end + 1]) + len(pending[end + 2]) + 1
            if end > start and (end - start >= 3 * self._max_records or size + record_size > self._max_bytes):
                stored &= self._store_request(pending[start:end])
                start, size = end, 0
            size += record_size
        return self._store_request(pending[start:]) and stored

    def _store_request(self, records: list[bytes]) -> bool:
        # ExportLogsServiceRequest{resource_logs=1: ResourceLogs{resource=1, scope_logs=2: ScopeLogs{scope=1,
        # log_records=2...}}}: the lengths first, then the whole request in one join (one copy of the records)
        scope_size = len(self._scope) + sum(map(len, records)) + len(self._scope_tail)
        scope_head = b"\x12" + varint(scope_size)
        resource_size = len(self._resource) + len(scope_head) + scope_size + len(self._resource_tail)
        request = (b"\x0a", varint(resource_size), self._resource, scope_head, self._scope, *records, self._scope_tail, self._resource_tail)
        return self._store(b"".join(request), len(records) // 3)
