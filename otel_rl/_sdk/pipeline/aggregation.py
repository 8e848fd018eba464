"""Where values wait for export: latest values read by observable instruments, and bulk histograms.

The OTel SDK records histogram values one call at a time (~2 us each), so a 4096-value reward
distribution would cost ~8 ms per step. ``BulkHistograms`` bins whole arrays with numpy
(searchsorted + bincount) into the same explicit-bucket, cumulative data points the SDK would
produce, and ``MergingMetricExporter`` adds them to every metric export.
"""

from __future__ import annotations

import bisect
import math
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_rl._sdk.pipeline.series_budget import SeriesBudget

Attrs = tuple[tuple[str, Any], ...]

DEFAULT_SERIES_LIMIT = 2000
DEFAULT_ATTRIBUTE_VALUE_LIMIT = 1024


class SeriesGuard:
    """Caps what one process can put into metric series: at most ``series_limit`` attribute sets
    per metric (a templated key or record() attributes carrying a step, a sample id or a file name
    would otherwise grow the series without bound), and string attribute values at
    ``attribute_value_limit`` characters. Values of series past the cap are dropped and
    ``on_overflow(metric, values)`` counts them; checks run only when a series is created."""

    def __init__(
        self,
        series_limit: int = DEFAULT_SERIES_LIMIT,
        attribute_value_limit: int = DEFAULT_ATTRIBUTE_VALUE_LIMIT,
        on_overflow: Callable[[str, int], None] | None = None,
        exempt: Iterable[str] = (),
    ) -> None:
        self.series_limit = series_limit
        self.attribute_value_limit = attribute_value_limit
        self.on_overflow = on_overflow
        self.exempt = frozenset(exempt)  # otel-rl's own counters, which must never be refused

    def admits(self, metric: str, existing: int, values: int = 1) -> bool:
        if self.series_limit and existing >= self.series_limit and metric not in self.exempt:
            if self.on_overflow is not None:
                self.on_overflow(metric, values)
            return False
        return True

    def attributes(self, attrs: Attrs) -> dict[str, Any]:
        limit = self.attribute_value_limit
        if not limit:
            return dict(attrs)
        return {k: (v[:limit] if isinstance(v, str) and len(v) > limit else v) for k, v in attrs}


_NO_GUARD = SeriesGuard(0, 0)


class SlotRow:
    """The latest-value slots of one step plan (a key set), in key order, and the linear
    conversions of its keys (``scaled``: index, factor): where a whole step's values go."""

    __slots__ = ("slots", "scaled", "covers", "unpack")

    def __init__(self, slots: list[list[Any]], scaled: list[tuple[int, float]], covers: frozenset[tuple[str, Attrs]]) -> None:
        self.slots = slots
        self.scaled = scaled
        self.covers = covers  # the (metric, attributes) series whose slots these are
        self.unpack = struct.Struct(f"<{len(slots)}d").unpack

    def converted(self, values: Sequence[float] | bytes) -> Sequence[float]:
        """The values (or the doubles packed in key order) as the metrics take them (after each key's conversion)."""
        if type(values) is bytes:
            values = self.unpack(values)
        if not self.scaled:
            return values
        out = list(values)
        for index, factor in self.scaled:
            out[index] *= factor
        return out

    def store(self, values: Sequence[float] | bytes) -> None:
        for slot, value in zip(self.slots, self.converted(values)):
            slot[0] = value


