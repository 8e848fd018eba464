"""Build the SDK providers (traces, metrics, logs) and their exporters from a TelemetryConfig.

No endpoint configured: everything goes to OTLP-JSON lines in the run folder (the collector's
file exporter format), so nothing is lost and it can be pushed to a collector later. With an
endpoint: OTLP over gRPC or HTTP/protobuf; `exporters=("otlp", "file")` does both.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.environment_variables import OTEL_BLRP_MAX_EXPORT_BATCH_SIZE
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_rl import environment_variables as ENV
from otel_rl._sdk.export.file_exports import QueuedExport, QueuedLogExport, QueuedSpanExport
from otel_rl._sdk.export.shutdown import shutdown_within
from otel_rl._sdk.otlp.sdk_compat import (
    BatchLogRecordProcessor,
    LoggerProvider,
    LogRecordExporter,
    LogRecordExportResult,
    LogRecordLimits,
    SimpleLogRecordProcessor,
    log_encoder,
    log_request_parts,
    metric_preferences,
)
from otel_rl._sdk.otlp.settings import check_otlp_environment, resolve_otlp_settings, sdk_exporter
from otel_rl._sdk.pipeline.aggregation import BulkHistograms, LatestValues, MergingMetricExporter, SeriesGuard, StampedPoints
from otel_rl._sdk.pipeline.direct_metrics import DirectMetrics
from otel_rl._sdk.pipeline.series_budget import SeriesBudget, series_budget
from otel_rl._sdk.pipeline.utf8 import OnBadText, clean_mapping, clean_text, encodes, plain_ascii
from otel_rl._sdk.settings.config import TelemetryConfig
from otel_rl._sdk.settings.redaction import redact_library_logs, redact_url
from otel_rl._sdk.spool.exporters import SpoolingLogExporter, SpoolingMetricExporter, SpoolingSpanExporter
from otel_rl._sdk.spool.store import LOGS, METRICS, TRACES, Spool, SpoolBusy, transport_for
from otel_rl._version import __version__
from otel_rl.exporters.files import LOGS_FILE, METRICS_FILE, TRACES_FILE, rank_file_name
from otel_rl.exporters.otlp_json import OtlpJsonLogExporter, OtlpJsonMetricExporter, OtlpJsonSpanExporter
from otel_rl.exporters.step_events import DirectStepWriter, StepEventWriter, StepEventWriters
from otel_rl.exporters.step_events_proto import StepEventProtoWriter
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

SCOPE_NAME = "otel_rl"
SPOOL_FOLDER = "spool"
logger = logging.getLogger("otel_rl")

# BatchLogRecordProcessor's default for OTEL_BLRP_MAX_EXPORT_BATCH_SIZE.
_SDK_LOG_BATCH_SIZE = 512
_WRITE_FAILED = A.RlTelemetryDropReasonValues.WRITE_FAILED.value


@dataclass
class Providers:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    logger_provider: LoggerProvider
    destinations: list[str] = field(default_factory=list)
    span_processors: list[Any] = field(default_factory=list)
    shared_tracer_provider: bool = False  # handed in by the caller, who shuts it down
    spool: Spool | None = None  # where OTLP exports wait for the collector
    # The writers of float-only step events (the run folder's, the spool's), when every place events
    # go has one: the worker writes those steps there directly, past the SDK's log pipeline.
    step_events: DirectStepWriter | None = None
    # The run folder's and the spool's spans and events, queued for the telemetry worker to write (no SDK thread).
    file_exports: list[QueuedExport] = field(default_factory=list)
    # Whether anything takes events (a file, a collector, a tracker): with nothing, none is built.
    events_exported: bool = True
    # The limits of the tracer provider otel-rl built (spans built past the SDK apply them); None for one handed in.
    span_limits: SpanLimits | None = None
    # Told of each text UTF-8 cannot encode in a span (the telemetry worker's ``bad_text``): said once, counted.
    on_bad_text: OnBadText | None = None
    # The run folder's queued events: written before the worker's direct event lines, to keep their order.
    run_folder_events: QueuedLogExport | None = None
    # How many attributes an event's log record keeps (telemetry trims past it, keeping the first).
    event_attribute_limit: int | None = None

    def end_spans(self, spans: Sequence[Any]) -> None:
        """Hand finished spans built without the SDK's span objects (``ReadableSpan``s, e.g. the
        kept trajectories of a step) to otel-rl's span processors, as the SDK does when a span ends:
        every destination (run folder, OTLP, spool) gets them in the same encoding. A tracer
        provider handed in by the caller keeps its own other processors out of this."""
        if self.on_bad_text is not None:
            spans = [utf8_span(span, self.on_bad_text) for span in spans]
        for processor in self.span_processors:
            on_end_all = getattr(processor, "on_end_all", None)
            if on_end_all is not None:  # the run folder's: one export for the batch
                on_end_all(spans)
                continue
            for span in spans:
                processor.on_end(span)

    def begin_shutdown(self, timeout_s: float) -> None:
        """Start the clock that bounds delivery during shutdown (an unreachable collector)."""
        if self.spool is not None:
            self.spool.begin_shutdown(timeout_s)

    def shutdown(self, timeout_s: float) -> list[str]:
        """Shut every signal down within ``timeout_s`` in all; the signals not delivered by then (reported)."""
        # a tracer provider that was handed in belongs to the caller: stop only our processors
        traces = self.span_processors if self.shared_tracer_provider else [self.tracer_provider]
        parts = {TRACES: traces, LOGS: [self.logger_provider], METRICS: [self.meter_provider]}
        otlp_unspooled = self.spool is None and any(d.startswith("OTLP") for d in self.destinations)
        hint = f" A disk spool ({ENV.OTEL_RL_SPOOL_MAX_BYTES} > 0, the default) keeps them for `otel-rl push`." if otlp_unspooled else ""
        span_queues = [q for q in self.file_exports if isinstance(q, QueuedSpanExport)]
        queues = {TRACES: span_queues, LOGS: [q for q in self.file_exports if q not in span_queues]}
        # each destination's queue gets every record: the fullest one says how many may be missing
        return shutdown_within(
            parts, timeout_s, self.destinations, hint, lambda signal: max((q.held for q in queues.get(signal, ())), default=0)
        )

    def force_flush(self, timeout_s: float) -> bool:
        """Flush every signal within ``timeout_s`` in all (each gets the time left); never raises.

        The SDK's batch processors ignore their timeout and export in the caller's thread, and the
        OTLP exporters wait their own timeout (10 s) on a peer that never answers: the flush runs
        in a daemon thread and the caller waits for it only until the deadline (False after it).
        """
        deadline = time.monotonic() + timeout_s
        result: list[bool] = []

        def flush_all() -> None:
            ok = True
            for provider in (self.tracer_provider, self.logger_provider, self.meter_provider):
                try:  # the meter provider raises when its readers time out
                    ok = bool(provider.force_flush(max(0, int((deadline - time.monotonic()) * 1000)))) and ok
                except Exception as exc:  # noqa: BLE001 - flush() never raises into the training loop
                    logger.debug("otel-rl: flushing %s failed: %s", type(provider).__name__, exc)
                    ok = False
            result.append(ok)

        worker = threading.Thread(target=flush_all, name="otel-rl-flush", daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        return bool(result) and result[0]


# -- fork safety ------------------------------------------------------------------------------
# A forked child inherits the providers, and the SDK restarts their worker threads in it: without
# these guards the child would append the parent's buffered data to the parent's files, spool and
# trackers a second time. The guard is outermost, so a child never touches otel-rl's locks either.


class _ForkSafeSpanExporter(SpanExporter):
    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self._pid = os.getpid()

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if os.getpid() != self._pid:
            return SpanExportResult.FAILURE
        return self.inner.export(spans)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return os.getpid() == self._pid and self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        if os.getpid() == self._pid:
            _shutdown(self.inner, timeout_millis)


class _ForkSafeLogExporter(LogRecordExporter):
    def __init__(self, inner: LogRecordExporter) -> None:
        self.inner = inner
        self._pid = os.getpid()

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        if os.getpid() != self._pid:
            return LogRecordExportResult.FAILURE
        return self.inner.export(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return os.getpid() == self._pid and self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        if os.getpid() == self._pid:
            _shutdown(self.inner, timeout_millis)


class _ForkSafeMetricExporter(MetricExporter):
    def __init__(self, inner: MetricExporter) -> None:
        temporality, aggregation = metric_preferences(inner)
        super().__init__(preferred_temporality=temporality, preferred_aggregation=aggregation)
        self.inner = inner
        self._pid = os.getpid()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.FAILURE
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return os.getpid() == self._pid and self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if os.getpid() == self._pid:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _shutdown(exporter: Any, timeout_millis: float | None) -> None:
    if timeout_millis is not None and "timeout_millis" in inspect.getfullargspec(exporter.shutdown).args:
        exporter.shutdown(timeout_millis=timeout_millis)
    else:
        exporter.shutdown()


# The SDK's batch processors flush into the exporter but do not flush the exporter itself; the
# spool's exporters deliver asynchronously, so Telemetry.flush() must reach them too.
class _SpanProcessor(BatchSpanProcessor):
    def __init__(self, exporter: SpanExporter) -> None:
        super().__init__(exporter)
        self._otel_rl_exporter = exporter

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        ok = super().force_flush(timeout_millis)
        return bool(self._otel_rl_exporter.force_flush(timeout_millis)) and ok


class _QueuedSpanProcessor(SpanProcessor):
    """Hands each ended (sampled) span to a QueuedExport: no thread of its own."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter

    def on_end(self, span: Any) -> None:
        if span.context.trace_flags.sampled:
            self._exporter.export((span,))

    def on_end_all(self, spans: Sequence[Any]) -> None:
        """Many ended spans (``Providers.end_spans``), queued in one export."""
        sampled = [span for span in spans if span.context.trace_flags.sampled]
        if sampled:
            self._exporter.export(sampled)

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._exporter.force_flush(timeout_millis))


