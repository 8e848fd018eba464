"""Bounds on what one request may cost the bridge, checked before anything is decoded.

A 64 KB gzip body inflates to 64 MB of two-byte empty messages, and the protobuf runtime spends
about 60 bytes of memory on each message it builds: decoding first and counting afterwards
peaks at gigabytes. :func:`scan_otlp` walks the protobuf wire format instead (lengths and tags
only, no objects), counts the messages, resources, log records and data points, and stops at
the first limit crossed, so a hostile body costs a bounded scan and a 413, never a decode.

:func:`chunk_size` reads one line of a chunked body strictly (hex digits only): Python's
``int(x, 16)`` takes ``-1``, ``+5``, ``0x10`` and ``1_0``, and ``rfile.read(-1)`` reads until
the peer closes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MESSAGE_COST_BYTES", "Counts", "RequestLimits", "RequestTooBig", "chunk_size", "scan_otlp"]

MESSAGE_COST_BYTES = 64  # memory of one decoded protobuf message (upb measured ~60 B for an empty one)
_MAX_DEPTH = 64  # OTLP nests about 12 deep (kvlist in array in kvlist ...); protobuf itself stops at 100
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_RESOURCES = {"ResourceLogs", "ResourceMetrics", "ResourceSpans"}
_RECORDS = {"LogRecord"}
_POINTS = {"NumberDataPoint", "HistogramDataPoint", "ExponentialHistogramDataPoint", "SummaryDataPoint"}


class RequestTooBig(ValueError):
    """The request crosses one of :class:`RequestLimits` (answered 413: the sender should split it)."""


class Malformed(ValueError):
    """The body is not valid protobuf wire format (answered 400)."""


@dataclass(frozen=True)
class RequestLimits:
    """Per-request bounds; the defaults leave room for a collector's large batches."""

    max_messages: int = 2_000_000  # every message (KeyValue, AnyValue, ...): ~128 MB decoded
    max_resources: int = 10_000
    max_records: int = 200_000
    max_points: int = 500_000
    # OTLP/JSON, counted on the text before it is parsed (see otel_rl.bridge.json_scan): a value
    # costs ~100 B and ~2 µs to decode, so a million is ~6 MB of compact OTLP/JSON, ~2 s, ~150 MB
    max_json_values: int = 1_000_000  # objects + arrays + strings (keys too) + numbers + true/false/null
    max_json_depth: int = 128  # OTLP nests about 20 deep; protobuf's own JSON parser stops at 100 messages


@dataclass
class Counts:
    """What :func:`scan_otlp` found in a body, and the encoded size of each resource and log record
    (in wire order: the order the decoded message lists them; sizes without decoding anything)."""

    messages: int = 0
    resources: int = 0
    records: int = 0
    points: int = 0
    resource_bytes: list[int] = field(default_factory=list)
    record_bytes: list[int] = field(default_factory=list)

    def decoded_bytes(self, body_len: int) -> int:
        """An upper estimate of the decoded message's memory (what the request queue is charged)."""
        return body_len + MESSAGE_COST_BYTES * self.messages


def chunk_size(line: bytes) -> int:
    """The size on one chunk-size line (``1a3;ext=1``); ValueError unless it is plain hex."""
    text = line.split(b";", 1)[0].strip()
    if not _HEX.fullmatch(text):
        raise ValueError(f"bad chunk size {text[:20]!r}")
    return int(text, 16)


_RESOURCE, _RECORD, _POINT = 1, 2, 3  # what a message counts towards besides messages
_fields_cache: dict[str, dict[int, tuple[dict, int]]] = {}


def _message_fields(descriptor: Any) -> dict[int, tuple[dict, int]]:
    """field number -> (the same map for the field's message type, what it counts towards), for the
    message-typed fields of ``descriptor`` (cached; filled after caching, so recursive types end)."""
    fields = _fields_cache.get(descriptor.full_name)
    if fields is None:
        fields = _fields_cache[descriptor.full_name] = {}
        for field in descriptor.fields:
            sub = field.message_type
            if sub is not None:
                kind = _RECORD if sub.name in _RECORDS else _POINT if sub.name in _POINTS else _RESOURCE if sub.name in _RESOURCES else 0
                fields[field.number] = (_message_fields(sub), kind)
    return fields


def _varint(buf: bytes | bytearray, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise Malformed("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise Malformed("varint over 10 bytes")


def scan_otlp(body: bytes | bytearray, descriptor: Any, limits: RequestLimits) -> Counts:
    """Count the messages of a protobuf ``body`` of type ``descriptor`` without decoding it.

    Raises :class:`RequestTooBig` at the first limit crossed (the scan stops there, so its cost
    is bounded by the limits, not by the body: ~0.4 µs a message) and :class:`Malformed` on
    broken wire format.
    """
    messages = resources = records = points = 0
    resource_bytes: list[int] = []
    record_bytes: list[int] = []
    fields, end = _message_fields(descriptor), len(body)
    stack: list[tuple[dict[int, tuple[dict, int]], int]] = [(fields, end)]
    pos = 0
    while True:
        if pos >= end:
            if pos > end:
                raise Malformed("a field runs past the end of its message")
            stack.pop()
            if not stack:
                return Counts(messages, resources, records, points, resource_bytes, record_bytes)
            fields, end = stack[-1]
            continue
        key = body[pos]  # one-byte varints inline: the loop runs once per field
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(body, pos, end)
        wire = key & 7
        if wire == 2:
            if pos >= end:
                raise Malformed("truncated varint")
            length = body[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = _varint(body, pos, end)
            if pos + length > end:
                raise Malformed("a length runs past the end of its message")
            sub = fields.get(key >> 3)
            if sub is None:  # a string, bytes or packed scalars: skipped whole
                pos += length
                continue
            messages += 1
            if messages > limits.max_messages:
                raise _too_big(limits.max_messages, "messages")
            kind = sub[1]
            if kind == _RECORD:
                record_bytes.append(length)
                records += 1
                if records > limits.max_records:
                    raise _too_big(limits.max_records, "log records")
            elif kind == _POINT:
                points += 1
                if points > limits.max_points:
                    raise _too_big(limits.max_points, "data points")
            elif kind == _RESOURCE:
                if len(stack) == 1:  # a request's own resources (ResourceLogs, ResourceMetrics)
                    resource_bytes.append(length)
                resources += 1
                if resources > limits.max_resources:
                    raise _too_big(limits.max_resources, "resources")
            if len(stack) >= _MAX_DEPTH:
                raise Malformed(f"messages nested over {_MAX_DEPTH} deep")
            fields, end = sub[0], pos + length
            stack.append((fields, end))
        elif wire == 0:
            _, pos = _varint(body, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:  # groups (3, 4) are not in OTLP; 6, 7 do not exist
            raise Malformed(f"wire type {wire}")


def _too_big(most: int, what: str) -> RequestTooBig:
    return RequestTooBig(f"over {most} {what} in one request: send smaller batches")
