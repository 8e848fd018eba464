"""The tracker bridge under a flood, end to end: the real ``otel-rl bridge`` command on 127.0.0.1
with a jsonl tracker, hit from several hosts (127.0.0.2-6: loopback addresses, each a host to
the bridge) by OTLP/JSON gzip bombs of every value kind (deep nested arrays, many small objects,
huge strings, many numbers, many literals) and by senders that stop mid-body, while a genuine run
on 127.0.0.1 posts 10 steps of OTLP logs and metrics, retrying 429 / 503 after Retry-After as a
collector does. Most of its steps must reach the tracker's file live, during the flood; the
bridge's peak RSS (VmHWM) stays bounded; its log holds no traceback. The bridge is stopped by its
PID however the test ends; the whole test runs in well under a minute. ``-s`` prints the figures.
"""

from __future__ import annotations

import gzip
import http.client
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N
from otel_rl.stack.process import free_port
from otel_rl.trackers.jsonl import read_jsonl

pytestmark = pytest.mark.e2e

STEPS = 10
STEP_EVERY_S = 1.0  # a training step a second
LIVE_WITHIN_S = 10.0  # a step counts as live when the tracker has it this soon after it was first sent
BOMB_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SLOW_HOSTS = ("127.0.0.5", "127.0.0.6")
GENUINE_HOST = "127.0.0.1"
_BOMB_BYTES = 7 << 20  # inflated: under the 8 MiB OTLP/JSON limit, so only counting refuses them


