"""Build the SDK providers (traces, metrics, logs) and their exporters from a TelemetryConfig.

No endpoint configured: everything goes to OTLP-JSON lines in the run folder (the collector's
file exporter format), so nothing is lost and it can be pushed to a collector later. With an
endpoint: OTLP over gRPC or HTTP/protobuf; `exporters=("otlp", "file")` does both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from ._aggregation import BulkHistograms, MergingMetricExporter
from ._config import TelemetryConfig
from ._runfolder import LOGS_FILE, METRICS_FILE, TRACES_FILE, rank_file_name
from ._version import __version__
from .exporters.otlp_json import OtlpJsonLogExporter, OtlpJsonMetricExporter, OtlpJsonSpanExporter

SCOPE_NAME = "otel_rl"


@dataclass
class Providers:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    logger_provider: LoggerProvider
    destinations: list[str] = field(default_factory=list)
    span_processors: list[Any] = field(default_factory=list)
    shared_tracer_provider: bool = False  # handed in by the caller, who shuts it down


def _otlp_exporters(config: TelemetryConfig) -> tuple[Any, MetricExporter, Any]:
    endpoint = (config.endpoint or "").rstrip("/")
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        kwargs = {"endpoint": endpoint} if endpoint else {}
        return OTLPSpanExporter(**kwargs), OTLPMetricExporter(**kwargs), OTLPLogExporter(**kwargs)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

    if not endpoint:  # the exporters read OTEL_EXPORTER_OTLP_*_ENDPOINT themselves
        return HttpSpanExporter(), HttpMetricExporter(), HttpLogExporter()
    # The base endpoint gets the per-signal paths, as OTEL_EXPORTER_OTLP_ENDPOINT does.
    return (
        HttpSpanExporter(endpoint=f"{endpoint}/v1/traces"),
        HttpMetricExporter(endpoint=f"{endpoint}/v1/metrics"),
        HttpLogExporter(endpoint=f"{endpoint}/v1/logs"),
    )


def build_providers(config: TelemetryConfig, resource: Resource, histograms: BulkHistograms,
                    extra_log_exporters: list[Any] | None = None, *, tracer_provider: Any = None) -> Providers:
    """``tracer_provider``: an SDK TracerProvider the program already has (e.g. its framework's
    own tracing); otel-rl's span processors join it instead of a second provider."""
    shared = tracer_provider is not None
    if shared and not callable(getattr(tracer_provider, "add_span_processor", None)):
        raise TypeError(f"otel_rl.init(tracer_provider=...) needs an SDK TracerProvider (opentelemetry.sdk.trace), "
                        f"got {type(tracer_provider).__name__}; leave it out to let otel-rl create one")
    if not shared:
        tracer_provider = TracerProvider(resource=resource)
    span_processors: list[Any] = []
    logger_provider = LoggerProvider(resource=resource)
    for exporter in extra_log_exporters or ():  # e.g. the trackers: fed off-thread by the batch processor
        logger_provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    scope = InstrumentationScope(SCOPE_NAME, __version__)
    readers = []
    destinations = []
    interval_ms = config.metric_export_interval_s * 1000.0

    def add(span_exporter: Any, metric_exporter: MetricExporter, log_exporter: Any) -> None:
        span_processors.append(BatchSpanProcessor(span_exporter))
        tracer_provider.add_span_processor(span_processors[-1])
        logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
        readers.append(PeriodicExportingMetricReader(
            MergingMetricExporter(metric_exporter, histograms, resource, scope), export_interval_millis=interval_ms))

    if config.file_enabled:
        run_dir = Path(str(config.run_dir))
        run_dir.mkdir(parents=True, exist_ok=True)
        files = [run_dir / rank_file_name(name, config.rank) for name in (TRACES_FILE, METRICS_FILE, LOGS_FILE)]
        add(OtlpJsonSpanExporter(files[0]), OtlpJsonMetricExporter(files[1]), OtlpJsonLogExporter(files[2]))
        destinations.append(f"files in {run_dir}")
    if config.otlp_enabled:
        add(*_otlp_exporters(config))
        destinations.append(f"OTLP {config.protocol} to {config.endpoint or 'the OTEL_EXPORTER_OTLP_*_ENDPOINT'}")
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return Providers(tracer_provider, meter_provider, logger_provider, destinations, span_processors, shared)
