"""The demo through the real collectors (agent -> gateway, collector-config/otelcol/) into Jaeger,
VictoriaMetrics and Prometheus, over gRPC and over HTTP: one step's whole trace as Jaeger's own
query API returns it, every metric the demo emits under its Prometheus name, no per-step series."""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict

import pytest
from stack_support import DemoRun, http_json, poll

from otel_rl.codegen.generate import prometheus_name
from otel_rl.runs.folder import find_step_trace, read_metrics, read_spans
from otel_rl.runs.jaeger import JaegerClient
from otel_rl.runs.jaeger_json import to_jaeger_trace
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

pytestmark = pytest.mark.e2e

PHASES = {"rl.onload", "rl.execute", "rl.offload"}


def label(attribute: str) -> str:
    """The Prometheus label an OTel attribute becomes (dots and other characters to underscores)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


def vm_query(stack, expr: str) -> list[dict]:
    answer = http_json(f"{stack.endpoints['victoria_metrics']}/api/v1/query", {"query": expr})
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def vm_series(stack, selector: str) -> list[dict]:
    answer = http_json(f"{stack.endpoints['victoria_metrics']}/api/v1/series", [("match[]", selector), ("start", "0")])
    assert answer["status"] == "success", answer
    return answer["data"]


@pytest.mark.parametrize("step", [1, 4])
def test_a_steps_whole_trace_reaches_jaeger_as_the_run_folder_holds_it(stack, demo_run: DemoRun, step):
    expected = find_step_trace(read_spans(demo_run.run_dir), step)
    client = JaegerClient(stack.endpoints["jaeger"])
    spans = poll(
        lambda: client.step_trace_spans(step, service=demo_run.service, run_id=demo_run.run_id),
        lambda got: len(got) == len(expected),
        60,
        f"step {step}'s {len(expected)} spans in Jaeger (service {demo_run.service})",
    )
    by_id = {s.span_id: s for s in spans}
    assert by_id.keys() == {s.span_id for s in expected}
    for want in expected:  # every span as the run folder holds it, at Jaeger's microsecond precision
        got = by_id[want.span_id]
        assert (got.trace_id, got.parent_span_id, got.name) == (want.trace_id, want.parent_span_id, want.name)
        assert (got.start_ns, got.duration_ns // 1000) == (want.start_ns // 1000 * 1000, want.duration_ns // 1000), want.name
        assert got.attributes == want.attributes and got.status == want.status and got.kind == want.kind
        assert [(e.name, e.time_ns, e.attributes) for e in got.events] == [
            (e.name, e.time_ns // 1000 * 1000, e.attributes) for e in want.events
        ]
        assert {k: got.resource[k] for k in want.resource} == want.resource  # the agent may add host.name, never change one
    roots = [s for s in spans if s.parent_span_id is None]
    assert len(roots) == 1 and roots[0].name == N.RL_STEP_SPAN and roots[0].attributes[A.RL_STEP] == step
    root = roots[0]
    stages = [s for s in spans if s.parent_span_id == root.span_id]
    stage_names = {s.attributes[A.RL_STAGE] for s in stages}
    assert {
        "generate",
        "compute_rewards",
        "compute_log_probs",
        "compute_ref_log_probs",
        "compute_values",
        "advantage",
        "train_step",
        "model_update",
    } <= stage_names
    for span in spans:
        if span is root:
            continue
        parent = by_id[span.parent_span_id]
        assert parent.start_ns <= span.start_ns and span.end_ns <= parent.end_ns, span.name
        assert span.attributes[A.RL_STEP] == step and span.attributes[A.RL_RANK] == 0
        assert span.attributes[A.RL_STAGE]
        if span.name in PHASES:
            assert parent in stages and span.attributes[A.RL_STAGE_PHASE] == span.name.removeprefix("rl.")
    train = [s for s in stages if s.attributes[A.RL_STAGE] == "train_step" and s.attributes.get(A.RL_CLUSTER) == "actor_train"][0]
    assert {s.name for s in spans if s.parent_span_id == train.span_id} == PHASES
    snapshots = [
        (e.attributes[A.RL_MEMORY_WHEN], e.attributes[A.RL_MEMORY_STATE]) for e in train.events if e.name == N.RL_MEMORY_SNAPSHOT_EVENT
    ]
    assert snapshots == [("start", "offload"), ("start", "onload"), ("end", "onload"), ("end", "offload")]


def test_the_jaeger_json_otel_rl_writes_is_what_jaegers_api_returns(stack, demo_run: DemoRun):
    """``otel-rl trace --out`` writes Jaeger's own JSON: field by field, what /api/traces/<id> answers."""
    import urllib.request

    expected = find_step_trace(read_spans(demo_run.run_dir), 2)
    ours = to_jaeger_trace(expected)["data"][0]
    url = f"{stack.endpoints['jaeger']}/api/traces/{ours['traceID']}"

    def fetch() -> dict:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback test server
            return json.loads(response.read())["data"][0]

    theirs = poll(fetch, lambda t: len(t["spans"]) == len(ours["spans"]), 60, f"trace {ours['traceID']} in Jaeger")

    def by_span(trace: dict) -> dict[str, dict]:  # process ids are per answer: compare the processes themselves
        return {s["spanID"]: {**s, "processID": trace["processes"][s["processID"]]} for s in trace["spans"]}

    mine, jaegers = by_span(ours), by_span(theirs)
    assert mine.keys() == jaegers.keys()
    host = [t for t in jaegers[next(iter(jaegers))]["processID"]["tags"] if t["key"] == "host.name"]
    for span_id, span in mine.items():
        other = jaegers[span_id]
        assert set(span) == set(other), span["operationName"]
        for field in span:
            if field == "processID" and host and host[0] not in span[field]["tags"]:  # the agent filled in host.name
                span[field]["tags"] = sorted([*span[field]["tags"], host[0]], key=lambda t: t["key"])
            assert span[field] == other[field], (span["operationName"], field)