class _QueuedLogProcessor(SimpleLogRecordProcessor):
    """The SDK's simple processor (it makes the record the exporter takes) in front of a
    QueuedExport; flushing writes the queue."""

    def __init__(self, exporter: LogRecordExporter) -> None:
        super().__init__(exporter)
        self._otel_rl_exporter = exporter

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._otel_rl_exporter.force_flush(timeout_millis))


class _LogProcessor(BatchLogRecordProcessor):
    def __init__(self, exporter: LogRecordExporter) -> None:
        super().__init__(exporter)
        self._otel_rl_exporter = exporter

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        ok = super().force_flush(timeout_millis)
        return bool(self._otel_rl_exporter.force_flush(timeout_millis)) and ok


_OWN_METRICS = (M.RL_TELEMETRY_DROPPED, M.RL_TELEMETRY_REJECTED, M.RL_TELEMETRY_SPOOL_USAGE)


def series_guard(config: TelemetryConfig) -> SeriesGuard:
    """The per-process cardinality and attribute-length caps of the config (bind() it to count)."""
    return SeriesGuard(config.series_limit, config.attribute_value_limit, exempt=_OWN_METRICS)


def bind_series_guard(guard: SeriesGuard, latest: LatestValues) -> None:
    """Count the values refused past the series cap in rl.telemetry.dropped; report each metric once."""
    reported: set[str] = set()
    attrs = ((A.RL_TELEMETRY_DROP_REASON, A.RlTelemetryDropReasonValues.SERIES_LIMIT.value), (A.RL_TELEMETRY_SIGNAL, METRICS))

    def overflow(metric: str, values: int) -> None:
        latest.add(M.RL_TELEMETRY_DROPPED, attrs, values)
        if metric not in reported:
            reported.add(metric)
            logger.warning(
                "otel-rl: %s reached %d series in this process; values of new attribute sets are dropped and "
                "counted in rl.telemetry.dropped{drop_reason=series_limit} (a step, sample id or other "
                "unbounded value in a key or an attribute? raise OTEL_RL_SERIES_LIMIT / series_limit if the "
                "series are legitimate; reported once per metric)",
                metric,
                guard.series_limit,
            )

    guard.on_overflow = overflow


