"""The in-process runtime behind the public API: configuration, the telemetry facade's mechanics,
the off-thread pipeline, aggregation, the SDK providers and their disk spool, and the probes.

Data path: ``init()`` (config) -> ``Telemetry.log()`` / spans (telemetry) -> the worker (pipeline:
keys, aggregation) -> the SDK providers (providers, spool) -> ``otel_rl.exporters`` and
``otel_rl.trackers``. Nothing here is public API: ``otel_rl/__init__.py`` re-exports what is.
"""
