"""A counting OTLP/HTTP receiver on 127.0.0.1 for the fault, fork and TLS tests.

It decodes the real OTLP protobuf requests (gzip or plain, as the collector and the SDK send them) and
keeps every span, log record and metric data point, so a test can compare what arrived with what
was emitted, exactly, and spot duplicates. Optional: TLS (an ``ssl.SSLContext``), a required
header (401 without it), and a forced status code (to act as a collector that refuses data).
"""

from __future__ import annotations

import gzip
import ssl
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

REQUESTS = {
    "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
    "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
}


def _any_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


@dataclass
class Received:
    lock: threading.Lock = field(default_factory=threading.Lock)
    spans: list[tuple[str, str, str, dict]] = field(default_factory=list)  # trace id, span id, name, attributes
    logs: list[tuple[str, dict, Any, dict]] = field(default_factory=list)  # event name, attributes, body, resource
    points: list[tuple[str, tuple, int, Any]] = field(default_factory=list)  # metric, attrs, time_unix_nano, value
    span_resources: list[dict] = field(default_factory=list)  # the resource of spans[i]
    span_starts: list[int] = field(default_factory=list)  # the start_time_unix_nano of spans[i]
    point_resources: list[dict] = field(default_factory=list)  # the resource of points[i]
    point_bounds: list[tuple[float, ...] | None] = field(default_factory=list)  # a histogram point's bucket bounds
    requests: Counter = field(default_factory=Counter)
    headers: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)  # raw bytes as received (for secret scans)

    def add(self, path: str, request: Any) -> None:
        with self.lock:
            self.requests[path] += 1
            if path == "/v1/traces":
                for rs in request.resource_spans:
                    resource = _attrs(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            self.spans.append((s.trace_id.hex(), s.span_id.hex(), s.name, _attrs(s.attributes)))
                            self.span_resources.append(resource)
                            self.span_starts.append(s.start_time_unix_nano)
            elif path == "/v1/logs":
                for rl in request.resource_logs:
                    resource = _attrs(rl.resource.attributes)
                    for sl in rl.scope_logs:
                        for r in sl.log_records:
                            self.logs.append((r.event_name, _attrs(r.attributes), _any_value(r.body), resource))
            else:
                for rm in request.resource_metrics:
                    resource = _attrs(rm.resource.attributes)
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            kind = m.WhichOneof("data")
                            for p in getattr(m, kind).data_points:
                                value = (
                                    p.as_double
                                    if kind in ("gauge", "sum") and p.WhichOneof("value") == "as_double"
                                    else (p.as_int if kind in ("gauge", "sum") else p.count)
                                )
                                attrs = tuple(sorted((k, str(v)) for k, v in _attrs(p.attributes).items()))
                                self.points.append((m.name, attrs, p.time_unix_nano, value))
                                self.point_resources.append(resource)
                                self.point_bounds.append(tuple(p.explicit_bounds) if kind == "histogram" else None)

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"traces": len(self.spans), "logs": len(self.logs), "metrics": len(self.points)}

    def events(self, name: str) -> list[tuple[str, dict, Any, dict]]:
        with self.lock:
            return [r for r in self.logs if r[0] == name]


class OtlpSink:
    """``with OtlpSink() as sink: sink.endpoint`` -> 'http://127.0.0.1:PORT'; ``sink.received``."""

    def __init__(
        self,
        *,
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        require_header: tuple[str, str] | None = None,
        status: Callable[[str], int | None] | None = None,
    ) -> None:
        self.received = Received()
        self._tls = tls
        self._require = require_header
        self._status = status
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with sink.received.lock:
                    sink.received.headers.append({k.lower(): v for k, v in self.headers.items()})
                    sink.received.bodies.append(body)
                if sink._require is not None and self.headers.get(sink._require[0]) != sink._require[1]:
                    return self._reply(401, b"")
                forced = sink._status(self.path) if sink._status is not None else None
                if forced is not None and forced != 200:
                    return self._reply(forced, b"")
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                types = REQUESTS.get(self.path)
                if types is None:
                    return self._reply(404, b"")
                request = types[0]()
                request.ParseFromString(body)
                sink.received.add(self.path, request)
                self._reply(200, types[1]().SerializeToString())

            def _reply(self, code: int, payload: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        scheme = "https" if tls is not None else "http"
        self.endpoint = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> OtlpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def wait_for(self, ok: Callable[[Received], bool], timeout_s: float, what: str = "data") -> None:
        end = time.monotonic() + timeout_s
        while not ok(self.received):
            if time.monotonic() > end:
                raise AssertionError(f"{what} did not arrive within {timeout_s:.0f} s; got {self.received.counts()}")
            time.sleep(0.05)


class GrpcSink:
    """The same counting receiver over OTLP/gRPC, optionally with TLS (PEM key and certificate) and a
    required metadata entry (UNAUTHENTICATED without it)."""

    def __init__(self, *, tls: tuple[bytes, bytes] | None = None, require_metadata: tuple[str, str] | None = None) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        self.received = Received()
        sink = self

        def servicer(base: type, path: str, response: type) -> Any:
            class Servicer(base):  # type: ignore[misc, valid-type]
                def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's naming
                    metadata = dict(context.invocation_metadata())
                    with sink.received.lock:
                        sink.received.headers.append(metadata)
                    if require_metadata is not None and metadata.get(require_metadata[0]) != require_metadata[1]:
                        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong credentials")
                    sink.received.add(path, request)
                    return response()

            return Servicer()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            servicer(trace_service_pb2_grpc.TraceServiceServicer, "/v1/traces", trace_service_pb2.ExportTraceServiceResponse), self._server
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            servicer(metrics_service_pb2_grpc.MetricsServiceServicer, "/v1/metrics", metrics_service_pb2.ExportMetricsServiceResponse),
            self._server,
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
            servicer(logs_service_pb2_grpc.LogsServiceServicer, "/v1/logs", logs_service_pb2.ExportLogsServiceResponse), self._server
        )
        if tls is not None:
            credentials = grpc.ssl_server_credentials([tls])
            self.port = self._server.add_secure_port("127.0.0.1:0", credentials)
            self.endpoint = f"https://127.0.0.1:{self.port}"
        else:
            self.port = self._server.add_insecure_port("127.0.0.1:0")
            self.endpoint = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GrpcSink:
        self._server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.stop(grace=None)
