"""Security of the export path: OTLP over TLS with a CA file and auth headers to real TLS
endpoints on 127.0.0.1, certificate errors that say what to fix, credentials that never reach any
output, capped attribute values and series, and text kept out of exports unless asked for.

The TLS endpoints are Python's ssl module in front of the counting OTLP/HTTP receiver, and
grpcio's TLS server for OTLP/gRPC (tests/otlp_sink.py), because these tests read every request's
headers, which a collector does not hand back; certificates are made per test session with
``cryptography``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import ssl
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from otlp_sink import GrpcSink, OtlpSink

import otel_rl
import otel_rl.runs.push as _push
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


@dataclass
class Pki:
    ca: Path  # the CA that signed the server certificate
    other_ca: Path  # a CA that did not
    cert: bytes
    key: bytes
    cert_file: Path
    key_file: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _ca(common: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = _ca("otel-rl test CA")
    _, other_cert = _ca("some other CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    paths = {name: folder / name for name in ("ca.pem", "other-ca.pem", "server.pem", "server.key")}
    paths["ca.pem"].write_bytes(_pem(ca_cert))
    paths["other-ca.pem"].write_bytes(_pem(other_cert))
    paths["server.pem"].write_bytes(_pem(server))
    paths["server.key"].write_bytes(key_pem)
    return Pki(paths["ca.pem"], paths["other-ca.pem"], _pem(server), key_pem, paths["server.pem"], paths["server.key"])


def server_context(pki: Pki) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.cert_file, pki.key_file)
    return context


@pytest.fixture
def secret() -> str:
    return "tok-" + secrets.token_hex(16)


def train(tel: otel_rl.Telemetry, steps: int = 10) -> None:
    for step in range(steps):
        with tel.step(step):
            with tel.stage("generate", cluster="actor_infer"):
                pass
            tel.log({"actor/pg_loss": float(step)})


def test_otlp_http_over_tls_with_a_ca_file_and_an_auth_header(pki: Pki, secret: str, make_telemetry, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{secret}")
    with OtlpSink(tls=server_context(pki), require_header=("Authorization", f"Bearer {secret}")) as sink:
        tel = make_telemetry(endpoint=sink.endpoint, protocol="http/protobuf", exporters="otlp")
        assert sink.endpoint.startswith("https://")
        train(tel)
        tel.shutdown()
        assert len(sink.received.events(N.RL_LOG_EVENT)) == 10 and len(sink.received.spans) == 20
        assert all(h.get("authorization") == f"Bearer {secret}" for h in sink.received.headers)


@pytest.mark.parametrize(("bundle_variable", "spool"), [("REQUESTS_CA_BUNDLE", True), ("CURL_CA_BUNDLE", False)])
def test_the_otlp_ca_file_wins_over_the_requests_ca_bundle(
    pki: Pki, make_telemetry, monkeypatch, bundle_variable: str, spool: bool
) -> None:
    # Managed machines often set these; requests would let them override the collector's CA. Both
    # ways out hold: the spool's senders and (spool off) the SDK exporters with otel-rl's session.
    monkeypatch.setenv(bundle_variable, str(pki.other_ca))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
    if not spool:
        monkeypatch.setenv("OTEL_RL_SPOOL_MAX_BYTES", "0")
    with OtlpSink(tls=server_context(pki)) as sink:
        tel = make_telemetry(endpoint=sink.endpoint, protocol="http/protobuf", exporters="otlp")
        assert (tel._providers.spool is not None) == spool
        train(tel)
        tel.shutdown()
        assert len(sink.received.events(N.RL_LOG_EVENT)) == 10 and len(sink.received.spans) == 20


def test_otlp_grpc_over_tls_with_a_ca_file_and_auth_metadata(pki: Pki, secret: str, make_telemetry, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{secret}")
    with GrpcSink(tls=(pki.key, pki.cert), require_metadata=("authorization", f"Bearer {secret}")) as sink:
        tel = make_telemetry(endpoint=sink.endpoint, protocol="grpc", exporters="otlp")
        train(tel)
        tel.shutdown()
        assert len(sink.received.events(N.RL_LOG_EVENT)) == 10 and len(sink.received.spans) == 20


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_wrong_ca_is_reported_naming_the_endpoint_and_the_ca_setting_and_nothing_is_lost(
    pki: Pki, make_telemetry, monkeypatch, caplog, protocol: str, tmp_path: Path
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.other_ca))
    sink_cm = OtlpSink(tls=server_context(pki)) if protocol != "grpc" else GrpcSink(tls=(pki.key, pki.cert))
    with sink_cm as sink:
        tel = make_telemetry(endpoint=sink.endpoint, protocol=protocol, exporters="otlp", run_dir=str(tmp_path / "run"))
        train(tel)
        tel.flush(timeout_s=5)
        errors = [r.getMessage() for r in caplog.records if "TLS certificate verification failed" in r.getMessage()]
        assert errors, [r.getMessage() for r in caplog.records]
        message = errors[0]
        assert f"127.0.0.1:{sink.port}" in message
        assert f"OTEL_EXPORTER_OTLP_CERTIFICATE={pki.other_ca}" in message
        assert len(errors) == 1 or len({e for e in errors}) == len(errors)  # once per endpoint
        assert sink.received.counts() == {"traces": 0, "logs": 0, "metrics": 0}
        tel.shutdown(timeout_s=1)
        # Fixed CA: what waited in the spool is delivered, exactly once.
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
        reports = _push.push(tmp_path / "run", endpoint=sink.endpoint, protocol=protocol, say=lambda line: None)
        assert reports and all(r.complete for r in reports)
        assert sorted(r[1][A.RL_STEP] for r in sink.received.events(N.RL_LOG_EVENT)) == list(range(10))
        assert len(sink.received.spans) == 20


CHILD = """
import logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)  # everything any library logs
import otel_rl
tel = otel_rl.init(service_name="secret-test", endpoint={endpoint!r}, protocol={protocol!r}, exporters="otlp,file",
                   run_dir={run_dir!r}, metric_export_interval_s=0.2)
