"""The OTLP/JSON lines exporters, driven by the real OpenTelemetry SDK (no mocks).

Every written line is parsed back with protobuf's ``json_format.Parse`` into the OTLP collector
``Export*ServiceRequest`` messages (after turning the hex ids back into base64, the one place
where OTLP/JSON differs from proto3 JSON), which proves the lines are real OTLP/JSON.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.metrics import Observation
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter, MetricExportResult, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_rl.exporters import OtlpJsonLogExporter, OtlpJsonMetricExporter, OtlpJsonSpanExporter
from otel_rl.exporters.otlp_json import to_otlp_json
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

RESOURCE = Resource.create({"service.name": "otlp-json-test", "rl.run.id": "run-1"})
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")
ID_KEYS = {"traceId", "spanId", "parentSpanId"}


# ----------------------------------------------------------------------------- helpers


def _hex_ids_to_base64(obj):
    """Undo the OTLP/JSON hex id rule so plain protobuf JSON parsing accepts the object."""
    if isinstance(obj, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ID_KEYS else _hex_ids_to_base64(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids_to_base64(v) for v in obj]
    return obj


def _collect_ids(obj, found):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ID_KEYS:
                found.append((k, v))
            else:
                _collect_ids(v, found)
    elif isinstance(obj, list):
        for v in obj:
            _collect_ids(v, found)
    return found


def _parse_lines(path: Path, message_type):
    """Each line -> (dict, proto message). Also checks the line round-trips byte for byte."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    out = []
    for line in text.splitlines():
        obj = json.loads(line)
        for key, value in _collect_ids(obj, []):
            assert (HEX32 if key == "traceId" else HEX16).match(value), (key, value)
        message = json_format.Parse(json.dumps(_hex_ids_to_base64(obj)), message_type())
        # Same bytes when re-encoded: the line is exactly the canonical OTLP/JSON of the message.
        assert to_otlp_json(message) == line
        out.append((obj, message))
    return out


def _tracer_provider(path: Path) -> TracerProvider:
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonSpanExporter(path)))
    return provider


def _make_step_trace(provider: TracerProvider, step: int = 3) -> None:
    tracer = provider.get_tracer("otel_rl", "0.1.0")
    with tracer.start_as_current_span("rl.step", attributes={"rl.step": step}):
        with tracer.start_as_current_span("rl.generate", attributes={"rl.stage": "generate", "rl.cluster": "actor_infer"}):
            time.sleep(0.002)
        with tracer.start_as_current_span(
            "rl.compute_log_probs", attributes={"rl.stage": "compute_log_probs", "rl.cluster": "actor_train"}
        ):
            for phase in ("onload", "execute", "offload"):
                with tracer.start_as_current_span(f"rl.{phase}", attributes={"rl.stage.phase": phase}) as span:
                    if phase == "onload":
                        span.add_event("rl.memory.snapshot", {"rl.memory.when": "start", "rl.memory.allocated": 2**33, "hw.id": "0"})
                    time.sleep(0.001)


# ----------------------------------------------------------------------------- classes


def test_exporters_subclass_sdk_interfaces(tmp_path):
    span_exporter = OtlpJsonSpanExporter(tmp_path / "t.jsonl")
    metric_exporter = OtlpJsonMetricExporter(tmp_path / "m.jsonl", preferred_temporality={Counter: AggregationTemporality.DELTA})
    log_exporter = OtlpJsonLogExporter(tmp_path / "l.jsonl")
    assert isinstance(span_exporter, SpanExporter)
    assert isinstance(metric_exporter, MetricExporter)
    assert isinstance(log_exporter, LogRecordExporter)
    # preferred temporality reaches the SDK's MetricExporter base (used by the periodic reader)
    assert metric_exporter._preferred_temporality == {Counter: AggregationTemporality.DELTA}
    for exporter in (span_exporter, metric_exporter, log_exporter):
        assert exporter.force_flush() is True
        exporter.shutdown()


# ----------------------------------------------------------------------------- traces


