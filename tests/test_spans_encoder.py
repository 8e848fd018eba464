"""The spool's span encoder must write the bytes the SDK's ``encode_spans`` serializes to: for a
real run's spans, and for every kind of span, attribute, event, link, status and scope."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from otlp_sink import OtlpSink

import otel_rl
from otel_rl._sdk.otlp.spans_encoder import encode_spans_request
from otel_rl._sdk.spool import exporters as spool_exporters
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N


def sdk_bytes(spans: Any) -> bytes:
    return encode_spans(spans).SerializeToString()


def test_a_real_runs_spans_are_the_bytes_the_sdk_writes_and_reach_the_collector(tmp_path, monkeypatch) -> None:
    """A step, its stages with clusters, a failed stage and an alert event, from a real
    Telemetry into a real OTLP/HTTP endpoint through the spool."""
    batches: list[list[Any]] = []
    real = spool_exporters.SpoolingSpanExporter.export
    monkeypatch.setattr(
        spool_exporters.SpoolingSpanExporter, "export", lambda self, spans: batches.append(list(spans)) or real(self, spans)
    )
    with OtlpSink() as sink:
        tel = otel_rl.init(
            service_name="enc",
            run_dir=str(tmp_path / "run"),
            console=False,
            framework="roll",
            endpoint=sink.endpoint,
            protocol="http/protobuf",
            spool_dir=str(tmp_path / "spool"),
        )
        for step in range(3):
            with tel.step(step):
                for name, cluster in (("generate", "actor_infer"), ("reward", "reward"), ("train_step", "actor_train")):
                    with tel.stage(name, cluster=cluster):
                        pass
                try:
                    with tel.stage("sync_weights", cluster="actor_train"):
                        raise RuntimeError("nccl timeout")
                except RuntimeError:
                    pass
                tel.log({"actor/pg_loss": 0.1 * step, "critic/score/mean": 1.0})
        tel.shutdown()
        received = [name for _, _, name, _ in sink.received.spans]
    spans = [span for batch in batches for span in batch]
    assert len(spans) == 15 and sorted(received) == sorted(span.name for span in spans)
    assert any(span.status.status_code is StatusCode.ERROR for span in spans) and any(span.events for span in spans)
    for batch in batches:
        assert encode_spans_request(batch) == sdk_bytes(batch)


_scalar = st.one_of(st.text(max_size=8), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True))
_attribute_value = st.one_of(
    _scalar,
    st.lists(st.text(max_size=4), max_size=3).map(tuple),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3).map(tuple),
    st.lists(st.floats(allow_nan=True), max_size=3).map(tuple),
    st.lists(st.booleans(), max_size=3).map(tuple),
)
_attributes = st.dictionaries(st.text(min_size=1, max_size=6), _attribute_value, max_size=4)


@settings(max_examples=200, deadline=None)
@given(
    names=st.tuples(st.text(max_size=6), st.text(min_size=1, max_size=6)),
    attributes=_attributes,
    event_attributes=_attributes,
    link_attributes=st.one_of(st.none(), _attributes),
    status=st.sampled_from([None, "", "boom", "ok"]),
    remote_parent=st.booleans(),
    trace_state=st.booleans(),
    kind=st.sampled_from(list(SpanKind)),
    scope=st.sampled_from([None, ("otel_rl", None, None), ("otel_rl", "2.0", "https://opentelemetry.io/schemas/1.26.0")]),
    resource_schema=st.sampled_from(["", "https://opentelemetry.io/schemas/1.26.0"]),
)
def test_any_span_is_the_bytes_the_sdk_writes(
    names, attributes, event_attributes, link_attributes, status, remote_parent, trace_state, kind, scope, resource_schema
) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({A.SERVICE_NAME: "s", A.RL_RANK: 3}, resource_schema))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(*scope) if scope else provider.get_tracer("")
    context = None
    if remote_parent:
        state = TraceState([("vendor", "v1"), ("other", "x")]) if trace_state else TraceState()
        context = trace.set_span_in_context(NonRecordingSpan(SpanContext(0xABC, 0xDEF, True, TraceFlags(1), state)))
    links = [] if link_attributes is None else [Link(SpanContext(0x1, 0x2, remote_parent, TraceFlags(1)), link_attributes)]
    with tracer.start_as_current_span(names[0], context=context, kind=kind, links=links, attributes=attributes) as outer:
        outer.add_event(N.RL_ALERT_EVENT, event_attributes)
        outer.add_event("", {}, timestamp=0)
        with tracer.start_as_current_span(names[1]) as inner:
            if status == "boom":
                inner.set_status(Status(StatusCode.ERROR, status))
        if status is not None and status != "boom":
            outer.set_status(Status(StatusCode.OK if status == "ok" else StatusCode.UNSET))
    provider.shutdown()
    spans = memory.get_finished_spans()
    assert encode_spans_request(spans) == sdk_bytes(spans)


def test_spans_of_several_resources_and_scopes_group_as_the_sdk_groups_them() -> None:
    first, second = Resource({A.RL_RANK: 0}), Resource({A.RL_RANK: 1})
    scopes = [InstrumentationScope("a"), InstrumentationScope("b", "1")]
    spans = [
        ReadableSpan(f"s{i}", SpanContext(1, 10 + i, False), resource=(first, second)[i % 2], instrumentation_scope=scopes[i // 2 % 2])
        for i in range(8)
    ]
    assert encode_spans_request(spans) == sdk_bytes(spans)
    request = ExportTraceServiceRequest.FromString(encode_spans_request(spans))
    assert [len(r.scope_spans) for r in request.resource_spans] == [2, 2]


def test_a_value_it_does_not_write_itself_goes_through_the_sdks_encoder() -> None:
    """A map value (a kvlist) is the SDK's to encode; the batch is still the SDK's bytes."""
    span = ReadableSpan("s", SpanContext(1, 2, False), attributes={"nested": {"a": 1}, "plain": "x"}, resource=Resource({}))
    assert encode_spans_request([span]) == sdk_bytes([span])
    assert ExportTraceServiceRequest.FromString(encode_spans_request([span])).resource_spans[0].scope_spans[0].spans[0].name == "s"


def test_true_and_1_under_one_key_stay_a_bool_and_an_int() -> None:
    """Encoded attributes are kept by (key, value), where True == 1: the type tells them apart."""
    spans = [
        ReadableSpan("s", SpanContext(1, 2 + i, False), attributes={"flag": value}, resource=Resource({}))
        for i, value in enumerate([True, 1, 1, True])
    ]
    for span in spans:
        assert encode_spans_request([span]) == sdk_bytes([span])
