"""A real training process SIGKILLed mid-run at ~100 steps/s: what its run folder (or its disk
spool, pushed later) holds against the steps its loop finished."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from otlp_sink import OtlpSink

import otel_rl
import otel_rl.runs.push as _push
from otel_rl.cli import main
from otel_rl.runs.folder import read_log_records, read_metrics, read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N
from otel_rl.stack.process import free_port

pytestmark = pytest.mark.e2e

# Steps of 250 keys (TRL-style per-reward-function keys) at ~100 steps/s; after each finished step
# the loop writes its number where the test reads it (pwrite: one atomic write, no buffer).
CHILD = """
import os, time
import otel_rl
tel = otel_rl.init(service_name="sigkill", run_dir={run_dir!r}, console=False, framework="trl", {options})
progress = os.open({progress!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
step = 0
while True:
    step += 1
    values = {{f"rewards/fn{{i}}/mean": step + 0.001 * i for i in range(250)}}  # each value names its step
    with tel.step(step):
        with tel.stage("generate"):
            time.sleep(0.005)
        with tel.stage("train"):
            pass
        tel.log(values, step=step)
    os.pwrite(progress, b"%10d" % step, 0)
    time.sleep(0.004)
"""

MAX_MISSING = 5


def kill_mid_run(tmp_path: Path, options: str, after_steps: int = 300) -> tuple[int, float]:
    """Start the child, SIGKILL it once it finished ``after_steps``; the last finished step and the kill time."""
    progress = tmp_path / "progress"
    code = CHILD.format(run_dir=str(tmp_path / "run"), options=options, progress=str(progress))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = progress.read_bytes().strip() if progress.exists() else b""
            if text and int(text) >= after_steps:
                break
            if child.poll() is not None:
                raise AssertionError(f"the child ended early: {child.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
        else:
            raise AssertionError("the child did not reach its steps in 60 s")
        child.send_signal(signal.SIGKILL)
        killed_at = time.time()
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    finished = int(progress.read_bytes().strip())
    return finished, killed_at


def missing(steps: set[int], finished: int) -> list[int]:
    return [s for s in range(1, finished + 1) if s not in steps]


def test_a_sigkill_loses_at_most_the_last_few_steps_of_the_run_folder(tmp_path: Path) -> None:
    # The default metric export interval (60 s): the process dies before its first metric export.
    finished, _ = kill_mid_run(tmp_path, "")
    run = tmp_path / "run"
    events = read_log_records(run)
    logged = {r["attributes"][A.RL_STEP] for r in events if r["event_name"] == N.RL_LOG_EVENT}
    lost = missing(logged, finished)
    assert len(lost) <= MAX_MISSING and all(s > finished - MAX_MISSING for s in lost), (finished, lost[:10])
    assert all(len(r["body"]) == 250 for r in events if r["event_name"] == N.RL_LOG_EVENT)
    spans = read_spans(run)
    traced = {s.attributes.get(A.RL_STEP) for s in spans if s.name == N.RL_STEP_SPAN}
    lost_spans = missing(traced, finished)
    assert len(lost_spans) <= MAX_MISSING, (finished, lost_spans[:10])
    # A torn last line is the worst case: every reader skips it and says so; nothing else is bad.
    for result in (events, spans):
        assert all(p.reason == "truncated JSON" for p in result.problems), result.problems

    # Metric points: none was exported yet; `otel-rl recover` rebuilds them from the events, every
    # step's 250 points at the step's own time.
    assert not [p for p in read_metrics(run) if p.name == M.RL_REWARD_COMPONENT]
    assert main(["recover", str(run), "--resolution", "0"]) == 0
    points = read_metrics(run)
    assert all(p.reason == "truncated JSON" for p in points.problems), points.problems
    by_step: dict[int, list] = {}
    for p in points:
        if p.name == M.RL_REWARD_COMPONENT:
            by_step.setdefault(int(p.value), []).append(p)
    lost_points = missing({s for s, found in by_step.items() if len(found) == 250}, finished)
    assert len(lost_points) <= MAX_MISSING and all(s > finished - MAX_MISSING for s in lost_points), (finished, lost_points[:10])
    times = {r["attributes"][A.RL_STEP]: r["timestamp"] for r in events if r["event_name"] == N.RL_LOG_EVENT}
    step = finished - MAX_MISSING
    fn7 = next(p for p in by_step[step] if p.attributes[A.RL_REWARD_FUNCTION] == "fn7")
    assert (fn7.value, fn7.time_ns) == (pytest.approx(step + 0.007), times[step])


def test_the_next_process_in_the_folder_rebuilds_the_killed_ones_metric_points_by_itself(tmp_path: Path) -> None:
    # No command run by hand: the process that takes the folder next finds its predecessor's PID in
    # the rank's lock file and rebuilds the points from the events, beside itself, at the default
    # resolution (each series' latest value per second of step time).
    finished, _ = kill_mid_run(tmp_path, "", after_steps=250)
    run = tmp_path / "run"
    assert not [p for p in read_metrics(run) if p.name == M.RL_REWARD_COMPONENT]
    resumed = otel_rl.Telemetry(otel_rl.resolve_config({"run_dir": str(run), "console": False, "service_name": "resumed"}))
    try:
        assert str(resumed.run_dir) == str(run) and resumed.recovery is not None
        assert resumed.recovery.wait(60) == 0
    finally:
        resumed.shutdown()
    events = {r["attributes"][A.RL_STEP]: r for r in read_log_records(run) if r["event_name"] == N.RL_LOG_EVENT}
    fn7 = sorted(
        (p for p in read_metrics(run) if p.name == M.RL_REWARD_COMPONENT and p.attributes[A.RL_REWARD_FUNCTION] == "fn7"),
        key=lambda p: p.time_ns,
    )
    assert fn7, "no point rebuilt"
    # one point per second of steps at ~100 steps/s, each at its step's own time and value
    assert len(fn7) >= (finished - 1) // 120
    at_time = {r["timestamp"]: step for step, r in events.items()}
    for point in fn7:
        assert point.value == pytest.approx(at_time[point.time_ns] + 0.007)
    assert fn7[-1].value > finished - MAX_MISSING  # the last one: one of the last few steps


def test_a_sigkill_during_a_collector_outage_leaves_a_spool_that_push_delivers(tmp_path: Path) -> None:
    # Float-only steps reach the spool at each drain of the worker, encoded by the direct writer
    # (exporters/step_events_proto.py), so the bound is the run folder's: the last few steps.
    dead = f"http://127.0.0.1:{free_port()}"
    finished, _ = kill_mid_run(tmp_path, f"endpoint={dead!r}, exporters='otlp', metric_export_interval_s=1")
    with OtlpSink() as sink:
        reports = _push.push(tmp_path / "run", endpoint=sink.endpoint, say=lambda line: None)
        assert reports and not any(sum(r.left.values()) for r in reports), reports
        logged = {r[1][A.RL_STEP] for r in sink.received.events(N.RL_LOG_EVENT)}
        lost = missing(logged, finished)
        assert len(lost) <= MAX_MISSING and all(s > finished - MAX_MISSING for s in lost), (finished, lost[:10])
        steps = [r[1][A.RL_STEP] for r in sink.received.events(N.RL_LOG_EVENT)]
        assert len(steps) == len(set(steps)), "a step was delivered twice"
        assert sink.received.points, "no metric point was delivered"