class LatestValues:
    """Latest value per (metric, attribute set), read by observable instruments at collection time.

    Writers are the telemetry worker thread (and, for otel-rl's own counters, the exporters'
    threads); the reader is the SDK's metric reader thread. Each per-metric dict is only ever
    assigned to (never resized while iterated: readers copy first).

    A step of a known key set is stored with :meth:`defer`: its values wait, one list per key set,
    until something reads a slot (a collection, :meth:`get`) or writes one of its series, so a
    step costs a reference instead of a write per key; a collection every few seconds stores the
    latest step of each key set once.
    """

    def __init__(self, guard: SeriesGuard | None = None) -> None:
        self._series: dict[str, dict[Attrs, list[Any]]] = {}
        self.guard = guard or _NO_GUARD
        self._deferred: dict[SlotRow, Sequence[float] | bytes] = {}  # in the order the steps came (latest last)
        self._deferred_lock = threading.Lock()

    def series(self, metric: str) -> dict[Attrs, list[Any]]:
        found = self._series.get(metric)
        if found is None:
            found = self._series.setdefault(metric, {})
        return found

    def defer(self, row: SlotRow, values: Sequence[float] | bytes) -> None:
        """Store ``values`` (as logged, in the row's key order; or those doubles packed) into the row's slots when next read."""
        with self._deferred_lock:
            deferred = self._deferred
            deferred.pop(row, None)  # to the end: a later key set sharing a series must win
            deferred[row] = values

    def settle(self) -> None:
        """Store every deferred step into its slots (in step order)."""
        if self._deferred:
            with self._deferred_lock:
                for row, values in self._deferred.items():
                    row.store(values)
                self._deferred.clear()

    def _settle_if_deferred(self, metric: str, attrs: Attrs) -> None:
        series = (metric, attrs)
        if any(series in row.covers for row in list(self._deferred)):
            self.settle()  # a deferred step holds an older value of this series: store it first

    def set(self, metric: str, attrs: Attrs, value: float) -> None:
        if self._deferred:
            self._settle_if_deferred(metric, attrs)
        series = self.series(metric)
        slot = series.get(attrs)
        if slot is None:
            if self.guard.admits(metric, len(series)):
                series[attrs] = [value, self.guard.attributes(attrs)]
        else:
            slot[0] = value

    def add(self, metric: str, attrs: Attrs, amount: float) -> None:
        if self._deferred:
            self._settle_if_deferred(metric, attrs)
        series = self.series(metric)
        slot = series.get(attrs)
        if slot is None:
            if self.guard.admits(metric, len(series)):
                series[attrs] = [amount, self.guard.attributes(attrs)]
        else:
            slot[0] += amount

    def get(self, metric: str, attrs: Attrs = ()) -> float | None:
        self.settle()
        slot = self._series.get(metric, {}).get(attrs)
        return None if slot is None else slot[0]

    def metrics(self) -> list[str]:
        return list(self._series)

    def callback(self, metric: str):
        """An observable-instrument callback yielding every series of ``metric``."""
        series = self.series(metric)

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            self.settle()
            return [Observation(slot[0], slot[1]) for slot in list(series.values())]

        return observe


class _HistogramState:
    __slots__ = ("bounds", "counts", "count", "total", "min", "max", "attributes")

    def __init__(self, bounds: tuple[float, ...], attributes: dict[str, Any]) -> None:
        self.bounds = bounds
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.attributes = attributes


def _add(state: _HistogramState, value: float) -> None:
    state.counts[bisect.bisect_left(state.bounds, value)] += 1
    state.count += 1
    state.total += value
    if value < state.min:
        state.min = value
    if value > state.max:
        state.max = value


