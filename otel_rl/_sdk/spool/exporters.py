"""The exporters the SDK's batch processors and metric reader call when the disk spool is on: they
encode each batch into the OTLP request the SDK exporter would send and store it in the spool,
which delivers it (see :mod:`otel_rl._sdk.spool.store`). They never wait for the network.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_rl._sdk.otlp.metrics_encoder import MetricsEncoder
from otel_rl._sdk.otlp.sdk_compat import LogRecordExporter, LogRecordExportResult, log_encoder, metric_preferences
from otel_rl._sdk.otlp.spans_encoder import encode_spans_request
from otel_rl._sdk.spool.store import LOGS, METRICS, TRACES, Spool

logger = logging.getLogger("otel_rl")


def _metric_points(data: MetricsData) -> int:
    count = 0
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                count += len(getattr(metric.data, "data_points", ()) or ())
    return count


class _SpoolingExporterMixin:
    _signal: str

    def _init_spooling(self, spool: Spool, inner: Any) -> None:
        self._spool = spool
        self.inner = inner
        self._pid = os.getpid()
        self._encode_error_reported = False

    def _store(self, encode: Callable[[], bytes], items: int) -> bool:
        """Store the serialized request ``encode()`` makes."""
        if os.getpid() != self._pid:  # a forked child: the parent's spool is not ours to write
            return False
        try:
            payload = encode()
        except Exception as exc:  # noqa: BLE001 - never raise into the SDK
            if not self._encode_error_reported:
                self._encode_error_reported = True
                logger.warning("otel-rl: cannot encode a batch of %s for OTLP (%r); it is dropped (reported once)", self._signal, exc)
            return False
        return self._spool.append(self._signal, payload, items)

    def _flush(self, timeout_millis: float) -> bool:
        if os.getpid() != self._pid:
            return False
        return self._spool.wait_delivered(self._signal, timeout_millis / 1000.0)

    def _close(self, timeout_millis: float | None) -> None:
        if os.getpid() != self._pid:
            return
        self._spool.close_signal(self._signal, None if timeout_millis is None else timeout_millis / 1000.0)


class SpoolingSpanExporter(_SpoolingExporterMixin, SpanExporter):
    """Spans into the spool, in place of the SDK OTLP span exporter ``inner``."""

    _signal = TRACES

    def __init__(self, spool: Spool, inner: Any) -> None:
        self._init_spooling(spool, inner)

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        ok = self._store(lambda: encode_spans_request(spans), len(spans))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._flush(timeout_millis)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        self._close(timeout_millis)


class SpoolingLogExporter(_SpoolingExporterMixin, LogRecordExporter):
    """Log records into the spool, in place of the SDK OTLP log exporter ``inner``.

    Needs the SDK's log encoder: callers check ``sdk_compat.log_encoder()`` first (RuntimeError without it)."""

    _signal = LOGS

    def __init__(self, spool: Spool, inner: Any) -> None:
        encoder = log_encoder()
        if encoder is None:
            raise RuntimeError("this opentelemetry-exporter-otlp offers no log encoder the spool supports (warned above)")
        self._encode_logs = encoder
        self._init_spooling(spool, inner)

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        if not batch:
            return LogRecordExportResult.SUCCESS
        ok = self._store(lambda: self._encode_logs(batch).SerializeToString(), len(batch))
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._flush(timeout_millis)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        self._close(timeout_millis)


class SpoolingMetricExporter(_SpoolingExporterMixin, MetricExporter):
    """Metric exports into the spool, in place of the SDK OTLP metric exporter ``inner``, whose
    temporality / aggregation preferences (OTEL_EXPORTER_OTLP_METRICS_*) still apply."""

    _signal = METRICS

    def __init__(self, spool: Spool, inner: Any) -> None:
        temporality, aggregation = metric_preferences(inner)
        MetricExporter.__init__(self, preferred_temporality=temporality, preferred_aggregation=aggregation)
        self._init_spooling(spool, inner)
        self._encoder = MetricsEncoder()  # each series' attributes encoded once for the run

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if metrics_data is None or not metrics_data.resource_metrics:
            return MetricExportResult.SUCCESS
        ok = self._store(lambda: self._encoder.encode(metrics_data), _metric_points(metrics_data))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._close(timeout_millis)
