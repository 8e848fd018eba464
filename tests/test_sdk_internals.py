"""otel-rl and the OpenTelemetry SDK's internals: the one module that touches them (sdk_compat) and its
version check, the OTLP settings the exporters and the spool's senders share, and that nothing else
in the runtime reaches into the SDK's private attributes."""

from __future__ import annotations

import logging
import re
from importlib import metadata
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from otlp_sink import GrpcSink, OtlpSink
from test_spool import log_request, received_indices

from otel_rl._sdk.export.providers import otlp_exporters
from otel_rl._sdk.otlp import sdk_compat
from otel_rl._sdk.otlp.settings import open_http_session, resolve_otlp_settings, settings_of
from otel_rl._sdk.settings.config import resolve_config
from otel_rl._sdk.spool.store import LOGS, METRICS, SIGNALS, TRACES, GrpcTransport, HttpTransport, transport_for
from otel_rl.semconv import names as N

SDK_DIR = Path(__file__).resolve().parents[1] / "otel_rl" / "_sdk"


@pytest.fixture
def fresh_check():
    """The version check runs once per process: run it again in the test, and again after it."""
    sdk_compat.log_encoder.cache_clear()
    yield
    sdk_compat.log_encoder.cache_clear()


def test_the_installed_exporter_version_is_supported(fresh_check) -> None:
    version = sdk_compat.installed_exporter_version()
    assert version == metadata.version("opentelemetry-exporter-otlp")
    assert sdk_compat.unsupported_reason(version) is None
    assert callable(sdk_compat.log_encoder())


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("1.27.0", True),
        ("1.45.2", True),
        ("1.99.0rc1", True),
        (None, True),
        ("1.26.9", False),
        ("2.0.0", False),
        ("0.50b0", False),
        ("main", False),
    ],
)
def test_the_version_check_bounds(version: str | None, supported: bool) -> None:
    reason = sdk_compat.unsupported_reason(version)
    assert (reason is None) == supported
    if not supported:
        assert str(version) in reason


def test_an_unsupported_exporter_version_turns_the_spool_off_with_one_warning(fresh_check, make_telemetry, monkeypatch, caplog) -> None:
    monkeypatch.setattr(sdk_compat, "installed_exporter_version", lambda: "2.1.0")
    with OtlpSink() as sink:
        tel = make_telemetry(endpoint=sink.endpoint, exporters="otlp")
        again = make_telemetry(endpoint=sink.endpoint, exporters="otlp")
        assert tel._providers.spool is None and again._providers.spool is None
        with tel.step(0):
            tel.log({"actor/pg_loss": 1.0})
        tel.shutdown()
        assert len(sink.received.events(N.RL_LOG_EVENT)) == 1  # straight through the SDK exporter
    warnings = [r.getMessage() for r in caplog.records if "disk spool is off" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "opentelemetry-exporter-otlp 2.1.0" in warnings[0] and ">=1.27,<2.0" in warnings[0]


def test_a_missing_log_encoder_turns_the_spool_off_too(fresh_check, monkeypatch, caplog) -> None:
    monkeypatch.setattr(sdk_compat, "_LOG_ENCODER_MODULE", "opentelemetry.exporter.otlp.proto.common._no_such_module")
    assert sdk_compat.log_encoder() is None
    assert any("disk spool is off" in r.getMessage() and "_no_such_module" in r.getMessage() for r in caplog.records)


def test_only_sdk_compat_reaches_into_the_sdk() -> None:
    # Private SDK modules ("opentelemetry.sdk._logs") and attributes ("exporter._client", getattr(x, "_y")).
    private = re.compile(r"opentelemetry[\w.]*\._[a-z]|getattr\([^)]*[\"']_[a-z]|\b(exporter|inner|client)\._[a-z]")
    offenders = []
    for path in sorted(SDK_DIR.glob("*.py")):
        if path.name == "sdk_compat.py" or not (path.name.startswith(("spool", "otlp", "providers"))):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if private.search(line):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# -- the settings the exporters and the spool's senders share ------------------------------------------


def test_settings_follow_the_otlp_variables_signal_first() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20general",
        "OTEL_EXPORTER_OTLP_LOGS_HEADERS": "authorization=Bearer%20logs",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/ca.pem",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/custom",
    }
    logs = resolve_otlp_settings("http/protobuf", "http://collector:4318/", LOGS, environ)
    assert logs.endpoint == "http://collector:4318/v1/logs"  # a configured endpoint gets the signal path
    assert dict(logs.headers) == {"authorization": "Bearer logs"}
    assert (logs.timeout_s, logs.compression, logs.certificate_file) == (3.0, "gzip", "/ca.pem")
    assert "Bearer" not in repr(logs)  # headers hold credentials
    traces = resolve_otlp_settings("http/protobuf", None, TRACES, environ)
    assert traces.endpoint == "http://traces:4318/custom" and dict(traces.headers) == {"authorization": "Bearer general"}
    metrics = resolve_otlp_settings("http/protobuf", None, METRICS, {})
    assert (metrics.endpoint, metrics.timeout_s, metrics.compression) == ("http://localhost:4318/v1/metrics", 10.0, "none")


