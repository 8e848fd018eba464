"""The registry's gauges and counters, exported from the latest values without SDK instruments, must
be what the SDK's observable instruments reading the same values export: names, kinds, temporality,
attributes and values; deltas for an exporter that prefers them."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider, ObservableCounter, ObservableUpDownCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, InMemoryMetricReader, Metric, Sum

from otel_rl._sdk.pipeline.aggregation import LatestValues
from otel_rl._sdk.pipeline.direct_metrics import DirectMetrics

DECLARED = {  # metric -> instrument
    "rl.reward.mean": "gauge",
    "rl.tokens.total": "counter",
    "rl.queue.depth": "updowncounter",
}


def _latest() -> LatestValues:
    latest = LatestValues()
    latest.set("rl.reward.mean", (("rl.model.role", "actor"),), 0.25)
    latest.set("rl.reward.mean", (("rl.model.role", "critic"),), -1.5)
    latest.add("rl.tokens.total", (), 100.0)
    latest.add("rl.queue.depth", (("rl.cluster", "rollout"),), 3.0)
    return latest


def _shape(metrics: list[Metric]) -> dict[str, Any]:
    out = {}
    for metric in metrics:
        data = metric.data
        kind = "gauge" if isinstance(data, Gauge) else ("sum", data.aggregation_temporality, data.is_monotonic)
        points = sorted((tuple(sorted(p.attributes.items())), p.value, p.start_time_unix_nano is None) for p in data.data_points)
        out[metric.name] = (kind, metric.unit, metric.description, points)
    return out


def _sdk_export(latest: LatestValues, temporality: dict[type, AggregationTemporality] | None = None) -> InMemoryMetricReader:
    reader = InMemoryMetricReader(preferred_temporality=temporality or {})
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    create = {
        "gauge": meter.create_observable_gauge,
        "counter": meter.create_observable_counter,
        "updowncounter": meter.create_observable_up_down_counter,
    }
    for name, instrument in DECLARED.items():
        create[instrument](name, callbacks=[latest.callback(name)], unit="1", description=f"about {name}")
    return reader


def _direct(latest: LatestValues) -> DirectMetrics:
    direct = DirectMetrics(latest)
    for name, instrument in DECLARED.items():
        direct.declare(name, instrument, f"about {name}", "1")
    return direct


def _sdk_metrics(reader: InMemoryMetricReader) -> list[Metric]:
    data = reader.get_metrics_data()
    assert data is not None
    return list(data.resource_metrics[0].scope_metrics[0].metrics)


def test_cumulative_export_is_what_the_sdks_observable_instruments_export() -> None:
    latest = _latest()
    ours = _direct(latest).to_metrics(None)
    assert _shape(ours) == _shape(_sdk_metrics(_sdk_export(latest)))
    counter = next(m for m in ours if m.name == "rl.tokens.total")
    assert counter.data.data_points[0].start_time_unix_nano > 0  # a cumulative sum says since when


def test_a_metric_with_no_series_is_left_out() -> None:
    latest = LatestValues()
    latest.set("rl.reward.mean", (), 1.0)
    assert [m.name for m in _direct(latest).to_metrics(None)] == ["rl.reward.mean"]


def test_an_exporter_preferring_deltas_gets_what_came_since_its_last_export() -> None:
    delta = {ObservableCounter: AggregationTemporality.DELTA, ObservableUpDownCounter: AggregationTemporality.DELTA}
    latest = _latest()
    direct = _direct(latest)
    state = direct.new_delta_state()
    reader = _sdk_export(latest, delta)
    rounds = []
    for added in (0.0, 40.0, 0.0):
        latest.add("rl.tokens.total", (), added)
        latest.add("rl.queue.depth", (("rl.cluster", "rollout"),), -added / 40)
        ours, sdk = direct.to_metrics(delta, state), _sdk_metrics(reader)
        assert _shape(ours) == _shape(sdk)
        rounds.append(next(m for m in ours if m.name == "rl.tokens.total").data.data_points[0].value)
    assert rounds == [100.0, 40.0, 0.0]
    sums = [m.data for m in ours if isinstance(m.data, Sum)]
    assert all(s.aggregation_temporality == AggregationTemporality.DELTA for s in sums)
