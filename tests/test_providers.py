"""OTLP export over HTTP/protobuf and gRPC to receivers on 127.0.0.1 that decode the real OTLP protobufs.

These check otel-rl's side (endpoints, protocols, what is sent); the end-to-end tests with a real
collector and backends live in tests/e2e.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otel_rl.semconv import names as N

REQUESTS = {
    "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
    "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
}


class Received:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[str] = []
        self.metrics: set[str] = set()
        self.events: list[str] = []
        self.resource_attrs: dict[str, str] = {}

    def add(self, request) -> None:
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                for rs in request.resource_spans:
                    self.resource_attrs.update({kv.key: kv.value.string_value for kv in rs.resource.attributes})
                    self.spans += [s.name for ss in rs.scope_spans for s in ss.spans]
            elif isinstance(request, metrics_service_pb2.ExportMetricsServiceRequest):
                self.metrics |= {m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
            else:
                self.events += [r.event_name for rl in request.resource_logs for sl in rl.scope_logs for r in sl.log_records]


def _run_training(make_telemetry, **options):
    tel = make_telemetry(**options)
    with tel.step(0):
        with tel.stage("generate", cluster="actor_infer"):
            pass
        tel.log({"actor/pg_loss": 0.5, "critic/rewards/mean": 1.0})
    tel.shutdown()
    return tel


def test_otlp_http_protobuf_sends_traces_metrics_and_events(make_telemetry):
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            request_type, response_type = REQUESTS[self.path]
            body = self.rfile.read(int(self.headers["Content-Length"]))
            assert self.headers["Content-Type"] == "application/x-protobuf"
            request = request_type()
            request.ParseFromString(body)
            received.add(request)
            payload = response_type().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        tel = _run_training(make_telemetry, endpoint=endpoint, protocol="http/protobuf", service_name="http-test")
    finally:
        server.shutdown()
        server.server_close()
    assert tel.run_dir is None  # an endpoint replaces the run-folder default
    assert sorted(received.spans) == ["rl.generate", "rl.step"]
    assert {"rl.loss", "rl.reward", "rl.stage.duration", "rl.step.duration"} <= received.metrics
    assert received.events == [N.RL_LOG_EVENT]
    assert received.resource_attrs["service.name"] == "http-test"


def test_otlp_grpc_and_the_file_default_together(make_telemetry):
    received = Received()

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 - gRPC API
            received.add(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            received.add(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            received.add(request)
            return logs_service_pb2.ExportLogsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        tel = _run_training(make_telemetry, endpoint=f"http://127.0.0.1:{port}", protocol="grpc", exporters="otlp,file")
    finally:
        server.stop(grace=None)
    assert sorted(received.spans) == ["rl.generate", "rl.step"]
    assert "rl.loss" in received.metrics and received.events == [N.RL_LOG_EVENT]
    assert (tel.run_dir / "traces.jsonl").stat().st_size > 0  # and the file copy, as asked


@pytest.mark.parametrize(
    ("options", "file", "otlp"),
    [
        ({}, True, False),
        ({"endpoint": "http://127.0.0.1:4318"}, False, True),
        ({"endpoint": "http://127.0.0.1:4318", "exporters": "otlp,file"}, True, True),
        ({"exporters": "none"}, False, False),
    ],
)
def test_destinations_follow_the_endpoint_and_exporters(options, file, otlp):
    from otel_rl._sdk.settings.config import resolve_config

    config = resolve_config(options, environ={})
    assert (config.file_enabled, config.otlp_enabled) == (file, otlp)


def test_a_short_metric_interval_never_ticks_before_the_provider_owns_its_readers(make_telemetry, silent_peer, caplog):
    """A reader's timer starts when it is made; the run folder's reader used to be made before the
    OTLP exporters and the spool were set up, and a short interval ticked in between (the SDK warns)."""
    with caplog.at_level(logging.WARNING, logger="opentelemetry.sdk.metrics"):
        make_telemetry(exporters="otlp,file", endpoint=silent_peer, metric_export_interval_s=0.05)
        time.sleep(0.05)
    assert not [r.getMessage() for r in caplog.records if "until it is registered" in r.getMessage()]
