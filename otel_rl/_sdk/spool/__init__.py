"""The disk spool in front of OTLP: a signal's batches written to rotating files first
(``files``, ``store``), delivered by a background thread with retries and back-off (``delivery``)
over HTTP or gRPC (``transports``; ``plain_http`` for a plaintext collector URL), fed by the spooling exporters the providers install
(``exporters``); ``otel-rl push`` sends what is left. May import ``settings`` and ``otlp``.
"""
