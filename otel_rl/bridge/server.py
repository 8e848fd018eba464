"""The bridge server: :class:`TrackerBridge` receives OTLP/HTTP on its own threads, queues each
decoded request, and hands it to one worker thread that feeds the runs' trackers
(:mod:`otel_rl.bridge.runs`).

Request handling follows OTLP/HTTP: protobuf or JSON bodies, gzip / deflate or none, at most
64 MiB on the wire and after decompression (413), unknown encodings 415, bodies that do not
decode 400 with a ``google.rpc.Status`` (counted, never fatal), and 503 with ``Retry-After``
when the queue of received requests is full, so a slow tracker slows the senders down instead
of growing memory.

Hostile input costs bounded memory (:mod:`otel_rl.bridge.limits`): at most
``max_requests_in_flight`` requests are read at once (beyond it 429 with ``Retry-After``,
before the body is read), a body is counted on the wire (messages, resources, log records, data
points: 413 past a limit) before it is decoded, one body is decoded at a time, and its estimated
decoded size is reserved in the queue first (503 when it does not fit). With
``OTEL_RL_BRIDGE_TOKEN`` set, POSTs need ``Authorization: Bearer <token>`` (401 otherwise).
"""

from __future__ import annotations

import atexit
import hmac
import importlib
import json
import logging
import os
import socket
import sys
import threading
import time
import weakref
import zlib
from collections import deque
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

from otel_rl import environment_variables as ENV
from otel_rl.bridge.config import BridgeConfig, parse_listen
from otel_rl.bridge.limits import Malformed, RequestLimits, RequestTooBig, chunk_size, count_json_objects, scan_otlp
from otel_rl.bridge.runs import RunTrackers
from otel_rl.bridge.tracker_settings import format_tracker_kwargs, run_tracker_kwargs, secret_strings
from otel_rl.trackers.base import create_trackers

__all__ = ["TrackerBridge"]

logger = logging.getLogger("otel_rl")

_STDOUT = object()  # "print to whatever sys.stdout is at the time"
_MAX_BODY = 64 << 20  # bytes on the wire and after decompression
_MAX_JSON_BODY = 8 << 20  # OTLP/JSON after decompression: the JSON parser builds Python objects as it reads
_RETRY_AFTER_S = 1
_GRPC_INVALID_ARGUMENT, _GRPC_UNAVAILABLE, _GRPC_UNAUTHENTICATED = 3, 14, 16


class _Busy(Exception):
    """The queue has no room for the request (answered 503 with Retry-After)."""


