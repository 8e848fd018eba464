"""What the stack and ``otel-rl trace`` tell a user is true, against the real stack.

- every listening socket of every stack process (and its children) is on 127.0.0.1 or ::1;
- ``otel-rl trace --jaeger`` finds a step through Jaeger's query API; with two runs holding the
  same step it lists the runs and exits 2 unless ``--run-id`` picks one;
- the Jaeger link is printed exactly when that Jaeger holds the trace (a run folder's trace that
  never reached it, a closed port, something that is not Jaeger: no link, the upload hint instead).
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
from stack_support import poll

import otel_rl
from otel_rl.cli import main as cli_main
from otel_rl.runs.jaeger import JaegerClient
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


def _send_steps(stack: Any, service: str, run_id: str, steps: int) -> None:
    tel = otel_rl.init(service_name=service, run_id=run_id, endpoint=stack.endpoints["otlp_http"], exporters="otlp", console=False)
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


def test_trace_lists_the_runs_when_two_have_the_step_and_picks_one_by_run_id(stack: Any, tmp_path) -> None:
    service = f"two-runs-{uuid.uuid4().hex[:8]}"
    first, second = f"run-a-{uuid.uuid4().hex[:6]}", f"run-b-{uuid.uuid4().hex[:6]}"
    _send_steps(stack, service, first, 3)
    _send_steps(stack, service, second, 4)
    client = JaegerClient(stack.endpoints["jaeger"])
    poll(
        lambda: client.runs(service),
        lambda runs: sorted((r.run_id, r.steps) for r in runs) == [(first, 3), (second, 4)],
        60,
        "both runs in Jaeger",
    )

    jaeger = ["--jaeger", stack.endpoints["jaeger"], "--service", service, "--step", "3"]
    code, out, err = _trace(*jaeger)
    assert code == 2, (out, err)
    assert "--run-id" in err and first in err and second in err, err
    rows = {line.split()[1]: line.split()[-1] for line in err.splitlines() if line.strip().startswith(service)}
    assert rows == {first: "3", second: "4"}, err

    out_file = tmp_path / "step3.json"
    code, out, err = _trace(*jaeger, "--run-id", first, "--out", str(out_file))
    assert code == 0, (out, err)
    trace_id = json.loads(out_file.read_text())["data"][0]["traceID"]
    roots = [s for s in client.trace(trace_id) if s.parent_span_id is None]
    assert [r.attributes.get(A.RL_RUN_ID) for r in roots] == [first]
    assert f"  Jaeger:  {stack.endpoints['jaeger']}/trace/{trace_id}" in out, out

    code, out, err = _trace(*jaeger, "--run-id", second)
    assert code == 0 and trace_id not in out, (out, err)
    # Without --service every service Jaeger lists is searched: the same two runs.
    code, out, err = _trace("--jaeger", stack.endpoints["jaeger"], "--step", "4", "--run-id", second)
    assert code == 0 and "rl.generate" in out, (out, err)


def test_the_jaeger_link_is_printed_only_when_that_jaeger_holds_the_trace(stack: Any, tmp_path) -> None:
    # A run that reached Jaeger through the stack (and kept a run folder), and one that only has a run folder.
    shipped = otel_rl.init(
        service_name="link-test",
        run_id=f"linked-{uuid.uuid4().hex[:6]}",
        endpoint=stack.endpoints["otlp_grpc"],
        protocol="grpc",
        exporters="otlp,file",
        run_dir=str(tmp_path / "shipped"),
        console=False,
    )
    with shipped.step(1), shipped.stage("generate"):
        pass
    shipped.shutdown()
    local = otel_rl.init(service_name="link-test", run_dir=str(tmp_path / "local"), console=False)
    with local.step(1), local.stage("generate"):
        pass
    local.shutdown()
    jaeger = stack.endpoints["jaeger"]
    code, out, err = poll(
        lambda: _trace("--step", "1", "--run-dir", str(tmp_path / "shipped"), "--jaeger", jaeger),
        lambda r: "/trace/" in r[1],
        60,
        "the shipped run's trace in Jaeger",
    )
    assert code == 0 and f"  Jaeger:  {jaeger}/trace/" in out, (out, err)
    code, out, err = _trace("--step", "1", "--run-dir", str(tmp_path / "local"), "--jaeger", jaeger)
    assert code == 0 and "/trace/" not in out and "does not hold this trace" in out and "Search > JSON File" in out, out
    for elsewhere in (f"http://127.0.0.1:{_closed_port()}", stack.endpoints["victoria_metrics"]):  # nothing there; not Jaeger
        code, out, err = _trace("--step", "1", "--run-dir", str(tmp_path / "shipped"), "--jaeger", elsewhere)
        assert code == 0 and "/trace/" not in out and "does not hold this trace" in out, (elsewhere, out)
