"""Calls telemetry refuses, each kind said once and counted, never raised into the loop: calls after
shutdown(), otel_rl.log() before init(), and steps or integer attributes outside int64 (which the
OTLP encoder cannot carry and a backend would read as another step)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from otlp_sink import OtlpSink

import otel_rl
from otel_rl.runs.folder import read_log_records, read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

INT64_MAX = 2**63 - 1
_LOGS, _METRICS = A.RlTelemetrySignalValues.LOGS.value, A.RlTelemetrySignalValues.METRICS.value
_AFTER_SHUTDOWN = A.RlTelemetryDropReasonValues.AFTER_SHUTDOWN.value


def test_calls_after_shutdown_are_said_once_and_counted(make_telemetry, caplog) -> None:
    tel = make_telemetry()
    tel.log({"actor/pg_loss": 1.0}, step=0)
    tel.shutdown()
    caplog.clear()
    for step in range(1, 4):
        tel.log({"actor/pg_loss": 2.0}, step=step)
    tel.record(M.RL_SAMPLE_REWARD, [1.0, 2.0])
    tel.add(M.RL_TENSOR_NONFINITE)
    tel.event(N.RL_LOG_EVENT, {"x": 1.0})
    said = [r.getMessage() for r in caplog.records if r.name == "otel_rl" and r.threadName == "MainThread"]
    assert len(said) == 1, said
    assert "log() was called after shutdown()" in said[0] and "dropped" in said[0]
    assert str(tel.run_dir) in said[0] and "otel_rl.init()" in said[0]
    assert tel.dropped_calls == 6
    drops = {
        signal: tel.latest(M.RL_TELEMETRY_DROPPED, {A.RL_TELEMETRY_SIGNAL: signal, A.RL_TELEMETRY_DROP_REASON: _AFTER_SHUTDOWN})
        for signal in (_LOGS, _METRICS)
    }
    assert drops == {_LOGS: 4, _METRICS: 2}
    assert [r["attributes"][A.RL_STEP] for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT] == [0]


_BEFORE_INIT = """
import otel_rl
assert otel_rl.get_telemetry() is None  # code that checks for telemetry keeps working
try:
    otel_rl.log({"actor/pg_loss": 0.5}, step=0)
except RuntimeError as exc:
    print("raised:", exc)