class _BadRequest(Exception):
    """A request answered with a 4xx ``status`` and a ``google.rpc.Status`` saying why."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


class TrackerBridge:
    """The bridge server. ``start()`` binds and serves in background threads; ``close()`` finishes.

    Relative paths in the config (``base_dir``, tracker folders) are relative to the working
    directory; ``otel-rl stack`` runs the bridge in its config file's folder.
    """

    def __init__(self, config: BridgeConfig, *, out: TextIO | None | object = _STDOUT) -> None:
        self.config = config
        self._out = out
        self._host, self._port = parse_listen(config.listen)
        for module in config.imports:  # third-party trackers register themselves on import
            importlib.import_module(module)
        self._secrets = secret_strings(config.track_with, config.tracker_kwargs)  # (their secret_keys known now)
        self._runs = RunTrackers(config, count=self._count, say=self._say, scrub=self._scrub)
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._queued_bytes = 0
        self._max_bytes = int(config.max_queue_mb * (1 << 20))
        self._stopping = False
        self._closed = False
        self._busy = False
        self.limits = RequestLimits()
        self._in_flight = threading.BoundedSemaphore(config.max_requests_in_flight)
        self._decoding = threading.Lock()  # one decode at a time: it holds the GIL anyway, and it bounds the peak
        token = os.environ.get(ENV.OTEL_RL_BRIDGE_TOKEN, "")
        self._token = token.encode() if token else None
        if token:
            self._secrets = (*self._secrets, token)
        self._stats_lock = threading.Lock()
        self._stats: dict[str, int] = dict.fromkeys(
            (
                "requests",
                "bad_requests",
                "busy_responses",
                "unauthorized",
                "records_bad",
                "log_records",
                "events_delivered",
                "hparams_delivered",
                "samples_delivered",
                "records_ignored",
                "records_other_ranks",
                "metric_exports",
                "metric_steps_written",
                "metric_exports_ignored",
                "runs",
                "runs_failed",
                "runs_closed_for_room",
                "worker_errors",
            ),
            0,
        )
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        # Checked now, opened per run: an unknown tracker, a missing library or a bad setting fails
        # here, before anything listens (no I/O: trackers open their backends in start()).
        create_trackers(config.track_with, run_tracker_kwargs(config, "check"), run_name="check", run_dir=Path(config.base_dir) / "check")

    # -- public --------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) it listens on (the real port when the config said port 0)."""
        if self._server is not None:
            return self._host, self._server.server_address[1]
        return self._host, self._port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def start(self) -> TrackerBridge:
        bridge = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = socket.AF_INET6 if ":" in self._host else socket.AF_INET

        class Handler(_Handler):
            pass

        Handler.bridge = bridge
        self._server = Server((self._host, self._port), Handler)
        worker = threading.Thread(target=self._work, name="otel-rl-bridge-worker", daemon=True)
        serve = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="otel-rl-bridge-http", daemon=True)
        self._threads = [worker, serve]
        worker.start()
        serve.start()
        ref = weakref.WeakMethod(self.close)
        atexit.register(lambda: (m := ref()) is not None and m())
        cfg = self.config
        ranks = "all" if cfg.ranks is None else ",".join(map(str, cfg.ranks))
        split = (
            f"one tracker set per run under {Path(cfg.base_dir).absolute()}"
            if cfg.split_runs
            else f"all runs into one tracker set (run_dir {Path(cfg.base_dir).absolute()})"
        )
        self._say(
            f"otel-rl bridge: listening on {self.url} (OTLP/HTTP /v1/logs, /v1/metrics); trackers: "
            f"{format_tracker_kwargs(cfg.track_with, cfg.tracker_kwargs)}; keys {cfg.tracker_keys}; ranks {ranks}; {split}"
        )
        return self

    def stats(self) -> dict[str, Any]:
        with self._stats_lock:
            out: dict[str, Any] = dict(self._stats)
        with self._cond:
            out["queued_requests"], out["queued_bytes"] = len(self._queue), self._queued_bytes
        out["run_labels"] = self._runs.labels()
        out["runs_open"] = self._runs.open_count()
        return out

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Until every accepted request is delivered to the trackers and flushed (for tests and tools)."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop accepting, deliver what was accepted, flush and finish every tracker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread.name == "otel-rl-bridge-worker":
                thread.join(timeout_s)
                if thread.is_alive():
                    logger.warning("otel-rl bridge: trackers still busy after %.0f s; exiting without waiting", timeout_s)
        if self._server is None:  # never started: nothing to finish but what a test fed directly
            self._runs.finish_all()
        stats = self.stats()
        self._say(
            f"otel-rl bridge: stopped; {stats['runs']} run(s), {stats['events_delivered']} step event(s), "
            f"{stats['metric_steps_written']} metrics step(s) delivered; {stats['bad_requests']} bad request(s)"
        )

    def __enter__(self) -> TrackerBridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- receiving (HTTP threads) --------------------------------------------------------------

    def _count(self, name: str, amount: int = 1) -> None:
        with self._stats_lock:
            self._stats[name] += amount

    def _reserve(self, size: int) -> bool:
        """Reserve queue space for a request about to be decoded; False when full (or closing)."""
        with self._cond:
            # (like a request the worker is delivering, one reserved while the queue is empty always fits)
            if self._stopping or (self._queue and self._queued_bytes + size > self._max_bytes):
                return False
            self._queued_bytes += size
            return True

    def _release(self, size: int) -> None:
        with self._cond:
            self._queued_bytes -= size
            self._cond.notify_all()

    def _submit(self, kind: str, message: Any, size: int) -> bool:
        """Queue a decoded request whose ``size`` was reserved; False when closing (the reservation is freed)."""
        with self._cond:
            if self._stopping:
                self._queued_bytes -= size
                return False
            self._queue.append((kind, message, size))
            self._cond.notify_all()
            return True

    def _authorized(self, header: str | None) -> bool:
        if self._token is None:
            return True
        scheme, _, given = (header or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    # -- delivering (the worker thread) --------------------------------------------------------

    def _work(self) -> None:
        idle_s = self.config.run_idle_timeout_s
        tick = min(idle_s / 4, 60.0) if idle_s else None
        while True:
            with self._cond:
                if not self._queue and not self._stopping:
                    self._cond.wait(tick)
                if self._queue:
                    kind, message, size = self._queue.popleft()
                    self._busy = True
                elif self._stopping:
                    break
                else:
                    kind = None
            if kind is None:  # woken without work: time to finish runs gone quiet (outside the lock)
                if idle_s:
                    self._runs.finish_idle_runs()
                continue
            try:
                if kind == "logs":
                    self._runs.deliver_logs(message)
                else:
                    self._runs.deliver_metrics(message)
            except Exception as exc:  # never let one request stop the worker
                self._count("worker_errors")
                logger.warning("otel-rl bridge: a %s request could not be delivered: %s", kind, self._scrub(f"{type(exc).__name__}: {exc}"))
            with self._cond:
                self._queued_bytes -= size
                idle = not self._queue
            if idle:
                self._runs.flush_dirty()
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        self._runs.finish_all()

    # -- output ----------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _say(self, text: str) -> None:
        out = sys.stdout if self._out is _STDOUT else self._out
        if out is not None:
            out.write(self._scrub(text) + "\n")  # type: ignore[union-attr]
            out.flush()  # type: ignore[union-attr]


# ---- HTTP ------------------------------------------------------------------------------------


def _message_types() -> dict[str, tuple[Any, Any]]:
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    return {
        "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
        "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
        "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    }


class _Handler(BaseHTTPRequestHandler):
    bridge: TrackerBridge
    protocol_version = "HTTP/1.1"  # keep-alive: collectors reuse their connections
    server_version = "otel-rl-bridge"
    sys_version = ""
    timeout = 60  # a sender that stalls mid-request frees its thread
    _types = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("otel-rl bridge: %s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the sender left: nothing to answer
            self.close_connection = True

    def _send_status(self, status: int, code: int, message: str, as_json: bool, headers: Mapping[str, str] | None = None) -> None:
        from google.rpc import status_pb2

        payload = status_pb2.Status(code=code, message=message)
        if as_json:
            self._send(status, json.dumps({"code": code, "message": message}).encode(), "application/json", headers)
        else:
            self._send(status, payload.SerializeToString(), "application/x-protobuf", headers)

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/stats" and not self.bridge._authorized(self.headers.get("Authorization")):
            self._send(401, b"missing or wrong bearer token\n", "text/plain; charset=utf-8", {"WWW-Authenticate": "Bearer"})
        elif path == "/stats":
            self._send(200, json.dumps(self.bridge.stats()).encode(), "application/json")
        else:
            self._send(404, b"not found: GET /healthz, GET /stats, POST /v1/logs, /v1/metrics, /v1/traces\n", "text/plain; charset=utf-8")

    def do_POST(self) -> None:  # noqa: N802
        bridge = self.bridge
        path = self.path.split("?", 1)[0].rstrip("/")
        content_type = (self.headers.get("Content-Type") or "application/x-protobuf").split(";", 1)[0].strip().lower()
        as_json = content_type == "application/json"
        types = _Handler._types or _message_types()
        _Handler._types = types
        if path not in types:
            self.close_connection = True
            self._send(404, b"not found: POST /v1/logs, /v1/metrics or /v1/traces\n", "text/plain; charset=utf-8")
            return
        bridge._count("requests")
        if not bridge._authorized(self.headers.get("Authorization")):
            bridge._count("unauthorized")
            self.close_connection = True  # the body is left unread
            self._send_status(401, _GRPC_UNAUTHENTICATED, "missing or wrong bearer token", as_json, {"WWW-Authenticate": "Bearer"})
            return
        if not bridge._in_flight.acquire(blocking=False):  # before the body is read: a flood costs no memory
            bridge._count("busy_responses")
            self.close_connection = True
            self._send_status(
                429, _GRPC_UNAVAILABLE, "too many requests in flight; retry later", as_json, {"Retry-After": str(_RETRY_AFTER_S)}
            )
            return
        try:
            self._post(path, types, content_type, as_json)
        finally:
            bridge._in_flight.release()

    def _post(self, path: str, types: Mapping[str, tuple[Any, Any]], content_type: str, as_json: bool) -> None:
        bridge = self.bridge
        reserved = 0
        try:
            body = self._read_body()
            encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            body = _decompress(body, encoding, _MAX_JSON_BODY if as_json else _MAX_BODY)
            if content_type not in ("application/x-protobuf", "application/protobuf", "application/json"):
                raise _BadRequest(
                    HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                    f"unsupported Content-Type {content_type!r}: send application/x-protobuf or application/json",
                )
            request_type, response_type = types[path]
            if path == "/v1/traces":  # accepted and dropped: trackers take no spans
                self._reply(response_type(), as_json)
                return
            with bridge._decoding:
                message, reserved = _decode(request_type, body, as_json, bridge)
        except _BadRequest as exc:
            bridge._count("bad_requests")
            logger.info("otel-rl bridge: %s %s: %s", path, int(exc.status), exc)
            self._send_status(int(exc.status), _GRPC_INVALID_ARGUMENT, str(exc), as_json)
            return
        except _Busy:
            bridge._count("busy_responses")
            self._send_status(
                503, _GRPC_UNAVAILABLE, "the bridge's trackers are behind; retry later", as_json, {"Retry-After": str(_RETRY_AFTER_S)}
            )
            return
        if not bridge._submit("logs" if path == "/v1/logs" else "metrics", message, reserved):
            bridge._count("busy_responses")
            self._send_status(503, _GRPC_UNAVAILABLE, "the bridge is stopping; retry later", as_json, {"Retry-After": str(_RETRY_AFTER_S)})
            return
        self._reply(response_type(), as_json)

    def _reply(self, response: Any, as_json: bool) -> None:
        if as_json:
            self._send(200, b"{}", "application/json")
        else:
            self._send(200, response.SerializeToString(), "application/x-protobuf")

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks, total = [], 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = chunk_size(line)  # hex digits only: int(x, 16) takes "-1", and read(-1) reads to EOF
                except ValueError:
                    self.close_connection = True
                    raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed chunked body") from None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > _MAX_BODY:
                    self.close_connection = True
                    raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {_MAX_BODY} bytes")
                chunks.append(self._read_exactly(size))
                self.rfile.readline(1024)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if length < 0 or length > _MAX_BODY:
            self.close_connection = True
            raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {_MAX_BODY} bytes")
        return self._read_exactly(length) if length else b""

    def _read_exactly(self, size: int) -> bytes:
        data = self.rfile.read(size)
        if len(data) < size:  # the sender closed mid-body: a truncated body is not a request
            self.close_connection = True
            raise _BadRequest(HTTPStatus.BAD_REQUEST, f"body ended after {len(data)} of {size} bytes")
        return data


def _decompress(body: bytes, encoding: str, most: int) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS
    else:
        raise _BadRequest(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Encoding {encoding!r}: use gzip, deflate or none")
    try:
        inflater = zlib.decompressobj(wbits)
        out = inflater.decompress(body, most + 1)
    except zlib.error as exc:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, f"body is not valid {encoding}: {exc}") from None
    if len(out) > most or inflater.unconsumed_tail:
        raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"decompressed body over {most} bytes")
    return out


def _decode(request_type: Any, body: bytes, as_json: bool, bridge: TrackerBridge) -> tuple[Any, int]:
    """The request's message and the queue space reserved for it: counted first (413 past a limit),
    then space reserved (:class:`_Busy` when full), then decoded (400 when it does not)."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError

    kind = "OTLP/JSON" if as_json else "OTLP protobuf"
    limits = bridge.limits
    try:
        if as_json:
            # the JSON parser builds objects as it reads: it stops at a quarter of the message limit
            json_limits = RequestLimits(max_messages=max(1, limits.max_messages // 4))
            data = count_json_objects(body.decode("utf-8"), json_limits)
            del body
            message = json_format.ParseDict(data, request_type(), ignore_unknown_fields=True)
            del data
            body = message.SerializeToString()  # counted like a protobuf body (a JSON body is at most 8 MiB)
        counts = scan_otlp(body, request_type.DESCRIPTOR, limits)
    except RequestTooBig as exc:
        raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(exc)) from None
    except (Malformed, DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError, TypeError, RecursionError) as exc:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, f"body is not an {kind} {request_type.DESCRIPTOR.name}: {str(exc)[:200]}") from None
    size = counts.decoded_bytes(len(body))
    if not bridge._reserve(size):
        raise _Busy
    try:
        return (message if as_json else request_type.FromString(body)), size
    except DecodeError as exc:
        bridge._release(size)
        raise _BadRequest(HTTPStatus.BAD_REQUEST, f"body is not an {kind} {request_type.DESCRIPTOR.name}: {str(exc)[:200]}") from None
    except BaseException:
        bridge._release(size)
        raise
