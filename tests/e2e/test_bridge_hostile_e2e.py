"""The tracker bridge against 20 hostile clients from 10 addresses, end to end: the real
``otel-rl bridge`` on 127.0.0.1 with a jsonl tracker, while a genuine run on 127.0.0.1 posts 10
steps as a collector does (retrying 429 / 503 after Retry-After).

The hostile clients (127.0.0.2-11, each a host to the bridge), every kind at once:

- slow bodies: a 60 MB or a 15 MB ``Content-Length`` sent at 100 KiB/s, above the bridge's
  minimum rate, 4 connections from 2 addresses, reconnecting whenever cut off;
- run-id fillers: one-record requests, each with a new ``rl.run.id``, 2 clients;
- protobuf bombs: valid OTLP logs whose body inflates to 60 MiB (one record, one string) or 18 MiB
  (288 records of a 64 KiB string) from ~60 KB of gzip, 4 clients from 2 addresses;
- idle connections: 1,000 kept-open connections from each of 2 addresses;
- OTLP/JSON gzip bombs and bodies that stop after 16 bytes, 4 clients each.

Run twice: without a token, and with ``OTEL_RL_BRIDGE_TOKEN`` set, which the genuine run sends
and the hostile clients do not. The genuine run must get 10 of 10 steps into its tracker live; the bridge's peak RSS stays
under 150 MB, its threads bounded, what it writes under the folder within its disk budget
(``max_run_mb`` per run), and its log holds no traceback. ``-s`` prints the figures.
"""

from __future__ import annotations

import gzip
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from test_bridge_flood_e2e import (
    STEPS,
    SenderThreads,
    StepWatcher,
    _resource,
    json_bombs,
    peak_rss_mb,
    post_from,
    send_steps_like_a_collector,
    stall_mid_body,
    stop_bridge,
    wait_healthy,
)

from otel_rl import environment_variables as ENV
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N
from otel_rl.stack.process import free_port

pytestmark = pytest.mark.e2e

LIVE_WITHIN_S = 10.0
MAX_RUN_MB = 24  # the test's per-run disk budget (the default is larger)
RSS_LIMIT_MB = 150
IDLE_PER_HOST = 1000


def protobuf_bomb(run_id: str, records: int, string_bytes: int) -> bytes:
    """Valid OTLP logs: ``records`` rl.log records (steps 1, 2, ...), each one string of ``string_bytes``, gzipped."""
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    _resource(resource_logs.resource.attributes, run_id)
    scope = resource_logs.scope_logs.add()
    for step in range(1, records + 1):
        record = scope.log_records.add()
        record.event_name = N.RL_LOG_EVENT
        attr = record.attributes.add()
        attr.key, attr.value.int_value = A.RL_STEP, step
        value = record.body.kvlist_value.values.add()
        value.key, value.value.string_value = "text", "x" * string_bytes
    return gzip.compress(request.SerializeToString(), compresslevel=9)


def one_record(run_id: str) -> bytes:
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    _resource(resource_logs.resource.attributes, run_id)
    record = resource_logs.scope_logs.add().log_records.add()
    record.event_name = N.RL_LOG_EVENT
    attr = record.attributes.add()
    attr.key, attr.value.int_value = A.RL_STEP, 1
    value = record.body.kvlist_value.values.add()
    value.key, value.value.double_value = "loss", 1.0
    return request.SerializeToString()


