"""The bridge's HTTP side: OTLP/HTTP requests read, counted, decoded and queued (see
:mod:`otel_rl.bridge.server` for the answers it gives).

A request takes one of the bridge's request slots before its body is read
(:mod:`otel_rl.bridge.admission`: one address gets a share only, 429 beyond), and its body must
keep arriving: no byte for ``body_timeout_s``, or a body slower than that plus one second per
64 KiB, is answered 408 and the connection closed, so a sender that stops mid-body frees its
slot in seconds; a body that arrives slowly while other senders wait for a slot is cut off for
them (:mod:`otel_rl.bridge.admission`). Connections are counted and capped
(:mod:`otel_rl.bridge.connections`): each holds a thread. Senders that reset their connection are counted and summed up in the log
(:mod:`otel_rl.bridge.disconnects`), not reported with a traceback each.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_rl.bridge.admission import Slot
from otel_rl.bridge.disconnects import is_disconnect
from otel_rl.bridge.intake import Intake
from otel_rl.bridge.limits import chunk_size
from otel_rl.bridge.request_decode import MAX_BODY_BYTES, MAX_JSON_BODY_BYTES, BadRequest, QueueFull, decode_request, inflate

__all__ = ["RETRY_AFTER_S", "make_http_server"]

logger = logging.getLogger("otel_rl")

RETRY_AFTER_S = 1
_MIN_BODY_RATE = 64 << 10  # bytes per second a body may take beyond body_timeout_s (a slow link, not a trickle)
_ANSWER_TIMEOUT_S = 5.0  # writing an answer to a sender that does not read it
_GRPC_INVALID_ARGUMENT, _GRPC_RESOURCE_EXHAUSTED, _GRPC_UNAVAILABLE, _GRPC_UNAUTHENTICATED = 3, 8, 14, 16
_MEDIA_TYPES = ("application/x-protobuf", "application/protobuf", "application/json")


class _BodyStalled(Exception):
    """The body stopped arriving (or crawled) past body_timeout_s."""


def _message_types() -> dict[str, tuple[Any, Any]]:
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    return {
        "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
        "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
        "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    }


def make_http_server(host: str, port: int, intake: Intake, stats: Callable[[], dict[str, Any]]) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) that feeds ``intake``; ``stats()`` answers ``GET /stats``."""

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128  # the listen backlog: socketserver's 5 drops connections under a flood (1 s SYN retries)
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def process_request(self, request: Any, client_address: Any) -> None:
            if not intake.connections.admit(str(client_address[0]), request):  # a thread per connection: capped
                intake.count("connections_refused")
                self.shutdown_request(request)
                return
            super().process_request(request, client_address)

        def shutdown_request(self, request: Any) -> None:
            intake.connections.close(request)
            super().shutdown_request(request)

        def handle_error(self, request: Any, client_address: Any) -> None:
            exc = sys.exc_info()[1]
            if is_disconnect(exc):  # the sender went away: counted and summed up, no traceback
                intake.note_disconnect("reset" if isinstance(exc, ConnectionError) else "timed out")
            else:
                super().handle_error(request, client_address)

    class Handler(_Handler):
        def stats(self) -> dict[str, Any]:
            return stats()

    Handler.intake = intake
    return Server((host, port), Handler)


