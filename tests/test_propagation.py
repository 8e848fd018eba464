"""Trace context across processes: inject on the driver, join on the worker (real SDK, real processes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import otel_rl
from otel_rl._sdk.settings.config import resolve_config
from otel_rl._sdk.spans.propagation import extract_context, inject_context
from otel_rl.runs.folder import find_step_trace, rank_file_name, read_log_records, read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N


def test_carrier_holds_w3c_traceparent_and_the_step(make_telemetry):
    tel = make_telemetry()
    with tel.step(7) as scope, tel.stage("generate", cluster="actor_infer"):
        carrier = tel.inject({"existing": "kept"})
    assert carrier["existing"] == "kept"
    version, trace_id, span_id, flags = carrier["traceparent"].split("-")
    assert (version, trace_id) == ("00", scope.trace_id)
    assert int(flags, 16) & 1  # sampled
    assert len(span_id) == 16
    assert carrier["baggage"] == f"{A.RL_STEP}=7"
    _, step = extract_context(carrier)
    assert step == 7


def test_worker_spans_are_children_of_the_injecting_stage(make_telemetry, tmp_path):
    driver = make_telemetry(service_name="driver")
    # another process's telemetry, built directly: a second init() replaces the first
    worker = otel_rl.Telemetry(resolve_config({"service_name": "worker", "rank": 1, "console": False, "run_dir": str(tmp_path / "worker")}))
    with driver.step(3) as scope:
        with driver.stage("generate", cluster="actor_infer"):
            carrier = driver.inject()
    # the worker, as it would in another process: no step of its own
    with worker.join(carrier) as joined:
        assert joined.joined and joined.step == 3
        with worker.stage("generate_shard", cluster="actor_infer"):
            pass
        worker.log({"actor/pg_loss": 0.25})
    assert worker.current_step is None  # restored after the scope
    driver.shutdown()
    worker.shutdown()

    driver_spans = read_spans(driver.run_dir)
    worker_spans = read_spans(worker.run_dir)
    stage = next(s for s in driver_spans if s.name == "rl.generate")
    shard = next(s for s in worker_spans if s.name == "rl.generate_shard")
    assert shard.trace_id == scope.trace_id == stage.trace_id
    assert shard.parent_span_id == stage.span_id
    assert shard.attributes[A.RL_STEP] == 3
    assert shard.attributes[A.RL_RANK] == 1
    event = next(r for r in read_log_records(worker.run_dir) if r["event_name"] == N.RL_LOG_EVENT)
    assert event["trace_id"] == scope.trace_id  # the worker's step event sits in the driver's trace
    assert event["attributes"][A.RL_STEP] == 3


@pytest.mark.parametrize("carrier", [None, {}, {"traceparent": "garbage"}, 42, {"traceparent": 5}])
def test_a_bad_carrier_is_reported_once_and_spans_start_their_own_trace(make_telemetry, caplog, carrier):
    tel = make_telemetry()
    for _ in range(2):
        with tel.join(carrier) as joined, tel.stage("generate"):
            assert not joined.joined
    tel.shutdown()
    assert len([r for r in caplog.records if "join() got a carrier" in r.getMessage()]) == 1
    spans = read_spans(tel.run_dir)
    assert len(spans) == 2 and all(s.parent_span_id is None for s in spans)


def test_inject_without_a_span_gives_no_traceparent_but_keeps_the_step():
    carrier = inject_context(step=4)
    assert "traceparent" not in carrier
    assert extract_context(carrier)[1] == 4


WORKER = textwrap.dedent("""
    import json, sys
    import otel_rl
    carrier = json.loads(sys.stdin.read())
    tel = otel_rl.init(run_dir=sys.argv[1], console=False, service_name="worker")
    with tel.join(carrier):
        with tel.stage("compute_rewards", cluster="reward"):
            pass
    tel.shutdown()
""")


def test_the_trace_crosses_a_real_process_boundary_into_one_run_folder(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    tel = otel_rl.init(run_dir=str(tmp_path), console=False, service_name="driver")
    with tel.step(1) as scope, tel.stage("compute_rewards", cluster="reward"):
        carrier = tel.inject()
    tel.shutdown()
    env = {**__import__("os").environ, "RANK": "2", "WORLD_SIZE": "3"}
    import json

    subprocess.run([sys.executable, "-c", WORKER, str(tmp_path)], input=json.dumps(carrier), text=True, env=env, check=True, timeout=120)
    assert (tmp_path / rank_file_name("traces.jsonl", 2)).is_file()
    trace = find_step_trace(read_spans(tmp_path), 1)  # both ranks' files are read
    assert {s.trace_id for s in trace} == {scope.trace_id}
    by_rank = {s.resource[A.RL_RANK]: s for s in trace if s.name == "rl.compute_rewards"}
    assert set(by_rank) == {0, 2}
    assert by_rank[2].parent_span_id == by_rank[0].span_id
    assert by_rank[2].resource[A.RL_WORLD_SIZE] == 3


def test_a_given_sdk_tracer_provider_is_reused_not_replaced_or_shut_down(make_telemetry):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    theirs = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(theirs))
    tel = make_telemetry(tracer_provider=provider)
    assert tel._providers.tracer_provider is provider
    with tel.step(1), tel.stage("generate"):
        pass
    tel.shutdown()
    # the framework's own exporter saw otel-rl's spans, and otel-rl's run folder has them too
    assert sorted(s.name for s in theirs.get_finished_spans()) == ["rl.generate", N.RL_STEP_SPAN]
    assert len(read_spans(tel.run_dir)) == 2
    # the provider still works for its owner after otel-rl shut down
    with provider.get_tracer("framework").start_as_current_span("after"):
        pass
    assert "after" in [s.name for s in theirs.get_finished_spans()]


def test_a_tracer_provider_that_is_not_the_sdk_one_is_refused_naming_the_fix(make_telemetry):
    from opentelemetry.trace import NoOpTracerProvider

    with pytest.raises(TypeError, match="needs an SDK TracerProvider"):
        make_telemetry(tracer_provider=NoOpTracerProvider())