class Hostile(SenderThreads):
    """The 20 hostile clients, running until :meth:`stop`; what they were answered, for the figures."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.answers: dict[str, dict[int, int]] = {}
        self.idle: list[socket.socket] = []
        self.json = json_bombs()
        self.pb = [protobuf_bomb("bomb-run", 1, 60 << 20), protobuf_bomb("bomb-run", 288, 64 << 10)]
        clients: list[tuple[Callable[..., None], str, tuple]] = []
        clients += [(self._slow_body, host, (size,)) for host in ("127.0.0.2", "127.0.0.3") for size in (60_000_000, 15_000_000)]
        clients += [(self._run_ids, "127.0.0.4", (i,)) for i in range(2)]
        clients += [(self._pb_bomb, host, (i,)) for host in ("127.0.0.5", "127.0.0.6") for i in range(2)]
        clients += [(self._idle_connections, host, ()) for host in ("127.0.0.7", "127.0.0.8")]
        clients += [(self._json_bomb, "127.0.0.9", (i,)) for i in range(4)]
        clients += [(self._stalled, host, ()) for host in ("127.0.0.10", "127.0.0.11") for _ in range(2)]
        assert len(clients) == 20 and len({host for _, host, _ in clients}) == 10
        self.threads = [threading.Thread(target=fn, args=(host, *args), daemon=True) for fn, host, args in clients]

    def stop(self) -> None:
        super().stop()
        for sock in self.idle:
            sock.close()

    def _answer(self, kind: str, status: int) -> None:
        with self.lock:
            counts = self.answers.setdefault(kind, {})
            counts[status] = counts.get(status, 0) + 1

    def _post(self, kind: str, host: str, body: bytes, headers: dict[str, str]) -> None:
        try:
            status, _ = post_from(host, self.port, "/v1/logs", body, headers, timeout=30)
        except OSError:
            status = 0
        self._answer(kind, status)

    def _slow_body(self, host: str, size: int) -> None:
        """Announce ``size`` bytes and send them at 100 KiB/s, 10 KiB every 0.1 s, until answered."""
        head = f"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: {size}\r\n\r\n".encode()
        while not self.stopping.is_set():
            status = 0
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1, source_address=(host, 0)) as sock:
                    sock.sendall(head)
                    sock.setblocking(False)
                    sent, answer = 0, b""
                    while not self.stopping.is_set() and sent < size and not answer:
                        try:
                            answer = sock.recv(4096)
                            break
                        except BlockingIOError:
                            pass
                        try:
                            sent += sock.send(b"\x0a" * min(10 << 10, size - sent))
                        except BlockingIOError:
                            pass
                        time.sleep(0.1)
                    if answer.startswith(b"HTTP/1.1 "):
                        status = int(answer[9:12])
            except OSError:
                pass
            self._answer(f"slow body {size // 1_000_000} MB", status)
            self.stopping.wait(0.05)

    def _run_ids(self, host: str, offset: int) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            self._post("new run ids", host, one_record(f"filler-{offset}-{n}"), {"Content-Type": "application/x-protobuf"})

    def _pb_bomb(self, host: str, offset: int) -> None:
        n = offset
        while not self.stopping.is_set():
            body = self.pb[n % 2]
            n += 1
            self._post(f"protobuf bomb {'60 MiB' if body is self.pb[0] else '18 MiB'}", host, body,
                       {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})  # fmt: skip
            self.stopping.wait(0.02)

    def _idle_connections(self, host: str) -> None:
        """Open IDLE_PER_HOST connections and keep them open, sending nothing."""
        opened = 0
        while opened < IDLE_PER_HOST and not self.stopping.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=2, source_address=(host, 0))
            except OSError:
                self._answer("idle connection", 0)
                continue
            with self.lock:
                self.idle.append(sock)
            opened += 1
        self._answer("idle connection", 1)

    def _json_bomb(self, host: str, offset: int) -> None:
        kinds, n = list(self.json), offset
        while not self.stopping.is_set():
            kind = kinds[n % len(kinds)]
            n += 1
            self._post("JSON bomb", host, self.json[kind], {"Content-Type": "application/json", "Content-Encoding": "gzip"})
            self.stopping.wait(0.02)

    def _stalled(self, host: str) -> None:
        while not self.stopping.is_set():
            answer, _ = stall_mid_body(self.port, host, self.stopping)
            self._answer("stalled body", int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else 0)


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads in /proc/<pid>/status")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("token", [None, "bridge-token-5f1c9e"], ids=["no-token", "token"])
def test_a_genuine_run_gets_every_step_live_through_20_hostile_clients_of_every_kind(tmp_path: Path, token: str | None) -> None:
    test_start = time.monotonic()
    port = free_port()
    config = tmp_path / "bridge.yaml"
    settings = {"listen": f"127.0.0.1:{port}", "track_with": "jsonl", "tracker_kwargs": {"log_dir": "jl"}, "max_run_mb": MAX_RUN_MB}
    config.write_text(yaml.safe_dump(settings))
    log = (tmp_path / "bridge.log").open("w")
    env = {k: v for k, v in os.environ.items() if k != ENV.OTEL_RL_BRIDGE_TOKEN} | ({ENV.OTEL_RL_BRIDGE_TOKEN: token} if token else {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_rl.cli", "bridge", "--config", str(config)],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    hostile = Hostile(port)
    most_threads = 0
    try:
        wait_healthy(port, proc, 30)
        watcher = StepWatcher(tmp_path / "jl" / "genuine-run" / "metrics.jsonl")
        hostile.start()
        time.sleep(3.0)  # every kind is on (the idle connections opened, the slow bodies hold slots) before the run sends
        sampling = threading.Event()

        def sample_threads() -> None:
            nonlocal most_threads
            while not sampling.is_set() and proc.poll() is None:
                most_threads = max(most_threads, threads_of(proc.pid))
                sampling.wait(0.2)

        sampler = threading.Thread(target=sample_threads, daemon=True)
        sampler.start()
        sent_at, statuses = send_steps_like_a_collector(port, "genuine-run", token)
        end = time.monotonic() + LIVE_WITHIN_S
        while len(watcher.seen_at) < STEPS and time.monotonic() < end:
            time.sleep(0.1)
        assert proc.poll() is None, "the bridge died under the hostile clients"
        peak_mb = peak_rss_mb(proc.pid)
        sampling.set()
        hostile.stop()
        watcher.stop()
    finally:
        hostile.stopping.set()
        stop_bridge(proc)
        log.close()
        for sock in hostile.idle:
            sock.close()
    seen_at = watcher.seen_at
    live = sorted(s for s in sent_at if s in seen_at and seen_at[s] - sent_at[s] <= LIVE_WITHIN_S)
    latencies = [seen_at[s] - sent_at[s] for s in live]
    written = folder_bytes(tmp_path / "jl")
    runs = sum(1 for p in (tmp_path / "jl").iterdir() if p.is_dir()) if (tmp_path / "jl").exists() else 0
    print(
        f"\n20 hostile clients from 10 addresses: genuine steps live {len(live)}/{STEPS} (latency median "
        f"{statistics.median(latencies) if latencies else float('nan'):.2f} s, max {max(latencies, default=float('nan')):.2f} s); "
        f"bridge peak RSS {peak_mb:.0f} MB, most threads {most_threads}; {written / 1e6:.1f} MB written in {runs} run folders; "
        f"genuine answers {dict((s, statuses.count(s)) for s in sorted(set(statuses)))}; "
        f"hostile answers {hostile.answers}; test took {time.monotonic() - test_start:.0f} s"
    )
    assert live == list(range(1, STEPS + 1)), f"only steps {live} of {STEPS} reached the tracker live"
    assert peak_mb < RSS_LIMIT_MB, f"bridge peak RSS {peak_mb:.0f} MB"
    assert most_threads < 400, f"{most_threads} threads for {2 * IDLE_PER_HOST} idle connections"
    # the bomb run wrote up to its max_run_mb, then was refused (its jsonl lines are its OTLP size and a few bytes)
    biggest = max((folder_bytes(p) for p in (tmp_path / "jl").iterdir() if p.is_dir()), default=0)
    assert biggest < MAX_RUN_MB * 1.1 * 2**20, f"a run folder holds {biggest / 2**20:.1f} MiB"
    if token:  # nothing of theirs was read past the headers
        assert all(set(answers) <= {0, 1, 401} for answers in hostile.answers.values()), hostile.answers
        assert biggest < 1 << 20
    else:
        assert MAX_RUN_MB / 2 * 2**20 < biggest, f"the bomb run wrote only {biggest / 2**20:.1f} MiB"
        assert 507 in hostile.answers["protobuf bomb 18 MiB"], hostile.answers
    bridge_log = (tmp_path / "bridge.log").read_text()
    assert "Traceback" not in bridge_log, bridge_log[-3000:]
