"""Decoding OTLP/JSON ``Export*ServiceRequest`` objects (one parsed line of a run folder file)
into records: spans, log record dicts and flattened metric points.

A malformed request raises ``ValueError`` / ``TypeError`` / ``KeyError`` / ``AttributeError``;
the reader turns that into a skipped line. Only the standard library is needed (no protobuf).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from typing import Any

from otel_rl.runs.records import MetricPoint, SpanEvent, SpanRecord
from otel_rl.semconv import attributes as A

__all__ = ["StepKeySets", "decode_any_value", "decode_attributes", "decode_logs_request", "decode_metrics_request", "decode_trace_request"]


def _int(value: Any, default: int = 0) -> int:
    """int64/uint64/fixed64 fields: decimal strings in OTLP/JSON, numbers tolerated."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value)
    raise ValueError(f"expected an integer, got {value!r}")


def _float(value: Any, default: float | None = None) -> float | None:
    """double fields: numbers, or the strings "NaN" / "Infinity" / "-Infinity"."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return float(value)  # accepts "NaN", "Infinity", "-Infinity", "1e3"
    raise ValueError(f"expected a number, got {value!r}")


def _hex_id(value: Any, nbytes: int) -> str | None:
    """A trace/span id as lowercase hex; ``None`` when absent or all zero.

    OTLP/JSON says hex; plain proto3 JSON (base64) is accepted as well.
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"id is not a string: {value!r}")
    if len(value) == 2 * nbytes:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raw = b""
        if raw:
            return None if not any(raw) else raw.hex()
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != nbytes:
        raise ValueError(f"invalid {nbytes}-byte id {value!r}")
    return None if not any(raw) else raw.hex()


