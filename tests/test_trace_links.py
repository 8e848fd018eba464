"""``otel-rl trace`` prints a Jaeger link only when a Jaeger query service answers at ``--jaeger-url``."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl import cli
from otel_rl.runs.jaeger_json import jaeger_answers


@contextlib.contextmanager
def _jaeger_query_stand_in(services_status: int = 200) -> Iterator[str]:
    """A stand-in for Jaeger's query service (Jaeger does not run here: it needs Docker or its binary). It
    answers ``GET /api/services`` as jaeger-query's HTTP API does (cmd/query/app/http_handler.go:
    ``{"data": [names], "total": N, "limit": 0, "offset": 0, "errors": null}``), on 127.0.0.1."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            ok = self.path == "/api/services" and services_status == 200
            body = json.dumps({"data": ["trace-test"], "total": 1, "limit": 0, "offset": 0, "errors": None} if ok else {}).encode()
            self.send_response(200 if ok else services_status if self.path == "/api/services" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # keep pytest's output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_step_run(run_dir: Path) -> Path:
    tel = otel_rl.init(run_dir=str(run_dir), console=False, service_name="trace-test")
    with tel.step(1), tel.stage("generate"):
        pass
    tel.shutdown()
    return run_dir


def test_the_jaeger_link_is_printed_when_jaeger_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _one_step_run(tmp_path / "run")
    with _jaeger_query_stand_in() as jaeger:
        assert cli.main(["trace", "--step", "1", "--run-dir", str(run_dir), "--jaeger-url", jaeger + "/"]) == 0
    printed = capsys.readouterr().out
    assert f"  Jaeger:  {jaeger}/trace/" in printed, printed


@pytest.mark.parametrize("answer", ["closed port", "500", "not Jaeger"])
def test_no_jaeger_link_without_a_jaeger_query_service(tmp_path: Path, capsys: pytest.CaptureFixture[str], answer: str) -> None:
    run_dir = _one_step_run(tmp_path / "run")
    with contextlib.ExitStack() as stack:
        if answer == "closed port":
            url = f"http://127.0.0.1:{_closed_port()}"
        else:
            url = stack.enter_context(_jaeger_query_stand_in(500 if answer == "500" else 404))
            if answer == "not Jaeger":
                url += "/elsewhere"  # answers 404 for /elsewhere/api/services
        assert not jaeger_answers(url)
        assert cli.main(["trace", "--step", "1", "--run-dir", str(run_dir), "--jaeger-url", url]) == 0
    printed = capsys.readouterr().out
    assert "/trace/" not in printed
    assert f"none answers at {url}; load the file --out FILE writes in Jaeger's UI (Search > JSON File)" in printed
