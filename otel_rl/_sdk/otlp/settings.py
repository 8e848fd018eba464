"""The OTLP settings of one signal (endpoint, headers, TLS files, timeout, compression) and what is built from them.

The settings follow the ``OTEL_EXPORTER_OTLP_*`` variables as the SDK exporters read them (a
signal's own variable first, then the general one) and are resolved once, here: the SDK exporters
get them through their public constructors (the HTTP ones with a ``requests`` session built here),
and the disk spool's senders open their own session or gRPC channel from the same settings, so
both reach the collector the same way. :func:`check_otlp_environment` rejects settings the SDK
would otherwise ignore with a log line or fail on at every export.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import ssl
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any
from urllib.parse import unquote, urlsplit

from otel_rl._sdk.otlp.sdk_compat import installed_exporter_version, otlp_log_exporter_class
from otel_rl._sdk.settings.redaction import redact_url
from otel_rl._version import __version__

logger = logging.getLogger("otel_rl")

GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"
DEFAULT_TIMEOUT_S = 10.0
_DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
_DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
_COMPRESSIONS = ("none", "gzip", "deflate")
_CREDENTIAL_PROVIDER_GROUP = "opentelemetry_otlp_credential_provider"


@dataclass(frozen=True)
class OtlpSettings:
    """How one signal reaches the collector."""

    signal: str  # traces | metrics | logs
    protocol: str  # grpc | http/protobuf
    endpoint: str  # HTTP: the signal's full URL; gRPC: host:port
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # usually credentials: never shown
    timeout_s: float = DEFAULT_TIMEOUT_S
    compression: str = "none"  # none | gzip | deflate
    certificate_file: str | None = None  # the CA that signed the collector's certificate
    client_key_file: str | None = None  # mTLS
    client_certificate_file: str | None = None  # mTLS
    insecure: bool = False  # gRPC: a plaintext channel
    credential_provider: str | None = None  # an entry point that makes the session / channel credentials


def resolve_otlp_settings(protocol: str, endpoint: str | None, signal: str, environ: Mapping[str, str] | None = None) -> OtlpSettings:
    """The settings of ``signal`` from ``endpoint`` (the run's collector, if configured) and ``OTEL_EXPORTER_OTLP_*``.

    As before otel-rl resolved them itself: a configured endpoint gets the per-signal paths
    (``/v1/traces``) over HTTP and wins over ``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT``."""
    env = os.environ if environ is None else environ
    word = signal.upper()

    def setting(suffix: str) -> str | None:
        return env.get(f"OTEL_EXPORTER_OTLP_{word}_{suffix}") or env.get(f"OTEL_EXPORTER_OTLP_{suffix}") or None

    base = (endpoint or "").rstrip("/")
    insecure = False
    if protocol == GRPC:
        raw = base or env.get(f"OTEL_EXPORTER_OTLP_{word}_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or _DEFAULT_GRPC_ENDPOINT
        parts = urlsplit(raw)
        # As the SDK: https means TLS; otherwise OTEL_EXPORTER_OTLP_*INSECURE, else plaintext only for http://.
        flag = setting("INSECURE")
        if parts.scheme == "https":
            insecure = False
        elif flag is not None:
            insecure = flag.strip().lower() == "true"
        else:
            insecure = parts.scheme == "http"
        # gRPC has no user:password in its target (a channel would quote it in every error): never pass one on.
        target = (parts.netloc.rpartition("@")[2] if parts.netloc else raw.rpartition("@")[2]) or raw
    elif base:
        target = f"{base}/v1/{signal}"
    else:
        target = env.get(f"OTEL_EXPORTER_OTLP_{word}_ENDPOINT") or (
            f"{(env.get('OTEL_EXPORTER_OTLP_ENDPOINT') or _DEFAULT_HTTP_ENDPOINT).rstrip('/')}/v1/{signal}"
        )
    compression = (setting("COMPRESSION") or "none").strip().lower()
    kind = "GRPC" if protocol == GRPC else "HTTP"
    return OtlpSettings(
        signal=signal,
        protocol=protocol,
        endpoint=target,
        headers=_parse_headers(setting("HEADERS")),
        timeout_s=_timeout(setting("TIMEOUT")),
        compression=compression if compression in _COMPRESSIONS else "none",
        certificate_file=setting("CERTIFICATE"),
        client_key_file=setting("CLIENT_KEY"),
        client_certificate_file=setting("CLIENT_CERTIFICATE"),
        insecure=insecure,
        credential_provider=(
            env.get(f"OTEL_PYTHON_EXPORTER_OTLP_{kind}_{word}_CREDENTIAL_PROVIDER")
            or env.get(f"OTEL_PYTHON_EXPORTER_OTLP_{kind}_CREDENTIAL_PROVIDER")
            or None
        ),
    )


def _parse_headers(text: str | None) -> dict[str, str]:
    """``name=value,...`` as the SDK reads it (names lower-cased, URL-encoded values decoded), without
    the SDK's parser: it logs an entry it cannot read whole, credential included. A bad entry is left
    out here; ``check_otlp_environment`` refuses it at ``init()``, naming its header only."""
    headers: dict[str, str] = {}
    for entry in (text or "").split(","):
        if entry.strip() and header_problem(entry) is None:
            name, value = entry.split("=", 1)
            headers[unquote(name).strip().lower()] = unquote(value.strip())
    return headers


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
# A header value as OTEL_EXPORTER_OTLP_HEADERS may carry it (W3C Baggage's value octets, and spaces,
# as the SDK's liberal reading allows): no quote, comma, semicolon, backslash, control or non-ASCII
# character. Those are written URL-encoded (%22, %3B, %5C, UTF-8 bytes as %XX).
_HEADER_VALUE = re.compile(r"^[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*$")


def header_problem(entry: str) -> str | None:
    """What is wrong with one ``name=value`` entry of OTEL_EXPORTER_OTLP_*HEADERS, naming at most its
    header's name (never the value: it usually is a credential); None when it is sound."""
    if "=" not in entry:
        return "is not name=value"
    name, value = entry.split("=", 1)
    name = name.strip()
    if not _HEADER_NAME.match(name):
        return "has a name that is not an HTTP header name"
    if not _HEADER_VALUE.match(value.strip()):
        return (
            f"(header {name!r}) has a value with a character this variable cannot carry as it is (a quote, ';', a "
            "backslash, a control or non-ASCII character): URL-encode it (a quote is %22, a space may stay or be %20)"
        )
    return None


def _timeout(text: str | None) -> float:
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:  # check_otlp_environment rejects it first; a direct caller gets the default
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def user_agent() -> str:
    return f"OTel-OTLP-Exporter-Python/{installed_exporter_version() or 'unknown'} otel-rl/{__version__}"


# -- which exporters were built from which settings -----------------------------------------------
# The spool's senders are built from the settings of the SDK exporter they stand in for.

_SETTINGS_OF: weakref.WeakKeyDictionary[Any, OtlpSettings] = weakref.WeakKeyDictionary()


def settings_of(exporter: Any) -> OtlpSettings | None:
    """The settings an exporter of :func:`sdk_exporter` was built from; None for any other exporter."""
    try:
        return _SETTINGS_OF.get(exporter)
    except TypeError:  # not weak-referenceable: not one of ours
        return None


def sdk_exporter(settings: OtlpSettings) -> Any:
    """The SDK's OTLP exporter for ``settings.signal``, given exactly ``settings`` through its public constructor."""
    if settings.protocol == GRPC:
        exporter = _sdk_grpc_exporter(settings)
    else:
        exporter = _sdk_http_exporter(settings)
    _SETTINGS_OF[exporter] = settings
    return exporter


def _sdk_http_exporter(settings: OtlpSettings) -> Any:
    from opentelemetry.exporter.otlp.proto.http import Compression

    if settings.signal == "traces":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter_class: Any = OTLPSpanExporter
    elif settings.signal == "metrics":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter_class = OTLPMetricExporter
    else:
        exporter_class = otlp_log_exporter_class(settings.protocol)
    return exporter_class(
        endpoint=settings.endpoint,
        certificate_file=settings.certificate_file,
        client_key_file=settings.client_key_file,
        client_certificate_file=settings.client_certificate_file,
        headers=dict(settings.headers),
        timeout=settings.timeout_s,
        compression=Compression(settings.compression),
        session=open_http_session(settings),
    )


def _sdk_grpc_exporter(settings: OtlpSettings) -> Any:
    if settings.signal == "traces":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter_class: Any = OTLPSpanExporter
    elif settings.signal == "metrics":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        exporter_class = OTLPMetricExporter
    else:
        exporter_class = otlp_log_exporter_class(settings.protocol)
    return exporter_class(
        endpoint=settings.endpoint,
        insecure=settings.insecure,
        credentials=grpc_credentials(settings),
        headers=dict(settings.headers) or None,
        timeout=settings.timeout_s,
        compression=grpc_compression(settings),
    )


# -- OTLP/HTTP: a requests session ----------------------------------------------------------------


def open_http_session(settings: OtlpSettings) -> Any:
    """A ``requests.Session`` that verifies the collector with the settings' CA file and presents
    the client certificate; the CA file wins over REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE.

    requests lets those environment variables override a session's ``verify`` on every request, so
    with either set (common on managed machines) the collector's CA would be silently ignored and
    every export would fail verification."""
    # requests imports netrc on a session's first request, on whichever thread sends it. A fork
    # while that import runs leaves netrc half-imported in the child, its import lock held by a
    # thread the child does not have, and every sender there blocks on it: imported here instead,
    # on the thread that calls init().
    import netrc  # noqa: F401

    import requests

    if settings.credential_provider:
        session = _load_credential_provider(settings.credential_provider)
        if not isinstance(session, requests.Session):
            raise RuntimeError(
                f"the credential provider {settings.credential_provider!r} made a {type(session).__name__}, not a requests.Session"
            )
        _keep_the_ca_of(session)
    else:
        session = _ca_keeping_session_class()()
    session.verify = settings.certificate_file or True
    if settings.client_certificate_file:
        session.cert = (
            (settings.client_certificate_file, settings.client_key_file) if settings.client_key_file else settings.client_certificate_file
        )
    return session


def _with_the_session_ca(session: Any, merged: dict[str, Any], verify: Any) -> dict[str, Any]:
    if isinstance(session.verify, str) and not isinstance(verify, str):  # a CA file, not asked otherwise per request
        merged["verify"] = session.verify
    return merged


class _MergedOnce:
    """A session's environment settings for a request, read once per (URL, options) and reused.

    requests reads the proxy variables (scanning the whole environment twice) and the CA bundle
    variables on every request: ~80-150 us of a sender's CPU per request, for a URL that does not
    change. Proxy and CA variables changed after ``init()`` apply from the next start."""

    def __init__(self, session: Any, merge: Any) -> None:
        self._session, self._merge = session, merge
        self._merged: dict[tuple[Any, ...], dict[str, Any]] = {}

    def __call__(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> dict[str, Any]:
        key = (url, stream, verify, cert if not isinstance(cert, list) else tuple(cert))
        own_proxies = bool(proxies)  # read first: requests adds the environment's to the dict it is given
        found = None if own_proxies else self._merged.get(key)
        if found is None:
            found = _with_the_session_ca(self._session, self._merge(url, proxies, stream, verify, cert), verify)
            if not own_proxies and len(self._merged) < 16:
                self._merged[key] = found
        # a copy each time: requests hands the proxies on to the adapter
        return {**found, "proxies": dict(found["proxies"])} if isinstance(found.get("proxies"), dict) else dict(found)


@functools.cache
def _ca_keeping_session_class() -> type:
    import requests  # only OTLP/HTTP needs it: not imported with otel_rl

    class CaKeepingSession(requests.Session):
        """A session whose CA file wins over REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE (see open_http_session),
        and that reads the environment's settings once per URL (``_MergedOnce``)."""

        def __init__(self) -> None:
            super().__init__()
            self.merge_environment_settings = _MergedOnce(self, super().merge_environment_settings)  # type: ignore[method-assign]

    return CaKeepingSession


def _keep_the_ca_of(session: Any) -> None:
    """The same for a session a credential provider made (its class is not ours to choose)."""
    session.merge_environment_settings = _MergedOnce(session, session.merge_environment_settings)


def _load_credential_provider(name: str) -> Any:
    """What the ``opentelemetry_otlp_credential_provider`` entry point ``name`` makes (as the SDK does)."""
    for entry_point in metadata.entry_points(group=_CREDENTIAL_PROVIDER_GROUP, name=name):
        return entry_point.load()()
    raise RuntimeError(
        f"no credential provider {name!r} is installed (OTEL_PYTHON_EXPORTER_OTLP_*_CREDENTIAL_PROVIDER "
        f"names an entry point of the group {_CREDENTIAL_PROVIDER_GROUP})"
    )


# -- OTLP/gRPC: channel credentials and channels --------------------------------------------------


def grpc_credentials(settings: OtlpSettings) -> Any:
    """The channel credentials of ``settings``; None for a plaintext channel."""
    if settings.insecure:
        return None
    import grpc

    if settings.credential_provider:
        credentials = _load_credential_provider(settings.credential_provider)
        if not isinstance(credentials, grpc.ChannelCredentials):
            raise RuntimeError(
                f"the credential provider {settings.credential_provider!r} made a {type(credentials).__name__}, not grpc.ChannelCredentials"
            )
        return credentials
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(settings.certificate_file),
        private_key=_read_pem(settings.client_key_file),
        certificate_chain=_read_pem(settings.client_certificate_file),
    )


def grpc_compression(settings: OtlpSettings) -> Any:
    import grpc

    return {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}.get(settings.compression, grpc.Compression.NoCompression)


def open_grpc_channel(settings: OtlpSettings, credentials: Any) -> Any:
    """A channel to the collector (``credentials`` from :func:`grpc_credentials`; None: plaintext)."""
    import grpc

    options = [("grpc.primary_user_agent", user_agent())]
    if credentials is None:
        return grpc.insecure_channel(settings.endpoint, options=options, compression=grpc_compression(settings))
    return grpc.secure_channel(settings.endpoint, credentials, options=options, compression=grpc_compression(settings))


def _read_pem(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:  # as the SDK: reported, then the default (check_otlp_environment catches it first)
        logger.warning("otel-rl: cannot read %s (%s); the gRPC channel is opened without it", path, exc)
        return None


# -- checking the environment ---------------------------------------------------------------------

_SIGNAL_WORDS = ("TRACES", "METRICS", "LOGS")


def check_otlp_environment(protocol: str, endpoint: str | None, environ: Any = None) -> None:
    """Raise a ValueError naming the variable and the fix for OTEL_EXPORTER_OTLP_* settings that the
    SDK exporters would otherwise ignore with a log line or fail on at every export.

    Header values are never shown: they usually hold credentials."""
    environ = os.environ if environ is None else environ
    problems: list[str] = []

    def names(suffix: str) -> list[str]:
        return [f"OTEL_EXPORTER_OTLP_{suffix}", *(f"OTEL_EXPORTER_OTLP_{s}_{suffix}" for s in _SIGNAL_WORDS)]

    if protocol == "grpc":
        # A gRPC target takes no user:password: refuse it before a channel quotes it in its errors.
        for name, value in (("endpoint= or OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), *((n, environ.get(n)) for n in names("ENDPOINT")[1:])):
            if value and "@" in (urlsplit(value).netloc if "://" in value else value):
                problems.append(
                    f"{name}: the gRPC endpoint {redact_url(value)!r} carries user:password, which gRPC cannot send (the "
                    "value is not shown); remove it from the endpoint and put the credential in OTEL_EXPORTER_OTLP_HEADERS "
                    "(e.g. authorization=Basic <base64 of user:password>)"
                )
    if endpoint:
        parts = urlsplit(endpoint)
        if protocol != "grpc" and (parts.scheme not in ("http", "https") or not parts.hostname):
            problems.append(
                f"endpoint {redact_url(endpoint)!r} (endpoint= or OTEL_EXPORTER_OTLP_ENDPOINT) is not an http:// or "
                f"https:// URL; OTLP/HTTP needs e.g. http://collector:4318"
            )
    for name in names("ENDPOINT")[1:]:
        value = environ.get(name)
        if value and protocol != "grpc":  # gRPC also takes host:port
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                problems.append(f"{name}={redact_url(value)!r} is not an http:// or https:// URL (e.g. http://collector:4318/v1/traces)")
    for name in names("HEADERS"):
        value = environ.get(name)
        if not value:
            continue
        entries = [e for e in value.split(",") if e.strip()]
        for number, entry in enumerate(entries, 1):
            problem = header_problem(entry)
            if problem is not None:
                problems.append(
                    f"{name}: entry {number} of {len(entries)} {problem} (the value is not shown: it may hold a "
                    "credential); write name1=value1,name2=value2 with each value URL-encoded"
                )
    for suffix, what in (
        ("CERTIFICATE", "the PEM file of the CA that signed the collector's certificate"),
        ("CLIENT_CERTIFICATE", "this client's PEM certificate (mTLS)"),
        ("CLIENT_KEY", "this client's PEM private key (mTLS)"),
    ):
        for name in names(suffix):
            path = environ.get(name)
            if not path:
                continue
            if not os.path.isfile(path) or not os.access(path, os.R_OK):
                problems.append(f"{name}={path}: no such readable file; set it to {what}, or unset it")
            elif suffix == "CERTIFICATE":
                try:
                    ssl.create_default_context(cafile=path)
                except (ssl.SSLError, ValueError) as exc:
                    problems.append(f"{name}={path}: not a PEM CA certificate ({exc}); set it to {what}")
    for name in names("TIMEOUT"):
        value = environ.get(name)
        if value:
            try:
                ok = float(value) > 0
            except ValueError:
                ok = False
            if not ok:
                problems.append(f"{name}={value!r} is not a positive number of seconds (e.g. 10)")
    choices = ("gzip", "deflate", "none")
    for name in names("COMPRESSION"):
        value = environ.get(name)
        if value and value.strip().lower() not in choices:
            problems.append(f"{name}={value!r} is not one of {', '.join(choices)}")
    for name in ("OTEL_EXPORTER_OTLP_INSECURE", *(f"OTEL_EXPORTER_OTLP_{s}_INSECURE" for s in _SIGNAL_WORDS)):
        value = environ.get(name)
        if value and value.strip().lower() not in ("true", "false"):
            problems.append(f"{name}={value!r} is not true or false")
    if problems:
        raise ValueError("otel-rl: invalid OTLP exporter settings:\n  " + "\n  ".join(problems))