def json_bombs() -> dict[str, bytes]:
    """One gzip bomb per JSON value kind (~7 MiB inflated, 10-40 KB on the wire)."""
    n = _BOMB_BYTES
    inner = {
        "deep nested arrays": b"[" * (n // 2) + b"]" * (n // 2),
        "many small objects": b"[" + b"{}," * (n // 3) + b"{}]",
        "huge strings": b'["' + b"x" * (1 << 20) + b'",' + b'"y",' * ((n - (1 << 20)) // 4) + b'"z"]',
        "many numbers": b"[" + b"0," * (n // 2) + b"0]",
        "many literals": b"[" + b"null,true," * (n // 10) + b"false]",
    }
    return {kind: gzip.compress(b'{"resourceLogs":[],"padding":' + body + b"}", compresslevel=9) for kind, body in inner.items()}


def _resource(attributes: object, run_id: str) -> None:
    for key, value in ((A.SERVICE_NAME, "grpo-flood"), (A.RL_RUN_ID, run_id)):
        kv = attributes.add()  # type: ignore[attr-defined]
        kv.key, kv.value.string_value = key, value
    kv = attributes.add()  # type: ignore[attr-defined]
    kv.key, kv.value.int_value = A.RL_RANK, 0


def step_logs(run_id: str, step: int) -> bytes:
    """One rl.log event as otel-rl's SDK exports it: the step's key -> value map in a kvlist body."""
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    _resource(resource_logs.resource.attributes, run_id)
    record = resource_logs.scope_logs.add().log_records.add()
    record.event_name = N.RL_LOG_EVENT
    record.time_unix_nano = time.time_ns()
    attr = record.attributes.add()
    attr.key, attr.value.int_value = A.RL_STEP, step
    for i in range(20):
        value = record.body.kvlist_value.values.add()
        value.key, value.value.double_value = f"actor/metric_{i}", step + i / 100
    return request.SerializeToString()


def step_metrics(run_id: str, step: int) -> bytes:
    """The run's rl.progress.step gauge, as the SDK's periodic metrics export sends it."""
    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    _resource(resource_metrics.resource.attributes, run_id)
    metric = resource_metrics.scope_metrics.add().metrics.add()
    metric.name = "rl.progress.step"
    point = metric.gauge.data_points.add()
    point.as_double, point.time_unix_nano = float(step), time.time_ns()
    return request.SerializeToString()


def post_from(source: str, port: int, path: str, body: bytes, headers: dict[str, str], timeout: float = 20.0) -> tuple[int, float]:
    """POST from the loopback address ``source``; (status, Retry-After seconds or 0)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, float(response.getheader("Retry-After") or 0)
    finally:
        conn.close()


class SenderThreads:
    """Sender threads against the bridge on ``port``, running until :meth:`stop`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # guards what the senders record
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        end = time.monotonic() + 15
        for thread in self.threads:  # daemons: one stuck in a long request is left behind
            thread.join(max(0.0, end - time.monotonic()))


class Flood(SenderThreads):
    """Bomb threads and slow senders, running until :meth:`stop`; what they saw, for the figures."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.bombs = json_bombs()
        self.bomb_answers: dict[int, int] = {}
        self.refusal_s: dict[str, list[float]] = {kind: [] for kind in self.bombs}
        self.slot_held_s: list[float] = []
        self.threads = [threading.Thread(target=self._bomb, args=(host, i), daemon=True) for host in BOMB_HOSTS for i in range(2)]
        self.threads += [threading.Thread(target=self._slow, args=(host,), daemon=True) for host in SLOW_HOSTS for _ in range(2)]

    def _bomb(self, host: str, offset: int) -> None:
        kinds = list(self.bombs)
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        n = offset
        while not self.stopping.is_set():
            kind = kinds[n % len(kinds)]
            n += 1
            start = time.monotonic()
            try:
                status, _ = post_from(host, self.port, "/v1/logs", self.bombs[kind], headers)
            except OSError:
                status = 0
            with self.lock:
                self.bomb_answers[status] = self.bomb_answers.get(status, 0) + 1
                if status == 413:
                    self.refusal_s[kind].append(time.monotonic() - start)
            self.stopping.wait(0.02)

    def _slow(self, host: str) -> None:
        """Announce a 100 KB body, send 16 bytes of it, stop; reconnect as soon as the bridge lets go."""
        while not self.stopping.is_set():
            answer, held_s = stall_mid_body(self.port, host, self.stopping)
            if answer.startswith(b"HTTP/1.1 408"):
                with self.lock:
                    self.slot_held_s.append(held_s)


def stall_mid_body(port: int, host: str, stopping: threading.Event) -> tuple[bytes, float]:
    """From ``host``, announce a 100 KB body, send 16 bytes of it and wait; (the bridge's answer's
    first bytes, or b"" when it closed or ``stopping`` was set; seconds waited)."""
    head = b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100000\r\n\r\n"
    answer, start = b"", time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1, source_address=(host, 0)) as sock:
            sock.sendall(head + b"\x0a" * 16)
            start = time.monotonic()
            while not stopping.is_set():
                try:
                    answer = sock.recv(4096)
                    break
                except TimeoutError:
                    continue
    except OSError:
        stopping.wait(0.05)
    return answer, time.monotonic() - start


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def stop_bridge(proc: subprocess.Popen) -> None:
    """Stop the bridge by its PID: SIGTERM (it flushes its trackers), SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def wait_healthy(port: int, proc: subprocess.Popen, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, "the bridge exited at start"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the bridge did not answer /healthz within {deadline_s} s")


class StepWatcher:
    """When each step first shows up in the tracker's jsonl file (polled every 0.1 s in a thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen_at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            if self.path.exists():
                now = time.monotonic()
                for step, _ in read_jsonl(self.path):
                    if step is not None:
                        self.seen_at.setdefault(step, now)
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def send_steps_like_a_collector(port: int, run_id: str, token: str | None = None) -> tuple[dict[int, float], list[int]]:
    """A step a second, logs then metrics, each retried on 429 / 503 after Retry-After (at most
    LIVE_WITHIN_S a request), with the bridge's bearer ``token`` if given; when each step was
    first sent, and every answer's status."""
    sent_at: dict[int, float] = {}
    statuses: list[int] = []
    begin = time.monotonic()
    sending_ends = begin + STEPS * STEP_EVERY_S + LIVE_WITHIN_S  # the test's own bound, however the bridge answers
    headers = {"Content-Type": "application/x-protobuf", **({"Authorization": f"Bearer {token}"} if token else {})}
    for step in range(1, STEPS + 1):
        time.sleep(max(0.0, begin + (step - 1) * STEP_EVERY_S - time.monotonic()))
        sent_at[step] = time.monotonic()
        for path, body in (("/v1/logs", step_logs(run_id, step)), ("/v1/metrics", step_metrics(run_id, step))):
            give_up = min(time.monotonic() + LIVE_WITHIN_S, sending_ends)
            while time.monotonic() < give_up:
                try:
                    status, retry_after = post_from(GENUINE_HOST, port, path, body, headers, timeout=max(1.0, give_up - time.monotonic()))
                except OSError:
                    status, retry_after = 0, 0.5
                statuses.append(status)
                if status not in (0, 429, 503):
                    break
                time.sleep(min(retry_after or 0.5, 1.0) / 2)
    return sent_at, statuses


def test_a_genuine_run_reaches_its_tracker_live_while_bombs_and_slow_senders_flood_the_bridge(tmp_path: Path) -> None:
    test_start = time.monotonic()
    port = free_port()
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{port}", "track_with": "jsonl", "tracker_kwargs": {"log_dir": "jl"}}))
    log = (tmp_path / "bridge.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_rl.cli", "bridge", "--config", str(config)], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT
    )
    flood = Flood(port)
    try:
        wait_healthy(port, proc, 30)
        watcher = StepWatcher(tmp_path / "jl" / "genuine-run" / "metrics.jsonl")
        flood.start()
        flood_began = time.monotonic()
        time.sleep(1.0)  # the flood is on before the run sends
        sent_at, statuses = send_steps_like_a_collector(port, "genuine-run")
        end = time.monotonic() + LIVE_WITHIN_S  # the flood goes on while the last steps may still be on their way
        while len(watcher.seen_at) < STEPS and time.monotonic() < end:
            time.sleep(0.1)
        flood_s = time.monotonic() - flood_began
        assert proc.poll() is None, "the bridge died under the flood"
        peak_mb = peak_rss_mb(proc.pid)
        flood.stop()
        watcher.stop()
    finally:
        flood.stopping.set()
        stop_bridge(proc)
        log.close()
    seen_at = watcher.seen_at
    live = sorted(s for s in sent_at if s in seen_at and seen_at[s] - sent_at[s] <= LIVE_WITHIN_S)
    latencies = [seen_at[s] - sent_at[s] for s in live]
    refusals = {kind: statistics.median(times) for kind, times in flood.refusal_s.items() if times}
    held = statistics.median(flood.slot_held_s) if flood.slot_held_s else float("nan")
    print(
        f"\nflood of {flood_s:.0f} s from {len(BOMB_HOSTS)} bomb hosts (2 threads each) and {len(SLOW_HOSTS)} slow-sender hosts "
        f"(2 each): genuine steps delivered live {len(live)}/{STEPS} (latency median "
        f"{statistics.median(latencies) if latencies else float('nan'):.2f} s, max {max(latencies, default=float('nan')):.2f} s); "
        f"bridge peak RSS (VmHWM) {peak_mb:.0f} MB; bomb answers {dict(sorted(flood.bomb_answers.items()))}; "
        f"median refusal per kind {', '.join(f'{k} {v:.2f} s' for k, v in refusals.items())}; "
        f"slow senders held a slot {held:.1f} s (median of {len(flood.slot_held_s)}); "
        f"genuine answers {dict((s, statuses.count(s)) for s in sorted(set(statuses)))}; test took {time.monotonic() - test_start:.0f} s"
    )
    assert len(live) >= 8, f"only steps {live} of {STEPS} reached the tracker live"
    assert peak_mb < 512, f"bridge peak RSS {peak_mb:.0f} MB"
    assert all(kind in refusals for kind in flood.bombs), flood.bomb_answers  # every kind refused with 413
    assert max(refusals.values()) < 10  # by counting, not after seconds of parsing
    assert held < 15  # body_timeout_s (5 s by default), not a minute
    bridge_log = (tmp_path / "bridge.log").read_text()
    assert "Traceback" not in bridge_log, bridge_log[-3000:]
