"""The spool's direct step events: the same request bytes as the SDK's protobuf encoder.

Each case emits the same steps through a real SDK LoggerProvider (what Pipeline.emit_event does)
and through StepEventProtoWriter, and compares the encoded requests byte for byte.
"""

from __future__ import annotations

import struct

import pytest
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.context import Context
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags

from otel_rl._sdk.otlp.sdk_compat import LogRecordExporter, LogRecordExportResult, log_encoder, log_request_parts
from otel_rl.exporters.step_events_proto import StepEventProtoWriter, varint
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

ENCODE = log_encoder()
RESOURCE = Resource({SERVICE_NAME: "otel-rl-test", A.RL_RUN_ID: "run-1", "team.tags": ("a", "b")}, schema_url="https://x/1.0")
SCOPE = InstrumentationScope("otel_rl", "9.9.9")
TRACED = SpanContext(0x0123456789ABCDEF0123456789ABCDEF, 0x0123456789ABCDEF, False, TraceFlags(1))
UNSAMPLED = SpanContext(0x0123456789ABCDEF0123456789ABCDEF, 0x1111111111111111, False, TraceFlags(0))


class Captured(LogRecordExporter):
    def __init__(self) -> None:
        self.records: list = []

    def export(self, batch):
        self.records.extend(batch)
        return LogRecordExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        pass


def both(steps: list[tuple[dict[str, float], int | None, SpanContext | None]], packed: bool = False) -> tuple[bytes, bytes]:
    """(the SDK encoder's request, the direct writer's request) for the same steps; ``packed``: the
    float-only steps handed over packed, as log() packs them."""
    captured = Captured()
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(SimpleLogRecordProcessor(captured))
    logger = provider.get_logger(SCOPE.name, SCOPE.version)
    stored: list[tuple[bytes, int]] = []
    writer = StepEventProtoWriter(
        lambda payload, records: stored.append((payload, records)) is None,
        *log_request_parts(ENCODE, RESOURCE, SCOPE),
        N.RL_LOG_EVENT,
        A.RL_STEP,
    )
    templates: dict[tuple[str, ...], object] = {}
    for index, (values, step, span_context) in enumerate(steps):
        time_ns = 1_764_000_000_000_000_000 + index * 1_000_003
        context = trace.set_span_in_context(trace.NonRecordingSpan(span_context)) if span_context is not None else Context()
        logger.emit(
            timestamp=time_ns,
            observed_timestamp=time_ns,
            context=context,
            severity_number=SeverityNumber.INFO,
            body=values,
            attributes={A.RL_STEP: step} if step is not None else {},
            event_name=N.RL_LOG_EVENT,
        )
        ints = tuple(i for i, v in enumerate(values.values()) if type(v) is int)
        template = templates.setdefault((tuple(values), ints), writer.template(list(values), ints))
        numbers = list(values.values())
        if packed and not ints:
            numbers = struct.pack(f"<{len(numbers)}d", *numbers)
        writer.add(template, numbers, step, time_ns, span_context)
    assert writer.pending
    assert writer.write() and not writer.pending
    assert writer.write()  # nothing pending: nothing stored, still success
    provider.shutdown()
    ((payload, records),) = stored
    assert records == len(steps)
    return ENCODE(captured.records).SerializeToString(), payload


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([({"loss": 0.5, "kl": -0.0, "lr": 1e-300}, 1, None)], id="one-step"),
        pytest.param([({"a": 1.0, "b": 2.0}, None, None), ({"a": 3.0, "b": 4.0}, -5, UNSAMPLED)], id="no-step-negative-step-unsampled"),
        pytest.param([({"é/κ/报酬": 1.25, "x" * 300: 2.5}, 2**40, TRACED)], id="unicode-and-long-keys"),
        pytest.param([({f"critic/k{i}/mean": i / 7 for i in range(250)}, s, TRACED) for s in range(3)], id="250-keys"),
        pytest.param([({"a": 1.0}, 1, None), ({"b": 2.0, "c": 3.0}, 1, TRACED), ({"a": 4.0}, 2, None)], id="two-key-sets-taking-turns"),
        pytest.param(
            [
                ({"n": 0, "x": 0.5, "y": 1.5, "m": -1, "z": 2.5}, 1, TRACED),
                ({"n": 2**63 - 1, "x": -0.5, "y": 1e300, "m": -(2**63), "z": 5e-324}, 2, None),
                ({"n": 127, "x": 0.0, "y": 1.0, "m": 128, "z": 2.0}, 3, None),
            ],
            id="ints-between-floats",
        ),
        pytest.param([({"global_step": 7, "epoch": 1}, 7, None), ({"global_step": 300, "x": 0.25}, 8, None)], id="ints-only-at-the-ends"),
        pytest.param([({"a": 1.0, "b": 2}, 1, None), ({"a": 1.0, "b": 2.0}, 2, None)], id="same-keys-int-then-float"),
    ],
)
@pytest.mark.parametrize("packed", [False, True], ids=["numbers", "packed"])
def test_the_request_is_the_sdk_encoders_byte_for_byte(steps, packed) -> None:
    sdk, direct = both(steps, packed)
    assert direct == sdk
    request = ExportLogsServiceRequest.FromString(direct)
    records = request.resource_logs[0].scope_logs[0].log_records
    decoded = [{kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in r.body.kvlist_value.values} for r in records]
    assert decoded == [v for v, _, _ in steps]
    assert [[type(v) for v in d.values()] for d in decoded] == [[type(v) for v in v.values()] for v, _, _ in steps]


