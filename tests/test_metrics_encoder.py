"""The spool's metric encoder must make the request the SDK's ``encode_metrics`` makes, for what a
real run exports and for attribute values and metric kinds it leaves to the SDK."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.resources import Resource

import otel_rl
from otel_rl._sdk.otlp.metrics_encoder import MetricsEncoder
from otel_rl.exporters.otlp_json import OtlpJsonMetricExporter


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
    encoder = MetricsEncoder()
    ours = encoder.encode(data)
    assert ours == encode_metrics(data)
    assert len(ours.SerializeToString()) > 10_000  # a real export: hundreds of series
    assert encoder.encode(data) == ours  # again, from the attribute sets it keeps


def _sdk_data(resource: dict[str, Any], attributes: dict[str, Any]) -> MetricsData:
    reader = InMemoryMetricReader()
    meter = MeterProvider(resource=Resource.create(resource), metric_readers=[reader]).get_meter("m", "1.0")
    meter.create_counter("c").add(2, attributes)
    meter.create_up_down_counter("u").add(-3, {"k": "v"})
    meter.create_histogram("h").record(0.3, {"k": "v"})
    meter.create_gauge("g").set(1.5)
    data = reader.get_metrics_data()
    assert data is not None
    return data


def test_every_attribute_type_it_encodes_comes_out_as_the_sdks() -> None:
    data = _sdk_data({"rl.rank": 3, "on": False}, {"ok": True, "n": 1, "x": 0.5, "s": "t"})
    assert MetricsEncoder().encode(data) == encode_metrics(data)


def test_values_it_leaves_to_the_sdk_encode_as_the_sdk_encodes_them() -> None:
    data = _sdk_data({"tags": ("a", "b")}, {"list": ("p", "q")})  # arrays: the SDK's encoder, whole
    assert MetricsEncoder().encode(data) == encode_metrics(data)


def test_true_and_1_under_one_key_stay_a_bool_and_an_int() -> None:
    """Attribute sets are kept by their items, where True == 1: the types tell them apart."""
    encoder = MetricsEncoder()
    for attributes in ({"flag": True}, {"flag": 1}, {"flag": 1.0}, {"flag": True}):
        data = _sdk_data({"rl.rank": 0}, attributes)
        assert encoder.encode(data) == encode_metrics(data), attributes
