"""What a rank other than the lead sends to the metrics store: the series budget.

Every metric carries its process's resource, ``rl.rank`` included, so a store holds each series
once per rank: ~1,000 series a rank with the defaults, a million for a 1,024-rank job. Most of
them are copies: the trainer's reward, KL or loss is the same job-level value on every rank, and
a histogram's buckets are what a job-level view needs once. The registry says for each metric
which ranks send it (``annotations.otel_rl.ranks``):

- ``copy`` (the default): a job-level value every rank holds. Only the lead rank sends it.
- ``own``: each rank's own state (its GPU's memory and utilisation, its process, its stage
  time): what a straggler hunt compares across ranks. Every rank sends it; a histogram's buckets
  come from the lead rank, the other ranks send its sum and count only (one bucket, +Inf), which
  is each rank's mean per call.
- ``share``: each rank's part of the job's observations (samples, trajectories, tool calls, the
  inference engines it reads): every rank sends it whole, the store adds them up.

``per_rank_metrics`` (``OTEL_RL_PER_RANK_METRICS``) asks for whole per-rank copies: ``all``, or
the names of the metrics to keep whole on every rank. The run folder keeps every metric whatever
the budget: it is the rank's own record, not a store's series.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from opentelemetry.sdk.metrics.export import Histogram, HistogramDataPoint, Metric, MetricsData, ResourceMetrics, ScopeMetrics

from otel_rl.semconv import METRICS

ALL_METRICS = "all"
COPY, OWN, SHARE = "copy", "own", "share"


def is_lead_rank(rank: int | None) -> bool:
    """The rank that sends the job-level metrics: rank 0, or a process that names no rank."""
    return not rank


class SeriesBudget:
    """Filters one non-lead rank's metric exports by each metric's rank scope (module docstring).

    ``scopes`` maps metric names to ``copy`` / ``own`` / ``share``; a metric it does not hold (an
    instrument of the program's own) is sent as it is. Framework keys with no registry meaning
    are ``rl.unmapped`` points, a copy like the keys around them. ``whole`` names the metrics
    kept whole on this rank.
    """

    def __init__(self, scopes: Mapping[str, str], whole: frozenset[str] = frozenset()) -> None:
        self._scopes = scopes
        self._whole = whole

    def apply(self, data: MetricsData) -> MetricsData:
        resource_metrics = []
        for rm in data.resource_metrics:
            scopes = []
            for sm in rm.scope_metrics:
                kept = [m for m in (self._budgeted(metric) for metric in sm.metrics) if m is not None]
                if kept:
                    scopes.append(ScopeMetrics(scope=sm.scope, metrics=kept, schema_url=sm.schema_url))
            if scopes:
                resource_metrics.append(ResourceMetrics(resource=rm.resource, scope_metrics=scopes, schema_url=rm.schema_url))
        return MetricsData(resource_metrics=resource_metrics)

    def _budgeted(self, metric: Metric) -> Metric | None:
        scope = self._scopes.get(metric.name)
        if scope is None or scope == SHARE or metric.name in self._whole:
            return metric
        if scope == COPY:
            return None
        if isinstance(metric.data, Histogram):
            points = [_sum_and_count(p) for p in metric.data.data_points]
            return dataclasses.replace(metric, data=dataclasses.replace(metric.data, data_points=points))
        return metric


def _sum_and_count(point: HistogramDataPoint) -> HistogramDataPoint:
    """The point with its buckets folded into one (+Inf): its count, sum, min and max stay."""
    return dataclasses.replace(point, bucket_counts=[point.count], explicit_bounds=[], exemplars=[])


REGISTRY_SCOPES: dict[str, str] = {name: definition.ranks for name, definition in METRICS.items()}


def series_budget(rank: int | None, per_rank_metrics: tuple[str, ...] = ()) -> SeriesBudget | None:
    """The budget a process of ``rank`` applies to its store exports, or None where it sends all."""
    if is_lead_rank(rank) or ALL_METRICS in per_rank_metrics:
        return None
    return SeriesBudget(REGISTRY_SCOPES, frozenset(per_rank_metrics))