def test_trace_lines_are_otlp_json(tmp_path):
    path = tmp_path / "run" / "nested" / "traces.jsonl"  # parent dirs are created
    provider = _tracer_provider(path)
    _make_step_trace(provider, step=3)
    provider.shutdown()

    lines = _parse_lines(path, ExportTraceServiceRequest)
    assert len(lines) == 6  # SimpleSpanProcessor: one export, hence one line, per span
    raw = path.read_text()
    assert re.search(r'"traceId":"[0-9a-f]{32}"', raw)
    assert re.search(r'"spanId":"[0-9a-f]{16}"', raw)
    assert '"parentSpanId":"' in raw

    spans = {}
    for obj, message in lines:
        assert set(obj) == {"resourceSpans"}
        rs = obj["resourceSpans"][0]
        resource = {kv["key"]: kv["value"] for kv in rs["resource"]["attributes"]}
        assert resource["service.name"] == {"stringValue": "otlp-json-test"}
        assert rs["scopeSpans"][0]["scope"] == {"name": "otel_rl", "version": "0.1.0"}
        for span in rs["scopeSpans"][0]["spans"]:
            spans[span["name"]] = span
        assert message.resource_spans[0].scope_spans[0].spans[0].trace_id  # bytes made it through

    assert list(spans) == ["rl.generate", "rl.onload", "rl.execute", "rl.offload", "rl.compute_log_probs", "rl.step"]  # end order
    root = spans["rl.step"]
    assert "parentSpanId" not in root  # default (empty) omitted
    assert root["kind"] == 1  # enum as integer (SPAN_KIND_INTERNAL)
    assert isinstance(root["startTimeUnixNano"], str)  # int64 as a decimal string
    assert root["attributes"] == [{"key": "rl.step", "value": {"intValue": "3"}}]
    assert "status" not in root or root["status"] == {}  # unset status: defaults omitted
    assert {s["traceId"] for s in spans.values()} == {root["traceId"]}
    assert spans["rl.generate"]["parentSpanId"] == root["spanId"]
    assert spans["rl.compute_log_probs"]["parentSpanId"] == root["spanId"]
    for phase in ("rl.onload", "rl.execute", "rl.offload"):
        assert spans[phase]["parentSpanId"] == spans["rl.compute_log_probs"]["spanId"]
    (event,) = spans["rl.onload"]["events"]
    assert event["name"] == "rl.memory.snapshot"
    assert {"key": "rl.memory.allocated", "value": {"intValue": str(2**33)}} in event["attributes"]


