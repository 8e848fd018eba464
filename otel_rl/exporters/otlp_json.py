"""OTLP/JSON lines exporters: the run folder's ``traces.jsonl``, ``metrics.jsonl``, ``logs.jsonl``.

Each ``export()`` call appends exactly one line: one ``ExportTraceServiceRequest`` /
``ExportMetricsServiceRequest`` / ``ExportLogsServiceRequest`` in the OTLP/JSON encoding, the
format the OpenTelemetry Collector's ``file`` exporter writes and its ``otlpjsonfile`` receiver
reads:

* the protobuf is built by the official OTLP encoders (``opentelemetry.exporter.otlp.proto.common``),
  so the content is exactly what the OTLP/gRPC and OTLP/HTTP exporters would send;
* proto3 JSON mapping with lowerCamelCase field names, enums as integers, int64 as decimal
  strings, default values omitted;
* ``traceId`` / ``spanId`` / ``parentSpanId`` (spans, span links, log records, exemplars) as
  lowercase hex strings, which is the one place where OTLP/JSON differs from plain proto3 JSON
  (that would use base64).

The exporters never raise into the SDK: an encoding or I/O error is logged once (per exporter)
on the ``otel_rl`` logger and the export returns ``FAILURE``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import IO, Any, Callable

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = [
    "OtlpJsonLogExporter",
    "OtlpJsonMetricExporter",
    "OtlpJsonSpanExporter",
    "logs_to_otlp_json",
    "to_otlp_json",
]

_logger = logging.getLogger("otel_rl")

# Every bytes field of the OTLP protos that OTLP/JSON writes as hex. The keys of the dicts that
# MessageToDict produces are always proto field names (attributes are lists of {"key","value"}),
# so a user attribute can never be mistaken for one of these.
_HEX_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _ids_to_hex(obj: Any) -> None:
    """Rewrite, in place, the base64 id fields of a MessageToDict result as lowercase hex."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in _HEX_ID_FIELDS and isinstance(value, str):
                obj[key] = _b64_to_hex(value)
            elif isinstance(value, (dict, list)):
                _ids_to_hex(value)
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, (dict, list)):
                _ids_to_hex(item)


def to_otlp_json(message: Message) -> str:
    """One OTLP protobuf message as a compact OTLP/JSON string (no trailing newline)."""
    as_dict = json_format.MessageToDict(
        message,
        use_integers_for_enums=True,
        preserving_proto_field_name=False,
    )
    _ids_to_hex(as_dict)
    return json.dumps(as_dict, separators=(",", ":"), ensure_ascii=False)


class _NotPlain(Exception):
    """A value the direct log encoder does not handle: use the protobuf path for the batch."""


_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _any_value(value: Any) -> dict[str, Any]:
    """An AnyValue in OTLP/JSON, as MessageToDict writes it (int64 as a string, non-finite
    doubles as "NaN" / "Infinity", empty containers as an empty message)."""
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is float:
        return {"doubleValue": value if value - value == 0 else _NON_FINITE[repr(value)]}
    if kind is bool:
        return {"boolValue": value}
    if kind is int:
        return {"intValue": str(value)}
    if kind is dict:
        return {"kvlistValue": {"values": [_key_value(k, v) for k, v in value.items()]} if value else {}}
    if kind is list or kind is tuple:
        return {"arrayValue": {"values": [_any_value(v) for v in value]} if value else {}}
    raise _NotPlain(kind.__name__)


def _key_value(key: Any, value: Any) -> dict[str, Any]:
    if type(key) is not str or not key:
        raise _NotPlain("key")
    return {"key": key, "value": _any_value(value) if value is not None else {}}


def _attributes(attributes: Any) -> list[dict[str, Any]]:
    return [_key_value(k, v) for k, v in attributes.items()] if attributes else []


