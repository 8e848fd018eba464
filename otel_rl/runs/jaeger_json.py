"""One trace as the JSON Jaeger's UI loads from its upload button (the /api/traces/<id> shape).

Jaeger's "JSON File" upload takes ``{"data": [{"traceID", "spans": [...], "processes": {...}}]}``
with microsecond times, hex ids, typed tags and span events as logs. This lets a user look at one
step's trace in Jaeger without a Jaeger server holding it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from typing import Any

from otel_rl.runs.folder import SpanRecord
from otel_rl.semconv import attributes as A

# OTLP SpanKind numbers -> the names Jaeger shows.
_SPAN_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, str):
        return {"key": key, "type": "string", "value": value}
    return {"key": key, "type": "string", "value": json.dumps(value, default=str)}


def _tags(attributes: dict[str, Any]) -> list[dict[str, Any]]:
    return [_tag(k, v) for k, v in sorted(attributes.items())]


def to_jaeger_trace(spans: Sequence[SpanRecord]) -> dict[str, Any]:
    """Convert the spans of ONE trace into Jaeger's trace JSON (``{"data": [trace]}``)."""
    if not spans:
        raise ValueError("no spans to convert")
    trace_ids = {s.trace_id for s in spans}
    if len(trace_ids) != 1:
        raise ValueError(f"spans belong to {len(trace_ids)} traces; convert one trace at a time")
    processes: dict[tuple, str] = {}
    process_json: dict[str, Any] = {}
    out_spans = []
    for span in sorted(spans, key=lambda s: s.start_ns):
        resource = dict(span.resource or {})
        service = str(resource.pop(A.SERVICE_NAME, "unknown_service"))
        key = (service, tuple(sorted((k, json.dumps(v, default=str)) for k, v in resource.items())))
        pid = processes.get(key)
        if pid is None:
            pid = processes[key] = f"p{len(processes) + 1}"
            process_json[pid] = {"serviceName": service, "tags": _tags(resource)}
        tags = _tags(span.attributes)
        tags.append(_tag("span.kind", _SPAN_KINDS.get(span.kind, "internal")))
        if span.status == "error":
            tags += [_tag("error", True), _tag("otel.status_code", "ERROR")]
            if span.status_message:
                tags.append(_tag("otel.status_description", span.status_message))
        if span.scope:
            tags.append(_tag("otel.scope.name", span.scope))
        references = []
        if span.parent_span_id:
            references.append({"refType": "CHILD_OF", "traceID": span.trace_id, "spanID": span.parent_span_id})
        out_spans.append(
            {
                "traceID": span.trace_id,
                "spanID": span.span_id,
                "operationName": span.name,
                "references": references,
                "startTime": span.start_ns // 1000,
                "duration": max((span.end_ns - span.start_ns) // 1000, 0),
                "tags": tags,
                "logs": [{"timestamp": e.time_ns // 1000, "fields": [_tag("event", e.name), *_tags(e.attributes)]} for e in span.events],
                "processID": pid,
                "warnings": None,
                "flags": 1,
            }
        )
    return {"data": [{"traceID": next(iter(trace_ids)), "spans": out_spans, "processes": process_json, "warnings": None}]}


def write_jaeger_json(spans: Iterable[SpanRecord], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(to_jaeger_trace(list(spans)), fh, indent=1)
        fh.write("\n")


def jaeger_answers(base_url: str, timeout_s: float = 1.0) -> bool:
    """Whether a Jaeger query service answers at ``base_url`` (its ``/api/services`` lists services).

    Bounded by ``timeout_s``: a link to a Jaeger that does not run is never printed.
    """
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/api/services", timeout=timeout_s) as response:  # noqa: S310 - a user-given URL
            body = json.loads(response.read(1_000_000).decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return isinstance(body, dict) and "data" in body