def test_span_links_and_status_are_encoded(tmp_path):
    from opentelemetry.trace import Link, Status, StatusCode

    path = tmp_path / "traces.jsonl"
    provider = _tracer_provider(path)
    tracer = provider.get_tracer("otel_rl")
    with tracer.start_as_current_span("rl.step", attributes={"rl.step": 1}) as first:
        pass
    with tracer.start_as_current_span("rl.step", links=[Link(first.get_span_context())]) as second:
        second.set_status(Status(StatusCode.ERROR, "boom"))
        second.set_attribute("rl.tags", ["a", "b"])
        second.set_attribute("rl.ratio", 0.25)
        second.set_attribute("rl.ok", True)
    provider.shutdown()
    (_, _), (obj, _) = _parse_lines(path, ExportTraceServiceRequest)
    span = obj["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    (link,) = span["links"]
    assert link["traceId"] == format(first.get_span_context().trace_id, "032x")
    assert link["spanId"] == format(first.get_span_context().span_id, "016x")
    assert span["status"] == {"code": 2, "message": "boom"}
    attributes = {kv["key"]: kv["value"] for kv in span["attributes"]}
    assert attributes["rl.tags"] == {"arrayValue": {"values": [{"stringValue": "a"}, {"stringValue": "b"}]}}
    assert attributes["rl.ratio"] == {"doubleValue": 0.25}
    assert attributes["rl.ok"] == {"boolValue": True}


def test_file_is_appended_not_truncated(tmp_path):
    path = tmp_path / "traces.jsonl"
    for _ in range(2):  # a second process / rerun appends to the same run folder
        provider = _tracer_provider(path)
        _make_step_trace(provider)
        provider.shutdown()
    assert len(_parse_lines(path, ExportTraceServiceRequest)) == 12


def test_concurrent_exports_write_whole_lines(tmp_path):
    path = tmp_path / "traces.jsonl"
    provider = _tracer_provider(path)
    tracer = provider.get_tracer("otel_rl")

    def work(n):
        for i in range(50):
            with tracer.start_as_current_span(f"rl.worker{n}", attributes={"i": i, "pad": "x" * 500}):
                pass

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    provider.shutdown()
    assert len(_parse_lines(path, ExportTraceServiceRequest)) == 400


# ----------------------------------------------------------------------------- metrics


def test_metric_lines_are_otlp_json(tmp_path):
    path = tmp_path / "metrics.jsonl"
    exporter = OtlpJsonMetricExporter(path)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60000)
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("otel_rl")
    histogram = meter.create_histogram("rl.sample.response_length", unit="{token}")
    counter = meter.create_counter("rl.progress.samples", unit="{sample}")
    meter.create_observable_gauge(
        "rl.gpu.memory.usage", callbacks=[lambda options: [Observation(2**31, {"hw.id": "0", "rl.memory.kind": "reserved"})]], unit="By"
    )
    # A measurement inside a sampled span gets an exemplar whose ids must be hex too.
    tracer_provider = TracerProvider()
    with tracer_provider.get_tracer("t").start_as_current_span("rl.step") as span:
        for value in (12, 250, 3000):
            histogram.record(value)
    counter.add(64)
    counter.add(32)
    assert provider.force_flush()
    provider.shutdown()

    lines = _parse_lines(path, ExportMetricsServiceRequest)
    assert len(lines) >= 1
    obj, _ = lines[0]
    metrics = {m["name"]: m for m in obj["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]}
    hist = metrics["rl.sample.response_length"]
    assert hist["unit"] == "{token}"
    (point,) = hist["histogram"]["dataPoints"]
    assert point["count"] == "3"
    assert point["sum"] == 3262.0
    assert len(point["bucketCounts"]) == len(point["explicitBounds"]) + 1
    assert hist["histogram"]["aggregationTemporality"] == 2  # CUMULATIVE, as an integer
    exemplar_ids = _collect_ids(point.get("exemplars", []), [])
    assert ("traceId", format(span.get_span_context().trace_id, "032x")) in exemplar_ids
    assert ("spanId", format(span.get_span_context().span_id, "016x")) in exemplar_ids
    total = metrics["rl.progress.samples"]["sum"]
    assert total["isMonotonic"] is True
    assert total["dataPoints"][0]["asInt"] == "96"
    gauge = metrics["rl.gpu.memory.usage"]["gauge"]["dataPoints"][0]
    assert gauge["asInt"] == str(2**31)
    assert {"key": "hw.id", "value": {"stringValue": "0"}} in gauge["attributes"]


def test_metric_exporter_honours_preferred_temporality(tmp_path):
    path = tmp_path / "metrics.jsonl"
    exporter = OtlpJsonMetricExporter(
        path, preferred_temporality={Counter: AggregationTemporality.DELTA, Histogram: AggregationTemporality.DELTA}
    )
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60000)
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("otel_rl").create_counter("rl.progress.tokens").add(7)
    provider.force_flush()
    provider.shutdown()
    obj, _ = _parse_lines(path, ExportMetricsServiceRequest)[0]
    (metric,) = obj["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
    assert metric["sum"]["aggregationTemporality"] == 1  # DELTA


# ----------------------------------------------------------------------------- logs


def test_log_lines_are_otlp_json(tmp_path):
    path = tmp_path / "logs.jsonl"
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(SimpleLogRecordProcessor(OtlpJsonLogExporter(path)))
    logger = provider.get_logger("otel_rl")
    tracer_provider = TracerProvider()
    with tracer_provider.get_tracer("t").start_as_current_span("rl.step") as span:
        logger.emit(body={"actor/pg_loss": 0.5, "step": 3}, attributes={"rl.step": 3}, event_name="rl.log")
    provider.shutdown()

    ((obj, message),) = _parse_lines(path, ExportLogsServiceRequest)
    (record,) = obj["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    assert record["eventName"] == "rl.log"
    assert record["body"] == {
        "kvlistValue": {"values": [{"key": "actor/pg_loss", "value": {"doubleValue": 0.5}}, {"key": "step", "value": {"intValue": "3"}}]}
    }
    assert record["attributes"] == [{"key": "rl.step", "value": {"intValue": "3"}}]
    assert record["traceId"] == format(span.get_span_context().trace_id, "032x")
    assert record["spanId"] == format(span.get_span_context().span_id, "016x")
    assert f'"traceId":"{record["traceId"]}"' in path.read_text()
    assert message.resource_logs[0].scope_logs[0].log_records[0].event_name == "rl.log"


# ----------------------------------------------------------------------------- failure paths


def _otel_rl_warnings(caplog):
    return [r for r in caplog.records if r.name == "otel_rl" and r.levelno >= logging.WARNING]


def test_unwritable_path_returns_failure_and_logs_once(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the run folder should be")
    caplog.set_level(logging.DEBUG, logger="otel_rl")

    exporter = OtlpJsonSpanExporter(blocker / "traces.jsonl")  # must not raise
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("rl.step") as span:
        pass
    results = [exporter.export([span]) for _ in range(3)]
    assert results == [SpanExportResult.FAILURE] * 3
    warnings = _otel_rl_warnings(caplog)
    assert len(warnings) == 1
    assert "traces" in warnings[0].getMessage() and "not-a-dir" in warnings[0].getMessage()
    exporter.force_flush()
    exporter.shutdown()

    metric_exporter = OtlpJsonMetricExporter(blocker / "metrics.jsonl")
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=60000)
    meter_provider = MeterProvider(metric_readers=[reader])
    meter_provider.get_meter("t").create_counter("c").add(1)
    meter_provider.force_flush()  # the reader gets FAILURE, nothing raises
    meter_provider.shutdown()

    log_exporter = OtlpJsonLogExporter(blocker / "logs.jsonl")
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    logger_provider.get_logger("t").emit(body="x")
    logger_provider.shutdown()
    said = [w.getMessage() for w in _otel_rl_warnings(caplog)]
    # one per exporter when it first fails, and one at its shutdown counting what it lost
    assert len([m for m in said if "cannot open" in m]) == 3, said
    lost = [m for m in said if "were lost" in m]
    assert len(lost) == 3 and "3 record(s) of traces" in lost[0] and "1 record(s) of logs" in lost[2], lost


def test_export_after_shutdown_fails_quietly(tmp_path):
    path = tmp_path / "logs.jsonl"
    exporter = OtlpJsonLogExporter(path)
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger("t")
    logger.emit(body="before")
    exporter.shutdown()
    exporter.shutdown()  # idempotent

    from opentelemetry._logs import LogRecord
    from opentelemetry.sdk._logs import ReadableLogRecord

    record = ReadableLogRecord(LogRecord(body="after"), resource=Resource.create({}))
    assert exporter.export([record]) is LogRecordExportResult.FAILURE
    assert len(path.read_text().splitlines()) == 1

    span_exporter = OtlpJsonSpanExporter(tmp_path / "traces.jsonl")
    span_exporter.shutdown()
    assert span_exporter.export([]) is SpanExportResult.FAILURE
    metric_exporter = OtlpJsonMetricExporter(tmp_path / "metrics.jsonl")
    metric_exporter.shutdown()
    assert metric_exporter.export(None) is MetricExportResult.FAILURE  # type: ignore[arg-type]


def test_empty_batches_write_nothing(tmp_path):
    path = tmp_path / "traces.jsonl"
    exporter = OtlpJsonSpanExporter(path)
    assert exporter.export([]) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert path.read_text() == ""


def test_encoding_error_is_failure_not_exception(tmp_path, caplog):
    class Unencodable:
        pass

    path = tmp_path / "logs.jsonl"
    exporter = OtlpJsonLogExporter(path)
    from opentelemetry._logs import LogRecord
    from opentelemetry.sdk._logs import ReadableLogRecord

    record = ReadableLogRecord(LogRecord(body=Unencodable()), resource=Resource.create({}))
    caplog.set_level(logging.DEBUG, logger="otel_rl")
    assert exporter.export([record]) is LogRecordExportResult.FAILURE
    assert len(_otel_rl_warnings(caplog)) == 1
    good = ReadableLogRecord(LogRecord(body="fine"), resource=Resource.create({}))
    assert exporter.export([good]) is LogRecordExportResult.SUCCESS  # the exporter keeps working
    exporter.shutdown()
    assert len(path.read_text().splitlines()) == 1


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_doubles_use_proto3_json_strings(tmp_path, value):
    path = tmp_path / "traces.jsonl"
    provider = _tracer_provider(path)
    with provider.get_tracer("t").start_as_current_span("s", attributes={"x": value}):
        pass
    provider.shutdown()
    line = path.read_text()
    expected = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(value)]
    assert f'"doubleValue":"{expected}"' in line
    _parse_lines(path, ExportTraceServiceRequest)


# ---- the direct log encoder equals the protobuf path -----------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_scalars = st.one_of(
    st.text(max_size=8), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True), st.none()
)
_values = st.recursive(
    _scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=8
)