def decode_any_value(value: Any) -> Any:
    """An OTLP/JSON ``AnyValue`` object as the Python value it carries."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"AnyValue is not an object: {value!r}")
    if "stringValue" in value:
        return str(value["stringValue"])
    if "intValue" in value:
        return _int(value["intValue"])
    if "doubleValue" in value:
        return _float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [decode_any_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in value:
        return decode_attributes((value["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"])
    return None  # empty AnyValue


def decode_attributes(key_values: Any) -> dict[str, Any]:
    """A list of OTLP/JSON ``KeyValue`` objects as a dict."""
    if key_values is None:
        return {}
    if not isinstance(key_values, list):
        raise ValueError(f"attributes are not a list: {key_values!r}")
    out: dict[str, Any] = {}
    for kv in key_values:
        if not isinstance(kv, Mapping) or "key" not in kv:
            raise ValueError(f"attribute is not a KeyValue: {kv!r}")
        out[str(kv["key"])] = decode_any_value(kv.get("value"))
    return out


# The last resource decoded, with its JSON: a rank's file repeats one resource on every line, and
# decoding it again was a third of reading a 1,024-rank folder's traces. One slot, replaced whole.
_last_resource: tuple[Any, dict[str, Any]] = (None, {})


def _resource(resource_entry: Mapping[str, Any]) -> dict[str, Any]:
    """The resource's attributes (shared with the records of earlier lines of the same resource:
    read-only)."""
    global _last_resource
    raw = (resource_entry.get("resource") or {}).get("attributes")
    last = _last_resource
    if raw is not None and last[0] == raw:
        return last[1]
    decoded = decode_attributes(raw)
    _last_resource = (raw, decoded)
    return decoded


def _scope_name(scope_entry: Mapping[str, Any]) -> str:
    return str((scope_entry.get("scope") or {}).get("name", ""))


def _scope_version(scope_entry: Mapping[str, Any]) -> str:
    return str((scope_entry.get("scope") or {}).get("version", ""))


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{key} is not a list")
    return value


# ---- traces


def _status(span: Mapping[str, Any]) -> tuple[str, str]:
    status = span.get("status") or {}
    code = status.get("code", 0)
    if isinstance(code, str):  # tolerate enum names
        code = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(code, 0)
    return {1: "ok", 2: "error"}.get(int(code), "unset"), str(status.get("message", ""))


def decode_trace_request(obj: Mapping[str, Any]) -> list[SpanRecord]:
    spans: list[SpanRecord] = []
    for resource_spans in _list(obj, "resourceSpans"):
        resource = _resource(resource_spans)
        for scope_spans in _list(resource_spans, "scopeSpans"):
            scope, scope_version = _scope_name(scope_spans), _scope_version(scope_spans)
            for span in _list(scope_spans, "spans"):
                trace_id = _hex_id(span.get("traceId"), 16)
                span_id = _hex_id(span.get("spanId"), 8)
                if trace_id is None or span_id is None:
                    raise ValueError("span without traceId/spanId")
                status, message = _status(span)
                spans.append(
                    SpanRecord(
                        trace_id=trace_id,
                        span_id=span_id,
                        parent_span_id=_hex_id(span.get("parentSpanId"), 8),
                        name=str(span.get("name", "")),
                        start_ns=_int(span.get("startTimeUnixNano")),
                        end_ns=_int(span.get("endTimeUnixNano")),
                        attributes=decode_attributes(span.get("attributes")),
                        events=[
                            SpanEvent(
                                str(event.get("name", "")), _int(event.get("timeUnixNano")), decode_attributes(event.get("attributes"))
                            )
                            for event in _list(span, "events")
                        ],
                        resource=resource,
                        status=status,
                        status_message=message,
                        kind=_int(span.get("kind")),
                        scope=scope,
                        scope_version=scope_version,
                        links=[
                            (linked, linked_span)
                            for link in _list(span, "links")
                            if (linked := _hex_id(link.get("traceId"), 16)) is not None
                            and (linked_span := _hex_id(link.get("spanId"), 8)) is not None
                        ],
                    )
                )
    return spans


# ---- logs


def decode_logs_request(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for resource_logs in _list(obj, "resourceLogs"):
        resource = _resource(resource_logs)
        for scope_logs in _list(resource_logs, "scopeLogs"):
            scope = _scope_name(scope_logs)
            for log in _list(scope_logs, "logRecords"):
                observed = _int(log.get("observedTimeUnixNano"))
                records.append(
                    {
                        "timestamp": _int(log.get("timeUnixNano")) or observed,
                        "observed_timestamp": observed,
                        "event_name": str(log.get("eventName", "")) or None,
                        "body": decode_any_value(log.get("body")),
                        "attributes": decode_attributes(log.get("attributes")),
                        "trace_id": _hex_id(log.get("traceId"), 16),
                        "span_id": _hex_id(log.get("spanId"), 8),
                        "severity_number": _int(log.get("severityNumber")),
                        "severity_text": str(log.get("severityText", "")),
                        "resource": resource,
                        "scope": scope,
                    }
                )
    return records


class StepKeySets:
    """Restores the key -> value map of a run folder's compact ``rl.log`` records (written by
    ``otel_rl.exporters.step_events``): the first record of a key set carries the map and the
    ``rl.log.key_set`` attribute, later ones the attribute and the values alone (8 little-endian
    bytes each, in key order: a double, or an int64 where the map holds an int).
    One instance per file, fed its records in file order; the attribute is dropped, so a record
    reads as the SDK path would have written it."""

    def __init__(self) -> None:
        self._keys: dict[str, tuple[list[str], struct.Struct]] = {}

    def restore(self, records: list[dict[str, Any]]) -> str | None:
        """Restore ``records`` in place; a record whose keys no earlier line of the file holds is
        removed, and the return value says how many and which key set (None when all were read)."""
        lost: dict[str, int] = {}
        kept: list[dict[str, Any]] = []
        for record in records:
            attributes = record["attributes"]
            key_set = attributes.get(A.RL_LOG_KEY_SET)
            body = record["body"]
            if isinstance(key_set, str) and isinstance(body, dict):
                layout = "".join("q" if type(v) is int else "d" for v in body.values())
                self._keys[key_set] = (list(body), struct.Struct("<" + layout))
                del attributes[A.RL_LOG_KEY_SET]
            elif isinstance(key_set, str) and isinstance(body, bytes):
                known = self._keys.get(key_set)
                if known is None or len(body) != known[1].size:
                    lost[key_set] = lost.get(key_set, 0) + 1
                    continue
                record["body"] = dict(zip(known[0], known[1].unpack(body)))
                del attributes[A.RL_LOG_KEY_SET]
            kept.append(record)
        if not lost:
            return None
        records[:] = kept
        what = ", ".join(f"{count} of key set {key_set}" for key_set, count in lost.items())
        return f"skipped {sum(lost.values())} rl.log record(s) whose keys no earlier line holds ({what})"


# ---- metrics

_METRIC_KINDS = {
    "gauge": "gauge",
    "sum": "sum",
    "histogram": "histogram",
    "exponentialHistogram": "exponential_histogram",
    "summary": "summary",
}


def _decode_metric(metric: Mapping[str, Any], resource: dict[str, Any], scope: str) -> list[MetricPoint]:
    for json_key, kind in _METRIC_KINDS.items():
        if json_key in metric:
            data = metric[json_key] or {}
            break
    else:
        raise ValueError(f"metric {metric.get('name')!r} has no data")
    common = {
        "name": str(metric.get("name", "")),
        "unit": str(metric.get("unit", "")),
        "description": str(metric.get("description", "")),
        "kind": kind,
        "temporality": _int(data.get("aggregationTemporality")),
        "is_monotonic": bool(data.get("isMonotonic", False)),
        "resource": resource,
        "scope": scope,
    }
    points: list[MetricPoint] = []
    for dp in _list(data, "dataPoints"):
        point = MetricPoint(
            attributes=decode_attributes(dp.get("attributes")),
            time_ns=_int(dp.get("timeUnixNano")),
            start_time_ns=_int(dp.get("startTimeUnixNano")),
            **common,
        )
        if kind in ("gauge", "sum"):
            if "asInt" in dp:
                point.value = _int(dp["asInt"])
            elif "asDouble" in dp:
                point.value = _float(dp["asDouble"])
        else:
            point.count = _int(dp.get("count"))
            point.sum = _float(dp.get("sum"))
            point.min = _float(dp.get("min"))
            point.max = _float(dp.get("max"))
            if kind == "histogram":
                point.bucket_counts = [_int(c) for c in _list(dp, "bucketCounts")]
                point.explicit_bounds = [float(_float(b)) for b in _list(dp, "explicitBounds")]  # type: ignore[arg-type]
        points.append(point)
    return points


def decode_metrics_request(obj: Mapping[str, Any]) -> list[MetricPoint]:
    points: list[MetricPoint] = []
    for resource_metrics in _list(obj, "resourceMetrics"):
        resource = _resource(resource_metrics)
        for scope_metrics in _list(resource_metrics, "scopeMetrics"):
            scope = _scope_name(scope_metrics)
            for metric in _list(scope_metrics, "metrics"):
                points.extend(_decode_metric(metric, resource, scope))
    return points
