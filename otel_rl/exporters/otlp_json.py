"""OTLP/JSON lines exporters: the run folder's ``traces.jsonl``, ``metrics.jsonl``, ``logs.jsonl``.

Each ``export()`` call appends exactly one line: one ``ExportTraceServiceRequest`` /
``ExportMetricsServiceRequest`` / ``ExportLogsServiceRequest`` in the OTLP/JSON encoding, the
format the OpenTelemetry Collector's ``file`` exporter writes and its ``otlpjsonfile`` receiver
reads. The content is exactly what the OTLP/gRPC and OTLP/HTTP exporters would send; the
encoding itself lives in :mod:`otel_rl.exporters.otlp_json_encoders` and
:mod:`otel_rl.exporters.otlp_json_metrics` (their names are re-exported
here).

The exporters never raise into the SDK: an encoding or I/O error is logged once (per exporter)
on the ``otel_rl`` logger and the export returns ``FAILURE``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_rl.exporters.otlp_json_encoders import FloatBody, logs_to_otlp_json, spans_to_otlp_json, to_otlp_json
from otel_rl.exporters.otlp_json_metrics import metrics_to_otlp_json

__all__ = [
    "FloatBody",
    "OtlpJsonLogExporter",
    "OtlpJsonMetricExporter",
    "OtlpJsonSpanExporter",
    "logs_to_otlp_json",
    "metrics_to_otlp_json",
    "spans_to_otlp_json",
    "to_otlp_json",
]

_logger = logging.getLogger("otel_rl")


def _ends_torn(path: str) -> bool:
    """Whether the file at ``path`` is non-empty and its last byte is not a newline."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


