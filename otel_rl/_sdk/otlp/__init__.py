"""OTLP as the SDK's own variables define it: endpoints, headers, protocol, compression and
TLS files per signal, and the SDK exporters built from them (``settings``); every use of the
SDK's private modules, in one place and checked against the installed SDK (``sdk_compat``); metric
exports (``metrics_encoder``) and spans (``spans_encoder``) as the bytes of OTLP requests, written
directly in the protobuf wire format (``otel_rl.exporters.protobuf_wire``); the SDK's warnings
about attribute values, said once per key (``attribute_warnings``). May import ``settings``.
"""
