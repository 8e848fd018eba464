"""Spans as the bytes of an OTLP ``ExportTraceServiceRequest``, written straight from the spans.

The SDK's ``encode_spans`` builds a protobuf message per span, attribute and value and then
serializes them: ~75 us a span, 0.5-0.8 ms of the telemetry worker's CPU for a step's 7 spans
into the spool (a third of its work a step over OTLP). Here the wire format is written directly
(fields in number order, as protobuf serializes them), each resource and scope once per run and
each attribute key's bytes once: the same bytes as ``encode_spans(spans).SerializeToString()``
(tests hold them equal). A value this does not cover (a nested map, an int past 64 bits, bytes)
sends the batch through the SDK's encoder.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind

from otel_rl.exporters.protobuf_wire import Unsupported, field, key_value, pack_fixed32, pack_fixed64, varint

_KIND_CODES = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags: the parent's is_remote is known / true
_CACHE_LIMIT = 4096  # keys, resources and scopes kept (past it, encoded each time)


# (number, key, value) -> (the value's type, the field's bytes) for string, bool and int values (a
# stage's name, its cluster, the rank): True == 1 in a dict, so the type is checked on a hit.
_FIELDS: dict[tuple[int, str, Any], tuple[type, bytes]] = {}


def _attributes(number: int, attributes: Any) -> bytes:
    """Each attribute as a repeated KeyValue field of field ``number``."""
    if not attributes:
        return b""
    out = []
    for key, value in attributes.items():
        kind = type(value)
        if kind is str or kind is int or kind is bool:
            found = _FIELDS.get((number, key, value))
            if found is not None and found[0] is kind:
                out.append(found[1])
                continue
            encoded = field(number, key_value(key, value))
            if found is None and (kind is not str or len(value) <= 256):  # (not long texts)
                if len(_FIELDS) >= _CACHE_LIMIT:  # rl.step takes a new value each step: start again
                    _FIELDS.clear()
                _FIELDS[(number, key, value)] = (kind, encoded)
            out.append(encoded)
        else:
            out.append(field(number, key_value(key, value)))
    return b"".join(out)


_RESOURCES: dict[int, tuple[Any, tuple[bytes, bytes]]] = {}  # id -> (the object, its fields' bytes)
_SCOPES: dict[int, tuple[Any, tuple[bytes, bytes]]] = {}


def _resource(resource: Any) -> tuple[bytes, bytes]:
    """(ResourceSpans.resource field, ResourceSpans.schema_url field). A Resource is immutable and
    kept while cached, so its id stays its own."""
    found = _RESOURCES.get(id(resource))
    if found is None or found[0] is not resource:
        schema = field(3, resource.schema_url.encode("utf-8")) if resource.schema_url else b""
        found = (resource, (field(1, _attributes(1, resource.attributes)), schema))
        if len(_RESOURCES) < _CACHE_LIMIT:
            _RESOURCES[id(resource)] = found
    return found[1]


def _scope(scope: Any) -> tuple[bytes, bytes]:
    """(ScopeSpans.scope field, ScopeSpans.schema_url field); none for spans without a scope."""
    if scope is None:
        return _no_scope(), b""
    found = _SCOPES.get(id(scope))
    if found is None or found[0] is not scope:
        body = field(1, scope.name.encode("utf-8")) if scope.name else b""
        if scope.version:
            body += field(2, scope.version.encode("utf-8"))
        body += _attributes(3, scope.attributes)
        schema = field(3, scope.schema_url.encode("utf-8")) if scope.schema_url else b""
        found = (scope, (field(1, body), schema))
        if len(_SCOPES) < _CACHE_LIMIT:
            _SCOPES[id(scope)] = found
    return found[1]


@functools.cache
def _no_scope() -> bytes:
    """What the SDK writes for spans without a scope: an empty scope (its recent versions) or none."""
    request = sdk_encode_spans([ReadableSpan("", SpanContext(1, 1, False))])
    return b"\x0a\x00" if request.resource_spans[0].scope_spans[0].HasField("scope") else b""


def _flags(parent: Any) -> bytes:
    """Span.flags / Link.flags (fixed32): whether the parent (or linked) context is remote."""
    return pack_fixed32(_HAS_IS_REMOTE | _IS_REMOTE if parent is not None and parent.is_remote else _HAS_IS_REMOTE)


def _span(span: Any) -> bytes:
    """One Span message's bytes, fields in number order."""
    context = span.get_span_context()
    out = [b"\x0a\x10", context.trace_id.to_bytes(16, "big"), b"\x12\x08", context.span_id.to_bytes(8, "big")]
    trace_state = context.trace_state
    if trace_state:
        out.append(field(3, ",".join(f"{k}={v}" for k, v in trace_state.items()).encode("utf-8")))
    parent = span.parent
    if parent is not None:
        out += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    if span.name:
        out.append(field(5, span.name.encode("utf-8")))
    out += (b"\x30", bytes((_KIND_CODES[span.kind],)))
    if span.start_time:
        out += (b"\x39", pack_fixed64(span.start_time))
    if span.end_time:
        out += (b"\x41", pack_fixed64(span.end_time))
    out.append(_attributes(9, span.attributes))
    if span.dropped_attributes:
        out += (b"\x50", varint(span.dropped_attributes))
    for event in span.events:
        body = b"\x09" + pack_fixed64(event.timestamp) if event.timestamp else b""
        if event.name:
            body += field(2, event.name.encode("utf-8"))
        body += _attributes(3, event.attributes)
        if event.dropped_attributes:
            body += b"\x20" + varint(event.dropped_attributes)
        out.append(field(11, body))
    if span.dropped_events:
        out += (b"\x60", varint(span.dropped_events))
    for link in span.links:
        body = b"\x0a\x10" + link.context.trace_id.to_bytes(16, "big") + b"\x12\x08" + link.context.span_id.to_bytes(8, "big")
        body += _attributes(4, link.attributes)
        if link.dropped_attributes:
            body += b"\x28" + varint(link.dropped_attributes)
        out.append(field(13, body + b"\x35" + _flags(link.context)))
    if span.dropped_links:
        out += (b"\x70", varint(span.dropped_links))
    status = span.status
    if status is not None:
        body = field(2, status.description.encode("utf-8")) if status.description else b""
        code = status.status_code.value
        out.append(field(15, body + (b"\x18" + varint(code) if code else b"")))
    out += (b"\x85\x01", _flags(parent))  # field 16, fixed32
    return b"".join(out)


