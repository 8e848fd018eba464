"""Reading a run folder back (otel_rl.runs.folder), with files written by the real SDK + exporters."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_rl.exporters import OtlpJsonLogExporter, OtlpJsonMetricExporter, OtlpJsonSpanExporter
from otel_rl.runs.folder import (
    LOGS_FILE,
    METRICS_FILE,
    TRACES_FILE,
    Problem,
    SpanRecord,
    decode_any_value,
    find_step_trace,
    format_duration,
    format_problems,
    read_log_records,
    read_metrics,
    read_spans,
    render_waterfall,
)

RESOURCE = Resource.create({"service.name": "grpo-demo", "rl.run.id": "run-7", "rl.rank": 0})
TREE_ORDER = ["rl.step", "rl.generate", "rl.compute_log_probs", "rl.onload", "rl.execute", "rl.offload"]


def write_step_traces(run_dir: Path, steps=(3,)) -> None:
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonSpanExporter(run_dir / TRACES_FILE)))
    tracer = provider.get_tracer("otel_rl")
    for step in steps:
        with tracer.start_as_current_span("rl.step", attributes={"rl.step": step}):
            with tracer.start_as_current_span(
                "rl.generate", attributes={"rl.stage": "generate", "rl.cluster": "actor_infer", "rl.stage.phase": "total"}
            ):
                time.sleep(0.003)
            with tracer.start_as_current_span(
                "rl.compute_log_probs", attributes={"rl.stage": "compute_log_probs", "rl.cluster": "actor_train"}
            ):
                for phase in ("onload", "execute", "offload"):
                    with tracer.start_as_current_span(
                        f"rl.{phase}", attributes={"rl.stage.phase": phase, "rl.cluster": "actor_train"}
                    ) as span:
                        for when in ("start", "end"):
                            span.add_event(
                                "rl.memory.snapshot",
                                {
                                    "rl.memory.when": when,
                                    "rl.memory.state": "onload",
                                    "hw.id": "0",
                                    "rl.memory.allocated": 3 * 2**30,
                                    "rl.memory.reserved": 4 * 2**30,
                                },
                            )
                            if when == "start":
                                time.sleep(0.002)
    provider.shutdown()


# ----------------------------------------------------------------------------- spans


def test_read_spans_round_trip(tmp_path):
    write_step_traces(tmp_path)
    spans = read_spans(tmp_path)
    assert spans.problems == []
    assert len(spans) == 6
    by_name = {s.name: s for s in spans}
    assert set(by_name) == set(TREE_ORDER)
    root = by_name["rl.step"]
    for span in spans:
        assert re.fullmatch(r"[0-9a-f]{32}", span.trace_id)
        assert re.fullmatch(r"[0-9a-f]{16}", span.span_id)
        assert span.trace_id == root.trace_id
        assert span.resource["service.name"] == "grpo-demo"
        assert span.resource["rl.rank"] == 0
        assert span.scope == "otel_rl"
        assert span.status == "unset"
    assert root.parent_span_id is None
    assert root.attributes == {"rl.step": 3}
    assert isinstance(root.attributes["rl.step"], int)
    assert by_name["rl.generate"].parent_span_id == root.span_id
    assert by_name["rl.compute_log_probs"].parent_span_id == root.span_id
    stage = by_name["rl.compute_log_probs"]
    for phase in ("rl.onload", "rl.execute", "rl.offload"):
        assert by_name[phase].parent_span_id == stage.span_id
    parents = {s.span_id: s for s in spans}
    for span in spans:
        if span.parent_span_id:
            parent = parents[span.parent_span_id]
            assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns
    assert by_name["rl.generate"].duration_ns >= 3_000_000
    onload = by_name["rl.onload"]
    assert [e.name for e in onload.events] == ["rl.memory.snapshot"] * 2
    name, time_ns, attributes = onload.events[0]
    assert onload.start_ns <= time_ns <= onload.end_ns
    assert attributes["rl.memory.allocated"] == 3 * 2**30
    assert attributes["rl.memory.when"] == "start"
    assert by_name["rl.generate"].attributes["rl.cluster"] == "actor_infer"


def test_read_accepts_file_path_and_missing_files(tmp_path):
    write_step_traces(tmp_path)
    assert len(read_spans(tmp_path / TRACES_FILE)) == 6
    assert list(read_metrics(tmp_path)) == []  # no metrics.jsonl: nothing, no problem
    assert read_metrics(tmp_path).problems == []
    with pytest.raises(FileNotFoundError):
        read_spans(tmp_path / "does-not-exist")


def test_find_step_trace_and_waterfall(tmp_path):
    write_step_traces(tmp_path, steps=(1, 2, 3))
    spans = read_spans(tmp_path)
    trace = find_step_trace(spans, 3)
    assert len(trace) == 6
    assert trace[0].name == "rl.step" and trace[0].attributes["rl.step"] == 3
    assert len({s.trace_id for s in trace}) == 1

    text = render_waterfall(trace)
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines), text
    positions = [text.index(name) for name in TREE_ORDER]
    assert positions == sorted(positions), text  # tree order: stage before its phases
    assert "actor_train" in text and "actor_infer" in text
    assert text.count("[2 memory snapshots]") == 3
    assert "(orphans)" not in text
    row = {
        name: next(line for line in lines if re.search(rf"\b{re.escape(name)}\b(?!_)", line) and "trace" not in line) for name in TREE_ORDER
    }
    assert "█" * 20 in row["rl.step"]  # the root spans the whole timeline
    assert row["rl.onload"].index("rl.onload") > row["rl.compute_log_probs"].index("rl.compute_log_probs")
    # the generate bar starts left of the compute_log_probs bar
    first_bar = lambda line: min(i for i, c in enumerate(line) if c in "█▏")  # noqa: E731
    assert first_bar(row["rl.generate"]) < first_bar(row["rl.compute_log_probs"])
    assert first_bar(row["rl.onload"]) <= first_bar(row["rl.execute"]) <= first_bar(row["rl.offload"])


def test_find_step_trace_takes_last_rerun_and_lists_available_steps(tmp_path):
    write_step_traces(tmp_path, steps=(0, 1, 2, 3, 7))
    write_step_traces(tmp_path, steps=(3,))  # a rerun appending to the same run folder
    spans = read_spans(tmp_path)
    trace = find_step_trace(spans, 3)
    step3_roots = [s for s in spans if s.name == "rl.step" and s.attributes["rl.step"] == 3]
    assert len(step3_roots) == 2
    assert trace[0] is step3_roots[-1]
    with pytest.raises(LookupError) as info:
        find_step_trace(spans, 5)
    message = str(info.value)
    assert "5" in message and "0-3, 7" in message
    with pytest.raises(LookupError, match="no 'rl.step' root spans"):
        find_step_trace([], 1)


def _span(name, span_id, parent, start, end, **attributes):
    return SpanRecord(
        trace_id="ab" * 16, span_id=span_id, parent_span_id=parent, name=name, start_ns=start, end_ns=end, attributes=attributes
    )


def test_waterfall_orphans_tiny_spans_and_long_names():
    ms = 1_000_000
    spans = [
        _span("rl.step", "0" * 15 + "1", None, 0, 1000 * ms, **{"rl.step": 4}),
        _span("rl.tiny", "0" * 15 + "2", "0" * 15 + "1", 500 * ms, 500 * ms + 10),
        _span("rl.lost", "0" * 15 + "3", "f" * 16, 100 * ms, 200 * ms),
        _span("rl.lost_child", "0" * 15 + "4", "0" * 15 + "3", 120 * ms, 150 * ms),
        _span("rl." + "x" * 150, "0" * 15 + "5", "0" * 15 + "1", 0, 10 * ms),
    ]
    text = render_waterfall(spans, width=60)
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines), text
    orphans_at = next(i for i, line in enumerate(lines) if line.startswith("(orphans)"))
    assert any("rl.lost" in line for line in lines[orphans_at:])
    assert any("rl.lost_child" in line for line in lines[orphans_at:])
    assert not any("rl.lost" in line for line in lines[:orphans_at])
    tiny = next(line for line in lines if "rl.tiny" in line)
    assert "▏" in tiny and "█" not in tiny  # shorter than one cell: a thin marker
    assert "…" in text  # the 150-char name was cut to fit
    assert "1 s" in text or "1.00 s" in text  # the root's human duration
    assert render_waterfall([]) == "(no spans)"


def test_waterfall_with_cycle_does_not_hang():
    spans = [_span("a", "0" * 15 + "1", "0" * 15 + "2", 0, 10), _span("b", "0" * 15 + "2", "0" * 15 + "1", 0, 10)]
    text = render_waterfall(spans)
    lines = text.splitlines()
    assert lines[0].startswith("(orphans)")
    assert len(lines) == 3
    assert lines[1].startswith("a ") and lines[2].startswith("└─ b ")


def test_format_duration():
    assert format_duration(0) == "0"
    assert format_duration(10) == "10 ns"
    assert format_duration(850_000) == "850 µs"
    assert format_duration(4_123_000) == "4.12 ms"
    assert format_duration(412_000_000) == "412 ms"
    assert format_duration(1_234_000_000) == "1.23 s"
    assert format_duration(123_000_000_000) == "2m 03s"


# ----------------------------------------------------------------------------- malformed lines


def test_malformed_lines_are_skipped_with_their_numbers(tmp_path):
    write_step_traces(tmp_path)  # lines 1-6
    path = tmp_path / TRACES_FILE
    good_line = path.read_text().splitlines()[0]
    with open(path, "a", encoding="utf-8") as f:
        f.write("this is not json\n")  # 7
        f.write("\n")  # 8: blank, ignored silently
        f.write('{"resourceMetrics": []}\n')  # 9: wrong signal
        f.write('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz","spanId":"1"}]}]}]}\n')  # 10
        f.write(good_line + "\n")  # 11: fine
        f.write(good_line[: len(good_line) // 2])  # 12: truncated by a crash
    spans = read_spans(tmp_path)
    assert len(spans) == 7
    assert [(p.file, p.line) for p in spans.problems] == [(TRACES_FILE, 7), (TRACES_FILE, 9), (TRACES_FILE, 10), (TRACES_FILE, 12)]
    assert "truncated" in spans.problems[-1].reason
    assert str(spans.problems[0]).startswith("traces.jsonl:7: ")
    summary = format_problems(spans.problems)
    assert summary == ("skipped 4 malformed lines (traces.jsonl:7, traces.jsonl:9, traces.jsonl:10, traces.jsonl:12)")
    assert format_problems([]) == ""
    many = [Problem(TRACES_FILE, i, "x") for i in range(1, 10)]
    assert format_problems(many, limit=2) == "skipped 9 malformed lines (traces.jsonl:1, traces.jsonl:2, ... 7 more)"


def test_non_utf8_line_is_a_problem(tmp_path):
    (tmp_path / LOGS_FILE).write_bytes(b'{"resourceLogs":[]}\n\xff\xfe\n')
    records = read_log_records(tmp_path)
    assert list(records) == []
    assert [(p.line, p.reason.split(" ")[0]) for p in records.problems] == [(2, "not")]


# ----------------------------------------------------------------------------- metrics


def test_read_metrics(tmp_path):
    exporter = OtlpJsonMetricExporter(tmp_path / METRICS_FILE)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60000)
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("otel_rl")
    histogram = meter.create_histogram("rl.sample.reward", unit="1")
    for value in (0.5, 0.25, 1.0, 7.0):  # (the Python SDK drops negative histogram values)
        histogram.record(value)
    counter = meter.create_counter("rl.progress.samples", unit="{sample}")
    counter.add(64)
    meter.create_observable_gauge(
        "rl.gpu.memory.usage",
        callbacks=[
            lambda options: [
                Observation(3 * 2**30, {"hw.id": "0", "rl.memory.kind": "allocated"}),
                Observation(0.5, {"hw.id": "1", "rl.memory.kind": "allocated"}),
            ]
        ],
        unit="By",
    )
    provider.force_flush()
    provider.shutdown()  # a second collection: a second line

    points = read_metrics(tmp_path)
    assert points.problems == []
    assert {p.name for p in points} == {"rl.sample.reward", "rl.progress.samples", "rl.gpu.memory.usage"}
    hist = next(p for p in points if p.name == "rl.sample.reward")
    assert hist.kind == "histogram" and hist.unit == "1"
    assert hist.count == 4 and hist.sum == pytest.approx(8.75)
    assert hist.min == 0.25 and hist.max == 7.0
    assert len(hist.bucket_counts) == len(hist.explicit_bounds) + 1
    assert sum(hist.bucket_counts) == 4
    assert all(isinstance(c, int) for c in hist.bucket_counts)
    assert hist.value is None and hist.time_ns > 0 and hist.start_time_ns > 0
    total = next(p for p in points if p.name == "rl.progress.samples")
    assert total.kind == "sum" and total.value == 64 and isinstance(total.value, int)
    assert total.is_monotonic and total.temporality == 2
    gauges = [p for p in points if p.name == "rl.gpu.memory.usage"]
    assert all(p.kind == "gauge" and p.unit == "By" for p in gauges)
    by_device = {p.attributes["hw.id"]: p.value for p in gauges}
    assert by_device == {"0": 3 * 2**30, "1": 0.5}
    assert gauges[0].resource["rl.run.id"] == "run-7"
    assert len(points) == 2 * 4  # two collections x (histogram, counter, 2 gauge points)


# ----------------------------------------------------------------------------- logs


def test_read_log_records(tmp_path):
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(SimpleLogRecordProcessor(OtlpJsonLogExporter(tmp_path / LOGS_FILE)))
    logger = provider.get_logger("otel_rl")
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("rl.step") as span:
        logger.emit(body={"actor/pg_loss": 0.5, "step": 3}, attributes={"rl.step": 3}, event_name="rl.log")
    logger.emit(body="plain", attributes={"rl.step": 4})
    provider.shutdown()

    records = read_log_records(tmp_path)
    assert records.problems == []
    first, second = records
    assert first["body"] == {"actor/pg_loss": 0.5, "step": 3}
    assert isinstance(first["body"]["step"], int)
    assert first["attributes"] == {"rl.step": 3}
    assert first["event_name"] == "rl.log"
    assert first["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert first["span_id"] == format(span.get_span_context().span_id, "016x")
    assert first["timestamp"] > 0
    assert first["resource"]["service.name"] == "grpo-demo"
    assert second["body"] == "plain" and second["trace_id"] is None and second["event_name"] is None


# ----------------------------------------------------------------------------- decoding


def test_decode_any_value():
    assert decode_any_value({"stringValue": "x"}) == "x"
    assert decode_any_value({"intValue": "-12"}) == -12
    assert decode_any_value({"intValue": 5}) == 5
    assert decode_any_value({"doubleValue": 1.5}) == 1.5
    assert math.isnan(decode_any_value({"doubleValue": "NaN"}))
    assert decode_any_value({"doubleValue": "-Infinity"}) == -math.inf
    assert decode_any_value({"boolValue": False}) is False
    assert decode_any_value({"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "a"}]}}) == [1, "a"]
    assert decode_any_value({"arrayValue": {}}) == []
    assert decode_any_value({"kvlistValue": {"values": [{"key": "a", "value": {"kvlistValue": {"values": []}}}]}}) == {"a": {}}
    assert decode_any_value({"bytesValue": "AAE="}) == b"\x00\x01"
    assert decode_any_value({}) is None
    with pytest.raises(ValueError):
        decode_any_value("not an AnyValue")


def test_reads_collector_written_otlp_json(tmp_path):
    """A line as in the OTLP spec examples / Collector file exporter (uppercase hex accepted)."""
    line = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "my.service"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "my.library", "version": "1.0.0"},
                        "spans": [
                            {
                                "traceId": "5B8EFFF798038103D269B633813FC60C",
                                "spanId": "EEE19B7EC3C1B174",
                                "parentSpanId": "EEE19B7EC3C1B173",
                                "name": "I'm a server span",
                                "startTimeUnixNano": "1544712660000000000",
                                "endTimeUnixNano": "1544712661000000000",
                                "kind": 2,
                                "attributes": [{"key": "my.span.attr", "value": {"stringValue": "some value"}}],
                                "status": {"code": 2, "message": "bad"},
                            }
                        ],
                    }
                ],
            }
        ]
    }
    (tmp_path / TRACES_FILE).write_text(json.dumps(line) + "\n")
    (span,) = read_spans(tmp_path)
    assert span.trace_id == "5b8efff798038103d269b633813fc60c"
    assert span.parent_span_id == "eee19b7ec3c1b173"
    assert span.duration_ns == 1_000_000_000
    assert span.kind == 2 and span.status == "error" and span.status_message == "bad"
    assert span.scope == "my.library"
    text = render_waterfall([span])
    assert "(orphans)" in text and "ERROR: bad" in text
