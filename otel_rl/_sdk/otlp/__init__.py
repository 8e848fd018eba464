"""OTLP as the SDK's own variables define it: endpoints, headers, protocol, compression and
TLS files per signal, and the SDK exporters built from them (``settings``); every use of the
SDK's private modules, in one place and checked against the installed SDK (``sdk_compat``); metric
exports as OTLP requests with each series' attributes encoded once (``metrics_encoder``); spans as
the bytes of an OTLP request, written directly (``spans_encoder``). May import ``settings``.
"""
