"""Bulk histograms must produce exactly what the SDK's own explicit-bucket aggregation produces."""

from __future__ import annotations

import numpy as np
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_rl._sdk.pipeline.aggregation import BulkHistograms, LatestValues, MergingMetricExporter, SlotRow
from otel_rl.semconv import BUCKETS


@pytest.mark.parametrize("bucket_set", ["duration", "tokens", "ratio", "count"])
def test_bulk_binning_matches_the_sdk_histogram(bucket_set):
    bounds = BUCKETS[bucket_set]
    rng = np.random.default_rng(3)
    # Values on the bounds exercise the (lower, upper] edge rule; the SDK drops negatives, so none here.
    values = np.concatenate([rng.uniform(0, bounds[-1] * 1.2, 500), np.array(bounds), np.array([0.0])])
    reader = InMemoryMetricReader()
    sdk = MeterProvider(metric_readers=[reader]).get_meter("t").create_histogram("h", explicit_bucket_boundaries_advisory=list(bounds))
    for v in values:
        sdk.record(float(v))
    sdk_point = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]

    ours = BulkHistograms()
    ours.declare("h", "", "1", bounds)
    ours.record_many("h", values[:300])
    for v in values[300:310]:
        ours.record("h", float(v))  # the single-value path must agree with the bulk one
    ours.record_many("h", values[310:])
    point = ours.to_metrics()[0].data.data_points[0]
    assert list(point.bucket_counts) == list(sdk_point.bucket_counts)
    assert point.count == sdk_point.count
    assert point.sum == pytest.approx(sdk_point.sum)
    assert (point.min, point.max) == (sdk_point.min, sdk_point.max)


def test_latest_values_keep_the_last_set_and_accumulate_adds():
    latest = LatestValues()
    latest.set("g", (("a", "1"),), 1.0)
    latest.set("g", (("a", "1"),), 2.0)
    latest.add("c", (), 1)
    latest.add("c", (), 2)
    assert latest.get("g", (("a", "1"),)) == 2.0 and latest.get("c") == 3
    assert [(slot[0], slot[1]) for slot in latest.series("g").values()] == [(2.0, {"a": "1"})]


def _row(latest: LatestValues, series: list[tuple[str, tuple]], scaled: list[tuple[int, float]] = ()) -> SlotRow:
    for metric, attrs in series:
        latest.set(metric, attrs, 0.0)
    return SlotRow([latest.series(m)[a] for m, a in series], list(scaled), frozenset(series))


def test_a_deferred_step_is_stored_converted_when_read():
    latest = LatestValues()
    row = _row(latest, [("g", (("k", "a"),)), ("h", ())], scaled=[(1, 1e-3)])
    latest.defer(row, [1.5, 2500.0])
    assert latest.series("h")[()][0] == 0.0  # nothing written per step ...
    assert latest.get("g", (("k", "a"),)) == 1.5  # ... until read
    assert latest.get("h") == 2500.0 * 1e-3
    latest.defer(row, [3.0, 1000.0])
    latest.defer(row, [4.0, 2000.0])  # only the latest step of a key set is kept
    assert latest.get("g", (("k", "a"),)) == 4.0 and latest.get("h") == 2.0


def test_the_latest_write_of_a_series_wins_across_key_sets_and_single_writes():
    latest = LatestValues()
    shared = ("loss", ())
    train = _row(latest, [shared, ("kl", ())])
    validation = _row(latest, [shared])
    latest.defer(train, [1.0, 0.1])
    latest.defer(validation, [2.0])
    latest.defer(train, [3.0, 0.2])  # the train key set again: its loss is the latest
    assert latest.get("loss") == 3.0
    latest.defer(validation, [4.0])
    latest.set("loss", (), 5.0)  # a single write after a deferred step of that series
    latest.defer(train, [6.0, 0.3])
    latest.set("other", (), 1.0)  # a series no key set holds: the deferred step stays deferred
    assert latest.series("loss")[()][0] == 5.0
    assert latest.get("loss") == 6.0 and latest.get("kl") == 0.3
    latest.defer(train, [7.0, 0.4])
    latest.add("kl", (), 1.0)
    assert latest.get("kl") == 1.4 and latest.get("loss") == 7.0


class _Capture:
    """A minimal MetricExporter-compatible sink that keeps what it is given."""

    _preferred_temporality: dict = {}
    _preferred_aggregation: dict = {}

    def __init__(self) -> None:
        self.exported = []

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        self.exported.append(metrics_data)

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def test_merging_exporter_joins_the_sdk_scope_instead_of_adding_a_twin():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("otel_rl").create_counter("c").add(1)
    histograms = BulkHistograms()
    histograms.declare("h", "d", "s", (1.0, 2.0))
    histograms.record_many("h", np.array([0.5, 1.5, 3.0]))
    sink = _Capture()
    exporter = MergingMetricExporter(sink, histograms, Resource.create({}), InstrumentationScope("otel_rl", "0"))
    exporter.export(reader.get_metrics_data())
    (data,) = sink.exported
    scopes = data.resource_metrics[0].scope_metrics
    assert [s.scope.name for s in scopes] == ["otel_rl"]
    assert sorted(m.name for m in scopes[0].metrics) == ["c", "h"]
    # With nothing from the SDK, the histograms still go out under the given resource.
    exporter.export(None)
    assert [m.name for m in sink.exported[1].resource_metrics[0].scope_metrics[0].metrics] == ["h"]


