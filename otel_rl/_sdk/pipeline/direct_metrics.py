"""The registry's gauges and counters exported straight from the latest values, without SDK instruments.

An observable SDK instrument per registry metric costs each export a callback, a ``Measurement``
(its attributes cleaned again) and a view-match aggregation per series: ~70% of a run's metric
export, which at one step a second and a 10 s interval was 1.4 ms of CPU per step. The values
are already held once per series (``LatestValues``), so each export builds its data points from
them directly, as the SDK would: gauges without a start time, counters and up-down counters as
cumulative sums from the telemetry's start, or as deltas for an exporter that prefers them for
observable counters (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta``).

The probes' metrics (process memory and CPU, GPU through NVML) are read at each export too: their
callbacks' observations are stored as the latest values of their series just before the points
are built, without the SDK's measurement and aggregation per series (a third of an export for ~30
series). A probe's reading replaces a logged value of the same series; the SDK's up-down counters
added the two.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import ObservableCounter, ObservableUpDownCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, Metric, NumberDataPoint, Sum

from otel_rl._sdk.pipeline.aggregation import LatestValues

logger = logging.getLogger("otel_rl")
_SUM_KINDS = {"counter": ObservableCounter, "updowncounter": ObservableUpDownCounter}
Probe = Callable[[CallbackOptions], Iterable[Observation]]


class DeltaState:
    """One exporter's last export of the delta sums: when, and each series' cumulative value then."""

    def __init__(self, start_ns: int) -> None:
        self.last_ns = start_ns
        self.values: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}


class DirectMetrics:
    """The metrics of ``latest`` declared here, as SDK ``Metric`` objects at each export."""

    def __init__(self, latest: LatestValues) -> None:
        self.latest = latest
        self.start_ns = time.time_ns()
        self._declared: dict[str, tuple[str, str, str]] = {}  # metric -> (instrument, description, unit)
        self._probes: list[tuple[str, Probe]] = []
        self._failed_probes: set[str] = set()

    def declare(self, metric: str, instrument: str, description: str, unit: str, probe: Probe | None = None) -> None:
        """A registry metric read from the latest values; ``probe``: a callback read at each export too."""
        self._declared[metric] = (instrument, description, unit)
        if probe is not None:
            self._probes.append((metric, probe))

    def _read_probes(self) -> None:
        latest = self.latest
        for metric, probe in self._probes:
            try:
                for observation in probe(CallbackOptions()):
                    attributes = observation.attributes
                    latest.set(metric, tuple(sorted(attributes.items())) if attributes else (), observation.value)
            except Exception as exc:  # a probe that fails is skipped this export, said once
                if metric not in self._failed_probes:
                    self._failed_probes.add(metric)
                    logger.warning("otel-rl: reading %s failed (%r); its series keep their last value", metric, exc)

    def new_delta_state(self) -> DeltaState:
        return DeltaState(self.start_ns)

    def to_metrics(self, temporality: dict[type, AggregationTemporality] | None, delta: DeltaState | None = None) -> list[Metric]:
        """Every declared metric with a series; sums as deltas where ``temporality`` asks for them
        (``delta``: the exporter's own state, kept between its exports)."""
        latest = self.latest
        if self._probes:
            self._read_probes()
        latest.settle()
        now = time.time_ns()
        out: list[Metric] = []
        for metric, (instrument, description, unit) in list(self._declared.items()):
            series = latest.series(metric)
            if not series:
                continue
            slots = list(series.values())
            if instrument == "gauge":
                data: Any = Gauge(data_points=[NumberDataPoint(slot[1], None, now, slot[0]) for slot in slots])  # pyright: ignore[reportArgumentType]
            elif delta is not None and temporality and temporality.get(_SUM_KINDS[instrument]) == AggregationTemporality.DELTA:
                points = []
                for slot in slots:
                    key = (metric, tuple(slot[1].items()))
                    points.append(NumberDataPoint(slot[1], delta.last_ns, now, slot[0] - delta.values.get(key, 0.0)))
                    delta.values[key] = slot[0]
                data = Sum(points, AggregationTemporality.DELTA, instrument == "counter")
            else:
                points = [NumberDataPoint(slot[1], self.start_ns, now, slot[0]) for slot in slots]
                data = Sum(points, AggregationTemporality.CUMULATIVE, instrument == "counter")
            out.append(Metric(name=metric, description=description, unit=unit, data=data))
        if delta is not None:
            delta.last_ns = now
        return out
