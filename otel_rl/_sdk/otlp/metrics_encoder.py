"""A metric export as an OTLP request, each series' attributes encoded once for the whole run.

The SDK's ``encode_metrics`` builds every data point's attributes again at each export: a Python
call per key and value, ~70% of a 250-key run's export over OTLP (~7 ms of CPU every 10 s). A
run's series keep their attribute sets from export to export, so here each set's ``KeyValue``
messages are built once and copied into each point (a copy in C). The request is the one the SDK
builds (a test holds the two equal); a metric of a kind or with exemplars this does not cover goes
through the SDK's encoder whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics as sdk_encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.metrics.export import Gauge, Histogram, MetricsData, Sum

_CACHED_SETS = 50_000  # attribute sets kept (a run past it is encoded as the SDK does)


class _Unsupported(Exception):
    """A value or a metric this encoder leaves to the SDK's."""


def _any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    raise _Unsupported(type(value).__name__)  # bytes, arrays, maps: rare in attributes, left to the SDK


class MetricsEncoder:
    """``encode(metrics_data)``: the ``ExportMetricsServiceRequest`` the SDK's ``encode_metrics`` makes."""

    def __init__(self) -> None:
        self._sets: dict[tuple[tuple[str, Any], ...], tuple[tuple[type, ...], list[KeyValue]]] = {}

    def encode(self, data: MetricsData) -> ExportMetricsServiceRequest:
        try:
            return self._encode(data)
        except (_Unsupported, TypeError):  # (TypeError: an attribute value that cannot be hashed)
            return sdk_encode_metrics(data)

    def _attributes(self, attributes: Mapping[str, Any] | None) -> list[KeyValue]:
        if not attributes:
            return []
        key = tuple(attributes.items())
        types = tuple(map(type, attributes.values()))  # True == 1 == 1.0 as dict keys; not in OTLP
        found = self._sets.get(key)
        if found is not None and found[0] == types:
            return found[1]
        encoded = [KeyValue(key=str(k), value=_any_value(v)) for k, v in key]
        if found is None and len(self._sets) < _CACHED_SETS:
            self._sets[key] = (types, encoded)
        return encoded

    def _encode(self, data: MetricsData) -> ExportMetricsServiceRequest:
        request = ExportMetricsServiceRequest()
        for resource_metrics in data.resource_metrics:
            resource = resource_metrics.resource
            out = request.resource_metrics.add()
            out.resource.attributes.extend(self._attributes(resource.attributes))
            out.schema_url = resource.schema_url
            for scope_metrics in resource_metrics.scope_metrics:
                scope = scope_metrics.scope
                out_scope = out.scope_metrics.add()
                out_scope.scope.name = scope.name
                if scope.version:
                    out_scope.scope.version = scope.version
                out_scope.scope.attributes.extend(self._attributes(scope.attributes))
                out_scope.schema_url = scope.schema_url or ""
                for metric in scope_metrics.metrics:
                    self._metric(out_scope.metrics.add(), metric)
        return request

    def _metric(self, out: Any, metric: Any) -> None:
        out.name, out.description, out.unit = metric.name, metric.description, metric.unit
        data = metric.data
        if isinstance(data, Gauge):
            self._numbers(out.gauge.data_points, data.data_points, start=False)
        elif isinstance(data, Sum):
            out.sum.aggregation_temporality = data.aggregation_temporality
            out.sum.is_monotonic = data.is_monotonic
            self._numbers(out.sum.data_points, data.data_points, start=True)
        elif isinstance(data, Histogram):
            out.histogram.aggregation_temporality = data.aggregation_temporality
            for point in data.data_points:
                if point.exemplars:
                    raise _Unsupported("exemplars")
                pt = out.histogram.data_points.add(
                    time_unix_nano=point.time_unix_nano,
                    start_time_unix_nano=point.start_time_unix_nano,
                    count=point.count,
                    sum=point.sum,
                    bucket_counts=point.bucket_counts,
                    explicit_bounds=point.explicit_bounds,
                    max=point.max,
                    min=point.min,
                )
                pt.attributes.extend(self._attributes(point.attributes))
        else:
            raise _Unsupported(type(data).__name__)

    def _numbers(self, out: Any, points: Sequence[Any], *, start: bool) -> None:
        for point in points:
            if point.exemplars:
                raise _Unsupported("exemplars")
            pt = out.add(time_unix_nano=point.time_unix_nano)
            if start:
                pt.start_time_unix_nano = point.start_time_unix_nano or 0
            pt.attributes.extend(self._attributes(point.attributes))
            value = point.value
            if isinstance(value, int):
                pt.as_int = value
            else:
                pt.as_double = value