class _Handler(BaseHTTPRequestHandler):
    intake: Intake
    protocol_version = "HTTP/1.1"  # keep-alive: collectors reuse their connections
    server_version = "otel-rl-bridge"
    sys_version = ""
    timeout = 60  # waiting for a request line and headers (a keep-alive connection's idle time)
    _slot: Slot  # the slot of the request whose body is being read
    _answering_slot: Slot | None = None  # the slot the request being answered holds, given back by _send
    _types: dict[str, tuple[Any, Any]] | None = None

    def stats(self) -> dict[str, Any]:
        """The counters ``GET /stats`` answers with (the server's subclass supplies them)."""
        raise NotImplementedError

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("otel-rl bridge: %s %s", self.address_string(), format % args)

    # -- answering --------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        # The slot is free before the answer leaves: a sender that posts again on reading it finds its share back.
        if self._answering_slot is not None:
            self.intake.slots.release(self._answering_slot)
            self._answering_slot = None
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except (ConnectionError, TimeoutError):  # the sender left (or reads nothing): nothing to answer
            self.close_connection = True
            self.intake.note_disconnect("left before its answer")

    def _send_status(self, status: int, code: int, message: str, as_json: bool, headers: Mapping[str, str] | None = None) -> None:
        from google.rpc import status_pb2

        if as_json:
            self._send(status, json.dumps({"code": code, "message": message}).encode(), "application/json", headers)
        else:
            self._send(status, status_pb2.Status(code=code, message=message).SerializeToString(), "application/x-protobuf", headers)

    def _reply(self, response: Any, as_json: bool) -> None:
        if as_json:
            self._send(200, b"{}", "application/json")
        else:
            self._send(200, response.SerializeToString(), "application/x-protobuf")

    # -- requests ---------------------------------------------------------------------------------

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:  # back to waiting for the next request: its connection may give its place up
            self.intake.connections.busy(self.connection, False)

    def parse_request(self) -> bool:
        self.intake.connections.busy(self.connection, True)  # a request line arrived: handled, not idle
        return super().parse_request()

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/stats" and not self.intake.authorized(self.headers.get("Authorization")):
            self._send(401, b"missing or wrong bearer token\n", "text/plain; charset=utf-8", {"WWW-Authenticate": "Bearer"})
        elif path == "/stats":
            self._send(200, json.dumps(self.stats()).encode(), "application/json")
        else:
            self._send(404, b"not found: GET /healthz, GET /stats, POST /v1/logs, /v1/metrics, /v1/traces\n", "text/plain; charset=utf-8")

    def do_POST(self) -> None:  # noqa: N802
        intake = self.intake
        path = self.path.split("?", 1)[0].rstrip("/")
        content_type = (self.headers.get("Content-Type") or "application/x-protobuf").split(";", 1)[0].strip().lower()
        as_json = content_type == "application/json"
        types = _Handler._types or _message_types()
        _Handler._types = types
        if path not in types:
            self.close_connection = True
            self._send(404, b"not found: POST /v1/logs, /v1/metrics or /v1/traces\n", "text/plain; charset=utf-8")
            return
        intake.count("requests")
        if not intake.authorized(self.headers.get("Authorization")):
            intake.count("unauthorized")
            self.close_connection = True  # the body is left unread
            self._send_status(401, _GRPC_UNAUTHENTICATED, "missing or wrong bearer token", as_json, {"WWW-Authenticate": "Bearer"})
            return
        client = str(self.client_address[0])
        admission = intake.slots.acquire(client)  # before the body is read: a flood costs no memory
        if not admission.admitted:
            intake.count("busy_responses")
            if admission.per_client:
                intake.count("client_share_refusals")
            self.close_connection = True
            self._send_status(429, _GRPC_UNAVAILABLE, f"{admission.why}; retry later", as_json, {"Retry-After": str(RETRY_AFTER_S)})
            return
        slot = admission.slot
        assert slot is not None
        connection = self.connection
        slot.cut = lambda: connection.shutdown(socket.SHUT_RD)
        self._answering_slot = slot
        try:
            self._post(path, types, content_type, as_json, slot)
        finally:
            self._answering_slot = None
            intake.slots.release(slot)

    def _post(self, path: str, types: Mapping[str, tuple[Any, Any]], content_type: str, as_json: bool, slot: Slot) -> None:
        intake = self.intake
        try:
            try:
                body = self._read_body(slot)
            except _BodyStalled as exc:
                intake.count("bodies_cut_off" if slot.was_cut else "stalled_bodies")
                intake.note_disconnect("stalled body")
                self.close_connection = True
                self.connection.settimeout(_ANSWER_TIMEOUT_S)
                raise BadRequest(HTTPStatus.REQUEST_TIMEOUT, str(exc)) from None
            if content_type not in _MEDIA_TYPES:
                raise BadRequest(
                    HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                    f"unsupported Content-Type {content_type!r}: send application/x-protobuf or application/json",
                )
            encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            request_type, response_type = types[path]
            with intake.decoding:  # one request inflated, decoded and queued at a time: bounds the peak memory
                body = inflate(body, encoding, MAX_JSON_BODY_BYTES if as_json else MAX_BODY_BYTES)
                why, queued = None, True
                if path != "/v1/traces":  # traces are accepted and dropped: trackers take no spans
                    message, reserved, counts = decode_request(request_type, body, as_json, intake.limits, intake.reserve, intake.release)
                    del body
                    why = intake.refusal(path, message, counts)
                    if why is not None:  # never acknowledge what would be dropped: 507 is not retried as it is
                        intake.release(reserved)
                    else:
                        queued = intake.submit("logs" if path == "/v1/logs" else "metrics", message, reserved, counts)
                    del message  # freed before the answer is written, not after
        except BadRequest as exc:
            intake.count("bad_requests")
            logger.info("otel-rl bridge: %s %s: %s", path, int(exc.status), exc)
            self._send_status(int(exc.status), _GRPC_INVALID_ARGUMENT, str(exc), as_json)
            return
        except QueueFull:
            intake.count("busy_responses")
            self._send_status(
                503, _GRPC_UNAVAILABLE, "the bridge's trackers are behind; retry later", as_json, {"Retry-After": str(RETRY_AFTER_S)}
            )
            return
        if why is not None:
            intake.count("requests_over_max_runs")
            self._send_status(507, _GRPC_RESOURCE_EXHAUSTED, why, as_json)
            return
        if not queued:
            intake.count("busy_responses")
            self._send_status(503, _GRPC_UNAVAILABLE, "the bridge is stopping; retry later", as_json, {"Retry-After": str(RETRY_AFTER_S)})
            return
        self._reply(response_type(), as_json)

    # -- the body, within its deadline -----------------------------------------------------------

    def _read_body(self, slot: Slot) -> bytes:
        self._slot = slot
        self._body_started, self._body_received = time.monotonic(), 0
        slot.reading_since, slot.received = self._body_started, 0
        try:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                return self._read_chunked()
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self.close_connection = True
                raise BadRequest(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
            if length < 0 or length > MAX_BODY_BYTES:
                self.close_connection = True
                raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes: send smaller batches")
            return self._read_exactly(length) if length else b""
        finally:
            slot.reading_since = None
            if not self.close_connection:
                self.connection.settimeout(self.timeout)  # back to the keep-alive wait

    def _read_chunked(self) -> bytes:
        chunks, total = [], 0
        while True:
            line = self._timed(self.rfile.readline, 1024)
            try:
                size = chunk_size(line)  # hex digits only: int(x, 16) takes "-1", and read(-1) reads to EOF
            except ValueError:
                self.close_connection = True
                raise BadRequest(HTTPStatus.BAD_REQUEST, "malformed chunked body") from None
            if size == 0:
                while self._timed(self.rfile.readline, 1024) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                self.close_connection = True
                raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes: send smaller batches")
            chunks.append(self._read_exactly(size))
            self._timed(self.rfile.readline, 1024)

    def _read_exactly(self, size: int) -> bytes:
        parts, got = [], 0
        while got < size:
            part = self._timed(self.rfile.read1, min(size - got, 1 << 20))
            if not part:  # the sender closed mid-body: a truncated body is not a request
                self.close_connection = True
                raise BadRequest(HTTPStatus.BAD_REQUEST, f"body ended after {got} of {size} bytes")
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def _timed(self, read: Any, size: int) -> bytes:
        """One read of the body, within what is left of its deadline (:class:`_BodyStalled` past it)."""
        quiet_s = self.intake.body_timeout_s
        left = self._body_started + quiet_s + self._body_received / _MIN_BODY_RATE - time.monotonic()
        if left <= 0:
            self.close_connection = True
            raise _BodyStalled(
                f"the body arrived slower than the bridge takes ({self._body_received} bytes in "
                f"{time.monotonic() - self._body_started:.1f} s; body_timeout_s is {quiet_s:g}): send it at once"
            )
        self.connection.settimeout(min(left, quiet_s))
        try:
            data = read(size)
        except TimeoutError:
            self.close_connection = True
            raise _BodyStalled(
                f"the body stopped arriving after {self._body_received} bytes (no byte for "
                f"{min(left, quiet_s):.1f} s; body_timeout_s is {quiet_s:g}): send it at once"
            ) from None
        if not data and self._slot.was_cut:
            self.close_connection = True
            raise _BodyStalled(
                f"the body was cut off after {self._body_received} bytes in {time.monotonic() - self._body_started:.1f} s: it "
                f"arrived slower than {self.intake.slots.cut_below_rate >> 10} KiB/s while other senders waited for the bridge: "
                "send it at once, or in smaller batches"
            )
        self._body_received += len(data)
        self._slot.received = self._body_received
        return data
