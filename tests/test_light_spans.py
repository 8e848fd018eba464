"""Spans built past the SDK (light_spans): the same bytes as the SDK's spans, in the run folder's
OTLP/JSON and in OTLP protobuf, and the same behaviour around them (real SDK, real files)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from otel_rl._sdk.spans.light_spans import LightSpan, LightTracer
from otel_rl._sdk.spans.propagation import extract_context
from otel_rl._version import __version__
from otel_rl.exporters.otlp_json import OtlpJsonSpanExporter, spans_to_otlp_json
from otel_rl.runs.folder import read_spans
from otel_rl.semconv import names as N

T0 = 1_700_000_000_000_000_000
RESOURCE = Resource.create({"service.name": "light", "rl.run.id": "run-1", "rl.rank": 3})
SCOPE = ("otel_rl", __version__)
# A remote parent as a W3C carrier brings it: sampled, with a trace state.
REMOTE = extract_context({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "rojo=00f067aa0ba902b7"})[
    0
]

LIMITS = {
    "default": {"max_attribute_length": 16},  # otel-rl's attribute_value_limit, shortened to cut values here
    "tight": {"max_span_attributes": 3, "max_events": 2, "max_event_attributes": 2, "max_links": 1, "max_link_attributes": 1},
}


def exercise(tracer: Any) -> None:
    """Every kind of span content, with fixed times: the same calls on either tracer."""
    root = tracer.start_span(
        "rl.step",
        context=trace.set_span_in_context(trace.INVALID_SPAN),
        attributes={"rl.step": 7, "rl.rank": 0, "rl.run.id": "a run id longer than sixteen", "flag": True, "share": 0.25},
        start_time=T0,
    )
    stage = tracer.start_span(
        "rl.generate",
        context=trace.set_span_in_context(root),
        kind=SpanKind.CLIENT,
        attributes={"rl.stage": "generate", "tags": ["a", "bb", "c" * 40], "none": None},
        links=[Link(SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1)), {"rl.link": "previous", "n": 1})],
        start_time=T0 + 1_000,
    )
    stage.add_event("rl.memory.snapshot", {"rl.memory.when": "start", "rl.memory.allocated": 1 << 33}, timestamp=T0 + 2_000)
    stage.add_event("marker", timestamp=T0 + 3_000)
    stage.set_attribute("rl.stage", "generate again")  # a later value moves the key to the end, as in the SDK
    stage.set_attribute("late", [1, 2, 3])
    stage.set_attributes({"more": "x" * 30, "": "an empty key is dropped"})
    stage.add_link(SpanContext(0x9ABC, 0xDEF0, is_remote=False), {"kind": "later"})
    stage.add_link(trace.INVALID_SPAN_CONTEXT)  # no context, no attributes: not kept
    try:
        raise ValueError("the stage failed")
    except ValueError as exc:
        stage.record_exception(exc, {"extra": 1}, timestamp=T0 + 4_000)
        stage.set_status(Status(StatusCode.ERROR, f"ValueError: {exc}"))
    stage.set_status(StatusCode.UNSET)  # ignored
    stage.update_name("rl.generate_renamed")
    stage.end(end_time=T0 + 5_000)
    joined = tracer.start_span("rl.shard", context=REMOTE, attributes={"rl.stage": "shard"}, start_time=T0 + 6_000)
    joined.set_status(StatusCode.OK)
    joined.set_status(StatusCode.ERROR, "after OK: ignored")
    joined.end(end_time=T0 + 7_000)
    root.end(end_time=T0 + 8_000)


def sdk_spans(limits: SpanLimits, run: Callable[[Any], None]) -> list[ReadableSpan]:
    provider = TracerProvider(resource=RESOURCE, span_limits=limits)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    random.seed(20240601)  # RandomIdGenerator draws from the random module: the same seed, the same ids
    run(provider.get_tracer(*SCOPE))
    provider.shutdown()
    return list(memory.get_finished_spans())


def light_spans(limits: SpanLimits, run: Callable[[Any], None]) -> list[ReadableSpan]:
    built: list[ReadableSpan] = []
    tracer = LightTracer(RESOURCE, InstrumentationScope(*SCOPE), limits, built.extend)
    random.seed(20240601)
    run(tracer)
    assert tracer.pending
    tracer.write()
    assert not tracer.pending
    return built


@pytest.mark.parametrize("limits", list(LIMITS), ids=list(LIMITS))
def test_a_light_span_encodes_to_the_sdks_bytes_in_otlp_json_and_protobuf(limits, tmp_path: Path):
    sdk = sdk_spans(SpanLimits(**LIMITS[limits]), exercise)
    light = light_spans(SpanLimits(**LIMITS[limits]), exercise)
    assert [s.name for s in light] == [s.name for s in sdk] == ["rl.generate_renamed", "rl.shard", "rl.step"]
    # what this compares is not empty: ids, parents, events, links, status, limits
    stage = light[0]
    assert stage.parent is not None and stage.parent.span_id == light[2].context.span_id
    assert (
        light[1].parent is not None
        and light[1].parent.is_remote
        and light[1].context.trace_state == TraceState([("rojo", "00f067aa0ba902b7")])
    )
    assert stage.status.status_code is StatusCode.ERROR and stage.events and stage.links
    if limits == "tight":
        assert stage.dropped_attributes and stage.dropped_events and stage.dropped_links
        # Past the count limit a light span keeps its first attributes, as the specification asks
        # (the SDK keeps the last, so a stage span lost its rl.stage and rl.step first); the
        # counts of the dropped agree, and everything else is still the SDK's, byte for byte.
        assert list(light[2].attributes) == ["rl.step", "rl.rank", "rl.run.id"]
        assert list(sdk[2].attributes) == ["rl.run.id", "flag", "share"]
        assert list(stage.attributes) == ["tags", "none", "rl.stage"]  # a later value of a key moves it last, as in the SDK
        assert [s.dropped_attributes for s in light] == [s.dropped_attributes for s in sdk] == [3, 0, 2]
        # So do a span event's and a link's attributes.
        exception = [e for e in stage.events if e.name == "exception"][0]
        assert list(exception.attributes) == ["exception.type", "exception.message"] and exception.dropped_attributes == 3
        assert [list(link.attributes) for link in stage.links] == [["kind"]]  # max_links 1: the last link, as the SDK keeps it
        light_json, sdk_json = json.loads(spans_to_otlp_json(light)), json.loads(spans_to_otlp_json(sdk))
        for tree in (light_json, sdk_json):
            for span in tree["resourceSpans"][0]["scopeSpans"][0]["spans"]:
                for part in [span, *span.get("events", ()), *span.get("links", ())]:
                    part.pop("attributes", None)
        assert light_json == sdk_json
        return
    assert light[2].attributes["rl.run.id"] == "a run id longer "  # cut at 16, as the SDK cuts it

    assert spans_to_otlp_json(light) == spans_to_otlp_json(sdk)
    assert encode_spans(light).SerializeToString() == encode_spans(sdk).SerializeToString()
    for name, spans in (("sdk", sdk), ("light", light)):
        exporter = OtlpJsonSpanExporter(tmp_path / f"{name}.jsonl")
        exporter.export(spans)
        exporter.shutdown()
    assert (tmp_path / "light.jsonl").read_bytes() == (tmp_path / "sdk.jsonl").read_bytes()


def test_under_an_unsampled_parent_both_make_a_span_that_records_nothing():
    unsampled = trace.set_span_in_context(NonRecordingSpan(SpanContext(0xAB, 0xCD, is_remote=True, trace_flags=TraceFlags(0))))
    contexts: dict[str, SpanContext] = {}

    def run(name: str) -> Callable[[Any], None]:
        def under(tracer: Any) -> None:
            span = tracer.start_span("rl.generate", context=unsampled, start_time=T0)
            assert not span.is_recording()
            contexts[name] = span.get_span_context()
            span.end()

        return under

    assert sdk_spans(SpanLimits(), run("sdk")) == []
    assert light_spans_or_none(run("light")) == []
    assert contexts["light"] == contexts["sdk"] and not contexts["light"].trace_flags.sampled


def light_spans_or_none(run: Callable[[Any], None]) -> list[ReadableSpan]:
    built: list[ReadableSpan] = []
    tracer = LightTracer(RESOURCE, InstrumentationScope(*SCOPE), SpanLimits(), built.extend)
    random.seed(20240601)
    run(tracer)
    assert not tracer.pending
    return built


def test_start_as_current_span_nests_sdk_spans_and_marks_an_exception():
    built: list[ReadableSpan] = []
    tracer = LightTracer(RESOURCE, InstrumentationScope(*SCOPE), SpanLimits(), built.extend)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with pytest.raises(KeyError), tracer.start_as_current_span("rl.train") as span:
        assert isinstance(span, LightSpan) and trace.get_current_span() is span
        with provider.get_tracer("framework").start_as_current_span("forward"):
            pass
        raise KeyError("batch")
    tracer.write()
    (train,) = built
    (forward,) = memory.get_finished_spans()
    assert forward.parent is not None and forward.parent.span_id == train.context.span_id
    assert forward.context.trace_id == train.context.trace_id
    assert train.status.status_code is StatusCode.ERROR and [e.name for e in train.events] == ["exception"]
    assert train.events[0].attributes is not None and train.events[0].attributes["exception.type"] == "KeyError"


def test_an_ended_span_ignores_later_calls_and_says_so_once(caplog):
    built: list[ReadableSpan] = []
    tracer = LightTracer(RESOURCE, InstrumentationScope(*SCOPE), SpanLimits(), built.extend)
    span = tracer.start_span("rl.train", attributes={"a": 1})
    span.end()
    for _ in range(3):
        span.set_attribute("a", 2)
        span.end()
    tracer.write()
    assert len(built) == 1 and built[0].attributes == {"a": 1}
    assert len([r for r in caplog.records if "set_attribute() on a span that has ended" in r.getMessage()]) == 1


# -- inside Telemetry ------------------------------------------------------------------------------


def _trace_lines(tel: Any) -> list[dict[str, Any]]:
    files = sorted(Path(tel.run_dir).glob("traces*.jsonl"))
    return [json.loads(line) for path in files for line in path.read_text().splitlines()]


def test_the_scopes_spans_carry_the_resource_the_scope_and_the_attribute_limit(make_telemetry):
    tel = make_telemetry(attribute_value_limit=12)
    assert isinstance(tel._tracer, LightTracer)
    user = TracerProvider().get_tracer("user")
    with tel.step(4), tel.stage("generate", cluster="a_cluster_name_over_twelve") as stage, stage.phase("execute"):
        trace.get_current_span().set_attribute("user.note", "kept")
        with user.start_as_current_span("user.work") as work:
            parent = work.parent
    tel.shutdown()
    lines = _trace_lines(tel)
    scopes = [scope for line in lines for rs in line["resourceSpans"] for scope in rs["scopeSpans"]]
    assert {(s["scope"]["name"], s["scope"]["version"]) for s in scopes} == {SCOPE}
    resources = [rs["resource"] for line in lines for rs in line["resourceSpans"]]
    assert all({a["key"] for a in r["attributes"]} == set(tel.resource.attributes) for r in resources)
    spans = {s.name: s for s in read_spans(tel.run_dir)}
    assert set(spans) == {"rl.step", "rl.generate", "rl.execute"}
    assert spans["rl.generate"].attributes["rl.cluster"] == "a_cluster_na"  # cut at attribute_value_limit
    assert spans["rl.execute"].attributes["user.note"] == "kept"  # set on the current span by a program
    assert parent is not None and format(parent.span_id, "016x") == spans["rl.execute"].span_id


def test_a_sampler_from_the_environment_keeps_the_sdks_spans(make_telemetry, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    tel = make_telemetry()
    assert not isinstance(tel._tracer, LightTracer)
    with tel.step(1), tel.stage("generate"):
        assert not trace.get_current_span().is_recording()  # the SDK's sampler decided
    tel.shutdown()
    assert read_spans(tel.run_dir) == []


def test_spans_ended_after_shutdown_are_not_kept(make_telemetry):
    tel = make_telemetry()
    tel.shutdown()
    with tel.step(1), tel.stage("generate"):
        pass
    assert not tel._light_spans.pending


def test_with_no_span_processor_spans_are_timed_but_never_built(make_telemetry, monkeypatch):
    built: list[str] = []
    readable = LightTracer.readable
    monkeypatch.setattr(LightTracer, "readable", lambda self, span: built.append(span.name) or readable(self, span))
    quiet = make_telemetry(exporters="none")
    with quiet.step(1), quiet.stage("generate"):
        pass
    quiet.flush()
    assert built == [] and not quiet._light_spans.pending  # dropped unbuilt: nothing would take them
    filed = make_telemetry()
    with filed.step(1), filed.stage("generate"):
        pass
    filed.flush()
    assert sorted(built) == sorted(
        [N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", "generate"), N.RL_STEP_SPAN]
    )  # a destination: built as before
