"""The direct writer of float-only step events: the keys once per key set, the values alone after
that, and read back as the very records the SDK's log pipeline writes."""

from __future__ import annotations

import base64
import json
import os
import struct

import pytest
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.context import Context
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags

import otel_rl
from otel_rl.exporters.otlp_json import OtlpJsonLogExporter
from otel_rl.exporters.step_events import KeyTemplate, StepEventWriter
from otel_rl.runs.folder import read_log_records
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

RESOURCE = Resource.create({"service.name": "trainer", "rl.run.id": "run-1", "rl.rank": 0})
SCOPE = ("otel_rl", "0.1.0")
# Keys that need escaping, one that is not ASCII, values OTLP/JSON writes in several ways.
STEPS = [
    ({"actor/pg_loss": 0.5, 'odd "key"\\/': -1e-05, "réponse/longueur": 1e300, "x": 3.0}, 7, 1_700_000_000_123_456_789),
    ({"actor/pg_loss": -0.0, 'odd "key"\\/': 123456789.125, "réponse/longueur": 5e-324, "x": 2.5}, None, 1_700_000_000_223_456_789),
]
# verl logs ints among the floats (training/global_step, global_seqlen/*): int64s in the event.
STEPS_WITH_INTS = [
    ({"training/global_step": 7, "actor/pg_loss": 0.5, "global_seqlen/min": -(2**63), "x": 1e300}, 7, 1_700_000_000_123_456_789),
    ({"training/global_step": 8, "actor/pg_loss": -0.0, "global_seqlen/min": 2**63 - 1, "x": 5e-324}, 8, 1_700_000_000_223_456_789),
]
CONTEXTS = [
    None,
    SpanContext(trace_id=0x0AF7651916CD43DD8448EB211C80319C, span_id=0x00F067AA0BA902B7, is_remote=False, trace_flags=TraceFlags(1)),
    SpanContext(trace_id=0x1, span_id=0x2, is_remote=True, trace_flags=TraceFlags(0)),
]


def sdk_lines(path, steps, context) -> list[str]:
    """What the SDK's log pipeline writes for these steps (as Pipeline.emit_event emits them)."""
    provider = LoggerProvider(resource=RESOURCE)
    exporter = OtlpJsonLogExporter(path)
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger(*SCOPE)
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(context)) if context is not None else Context()
    for values, step, time_ns in steps:
        logger.emit(
            timestamp=time_ns,
            observed_timestamp=time_ns,
            context=ctx,
            severity_number=SeverityNumber.INFO,
            body=dict(values),
            attributes={A.RL_STEP: step} if step is not None else {},
            event_name=N.RL_LOG_EVENT,
        )
    provider.shutdown()
    return path.read_text(encoding="utf-8").splitlines()


def writer_for(exporter: OtlpJsonLogExporter) -> StepEventWriter:
    return StepEventWriter(exporter, RESOURCE, InstrumentationScope(*SCOPE), N.RL_LOG_EVENT, A.RL_STEP, A.RL_LOG_KEY_SET)


def direct_record_lines(path, steps, context, packed: bool = False) -> list[str]:
    """The direct writer's lines; ``packed``: float-only steps handed over packed, as log() packs them."""
    exporter = OtlpJsonLogExporter(path)
    writer = writer_for(exporter)
    for values, step, time_ns in steps:
        numbers = list(values.values())
        if packed and not ints_of(values):
            numbers = struct.pack(f"<{len(numbers)}d", *numbers)
        writer.add(KeyTemplate(list(values), ints_of(values)), numbers, step, time_ns, context)
        assert writer.write()
    exporter.shutdown()
    return path.read_text(encoding="utf-8").splitlines()


def ints_of(values: dict) -> tuple[int, ...]:
    return tuple(i for i, v in enumerate(values.values()) if type(v) is int)


def body_text(line: str) -> str:
    start = line.index('"body":{"kvlistValue"')
    return line[start : line.index("}}]}}", start) + 5]


