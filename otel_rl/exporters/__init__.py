"""Embedded default exporters of otel-rl.

The run folder files (``traces.jsonl``, ``metrics.jsonl``, ``logs.jsonl``) are OTLP/JSON lines,
the format of the OpenTelemetry Collector's ``file`` exporter, written by the classes below.
"""

from otel_rl.exporters.otlp_json import OtlpJsonLogExporter, OtlpJsonMetricExporter, OtlpJsonSpanExporter, to_otlp_json

__all__ = ["OtlpJsonLogExporter", "OtlpJsonMetricExporter", "OtlpJsonSpanExporter", "to_otlp_json"]