def test_every_metric_the_demo_emits_is_queryable_with_its_prometheus_name_and_labels(stack, demo_run: DemoRun):
    emitted: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for point in read_metrics(demo_run.run_dir):
        if point.name in METRICS:
            emitted[point.name].add(tuple(sorted(point.attributes)))
    assert len(emitted) >= 30, sorted(emitted)  # the demo emits most of ROLL's families
    run = f'{label(A.RL_RUN_ID)}="{demo_run.run_id}"'
    missing = []
    for name, attribute_sets in sorted(emitted.items()):
        mdef = METRICS[name]
        prom = prometheus_name(name, mdef.unit, mdef.instrument)
        series_name = f"{prom}_bucket" if mdef.instrument == "histogram" else prom
        series = poll(lambda: vm_series(stack, f"{series_name}{{{run}}}"), bool, 60, f"{series_name} for run {demo_run.run_id}")
        label_sets = {frozenset(k for k in s if not k.startswith("__")) for s in series}
        for attributes in attribute_sets:
            wanted = {label(a) for a in attributes}
            if not any(wanted <= labels for labels in label_sets):
                missing.append((series_name, sorted(wanted)))
        if mdef.instrument == "histogram":
            for suffix in ("_sum", "_count"):
                assert vm_series(stack, f"{prom}{suffix}{{{run}}}"), f"{prom}{suffix}"
    assert not missing


def test_stage_durations_work_with_histogram_quantile(stack, demo_run: DemoRun):
    run = f'{label(A.RL_RUN_ID)}="{demo_run.run_id}"'
    prom = prometheus_name("rl.stage.duration", "s", "histogram")
    assert prom == "rl_stage_duration_seconds"
    expr = f'histogram_quantile(0.9, sum by (le, {label(A.RL_STAGE)}) (max_over_time({prom}_bucket{{{run},{label(A.RL_STAGE_PHASE)}="total"}}[1h])))'
    result = poll(lambda: vm_query(stack, expr), lambda r: len(r) >= 7, 60, "p90 of every stage")
    for series in result:
        value = float(series["value"][1])
        assert 0 < value < 600, series