class _JsonLinesFile:
    """A file opened once in append mode, written one whole line per call, under a lock.

    Errors are swallowed: the first one is logged (warning, with the reason), later ones at debug
    level, and the call reports failure with ``False``.
    """

    def __init__(self, path: str | os.PathLike[str], signal: str) -> None:
        self.path = os.fspath(path)
        self._signal = signal
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._shutdown = False
        self._error_logged = False
        self.lost = 0  # records in lines that could not be written (a full disk, a removed folder)
        # Told of each lost line's records (signal, count): the run's rl.telemetry.dropped{write_failed}.
        self.on_lost: Callable[[str, int], None] | None = None
        with self._lock:
            self._open_locked()

    def _report(self, what: str, error: BaseException) -> None:
        if not self._error_logged:
            self._error_logged = True
            _logger.warning(
                "otel-rl: cannot %s %s file %s: %s: %s (further errors of this exporter are "
                "logged at debug level; telemetry for this signal is being dropped)",
                what,
                self._signal,
                self.path,
                type(error).__name__,
                error,
            )
        else:
            _logger.debug("otel-rl: cannot %s %s file %s: %r", what, self._signal, self.path, error)

    def _open_locked(self) -> bool:
        if self._file is not None:
            return True
        try:
            parent = os.path.dirname(self.path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            # newline="\n": no "\r\n" translation on any platform; one record per "\n".
            # errors=: a text UTF-8 cannot encode that got past the worker costs its own characters, not the batch
            self._file = open(self.path, "a", encoding="utf-8", errors="backslashreplace", newline="\n")  # noqa: SIM115
            if _ends_torn(self.path):
                # A crashed writer left a torn last line: end it, so our first line stays whole
                # (the reader then reports the torn line alone instead of losing our batch too).
                self._file.write("\n")
                self._file.flush()
            return True
        except Exception as error:  # noqa: BLE001 - never raise into the SDK
            self._report("open", error)
            return False

    def _lose(self, items: int) -> bool:
        """``items`` records were not written: counted (and told), never silently gone."""
        if items > 0:
            self.lost += items
            if self.on_lost is not None:
                self.on_lost(self._signal, items)
        return False

    def write_line(self, make_line: Callable[[], str | None], items: int = 1) -> bool:
        """Append ``make_line()`` plus a newline; ``None`` means nothing to write (success).
        ``items``: the records the line holds, counted as lost when it cannot be written."""
        with self._lock:
            if self._shutdown:
                return False
            try:
                line = make_line()
            except Exception as error:  # noqa: BLE001 - encoding error, drop this batch
                self._report("encode data for the", error)
                return self._lose(items)
            if line is None:
                return True
            if not self._open_locked():
                return self._lose(items)
            assert self._file is not None
            try:
                self._file.write(line + "\n")
                self._file.flush()
                return True
            except Exception as error:  # noqa: BLE001
                self._report("write to", error)
                return self._lose(items)

    def write_bytes(self, line: bytes, items: int = 1) -> bool:
        """Append ``line`` (UTF-8, ending in a newline) as it is, after any text written before."""
        with self._lock:
            if self._shutdown or not self._open_locked():
                return False if self._shutdown else self._lose(items)
            assert self._file is not None
            try:
                self._file.flush()  # the text layer's buffer first (write_line flushes: normally empty)
                self._file.buffer.write(line)
                self._file.buffer.flush()
                return True
            except Exception as error:  # noqa: BLE001
                self._report("write to", error)
                return self._lose(items)

    def flush(self) -> bool:
        with self._lock:
            if self._file is None:
                return not self._shutdown
            try:
                self._file.flush()
                return True
            except Exception as error:  # noqa: BLE001
                self._report("flush", error)
                return False

    def close(self) -> None:
        with self._lock:
            self._shutdown = True
            file, self._file = self._file, None
            if self.lost:
                _logger.warning(
                    "otel-rl: %s record(s) of %s were lost: %s could not be written when they came (see the first error "
                    "above); counted in rl.telemetry.dropped{rl.telemetry.drop_reason=write_failed}",
                    f"{self.lost:,}",
                    self._signal,
                    self.path,
                )
            if file is None:
                return
            try:
                file.close()
            except Exception as error:  # noqa: BLE001
                self._report("close", error)


def _points(metrics_data: MetricsData | None) -> int:
    """The data points of a collection (what a lost metrics line loses)."""
    if metrics_data is None:
        return 0
    return sum(
        len(getattr(metric.data, "data_points", ()) or ())
        for rm in metrics_data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    )


class OtlpJsonSpanExporter(SpanExporter):
    """Appends one ``ExportTraceServiceRequest`` OTLP/JSON line per batch of spans to ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._out = _JsonLinesFile(path, "traces")

    @property
    def path(self) -> str:
        return self._out.path

    @property
    def lines(self) -> _JsonLinesFile:
        return self._out

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        def make_line() -> str | None:
            if not spans:
                return None
            return spans_to_otlp_json(spans)

        ok = self._out.write_line(make_line, len(spans))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._out.flush()

    def shutdown(self) -> None:
        self._out.close()


class OtlpJsonMetricExporter(MetricExporter):
    """Appends one ``ExportMetricsServiceRequest`` OTLP/JSON line per collection to ``path``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        preferred_temporality: dict[type, AggregationTemporality] | None = None,
        preferred_aggregation: dict[type, Any] | None = None,
    ) -> None:
        super().__init__(preferred_temporality=preferred_temporality, preferred_aggregation=preferred_aggregation)
        self._out = _JsonLinesFile(path, "metrics")

    @property
    def path(self) -> str:
        return self._out.path

    @property
    def lines(self) -> _JsonLinesFile:
        return self._out

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        def make_line() -> str | None:
            if metrics_data is None or not metrics_data.resource_metrics:
                return None
            return metrics_to_otlp_json(metrics_data)

        ok = self._out.write_line(make_line, _points(metrics_data))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._out.flush()

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._out.close()


class OtlpJsonLogExporter(LogRecordExporter):
    """Appends one ``ExportLogsServiceRequest`` OTLP/JSON line per batch of log records to ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._out = _JsonLinesFile(path, "logs")

    @property
    def path(self) -> str:
        return self._out.path

    @property
    def lines(self) -> _JsonLinesFile:
        """The file this exporter appends to (a writer of other lines shares its lock)."""
        return self._out

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        def make_line() -> str | None:
            if not batch:
                return None
            return logs_to_otlp_json(batch)

        ok = self._out.write_line(make_line, len(batch))
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._out.flush()

    def shutdown(self) -> None:
        self._out.close()
