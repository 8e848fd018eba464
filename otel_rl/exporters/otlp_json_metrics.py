"""The run folder's metric lines: an SDK ``MetricsData`` as ``ExportMetricsServiceRequest``
OTLP/JSON, built straight from its points (the span and log encoders, and the pieces all three
share, are in :mod:`otel_rl.exporters.otlp_json_encoders`)."""

from __future__ import annotations

from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import Gauge, Histogram, MetricsData, Sum

from otel_rl.exporters.otlp_json_encoders import (
    _ENCODE_ERRORS,
    _NON_FINITE,
    _attributes,
    _dumps,
    _NotPlain,
    _resource_entry,
    _scope,
    to_otlp_json,
)

__all__ = ["metrics_to_otlp_json"]


def _double(value: float) -> Any:
    return value if value - value == 0 else _NON_FINITE[repr(float(value))]


# Each series' encoded attributes, kept across exports: a series' attributes object lives as long
# as the series (otel-rl's latest values and the SDK's aggregations hold one per series), so it is
# encoded once, not at every export. An entry holds the object (its id cannot be reused while
# cached) and a snapshot of its items, so an attributes dict changed in place is encoded again
# (all but a value swapped for an equal one of another type, True for 1: the SDK's own series key,
# frozenset(attributes.items()), does not tell those apart either).
_SERIES_ATTRIBUTES: dict[int, tuple[Any, tuple[tuple[Any, Any], ...], list[dict[str, Any]]]] = {}
_SERIES_ATTRIBUTES_MAX = 20_000  # a bound for callers that build new attributes per export


def _point_attributes(attributes: Any) -> list[dict[str, Any]]:
    items = tuple(attributes.items())
    found = _SERIES_ATTRIBUTES.get(id(attributes))
    if found is not None and found[0] is attributes and found[1] == items:
        return found[2]
    encoded = _attributes(attributes)
    if len(_SERIES_ATTRIBUTES) >= _SERIES_ATTRIBUTES_MAX:
        _SERIES_ATTRIBUTES.clear()
    _SERIES_ATTRIBUTES[id(attributes)] = (attributes, items, encoded)
    return encoded


# Fields in proto field-number order, as MessageToDict writes them.
def _number_point(point: Any, with_start: bool) -> dict[str, Any]:
    if point.exemplars:
        raise _NotPlain("exemplars")
    out: dict[str, Any] = {}
    if with_start and point.start_time_unix_nano:
        out["startTimeUnixNano"] = str(point.start_time_unix_nano)
    if point.time_unix_nano:
        out["timeUnixNano"] = str(point.time_unix_nano)
    value = point.value
    if type(value) is float:
        out["asDouble"] = _double(value)
    elif type(value) is int:
        out["asInt"] = str(value)
    else:
        raise _NotPlain(type(value).__name__)
    if point.attributes:
        out["attributes"] = _point_attributes(point.attributes)
    return out


# A histogram's bucket bounds, encoded once: a tuple (immutable) is shared by every point of its
# metric and kept while cached, so its id stays its own.
_BOUNDS: dict[int, tuple[tuple[float, ...], list[Any]]] = {}


def _bounds(bounds: Any) -> list[Any]:
    found = _BOUNDS.get(id(bounds))
    if found is not None and found[0] is bounds:
        return found[1]
    encoded = [_double(float(b)) for b in bounds]
    if type(bounds) is tuple:
        if len(_BOUNDS) >= _SERIES_ATTRIBUTES_MAX:
            _BOUNDS.clear()
        _BOUNDS[id(bounds)] = (bounds, encoded)
    return encoded


def _histogram_point(point: Any) -> dict[str, Any]:
    if point.exemplars:
        raise _NotPlain("exemplars")
    out: dict[str, Any] = {}
    if point.start_time_unix_nano:
        out["startTimeUnixNano"] = str(point.start_time_unix_nano)
    if point.time_unix_nano:
        out["timeUnixNano"] = str(point.time_unix_nano)
    if point.count:
        out["count"] = str(point.count)
    if point.sum is not None:
        out["sum"] = _double(float(point.sum))
    counts = point.bucket_counts
    if len(counts):
        out["bucketCounts"] = list(map(str, map(int, counts.tolist() if hasattr(counts, "tolist") else counts)))
    if len(point.explicit_bounds):
        out["explicitBounds"] = _bounds(point.explicit_bounds)
    if point.attributes:
        out["attributes"] = _point_attributes(point.attributes)
    if point.min is not None:
        out["min"] = _double(float(point.min))
    if point.max is not None:
        out["max"] = _double(float(point.max))
    return out


def _metric(metric: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": metric.name} if metric.name else {}
    if metric.description:
        out["description"] = metric.description
    if metric.unit:
        out["unit"] = metric.unit
    data, kind = metric.data, type(metric.data)
    if not data.data_points:
        raise _NotPlain("no data points")
    if kind is Gauge:
        out["gauge"] = {"dataPoints": [_number_point(p, False) for p in data.data_points]}
    elif kind is Sum:
        body: dict[str, Any] = {"dataPoints": [_number_point(p, True) for p in data.data_points]}
        if int(data.aggregation_temporality):
            body["aggregationTemporality"] = int(data.aggregation_temporality)
        if data.is_monotonic:
            body["isMonotonic"] = True
        out["sum"] = body
    elif kind is Histogram:
        body = {"dataPoints": [_histogram_point(p) for p in data.data_points]}
        if int(data.aggregation_temporality):
            body["aggregationTemporality"] = int(data.aggregation_temporality)
        out["histogram"] = body
    else:
        raise _NotPlain(kind.__name__)
    return out


def metrics_to_otlp_json(metrics_data: MetricsData) -> str:
    """An ExportMetricsServiceRequest for ``metrics_data`` as OTLP/JSON, built straight from it.

    The same JSON as ``to_otlp_json(encode_metrics(metrics_data))`` (a test holds them equal),
    several times faster: a replayed log carries one point per step and series. Gauges, sums and
    explicit-bucket histograms without exemplars take this path; anything else the protobuf one.
    """
    try:
        grouped: dict[Any, dict[Any, list[dict[str, Any]]]] = {}
        for resource_metrics in metrics_data.resource_metrics:
            scopes = grouped[resource_metrics.resource] = {}
            for scope_metrics in resource_metrics.scope_metrics:
                entry: dict[str, Any] = {"scope": _scope(scope_metrics.scope), "metrics": [_metric(m) for m in scope_metrics.metrics]}
                if scope_metrics.scope.schema_url:
                    entry["schemaUrl"] = scope_metrics.scope.schema_url
                scopes[scope_metrics.scope] = entry  # type: ignore[assignment]
        resource_entries = [_resource_entry(resource, "scopeMetrics", list(scopes.values())) for resource, scopes in grouped.items()]
        return _dumps({"resourceMetrics": resource_entries})
    except (_NotPlain, KeyError, AttributeError, TypeError, ValueError, *_ENCODE_ERRORS):
        return to_otlp_json(encode_metrics(metrics_data))