class HistogramRows:
    """Rows of one value per histogram state, binned in bulk when the histograms are read or the
    rows reach ``limit``: a step's timers cost one ``struct`` pack and a list append instead of a
    bisect and five updates each, and a whole batch of rows is binned by a few numpy calls over
    the table (states sharing their bounds in one ``searchsorted``). NaN marks a state with no
    value in that row. Histograms are order-free (counts, sum, min, max), so binning later gives
    the same points."""

    __slots__ = ("states", "factors", "pending", "lock", "owner_lock", "limit", "packer", "bounds")

    def __init__(
        self, states: tuple[_HistogramState, ...], owner_lock: Any, limit: int = 512, factors: Sequence[float] | None = None
    ) -> None:
        self.states = states
        # Each column's conversion (a timer's ms -> s), applied when binned: rows hold values as logged.
        self.factors = None if factors is None or all(f == 1.0 for f in factors) else np.array(factors, dtype=np.float64)
        self.pending: list[bytes] = []
        self.lock = threading.Lock()
        self.owner_lock = owner_lock  # the lock every other update of these states holds
        self.limit = limit
        self.packer = struct.Struct(f"<{len(states)}d")
        # The bounds every state has (a step's timers all use the stage-duration buckets), else None.
        shared = {state.bounds for state in states}
        self.bounds = np.array(next(iter(shared)), dtype=np.float64) if len(shared) == 1 else None

    def add(self, row: Sequence[float]) -> None:
        packed = self.packer.pack(*row)
        with self.lock:
            self.pending.append(packed)
            if len(self.pending) < self.limit:
                return
        with self.owner_lock:
            self.fold_locked()

    def fold_locked(self) -> None:
        """Bin the pending rows (the caller holds ``owner_lock``)."""
        with self.lock:
            pending, self.pending = self.pending, []
        if not pending or not self.states:
            return
        table = np.frombuffer(b"".join(pending), dtype="<f8").reshape(len(pending), len(self.states))
        if self.factors is not None:
            table = table * self.factors
        present = ~np.isnan(table)
        if self.bounds is not None and present.all():  # every row full: the whole table at once
            buckets = len(self.bounds) + 1
            # Explicit buckets are (b[i-1], b[i]]: side="left" puts a value equal to a bound below it.
            index = np.searchsorted(self.bounds, table, side="left") + np.arange(len(self.states)) * buckets
            counts = np.bincount(index.ravel(), minlength=buckets * len(self.states)).reshape(len(self.states), buckets)
            totals, lows, highs = table.sum(axis=0).tolist(), table.min(axis=0).tolist(), table.max(axis=0).tolist()
            for state, binned, total, low, high in zip(self.states, counts, totals, lows, highs):
                state.counts += binned
                state.count += len(pending)
                state.total += total
                state.min = min(state.min, low)
                state.max = max(state.max, high)
            return
        for column, keep, state in zip(table.T, present.T, self.states):
            values = column[keep]
            if values.size:
                state.counts += np.bincount(np.searchsorted(state.bounds, values, side="left"), minlength=len(state.counts))
                state.count += int(values.size)
                state.total += float(values.sum())
                state.min = min(state.min, float(values.min()))
                state.max = max(state.max, float(values.max()))


