"""The tracker bridge under hostile input, served for real on 127.0.0.1: broken chunked
bodies, decompression and message bombs, a flood of requests and of run ids, per-record bad
values, a bearer token, and run ids that try to forge log lines. Every test is bounded in time
(socket timeouts) and in memory (the bridge's RSS is sampled with psutil)."""

from __future__ import annotations

import gzip
import io
import json
import logging
import math
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from test_bridge import MemoryTracker, get, logs_request, make_bridge, memory_tracker, post, restore_registry  # noqa: F401 - fixtures

from otel_rl import environment_variables as ENV
from otel_rl.bridge.limits import RequestLimits
from otel_rl.stack.process import free_port
from otel_rl.trackers.jsonl import read_jsonl

_BOMB_INFLATED = 63 << 20  # 63 MB of two-byte empty ResourceLogs messages: ~2 GB once decoded


def _bomb() -> bytes:
    return gzip.compress(b"\x0a\x00" * (_BOMB_INFLATED // 2), compresslevel=9)


def _raw(port: int, head: str, body: bytes = b"", timeout: float = 5.0) -> bytes:
    """Send a raw HTTP request and read the first response (raises socket.timeout when none comes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        return data


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


class RssPeak:
    """Samples a process's RSS every 20 ms in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# ---- 1. chunked bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["-1", "+5", "0x10", "1_0", "zz", ""])
def test_a_negative_or_non_hex_chunk_size_is_refused_with_400_at_once(make_bridge, size: str) -> None:
    bridge = make_bridge({"track_with": "stdout"})
    port = bridge.address[1]
    head = "POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\n\r\n"
    # the connection stays open: a bridge that reads "until the peer closes" never answers
    start = time.monotonic()
    response = _raw(port, head, f"{size}\r\nabcdefghijklmnop\r\n".encode(), timeout=5)
    assert _status(response) == 400 and time.monotonic() - start < 4
    assert get(f"{bridge.url}/healthz")[0] == 200  # still serving
    # a well-formed chunked body still goes through
    body = logs_request("chunky", range(1, 3)).SerializeToString()
    ok = _raw(port, head, f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    assert _status(ok) == 200


# ---- 2. bombs, limits and admission --------------------------------------------------------------


def test_a_gzip_bomb_of_empty_messages_is_refused_before_it_is_decoded(make_bridge) -> None:
    bridge = make_bridge({"track_with": "stdout"})
    bomb = _bomb()
    assert len(bomb) < 200_000
    with RssPeak(psutil.Process().pid) as rss:
        base = rss.proc.memory_info().rss
        start = time.monotonic()
        status, _, _ = post(f"{bridge.url}/v1/logs", bomb, encoding="gzip", timeout=30)
    assert status == 413
    assert time.monotonic() - start < 5
    assert rss.peak - base < 400 << 20, f"{(rss.peak - base) >> 20} MB for one bomb"
    assert bridge.stats()["bad_requests"] == 1


def test_records_resources_and_points_per_request_are_bounded(make_bridge, memory_tracker: type[MemoryTracker]) -> None:
    bridge = make_bridge({"track_with": "memory"})
    bridge.limits = RequestLimits(max_records=5, max_resources=2)
    url = f"{bridge.url}/v1/logs"
    assert post(url, logs_request("six", range(1, 7)).SerializeToString())[0] == 413
    assert post(url, logs_request("five", range(1, 6)).SerializeToString())[0] == 200
    three = ExportLogsServiceRequest()
    for run in ("r1", "r2", "r3"):
        three.resource_logs.append(logs_request(run, range(1, 2)).resource_logs[0])
    assert post(url, three.SerializeToString())[0] == 413
    # OTLP/JSON is bounded too (the JSON parser builds Python objects as it goes)
    as_json = json.dumps({"resourceLogs": [{} for _ in range(50)]}).encode()
    bridge.limits = RequestLimits(max_messages=20)
    assert post(url, as_json, content_type="application/json")[0] == 413
    assert bridge.wait_idle()
    assert [s for t in memory_tracker.instances for s, _ in t.steps] == [1, 2, 3, 4, 5]


def test_requests_beyond_the_in_flight_cap_get_429_with_retry_after(make_bridge) -> None:
    bridge = make_bridge({"track_with": "stdout", "max_requests_in_flight": 2, "max_requests_per_client": 2})
    port = bridge.address[1]
    stalled = []
    for _ in range(2):  # two senders that announce a body and stall: each holds a slot (until body_timeout_s)
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100\r\n\r\n")
        stalled.append(sock)
    try:
        time.sleep(0.3)
        status, headers, _ = post(f"{bridge.url}/v1/logs", logs_request("third", range(1, 2)).SerializeToString(), timeout=5)
        assert status == 429 and headers["Retry-After"] == "1"
    finally:
        for sock in stalled:
            sock.close()
    time.sleep(0.3)  # the stalled requests end (their peers closed) and free their slots
    assert post(f"{bridge.url}/v1/logs", logs_request("third", range(1, 2)).SerializeToString())[0] == 200
    assert bridge.stats()["bad_requests"] == 2  # the bodies cut short are refused, not decoded as empty requests


def test_a_sender_posting_again_on_its_answer_finds_its_slot_free(make_bridge, monkeypatch: pytest.MonkeyPatch) -> None:
    # The slot is given back before the answer is written: a slow give-back (a busy host) cannot make
    # the sender's next request count against its own share of the bridge.
    from otel_rl.bridge.admission import ClientSlots

    give_back = ClientSlots.release

    def slow_release(self: ClientSlots, slot: Any) -> None:
        time.sleep(0.3)
        give_back(self, slot)

    monkeypatch.setattr(ClientSlots, "release", slow_release)
    bridge = make_bridge({"track_with": "stdout", "max_requests_in_flight": 2, "max_requests_per_client": 1})
    for first in (1, 2, 3):
        assert post(f"{bridge.url}/v1/logs", logs_request("again", range(first, first + 1)).SerializeToString())[0] == 200
    assert bridge.stats()["busy_responses"] == 0


# ---- 3. per-record errors ------------------------------------------------------------------------


def test_a_record_with_a_bad_step_or_rank_is_skipped_and_counted_and_the_rest_delivered(
    make_bridge, memory_tracker: type[MemoryTracker]
) -> None:
    bridge = make_bridge({"track_with": "memory", "ranks": "all"})
    request = logs_request("mixed", range(1, 6))
    records = request.resource_logs[0].scope_logs[0].log_records
    for record, bad in ((records[1], math.nan), (records[2], math.inf), (records[3], 1e308)):
        record.attributes[0].value.double_value = bad  # rl.step
    bad_rank = logs_request("bad-rank", range(1, 3))
    bad_rank.resource_logs[0].resource.attributes[2].value.double_value = math.inf  # rl.rank
    request.resource_logs.insert(0, bad_rank.resource_logs[0])
    assert post(f"{bridge.url}/v1/logs", request.SerializeToString())[0] == 200
    assert bridge.wait_idle()
    steps = [(t.run_name, s) for t in memory_tracker.instances for s, _ in t.steps]
    assert [s for _, s in steps] == [1, 5], steps
    stats = bridge.stats()
    assert stats["records_bad"] == 5 and stats["worker_errors"] == 0  # 3 bad steps, 2 records of the bad-rank resource


def test_a_metrics_resource_with_an_infinite_rank_does_not_drop_the_other_resources(
    make_bridge, memory_tracker: type[MemoryTracker]
) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    bridge = make_bridge({"track_with": "memory", "ranks": "all", "metrics_fallback_after": 0})
    request = ExportMetricsServiceRequest()
    for run_id, rank in (("inf-rank", math.inf), ("fine", 0.0)):
        resource = request.resource_metrics.add()
        for key, value in (("service.name", "m"), ("rl.run.id", run_id)):
            kv = resource.resource.attributes.add()
            kv.key, kv.value.string_value = key, value
        kv = resource.resource.attributes.add()
        kv.key, kv.value.double_value = "rl.rank", rank
        metric = resource.scope_metrics.add().metrics.add()
        metric.name = "rl.progress.step"
        metric.gauge.data_points.add().as_double = 7.0
    assert post(f"{bridge.url}/v1/metrics", request.SerializeToString())[0] == 200
    assert bridge.wait_idle()
    assert [s for t in memory_tracker.instances for s, _ in t.steps] == [7]
    assert bridge.stats()["worker_errors"] == 0


# ---- 4. the run cap ------------------------------------------------------------------------------


def test_open_runs_are_capped_least_recently_used_closed_first_and_no_step_is_lost(make_bridge, tmp_path: Path) -> None:
    bridge = make_bridge(
        {"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "jl")}, "max_open_runs": 3, "run_idle_timeout_s": 600}
    )
    threads_before = threading.active_count()
    url = f"{bridge.url}/v1/logs"
    for round_ in range(2):  # every run sends twice: the second time its trackers are reopened
        for n in range(12):
            assert post(url, logs_request(f"run-{n}", range(1 + 2 * round_, 3 + 2 * round_)).SerializeToString())[0] == 200
            assert bridge.wait_idle()
            assert bridge.stats()["runs_open"] <= 3
    assert threading.active_count() - threads_before <= 6
    for n in range(12):
        (path,) = (tmp_path / "jl" / f"run-{n}").glob("*.jsonl")
        assert sorted(step or 0 for step, _ in read_jsonl(path)) == [1, 2, 3, 4]


def test_the_run_idle_timeout_default_is_shorter_than_an_hour() -> None:
    from otel_rl.bridge import BridgeConfig

    assert BridgeConfig(track_with="stdout").run_idle_timeout_s <= 900


# ---- 5. token and log lines ----------------------------------------------------------------------


def test_a_bearer_token_is_required_when_set(make_bridge, monkeypatch: pytest.MonkeyPatch) -> None:
    token = "tok-" + "x" * 28
    monkeypatch.setenv(ENV.OTEL_RL_BRIDGE_TOKEN, token)
    out = io.StringIO()
    bridge = make_bridge({"track_with": "stdout"}, out=out)
    url, body = f"{bridge.url}/v1/logs", logs_request("auth", range(1, 2)).SerializeToString()

    def send(auth: str | None) -> int:
        headers = {"Content-Type": "application/x-protobuf", **({"Authorization": auth} if auth else {})}
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as err:
            return err.code

    assert send(None) == 401 and send("Bearer wrong") == 401 and send(f"Basic {token}") == 401
    assert send(f"Bearer {token}") == 200
    assert get(f"{bridge.url}/healthz")[0] == 200  # health stays open for probes
    assert get(f"{bridge.url}/stats")[0] == 401  # the counters name the runs: behind the token too
    assert bridge.stats()["unauthorized"] == 3
    bridge.close()
    assert token not in out.getvalue()


def test_a_newline_in_a_run_id_cannot_forge_log_lines(make_bridge, caplog: pytest.LogCaptureFixture, restore_registry: None) -> None:
    out = io.StringIO()
    bridge = make_bridge({"track_with": "stdout"}, out=out)
    evil = "ok\notel-rl bridge: FORGED line\r\x1b[31m"
    request = logs_request(evil, range(1, 2))
    request.resource_logs[0].resource.attributes[0].value.string_value = "svc\nFORGED service"
    with caplog.at_level(logging.DEBUG, logger="otel_rl"):
        assert post(f"{bridge.url}/v1/logs", request.SerializeToString())[0] == 200
        assert bridge.wait_idle()
    text = out.getvalue()
    lines = [line for line in text.splitlines() if "FORGED" in line]
    assert lines and all(not line.startswith("otel-rl bridge: FORGED") and "\x1b" not in line for line in lines), text
    assert all("\n" not in r.getMessage() for r in caplog.records if "FORGED" in r.getMessage())


# ---- measured: 30 hostile requests at once, a genuine run still served -----------------------------


def _hostile(port: int, kind: int) -> None:
    url = f"http://127.0.0.1:{port}/v1/logs"
    try:
        if kind % 5 == 0:
            post(url, _BOMB_BODY, encoding="gzip", timeout=20)
        elif kind % 5 == 1:
            _raw(port, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"-1\r\nxxxx", timeout=10)
        elif kind % 5 == 2:
            bad = logs_request(f"nan-{kind}", range(1, 4))
            bad.resource_logs[0].scope_logs[0].log_records[1].attributes[0].value.double_value = math.nan
            post(url, bad.SerializeToString(), timeout=10)
        elif kind % 5 == 3:
            many = ExportLogsServiceRequest()
            for n in range(200):
                many.resource_logs.append(logs_request(f"flood-{kind}-{n}", range(1, 2)).resource_logs[0])
            post(url, many.SerializeToString(), timeout=10)
        else:
            post(url, b"{" * 100_000, content_type="application/json", timeout=10)
    except OSError:
        pass  # refused or cut off: what matters is the bridge, not this sender


_BOMB_BODY = b""


def _send_genuine(port: int, steps: range) -> list[int]:
    """A collector's retry loop: 429 / 503 are retried after Retry-After."""
    statuses = []
    for step in steps:
        body = logs_request("genuine", range(step, step + 1), keys=20).SerializeToString()
        for _ in range(100):
            status, headers, _ = post(f"http://127.0.0.1:{port}/v1/logs", body, timeout=20)
            statuses.append(status)
            if status not in (429, 503):
                break
            time.sleep(min(float(headers.get("Retry-After", "1")), 1.0) / 4)
    return statuses


def test_thirty_hostile_requests_at_once_stay_under_1_gb_and_a_genuine_run_is_served(tmp_path: Path) -> None:
    global _BOMB_BODY
    _BOMB_BODY = _bomb()
    port = free_port()
    config = tmp_path / "bridge.yaml"
    config.write_text(
        yaml.safe_dump(
            {"listen": f"127.0.0.1:{port}", "track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "jl")}, "ranks": "all"}
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_rl.cli", "bridge", "--config", str(config)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while get_ok(port) is False:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.1)
        with RssPeak(proc.pid) as rss:
            hostile = [threading.Thread(target=_hostile, args=(port, k), daemon=True) for k in range(30)]
            for t in hostile:
                t.start()
            statuses = _send_genuine(port, range(1, 11))
            for t in hostile:
                t.join(60)
        print(f"bridge peak RSS under 30 hostile requests: {rss.peak >> 20} MB")
        assert rss.peak < 1 << 30, f"peak RSS {rss.peak >> 20} MB"
        assert statuses.count(200) == 10, statuses
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = list((tmp_path / "jl" / "genuine").glob("*.jsonl"))
            if found and sorted(s or 0 for s, _ in read_jsonl(found[0])) == list(range(1, 11)):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the genuine run's steps did not all reach the tracker")
        assert proc.poll() is None
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def get_ok(port: int) -> bool:
    try:
        return get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    except OSError:
        return False


@pytest.fixture(autouse=True)
def _no_token(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OTEL_RL_BRIDGE_TOKEN", raising=False)
    yield
