"""The spans a kept trajectory is built into (``_sdk/spans/trajectory_spans.py``) are the spans the SDK
would make: the same OTLP protobuf and OTLP/JSON bytes as SDK spans started and ended with the
same ids, times, attributes, events, links and status; and they reach every destination."""

from __future__ import annotations

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import StatusCode
from otlp_sink import OtlpSink

import otel_rl
from otel_rl._sdk.spans.trajectory_spans import text_of
from otel_rl.exporters.otlp_json import spans_to_otlp_json
from otel_rl.runs.folder import read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

TRAJECTORY_SPANS = (N.RL_TRAJECTORY_SPAN, N.RL_TURN_SPAN, N.RL_TOOL_SPAN)


class _ReplayIds(IdGenerator):
    """Hands the SDK the ids a built trajectory has, in the order the SDK asks for them."""

    def __init__(self, trace_id: int, span_ids: list[int]) -> None:
        self._trace_id = trace_id
        self._span_ids = iter(span_ids)

    def generate_trace_id(self) -> int:
        return self._trace_id

    def generate_span_id(self) -> int:
        return next(self._span_ids)

    def is_trace_id_random(self) -> bool:
        return True  # as the SDK's RandomIdGenerator, which otel-rl's provider uses


def _record(tel: otel_rl.Telemetry) -> None:
    with tel.step(3):
        with tel.stage("generate"):
            with tel.trajectory("s-9", group="g") as traj:
                with traj.turn(tokens_in=17, engine="http://rollout-2.cluster.local:30000/v1", prompt="2+2?") as turn:
                    turn.done(tokens_out=4, finish_reason="length", response="4" * 3000)
                try:
                    with traj.tool("calc", call_id="c-1", arguments={"expression": "2+2"}):
                        raise ZeroDivisionError("division by zero")
                except ZeroDivisionError:
                    pass
                traj.reward(1.0, components={"format": 1.0})


def _sdk_twins(built: list) -> list:
    """SDK spans started and ended with everything the built ones hold, in the built order."""
    root, *children = built
    provider = TracerProvider(
        resource=root.resource,
        id_generator=_ReplayIds(root.context.trace_id, [s.context.span_id for s in built]),
        span_limits=SpanLimits(max_attribute_length=1024),
    )
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otel_rl", otel_rl.__version__)
    sdk_root = tracer.start_span(
        root.name, context=Context(), kind=root.kind, attributes=dict(root.attributes), links=root.links, start_time=root.start_time
    )
    if root.status.status_code is not StatusCode.UNSET:
        sdk_root.set_status(root.status)
    parent = trace_api.set_span_in_context(sdk_root)
    for child in children:
        span = tracer.start_span(
            child.name, context=parent, kind=child.kind, attributes=dict(child.attributes), start_time=child.start_time
        )
        for event in child.events:
            span.add_event(event.name, event.attributes, event.timestamp)
        if child.status.status_code is not StatusCode.UNSET:
            span.set_status(child.status)
        span.end(end_time=child.end_time)
    sdk_root.end(end_time=root.end_time)
    by_id = {s.context.span_id: s for s in exporter.get_finished_spans()}
    return [by_id[s.context.span_id] for s in built]


def test_built_spans_encode_exactly_as_the_sdk_spans_with_the_same_content(make_telemetry):
    tel = make_telemetry(exporters="none", trajectory_sample_ratio=1.0, log_samples=1, sample_text_limit=256)
    captured = InMemorySpanExporter()
    tel._providers.span_processors.append(SimpleSpanProcessor(captured))  # beside otel-rl's own destinations
    _record(tel)
    tel.flush()
    built = [s for s in captured.get_finished_spans() if s.name in TRAJECTORY_SPANS]
    built.sort(key=lambda s: (s.parent is not None, s.start_time))
    assert [s.name for s in built] == [N.RL_TRAJECTORY_SPAN, N.RL_TURN_SPAN, N.RL_TOOL_SPAN]
    generate = next(s for s in captured.get_finished_spans() if s.name == "rl.generate")
    root, turn, tool = built
    assert [link.context for link in root.links] == [generate.context]
    assert turn.attributes[A.SERVER_ADDRESS] == "rollout-2.cluster.local" and turn.attributes[A.SERVER_PORT] == 30000
    assert turn.attributes[A.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",) and root.attributes[A.RL_TRAJECTORY_TRUNCATED] is True
    assert len(turn.attributes[A.RL_TURN_RESPONSE].encode()) <= 256
    assert tool.status.status_code is StatusCode.ERROR and tool.status.description == "ZeroDivisionError: division by zero"
    assert all(s.context.trace_flags.sampled and s.instrumentation_scope.name == "otel_rl" for s in built)

    twins = _sdk_twins(built)
    assert [s.context for s in twins] == [s.context for s in built] and [s.parent for s in twins] == [s.parent for s in built]
    assert encode_spans(built).SerializeToString() == encode_spans(twins).SerializeToString()
    assert spans_to_otlp_json(built) == spans_to_otlp_json(twins)
    # and in a batch with the telemetry's own SDK-made spans (one resource, one scope)
    mixed = [generate, *built]
    assert encode_spans(mixed).SerializeToString() == encode_spans([generate, *twins]).SerializeToString()
    assert len(encode_spans(mixed).resource_spans) == 1 and len(encode_spans(mixed).resource_spans[0].scope_spans) == 1


def test_kept_trajectories_reach_the_run_folder_and_the_collector_alike(tmp_path):
    with OtlpSink() as sink:
        tel = otel_rl.Telemetry(
            otel_rl.resolve_config(
                dict(
                    run_dir=str(tmp_path / "run"), console=False, exporters="otlp,file", endpoint=sink.endpoint, trajectory_sample_ratio=1.0
                )
            )
        )
        try:
            _record(tel)
            tel.flush()
            folder = {(s.trace_id, s.span_id, s.name) for s in read_spans(tel.run_dir) if s.name in TRAJECTORY_SPANS}
            assert len(folder) == 3
            sink.wait_for(lambda r: sum(1 for s in r.spans if s[2] in TRAJECTORY_SPANS) >= 3, 20, "the trajectory spans")
        finally:
            tel.shutdown()
        received = [s for s in sink.received.spans if s[2] in TRAJECTORY_SPANS]
        assert sorted((t, i, n) for t, i, n, _ in received) == sorted(folder)  # each once, the same ids
        root = next(a for _, _, n, a in received if n == N.RL_TRAJECTORY_SPAN)
        assert root[A.RL_SAMPLE_ID] == "s-9" and root[A.RL_TRAJECTORY_REWARD] == 1.0


def test_text_of_writes_mappings_as_json():
    assert text_of({"q": "é"}) == '{"q": "é"}' and text_of(["a", 1]) == '["a", 1]' and text_of(3) == "3" and text_of("x") == "x"