def test_histogram_rows_bin_later_to_the_same_points_as_single_records():
    bounds = (0.0, 1.0, 2.5, 10.0)
    one, rows = BulkHistograms(), BulkHistograms()
    for bulk in (one, rows):
        bulk.declare("a", "", "s", bounds)
        bulk.declare("b", "", "s", bounds)
        bulk.record("a", 0.5)  # each series exists before its rows are kept
        bulk.record("b", 0.5)
    sink = rows.rows([rows.series_state("a"), rows.series_state("b")])
    sink.limit = 3  # folds on its own after 3 rows, and again when read
    table = [(1.0, 2.5), (10.0, -1.0), (11.0, float("nan")), (0.0, 2.6), (2.5, 3.0)]  # values on the bounds, NaN = no value
    for a, b in table:
        one.record("a", a)
        if not np.isnan(b):
            one.record("b", b)
        sink.add([a, b])
    assert len(sink.pending) == 2  # three rows were binned when the sink reached its limit
    for name in ("a", "b"):
        assert rows.snapshot(name) == one.snapshot(name)
    assert sink.pending == []
    by_name = {m.name: m.data.data_points[0] for m in rows.to_metrics()}
    expected = {m.name: m.data.data_points[0] for m in one.to_metrics()}
    for name in ("a", "b"):
        got, want = by_name[name], expected[name]
        assert (got.count, got.sum, got.min, got.max, list(got.bucket_counts)) == (
            want.count,
            want.sum,
            want.min,
            want.max,
            list(want.bucket_counts),
        )
    assert by_name["b"].count == 5  # the NaN row left b out


@pytest.mark.parametrize("b_bounds", [(0.0, 1.0, 2.5, 10.0), (0.5, 5.0)], ids=["shared-bounds", "own-bounds"])
def test_full_rows_bin_as_one_table_to_the_same_points(b_bounds):
    # Rows with no NaN whose states share their bounds are binned in one searchsorted over the table.
    one, rows = BulkHistograms(), BulkHistograms()
    for bulk in (one, rows):
        bulk.declare("a", "", "s", (0.0, 1.0, 2.5, 10.0))
        bulk.declare("b", "", "s", b_bounds)
        bulk.record("a", 0.5)
        bulk.record("b", 0.5)
    sink = rows.rows([rows.series_state("a"), rows.series_state("b")])
    rng = np.random.default_rng(7)
    table = [(float(a), float(b)) for a, b in rng.choice([-1.0, 0.0, 0.5, 1.0, 2.5, 3.0, 10.0, 12.0], size=(40, 2))]
    for a, b in table:
        one.record("a", a)
        one.record("b", b)
        sink.add((a, b))
    for name in ("a", "b"):
        assert rows.snapshot(name) == one.snapshot(name)


def test_histogram_rows_convert_each_column_by_its_factor_when_binned():
    bounds = (0.0, 0.5, 1.0, 2.5)
    one, rows = BulkHistograms(), BulkHistograms()
    for bulk in (one, rows):
        for name in ("ms", "s"):
            bulk.declare(name, "", "s", bounds)
            bulk.record(name, 0.25)
    sink = rows.rows([rows.series_state("ms"), rows.series_state("s")], factors=[1e-3, 1.0])
    for ms, s in [(500.0, 0.75), (2500.0, float("nan")), (1234.5, 2.5)]:
        one.record("ms", ms * 1e-3)
        if not np.isnan(s):
            one.record("s", s)
        sink.add([ms, s])  # as logged: milliseconds
    for name in ("ms", "s"):
        assert rows.snapshot(name) == one.snapshot(name)


def test_histogram_points_share_their_declared_bounds_across_exports():
    # The run folder's JSON encoder keeps a bounds tuple's encoding while the same object comes back;
    # a fresh list per export made it encode every point's bounds again at every export.
    ours = BulkHistograms()
    ours.declare("h", "", "s", BUCKETS["duration"])
    ours.record("h", 0.5)
    first = ours.to_metrics()[0].data.data_points[0].explicit_bounds
    ours.record("h", 1.5)
    second = ours.to_metrics()[0].data.data_points[0].explicit_bounds
    assert type(first) is tuple and first is second
    assert list(first) == [float(b) for b in BUCKETS["duration"]]
