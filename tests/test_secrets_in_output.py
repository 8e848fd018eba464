"""No credential reaches what otel-rl prints, logs or stores.

A collector endpoint with ``user:password@`` and a ``?token=`` query, an OTLP header with a bearer
token and a tracker API key (wandb, offline) are set; a real Telemetry exports to a closed port on
127.0.0.1 (so the delivery warnings fire), then ``otel-rl push`` and ``otel-rl demo`` run as
subprocesses. Every file under the run folder and the spool, every log record and everything
printed is searched for the four secrets. The endpoint must stay recognisable (scheme, host, port).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import otel_rl
from otel_rl._sdk.settings.redaction import redact_text, redact_url

SECRETS = ("PASSWORDSECRET", "TOKENSECRET", "HEADERSECRET", "TRACKERSECRET")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def secret_env(tmp_path: Path, port: int, per_signal: bool = False) -> dict[str, str]:
    home = tmp_path / "home"
    if per_signal:
        endpoints = {
            f"OTEL_EXPORTER_OTLP_{s.upper()}_ENDPOINT": f"http://user:PASSWORDSECRET@127.0.0.1:{port}/v1/{s}?token=TOKENSECRET&x=1"
            for s in ("traces", "metrics", "logs")
        }
    else:
        endpoints = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://user:PASSWORDSECRET@127.0.0.1:{port}/?token=TOKENSECRET#TOKENSECRET"}
    return {
        **endpoints,
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer HEADERSECRET",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "WANDB_MODE": "offline",
        "HOME": str(home),
        "WANDB_CONFIG_DIR": str(home / ".config/wandb"),
        "WANDB_CACHE_DIR": str(home / ".cache/wandb"),
        "WANDB_DATA_DIR": str(home / ".local/share/wandb"),
    }


def assert_no_secret(texts: dict[str, str], folders: list[Path]) -> None:
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret} in {where}: ...{text[max(0, text.find(secret) - 200) : text.find(secret) + 50]}"
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} in {path}"


def test_redact_url_keeps_the_endpoint_recognisable() -> None:
    assert redact_url("http://u:p@host:4318/v1/traces?token=t&x=1#frag") == "http://host:4318/v1/traces?token=***&x=***"
    assert redact_url("https://[::1]:4318/") == "https://[::1]:4318/"
    assert redact_url("collector:4317") == "collector:4317"
    assert redact_url(None) is None
    text = "Max retries exceeded with url: /v1/traces?token=abc (http://u:pw@h:1/p?k=v)"
    assert redact_text(text) == "Max retries exceeded with url: /v1/traces?token=*** (http://h:1/p?k=***)"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spool_max_bytes", "per_signal"), [(1 << 20, False), (0, False), (1 << 20, True)], ids=["spool", "no-spool", "per-signal"]
)
def test_no_secret_in_run_folder_spool_logs_or_output(tmp_path, monkeypatch, caplog, capfd, spool_max_bytes, per_signal):
    pytest.importorskip("wandb")
    import wandb

    port = closed_port()
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", *(f"OTEL_EXPORTER_OTLP_{s}_ENDPOINT" for s in ("TRACES", "METRICS", "LOGS"))):
        monkeypatch.delenv(name, raising=False)
    for name, value in secret_env(tmp_path, port, per_signal).items():
        monkeypatch.setenv(name, value)
    run = tmp_path / "run"
    caplog.set_level(logging.DEBUG)
    tel = otel_rl.init(
        run_dir=str(run),
        exporters="file,otlp",
        spool_max_bytes=spool_max_bytes,
        console=True,
        track_with="wandb",
        tracker_kwargs={"api_key": "TRACKERSECRET", "project": "p", "name": "secrets"},
    )
    try:
        for step in range(1, 4):
            with tel.step(step):
                tel.log({"actor/pg_loss": 0.1 * step})
        destinations = list(tel._providers.destinations)
        print("telemetry:", ", ".join(destinations))  # as the demo prints them
        # Until a delivery to the closed port has failed and been reported.
        deadline = time.monotonic() + 20
        words = ("cannot deliver", "Transient error", "Failed to export")
        while time.monotonic() < deadline and not any(w in r.getMessage() for r in caplog.records for w in words):
            time.sleep(0.2)
        tel.shutdown()
    finally:
        wandb.teardown()
    failures = [r for r in caplog.records if any(w in r.getMessage() for w in ("cannot deliver", "Transient error", "Failed to export"))]
    assert failures, "no delivery failure was reported: the test did not exercise the warnings"
    out, err = capfd.readouterr()
    logged = "\n".join(logging.Formatter("%(name)s %(message)s").format(r) for r in caplog.records)
    assert_no_secret({"stdout": out, "stderr": err, "log records": logged, "destinations": str(destinations)}, [run, tmp_path / "home"])
    info = json.loads((run / "run.json").read_text())
    if per_signal:  # the per-signal URLs, recognisable, in the delivery warnings
        assert any(
            f"http://127.0.0.1:{port}/v1/{s}?token=***&x=***" in r.getMessage() for r in failures for s in ("traces", "metrics", "logs")
        ), logged
    else:
        assert f"http://127.0.0.1:{port}/?token=***" in json.dumps(info["destinations"])  # still recognisable
        assert info["endpoint"] == f"http://127.0.0.1:{port}/?token=***"
    if spool_max_bytes and not per_signal:  # push needs OTEL_EXPORTER_OTLP_ENDPOINT or --endpoint
        # otel-rl push: what it prints about the collector it fails to reach.
        env = {**os.environ, **secret_env(tmp_path, port, per_signal)}
        proc = subprocess.run(
            [sys.executable, "-m", "otel_rl.cli", "push", str(run), "--timeout", "2", "--give-up-after", "1"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert f"127.0.0.1:{port}" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        assert_no_secret({"push stdout": proc.stdout, "push stderr": proc.stderr}, [run])


@pytest.mark.slow
def test_demo_cli_prints_no_secret(tmp_path):
    pytest.importorskip("torch")
    port = closed_port()
    env = {**os.environ, **secret_env(tmp_path, port), "OTEL_RL_SPOOL_MAX_BYTES": "1MiB"}
    out_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "otel_rl.cli", "demo", "--steps", "2", "--quiet", "--out", str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"telemetry: OTLP http/protobuf to http://127.0.0.1:{port}/?token=***" in proc.stdout, proc.stdout
    assert_no_secret({"demo stdout": proc.stdout, "demo stderr": proc.stderr}, [tmp_path])


GRPC_SCRIPT = """
import otel_rl
tel = otel_rl.init(console=False, exporters="otlp", run_dir={run_dir!r})
with tel.step(0):
    tel.log({{"critic/score/mean": 1.0}}, step=0)