for step in range(5):
    with tel.step(step):
        with tel.stage("generate"):
            pass
        tel.log({{"actor/pg_loss": float(step)}})
print(repr(tel), tel.config.public_dict(), flush=True)
tel.flush(timeout_s=3)
tel.shutdown(timeout_s=2)
"""


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_auth_headers_never_appear_in_any_output(pki: Pki, secret: str, tmp_path: Path, protocol: str) -> None:
    outputs: list[str] = []
    for token, expect_delivery in ((secret, True), (secret + "-wrong", False)):
        required = ("authorization", f"Bearer {secret}")
        sink_cm = (
            OtlpSink(tls=server_context(pki), require_header=("Authorization", required[1]))
            if protocol != "grpc"
            else GrpcSink(tls=(pki.key, pki.cert), require_metadata=required)
        )
        with sink_cm as sink:
            run_dir = tmp_path / f"run-{len(outputs)}"
            env = {
                **os.environ,
                "OTEL_EXPORTER_OTLP_CERTIFICATE": str(pki.ca),
                "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{token},x-tenant={token}",
            }
            code = CHILD.format(endpoint=sink.endpoint, protocol=protocol, run_dir=str(run_dir))
            done = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=90, cwd=tmp_path
            )
            assert done.returncode == 0, done.stderr[-3000:]
            delivered = len(sink.received.events(N.RL_LOG_EVENT))
            assert (delivered == 5) if expect_delivery else (delivered == 0), done.stderr[-3000:]
            outputs += [done.stdout, done.stderr]
            if not expect_delivery:
                assert ("401" in done.stderr) if protocol != "grpc" else ("UNAUTHENTICATED" in done.stderr)
            for path in run_dir.rglob("*"):
                if path.is_file():
                    outputs.append(path.read_bytes().decode("utf-8", "replace"))
    assert len(outputs) > 4
    for text in outputs:
        assert secret not in text
        assert secret.replace("-", "%2D") not in text


def test_attribute_values_are_capped_in_spans_events_and_metrics(make_telemetry, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "100")
    with OtlpSink() as sink:
        tel = make_telemetry(endpoint=sink.endpoint, exporters="otlp")
        long = "c" * 5000
        with tel.step(0):
            with tel.stage("generate", cluster=long):
                pass
        tel.record(M.RL_LOSS, 1.0, {A.RL_LOSS_TYPE: "policy", A.RL_CLUSTER: long})
        tel.event(N.RL_LOG_EVENT, {"k": 1.0}, {A.RL_CLUSTER: long}, step=0)
        tel.shutdown()
        spans = [s for s in sink.received.spans if s[2] == "rl.generate"]
        assert spans and spans[0][3][A.RL_CLUSTER] == "c" * 100
        points = [p for p in sink.received.points if p[0] == M.RL_LOSS]
        assert points and dict(points[0][1])[A.RL_CLUSTER] == "c" * 100
        events = [r for r in sink.received.events(N.RL_LOG_EVENT) if A.RL_CLUSTER in r[1]]
        assert events and events[0][1][A.RL_CLUSTER] == "c" * 100


def test_the_series_cap_drops_new_series_counted_and_reported_once(make_telemetry, monkeypatch, caplog) -> None:
    monkeypatch.setenv("OTEL_RL_SERIES_LIMIT", "50")
    tel = make_telemetry(exporters="none")
    for i in range(300):  # e.g. a sample id in an attribute: 300 series asked for
        tel.record(M.RL_LOSS, 1.0, {A.RL_LOSS_TYPE: "policy", A.RL_CLUSTER: f"sample-{i}"})
        tel.record(M.RL_STAGE_DURATION, [0.1, 0.2], {A.RL_STAGE: f"stage-{i}"})
    tel.flush()
    assert len(tel._latest.series(M.RL_LOSS)) == 50
    dropped = tel.latest(
        M.RL_TELEMETRY_DROPPED,
        {
            A.RL_TELEMETRY_DROP_REASON: A.RlTelemetryDropReasonValues.SERIES_LIMIT.value,
            A.RL_TELEMETRY_SIGNAL: A.RlTelemetrySignalValues.METRICS.value,
        },
    )
    assert dropped == 250 + 250 * 2  # gauge values one each, histogram values per value
    warnings = [r.getMessage() for r in caplog.records if "series in this process" in r.getMessage()]
    assert len(warnings) == 2 and any(M.RL_LOSS in w for w in warnings)


def test_text_stays_out_of_exports_unless_enabled(make_telemetry, monkeypatch) -> None:
    prompt = "Reverse the digits 12345 please"
    completion = "5 4 3 2 1 " * 20
    values = {"actor/pg_loss": 1.0, "status": "ok", "sample/prompt": prompt, "val/completion": completion}
    with OtlpSink() as sink:
        tel = make_telemetry(endpoint=sink.endpoint, exporters="otlp")
        tel.log(values, step=0)
        tel.shutdown()
        [event] = sink.received.events(N.RL_LOG_EVENT)
        body = event[2]
        assert body["status"] == "ok" and body["actor/pg_loss"] == 1.0
        assert body["sample/prompt"].startswith("<text withheld: 31 chars")
        assert body["val/completion"].startswith("<text withheld: 200 chars")
        assert all(prompt not in str(b) for b in sink.received.bodies)
    monkeypatch.setenv("OTEL_RL_EXPORT_TEXT", "true")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "50")
    with OtlpSink() as sink:
        tel = make_telemetry(endpoint=sink.endpoint, exporters="otlp")
        tel.log(values, step=0)
        tel.shutdown()
        [event] = sink.received.events(N.RL_LOG_EVENT)
        assert event[2]["sample/prompt"] == prompt and event[2]["val/completion"] == completion[:50]