def spool_folder(config: TelemetryConfig) -> Path:
    """This process's spool folder: ``<spool_dir or run_dir/spool>/rank<N>``."""
    root = Path(str(config.spool_dir)) if config.spool_dir else Path(str(config.run_dir)) / SPOOL_FOLDER
    return root / f"rank{config.rank or 0}"


def _counter_of_lost(latest: LatestValues) -> Any:
    def lost(signal: str, items: int) -> None:
        latest.add(M.RL_TELEMETRY_DROPPED, ((A.RL_TELEMETRY_DROP_REASON, _WRITE_FAILED), (A.RL_TELEMETRY_SIGNAL, signal)), items)

    return lost


def open_spool(config: TelemetryConfig, latest: LatestValues | None) -> Spool | None:
    """The spool for this process, or None (turned off, or its folder cannot be written: reported)."""
    if config.spool_max_bytes <= 0:
        return None

    def on_drop(signal: str, reason: str, items: int) -> None:
        if latest is not None:
            latest.add(M.RL_TELEMETRY_DROPPED, ((A.RL_TELEMETRY_DROP_REASON, reason), (A.RL_TELEMETRY_SIGNAL, signal)), items)

    def on_usage(size: int) -> None:
        if latest is not None:
            latest.set(M.RL_TELEMETRY_SPOOL_USAGE, (), float(size))

    folder = spool_folder(config)
    try:
        try:
            return Spool(folder, config.spool_max_bytes, on_drop=on_drop, on_usage=on_usage)
        except SpoolBusy:
            # Another live process of the same rank (a restarted rank beside its old self, a child
            # that called init()) owns the folder: keep ours apart.
            return Spool(folder.with_name(f"{folder.name}-pid{os.getpid()}"), config.spool_max_bytes, on_drop=on_drop, on_usage=on_usage)
    except OSError as exc:
        logger.warning(
            "otel-rl: cannot use the spool folder %s (%s); OTLP exports go straight to the collector, and "
            "what fails to export during an outage is lost (set OTEL_RL_SPOOL_DIR to a writable folder)",
            folder,
            exc,
        )
        return None