tel = otel_rl.init(run_dir=RUN, console=False, service_name="before-init")
otel_rl.log({"actor/pg_loss": 0.25}, step=1)  # the module-level call logs to it
otel_rl.shutdown()
assert otel_rl.get_telemetry() is None
otel_rl.log({"actor/pg_loss": 0.125}, step=2)  # after shutdown: dropped, said once, never raised
print("dropped:", tel.dropped_calls)
"""


def test_module_level_log_before_init_says_to_call_init_first(tmp_path) -> None:
    run = tmp_path / "run"
    code = f"RUN = {str(run)!r}\n" + _BEFORE_INIT
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "raised: otel-rl: otel_rl.log() was called before otel_rl.init()" in done.stdout
    assert "Call otel_rl.init() first" in done.stdout
    assert "dropped: 1" in done.stdout
    assert "AttributeError" not in done.stderr
    assert done.stderr.count("after shutdown()") == 1
    steps = [r["attributes"][A.RL_STEP] for r in read_log_records(run) if r["event_name"] == N.RL_LOG_EVENT]
    assert steps == [1]


def _ints(value: object) -> list[int]:
    """Every int inside an attribute or body value."""
    if type(value) is int:
        return [value]
    if isinstance(value, dict):
        return [i for v in value.values() for i in _ints(v)]
    if isinstance(value, list):
        return [i for v in value for i in _ints(v)]
    return []


@pytest.mark.parametrize("bad_step", [2**64, 10**30, -(2**70)], ids=["2**64", "10**30", "-2**70"])
def test_a_step_or_attribute_outside_int64_is_refused_at_the_call_once_never_mangled(tmp_path, caplog, bad_step: int) -> None:
    caplog.set_level(logging.WARNING)
    with OtlpSink() as sink:
        tel = otel_rl.Telemetry(
            otel_rl.resolve_config(
                dict(
                    run_dir=str(tmp_path / "run"),
                    exporters="otlp,file",
                    endpoint=sink.endpoint,
                    spool_max_bytes=0,
                    console=False,
                    service_name="int64",
                )
            )
        )
        try:
            with tel.step(bad_step):
                with tel.stage("generate"):
                    pass
                tel.log({"actor/pg_loss": 0.5, "actor/kl_loss": 0.1})  # at the scope's step
            for _ in range(3):
                tel.log({"actor/pg_loss": 0.5}, step=bad_step)
            tel.log({"actor/pg_loss": 0.75}, step=7)  # a good step goes through
            tel.event(N.RL_LOG_EVENT, {"x": 1.0}, step=bad_step)
            tel.record(M.RL_SAMPLE_REWARD, [1.0], {"rl.sample.source": 2**70})
            tel.add(M.RL_TENSOR_NONFINITE, 1.0, {"rl.sample.source": 2**70})
            tel.flush()
            rejected = tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: A.RlTelemetryReasonValues.OUT_OF_RANGE.value})
        finally:
            tel.shutdown()
        received = sink.received
        # Nothing the SDK could not encode: no traceback in the training console. (Other records of the
        # SDK's loggers may come from the exporters of earlier tests, still retrying on their threads.)
        encoding = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry") and "encode" in r.getMessage()]
        assert not encoding, encoding
        said = [r.getMessage() for r in caplog.records if r.name == "otel_rl"]
        steps_said = [m for m in said if "step=" in m]
        assert len(steps_said) == 1, said  # one message for every refused step
        assert f"step={bad_step}" in steps_said[0] and "64-bit" in steps_said[0] and "dropped" in steps_said[0]
        attrs_said = [m for m in said if "'rl.sample.source'" in m]
        assert len(attrs_said) == 1 and str(2**70) in attrs_said[0]
        assert rejected == 2 + 3 + 1 + 2  # the scope's log() (2 values), 3 log() calls, the event, record() and add()
        # Only the good step arrived, and no integer out of range (none wrapped to another step).
        assert [a[A.RL_STEP] for name, a, _, _ in received.logs if name == N.RL_LOG_EVENT] == [7]
        exported = [i for _, _, _, a in received.spans for i in _ints(a)] + [i for _, a, b, _ in received.logs for i in _ints([a, b])]
        assert all(-(2**63) <= i <= INT64_MAX for i in exported)
        spans = {name: a for _, _, name, a in received.spans}
        assert A.RL_STEP not in spans[N.RL_STEP_SPAN] and A.RL_STEP not in spans["rl.generate"]
    # The run folder says the same as the collector.
    assert [r["attributes"][A.RL_STEP] for r in read_log_records(tmp_path / "run") if r["event_name"] == N.RL_LOG_EVENT] == [7]
    assert {s.name for s in read_spans(tmp_path / "run")} >= {N.RL_STEP_SPAN, "rl.generate"}


def test_integer_like_steps_of_other_types_are_logged_as_ints(make_telemetry) -> None:
    np = pytest.importorskip("numpy")
    tel = make_telemetry()
    tel.log({"actor/pg_loss": 0.5}, step=np.int64(3))
    tel.log({"actor/pg_loss": 0.5}, step=np.uint64(2**64 - 1))  # refused: past int64
    tel.shutdown()
    steps = [r["attributes"][A.RL_STEP] for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT]
    assert steps == [3]


def test_past_the_attribute_count_limit_a_span_and_an_event_keep_their_first_attributes_said_once(make_telemetry, caplog) -> None:
    """The SDK drops the oldest attributes past its count limit (128), so a stage span that a user
    gave 200 more lost its own rl.stage, rl.rank and rl.step, and it logs a warning for every one it
    drops. The first are kept (as the specification asks), the rest counted, and it is said once."""
    from opentelemetry import trace

    tel = make_telemetry()
    extra = {f"user.k{i:03d}": i for i in range(200)}
    for step in (1, 2):
        with tel.step(step), tel.stage("generate", cluster="actor_infer"):
            span = trace.get_current_span()
            span.set_attributes(extra)
            span.add_event("user.event", extra)
            span.add_link(trace.SpanContext(0xAB, 0xCD, is_remote=True), extra)
        tel.event(N.RL_SAMPLE_EVENT, {"prompt": "p"}, extra, step=step)
    tel.shutdown()

    stages = [s for s in read_spans(tel.run_dir) if s.attributes.get(A.RL_STAGE) == "generate"]
    assert [s.attributes[A.RL_STEP] for s in stages] == [1, 2]
    for span in stages:
        assert list(span.attributes)[:5] == [A.RL_STAGE, A.RL_RANK, A.RL_STEP, A.RL_CLUSTER, "user.k000"]
        assert len(span.attributes) == 128 and "user.k199" not in span.attributes
    lines = (tel.run_dir / "traces.jsonl").read_text()
    assert lines.count('"droppedAttributesCount":76') == 2  # 4 of otel-rl's + 200 given, 128 kept
    trees = [json.loads(line) for line in lines.splitlines()]
    raw = [s for t in trees for r in t["resourceSpans"] for ss in r["scopeSpans"] for s in ss["spans"] if s["name"].endswith("generate")]
    for part in [e for s in raw for e in s["events"]] + [link for s in raw for link in s["links"]]:  # a span event's, a link's
        assert [a["key"] for a in part["attributes"]][:2] == ["user.k000", "user.k001"] and part["droppedAttributesCount"] == 72

    samples = [r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_SAMPLE_EVENT]
    assert [r["attributes"][A.RL_STEP] for r in samples] == [1, 2]
    for record in samples:
        assert len(record["attributes"]) == 128
        assert "user.k000" in record["attributes"] and "user.k126" in record["attributes"] and "user.k127" not in record["attributes"]

    full = [r for r in caplog.records if "Attributes dict is full" in r.getMessage()]
    assert not full, f"{len(full)} of the SDK's per-attribute warnings"
    said = [r.getMessage() for r in caplog.records if r.name.startswith("otel_rl") and "attributes" in r.getMessage()]
    assert len(said) == 4, said  # the span's, its event's and link's, and the event's: once each over two steps
    assert any("'user.k124'" in m and "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT" in m for m in said), said
    assert any("'user.k127'" in m and "OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT" in m for m in said), said
    assert any("event 'user.event'" in m and "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT" in m for m in said), said
    assert any("a link of" in m and "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT" in m for m in said), said


def test_the_sdks_cleaning_of_an_attribute_is_said_once_naming_the_key_not_at_every_span(make_telemetry, caplog) -> None:
    """The SDK logs a warning without the key each time it cleans a value (a non-OTLP type made its
    str(), a string cut at the length limit): a stage span's or an event's bad attribute printed a line
    at every step. It is said once per place and key, the key named; the values are cleaned as before,
    and the SDK's warnings of other threads still pass."""
    from opentelemetry import trace
    from opentelemetry.attributes import BoundedAttributes

    class Setting:  # no OTLP type: the SDK keeps its str()
        def __str__(self) -> str:
            return "setting"

    tel = make_telemetry(attribute_value_limit=32)
    for step in range(3):
        with tel.step(step), tel.stage("generate"):
            span = trace.get_current_span()
            span.set_attribute("user.obj", Setting())
            span.set_attribute("user.note", "x" * 40)
        tel.event(N.RL_SAMPLE_EVENT, {"prompt": "p"}, {"user.bad": Setting(), "user.long": "y" * 40}, step=step)
    tel.shutdown()

    stages = [s for s in read_spans(tel.run_dir) if s.attributes.get(A.RL_STAGE) == "generate"]
    assert len(stages) == 3
    for span in stages:  # cleaned as the SDK cleans them
        assert span.attributes["user.note"] == "x" * 32 and span.attributes["user.obj"] == "setting"
    samples = [r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_SAMPLE_EVENT]
    assert [(r["attributes"]["user.bad"], r["attributes"]["user.long"]) for r in samples] == [("setting", "y" * 32)] * 3

    assert not [r for r in caplog.records if r.name == "opentelemetry.attributes"]
    said = [r.getMessage() for r in caplog.records if r.name.startswith("otel_rl") and "the SDK's cleaning" in r.getMessage()]
    assert len(said) == 3, said
    assert any("span 'rl.generate', attribute 'user.obj': Invalid type" in m for m in said), said
    assert any("span 'rl.generate', attribute 'user.note': String attribute value exceeds max length of 32" in m for m in said), said
    assert any("rl.sample event, attribute 'user.long': String attribute value exceeds max length of 32" in m for m in said), said
    # a value of no OTLP type is made text at the event() call, before the SDK sees it: said once there
    converted = [r.getMessage() for r in caplog.records if "got attribute 'user.bad' of type Setting" in r.getMessage()]
    assert len(converted) == 1, converted

    caplog.clear()
    BoundedAttributes(None, {"k": object()})  # outside otel-rl's building: the SDK's own warning
    assert [r.name for r in caplog.records] == ["opentelemetry.attributes"]