@pytest.mark.parametrize(("max_records", "max_bytes", "sizes"), [(4, 1 << 20, [4, 4, 2]), (100, 3_500, [3, 3, 3, 1]), (100, 10, [1] * 10)])
def test_a_drain_is_stored_as_bounded_requests_in_order(max_records, max_bytes, sizes) -> None:
    # The spool drops whole oldest segments when full: one request of a long drain bigger than a
    # segment would take the newest steps with it, so a drain is cut by records and by bytes.
    stored: list[tuple[bytes, int]] = []
    writer = StepEventProtoWriter(
        lambda payload, records: stored.append((payload, records)) is None,
        *log_request_parts(ENCODE, RESOURCE, SCOPE),
        N.RL_LOG_EVENT,
        A.RL_STEP,
        max_records=max_records,
        max_bytes=max_bytes,
    )
    template = writer.template([f"actor/k{i}" for i in range(40)])  # ~1,060 bytes a record
    for step in range(10):
        writer.add(template, [step + i / 40 for i in range(40)], step, 1_764_000_000_000_000_000 + step, None)
    assert writer.write()
    assert [records for _, records in stored] == sizes
    steps = []
    for payload, records in stored:
        assert records == 1 or len(payload) <= max_bytes + 200  # the resource and scope around them
        (resource_logs,) = ExportLogsServiceRequest.FromString(payload).resource_logs
        assert resource_logs.resource.attributes[0].key == SERVICE_NAME
        steps += [r.attributes[0].value.int_value for r in resource_logs.scope_logs[0].log_records]
    assert steps == list(range(10))


def test_varint_matches_protobuf() -> None:
    from google.protobuf.internal.encoder import _VarintBytes  # the reference implementation

    for value in (0, 1, 127, 128, 300, 2**32, 2**63 - 1):
        assert varint(value) == _VarintBytes(value)
    assert varint(-1) == b"\xff" * 9 + b"\x01"  # an int64 below zero: ten bytes, two's complement


@pytest.mark.parametrize(
    ("options", "writers"),
    [
        pytest.param({"exporters": "otlp"}, ["StepEventProtoWriter"], id="otlp"),
        pytest.param({"exporters": "file,otlp"}, ["StepEventWriter", "StepEventProtoWriter"], id="file-and-otlp"),
        pytest.param({"exporters": "otlp", "spool_max_bytes": 0}, [], id="otlp-without-spool"),
        pytest.param({"exporters": "file,otlp", "track_with": "stdout"}, [], id="with-a-tracker"),
    ],
)
def test_a_telemetry_writes_directly_where_every_destination_can_and_all_get_the_same_events(
    tmp_path, make_telemetry, options, writers
) -> None:
    """Direct writers only when every destination of events has one (a tracker reads the SDK's
    records, the SDK's exporter sends without a spool); the collector and the run folder get the
    steps logged, either way."""
    from otlp_sink import OtlpSink

    from otel_rl.runs.folder import read_log_records

    keys = ["actor/pg_loss", "actor/entropy", "critic/score/mean", "time/step_generate", "perf/total_num_tokens"]
    # the last value an int on odd steps (as verl logs its counts), a float on even ones
    logged = {step: {key: step + i / 8 if i < 4 or step % 2 == 0 else 1000 + step for i, key in enumerate(keys)} for step in range(10)}
    with OtlpSink() as sink:
        tel = make_telemetry(framework="roll", endpoint=sink.endpoint, **options)
        direct = tel._providers.step_events
        names = [type(w).__name__ for w in getattr(direct, "writers", [direct] if direct is not None else [])]
        assert names == writers
        for step, values in logged.items():
            with tel.step(step):
                tel.log(values)
        assert tel.flush(10)
        plan = tel._pipeline.step_plans[tuple(keys)]
        assert (plan.template is not None) == bool(writers)  # the later steps took the direct path
        assert bool(plan.int_templates) == bool(writers)  # those with an int too
        received = {r[1][A.RL_STEP]: r[2] for r in sink.received.events(N.RL_LOG_EVENT)}
        assert received == logged
        assert [type(received[step]["perf/total_num_tokens"]) for step in range(4)] == [float, int, float, int]
        if "file" in options["exporters"]:
            in_folder = {
                r["attributes"][A.RL_STEP]: r["body"] for r in read_log_records(tel.config.run_dir) if r["event_name"] == N.RL_LOG_EVENT
            }
            assert in_folder == logged
            assert [type(in_folder[step]["perf/total_num_tokens"]) for step in range(4)] == [float, int, float, int]
        tel.shutdown()