tel.shutdown(timeout_s=3)
"""


def test_a_grpc_endpoint_with_user_and_password_is_refused_without_showing_it(tmp_path: Path) -> None:
    """gRPC cannot send user:password, and its channel quotes its target in every error ("errors
    resolving user:pw@host"): refused, naming where it came from and the fix, in a run and in push."""
    from otel_rl._sdk.otlp.settings import resolve_otlp_settings

    port = closed_port()
    endpoint = f"http://user:PASSWORDSECRET@127.0.0.1:{port}"
    # Even where nothing checks first, the target handed to gRPC has no credential in it.
    assert resolve_otlp_settings("grpc", endpoint, "traces").endpoint == f"127.0.0.1:{port}"
    env = {**os.environ, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    script = GRPC_SCRIPT.format(run_dir=str(tmp_path / "run"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "carries user:password, which gRPC cannot send" in proc.stderr and "OTEL_EXPORTER_OTLP_HEADERS" in proc.stderr
    assert "PASSWORDSECRET" not in proc.stdout + proc.stderr
    # push: a spool written over HTTP to a closed port, then pushed over gRPC with the same endpoint
    spooled = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script.replace('exporters="otlp"', 'exporters="otlp,file"')],
        capture_output=True,
        text=True,
        env=spooled,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_rl.cli",
            "push",
            str(tmp_path / "run"),
            "--protocol",
            "grpc",
            "--endpoint",
            endpoint,
            "--timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode != 0 and "carries user:password, which gRPC cannot send" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert_no_secret({"push stdout": proc.stdout, "push stderr": proc.stderr}, [tmp_path / "run"])


def test_redact_text_removes_user_and_password_before_a_host_without_a_scheme() -> None:
    line = "errors resolving user:PASSWORDSECRET@127.0.0.1:9: lookup failed for user:PASSWORDSECRET@127.0.0.1:9"
    assert redact_text(line) == "errors resolving 127.0.0.1:9: lookup failed for 127.0.0.1:9"
    assert redact_text("write to a@b.com") == "write to a@b.com"  # no password: left as it is


@pytest.mark.parametrize(
    "value",
    [
        'Authorization="Bearer HEADERSECRET"',  # a quote
        "Authorization=Bearer\\HEADERSECRET",  # a backslash
        "Authorization=Bearer HEADERSECRET;x",  # a semicolon
        "Authorization=Bearer HEADERSECRÉT",  # non-ASCII
        "x-team=ml,Bearer HEADERSECRET",  # an entry with no name
    ],
)
@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"])
def test_a_header_the_variable_cannot_carry_is_refused_at_init_naming_its_key_only(monkeypatch, caplog, tmp_path, value, variable) -> None:
    """The SDK's own parser logs such an entry whole ("Header format invalid! ... Bearer S3cret", six
    times) and sends no Authorization at all; otel-rl refuses it at init(), naming the header."""
    monkeypatch.setenv(variable, value)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ValueError) as raised:
        otel_rl.init(run_dir=str(tmp_path / "run"), exporters="otlp", endpoint=f"http://127.0.0.1:{closed_port()}", console=False)
    message = str(raised.value)
    assert variable in message and "HEADERSECRET" not in message and "HEADERSECR" not in message
    assert ("'Authorization'" in message) or ("entry 2 of 2 is not name=value" in message), message
    assert not [r.getMessage() for r in caplog.records if "SECR" in r.getMessage()]


def test_a_url_encoded_header_reaches_the_collector(monkeypatch, tmp_path) -> None:
    from otlp_sink import OtlpSink

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20%22HEADERSECRET%22, x-team = ml")
    with OtlpSink(require_header=("authorization", 'Bearer "HEADERSECRET"')) as sink:
        tel = otel_rl.init(run_dir=str(tmp_path / "run"), exporters="otlp", endpoint=sink.endpoint, console=False, spool_max_bytes=0)
        tel.log({"actor/entropy": 0.5}, step=1)
        tel.shutdown()
        received = sink.received
    assert received.headers and all(h.get("authorization") == 'Bearer "HEADERSECRET"' and h.get("x-team") == "ml" for h in received.headers)
    assert received.logs, "nothing arrived"
