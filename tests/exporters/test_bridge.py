"""The tracker bridge (``otel_rl.bridge``), served for real on 127.0.0.1 at a free port
and fed by the real OpenTelemetry SDK over OTLP/HTTP (no mocks): every step read back from the
trackers' own files, runs split apart, ranks filtered, bad bodies refused while the server keeps
working, metrics-only runs, backpressure, shutdown, and secrets that never come out."""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

import otel_rl
import otel_rl.trackers.base as _tracker
from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl.bridge import BridgeConfig, TrackerBridge, load_bridge_config, per_run_tracker_kwargs
from otel_rl.cli import main
from otel_rl.stack.process import free_port
from otel_rl.trackers.base import Tracker, register_tracker
from otel_rl.trackers.fanout import registry_key_namer
from otel_rl.trackers.jsonl import read_jsonl
from otel_rl.trackers.stdout import parse_stdout_line

SECRET = "sk-bridge-SECRET-4242"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def step_values(step: int, run: str = "a") -> dict[str, Any]:
    """Keys as ROLL logs them, with a string, a bool and an int among the floats."""
    return {
        "actor/pg_loss": 0.1 * step - 0.35 + (0.5 if run == "b" else 0.0),
        "actor/kl_loss": 1e-3 * step,
        "actor/clipfrac": step / 10,
        "actor/total_samples": 64 * step,
        "actor/early_stop": step == 2,
        "critic/score/mean": 0.17 + 0.09 * step,
        "time/actor_train/train_step/total": 0.261 + step / 100,
        "val/generation": f"step {step}: 12345 -> 54321",
    }


# ---- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def restore_registry() -> Iterator[None]:
    saved = dict(_tracker._registry)
    yield
    _tracker._registry.clear()
    _tracker._registry.update(saved)


@pytest.fixture
def make_bridge(tmp_path: Path) -> Iterator[Any]:
    """Start bridges on 127.0.0.1 at a free port; each is closed after the test however it ends."""
    made: list[TrackerBridge] = []

    def make(settings: Mapping[str, Any], out: Any = None) -> TrackerBridge:
        config = BridgeConfig.from_mapping({"listen": "127.0.0.1:0", "base_dir": str(tmp_path / "base"), **settings})
        bridge = TrackerBridge(config, out=out if out is not None else io.StringIO()).start()
        made.append(bridge)
        return bridge

    yield make
    for bridge in made:
        bridge.close()


def send_steps(
    url: str,
    run_id: str,
    steps: range,
    *,
    rank: int = 0,
    service: str = "grpo-test",
    run: str = "a",
    hparams: Mapping[str, Any] | None = None,
) -> None:
    """A training process with the real SDK: otel_rl.init(... otlp over http/protobuf) and tel.log per step."""
    tel = otel_rl.init(
        service_name=service,
        run_id=run_id,
        endpoint=url,
        protocol="http/protobuf",
        exporters="otlp",
        rank=rank,
        console=False,
        framework="roll",
        metric_export_interval_s=60,
        export_text=True,
    )  # the steps carry a generation text the trackers must get
    try:
        if hparams:
            tel.log_hparams(hparams)
        for step in steps:
            with tel.step(step):
                tel.log(step_values(step, run))
    finally:
        tel.shutdown()


def jsonl_steps(path: Path) -> dict[int | None, dict[str, Any]]:
    return {step: data for step, data in read_jsonl(path)}


def expected_jsonl(step: int, run: str = "a") -> dict[str, Any]:
    return step_values(step, run)  # every value survives: numbers, the bool, the int and the text