def _readable(body, attributes, trace_id, span_id, event_name, resource_attrs, scope_name):
    from opentelemetry import trace
    from opentelemetry._logs import LogRecord, SeverityNumber
    from opentelemetry.sdk._logs import ReadableLogRecord
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    span = NonRecordingSpan(SpanContext(trace_id, span_id, False, TraceFlags(1 if trace_id else 0)))
    record = LogRecord(
        timestamp=1_700_000_000_123_456_789,
        observed_timestamp=1_700_000_000_223_456_789,
        context=trace.set_span_in_context(span),
        severity_number=SeverityNumber.INFO,
        body=body,
        attributes=attributes,
        event_name=event_name,
    )
    return ReadableLogRecord(
        record, resource=Resource(resource_attrs), instrumentation_scope=InstrumentationScope(scope_name, "1.0") if scope_name else None
    )


@settings(max_examples=200, deadline=None)
@given(
    body=_values,
    attributes=st.dictionaries(st.text(min_size=1, max_size=6), _scalars.filter(lambda v: v is not None), max_size=4),
    trace_id=st.integers(0, 2**128 - 1),
    span_id=st.integers(0, 2**64 - 1),
    event_name=st.sampled_from([None, "", "rl.log"]),
    scope_name=st.sampled_from([None, "otel_rl"]),
    rank=st.integers(0, 7),
)
def test_direct_log_encoding_is_the_protobuf_encoding(body, attributes, trace_id, span_id, event_name, scope_name, rank):
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs

    from otel_rl.exporters.otlp_json import logs_to_otlp_json, to_otlp_json

    batch = [
        _readable(body, attributes, trace_id, span_id, event_name, {"service.name": "s", "rl.rank": rank}, scope_name),
        _readable({"k": 1.5}, {}, 0, 0, "rl.log", {"service.name": "s", "rl.rank": rank + 1}, "otel_rl"),
    ]
    assert json.loads(logs_to_otlp_json(batch)) == json.loads(to_otlp_json(encode_logs(batch)))