def encode_spans_request(spans: Sequence[Any]) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of ``spans``: resources, then scopes, in the
    order the spans first name them, as the SDK's ``encode_spans`` groups them."""
    try:
        # By the resource object, not its value: a Resource hashes by a json.dumps of its attributes
        # (~15 us a span). Spans of equal but distinct resources go in requests' resources of their own.
        grouped: dict[int, dict[Any, list[bytes]]] = {}
        resources: dict[int, Any] = {}
        for span in spans:
            resource = span.resource
            scopes = grouped.get(id(resource))
            if scopes is None:
                scopes = grouped[id(resource)] = {}
                resources[id(resource)] = resource
            scopes.setdefault(span.instrumentation_scope or None, []).append(field(2, _span(span)))
        out = []
        for key, scopes in grouped.items():
            resource = resources[key]
            resource_field, resource_schema = _resource(resource)
            body = [resource_field]
            for scope, encoded in scopes.items():
                scope_field, scope_schema = _scope(scope)
                body.append(field(2, scope_field + b"".join(encoded) + scope_schema))
            body.append(resource_schema)
            out.append(field(1, b"".join(body)))
        return b"".join(out)
    except (Unsupported, AttributeError, KeyError, TypeError, ValueError, OverflowError):
        return sdk_encode_spans(spans).SerializeToString()