def otlp_exporters(config: TelemetryConfig) -> tuple[Any, MetricExporter, Any]:
    """The SDK's OTLP span, metric and log exporters for ``config``'s collector (see ``otlp_settings``)."""
    check_otlp_environment(config.protocol, config.endpoint)
    span, metric, log = (
        sdk_exporter(resolve_otlp_settings(config.protocol, config.endpoint, signal)) for signal in (TRACES, METRICS, LOGS)
    )
    redact_library_logs((span, metric, log))  # their retry warnings quote the URL, token and all
    return span, metric, log


def build_providers(
    config: TelemetryConfig,
    resource: Resource,
    histograms: BulkHistograms,
    extra_log_exporters: list[Any] | None = None,
    *,
    tracer_provider: Any = None,
    latest: LatestValues | None = None,
    stamped: StampedPoints | None = None,
    direct: DirectMetrics | None = None,
) -> Providers:
    """``tracer_provider``: an SDK TracerProvider the program already has (e.g. its framework's
    own tracing); otel-rl's span processors join it instead of a second provider. ``latest``
    receives the spool's own metrics (rl.telemetry.dropped, rl.telemetry.spool.usage); ``direct``:
    the registry metrics each export reads from the latest values, with no SDK instrument."""
    shared = tracer_provider is not None
    if shared and not callable(getattr(tracer_provider, "add_span_processor", None)):
        raise TypeError(
            f"otel_rl.init(tracer_provider=...) needs an SDK TracerProvider (opentelemetry.sdk.trace), "
            f"got {type(tracer_provider).__name__}; leave it out to let otel-rl create one"
        )
    limit = config.attribute_value_limit or None
    span_limits = None if shared else SpanLimits(max_attribute_length=limit)
    if not shared:
        tracer_provider = TracerProvider(resource=resource, span_limits=span_limits)
    span_processors: list[Any] = []
    log_limits = LogRecordLimits(max_attribute_length=limit)  # the count from OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT, or 128
    logger_provider = LoggerProvider(resource=resource, log_record_limits=log_limits)
    for exporter in extra_log_exporters or ():  # e.g. the trackers: fed off-thread by the batch processor
        logger_provider.add_log_record_processor(_LogProcessor(_ForkSafeLogExporter(exporter)))
    scope = InstrumentationScope(SCOPE_NAME, __version__)
    metric_exporters: list[MetricExporter] = []
    destinations = []
    interval_ms = config.metric_export_interval_s * 1000.0

    # What this rank sends the metrics store (the run folder keeps every metric).
    budget = series_budget(config.rank, config.per_rank_metrics)

    def add(span_exporter: Any, metric_exporter: MetricExporter, log_exporter: Any) -> None:
        span_processors.append(_SpanProcessor(_ForkSafeSpanExporter(span_exporter)))
        tracer_provider.add_span_processor(span_processors[-1])
        logger_provider.add_log_record_processor(_LogProcessor(_ForkSafeLogExporter(log_exporter)))
        add_metrics(metric_exporter, budget)

    def add_metrics(metric_exporter: MetricExporter, budget: SeriesBudget | None = None) -> None:
        metric_exporters.append(
            _ForkSafeMetricExporter(MergingMetricExporter(metric_exporter, histograms, resource, scope, stamped, budget, direct))
        )

    writers: list[DirectStepWriter] = []  # direct writers of step events
    file_exports: list[QueuedExport] = []
    run_folder_events: QueuedLogExport | None = None
    if config.file_enabled:
        run_dir = Path(str(config.run_dir))
        run_dir.mkdir(parents=True, exist_ok=True)
        files = [run_dir / rank_file_name(name, config.rank) for name in (TRACES_FILE, METRICS_FILE, LOGS_FILE)]
        log_file = OtlpJsonLogExporter(files[2])
        span_file, metric_file = OtlpJsonSpanExporter(files[0]), OtlpJsonMetricExporter(files[1])
        if latest is not None:  # what a failed write loses (a full disk) is counted, not silently gone
            for exporter in (span_file, metric_file, log_file):
                exporter.lines.on_lost = _counter_of_lost(latest)
        # Spans and events reach the files at the telemetry worker's next drain (within its gather
        # interval): a killed process loses at most that. No thread of their own (file_exports).
        queued_spans, queued_logs = QueuedSpanExport(span_file), QueuedLogExport(log_file)
        file_exports = [queued_spans, queued_logs]
        run_folder_events = queued_logs
        span_processors.append(_QueuedSpanProcessor(_ForkSafeSpanExporter(queued_spans)))
        tracer_provider.add_span_processor(span_processors[-1])
        logger_provider.add_log_record_processor(_QueuedLogProcessor(_ForkSafeLogExporter(queued_logs)))
        add_metrics(metric_file)
        destinations.append(f"files in {run_dir}")
        writers.append(StepEventWriter(log_file, resource, scope, N.RL_LOG_EVENT, A.RL_STEP, A.RL_LOG_KEY_SET))
    spool: Spool | None = None
    if config.otlp_enabled:
        exporters = otlp_exporters(config)
        # The spool stores what the SDK's encoders make: off (warned once) where they are not supported.
        spool = open_spool(config, latest) if log_encoder() is not None else None
        if spool is not None:
            exporters, spool = _spooled(spool, exporters)
        proto_writer = _spool_step_events(spool, resource, scope) if spool is not None and not extra_log_exporters else None
        if proto_writer is None:
            writers = []  # an OTLP destination without a direct writer: every event takes the SDK's path
        else:
            writers.append(proto_writer)
        if spool is not None:
            # Spans and events reach the spool at the telemetry worker's next drain, as they reach the
            # run folder: the same bound between log() and the disk, with no SDK thread that wakes
            # 50 times a second to look for them (half the CPU a rank spent at one step a second).
            span_exporter, metric_exporter, log_exporter = exporters
            queued_spans, queued_logs = QueuedSpanExport(span_exporter), QueuedLogExport(log_exporter)
            file_exports += [queued_spans, queued_logs]
            span_processors.append(_QueuedSpanProcessor(_ForkSafeSpanExporter(queued_spans)))
            tracer_provider.add_span_processor(span_processors[-1])
            logger_provider.add_log_record_processor(_QueuedLogProcessor(_ForkSafeLogExporter(queued_logs)))
            add_metrics(metric_exporter, budget)
        else:
            add(*exporters)  # straight to the network: the SDK's batch threads, off the worker
        destinations.append(
            f"OTLP {config.protocol} to {redact_url(config.endpoint) or 'the OTEL_EXPORTER_OTLP_*_ENDPOINT'}"
            + (f" (spool {spool.directory})" if spool is not None else "")
        )
    if extra_log_exporters:  # the trackers take events from the SDK's log pipeline only
        writers = []
    step_events = writers[0] if len(writers) == 1 else StepEventWriters(writers) if writers else None
    # A reader's timer starts when it is made: made here, next to its provider, so that a short
    # interval cannot tick before the provider owns it (the SDK warns on such a collect).
    readers = [PeriodicExportingMetricReader(exporter, export_interval_millis=interval_ms) for exporter in metric_exporters]
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    events_exported = bool(destinations or extra_log_exporters)
    return Providers(
        tracer_provider,
        meter_provider,
        logger_provider,
        destinations,
        span_processors,
        shared,
        spool,
        step_events,
        file_exports,
        events_exported,
        span_limits,
        run_folder_events=run_folder_events,
        # a limit of its own for log records since SDK 1.4x; the general one before
        event_attribute_limit=getattr(log_limits, "max_log_record_attributes", log_limits.max_attributes),
    )


