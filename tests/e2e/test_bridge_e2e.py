"""The tracker bridge end to end, with real servers: the CPU demo -> the agent collector (OTLP gRPC
and HTTP) -> the gateway collector with collector-config/otelcol/gateway-bridge.yaml -> the bridge
(all started by ``otel-rl stack``) -> TensorBoard event files, read back with TensorBoard's own
EventAccumulator and compared, step by step and value by value, with what the demo logged (its run
folder's ``rl.log`` events); and the gateway's own events file (``file/rl_events``) holds the same
steps. Two runs, two TensorBoard folders. Every server is stopped by its PID at the end however the
test ends, and the whole test runs under a deadline."""

from __future__ import annotations

import io
import json
import math
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from go_builds import require_go_built

import otel_rl
from otel_rl.runs.folder import read_log_records
from otel_rl.semconv import names as N

pytestmark = pytest.mark.e2e

STEPS = 4
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_INVALID_TAG_CHARS = re.compile(r"[^-/\w.]")  # TensorBoard's tag rule, as the tensorboard tracker applies it


@pytest.fixture
def bridge_stack(tmp_path: Path) -> Iterator[Any]:
    """Agent, gateway and the tracker bridge on a free port offset, in a data folder of the test's."""
    from otel_rl.stack import Stack, free_port_offset
    from otel_rl.stack.process import is_alive, read_pid_file

    config_dir = tmp_path / "bridge"
    config_dir.mkdir()
    config = config_dir / "bridge.yaml"
    # A relative log_dir: under the stack the bridge runs in its config file's folder.
    config.write_text(yaml.safe_dump({"track_with": "tensorboard", "tracker_kwargs": {"log_dir": "tb"}}))
    out = io.StringIO()
    require_go_built()
    names = ("otelcol-agent", "otelcol-gateway", "bridge")
    stack = Stack(tmp_path / "stack", port_offset=free_port_offset(), only=",".join(names), bridge_config=config, out=out)
    records: list[Any] = []
    try:
        stack.up()
        records = [read_pid_file(stack.data_dir / "run" / f"{name}.json") for name in names]
        yield stack
    finally:
        stack.down()
        for rec in records:
            assert rec is not None and not is_alive(rec), f"{rec.name} (pid {rec.pid}) still runs"


def bridge_stats(stack: Any) -> dict[str, Any]:
    with _OPENER.open(f"{stack.bridge_endpoint}/stats", timeout=5) as response:
        return json.loads(response.read())


def wait_for(what: str, probe: Any, deadline_s: float) -> Any:
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        try:
            last = probe()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {deadline_s} s (last: {last!r})")


def run_demo_through_the_agent(stack: Any, protocol: str, run_id: str, root: Path) -> Path:
    """The CPU demo exporting OTLP to the agent, and to a run folder (the record of what was logged)."""
    from otel_rl.demo import run_demo

    endpoint = stack.endpoints["otlp_grpc" if protocol == "grpc" else "otlp_http"]
    run_dir = root / run_id
    tel = otel_rl.init(
        service_name="otel-rl-bridge-e2e",
        run_id=run_id,
        endpoint=endpoint,
        protocol=protocol,
        exporters="otlp,file",
        run_dir=str(run_dir),
        framework="roll",
        console=False,
        metric_export_interval_s=1.0,
    )
    try:
        run_demo(steps=STEPS, algo="ppo", telemetry=tel, out=run_dir / "out", progress=False)
    finally:
        tel.shutdown()
    return run_dir


def logged_steps(run_dir: Path) -> dict[int, dict[str, Any]]:
    """step -> the exact key -> value map the demo logged, from its run folder's rl.log events."""
    records = read_log_records(run_dir)
    assert not records.problems, records.problems
    steps: dict[int, dict[str, Any]] = {}
    for record in records:
        if record["event_name"] == N.RL_LOG_EVENT:
            step = int(record["attributes"]["rl.step"])
            assert step not in steps, f"two rl.log events for step {step}"
            steps[step] = record["body"]
    return steps


def read_tensorboard(folder: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[tuple[int, str]]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags["scalars"]}
    texts = {
        tag: [(e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()) for e in events.Tensors(tag)] for tag in tags["tensors"]
    }
    return scalars, texts


