"""The spool's metric encoder must write the bytes of the request the SDK's ``encode_metrics``
makes, for what a real run exports and for attribute values and metric kinds it leaves to the SDK."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.resources import Resource

import otel_rl
from otel_rl._sdk.otlp import metrics_encoder
from otel_rl._sdk.otlp.metrics_encoder import MetricsEncoder
from otel_rl.exporters.otlp_json import OtlpJsonMetricExporter
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M


def sdk_bytes(data: MetricsData) -> bytes:
    return encode_metrics(data).SerializeToString()


def _run_export(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> MetricsData:
    """What a run's metric export hands its exporter: 250 ROLL keys, stages, a histogram, otel-rl's own counters."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_hotpath import step_values  # 250 keys as ROLL logs them

    captured: list[MetricsData] = []
    write = OtlpJsonMetricExporter.export  # the run folder's exporter: it gets what the spool would
    monkeypatch.setattr(OtlpJsonMetricExporter, "export", lambda self, data, **kw: captured.append(data) or write(self, data, **kw))
    tel = otel_rl.init(service_name="enc", run_dir=str(tmp_path), console=False, framework="roll", metric_export_interval_s=3600)
    try:
        for step in range(3):
            with tel.step(step):
                with tel.stage("generate", cluster="actor_infer"):
                    pass
                tel.log({**step_values(250), "rollout/flag": True, "rollout/count": 7})
        tel.record(otel_rl.semconv.metrics.RL_SAMPLE_REWARD, [0.1, 0.5, 0.9])
        tel.flush()
    finally:
        tel.shutdown()
    assert captured
    return captured[-1]


def test_a_runs_export_encodes_as_the_sdk_encodes_it(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _run_export(tmp_path, monkeypatch)
    expected = sdk_bytes(data)
    monkeypatch.setattr(metrics_encoder, "sdk_encode_metrics", lambda _: pytest.fail("took the SDK's encoder"))
    encoder = MetricsEncoder()
    ours = encoder.encode(data)
    assert ours == expected
    assert len(ours) > 10_000  # a real export: hundreds of series
    assert encoder.encode(data) == ours  # again, from the attribute sets it keeps


def _sdk_data(resource: dict[str, Any], attributes: dict[str, Any]) -> MetricsData:
    reader = InMemoryMetricReader()
    meter = MeterProvider(resource=Resource.create(resource), metric_readers=[reader]).get_meter("m", "1.0")
    meter.create_counter("c").add(2, attributes)
    meter.create_up_down_counter("u").add(-3, {"k": "v"})
    meter.create_histogram("h").record(0.3, {"k": "v"})
    meter.create_gauge("g").set(1.5)
    meter.create_counter("f", unit="s", description="seconds").add(0.25)
    data = reader.get_metrics_data()
    assert data is not None
    return data


ATTRIBUTE_CASES = [
    ({A.RL_RANK: 3, "on": False}, {"ok": True, "n": 1, "x": 0.5, "s": "t", "neg": -7, "big": 2**62}),
    ({"tags": ("a", "b")}, {"list": ("p", "q"), "ints": (1, -2), "empty": ()}),
    ({"service.name": "é ünïcode"}, {"k": "ü" * 200}),
]


@pytest.mark.parametrize(("resource", "attributes"), ATTRIBUTE_CASES)
def test_every_attribute_type_and_metric_kind_comes_out_as_the_sdks(resource, attributes, monkeypatch) -> None:
    data = _sdk_data(resource, attributes)
    expected = sdk_bytes(data)
    monkeypatch.setattr(metrics_encoder, "sdk_encode_metrics", lambda _: pytest.fail("took the SDK's encoder"))
    assert MetricsEncoder().encode(data) == expected


def test_what_it_leaves_to_the_sdk_encodes_as_the_sdk_encodes_it() -> None:
    from opentelemetry.sdk.metrics.export import Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    point = NumberDataPoint(attributes={"nested": {"a": 1}}, start_time_unix_nano=0, time_unix_nano=1, value=0.5)  # a kvlist value
    metric = Metric(name=M.RL_REWARD, description="", unit="1", data=Gauge(data_points=[point]))
    scope = ScopeMetrics(scope=InstrumentationScope("otel_rl"), metrics=[metric], schema_url="")
    data = MetricsData(resource_metrics=[ResourceMetrics(resource=Resource({}), scope_metrics=[scope], schema_url="")])
    assert MetricsEncoder().encode(data) == sdk_bytes(data)


def test_true_and_1_under_one_key_stay_a_bool_and_an_int() -> None:
    """Attribute sets are kept by their items, where True == 1: the types tell them apart."""
    encoder = MetricsEncoder()
    for attributes in ({"flag": True}, {"flag": 1}, {"flag": 1.0}, {"flag": True}):
        data = _sdk_data({A.RL_RANK: 0}, attributes)
        assert encoder.encode(data) == sdk_bytes(data), attributes