def only_record(line: str) -> dict:
    (record,) = json.loads(line)["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    return record


@pytest.mark.parametrize(
    ("steps", "packed"), [(STEPS, False), (STEPS, True), (STEPS_WITH_INTS, False)], ids=["floats", "floats-packed", "ints-among-floats"]
)
@pytest.mark.parametrize("context", CONTEXTS, ids=["no-span", "sampled-span", "remote-unsampled"])
def test_direct_records_read_back_as_the_sdk_pipelines_records(tmp_path, context, steps, packed):
    sdk = sdk_lines(tmp_path / "sdk.jsonl", steps, context)
    direct = direct_record_lines(tmp_path / "direct.jsonl", steps, context, packed)
    assert len(sdk) == len(direct) == 2
    key_set = KeyTemplate(list(steps[0][0]), ints_of(steps[0][0])).key_set
    tag = {"key": A.RL_LOG_KEY_SET, "value": {"stringValue": key_set}}
    # The key set's first record: the SDK's record with the key set named.
    first, expected = only_record(direct[0]), only_record(sdk[0])
    expected["attributes"] = [*expected.get("attributes", []), tag]
    assert first == expected
    assert body_text(direct[0]) == body_text(sdk[0])  # the map's text byte for byte, not only the same JSON
    # The next step of the same keys: its values alone, in key order, as doubles.
    second, expected = only_record(direct[1]), only_record(sdk[1])
    expected["attributes"] = [*expected.get("attributes", []), tag]
    layout = "".join("q" if type(v) is int else "d" for v in steps[1][0].values())
    packed = struct.pack("<" + layout, *steps[1][0].values())  # little-endian doubles and int64s
    expected["body"] = {"bytesValue": base64.b64encode(packed).decode()}
    assert second == expected
    assert len(direct[1]) < len(sdk[1])
    # Read back, both files give the same records (the map restored, the key set attribute gone).
    assert read_log_records(tmp_path / "direct.jsonl") == read_log_records(tmp_path / "sdk.jsonl")
    assert not read_log_records(tmp_path / "direct.jsonl").problems
    back = [r["body"] for r in read_log_records(tmp_path / "direct.jsonl")]
    assert [[type(v) for v in body.values()] for body in back] == [[type(v) for v in v.values()] for v, _, _ in steps]


def test_the_same_keys_with_and_without_ints_are_two_key_sets(tmp_path):
    # A value logged as an int in one step and a float in the next: each record reads back as logged.
    keys = ["step_count", "loss"]
    assert KeyTemplate(keys, (0,)).key_set != KeyTemplate(keys).key_set
    exporter = OtlpJsonLogExporter(tmp_path / "logs.jsonl")
    writer = writer_for(exporter)
    steps = [[3, 0.5], [3.0, 0.25], [4, 0.125], [4.0, 0.0625]]
    for step, values in enumerate(steps):
        writer.add(KeyTemplate(keys, (0,) if type(values[0]) is int else ()), values, step, 1_000 + step, None)
    assert writer.write()
    exporter.shutdown()
    back = [list(r["body"].values()) for r in read_log_records(tmp_path / "logs.jsonl")]
    assert back == steps and [type(v[0]) for v in back] == [int, float, int, float]


def test_one_line_per_write_holds_every_record_in_order(tmp_path):
    exporter = OtlpJsonLogExporter(tmp_path / "logs.jsonl")
    writer = writer_for(exporter)
    template = KeyTemplate(["a", "b"])
    for step in range(5):
        writer.add(template, [step + 0.5, -step - 0.25], step, 1_000 + step, None)
    assert writer.write()
    assert writer.write()  # nothing pending: nothing written, still success
    exporter.shutdown()
    (line,) = (tmp_path / "logs.jsonl").read_text().splitlines()
    records = json.loads(line)["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    assert [r["attributes"][0]["value"]["intValue"] for r in records] == ["0", "1", "2", "3", "4"]
    assert [v["key"] for v in records[0]["body"]["kvlistValue"]["values"]] == ["a", "b"]
    assert struct.unpack("<2d", base64.b64decode(records[3]["body"]["bytesValue"])) == (3.5, -3.25)
    back = read_log_records(tmp_path / "logs.jsonl")
    assert [r["body"] for r in back] == [{"a": step + 0.5, "b": -step - 0.25} for step in range(5)]


def test_each_writer_names_its_key_sets_again_and_a_reader_restores_every_one(tmp_path):
    """Two processes one after the other (a resumed run) and two key sets taking turns: each
    writer starts with the map of each key set; the reader restores every record by its own keys."""
    path = tmp_path / "logs.jsonl"
    train, validation = KeyTemplate(["loss", "kl"]), KeyTemplate(["val/score"])
    expected = []
    for process in range(2):
        exporter = OtlpJsonLogExporter(path)
        writer = writer_for(exporter)
        for step in range(4):
            s = process * 10 + step
            writer.add(train, [s + 0.5, s / 4], s, 1_000 + s, None)
            expected.append({"loss": s + 0.5, "kl": s / 4})
            if step % 2:
                writer.add(validation, [s * 1.5], s, 1_000 + s, None)
                expected.append({"val/score": s * 1.5})
            assert writer.write()
        exporter.shutdown()
    text = path.read_text()
    assert text.count('"kvlistValue"') == 4 and text.count('"bytesValue"') == 8
    back = read_log_records(path)
    assert [r["body"] for r in back] == expected
    assert all(A.RL_LOG_KEY_SET not in r["attributes"] for r in back) and not back.problems


def test_values_whose_keys_no_earlier_line_holds_are_skipped_and_said(tmp_path):
    """A file whose first lines are gone (cut by hand, a copy of its tail): the records that
    carry values alone cannot be read as maps; they are skipped, named, and the rest is read."""
    path = tmp_path / "logs.jsonl"
    exporter = OtlpJsonLogExporter(path)
    writer = writer_for(exporter)
    template = KeyTemplate(["a"])
    for step in range(3):
        writer.add(template, [float(step)], step, 1_000 + step, None)
        assert writer.write()
    writer.add(KeyTemplate(["b"]), [9.0], 3, 1_003, None)
    assert writer.write()
    exporter.shutdown()
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[1:]))  # the line with key set "a"'s map is gone
    back = read_log_records(path)
    assert [r["body"] for r in back] == [{"b": 9.0}]
    assert [(p.line, p.reason) for p in back.problems] == [
        (n, f"skipped 1 rl.log record(s) whose keys no earlier line holds (1 of key set {template.key_set})") for n in (1, 2)
    ]