def _spool_step_events(spool: Spool, resource: Resource, scope: InstrumentationScope) -> StepEventProtoWriter | None:
    """The spool's direct writer of step events: the same request bytes the SDK's encoder makes."""
    encoder = log_encoder()
    if encoder is None:
        return None
    try:
        parts = log_request_parts(encoder, resource, scope)
    except Exception as exc:  # an encoder of another shape: events take the SDK's path
        logger.debug("otel-rl: step events go through the SDK's log pipeline to the spool: %r", exc)
        return None
    return StepEventProtoWriter(
        lambda payload, records: spool.append(LOGS, payload, records),
        *parts,
        N.RL_LOG_EVENT,
        A.RL_STEP,
        max_records=_log_batch_size(),
        max_bytes=spool.segment_bytes,
    )


def _log_batch_size() -> int:
    """Records per logs request: the SDK batch processor's setting, which the direct writer keeps too."""
    raw = os.environ.get(OTEL_BLRP_MAX_EXPORT_BATCH_SIZE, "")
    try:
        return max(1, int(raw)) if raw.strip() else _SDK_LOG_BATCH_SIZE
    except ValueError:  # the SDK's processor says so itself when it reads the same variable
        return _SDK_LOG_BATCH_SIZE


def _spooled(spool: Spool, exporters: tuple[Any, MetricExporter, Any]) -> tuple[tuple[Any, MetricExporter, Any], Spool | None]:
    """The SDK OTLP exporters behind the spool: a transport with each one's settings, one sender thread each."""
    span_exporter, metric_exporter, log_exporter = exporters
    try:
        transports = [transport_for(e, s) for e, s in ((span_exporter, TRACES), (metric_exporter, METRICS), (log_exporter, LOGS))]
    except (TypeError, ValueError) as exc:  # exporters otel-rl did not build: no spool, say so
        logger.warning("otel-rl: the disk spool cannot stand in for these OTLP exporters (%s); exporting without it", exc)
        spool.close()
        return exporters, None
    for transport in transports:
        spool.attach(transport.signal, transport)
    return (
        SpoolingSpanExporter(spool, span_exporter),
        SpoolingMetricExporter(spool, metric_exporter),
        SpoolingLogExporter(spool, log_exporter),
    ), spool


def utf8_span(span: ReadableSpan, on_bad: OnBadText) -> ReadableSpan:
    """``span`` itself, or a copy with each text UTF-8 cannot encode escaped (a sample id from a file
    name): the encoders of every destination would otherwise fail the whole batch it is in."""
    if not span.events and span.name.isascii() and plain_ascii(span.attributes):
        return span  # nearly every span: one pass over its attributes
    where = f"the {span.name} span's attribute"
    attributes = clean_mapping(span.attributes or {}, where, on_bad)
    events = [(event, clean_mapping(event.attributes or {}, where, on_bad)) for event in span.events]
    if attributes is None and encodes(span.name) and all(fixed is None and encodes(e.name) for e, fixed in events):
        return span
    return ReadableSpan(
        name=clean_text(span.name, "a span's name", on_bad),
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes if attributes is not None else span.attributes,
        events=[
            Event(clean_text(e.name, "an event's name", on_bad), fixed if fixed is not None else e.attributes, e.timestamp)
            for e, fixed in events
        ],
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
