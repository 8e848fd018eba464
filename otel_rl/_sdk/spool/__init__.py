"""The disk spool in front of OTLP: a signal's batches written to rotating files first
(``files``, ``store``), delivered by a background thread with retries and back-off (``delivery``)
over HTTP or gRPC (``transports``), fed by the spooling exporters the providers install
(``exporters``); ``otel-rl push`` sends what is left. May import ``settings`` and ``otlp``.
"""