@pytest.mark.parametrize(
    ("endpoint", "environ", "target", "insecure"),
    [
        ("http://collector:4317", {}, "collector:4317", True),
        ("https://collector:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, "collector:4317", False),  # https wins
        ("collector:4317", {}, "collector:4317", False),
        ("collector:4317", {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}, "collector:4317", True),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4317"}, "t:4317", True),
    ],
)
def test_grpc_settings_are_host_and_port_and_tls_unless_plain_http(endpoint, environ, target, insecure) -> None:
    settings = resolve_otlp_settings("grpc", endpoint, TRACES, environ)
    assert (settings.endpoint, settings.insecure) == (target, insecure)


def test_the_session_keeps_the_otlp_ca_over_requests_ca_bundle(monkeypatch, tmp_path: Path) -> None:
    ca, bundle = tmp_path / "otlp-ca.pem", tmp_path / "bundle.pem"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    with_ca = open_http_session(resolve_otlp_settings("http/protobuf", "https://c:4318", LOGS, {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca)}))
    assert with_ca.merge_environment_settings("https://c:4318/v1/logs", {}, None, None, None)["verify"] == str(ca)
    # No OTLP CA: the machine's bundle applies, as requests does it.
    without = open_http_session(resolve_otlp_settings("http/protobuf", "https://c:4318", LOGS, {}))
    assert without.merge_environment_settings("https://c:4318/v1/logs", {}, None, None, None)["verify"] == str(bundle)


def test_the_session_reads_the_environment_once_per_url_and_still_honours_it(monkeypatch, tmp_path: Path) -> None:
    """requests scans the environment for proxies and CA bundles on each request: the session reads
    it once per URL. What it read is what requests would have read, and each request gets a copy."""
    import requests.utils

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "bypassed.example")
    reads = []
    real = requests.utils.get_environ_proxies
    monkeypatch.setattr(requests.sessions, "get_environ_proxies", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    session = open_http_session(resolve_otlp_settings("http/protobuf", "https://c:4318", LOGS, {}))
    first = session.merge_environment_settings("https://c:4318/v1/logs", {}, None, None, None)
    assert first["proxies"]["https"] == "http://proxy.example:3128"
    first["proxies"].clear()  # what a caller does with its copy stays its own
    for _ in range(3):
        again = session.merge_environment_settings("https://c:4318/v1/logs", {}, None, None, None)
        assert again["proxies"]["https"] == "http://proxy.example:3128"
    assert session.merge_environment_settings("https://bypassed.example/v1/logs", {}, None, None, None)["proxies"] == {}
    assert reads == ["https://c:4318/v1/logs", "https://bypassed.example/v1/logs"]
    # A request's own proxies are never kept for the next one.
    mine = {"https": "http://mine.example:1"}
    assert (
        session.merge_environment_settings("https://c:4318/v1/logs", mine, None, None, None)["proxies"]["https"] == "http://mine.example:1"
    )
    assert (
        session.merge_environment_settings("https://c:4318/v1/logs", {}, None, None, None)["proxies"]["https"]
        == "http://proxy.example:3128"
    )


# -- transports: built from the exporters otel-rl made, never from an SDK exporter's internals ---------


def test_transport_for_takes_otel_rls_exporters_and_refuses_others() -> None:
    with pytest.raises(TypeError, match="otlp_exporters"):
        transport_for(OTLPLogExporter(endpoint="http://127.0.0.1:1/v1/logs"), LOGS)
    config = resolve_config({"endpoint": "http://127.0.0.1:1", "exporters": "otlp"}, environ={})
    exporters = otlp_exporters(config)
    for exporter, signal in zip(exporters, SIGNALS):
        assert settings_of(exporter).signal == signal
    with pytest.raises(ValueError, match="sends traces"):
        transport_for(exporters[0], LOGS)
    transport = transport_for(exporters[2], LOGS)
    assert isinstance(transport, HttpTransport) and transport.endpoint == "http://127.0.0.1:1/v1/logs"
    transport.close()  # shuts the exporter down with it
    for exporter in exporters[:2]:
        exporter.shutdown()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_transport_delivers_encoded_bytes_with_the_exporters_headers(protocol: str, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team%20a")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    with GrpcSink() if protocol == "grpc" else OtlpSink() as sink:
        config = resolve_config({"endpoint": sink.endpoint, "protocol": protocol, "exporters": "otlp"})
        exporters = otlp_exporters(config)
        transport = transport_for(exporters[2], LOGS)
        assert isinstance(transport, GrpcTransport if protocol == "grpc" else HttpTransport)
        outcome = transport.send(log_request(0, 3), 5.0)
        assert outcome.ok, outcome
        assert received_indices(sink) == [0, 1, 2]
        assert all(h.get("x-tenant") == "team a" for h in sink.received.headers)
        transport.close()
        for exporter in exporters[:2]:
            exporter.shutdown()


def test_a_transport_reports_a_refused_connection_without_raising(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    config = resolve_config({"endpoint": "http://127.0.0.1:1", "exporters": "otlp"}, environ={})
    exporters = otlp_exporters(config)
    transport = transport_for(exporters[0], TRACES)
    outcome = transport.send(log_request(0, 1), 2.0)
    assert not outcome.ok and not outcome.permanent and "Errno" in outcome.detail
    transport.close()
    for exporter in exporters[1:]:
        exporter.shutdown()