def expected_tensorboard(steps: dict[int, dict[str, Any]]) -> tuple[dict[str, list], dict[str, list]]:
    """What the tensorboard tracker writes for these steps: numbers (bools as 0/1) as float32 scalars, text as text."""
    scalars: dict[str, list] = {}
    texts: dict[str, list] = {}
    for step in sorted(steps):
        for key, value in steps[step].items():
            tag = _INVALID_TAG_CHARS.sub("_", key).lstrip("/")
            if isinstance(value, str):
                texts.setdefault(f"{tag}/text_summary", []).append((step, value))  # add_text's tag
            elif isinstance(value, (bool, int, float)):
                scalars.setdefault(tag, []).append((step, float(np.float32(value))))
    return scalars, texts


def gateway_events(path: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """run id -> step -> the rl.log map, from the gateway's events file (OTLP-JSON lines, one request a line)."""
    from otel_rl.runs.otlp_json_decode import decode_logs_request

    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        for record in decode_logs_request(json.loads(line)):
            if record["event_name"] == N.RL_LOG_EVENT:
                runs.setdefault(str(record["resource"]["rl.run.id"]), {})[int(record["attributes"]["rl.step"])] = record["body"]
    return runs


def test_demo_through_the_collectors_and_the_bridge_into_tensorboard(bridge_stack: Any, tmp_path: Path) -> None:
    stack = bridge_stack
    from otel_rl.stack.process import read_pid_file

    # The stack ran the gateway with the bridge overlay, pointed at the bridge (the exporter appends /v1/logs).
    gateway = read_pid_file(stack.data_dir / "run" / "otelcol-gateway.json")
    assert any(arg.endswith("collector-config/otelcol/gateway-bridge.yaml") for arg in gateway.command)
    assert gateway.env["OTEL_RL_BRIDGE_ENDPOINT"] == stack.bridge_endpoint
    assert {s.name: s.state for s in stack.status()} == dict.fromkeys(("otelcol-agent", "otelcol-gateway", "bridge"), "healthy")

    demo_root = tmp_path / "demo"
    stamp = int(time.time())
    runs = {
        f"bridge-grpc-{stamp}": run_demo_through_the_agent(stack, "grpc", f"bridge-grpc-{stamp}", demo_root),
        f"bridge-http-{stamp}": run_demo_through_the_agent(stack, "http/protobuf", f"bridge-http-{stamp}", demo_root),
    }
    logged = {run_id: logged_steps(run_dir) for run_id, run_dir in runs.items()}
    for run_id, steps in logged.items():
        assert sorted(steps) == list(range(1, STEPS + 1)), run_id
        assert len(steps[1]) >= 50, f"the demo logs the ROLL keys ({len(steps[1])} in step 1)"

    wait_for(
        "every step event at the bridge",
        lambda: bridge_stats(stack)["events_delivered"] == 2 * STEPS and bridge_stats(stack)["queued_requests"] == 0,
        60,
    )
    stats = bridge_stats(stack)
    assert stats["bad_requests"] == 0 and stats["worker_errors"] == 0 and stats["runs"] == 2
    # The same steps, value for value, in the gateway's events file (its file/rl_events exporter).
    assert wait_for("every step in the gateway's events file", lambda: gateway_events(stack.events_file) == logged, 30)
    # The agent -> gateway -> bridge -> tracker path up to here; down() then stops the collectors, then
    # the bridge (SIGTERM: the trackers are flushed and finished).
    stack.down()
    bridge_log = (stack.data_dir / "logs" / "bridge.log").read_text()
    assert "otel-rl bridge: listening on" in bridge_log and "otel-rl bridge: stopped; 2 run(s)" in bridge_log
    assert "ERROR" not in bridge_log and "Traceback" not in bridge_log

    tensorboard_root = tmp_path / "bridge" / "tb"
    assert sorted(p.name for p in tensorboard_root.iterdir()) == sorted(runs)  # one folder per run
    for run_id, steps in logged.items():
        scalars, texts = read_tensorboard(tensorboard_root / run_id)
        want_scalars, want_texts = expected_tensorboard(steps)
        assert sorted(scalars) == sorted(want_scalars), f"{run_id}: tags differ: {set(scalars) ^ set(want_scalars)}"
        for tag, points in want_scalars.items():
            got = scalars[tag]
            assert [s for s, _ in got] == [s for s, _ in points], f"{run_id} {tag}: steps {got}"
            for (step, value), (_, want) in zip(got, points):
                assert value == want or (math.isnan(value) and math.isnan(want)), f"{run_id} {tag} step {step}: {value} != {want}"
        for tag, points in want_texts.items():
            assert texts.get(tag) == points, f"{run_id} {tag}"
        compared = sum(len(p) for p in want_scalars.values()) + sum(len(p) for p in want_texts.values())
        print(f"\n{run_id}: {compared} values in {len(steps)} steps read back from TensorBoard, all equal to what was logged")