class BulkHistograms:
    """Cumulative explicit-bucket histograms fed with whole arrays or single values."""

    def __init__(self, guard: SeriesGuard | None = None) -> None:
        self.guard = guard or _NO_GUARD
        self._lock = threading.Lock()
        self._states: dict[str, dict[Attrs, _HistogramState]] = {}
        self._meta: dict[str, tuple[str, str, tuple[float, ...]]] = {}
        self._start_ns = time.time_ns()
        self._row_sinks: list[HistogramRows] = []

    def declare(self, name: str, description: str, unit: str, bounds: Sequence[float]) -> None:
        self._meta[name] = (description, unit, tuple(float(b) for b in bounds))

    def _state(self, name: str, attrs: Attrs, values: int = 1) -> _HistogramState | None:
        per_metric = self._states.setdefault(name, {})
        state = per_metric.get(attrs)
        if state is None:
            if not self.guard.admits(name, len(per_metric), values):
                return None
            state = per_metric[attrs] = _HistogramState(self._meta[name][2], self.guard.attributes(attrs))
        return state

    def record(self, name: str, value: float, attrs: Attrs = ()) -> None:
        """Record one value (no numpy call: a single bisect is cheaper)."""
        with self._lock:
            state = self._state(name, attrs)
            if state is not None:
                _add(state, value)

    def series_state(self, name: str, attrs: Attrs = ()) -> _HistogramState | None:
        """The state of one existing series (None before its first value, or when the series cap
        refused it), for :meth:`rows`."""
        with self._lock:
            return self._states.get(name, {}).get(attrs)

    def rows(self, states: Sequence[_HistogramState], factors: Sequence[float] | None = None) -> HistogramRows:
        """A sink for rows of one value per state (a step's timers, in ``states`` order), each
        value multiplied by its column's factor when binned."""
        rows = HistogramRows(tuple(states), self._lock, factors=factors)
        with self._lock:
            self._row_sinks.append(rows)
            if len(self._row_sinks) > 64:  # sinks of forgotten step plans: bin what they hold, let them go
                for old in self._row_sinks[:-64]:
                    old.fold_locked()
                del self._row_sinks[:-64]
        return rows

    def _fold_rows(self) -> None:
        for rows in self._row_sinks:
            rows.fold_locked()

    def record_many(self, name: str, values: np.ndarray, attrs: Attrs = ()) -> None:
        """Record a whole 1-D float array of finite values at once."""
        if values.size == 0:
            return
        bounds = self._meta[name][2]
        # Explicit buckets are (b[i-1], b[i]]: side="left" puts a value equal to a bound below it.
        binned = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds) + 1)
        vmin, vmax, vsum = float(values.min()), float(values.max()), float(values.sum())
        with self._lock:
            state = self._state(name, attrs, int(values.size))
            if state is None:
                return
            state.counts += binned
            state.count += int(values.size)
            state.total += vsum
            state.min = min(state.min, vmin)
            state.max = max(state.max, vmax)

    def snapshot(self, name: str, attrs: Attrs = ()) -> tuple[int, float, list[int]] | None:
        with self._lock:
            self._fold_rows()
            state = self._states.get(name, {}).get(attrs)
            return None if state is None else (state.count, state.total, state.counts.tolist())

    def to_metrics(self) -> list[Metric]:
        now = time.time_ns()
        out = []
        with self._lock:
            self._fold_rows()
            for name, per_metric in self._states.items():
                description, unit, bounds = self._meta[name]
                points = [
                    HistogramDataPoint(
                        attributes=s.attributes,
                        start_time_unix_nano=self._start_ns,
                        time_unix_nano=now,
                        count=s.count,
                        sum=s.total,
                        bucket_counts=s.counts.tolist(),
                        explicit_bounds=bounds,  # the declared tuple: its encoding is kept across exports
                        min=s.min,
                        max=s.max,
                    )
                    for s in per_metric.values()
                    if s.count
                ]
                if points:
                    out.append(
                        Metric(
                            name=name,
                            description=description,
                            unit=unit,
                            data=Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE),
                        )
                    )
        return out