def test_plain_event_batches_take_the_direct_path(monkeypatch):
    import otel_rl.exporters.otlp_json_encoders as module

    def no_protobuf(batch):
        raise AssertionError("took the protobuf path")

    batch = [
        _readable(
            {"actor/pg_loss": 0.5, "tag": "x", "n": 3, "nested": {"a": [1, 2.5]}},
            {"rl.step": 7},
            0x1234,
            0x99,
            "rl.log",
            {"service.name": "s"},
            "otel_rl",
        )
    ]
    expected = json.loads(module.to_otlp_json(module.encode_logs(batch)))
    monkeypatch.setattr(module, "encode_logs", no_protobuf)
    assert json.loads(module.logs_to_otlp_json(batch)) == expected


# ---- the direct metric encoder equals the protobuf path --------------------------------------

_numbers = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True))
_times = st.integers(0, 2**63 - 1)
_point_attributes = st.dictionaries(st.text(min_size=1, max_size=6), _scalars.filter(lambda v: v is not None), max_size=3)


@st.composite
def _metrics_data(draw):
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    def number_points():
        return [
            NumberDataPoint(
                attributes=draw(_point_attributes),
                start_time_unix_nano=draw(st.one_of(st.none(), _times)),
                time_unix_nano=draw(_times),
                value=draw(_numbers),
            )
            for _ in range(draw(st.integers(1, 3)))
        ]

    def histogram_points():
        points = []
        for _ in range(draw(st.integers(1, 3))):
            bounds = sorted(draw(st.lists(st.floats(-1e6, 1e6), max_size=4)))
            counts = draw(st.lists(st.integers(0, 2**40), min_size=len(bounds) + 1, max_size=len(bounds) + 1))
            points.append(
                HistogramDataPoint(
                    attributes=draw(_point_attributes),
                    start_time_unix_nano=draw(_times),
                    time_unix_nano=draw(_times),
                    count=sum(counts),
                    sum=draw(st.floats(allow_nan=True, allow_infinity=True)),
                    bucket_counts=counts,
                    explicit_bounds=bounds,
                    min=draw(st.one_of(st.none(), st.floats())),
                    max=draw(st.one_of(st.none(), st.floats())),
                )
            )
        return points

    temporality = draw(st.sampled_from(list(AggregationTemporality)))
    metrics = []
    for index in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["gauge", "sum", "histogram"]))
        data = (
            Gauge(data_points=number_points())
            if kind == "gauge"
            else Sum(data_points=number_points(), aggregation_temporality=temporality, is_monotonic=draw(st.booleans()))
            if kind == "sum"
            else Histogram(data_points=histogram_points(), aggregation_temporality=temporality)
        )
        metrics.append(
            Metric(
                name=f"m{index}", description=draw(st.sampled_from(["", "d"])), unit=draw(st.sampled_from(["", "s", "{step}"])), data=data
            )
        )
    scope = InstrumentationScope(
        draw(st.sampled_from(["otel_rl", "other"])), draw(st.sampled_from([None, "1.0"])), draw(st.sampled_from([None, "https://x"]))
    )
    resource = Resource(draw(_point_attributes), draw(st.sampled_from([None, "https://r"])))
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=resource,
                scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics, schema_url=scope.schema_url or "")],
                schema_url="",
            )
        ]
    )


