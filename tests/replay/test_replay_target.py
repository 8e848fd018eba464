"""A replay lands where it is kept: its default clock ends now, points outside the target's
retention are refused before anything is sent, what the target stored is checked, and "already
replayed" depends on where the replay went."""

from __future__ import annotations

import argparse
import http.server
import io
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest
import replay_samples as samples

from otel_rl.replay import MARKER_FILE, ReplayNotStored, replay_file
from otel_rl.runs.folder import read_log_records
from otel_rl.semconv import names as N
from otel_rl.stack.process import PidRecord, write_pid_file
from otel_rl.stack.replay_target import StackTarget, retention_of, retention_seconds, target_for_endpoint


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver on 127.0.0.1 that accepts every export and counts the requests."""

    requests: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server interface
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).requests.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[str]]]:
    handler = type("Handler", (_Collector,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    finally:
        server.shutdown()
        server.server_close()


def step_times(run_dir: Path | None) -> list[int]:
    assert run_dir is not None
    return [r["timestamp"] for r in read_log_records(run_dir) if r["event_name"] == N.RL_LOG_EVENT]


@pytest.mark.parametrize("fmt", ["swift", "trainer_state"])  # an elapsed clock, a synthetic clock
def test_the_default_clock_ends_the_replayed_run_now(tmp_path, fmt):
    src = tmp_path / ("logging.jsonl" if fmt == "swift" else "trainer_state.json")
    src.write_text(getattr(samples, fmt)(samples.steps(20)))
    out = io.StringIO()
    before = time.time_ns()
    result = replay_file(src, out=out, progress=False)
    times = step_times(result.run_dir)
    assert len(times) == 20 and times == sorted(times)
    assert before - 5 * 10**9 <= times[-1] <= time.time_ns()  # the last step is now, not in 2025
    assert times[0] < times[-1]  # the steps keep their spacing, ending now
    assert "so that the last step is now" in out.getvalue()

    fixed = replay_file(src, out=io.StringIO(), progress=False, start_time="2025-03-01T00:00:00Z", run_dir=tmp_path / "fixed")
    fixed_times = step_times(fixed.run_dir)
    assert [t - fixed_times[0] for t in fixed_times] == [t - times[0] for t in times]  # same spacing
    assert fixed_times[0] >= 1740787200 * 10**9 and fixed_times[-1] < 1740787200 * 10**9 + 86400 * 10**9


def test_points_outside_the_stacks_retention_are_refused_before_sending(tmp_path):
    src = tmp_path / "trainer_state.json"
    src.write_text(samples.trainer_state(samples.steps(10)))
    one_month = StackTarget("http://127.0.0.1:9", "1", retention_seconds("1"), "the local stack's VictoriaMetrics (http://127.0.0.1:9)")
    with pytest.raises(ValueError) as info:
        replay_file(
            src,
            out=io.StringIO(),
            progress=False,
            endpoint="http://127.0.0.1:9",
            exporters="otlp",
            start_time="2025-01-01T00:00:00Z",
            target_for=lambda endpoint: one_month,
        )
    message = str(info.value)
    assert "--start-time" in message and "keeps 1 (-retentionPeriod)" in message and "nothing sent" in message
    assert "2025-01-01T00:01:00Z" in message  # the replayed span is named
    run_dir = next(tmp_path.glob("otel-rl-runs/replay-*"), None)
    assert run_dir is None or not (run_dir / MARKER_FILE).exists()  # refused before anything was written


def test_points_inside_the_retention_are_sent_and_a_short_read_back_is_an_error(tmp_path, collector):
    endpoint, requests = collector
    src = tmp_path / "trainer_state.json"
    src.write_text(samples.trainer_state(samples.steps(10)))

    class Store:
        """The replay's own ReplayTarget protocol, holding fewer samples than were sent."""

        description = "a store on 127.0.0.1"
        retention = "10y"
        retention_s = retention_seconds("10y")
        asked: list[tuple[int, int]] = []

        def count_stored(self, run_id: str, times_ms: Sequence[int], expected: int, deadline_s: float) -> int:
            self.asked.append((len(times_ms), expected))
            return expected - 3

    store = Store()
    out = io.StringIO()
    with pytest.raises(ReplayNotStored, match="holds .* of the .* metric samples sent"):
        replay_file(src, out=out, progress=False, endpoint=endpoint, exporters="otlp", target_for=lambda e: store)
    assert requests and store.asked and store.asked[0][0] == 10 and store.asked[0][1] >= 10  # ten step times, a sample each at least
    marker = json.loads(next(tmp_path.glob("otel-rl-runs/replay-*/replay.json")).read_text())
    assert not any(d.startswith("otlp") for d in marker["destinations"])  # not recorded as arrived: a rerun sends again


