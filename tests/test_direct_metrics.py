"""The registry's gauges and counters, exported from the latest values without SDK instruments, must
be what the SDK's observable instruments reading the same values export: names, kinds, temporality,
attributes and values; deltas for an exporter that prefers them."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider, ObservableCounter, ObservableUpDownCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, InMemoryMetricReader, Metric, Sum

from otel_rl._sdk.pipeline.aggregation import LatestValues
from otel_rl._sdk.pipeline.direct_metrics import DirectMetrics
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

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


def _sdk_export(
    latest: LatestValues, temporality: dict[type, AggregationTemporality] | None = None, probes: dict[str, Any] | None = None
) -> InMemoryMetricReader:
    reader = InMemoryMetricReader(preferred_temporality=temporality or {})
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    create = {
        "gauge": meter.create_observable_gauge,
        "counter": meter.create_observable_counter,
        "updowncounter": meter.create_observable_up_down_counter,
    }
    for name, instrument in DECLARED.items():
        probe = (probes or {}).get(name)
        callbacks = [latest.callback(name)] + ([probe] if probe else [])
        create[instrument](name, callbacks=callbacks, unit="1", description=f"about {name}")
    return reader


def _direct(latest: LatestValues, probes: dict[str, Any] | None = None) -> DirectMetrics:
    direct = DirectMetrics(latest)
    for name, instrument in DECLARED.items():
        direct.declare(name, instrument, f"about {name}", "1", (probes or {}).get(name))
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


class _Readings:
    """A probe as the process and NVML probes are: a callback read at each export, its reading new each time."""

    def __init__(self, *attributes: dict[str, str]) -> None:
        self.reads = 0
        self.attributes = attributes

    def __call__(self, _options):
        self.reads += 1
        return [Observation(10.0 * self.reads + i, attrs) for i, attrs in enumerate(self.attributes)]


def test_a_probed_metric_exports_what_the_sdks_instrument_with_the_probe_exported() -> None:
    def probes() -> dict[str, Any]:
        return {M.RL_QUEUE_DEPTH: _Readings({A.RL_CLUSTER: "train"}, {A.RL_CLUSTER: "eval"}), "rl.reward.mean": _Readings({})}

    sdk_latest, our_latest = _latest(), _latest()
    reader, direct = _sdk_export(sdk_latest, probes=probes()), _direct(our_latest, probes())
    for _ in range(2):  # each export reads the probes again
        assert _shape(direct.to_metrics(None)) == _shape(_sdk_metrics(reader))
    depth = our_latest.series(M.RL_QUEUE_DEPTH)
    assert {attrs: slot[0] for attrs, slot in depth.items()} == {
        ((A.RL_CLUSTER, "rollout"),): 3.0,  # logged
        ((A.RL_CLUSTER, "train"),): 20.0,  # the probe's second reading
        ((A.RL_CLUSTER, "eval"),): 21.0,
    }


def test_a_probes_reading_replaces_a_logged_value_of_the_same_series() -> None:
    # (The SDK's up-down counter added the two observations of one series in a collection: a double count.)
    latest = _latest()
    direct = _direct(latest, {M.RL_QUEUE_DEPTH: _Readings({A.RL_CLUSTER: "rollout"})})
    depth = next(m for m in direct.to_metrics(None) if m.name == M.RL_QUEUE_DEPTH)
    assert [(dict(p.attributes), p.value) for p in depth.data.data_points] == [({A.RL_CLUSTER: "rollout"}, 10.0)]


def test_a_failing_probe_is_said_once_and_the_rest_is_exported(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")

    def broken(_options):
        raise OSError("/proc is gone")

    latest = _latest()
    direct = _direct(latest, {"rl.reward.mean": broken, M.RL_QUEUE_DEPTH: _Readings({A.RL_CLUSTER: "rollout"})})
    for _ in range(3):
        names = {m.name for m in direct.to_metrics(None)}
    assert names == set(DECLARED)  # the broken probe's metric keeps its logged series
    said = [r.getMessage() for r in caplog.records if "rl.reward.mean" in r.getMessage()]
    assert len(said) == 1 and "/proc is gone" in said[0]
    assert latest.get(M.RL_QUEUE_DEPTH, ((A.RL_CLUSTER, "rollout"),)) == 10.0 * 3


def test_a_probes_whole_number_stays_an_int_as_the_sdk_exported_it() -> None:
    def rss(_options):
        return [Observation(75_227_136)]  # bytes, as psutil reads them

    latest = LatestValues()
    ours = _direct(latest, {M.RL_QUEUE_DEPTH: rss}).to_metrics(None)
    sdk = _sdk_metrics(_sdk_export(LatestValues(), probes={M.RL_QUEUE_DEPTH: rss}))
    assert [type(m.data.data_points[0].value) for m in ours] == [type(m.data.data_points[0].value) for m in sdk] == [int]