def test_a_line_that_failed_to_write_has_its_maps_written_again(tmp_path, monkeypatch):
    exporter = OtlpJsonLogExporter(tmp_path / "logs.jsonl")
    writer = writer_for(exporter)
    template = KeyTemplate(["a"])
    writer.add(template, [1.0], 1, 1, None)
    monkeypatch.setattr(exporter.lines, "write_bytes", lambda line, items=1: False)  # a full disk, say
    assert not writer.write()
    monkeypatch.undo()
    writer.add(template, [2.0], 2, 2, None)
    assert writer.write()
    exporter.shutdown()
    back = read_log_records(tmp_path / "logs.jsonl")
    assert [r["body"] for r in back] == [{"a": 2.0}] and not back.problems


def test_a_line_after_shutdown_or_in_a_forked_child_is_not_written(tmp_path, monkeypatch):
    exporter = OtlpJsonLogExporter(tmp_path / "logs.jsonl")
    writer = writer_for(exporter)
    writer.add(KeyTemplate(["a"]), [1.0], 1, 1, None)
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as a forked child sees it: another pid
    assert not writer.write()
    monkeypatch.undo()
    exporter.shutdown()
    writer.add(KeyTemplate(["a"]), [1.0], 2, 2, None)
    assert not writer.write()
    assert (tmp_path / "logs.jsonl").read_text() == ""


def test_the_run_folder_alone_takes_the_direct_path_and_reads_back_the_same(tmp_path):
    """A files-only telemetry writes float steps directly; with a tracker attached the SDK path
    stays (the tracker reads the SDK's records). Both folders read back the same events."""
    keys = ["actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "critic/score/max", "time/step_generate"]
    folders = {}
    for name, options in {"direct": {}, "sdk": {"track_with": "stdout"}}.items():
        folder = tmp_path / name
        tel = otel_rl.Telemetry(
            otel_rl.resolve_config({"service_name": "t", "console": False, "framework": "roll", "run_dir": str(folder), **options})
        )
        assert (tel._providers.step_events is not None) == (name == "direct")
        for step in range(6):
            with tel.step(step):
                tel.log({key: step + i / 8 for i, key in enumerate(keys)})
        tel.flush()
        plan = tel._pipeline.step_plans[tuple(keys)]
        assert (plan.template is not None) == (name == "direct")  # the later steps took the direct path
        tel.shutdown()
        folders[name] = folder
    events = {
        name: sorted(
            (r["attributes"][A.RL_STEP], tuple(r["body"].items())) for r in read_log_records(folder) if r["event_name"] == N.RL_LOG_EVENT
        )
        for name, folder in folders.items()
    }
    assert len(events["direct"]) == 6
    assert events["direct"] == events["sdk"]