def test_an_unknown_endpoint_gets_one_retention_warning_and_is_not_refused(tmp_path, collector, monkeypatch):
    import otel_rl.replay._run as run

    monkeypatch.setattr(run, "_UNKNOWN_RETENTION_SAID", [])
    endpoint, requests = collector
    parser = argparse.ArgumentParser(prog="otel-rl")
    from otel_rl.cli.replay import add_cli as add_command

    add_command(parser.add_subparsers(dest="command"))
    texts = []
    for n in (3, 4):
        src = tmp_path / f"log{n}.jsonl"
        src.write_text(samples.swift(samples.steps(n)))
        out = io.StringIO()
        monkeypatch.setattr("sys.stdout", out)
        args = parser.parse_args(["replay", str(src), "--endpoint", endpoint, "--start-time", "2025-01-01", "-q"])
        assert args.func(args) == 0
        texts.append(out.getvalue())
    assert requests  # sent, though 2025 may be outside what that endpoint keeps: it is not the stack
    assert "retention is unknown" in texts[0] and "retention is unknown" not in texts[1]


def test_already_replayed_means_to_the_same_destination(tmp_path, collector):
    endpoint, requests = collector
    src = tmp_path / "logging.jsonl"
    src.write_text(samples.swift(samples.steps(12)))
    local = replay_file(src, out=io.StringIO(), progress=False)  # into the run folder's files
    assert local.run_dir is not None
    logs = local.run_dir / "logs.jsonl"
    size = logs.stat().st_size

    out = io.StringIO()
    sent = replay_file(src, out=out, progress=False, endpoint=endpoint, exporters="otlp", run_dir=local.run_dir)
    assert not sent.skipped and requests and "already replayed" not in out.getvalue()  # the collector never got it before
    assert logs.stat().st_size == size  # the local replay's files are kept
    count = len(requests)

    out = io.StringIO()
    again = replay_file(src, out=out, progress=False, endpoint=endpoint, exporters="otlp", run_dir=local.run_dir)
    assert again.skipped and len(requests) == count and "already replayed to" in out.getvalue() and endpoint in out.getvalue()
    out = io.StringIO()
    assert replay_file(src, out=out, progress=False, run_dir=local.run_dir).skipped  # the files are still there too

    out = io.StringIO()
    forced = replay_file(src, out=out, progress=False, endpoint=endpoint, exporters="otlp", run_dir=local.run_dir, force=True)
    assert not forced.skipped and len(requests) > count
    assert logs.stat().st_size == size and "replacing" not in out.getvalue()  # --force to OTLP leaves the files alone

    out = io.StringIO()
    replay_file(src, out=out, progress=False, run_dir=local.run_dir, force=True)
    assert "replacing" in out.getvalue() and "logs.jsonl" in out.getvalue()  # files replaced are named
    assert len(step_times(local.run_dir)) == 12


def test_the_stack_is_recognised_by_its_pid_files(tmp_path):
    me = psutil.Process(os.getpid())
    run = tmp_path / "stack" / "run"
    agent = PidRecord("otelcol-agent", me.pid, me.create_time(), {"otlp_grpc": 24317, "otlp_http": 24318, "health": 33133}, ["otelcol-rl"])
    write_pid_file(run / "otelcol-agent.json", agent)
    gateway = PidRecord("otelcol-gateway", me.pid, me.create_time(), {"otlp_grpc": 24417, "otlp_http": 24418}, ["otelcol-rl"])
    write_pid_file(run / "otelcol-gateway.json", gateway)
    command = ["victoria-metrics", "-retentionPeriod=10y"]
    write_pid_file(run / "victoria-metrics.json", PidRecord("victoria-metrics", me.pid, me.create_time(), {"http": 28428}, command))

    found = target_for_endpoint("http://localhost:24318", tmp_path / "stack")
    assert found is not None and found.url == "http://127.0.0.1:28428" and found.retention == "10y"
    assert found.retention_s == 10 * 365 * 86400
    assert target_for_endpoint("127.0.0.1:24317", tmp_path / "stack") is not None  # gRPC, as host:port
    assert target_for_endpoint("http://127.0.0.1:24418", tmp_path / "stack") is not None  # straight to the gateway
    assert target_for_endpoint("http://127.0.0.1:33133", tmp_path / "stack") is None  # the agent's health port: not OTLP
    assert target_for_endpoint("http://127.0.0.1:4318", tmp_path / "stack") is None  # another port: not the stack
    assert target_for_endpoint("http://example.invalid:24318", tmp_path / "stack") is None
    assert target_for_endpoint("http://127.0.0.1:24318", tmp_path / "elsewhere") is None
    assert retention_of(["victoria-metrics"]) == "1" and retention_seconds("1") == 31 * 86400  # its default: a month


def test_points_are_counted_for_a_read_back_only_when_a_target_reads_them(tmp_path, monkeypatch):
    """Counting what was sent builds every stamped point again (replay ran at half speed with it):
    only a replay whose target reads the samples back registers for them."""
    from otel_rl._sdk.pipeline.aggregation import StampedPoints

    registered = []
    register = StampedPoints.register
    monkeypatch.setattr(StampedPoints, "register", lambda self: registered.append(1) or register(self))
    src = tmp_path / "logging.jsonl"
    src.write_text(samples.swift(samples.steps(20)))
    result = replay_file(src, out=io.StringIO(), progress=False, run_dir=tmp_path / "run", exporters="none")
    assert result.records == 20 and registered == [] and result.samples == 0  # no exporter, no read-back: no consumer