def post(
    url: str, body: bytes, content_type: str = "application/x-protobuf", encoding: str | None = None, timeout: float = 10.0
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def get(url: str) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def logs_request(run_id: str, steps: range, *, keys: int = 3, rank: int = 0) -> ExportLogsServiceRequest:
    """An OTLP logs request as otel-rl's SDK side sends it (one rl.log record per step)."""
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    for key, value in (("service.name", "raw"), ("rl.run.id", run_id)):
        kv = resource_logs.resource.attributes.add()
        kv.key, kv.value.string_value = key, value
    kv = resource_logs.resource.attributes.add()
    kv.key, kv.value.int_value = "rl.rank", rank
    records = resource_logs.scope_logs.add()
    for step in steps:
        record = records.log_records.add()
        record.event_name = "rl.log"
        attr = record.attributes.add()
        attr.key, attr.value.int_value = "rl.step", step
        for i in range(keys):
            value = record.body.kvlist_value.values.add()
            value.key, value.value.double_value = f"k/{i}", step + i / 10
    return request


class MemoryTracker(Tracker):
    """A third-party tracker that keeps everything it is given (and says what it was built with)."""

    name = "memory"
    extra = None
    options = {"log_dir": None, "name": None, "api_key": None, "project": None}
    secret_keys = ("api_key",)
    instances: ClassVar[list[MemoryTracker]] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: list[tuple[int | None, dict[str, Any]]] = []
        self.calls: list[str] = []
        MemoryTracker.instances.append(self)

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        self.calls.append("start")

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        self.steps.append((step, dict(values)))

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        self.hparams = self.scrub_hparams(hparams)

    def flush(self) -> None:
        self.calls.append("flush")

    def finish(self) -> None:
        self.calls.append("finish")


@pytest.fixture
def memory_tracker(restore_registry: None) -> type[MemoryTracker]:
    MemoryTracker.instances = []
    register_tracker("memory", MemoryTracker)
    return MemoryTracker


# ---- steps in, steps out ------------------------------------------------------------------------


def test_every_step_from_the_sdk_reads_back_from_jsonl_and_stdout(make_bridge, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = io.StringIO()
    bridge = make_bridge({"track_with": ["jsonl", "stdout"], "tracker_kwargs": {"jsonl": {"log_dir": str(tmp_path / "jl")}}}, out=out)
    send_steps(bridge.url, "run-one", range(1, 6))
    assert bridge.wait_idle()
    bridge.close()

    # The run's metrics and spans reached the bridge too (an events run: they are not written).
    stats = bridge.stats()
    assert stats["events_delivered"] == 5 and stats["bad_requests"] == 0 and stats["metric_exports"] >= 1
    assert stats["metric_steps_written"] == 0
    assert jsonl_steps(tmp_path / "jl" / "run-one" / "metrics.jsonl") == {s: expected_jsonl(s) for s in range(1, 6)}
    printed = [parse_stdout_line(line) for line in capsys.readouterr().out.splitlines()]
    assert [p for p in printed if p is not None] == [(s, step_values(s)) for s in range(1, 6)]
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"otel-rl bridge: listening on {bridge.url}") and "jsonl" in lines[0] and "stdout" in lines[0]
    assert [line for line in lines if "new run" in line] == [
        f"otel-rl bridge: new run run-one (service grpo-test, rank 0) -> run name grpo-test-run-one, run_dir "
        f"{tmp_path / 'base' / 'run-one'}; jsonl {json.dumps({'log_dir': str(tmp_path / 'jl' / 'run-one')})}, stdout"
    ]


def test_two_runs_go_to_separate_outputs(make_bridge, tmp_path: Path, memory_tracker: type[MemoryTracker]) -> None:
    bridge = make_bridge(
        {
            "track_with": ["jsonl", "memory"],
            "tracker_kwargs": {
                "jsonl": {"path": str(tmp_path / "jl" / "steps.jsonl")},
                "memory": {"log_dir": str(tmp_path / "mem"), "name": "grpo"},
            },
        }
    )
    send_steps(bridge.url, "run-a", range(1, 4), run="a")
    send_steps(bridge.url, "run-b", range(1, 4), run="b")
    bridge.close()

    assert jsonl_steps(tmp_path / "jl" / "steps-run-a.jsonl") == {s: expected_jsonl(s, "a") for s in range(1, 4)}
    assert jsonl_steps(tmp_path / "jl" / "steps-run-b.jsonl") == {s: expected_jsonl(s, "b") for s in range(1, 4)}
    assert not (tmp_path / "jl" / "steps.jsonl").exists()
    by_run = {t.run_name: t for t in memory_tracker.instances if t.calls}  # (the start-up check opens nothing)
    assert set(by_run) == {"grpo-test-run-a", "grpo-test-run-b"}
    for run in ("a", "b"):
        tracker = by_run[f"grpo-test-run-{run}"]
        assert tracker.run_dir == tmp_path / "base" / f"run-{run}"
        assert tracker.kwargs == {"log_dir": str(tmp_path / "mem" / f"run-{run}"), "name": f"grpo-run-{run}"}
        assert tracker.steps == [(s, step_values(s, run)) for s in range(1, 4)]
        assert tracker.calls[0] == "start" and tracker.calls[-1] == "finish" and tracker.calls.count("finish") == 1


def test_one_tracker_set_for_every_run_without_split_runs(make_bridge, tmp_path: Path) -> None:
    bridge = make_bridge({"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "jl")}, "split_runs": False})
    send_steps(bridge.url, "run-a", range(1, 3), run="a")
    send_steps(bridge.url, "run-b", range(3, 5), run="b")
    bridge.close()
    assert read_jsonl(tmp_path / "jl" / "metrics.jsonl") == [
        (1, step_values(1, "a")),
        (2, step_values(2, "a")),
        (3, step_values(3, "b")),
        (4, step_values(4, "b")),
    ]


def test_rank_1_is_skipped_by_default_and_a_run_of_its_own_with_ranks_all(make_bridge, tmp_path: Path) -> None:
    bridge = make_bridge({"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "default")}})
    send_steps(bridge.url, "ranked", range(1, 3), rank=1)
    send_steps(bridge.url, "ranked", range(1, 3), rank=0)
    bridge.close()
    assert sorted(p.name for p in (tmp_path / "default").iterdir()) == ["ranked"]
    assert jsonl_steps(tmp_path / "default" / "ranked" / "metrics.jsonl") == {1: step_values(1), 2: step_values(2)}
    assert bridge.stats()["records_other_ranks"] == 2

    everyone = make_bridge({"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "all")}, "ranks": "all"})
    send_steps(everyone.url, "ranked", range(1, 3), rank=1, run="b")
    send_steps(everyone.url, "ranked", range(1, 3), rank=0)
    everyone.close()
    assert jsonl_steps(tmp_path / "all" / "ranked-rank1" / "metrics.jsonl") == {1: step_values(1, "b"), 2: step_values(2, "b")}
    assert jsonl_steps(tmp_path / "all" / "ranked" / "metrics.jsonl") == {1: step_values(1), 2: step_values(2)}


def test_registry_keys_and_hparams(make_bridge, memory_tracker: type[MemoryTracker]) -> None:
    bridge = make_bridge({"track_with": "memory", "tracker_keys": "registry"})
    send_steps(bridge.url, "reg", range(1, 3), hparams={"actor": {"lr": 1e-6}, "algo": "grpo"})
    bridge.close()
    (tracker,) = [t for t in memory_tracker.instances if t.calls]
    namer = registry_key_namer(lambda key: KeyResolver.default().resolve(key, "roll"))
    assert tracker.steps == [(s, {namer(k): v for k, v in step_values(s).items()}) for s in (1, 2)]
    assert 'rl.loss{rl.loss.type="kl",rl.model.role="actor"}' in tracker.steps[0][1]
    assert tracker.hparams == {"actor/lr": 1e-6, "algo": "grpo"}


# ---- bad input ----------------------------------------------------------------------------------


def test_bad_bodies_get_4xx_are_counted_and_the_server_keeps_working(make_bridge, tmp_path: Path) -> None:
    bridge = make_bridge({"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "jl")}})
    logs = f"{bridge.url}/v1/logs"

    status, headers, body = post(logs, b"\xff\xff\xff\xff garbage")
    assert status == 400 and headers["Content-Type"] == "application/x-protobuf"
    assert status_pb2.Status.FromString(body).code == 3  # INVALID_ARGUMENT, with a message
    assert "ExportLogsServiceRequest" in status_pb2.Status.FromString(body).message
    status, headers, body = post(logs, b"{not json", content_type="application/json")
    assert status == 400 and json.loads(body)["code"] == 3
    assert post(logs, b"not gzip at all", encoding="gzip")[0] == 400
    assert post(f"{bridge.url}/v1/metrics", b"\x0a\x05\x0a\x03\xff", encoding=None)[0] == 400  # truncated message
    assert post(logs, b"", encoding="br")[0] == 415
    assert post(logs, b"", content_type="text/plain")[0] == 415
    assert post(f"{bridge.url}/v2/logs", b"")[0] == 404
    assert bridge.stats()["bad_requests"] == 6

    # Still serving: health, an empty request (what a collector's health probe sends), traces
    # (accepted and dropped), OTLP/JSON and gzip-compressed protobuf, then the SDK itself.
    assert get(f"{bridge.url}/healthz") == (200, b"ok\n")
    status, headers, body = post(logs, b"")
    assert (
        status == 200
        and headers["Content-Type"] == "application/x-protobuf"
        and ExportLogsServiceResponse.FromString(body) == ExportLogsServiceResponse()
    )
    status, _, body = post(f"{bridge.url}/v1/traces", b"\x00 anything")
    assert status == 200 and body == b""
    status, _, body = post(f"{bridge.url}/v1/metrics", b"")
    assert status == 200 and ExportMetricsServiceResponse.FromString(body) == ExportMetricsServiceResponse()
    as_json = json_format.MessageToJson(logs_request("raw-json", range(1, 3)))
    assert post(logs, as_json.encode(), content_type="application/json")[0] == 200
    status, headers, body = post(logs, as_json.encode(), content_type="application/json; charset=utf-8")
    assert (status, headers["Content-Type"], body) == (200, "application/json", b"{}")
    status, _, _ = post(logs, gzip.compress(logs_request("raw-gzip", range(1, 3)).SerializeToString()), encoding="gzip")
    assert status == 200
    send_steps(bridge.url, "after-garbage", range(1, 3))
    bridge.close()

    assert jsonl_steps(tmp_path / "jl" / "after-garbage" / "metrics.jsonl") == {1: step_values(1), 2: step_values(2)}
    expected_raw = {s: {"k/0": float(s), "k/1": s + 0.1, "k/2": s + 0.2} for s in (1, 2)}
    assert jsonl_steps(tmp_path / "jl" / "raw-gzip" / "metrics.jsonl") == expected_raw
    # sent twice as JSON (both accepted): each step twice, values exact
    assert read_jsonl(tmp_path / "jl" / "raw-json" / "metrics.jsonl") == [(s, expected_raw[s]) for s in (1, 2)] * 2
    assert bridge.stats()["bad_requests"] == 6 and bridge.stats()["worker_errors"] == 0


def test_a_slow_tracker_gets_503_with_retry_after_not_unbounded_memory(make_bridge, restore_registry: None) -> None:
    release = threading.Event()

    class Slow(MemoryTracker):
        name = "slow"

        def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
            release.wait(30)
            super().log(values, step)

    MemoryTracker.instances = []
    register_tracker("slow", Slow)
    bridge = make_bridge({"track_with": "slow", "max_queue_mb": 0.001})  # about 1 KB of queued requests
    logs = f"{bridge.url}/v1/logs"
    body = logs_request("slow-run", range(1, 2), keys=40).SerializeToString()
    assert len(body) > 600
    statuses = []
    for _ in range(4):
        status, headers, answer = post(logs, body)
        statuses.append(status)
        if status == 503:
            assert headers["Retry-After"] == "1" and status_pb2.Status.FromString(answer).code == 14  # UNAVAILABLE
        time.sleep(0.2)  # the worker picks up the first request and blocks in the tracker
    # the first goes to the (blocked) tracker, the second waits in the queue, the rest are refused
    assert statuses == [200, 200, 503, 503], statuses
    release.set()
    assert bridge.wait_idle()
    assert post(logs, body)[0] == 200
    bridge.close()
    (tracker,) = [t for t in Slow.instances if t.calls]
    assert len(tracker.steps) == 3 and bridge.stats()["busy_responses"] == 2


# ---- metrics where events are absent ------------------------------------------------------------


def _send_metrics_only(url: str, run_id: str, progress: list[int | None]) -> None:
    """A metrics-only pipeline: the SDK's metrics of one run (no events), one export per entry."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
    from opentelemetry.sdk.resources import Resource

    state: dict[str, Any] = {"step": 0, "i": 0}
    exporter = OTLPMetricExporter(endpoint=f"{url}/v1/metrics")
    reader = InMemoryMetricReader()  # collected and exported by hand: exactly one export per entry
    provider = MeterProvider(
        resource=Resource.create({"service.name": "metrics-only", "rl.run.id": run_id, "rl.rank": 0}), metric_readers=[reader]
    )
    meter = provider.get_meter("otel_rl")

    def loss(options: CallbackOptions):
        yield Observation(0.5 / (state["i"] + 1), {"rl.loss.type": "kl", "rl.model.role": "actor"})
        yield Observation(2.0 * state["i"], {"rl.loss.type": "policy", "rl.model.role": "actor"})

    def step(options: CallbackOptions):
        if state["step"] is not None:
            yield Observation(state["step"])

    meter.create_observable_gauge("rl.loss", callbacks=[loss])
    meter.create_observable_gauge("rl.progress.step", callbacks=[step])
    samples = meter.create_counter("rl.samples")
    histogram = meter.create_histogram("rl.stage.duration", unit="s")
    try:
        for i, value in enumerate(progress):
            state.update(step=value, i=i)
            samples.add(8, {"rl.cluster": "actor_infer"})
            histogram.record(0.25, {"rl.stage": "generate"})
            assert exporter.export(reader.get_metrics_data()) == MetricExportResult.SUCCESS
    finally:
        provider.shutdown()
        exporter.shutdown()


def test_metrics_only_runs_are_written_at_their_progress_steps(make_bridge, tmp_path: Path) -> None:
    bridge = make_bridge({"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "jl")}})
    _send_metrics_only(bridge.url, "metrics-run", [10, 20, 30, 40])
    _send_metrics_only(bridge.url, "counted-run", [None, None])  # no progress gauge: export count; held until shutdown
    assert bridge.wait_idle()
    assert not (tmp_path / "jl" / "counted-run").exists()  # fewer exports than metrics_fallback_after: held back
    bridge.close()

    def expected(i: int, step: int | None) -> dict[str, Any]:
        values = {
            'rl.loss{rl.loss.type="kl",rl.model.role="actor"}': 0.5 / (i + 1),
            'rl.loss{rl.loss.type="policy",rl.model.role="actor"}': 2.0 * i,
            'rl.samples{rl.cluster="actor_infer"}': 8 * (i + 1),
        }  # a cumulative sum
        if step is not None:
            values["rl.progress.step"] = step
        return values

    assert jsonl_steps(tmp_path / "jl" / "metrics-run" / "metrics.jsonl") == {s: expected(i, s) for i, s in enumerate([10, 20, 30, 40])}
    assert jsonl_steps(tmp_path / "jl" / "counted-run" / "metrics.jsonl") == {1: expected(0, None), 2: expected(1, None)}
    # the registry_key_namer format, for the same metric and attributes
    namer = registry_key_namer(lambda key: KeyResolver.default().resolve(key, "roll"))
    assert namer("actor/kl_loss") == 'rl.loss{rl.loss.type="kl",rl.model.role="actor"}'
    assert bridge.stats()["metric_steps_written"] == 6


def test_metrics_are_ignored_for_a_run_whose_events_arrive(make_bridge, tmp_path: Path) -> None:
    bridge = make_bridge({"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "jl")}})
    _send_metrics_only(bridge.url, "both", [5])  # one export arrives before the first event: held back
    send_steps(bridge.url, "both", range(1, 3), service="metrics-only")
    _send_metrics_only(bridge.url, "both", [6, 7, 8])
    bridge.close()
    assert jsonl_steps(tmp_path / "jl" / "both" / "metrics.jsonl") == {1: step_values(1), 2: step_values(2)}


# ---- shutdown -----------------------------------------------------------------------------------


def test_close_delivers_what_was_accepted_then_finishes_every_tracker(make_bridge, tmp_path: Path, restore_registry: None) -> None:
    release = threading.Event()

    class Gated(MemoryTracker):
        name = "gated"

        def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
            release.wait(30)  # the first step blocks the worker, so the rest are still queued at close()
            super().log(values, step)

    MemoryTracker.instances = []
    register_tracker("gated", Gated)
    bridge = make_bridge({"track_with": ["gated", "jsonl"], "tracker_kwargs": {"jsonl": {"log_dir": str(tmp_path / "jl")}}})
    for first in range(1, 200, 10):
        assert post(f"{bridge.url}/v1/logs", logs_request("burst", range(first, first + 10)).SerializeToString())[0] == 200
    assert bridge.stats()["queued_requests"] >= 18
    closing = threading.Thread(target=bridge.close)
    closing.start()
    deadline = time.monotonic() + 10
    while _port_open(bridge.address[1]):  # close() stops listening first...
        assert time.monotonic() < deadline
        time.sleep(0.05)
    release.set()  # ...then delivers everything that was accepted
    closing.join(30)
    assert not closing.is_alive()
    assert [s for s, _ in read_jsonl(tmp_path / "jl" / "burst" / "metrics.jsonl")] == list(range(1, 201))
    (tracker,) = [t for t in Gated.instances if t.calls]
    assert [s for s, _ in tracker.steps] == list(range(1, 201))
    assert tracker.calls[-2:] == ["flush", "finish"] and tracker.calls.count("finish") == 1
    bridge.close()  # idempotent


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


# ---- secrets ------------------------------------------------------------------------------------


SECRET_TRACKER_MODULE = '''
from otel_rl import register_tracker
from otel_rl.trackers.base import Tracker

class LeakyTracker(Tracker):
    """A third-party tracker whose backend echoes its key in errors and writes its config."""
    name = "leaky"
    extra = None
    options = {"api_key": None, "project": None, "log_dir": None}
    secret_keys = ("api_key",)

    def start(self, hparams=None):
        self.path = self.default_dir("log_dir", "leaky") / "steps.txt"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(f"project {self.settings['project']} run {self.run_name}\\n")

    def log(self, values, step=None):
        if step == 2:
            key = self.settings["api_key"]
            self.backend_call("log", lambda: (_ for _ in ()).throw(RuntimeError(f"401 for key {key}")))
        with open(self.path, "a") as fh:
            fh.write(f"{step} {sorted(values)}\\n")

    def log_hparams(self, hparams):
        with open(self.path, "a") as fh:
            fh.write(f"hparams {self.scrub_hparams(hparams)}\\n")

    def finish(self):
        with open(self.path, "a") as fh:
            fh.write("finished\\n")

register_tracker("leaky", LeakyTracker)
'''


def _assert_no_secret(roots: list[Path], *texts: str) -> None:
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file() and path.suffix != ".yaml":  # the config file is where the key lives
                assert SECRET.encode() not in path.read_bytes(), f"secret written to {path}"
    for text in texts:
        assert SECRET not in text


def test_a_trackers_secret_never_appears_in_output_logs_or_files(
    make_bridge,
    tmp_path: Path,
    restore_registry: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture,
) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "leaky_plugin.py").write_text(SECRET_TRACKER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    caplog.set_level(logging.DEBUG)
    settings = {
        "imports": ["leaky_plugin"],
        "track_with": ["leaky", "jsonl"],
        "tracker_kwargs": {
            "leaky": {"api_key": SECRET, "project": "p", "log_dir": str(tmp_path / "leaky")},
            "jsonl": {"log_dir": str(tmp_path / "jl")},
        },
    }
    out = io.StringIO()
    bridge = make_bridge(settings, out=out)
    send_steps(bridge.url, "secret-run", range(1, 4), hparams={"tracker_kwargs": {"api_key": SECRET}, "note": f"key={SECRET}"})
    _, stats = get(f"{bridge.url}/stats")
    bridge.close()

    text = (tmp_path / "leaky" / "secret-run" / "steps.txt").read_text()
    assert "hparams" in text and "1 [" in text and "3 [" in text and "finished" in text  # it ran, and step 2 failed
    startup = out.getvalue().splitlines()[0]  # the key masked, the rest as configured
    assert f'leaky {{"api_key": "***", "project": "p", "log_dir": "{tmp_path / "leaky"}"}}' in startup, startup
    failures = [r.getMessage() for r in caplog.records if "leaky" in r.getMessage() and "failed" in r.getMessage()]
    assert failures and "401 for key ***" in failures[0]
    captured = capfd.readouterr()
    _assert_no_secret(
        [tmp_path],
        out.getvalue(),
        captured.out,
        captured.err,
        stats.decode(),
        repr(bridge.config),
        str(bridge.config.public_dict()),
        "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records),
    )


def test_the_command_serves_until_sigterm_then_finishes_and_never_prints_the_secret(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "leaky_plugin.py").write_text(SECRET_TRACKER_MODULE)
    port = free_port()
    config = tmp_path / "bridge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{port}",
                "imports": ["leaky_plugin"],
                "track_with": ["leaky", "tensorboard"],
                "tracker_kwargs": {
                    "leaky": {"api_key": SECRET, "project": "p"},
                    "tensorboard": {"log_dir": "tb", "flush_secs": 3600, "max_queue": 100000},
                },
                "base_dir": "runs",
            }
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "plugins"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_rl.cli", "bridge", "--config", str(config), "-v"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while get_ok(f"http://127.0.0.1:{port}/healthz") is False:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the bridge did not answer /healthz in 30 s"
            time.sleep(0.1)
        send_steps(f"http://127.0.0.1:{port}", "cli-run", range(1, 4))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"listening on http://127.0.0.1:{port}" in out and "new run cli-run" in out and "otel-rl bridge: stopped" in out
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb" / "cli-run"), size_guidance={"scalars": 0})
    events.Reload()
    for key in ("actor/pg_loss", "critic/score/mean", "actor/total_samples"):
        assert [(e.step, e.value) for e in events.Scalars(key)] == [
            (s, pytest.approx(float(step_values(s)[key]), rel=1e-6)) for s in range(1, 4)
        ]
    assert (tmp_path / "runs" / "cli-run" / "leaky" / "steps.txt").read_text().endswith("finished\n")
    _assert_no_secret([tmp_path], out, err)


def get_ok(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


# ---- configuration and command line ---------------------------------------------------------------


def test_per_run_kwargs_make_folders_files_and_names_unique() -> None:
    assert per_run_tracker_kwargs("tensorboard", {"log_dir": "/tb", "flush_secs": 5}, "r1") == {"log_dir": "/tb/r1", "flush_secs": 5}
    assert per_run_tracker_kwargs("jsonl", {"path": "/x/steps.jsonl"}, "r1") == {"path": "/x/steps-r1.jsonl"}
    assert per_run_tracker_kwargs(
        ["wandb", "swanlab", "mlflow"],
        {
            "wandb": {"dir": "/w", "name": "grpo", "project": "p"},
            "swanlab": {"logdir": "/s", "experiment_name": "grpo"},
            "mlflow": {"experiment_name": "grpo", "run_name": "grpo"},
        },
        "r1",
    ) == {
        "wandb": {"dir": "/w/r1", "name": "grpo-r1", "project": "p"},
        "swanlab": {"logdir": "/s/r1", "experiment_name": "grpo-r1"},
        "mlflow": {"experiment_name": "grpo", "run_name": "grpo-r1"},
    }  # an MLflow experiment holds many runs


def test_config_file_errors_name_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    for text, message in [
        ("tracker_kwargs: {}\n", "track_with"),
        ("track_with: jsonl\nranks: some\n", "ranks"),
        ("track_with: jsonl\ntracker_keys: fancy\n", "tracker_keys"),
        ("track_with: jsonl\nlisten: localhost\n", "listen"),
        ("track_with: jsonl\nsplit_run: true\n", r"unknown setting\(s\) split_run"),
        ("track_with: [jsonl\n", "not valid YAML"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_bridge_config(path)
    path.write_text("track_with: [tensorboard, jsonl]\nranks: [0, 8]\nlisten: 0.0.0.0:4319\n")
    config = load_bridge_config(path)
    assert (config.track_with, config.ranks, config.listen, config.split_runs) == (("tensorboard", "jsonl"), (0, 8), "0.0.0.0:4319", True)


def test_cli_help_explains_the_config_file_and_bad_configs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bridge", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for word in (
        "--config",
        "track_with",
        "tracker_kwargs",
        "tracker_keys",
        "ranks",
        "split_runs",
        "127.0.0.1:4319",
        "/v1/logs",
        "rl.progress.step",
        "example (bridge.yaml)",
        "gateway-bridge.yaml",
    ):
        assert word in text, word
    example = text.split("example (bridge.yaml):\n", 1)[1].split("\n\n", 1)[0]
    parsed = BridgeConfig.from_mapping(yaml.safe_load(textwrap.dedent(example)))  # the example is a valid config
    assert parsed.track_with == ("tensorboard", "wandb")
    (tmp_path / "bad.yaml").write_text(f"track_with: nosuchtracker\ntracker_kwargs: {{api_key: {SECRET}}}\n")
    assert main(["bridge", "--config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert "unknown tracker 'nosuchtracker'" in err and SECRET not in err
    assert main(["bridge", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ---- the bridge in the local stack ----------------------------------------------------------------


def test_the_stack_runs_the_bridge_only_with_a_config_and_routes_the_gateways_logs_to_it(tmp_path: Path) -> None:
    from otel_rl.stack import COMPONENT_NAMES, Stack, StackError
    from otel_rl.stack._components import Context, check_health, plan_launch

    config = tmp_path / "conf" / "bridge.yaml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump({"track_with": "wandb", "tracker_kwargs": {"api_key": SECRET, "mode": "offline"}}))
    assert Stack(tmp_path / "s", port_offset=100, out=None).components == COMPONENT_NAMES  # no bridge by default
    assert Stack(tmp_path / "s", port_offset=100, out=None, bridge_config=config).components == (*COMPONENT_NAMES, "bridge")

    def launch(name: str, running: set[str], bridge_config: Path | None = config):
        ctx = Context(
            data_dir=tmp_path / "s", offset=100, running=frozenset(running), binary=lambda p, b: tmp_path / b, bridge_config=bridge_config
        )
        return plan_launch(name, ctx)

    overlay = "collector-config/otelcol/gateway-bridge.yaml"
    alone = launch("otelcol-gateway", {"otelcol-gateway", "victoria-metrics"})
    assert "OTEL_RL_BRIDGE_ENDPOINT" not in alone.env and not any(a.endswith(overlay) for a in alone.command)
    routed = launch("otelcol-gateway", {"otelcol-gateway", "bridge"})
    assert routed.env["OTEL_RL_BRIDGE_ENDPOINT"] == "http://127.0.0.1:4419" and any(a.endswith(overlay) for a in routed.command)
    bridge = launch("bridge", {"otelcol-gateway", "bridge"})
    assert bridge.command == [sys.executable, "-m", "otel_rl.cli", "bridge", "--config", str(config), "--listen", "127.0.0.1:4419"]
    assert bridge.cwd == config.parent and bridge.ports == {"otlp_http": 4419}
    assert SECRET not in json.dumps([bridge.command, bridge.env])  # what the PID file records
    with pytest.raises(ValueError, match="--bridge-config"):
        launch("bridge", {"bridge"}, bridge_config=None)
    with pytest.raises(StackError, match="--bridge-config"):
        Stack(tmp_path / "s", port_offset=100, only="bridge", out=None).up(install=False)
    (tmp_path / "bad.yaml").write_text("track_with: nosuchtracker\n")
    with pytest.raises(StackError, match="unknown tracker 'nosuchtracker'"):  # before anything starts
        Stack(tmp_path / "s", port_offset=100, only="bridge", bridge_config=tmp_path / "bad.yaml", out=None).up(install=False)
    assert not list((tmp_path / "s").glob("run/*.json"))

    with TrackerBridge(BridgeConfig.from_mapping({"track_with": "stdout", "listen": "127.0.0.1:0"}), out=None) as running:
        assert check_health("bridge", {"otlp_http": running.address[1]})
    assert not check_health("bridge", {"otlp_http": running.address[1]}, timeout_s=0.5)


def test_stack_up_starts_the_bridge_process_and_down_stops_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from otel_rl.stack import Stack, free_port_offset
    from otel_rl.stack.process import is_alive, read_pid_file

    config = tmp_path / "bridge.yaml"
    config.write_text("track_with: jsonl\ntracker_kwargs: {log_dir: out}\n")
    stack = Stack(tmp_path / "s", port_offset=free_port_offset(), only="bridge", bridge_config=config, out=None)
    try:
        (status,) = stack.up(timeout_s=30, install=False)  # nothing to install: it runs in this Python
        assert (status.name, status.state, status.ports) == ("bridge", "healthy", {"otlp_http": 4319 + stack.port_offset})
        assert status.urls["OTLP logs"] == f"{stack.bridge_endpoint}/v1/logs"
        send_steps(stack.bridge_endpoint, "stack-run", range(1, 3))
        # Started without --bridge-config, a stack in the same folder still lists the running bridge.
        assert "bridge" in [s.name for s in Stack(tmp_path / "s", out=None).status()]
    finally:
        rec = read_pid_file(tmp_path / "s" / "run" / "bridge.json")
        stack.down()
    assert rec is not None and not is_alive(rec)
    # SIGTERM from `down` made the bridge finish its trackers; relative paths are relative to the config's folder.
    assert jsonl_steps(tmp_path / "out" / "stack-run" / "metrics.jsonl") == {1: step_values(1), 2: step_values(2)}
    log = (tmp_path / "s" / "logs" / "bridge.log").read_text()
    assert "new run stack-run" in log and "otel-rl bridge: stopped; 1 run(s), 2 step event(s)" in log
    with pytest.raises(SystemExit):
        main(["stack", "up", "--help"])
    assert "--bridge-config" in capsys.readouterr().out


def test_a_quiet_run_is_finished_and_reopened_when_it_sends_again(make_bridge, tmp_path: Path, memory_tracker: type[MemoryTracker]) -> None:
    out = io.StringIO()
    bridge = make_bridge(
        {"track_with": ["memory", "jsonl"], "tracker_kwargs": {"jsonl": {"log_dir": str(tmp_path / "jl")}}, "run_idle_timeout_s": 0.5},
        out=out,
    )
    send_steps(bridge.url, "pausing", range(1, 3))
    deadline = time.monotonic() + 10
    while "idle for" not in out.getvalue():
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.05)
    first = [t for t in memory_tracker.instances if t.calls]
    assert len(first) == 1 and first[0].calls[-1] == "finish"  # finished while the bridge keeps running
    send_steps(bridge.url, "pausing", range(3, 5))
    bridge.close()
    opened = [t for t in memory_tracker.instances if t.calls]
    assert len(opened) == 2 and [s for s, _ in opened[1].steps] == [3, 4] and opened[1].calls[-1] == "finish"
    assert opened[1].run_dir == opened[0].run_dir and opened[1].run_name == opened[0].run_name == "grpo-test-pausing"
    assert jsonl_steps(tmp_path / "jl" / "pausing" / "metrics.jsonl") == {s: step_values(s) for s in range(1, 5)}
    assert "run pausing sends again: its trackers are reopened" in out.getvalue()
    assert bridge.stats()["runs"] == 1


def test_the_bridge_port_matches_the_gateway_overlay_and_the_stack() -> None:
    import re as regex

    from otel_rl.bridge import DEFAULT_LISTEN, parse_listen
    from otel_rl.stack._components import LOGS_BRIDGE_PORT

    overlay = yaml.safe_load((Path(__file__).resolve().parents[2] / "collector-config" / "otelcol" / "gateway-bridge.yaml").read_text())
    endpoint = overlay["exporters"]["otlp_http/bridge"]["endpoint"]
    default = regex.fullmatch(r"\$\{env:OTEL_RL_BRIDGE_ENDPOINT:-(http://[^}]+)\}", endpoint).group(1)
    host_port = default.removeprefix("http://")
    assert "/" not in host_port, "a base URL: the collector's otlp_http exporter appends /v1/logs itself"
    assert int(host_port.rsplit(":", 1)[1]) == parse_listen(DEFAULT_LISTEN)[1] == LOGS_BRIDGE_PORT == 4319
    assert overlay["exporters"]["otlp_http/bridge"].get("encoding", "proto") == "proto"
