"""Every use of the OpenTelemetry SDK's private modules and attributes by otel-rl's runtime, in one place.

Private names can move in any SDK release, so each one is named here once, and the one the disk
spool depends on sits behind a check of the installed opentelemetry-exporter-otlp version:

* ``encode_logs`` (``opentelemetry.exporter.otlp.proto.common._log_encoder``): the SDK has no
  public encoder of log records into an ``ExportLogsServiceRequest``, and the spool stores that
  request. On an unsupported version the spool is turned off (warned once): OTLP exports then go
  straight through the SDK exporters, as with ``OTEL_RL_SPOOL_MAX_BYTES=0``.
* the preferred temporality and aggregation of a metric exporter: ``MetricExporter`` keeps them in
  private attributes (the SDK's metric reader reads them there), and a wrapper around an exporter
  must declare the same preferences; without them a wrapper declares the SDK defaults.
* the logs SDK (``opentelemetry.sdk._logs``) and the OTLP log exporters (``..._log_exporter``),
  which have no public module yet.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
from collections.abc import Callable
from importlib import metadata
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider, LogRecordLimits
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor

__all__ = [
    "BatchLogRecordProcessor",
    "LogRecordExportResult",
    "LogRecordExporter",
    "LogRecordLimits",
    "LoggerProvider",
    "SUPPORTED_EXPORTER_VERSIONS",
    "SimpleLogRecordProcessor",
    "installed_exporter_version",
    "log_encoder",
    "log_request_parts",
    "metric_preferences",
    "otlp_log_exporter_class",
    "unsupported_reason",
]

logger = logging.getLogger("otel_rl")

#: The opentelemetry-exporter-otlp versions whose internals the spool was checked against: [lowest, first unsupported).
SUPPORTED_EXPORTER_VERSIONS: tuple[tuple[int, int], tuple[int, int]] = ((1, 27), (2, 0))
# The meta package first; where only its parts are installed, the one that holds the log encoder.
_EXPORTER_DISTRIBUTIONS = ("opentelemetry-exporter-otlp", "opentelemetry-exporter-otlp-proto-common")
_LOG_ENCODER_MODULE = "opentelemetry.exporter.otlp.proto.common._log_encoder"
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)")


def installed_exporter_version() -> str | None:
    """The installed opentelemetry-exporter-otlp version (or of its proto-common part); None if unknown."""
    for name in _EXPORTER_DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _supported_range() -> str:
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_EXPORTER_VERSIONS
    return f">={low_major}.{low_minor}, <{high_major}.{high_minor}"


def unsupported_reason(version: str | None) -> str | None:
    """Why the spool cannot use opentelemetry-exporter-otlp ``version``; None when it can.

    An unknown version (no package metadata, e.g. a vendored copy) passes: :func:`log_encoder`
    still checks that the encoder is where the spool expects it."""
    if version is None:
        return None
    match = _VERSION_RE.match(version)
    if match is None:
        return f"opentelemetry-exporter-otlp {version} is not a version otel-rl can read"
    low, high = SUPPORTED_EXPORTER_VERSIONS
    if not low <= (int(match.group(1)), int(match.group(2))) < high:
        return f"opentelemetry-exporter-otlp {version} is outside the versions the spool supports ({_supported_range()})"
    return None


@functools.cache
def log_encoder() -> Callable[[Any], Any] | None:
    """The SDK's encoder of log records into an ``ExportLogsServiceRequest``, or None (warned once per
    process) when the installed exporter version is unsupported or the encoder is not where expected."""
    version = installed_exporter_version()
    reason = unsupported_reason(version)
    if reason is None:
        try:
            encoder = importlib.import_module(_LOG_ENCODER_MODULE).encode_logs
        except (ImportError, AttributeError) as exc:
            reason = f"opentelemetry-exporter-otlp {version or '(version unknown)'} has no {_LOG_ENCODER_MODULE}.encode_logs ({exc})"
        else:
            if callable(encoder):
                return encoder
            reason = f"{_LOG_ENCODER_MODULE}.encode_logs is not a function"
    logger.warning(
        "otel-rl: the disk spool is off: %s. OTLP exports go straight to the collector, and what fails to "
        "export during an outage is lost; install opentelemetry-exporter-otlp%s to use the spool",
        reason,
        _supported_range().replace(" ", ""),
    )
    return None


def metric_preferences(exporter: Any) -> tuple[dict[type, Any] | None, dict[type, Any] | None]:
    """The preferred temporality and aggregation a metric exporter declared (None: the SDK defaults)."""
    return getattr(exporter, "_preferred_temporality", None), getattr(exporter, "_preferred_aggregation", None)


def otlp_log_exporter_class(protocol: str) -> type:
    """The SDK's OTLP log exporter class for ``protocol`` (grpc or http/protobuf)."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    return OTLPLogExporter


def log_request_parts(encode_logs: Callable[[Any], Any], resource: Any, scope: Any) -> tuple[bytes, bytes, str, str]:
    """The serialized ``Resource`` and ``InstrumentationScope`` and the two schema URLs that
    ``encode_logs`` (the SDK's encoder) writes for records of ``resource`` and ``scope``: read off
    the request it makes for one empty record, so the direct records carry exactly the same."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    captured: list[Any] = []

    class _Capture(LogRecordExporter):  # type: ignore[misc]
        def export(self, batch: Any) -> Any:
            captured.extend(batch)
            return LogRecordExportResult.SUCCESS

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return True

        def shutdown(self) -> None:
            pass

    provider = LoggerProvider(resource=resource)
    provider.add_log_record_processor(SimpleLogRecordProcessor(_Capture()))
    provider.get_logger(scope.name, scope.version, scope.schema_url, scope.attributes).emit(body="")
    provider.shutdown()
    request = ExportLogsServiceRequest.FromString(encode_logs(captured).SerializeToString())
    resource_logs = request.resource_logs[0]
    scope_logs = resource_logs.scope_logs[0]
    return (
        resource_logs.resource.SerializeToString(),
        scope_logs.scope.SerializeToString(),
        resource_logs.schema_url,
        scope_logs.schema_url,
    )
