"""How the disk spool's senders deliver one stored OTLP request: over HTTP with a ``requests``
session (or, for a plaintext URL that needs nothing it adds, one ``http.client`` connection:
:mod:`otel_rl._sdk.spool.plain_http`) or over gRPC on a channel of their own, both opened from
the :class:`OtlpSettings` of the SDK exporter they stand in for (same endpoint, headers, TLS
files, timeout and compression).

A transport makes one attempt per call and says what came of it (:class:`Outcome`); the spool does
the retrying, so a collector outage never holds a thread of the SDK.
"""

from __future__ import annotations

import gzip
import http.client
import os
import ssl
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any

from otel_rl._sdk.otlp.settings import GRPC, OtlpSettings, grpc_credentials, open_grpc_channel, open_http_session, settings_of, user_agent
from otel_rl._sdk.settings.redaction import redact_text, redact_url
from otel_rl._sdk.spool.files import LOGS, METRICS, TRACES
from otel_rl._sdk.spool.plain_http import PlainHttpPoster, plain_http_target

__all__ = ["GrpcTransport", "HttpTransport", "Outcome", "ca_setting", "describe_error", "redact_endpoint", "transport_for"]


def redact_endpoint(url: str | None) -> str:
    """An endpoint without user:password, query values or fragment, for messages."""
    return str(redact_url(url))


@dataclass(frozen=True)
class Outcome:
    """One delivery attempt: ``ok``; else ``permanent`` (drop it) or retry later; ``detail`` for messages."""

    ok: bool
    permanent: bool = False
    detail: str = ""
    tls: bool = False  # a certificate problem: reported with the CA setting


_HTTP_HOLD = {401, 403, 407}  # auth: keep the data (a fixed token delivers it), retry slowly
_HTTP_RETRY = {408, 429}


class HttpTransport:
    """Posts serialized OTLP requests to the signal's URL, one attempt per call.

    ``exporter``: the SDK exporter this transport stands in for, if any; closing the transport shuts
    it down (it owns the exporter's resources from then on)."""

    protocol = "http/protobuf"

    def __init__(self, settings: OtlpSettings, exporter: Any = None) -> None:
        self.settings = settings
        self.signal = settings.signal
        self.endpoint = settings.endpoint
        self.timeout_s = settings.timeout_s
        self.exporter = exporter
        self._session = open_http_session(settings)
        headers = {"content-type": "application/x-protobuf", "user-agent": user_agent()}
        headers.update({name.lower(): value for name, value in settings.headers.items()})
        if settings.compression != "none":
            headers.setdefault("content-encoding", settings.compression)
        self._headers = headers
        target = plain_http_target(settings)
        self._plain = PlainHttpPoster(*target, headers) if target is not None else None

    def _compress(self, payload: bytes) -> bytes:
        if self.settings.compression == "gzip":
            return gzip.compress(payload)
        if self.settings.compression == "deflate":
            return zlib.compress(payload)
        return payload

    def send(self, payload: bytes, timeout_s: float) -> Outcome:
        import requests

        data = self._compress(payload)
        timeout_s = max(timeout_s, 0.001)
        if self._plain is not None:
            try:
                return _http_outcome(*self._plain.post(data, timeout_s))
            except (OSError, http.client.HTTPException) as error:
                return Outcome(False, detail=describe_error(error))
        deadline = time.monotonic() + timeout_s
        for attempt in range(2):
            try:
                response = self._session.post(self.endpoint, data=data, headers=self._headers, timeout=timeout_s, allow_redirects=False)
                break
            except requests.RequestException as error:
                timeout_s = deadline - time.monotonic()
                # One immediate retry of a broken connection (a pooled one the collector closed), as the SDK does.
                if attempt == 0 and isinstance(error, requests.ConnectionError) and timeout_s > 0:
                    continue
                return Outcome(False, detail=describe_error(error), tls=_is_tls_error(error))
        return _http_outcome(response.status_code, response.reason)

    def close(self) -> None:
        if self._plain is not None:
            self._plain.close()
        self._session.close()
        _shutdown(self.exporter)


def _http_outcome(status: int, reason: str | None) -> Outcome:
    if 200 <= status < 300:
        return Outcome(True)
    detail = f"HTTP {status} {reason or ''}".strip()
    if status in _HTTP_HOLD or status in _HTTP_RETRY or status >= 500:
        return Outcome(False, detail=detail)
    return Outcome(False, permanent=True, detail=detail)


_GRPC_PATHS = {
    TRACES: "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    METRICS: "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    LOGS: "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
}