class StampedPoints:
    """log() values as data points stamped with the log's own time (``metrics_at_log_time``).

    The SDK stamps every point with its collection time, so an old log replayed in seconds would
    land at replay time, one point per export. Here each logged value is kept as its own point at
    the ``time_ns`` given to log(): gauges as logged, counters as cumulative sums with the value
    logged, histograms cumulative from the series' first point. Each exporter (``register()``)
    takes the points gathered since its last export, in order.
    """

    def __init__(self, instruments: dict[str, tuple[str, str, str, tuple[float, ...]]], guard: SeriesGuard | None = None) -> None:
        self._instruments = instruments  # metric -> (instrument, description, unit, histogram bounds)
        self.guard = guard or _NO_GUARD
        self._lock = threading.Lock()
        self._series: dict[str, dict[Attrs, list[Any]]] = {}  # -> [attributes, first time, histogram state, instrument]
        self._pending: list[list[tuple[str, list[Any], int, Any]]] = []  # per exporter: (metric, series, time, value)

    def register(self) -> int:
        with self._lock:
            self._pending.append([])
            return len(self._pending) - 1

    def add(self, time_ns: int, points: Iterable[tuple[str, Attrs, float]]) -> None:
        with self._lock:
            batch = []
            for metric, attrs, value in points:
                per_metric = self._series.setdefault(metric, {})
                series = per_metric.get(attrs)
                if series is None:
                    if not self.guard.admits(metric, len(per_metric)):
                        continue
                    instrument, _, _, bounds = self._instruments[metric]
                    state = _HistogramState(bounds, {}) if instrument == "histogram" else None
                    series = per_metric[attrs] = [self.guard.attributes(attrs), time_ns, state, instrument]
                state = series[2]
                if state is not None:
                    state.counts[bisect.bisect_left(state.bounds, value)] += 1
                    state.count += 1
                    state.total += value
                    state.min = min(state.min, value)
                    state.max = max(state.max, value)
                    value = (state.count, state.total, state.counts.tolist(), state.min, state.max)
                batch.append((metric, series, time_ns, value))
            for pending in self._pending:
                pending.extend(batch)

    def take(self, consumer: int) -> list[Metric]:
        """The points gathered since ``consumer`` last took them, as SDK metrics."""
        with self._lock:
            batch, self._pending[consumer] = self._pending[consumer], []
        points: dict[str, list[Any]] = {}
        for metric, (attributes, start_ns, state, instrument), time_ns, value in batch:
            if state is not None:
                count, total, counts, vmin, vmax = value
                point: Any = HistogramDataPoint(
                    attributes=attributes,
                    start_time_unix_nano=start_ns,
                    time_unix_nano=time_ns,
                    count=count,
                    sum=total,
                    bucket_counts=counts,
                    explicit_bounds=state.bounds,
                    min=vmin,
                    max=vmax,
                )
            else:
                point = NumberDataPoint(
                    attributes=attributes,  # a gauge point has no start time (as the SDK writes it)
                    start_time_unix_nano=None if instrument == "gauge" else start_ns,  # pyright: ignore[reportArgumentType]
                    time_unix_nano=time_ns,
                    value=value,
                )
            found = points.get(metric)
            if found is None:
                found = points[metric] = []
            found.append(point)
        out = []
        for metric, data_points in points.items():
            instrument, description, unit, _ = self._instruments[metric]
            if instrument == "gauge":
                data: Any = Gauge(data_points=data_points)
            elif instrument == "histogram":
                data = Histogram(data_points=data_points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
            else:
                data = Sum(
                    data_points=data_points, aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=instrument == "counter"
                )
            out.append(Metric(name=metric, description=description, unit=unit, data=data))
        return out


class MergingMetricExporter(MetricExporter):
    """Wraps a metric exporter and adds the bulk histograms to each export, under otel-rl's scope;
    ``budget`` then keeps what this rank sends a metrics store (series_budget.py)."""

    def __init__(
        self,
        inner: MetricExporter,
        histograms: BulkHistograms,
        resource: Resource,
        scope: InstrumentationScope,
        stamped: StampedPoints | None = None,
        budget: SeriesBudget | None = None,
        direct: Any = None,
    ) -> None:
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self._inner = inner
        self._histograms = histograms
        self._resource = resource
        self._scope = scope
        self._stamped = stamped
        self._consumer = stamped.register() if stamped is not None else -1
        self._budget = budget
        self._direct = direct  # direct_metrics.DirectMetrics (typed Any: that module imports this one)
        self._delta = direct.new_delta_state() if direct is not None else None

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        extra = self._histograms.to_metrics()
        if self._direct is not None:
            extra.extend(self._direct.to_metrics(self._preferred_temporality, self._delta))
        if self._stamped is not None:
            extra.extend(self._stamped.take(self._consumer))
        if extra:
            resource_metrics = list(metrics_data.resource_metrics) if metrics_data else []
            if resource_metrics:
                first = resource_metrics[0]
                # OTLP encoders key scopes by name: join the SDK's own otel_rl scope, never add a twin.
                scopes = list(first.scope_metrics)
                for i, scope in enumerate(scopes):
                    if scope.scope.name == self._scope.name:
                        scopes[i] = ScopeMetrics(scope=scope.scope, metrics=[*scope.metrics, *extra], schema_url=scope.schema_url)
                        break
                else:
                    scopes.append(ScopeMetrics(scope=self._scope, metrics=extra, schema_url=""))
                resource_metrics[0] = ResourceMetrics(resource=first.resource, scope_metrics=scopes, schema_url=first.schema_url)
            else:
                scope_metrics = ScopeMetrics(scope=self._scope, metrics=extra, schema_url="")
                resource_metrics = [ResourceMetrics(resource=self._resource, scope_metrics=[scope_metrics], schema_url="")]
            metrics_data = MetricsData(resource_metrics=resource_metrics)
        if self._budget is not None and metrics_data is not None:
            metrics_data = self._budget.apply(metrics_data)
        return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)