def test_a_metric_attribute_of_no_otlp_type_is_its_str_said_once_and_every_export_is_written(make_telemetry, caplog) -> None:
    """An attribute value OTLP cannot carry (an object, a stage's cluster given as one) failed the
    run folder's encoding of every later metric export, with a traceback each time. Such a value is
    its str() (numpy's integers and floats are numbers), said once per call and attribute."""
    import numpy as np

    from otel_rl.runs.folder import read_metrics

    class Pool:
        def __str__(self) -> str:
            return "pool-a"

    tel = make_telemetry(metric_export_interval_s=0.1)
    for step in range(3):
        with tel.step(step), tel.stage("generate", cluster=Pool()):
            pass
        tel.record(M.RL_SAMPLE_REWARD, [1.0, 2.0], attributes={"user.pool": Pool(), "user.shard": np.int64(3)})
        tel.add(M.RL_TENSOR_NONFINITE, 1, attributes={"user.pool": Pool()})
        tel.flush()
    tel.shutdown()

    points = read_metrics(tel.run_dir)
    rewards = [p for p in points if p.name == M.RL_SAMPLE_REWARD]
    assert rewards and all(p.attributes == {"user.pool": "pool-a", "user.shard": 3} for p in rewards)
    assert rewards[-1].count == 6
    nonfinite = [p for p in points if p.name == M.RL_TENSOR_NONFINITE]
    assert nonfinite and nonfinite[-1].attributes == {"user.pool": "pool-a"} and nonfinite[-1].value == 3
    durations = [p for p in points if p.name == M.RL_STAGE_DURATION and p.attributes.get(A.RL_STAGE) == "generate"]
    assert durations and {p.attributes.get(A.RL_CLUSTER) for p in durations} == {"pool-a"}

    assert not [r for r in caplog.records if r.exc_info or "Failed to encode" in r.getMessage()]
    said = [r.getMessage() for r in caplog.records if r.name.startswith("otel_rl") and "str() is used" in r.getMessage()]
    assert len(said) == 3, said
    assert any("record('rl.sample.reward') got attribute 'user.pool' of type Pool" in m for m in said), said
    assert any("add('rl.tensor.nonfinite') got attribute 'user.pool'" in m for m in said), said
    assert any("stage('generate', cluster=...) got a Pool" in m for m in said), said


def test_an_attribute_whose_str_raises_never_raises_into_the_loop(make_telemetry) -> None:
    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    tel = make_telemetry()
    with tel.step(0), tel.stage("generate", cluster=Broken()):  # type: ignore[arg-type]
        pass
    tel.record(M.RL_SAMPLE_REWARD, [1.0], attributes={"user.pool": Broken()})
    tel.shutdown()
    from otel_rl.runs.folder import read_metrics

    points = read_metrics(tel.run_dir)
    assert {p.attributes.get("user.pool") for p in points if p.name == M.RL_SAMPLE_REWARD} == {"<unrepresentable Broken>"}
    assert {p.attributes.get(A.RL_CLUSTER) for p in points if p.name == M.RL_STAGE_DURATION} == {"<unrepresentable Broken>"}