class GrpcTransport:
    """Sends serialized OTLP requests as raw bytes on a gRPC channel of its own, one attempt per call.

    ``exporter``: as for :class:`HttpTransport`."""

    protocol = "grpc"

    def __init__(self, settings: OtlpSettings, exporter: Any = None) -> None:
        import grpc

        self._grpc = grpc
        self.settings = settings
        self.signal = settings.signal
        self.endpoint = settings.endpoint
        self.timeout_s = settings.timeout_s
        self.exporter = exporter
        self._path = _GRPC_PATHS[settings.signal]
        self._metadata = tuple(settings.headers.items()) or None
        self._credentials = grpc_credentials(settings)  # once: a credential provider may be slow
        self._lock = threading.Lock()
        self._channel: Any = None
        self._call: Any = None

    def _method(self) -> Any:
        with self._lock:
            if self._channel is None:
                self._channel = open_grpc_channel(self.settings, self._credentials)
                # No serializers: the request is already the serialized protobuf.
                self._call = self._channel.unary_unary(self._path)
            return self._call

    def _drop_channel(self) -> None:
        with self._lock:
            channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - a channel that will not close is dropped all the same
                pass

    def send(self, payload: bytes, timeout_s: float) -> Outcome:
        grpc = self._grpc
        try:
            self._method()(payload, metadata=self._metadata, timeout=max(timeout_s, 0.001))
            return Outcome(True)
        except grpc.RpcError as error:
            code = error.code() if callable(getattr(error, "code", None)) else None
            details = str((error.details() if callable(getattr(error, "details", None)) else error) or "")
            detail = _short(f"gRPC {getattr(code, 'name', code)}: {details}")
            if code == grpc.StatusCode.UNAVAILABLE:
                # A channel in gRPC's own reconnect backoff can wait up to minutes; a fresh one
                # connects as soon as the collector is back (as the SDK exporter does).
                self._drop_channel()
            if code in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.UNIMPLEMENTED,
                grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.ALREADY_EXISTS,
            ):
                return Outcome(False, permanent=True, detail=detail)
            return Outcome(False, detail=detail, tls=_is_tls_text(details))
        except ValueError as error:  # a closed channel: the next attempt opens a new one
            self._drop_channel()
            return Outcome(False, detail=_short(str(error)))

    def close(self) -> None:
        self._drop_channel()
        _shutdown(self.exporter)


def transport_for(exporter: Any, signal: str | None = None) -> HttpTransport | GrpcTransport:
    """The transport that stands in for an SDK OTLP exporter built by ``providers.otlp_exporters``
    (or directly for :class:`OtlpSettings`); TypeError for any other exporter, whose settings are
    not known without reading the SDK's internals."""
    if isinstance(exporter, OtlpSettings):
        settings, exporter = exporter, None
    else:
        found = settings_of(exporter)
        if found is None:
            raise TypeError(f"not an OTLP exporter of otel_rl's otlp_exporters(): {type(exporter).__name__}")
        settings = found
    if signal is not None and signal != settings.signal:
        raise ValueError(f"the exporter sends {settings.signal}, not {signal}")
    if settings.protocol == GRPC:
        return GrpcTransport(settings, exporter)
    return HttpTransport(settings, exporter)


def _shutdown(exporter: Any) -> None:
    if exporter is not None:
        try:
            exporter.shutdown()
        except Exception:  # noqa: BLE001 - closing one exporter must not stop the others
            pass


def describe_error(error: BaseException | None) -> str:
    """The root cause of a transport error in a few words ("[Errno 111] Connection refused"),
    not the whole chain of wrapper exceptions that requests and urllib3 build around it."""
    if error is None:
        return "no response"
    seen: set[int] = set()
    stack: list[BaseException] = [error]
    root: BaseException = error
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return _short(f"[Errno {current.errno}] {current.strerror}")
        if isinstance(current, ssl.SSLError):
            return _short(f"{type(current).__name__}: {getattr(current, 'verify_message', None) or current.reason or current}")
        root = current
        stack.extend(a for a in getattr(current, "args", ()) if isinstance(a, BaseException))
        for nested in (current.__cause__, current.__context__, getattr(current, "reason", None)):
            if isinstance(nested, BaseException):
                stack.append(nested)
    text = str(root)
    # urllib3 wraps the reason as "<...>: Failed to establish a new connection: [Errno 111] ..."
    if "Errno" in text:
        text = text[text.index("[Errno") :] if "[Errno" in text else text
    return _short(f"{type(root).__name__}: {text}" if not text.startswith("[Errno") else text)


def _short(text: str, limit: int = 300) -> str:
    # Error texts from requests/urllib3/grpc may quote the URL with its query (a token): masked.
    text = redact_text(" ".join(str(text).split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_tls_text(text: str) -> bool:
    low = text.lower()
    return "certificate" in low or "ssl" in low or "handshake" in low or "tls" in low


def _is_tls_error(error: BaseException | None) -> bool:
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, ssl.SSLError) or type(error).__name__ == "SSLError":
            return True
        for arg in getattr(error, "args", ()):
            if isinstance(arg, BaseException) and _is_tls_error(arg):
                return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def ca_setting(signal: str, protocol: str = "http/protobuf", environ: Any = None) -> str:
    """Which CA file the collector's certificate is verified with, for messages."""
    environ = os.environ if environ is None else environ
    for name in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"):
        if environ.get(name):
            return f"{name}={environ[name]}"
    if protocol == "grpc":
        return "gRPC's default roots (OTEL_EXPORTER_OTLP_CERTIFICATE is not set)"
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        if environ.get(name):
            return f"{name}={environ[name]} (OTEL_EXPORTER_OTLP_CERTIFICATE is not set)"
    return "the CA bundle of the requests library (OTEL_EXPORTER_OTLP_CERTIFICATE is not set)"
