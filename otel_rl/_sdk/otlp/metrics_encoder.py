"""A metric export as the bytes of an OTLP request, each series' attributes encoded once for the run.

The SDK's ``encode_metrics`` builds a protobuf message per data point and attribute at every
export, then serializes them: ~4-7 ms of CPU every 10 s for a 250-key run over OTLP. A run's
series keep their attribute sets from export to export, so here each set's bytes are written once
and each point's fields straight into the wire format (fields in number order, as protobuf
serializes them): the same bytes as ``encode_metrics(data).SerializeToString()`` (tests hold them
equal). A metric of a kind this does not cover, exemplars, or an attribute value it does not
write itself sends the export through the SDK's encoder whole.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics as sdk_encode_metrics
from opentelemetry.sdk.metrics.export import Gauge, Histogram, MetricsData, Sum

from otel_rl.exporters.protobuf_wire import Unsupported, field, key_value, pack_double, pack_fixed64, pack_sfixed64, varint

_CACHED_SETS = 50_000  # attribute sets kept (a run past it has the rest written at each export)
# The field number of each message's repeated attributes.
_RESOURCE_ATTRIBUTES, _SCOPE_ATTRIBUTES, _NUMBER_ATTRIBUTES, _HISTOGRAM_ATTRIBUTES = 1, 3, 7, 9


def _str(number: int, text: str) -> bytes:
    """A string field, left out when empty (proto3)."""
    return field(number, text.encode("utf-8")) if text else b""


class MetricsEncoder:
    """``encode(metrics_data)``: the serialized ``ExportMetricsServiceRequest`` the SDK's ``encode_metrics`` makes."""

    def __init__(self) -> None:
        # (number, items) -> (value types, the repeated field's bytes); True == 1 == 1.0 as dict keys,
        # not in OTLP, so a set is reused only for the same value types.
        self._sets: dict[tuple[int, tuple[tuple[str, Any], ...]], tuple[tuple[type, ...], bytes]] = {}

    def encode(self, data: MetricsData) -> bytes:
        try:
            return self._encode(data)
        except (Unsupported, TypeError, ValueError, OverflowError, struct.error):  # (TypeError: an unhashable value)
            return sdk_encode_metrics(data).SerializeToString()

    def _attributes(self, number: int, attributes: Mapping[str, Any] | None) -> bytes:
        if not attributes:
            return b""
        key = (number, tuple(attributes.items()))
        types = tuple(map(type, attributes.values()))
        found = self._sets.get(key)
        if found is not None and found[0] == types:
            return found[1]
        encoded = b"".join(field(number, key_value(k, v)) for k, v in key[1])
        if found is None and len(self._sets) < _CACHED_SETS:
            self._sets[key] = (types, encoded)
        return encoded

    def _encode(self, data: MetricsData) -> bytes:
        out = []
        for resource_metrics in data.resource_metrics:
            resource = resource_metrics.resource
            body = [field(1, self._attributes(_RESOURCE_ATTRIBUTES, resource.attributes))]  # ResourceMetrics.resource
            for scope_metrics in resource_metrics.scope_metrics:
                scope = scope_metrics.scope
                scope_body = _str(1, scope.name) + _str(2, scope.version or "") + self._attributes(_SCOPE_ATTRIBUTES, scope.attributes)
                parts = [field(1, scope_body)]
                parts += [field(2, self._metric(metric)) for metric in scope_metrics.metrics]
                parts.append(_str(3, scope.schema_url or ""))
                body.append(field(2, b"".join(parts)))
            body.append(_str(3, resource.schema_url))
            out.append(field(1, b"".join(body)))
        return b"".join(out)

    def _metric(self, metric: Any) -> bytes:
        head = _str(1, metric.name) + _str(2, metric.description or "") + _str(3, metric.unit or "")
        data = metric.data
        if isinstance(data, Gauge):
            return head + field(5, self._numbers(data.data_points, start=False))
        if isinstance(data, Sum):
            body = self._numbers(data.data_points, start=True)
            if int(data.aggregation_temporality):
                body += b"\x10" + varint(int(data.aggregation_temporality))
            if data.is_monotonic:
                body += b"\x18\x01"
            return head + field(7, body)
        if isinstance(data, Histogram):
            body = b"".join(field(1, self._histogram_point(point)) for point in data.data_points)
            if int(data.aggregation_temporality):
                body += b"\x10" + varint(int(data.aggregation_temporality))
            return head + field(9, body)
        raise Unsupported(type(data).__name__)

    def _numbers(self, points: Sequence[Any], *, start: bool) -> bytes:
        """Each NumberDataPoint as a repeated data_points field (gauges have no start time, as the SDK writes them)."""
        out = []
        for point in points:
            if point.exemplars:
                raise Unsupported("exemplars")
            body = b"\x11" + pack_fixed64(point.start_time_unix_nano) if start and point.start_time_unix_nano else b""
            if point.time_unix_nano:
                body += b"\x19" + pack_fixed64(point.time_unix_nano)
            value = point.value
            body += b"\x31" + pack_sfixed64(value) if isinstance(value, int) else b"\x21" + pack_double(value)
            out.append(field(1, body + self._attributes(_NUMBER_ATTRIBUTES, point.attributes)))
        return b"".join(out)

    def _histogram_point(self, point: Any) -> bytes:
        if point.exemplars:
            raise Unsupported("exemplars")
        body = b"\x11" + pack_fixed64(point.start_time_unix_nano) if point.start_time_unix_nano else b""
        if point.time_unix_nano:
            body += b"\x19" + pack_fixed64(point.time_unix_nano)
        if point.count:
            body += b"\x21" + pack_fixed64(point.count)
        if point.sum is not None:
            body += b"\x29" + pack_double(point.sum)
        counts, bounds = list(point.bucket_counts), list(point.explicit_bounds)
        if counts:
            body += field(6, struct.pack(f"<{len(counts)}Q", *counts))  # packed fixed64
        if bounds:
            body += field(7, struct.pack(f"<{len(bounds)}d", *bounds))  # packed double
        body += self._attributes(_HISTOGRAM_ATTRIBUTES, point.attributes)
        if point.min is not None:
            body += b"\x59" + pack_double(point.min)
        if point.max is not None:
            body += b"\x61" + pack_double(point.max)
        return body
