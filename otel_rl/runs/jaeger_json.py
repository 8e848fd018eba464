"""One trace in Jaeger's JSON: the shape its query API answers (``/api/traces``) and its UI uploads.

``to_jaeger_trace`` writes what Jaeger v2 itself returns for the same OTLP spans (its OTLP
translator, then the query service's tag sorting): per span the instrumentation scope as
``otel.scope.name`` / ``otel.scope.version``, the attributes, ``span.kind``, the status as
``otel.status_code`` (with ``error`` and ``otel.status_description`` for errors); the parent as a
CHILD_OF reference; events as logs whose first field is ``event``; resources as processes; times
in microseconds. ``spans_from_jaeger`` reads that shape back into SpanRecords.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from otel_rl.runs.records import SpanEvent, SpanRecord
from otel_rl.semconv import attributes as A

# OTLP SpanKind numbers -> the names Jaeger shows (0, unspecified, gets no tag).
_SPAN_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_KIND_NUMBERS = {name: number for number, name in _SPAN_KINDS.items()}
# Tags Jaeger derives from the span itself rather than from its attributes.
_DERIVED_TAGS = ("otel.scope.name", "otel.scope.version", "span.kind", "otel.status_code", "otel.status_description", "error")


def _tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, str):
        return {"key": key, "type": "string", "value": value}
    # Arrays and maps: the collector's AsString(), compact JSON.
    return {"key": key, "type": "string", "value": json.dumps(value, default=str, separators=(",", ":"))}


def _sorted_tags(tags: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(tags, key=lambda t: t["key"])


def _span_tags(span: SpanRecord) -> list[dict[str, Any]]:
    tags = [_tag(k, v) for k, v in span.attributes.items()]
    if span.scope:
        tags.append(_tag("otel.scope.name", span.scope))
    if span.scope_version:
        tags.append(_tag("otel.scope.version", span.scope_version))
    if span.kind in _SPAN_KINDS:
        tags.append(_tag("span.kind", _SPAN_KINDS[span.kind]))
    if span.status == "ok":
        tags.append(_tag("otel.status_code", "OK"))
    elif span.status == "error":
        tags += [_tag("otel.status_code", "ERROR"), _tag("error", True)]
    if span.status_message:
        tags.append(_tag("otel.status_description", span.status_message))
    return _sorted_tags(tags)


def _log(event: SpanEvent) -> dict[str, Any]:
    fields = _sorted_tags(_tag(k, v) for k, v in event.attributes.items() if k != "event")
    return {"timestamp": event.time_ns // 1000, "fields": [_tag("event", event.name), *fields] if event.name else fields}


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
            process_json[pid] = {"serviceName": service, "tags": _sorted_tags(_tag(k, v) for k, v in resource.items())}
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
                "tags": _span_tags(span),
                "logs": [_log(e) for e in span.events],
                "processID": pid,
                "warnings": None,
            }
        )
    return {"data": [{"traceID": next(iter(trace_ids)), "spans": out_spans, "processes": process_json, "warnings": None}]}


def _tag_value(tag: Mapping[str, Any]) -> Any:
    value = tag.get("value")
    kind = tag.get("type")
    if kind == "int64":
        return int(value)  # type: ignore[arg-type]
    if kind == "float64":
        return float(value)  # type: ignore[arg-type]
    return value


def spans_from_jaeger(trace: Mapping[str, Any]) -> list[SpanRecord]:
    """The spans of one trace of Jaeger's JSON (one item of ``data``) as SpanRecords.

    Times come back in microseconds (Jaeger keeps no finer), so ``start_ns`` and ``end_ns`` are
    multiples of 1,000.
    """
    processes = trace.get("processes") or {}
    out: list[SpanRecord] = []
    for raw in trace.get("spans") or []:
        tags = {str(t["key"]): _tag_value(t) for t in raw.get("tags") or []}
        process = processes.get(raw.get("processID")) or {}
        resource = {str(t["key"]): _tag_value(t) for t in process.get("tags") or []}
        if process.get("serviceName"):
            resource[A.SERVICE_NAME] = process["serviceName"]
        code = tags.get("otel.status_code")
        status = "error" if code == "ERROR" or tags.get("error") is True else "ok" if code == "OK" else "unset"
        parents = [r for r in raw.get("references") or [] if r.get("refType") == "CHILD_OF" and r.get("traceID") == raw.get("traceID")]
        start_us = int(raw.get("startTime", 0))
        events = []
        for log in raw.get("logs") or []:
            fields = {str(f["key"]): _tag_value(f) for f in log.get("fields") or []}
            name = str(fields.pop("event", ""))
            events.append(SpanEvent(name, int(log.get("timestamp", 0)) * 1000, fields))
        out.append(
            SpanRecord(
                trace_id=str(raw.get("traceID", "")),
                span_id=str(raw.get("spanID", "")),
                parent_span_id=str(parents[0]["spanID"]) if parents else None,
                name=str(raw.get("operationName", "")),
                start_ns=start_us * 1000,
                end_ns=(start_us + int(raw.get("duration", 0))) * 1000,
                attributes={k: v for k, v in tags.items() if k not in _DERIVED_TAGS},
                events=events,
                resource=resource,
                status=status,
                status_message=str(tags.get("otel.status_description", "")),
                kind=_KIND_NUMBERS.get(str(tags.get("span.kind", "")), 0),
                scope=str(tags.get("otel.scope.name", "")),
                scope_version=str(tags.get("otel.scope.version", "")),
            )
        )
    return out


def write_jaeger_json(spans: Iterable[SpanRecord], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(to_jaeger_trace(list(spans)), fh, indent=1)
        fh.write("\n")
