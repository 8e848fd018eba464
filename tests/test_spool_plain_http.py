"""The spool's OTLP/HTTP posts on a plain http.client connection: used only where requests would add
nothing (no proxy, no userinfo, no TLS, no credential provider), delivering the same request."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from otlp_sink import OtlpSink

from otel_rl._sdk.otlp.settings import OtlpSettings, user_agent
from otel_rl._sdk.spool.plain_http import plain_http_target
from otel_rl._sdk.spool.store import LOGS, transport_for
from otel_rl.stack.process import free_port

BODY = b"\x0a\x00"  # an ExportLogsServiceRequest with one empty ResourceLogs


def settings(url: str, **extra: object) -> OtlpSettings:
    return OtlpSettings(LOGS, "http/protobuf", url, timeout_s=2, **extra)  # type: ignore[arg-type]


@contextmanager
def raw_http_server(*, close_after_reply: bool) -> Iterator[tuple[int, list[str], list[int]]]:
    """A loopback HTTP/1.1 server answering 200 to each request: (port, request lines, connections).
    ``close_after_reply``: it closes the connection after each reply without saying so (as a
    collector does with a connection idle past its keep-alive)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(10)
    lines: list[str] = []
    connections = [0]

    def serve_one(conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, data = data.split(b"\r\n\r\n", 1)
                length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                lines.append(head.split(b"\r\n")[0].decode())
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n")
                if close_after_reply:
                    return

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections[0] += 1
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], lines, connections
    finally:
        listener.close()
        thread.join(5)


def test_a_plain_http_collector_gets_the_post_without_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    import requests

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the plain URL went through requests")

    monkeypatch.setattr(requests.Session, "send", refuse)
    with OtlpSink() as sink:
        transport = transport_for(settings(f"{sink.endpoint}/v1/logs", headers={"Authorization": "Bearer t0ken"}))
        outcomes = [transport.send(BODY, 2) for _ in range(3)]  # the same connection, kept
        transport.close()
    assert [o.ok for o in outcomes] == [True] * 3
    assert sink.received.requests["/v1/logs"] == 3
    headers = sink.received.headers[-1]
    assert headers["authorization"] == "Bearer t0ken"
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["user-agent"] == user_agent()


def test_a_kept_connection_the_collector_closed_is_opened_again_once() -> None:
    with raw_http_server(close_after_reply=True) as (port, lines, connections):
        transport = transport_for(settings(f"http://127.0.0.1:{port}/v1/logs"))
        first, second = transport.send(BODY, 2), transport.send(BODY, 2)
        transport.close()
    assert first.ok and second.ok, second.detail
    assert lines == ["POST /v1/logs HTTP/1.1"] * 2
    assert connections[0] == 2


def test_an_unreachable_collector_is_retried_later_and_named_by_its_error() -> None:
    transport = transport_for(settings(f"http://127.0.0.1:{free_port()}/v1/logs"))
    outcome = transport.send(BODY, 2)
    transport.close()
    assert not outcome.ok and not outcome.permanent
    assert "Connection refused" in outcome.detail


def test_a_proxy_for_the_url_keeps_the_requests_session(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://collector.invalid:4318/v1/logs"  # reachable only through the proxy
    with raw_http_server(close_after_reply=False) as (port, lines, _):
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert plain_http_target(settings(url)) is None
        transport = transport_for(settings(url))
        outcome = transport.send(BODY, 2)
        transport.close()
    assert outcome.ok, outcome.detail
    assert lines == [f"POST {url} HTTP/1.1"]  # the proxy's form: the whole URL
    monkeypatch.setenv("NO_PROXY", "collector.invalid")
    assert plain_http_target(settings(url)) == ("collector.invalid", 4318, "/v1/logs")


@pytest.mark.parametrize(
    ("url", "extra"),
    [
        ("https://collector:4318/v1/logs", {}),  # TLS: the session's CA and client certificate
        ("http://user:secret@collector:4318/v1/logs", {}),  # requests turns userinfo into basic auth
        ("http://collector:4318/v1/logs", {"credential_provider": "corp"}),  # the provider's session
    ],
)
def test_urls_that_need_what_requests_adds_keep_it(url: str, extra: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert plain_http_target(settings(url, **extra)) is None
    assert plain_http_target(settings("http://collector:4318/v1/logs?tenant=a")) == ("collector", 4318, "/v1/logs?tenant=a")


def test_a_netrc_entry_for_the_host_keeps_the_requests_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine collector login ci password hunter2\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert plain_http_target(settings("http://collector:4318/v1/logs")) is None
    assert plain_http_target(settings("http://other:4318/v1/logs")) is not None
