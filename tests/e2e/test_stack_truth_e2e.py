"""What the stack and ``otel-rl trace`` tell a user is true, against the real stack.

- every listening socket of every stack process (and its children) is on 127.0.0.1 or ::1;
- ``otel-rl trace --phoenix`` with two runs holding the same step lists the runs and exits 2
  unless ``--run-id`` picks one, and prints no Jaeger link when no Jaeger query service answers.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import socket
import time
import uuid
from typing import Any

import psutil
import pytest
from stack_support import init_in_phoenix_project, poll

from otel_rl.cli import main as cli_main
from otel_rl.runs.phoenix import PhoenixClient
from otel_rl.semconv import attributes as A
from otel_rl.stack import COMPONENT_NAMES
from otel_rl.stack.process import read_pid_file

pytestmark = pytest.mark.e2e


def _loopback(address: str) -> bool:
    """127.0.0.1 or ::1; gRPC binds 127.0.0.1 on a dual-stack socket, shown as ::ffff:127.0.0.1."""
    ip = ipaddress.ip_address(address)
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return str(ip) in ("127.0.0.1", "::1")


def test_every_listening_socket_of_the_stack_is_on_loopback(stack: Any) -> None:
    listening: dict[str, set[tuple[str, int]]] = {}
    for name in COMPONENT_NAMES:
        rec = read_pid_file(stack.data_dir / "run" / f"{name}.json")
        assert rec is not None, f"{name} has no PID file after up()"
        process = psutil.Process(rec.pid)
        sockets = set()
        for proc in [process, *process.children(recursive=True)]:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    sockets.add((conn.laddr.ip, conn.laddr.port))
        listening[name] = sockets
        # each port the stack names for the component is among what it listens on
        assert set(rec.ports.values()) <= {port for _, port in sockets}, f"{name}: ports {rec.ports} not all listening: {sockets}"
    exposed = {name: sorted(s for s in sockets if not _loopback(s[0])) for name, sockets in listening.items()}
    assert not any(exposed.values()), f"listening beyond loopback: { {n: s for n, s in exposed.items() if s} }"


def _send_steps(stack: Any, project: str, run_id: str, steps: int) -> None:
    tel = init_in_phoenix_project(
        project, service_name=f"svc-{run_id}", run_id=run_id, endpoint=stack.endpoints["otlp_http"], exporters="otlp", console=False
    )
    try:
        for step in range(1, steps + 1):
            with tel.step(step), tel.stage("generate"):
                time.sleep(0.01)
    finally:
        tel.shutdown()


def _trace(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["trace", *argv])
    return code, out.getvalue(), err.getvalue()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_trace_lists_the_runs_when_two_have_the_step_and_links_no_jaeger_that_does_not_run(stack: Any, tmp_path) -> None:
    project = f"two-runs-{uuid.uuid4().hex[:8]}"
    first, second = f"run-a-{uuid.uuid4().hex[:6]}", f"run-b-{uuid.uuid4().hex[:6]}"
    _send_steps(stack, project, first, 3)
    _send_steps(stack, project, second, 4)
    client = PhoenixClient(stack.endpoints["phoenix"], project=project)
    poll(
        lambda: client.runs(),
        lambda runs: sorted((r.run_id, r.steps) for r in runs) == [(first, 3), (second, 4)],
        60,
        "both runs in Phoenix",
    )

    phoenix = ["--phoenix", stack.endpoints["phoenix"], "--project", project, "--step", "3"]
    no_jaeger = ["--jaeger-url", f"http://127.0.0.1:{_closed_port()}"]
    code, out, err = _trace(*phoenix, *no_jaeger)
    assert code == 2, (out, err)
    assert "--run-id" in err and first in err and second in err, err
    rows = {line.split()[0]: line.split()[-1] for line in err.splitlines() if line.strip().startswith("run-")}
    assert rows == {first: "3", second: "4"}, err

    out_file = tmp_path / "step3.json"
    code, out, err = _trace(*phoenix, *no_jaeger, "--run-id", first, "--out", str(out_file))
    assert code == 0, (out, err)
    trace_id = json.loads(out_file.read_text())["data"][0]["traceID"]
    roots = [s for s in client.spans([("trace_id", trace_id)]) if s.parent_span_id is None]
    assert [r.attributes.get(A.RL_RUN_ID) for r in roots] == [first]
    assert "/trace/" not in out and "Search > JSON File" in out, out

    code, out, err = _trace(*phoenix, *no_jaeger, "--run-id", second)
    assert code == 0 and trace_id not in out, (out, err)