def test_no_series_carries_a_step_or_sample_label(stack, demo_run: DemoRun):
    run = f'{label(A.RL_RUN_ID)}="{demo_run.run_id}"'
    series = poll(lambda: vm_series(stack, f"{{{run}}}"), bool, 60, f"series of run {demo_run.run_id}")
    labels = {k for s in series for k in s}
    assert label(A.RL_STEP) not in labels
    assert not any("sample" in k and k != "rl_sample" for k in labels if not k.startswith("__"))


def test_series_count_stays_flat_as_steps_grow(stack, tmp_path):
    """Twice the steps, the same series: nothing per-step becomes a label."""
    pytest.importorskip("torch")
    import otel_rl
    from otel_rl.demo import run_demo

    tel = otel_rl.init(
        service_name="otel-rl-e2e-flat",
        run_id=f"e2e-flat-{tmp_path.name}",
        endpoint=stack.endpoints["otlp_http"],
        protocol="http/protobuf",
        exporters="otlp",
        metric_export_interval_s=1.0,
        console=False,
    )
    run = f'{label(A.RL_RUN_ID)}="{tel.config.run_id}"'
    try:
        # Steps 1-4, then 5-8: both halves run the same stages (each ends with validation and a
        # checkpoint), so a new series in the second half could only come from the step itself.
        run_demo(steps=4, algo="grpo", telemetry=tel, out=tmp_path / "a", progress=False)
        tel.flush()
        # The last stages of step 4 (validation, the checkpoint's phases) reach the store through the
        # gateway's span-metrics flush and a scrape: wait for them, not only for a quiet spell.
        first = settled_series(stack, run, needs=("rl.validation", "rl.offload"))
        run_demo(steps=4, first_step=5, algo="grpo", telemetry=tel, out=tmp_path / "b", progress=False)
        tel.flush()
    finally:
        tel.shutdown()
    born_later = sorted(settled_series(stack, run, needs=("rl.validation", "rl.offload")) - first)
    assert not born_later, f"{len(born_later)} series first seen in steps 5-8, e.g. {born_later[:3]}"


def settled_series(stack, run: str, quiet_s: float = 20.0, deadline_s: float = 120.0, needs: tuple[str, ...] = ()) -> set[tuple]:
    """The run's series (their sorted labels) once the span metrics of every span name in ``needs``
    are there and the set has not changed for quiet_s: longer than the gateway's span-metrics flush
    (15 s), so that a flush still to come cannot add series later."""
    end = time.monotonic() + deadline_s
    series: set[tuple] = set()
    since = time.monotonic()
    while time.monotonic() < end:
        now = {tuple(sorted(s.items())) for s in vm_series(stack, f"{{{run}}}")}
        if now != series:
            series, since = now, time.monotonic()
        elif len(series) > 20 and time.monotonic() - since >= quiet_s and set(needs) <= _span_names(series):
            return series
        time.sleep(1.0)
    pytest.fail(f"the series of {run} never settled (last count {len(series)}; span names {sorted(_span_names(series))})")


def _span_names(series: set[tuple]) -> set[str]:
    return {value for labels in series for name, value in labels if name == "span_name"}


def test_prometheus_scrapes_the_metrics_from_the_gateway(stack, demo_run: DemoRun):
    """The pull way of gateway.yaml: its prometheus exporter on :8889, scraped with honor_labels."""
    run = f'{label(A.RL_RUN_ID)}="{demo_run.run_id}"'
    prom = prometheus_name("rl.loss", "1", "gauge")

    def query():
        answer = http_json(f"{stack.endpoints['prometheus']}/api/v1/query", {"query": f"{prom}{{{run}}}"})
        return answer["data"]["result"]

    result = poll(
        query,
        lambda r: {s["metric"].get(label(A.RL_LOSS_TYPE)) for s in r} >= {"policy", "kl", "total", "value"},
        60,
        f"{prom} in Prometheus",
    )
    assert {s["metric"][label(A.RL_LOSS_TYPE)] for s in result} >= {"policy", "kl", "total", "value"}