@settings(max_examples=300, deadline=None)
@given(data=_metrics_data())
def test_direct_metric_encoding_is_the_protobuf_encoding(data):
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from otel_rl.exporters.otlp_json import metrics_to_otlp_json, to_otlp_json

    # the same JSON values (float digits may be written differently: orjson's "1e-5" for json's "1e-05")
    assert json.loads(metrics_to_otlp_json(data)) == json.loads(to_otlp_json(encode_metrics(data)))
    assert metrics_to_otlp_json(data) == metrics_to_otlp_json(data)  # a second export, from the series cache


def _one_gauge(attributes: dict) -> Any:
    from opentelemetry.sdk.metrics.export import Gauge, Metric, MetricsData, NumberDataPoint, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    point = NumberDataPoint(attributes=attributes, start_time_unix_nano=0, time_unix_nano=1, value=0.5)
    metric = Metric(name=M.RL_REWARD, description="", unit="1", data=Gauge(data_points=[point]))
    scope = ScopeMetrics(scope=InstrumentationScope("otel_rl"), metrics=[metric], schema_url="")
    return MetricsData(resource_metrics=[ResourceMetrics(resource=Resource({}), scope_metrics=[scope], schema_url="")])


def test_a_series_attributes_changed_in_place_are_encoded_again():
    """Each series' attributes are encoded once and kept across exports; a dict changed in place
    between two exports is written as it is now, not as it was cached."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from otel_rl.exporters.otlp_json import metrics_to_otlp_json, to_otlp_json

    attributes = {A.RL_MODEL_ROLE: "actor", A.RL_RANK: 0}
    for change in ({}, {A.RL_MODEL_ROLE: "critic"}, {A.RL_RANK: 3}, {A.RL_CLUSTER: "reward"}):
        attributes.update(change)
        data = _one_gauge(attributes)
        assert json.loads(metrics_to_otlp_json(data)) == json.loads(to_otlp_json(encode_metrics(data))), change


def test_stamped_replay_points_take_the_direct_path(monkeypatch, make_telemetry):
    """A metrics_at_log_time export (gauges, sums and histograms, one point per step) never needs protobuf."""
    import otel_rl.exporters.otlp_json as module
    import otel_rl.exporters.otlp_json_metrics as encoders

    exported = []
    real = module.metrics_to_otlp_json

    def spy(data):
        exported.append(json.loads(module.to_otlp_json(encoders.encode_metrics(data))))
        with monkeypatch.context() as patch:
            patch.setattr(encoders, "encode_metrics", lambda _: (_ for _ in ()).throw(AssertionError("took the protobuf path")))
            line = real(data)
        assert json.loads(line) == json.loads(module.to_otlp_json(encoders.encode_metrics(data)))
        return line

    monkeypatch.setattr(module, "metrics_to_otlp_json", spy)
    tel = make_telemetry(framework="verl", metrics_at_log_time=True)
    for step in range(3):
        tel.log(
            {"actor/pg_loss": 0.5 + step, "timing_s/gen": 1.0, "training/global_step": step},
            step=step,
            time_ns=1_700_000_000_000_000_000 + step,
        )
    tel.shutdown()
    assert exported and any(
        len(m["gauge"]["dataPoints"]) == 3
        for line in exported
        for r in line["resourceMetrics"]
        for s in r["scopeMetrics"]
        for m in s["metrics"]
        if m["name"] == "rl.loss"
    )


# ---- the direct span encoder equals the protobuf path ----------------------------------------


def _spans_of(names, attributes, event_attrs, link, status, remote_parent, kind, scope_name):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "s", "rl.rank": 1}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(scope_name, "2.0") if scope_name else provider.get_tracer("")
    parent_ctx = None
    if remote_parent:
        parent_ctx = trace.set_span_in_context(
            NonRecordingSpan(SpanContext(0xABC, 0xDEF, True, TraceFlags(1), TraceState([("vendor", "v1")])))
        )
    links = [Link(SpanContext(0x1, 0x2, remote_parent, TraceFlags(1)), {"why": "previous step"})] if link else []
    with tracer.start_as_current_span(
        names[0], context=parent_ctx, kind=getattr(SpanKind, kind), links=links, attributes=attributes
    ) as outer:
        outer.add_event("rl.alert", event_attrs)
        with tracer.start_as_current_span(names[1]) as inner:
            if status:
                inner.set_status(Status(StatusCode.ERROR, status))
        if status == "":
            outer.set_status(Status(StatusCode.OK))
    provider.shutdown()
    return memory.get_finished_spans()


@settings(max_examples=150, deadline=None)
@given(
    names=st.tuples(st.text(max_size=6), st.text(min_size=1, max_size=6)),
    attributes=st.dictionaries(st.text(min_size=1, max_size=6), _scalars.filter(lambda v: v is not None), max_size=4),
    event_attrs=st.dictionaries(st.text(min_size=1, max_size=4), st.floats(allow_nan=True), max_size=2),
    link=st.booleans(),
    status=st.sampled_from([None, "", "boom"]),
    remote_parent=st.booleans(),
    kind=st.sampled_from(["INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"]),
    scope_name=st.sampled_from([None, "otel_rl"]),
)
def test_direct_span_encoding_is_the_protobuf_encoding(names, attributes, event_attrs, link, status, remote_parent, kind, scope_name):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_rl.exporters.otlp_json import spans_to_otlp_json

    spans = _spans_of(names, attributes, event_attrs, link, status, remote_parent, kind, scope_name)
    assert json.loads(spans_to_otlp_json(spans)) == json.loads(to_otlp_json(encode_spans(spans)))


def test_step_spans_take_the_direct_path(tmp_path, monkeypatch):
    import otel_rl.exporters.otlp_json_encoders as module

    spans = _spans_of(
        ("rl.step", "rl.generate"), {"rl.step": 3, "rl.stage": "generate"}, {"x": 1.0}, True, None, False, "INTERNAL", "otel_rl"
    )
    expected = json.loads(module.to_otlp_json(module.encode_spans(spans)))
    monkeypatch.setattr(module, "encode_spans", lambda s: (_ for _ in ()).throw(AssertionError("protobuf path")))
    assert json.loads(module.spans_to_otlp_json(spans)) == expected


@pytest.mark.parametrize("scope_name", [None, "otel_rl"])
def test_a_one_resource_batch_is_written_around_its_envelope_as_the_tree_would_be(monkeypatch, scope_name):
    import otel_rl.exporters.otlp_json_encoders as module

    # A resource and a scope with schema URLs, and texts that read like the envelope's cut.
    resource = Resource({A.SERVICE_NAME: 's"p\u00e9', "note": '"spans":[]'}, "https://schema/r")
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(scope_name, "1.0", "https://schema/s") if scope_name else provider.get_tracer("")
    for step in (-5, 0, 2**62):
        with tracer.start_as_current_span("rl.step", attributes={A.RL_STEP: step, "flag": True, "spans": '"spans":[]'}):
            with tracer.start_as_current_span("rl.generate", attributes={A.RL_STEP: step, A.RL_STAGE: "generate", "x": 0.5}):
                pass
    spans = memory.get_finished_spans()
    line = module.spans_to_otlp_json(spans)
    assert module._one_envelope_line(spans) == line  # the envelope's way wrote it
    monkeypatch.setattr(module, "_one_envelope_line", lambda spans: None)
    assert line == module.spans_to_otlp_json(spans)  # the same text as the tree's
    assert json.loads(line) == json.loads(to_otlp_json(module.encode_spans(spans)))


def test_equal_resources_share_one_entry_whatever_their_order_as_the_protobuf_path_groups_them():
    from opentelemetry._logs import LogRecord as SdkLogRecord
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk._logs import ReadableLogRecord

    from otel_rl.exporters.otlp_json import logs_to_otlp_json, spans_to_otlp_json

    rank1 = {A.SERVICE_NAME: "s", A.RL_RANK: 1}
    resources = [
        Resource(rank1),
        Resource(dict(reversed(list(rank1.items())))),  # equal, another object, its keys in the other order
        Resource({A.SERVICE_NAME: "s", A.RL_RANK: 2}),  # another rank
        Resource(rank1, "https://schema"),  # the same attributes, another schema URL
    ]
    spans = []
    for resource in resources:
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(SimpleSpanProcessor(memory))
        with provider.get_tracer("otel_rl").start_as_current_span("rl.step"):
            pass
        spans += memory.get_finished_spans()
    direct = json.loads(spans_to_otlp_json(spans))
    assert direct == json.loads(to_otlp_json(encode_spans(spans)))
    assert [len(rs["scopeSpans"][0]["spans"]) for rs in direct["resourceSpans"]] == [2, 1, 1]
    records = [ReadableLogRecord(SdkLogRecord(body="b", event_name="e"), resource=resource) for resource in resources]
    assert json.loads(logs_to_otlp_json(records)) == json.loads(to_otlp_json(encode_logs(records)))
    assert len(json.loads(logs_to_otlp_json(records))["resourceLogs"]) == 3