def _scope(scope: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if scope is None:
        return out
    if scope.name:
        out["name"] = scope.name
    if scope.version:
        out["version"] = scope.version
    if scope.attributes:
        out["attributes"] = _attributes(scope.attributes)
    return out


def _log_record(readable: ReadableLogRecord) -> dict[str, Any]:
    record = readable.log_record
    out: dict[str, Any] = {}
    if record.timestamp:
        out["timeUnixNano"] = str(record.timestamp)
    severity = getattr(record.severity_number, "value", None)
    if severity:
        out["severityNumber"] = severity
    if record.severity_text:
        out["severityText"] = record.severity_text
    out["body"] = _any_value(record.body) if record.body is not None else {}
    if record.attributes:
        out["attributes"] = _attributes(record.attributes)
    if readable.dropped_attributes:
        out["droppedAttributesCount"] = readable.dropped_attributes
    if int(record.trace_flags or 0):
        out["flags"] = int(record.trace_flags)
    if record.trace_id:
        out["traceId"] = format(record.trace_id, "032x")
    if record.span_id:
        out["spanId"] = format(record.span_id, "016x")
    if record.observed_timestamp:
        out["observedTimeUnixNano"] = str(record.observed_timestamp)
    if record.event_name:
        out["eventName"] = record.event_name
    return out


def logs_to_otlp_json(batch: Sequence[ReadableLogRecord]) -> str:
    """An ExportLogsServiceRequest for ``batch`` as OTLP/JSON, built straight from the records.

    The same JSON as ``to_otlp_json(encode_logs(batch))`` (a test holds them equal) about 10x
    faster: the protobuf round trip through MessageToDict dominated replaying logs into a run
    folder. Anything unusual (other value types, empty keys) takes the protobuf path.
    """
    try:
        grouped: dict[Any, dict[Any, list[dict[str, Any]]]] = {}
        for readable in batch:
            scope = readable.instrumentation_scope or None
            grouped.setdefault(readable.resource, {}).setdefault(scope, []).append(_log_record(readable))
        resource_logs = []
        for resource, scopes in grouped.items():
            scope_logs = []
            for scope, records in scopes.items():
                entry: dict[str, Any] = {"scope": _scope(scope), "logRecords": records}
                if scope is not None and scope.schema_url:
                    entry["schemaUrl"] = scope.schema_url
                scope_logs.append(entry)
            resource_entry: dict[str, Any] = {"resource": {"attributes": _attributes(resource.attributes)}
                                              if resource.attributes else {}, "scopeLogs": scope_logs}
            if resource.schema_url:
                resource_entry["schemaUrl"] = resource.schema_url
            resource_logs.append(resource_entry)
        return json.dumps({"resourceLogs": resource_logs}, separators=(",", ":"), ensure_ascii=False)
    except (_NotPlain, KeyError, AttributeError, TypeError, ValueError):
        return to_otlp_json(encode_logs(batch))


class _JsonLinesFile:
    """A file opened once in append mode, written one whole line per call, under a lock.

    Errors are swallowed: the first one is logged (warning, with the reason), later ones at debug
    level, and the call reports failure with ``False``.
    """

    def __init__(self, path: str | os.PathLike[str], signal: str) -> None:
        self.path = os.fspath(path)
        self._signal = signal
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._shutdown = False
        self._error_logged = False
        with self._lock:
            self._open_locked()

    def _report(self, what: str, error: BaseException) -> None:
        if not self._error_logged:
            self._error_logged = True
            _logger.warning(
                "otel-rl: cannot %s %s file %s: %s: %s (further errors of this exporter are "
                "logged at debug level; telemetry for this signal is being dropped)",
                what,
                self._signal,
                self.path,
                type(error).__name__,
                error,
            )
        else:
            _logger.debug("otel-rl: cannot %s %s file %s: %r", what, self._signal, self.path, error)

    def _open_locked(self) -> bool:
        if self._file is not None:
            return True
        try:
            parent = os.path.dirname(self.path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            # newline="\n": no "\r\n" translation on any platform; one record per "\n".
            self._file = open(self.path, "a", encoding="utf-8", newline="\n")  # noqa: SIM115
            return True
        except Exception as error:  # noqa: BLE001 - never raise into the SDK
            self._report("open", error)
            return False

    def write_line(self, make_line: Callable[[], str | None]) -> bool:
        """Append ``make_line()`` plus a newline; ``None`` means nothing to write (success)."""
        with self._lock:
            if self._shutdown:
                return False
            try:
                line = make_line()
            except Exception as error:  # noqa: BLE001 - encoding error, drop this batch
                self._report("encode data for the", error)
                return False
            if line is None:
                return True
            if not self._open_locked():
                return False
            assert self._file is not None
            try:
                self._file.write(line + "\n")
                self._file.flush()
                return True
            except Exception as error:  # noqa: BLE001
                self._report("write to", error)
                return False

    def flush(self) -> bool:
        with self._lock:
            if self._file is None:
                return not self._shutdown
            try:
                self._file.flush()
                return True
            except Exception as error:  # noqa: BLE001
                self._report("flush", error)
                return False

    def close(self) -> None:
        with self._lock:
            self._shutdown = True
            file, self._file = self._file, None
            if file is None:
                return
            try:
                file.close()
            except Exception as error:  # noqa: BLE001
                self._report("close", error)


class OtlpJsonSpanExporter(SpanExporter):
    """Appends one ``ExportTraceServiceRequest`` OTLP/JSON line per batch of spans to ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._out = _JsonLinesFile(path, "traces")

    @property
    def path(self) -> str:
        return self._out.path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        def make_line() -> str | None:
            if not spans:
                return None
            return to_otlp_json(encode_spans(spans))

        ok = self._out.write_line(make_line)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._out.flush()

    def shutdown(self) -> None:
        self._out.close()


class OtlpJsonMetricExporter(MetricExporter):
    """Appends one ``ExportMetricsServiceRequest`` OTLP/JSON line per collection to ``path``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        preferred_temporality: dict[type, AggregationTemporality] | None = None,
        preferred_aggregation: dict[type, Any] | None = None,
    ) -> None:
        super().__init__(
            preferred_temporality=preferred_temporality,
            preferred_aggregation=preferred_aggregation,
        )
        self._out = _JsonLinesFile(path, "metrics")

    @property
    def path(self) -> str:
        return self._out.path

    def export(
        self,
        metrics_data: MetricsData,
        timeout_millis: float = 10_000,
        **kwargs: Any,
    ) -> MetricExportResult:
        def make_line() -> str | None:
            if metrics_data is None or not metrics_data.resource_metrics:
                return None
            return to_otlp_json(encode_metrics(metrics_data))

        ok = self._out.write_line(make_line)
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._out.flush()

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._out.close()


class OtlpJsonLogExporter(LogRecordExporter):
    """Appends one ``ExportLogsServiceRequest`` OTLP/JSON line per batch of log records to ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._out = _JsonLinesFile(path, "logs")

    @property
    def path(self) -> str:
        return self._out.path

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        def make_line() -> str | None:
            if not batch:
                return None
            return logs_to_otlp_json(batch)

        ok = self._out.write_line(make_line)
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._out.flush()

    def shutdown(self) -> None:
        self._out.close()

