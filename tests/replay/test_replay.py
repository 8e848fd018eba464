"""Replaying a log sends every step through telemetry with its original time, exactly once."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import replay_samples as samples
from shared_files import LOGS, needs_shared_logs

import otel_rl
from otel_rl.replay import MARKER_FILE, add_cli, parse_file, replay_file, run_id_for
from otel_rl.replay._run import parse_start
from otel_rl.replay.progress import Progress
from otel_rl.runs.folder import read_log_records, read_metrics
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N


def step_events(run_dir: Path) -> list[dict]:
    return [r for r in read_log_records(run_dir) if r["event_name"] == N.RL_LOG_EVENT]


@needs_shared_logs
def test_real_swift_log_replays_with_elapsed_times_and_mapped_metrics(tmp_path):
    src = LOGS / "swift_grpo_logging_lines_from_issues.jsonl"
    out = io.StringIO()
    result = replay_file(src, out=out, progress=False, segment=1, start_time="2025-01-01T00:00:00Z")  # the first of three runs
    assert not result.skipped and result.records == 2 and result.format == "swift"
    events = step_events(result.run_dir)
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    assert [e["body"] for e in events] == rows[:2]  # the exact values, strings included
    assert [e["attributes"][A.RL_STEP] for e in events] == [1, 2]
    origin = parse_start("2025-01-01T00:00:00Z")
    assert [(e["timestamp"] - origin) / 1e9 for e in events] == [36.0, 39.0]
    assert events[0]["resource"][A.RL_RUN_ID] == result.run_id
    names = {p.name for p in read_metrics(result.run_dir)}
    assert {M.RL_RESPONSE_CLIPPED_RATIO, M.RL_THROUGHPUT_STEPS, M.RL_GPU_MEMORY_USAGE} <= names  # these rows log no kl
    text = out.getvalue()
    assert "2 steps (1-2)" in text and "elapsed time" in text and result.run_id in text
    assert "holds 3 runs" in text and "WARNING" not in text
    marker = json.loads((result.run_dir / "replay.json").read_text())
    assert marker["format"] == "swift" and marker["steps"] == {"first": 1, "last": 2, "count": 2} and marker["segment"] == 1


@needs_shared_logs
def test_trainer_state_gets_the_stated_synthetic_clock(tmp_path):
    out = io.StringIO()
    result = replay_file(
        LOGS / "trl_grpo_aaipl_checkpoint-500_trainer_state.json",
        out=out,
        progress=False,
        step_seconds=30,
        start_time="2025-03-01T00:00:00Z",
    )
    events = step_events(result.run_dir)
    assert len(events) == 50
    origin = parse_start("2025-03-01")
    assert [(e["timestamp"] - origin) // 10**9 for e in events[:3]] == [300, 600, 900]  # step x 30 s
    assert "synthetic" in out.getvalue() and "step x 30 s" in out.getvalue()


@needs_shared_logs
def test_every_metric_point_lands_at_its_steps_original_time(tmp_path):
    """One point per logged step and series, stamped like the step's event: the run keeps its timeline."""
    src = LOGS / "trl_grpo_aaipl_checkpoint-500_trainer_state.json"
    result = replay_file(src, out=io.StringIO(), progress=False, step_seconds=30, start_time="2025-03-01T00:00:00Z")
    events = step_events(result.run_dir)
    event_time = {e["attributes"][A.RL_STEP]: e["timestamp"] for e in events}
    points = [p for p in read_metrics(result.run_dir) if p.name == M.RL_POLICY_ENTROPY]
    logged = {e["attributes"][A.RL_STEP]: e["body"]["entropy"] for e in events if "entropy" in e["body"]}
    assert len(points) == len(logged) == 50
    by_time = {p.time_ns: p.value for p in points}
    assert by_time == {event_time[step]: pytest.approx(value) for step, value in logged.items()}
    # otel-rl's own metrics still describe the replay process, at export time
    assert any(p.name.startswith("process.") and p.time_ns > max(event_time.values()) for p in read_metrics(result.run_dir))


def test_verl_steps_with_timers_are_replayed_as_traces_at_their_time(tmp_path):
    from otel_rl.runs.folder import read_spans

    timing = {
        "timing_s/gen": 5.0,
        "timing_s/reward": 1.0,
        "timing_s/old_log_prob": 0.5,
        "timing_s/adv": 0.1,
        "timing_s/update_actor": 2.0,
        "timing_s/step": 9.0,
    }
    data = [(step, {**timing, "actor/pg_loss": 0.1 * step}) for step in (1, 2, 3)] + [(4, {"actor/pg_loss": 0.4})]
    src = tmp_path / "verl.jsonl"
    src.write_text(samples.verl_jsonl(data))
    out = io.StringIO()
    result = replay_file(src, out=out, progress=False, step_seconds=30, start_time="2025-03-01T00:00:00Z")
    assert result.traces == 3 and "3 steps traced" in out.getvalue()
    event_time = {e["attributes"][A.RL_STEP]: e["timestamp"] for e in step_events(result.run_dir)}
    spans = read_spans(result.run_dir)
    roots = {s.attributes[A.RL_STEP]: s for s in spans if s.name == N.RL_STEP_SPAN}
    assert sorted(roots) == [1, 2, 3]  # step 4 logged no timers
    for step, root in roots.items():
        assert root.end_ns == event_time[step] and root.duration_ns == 9 * 10**9
        children = sorted((s for s in spans if s.parent_span_id == root.span_id), key=lambda s: s.start_ns)
        assert [s.name for s in children] == ["rl.generate", "rl.compute_rewards", "rl.compute_log_probs", "rl.advantage", "rl.train_step"]
        assert all(s.attributes[A.RL_SPAN_RECONSTRUCTED] is True for s in children)


def test_replaying_twice_writes_nothing_twice_and_force_replaces(tmp_path):
    src = tmp_path / "logging.jsonl"
    src.write_text(samples.swift(samples.steps(40)))
    first = replay_file(src, out=io.StringIO(), progress=False)
    logs = first.run_dir / "logs.jsonl"
    size = logs.stat().st_size
    marker = json.loads((first.run_dir / MARKER_FILE).read_text())
    assert marker["completed"] and marker["records"] == 40

    out = io.StringIO()
    second = replay_file(src, out=out, progress=False)
    assert second.skipped and second.run_id == first.run_id and second.run_dir == first.run_dir
    assert logs.stat().st_size == size and "already replayed" in out.getvalue()

    third = replay_file(src, out=io.StringIO(), progress=False, force=True)
    assert not third.skipped and third.run_id == first.run_id
    assert len(step_events(third.run_dir)) == 40  # replaced, not doubled
    resource = step_events(third.run_dir)[0]["resource"]
    assert resource["service.instance.id"] == first.run_id  # the same resource as the first time


def test_an_unfinished_replay_is_redone(tmp_path):
    src = tmp_path / "logging.jsonl"
    src.write_text(samples.swift(samples.steps(10)))
    first = replay_file(src, out=io.StringIO(), progress=False)
    marker_path = first.run_dir / MARKER_FILE
    marker = json.loads(marker_path.read_text())
    marker["completed"] = False  # as if the process died half-way
    marker_path.write_text(json.dumps(marker))
    again = replay_file(src, out=io.StringIO(), progress=False)
    assert not again.skipped and len(step_events(again.run_dir)) == 10


def test_run_id_depends_on_content_and_resource(tmp_path):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text(samples.swift(samples.steps(5, seed=1)))
    b.write_text(samples.swift(samples.steps(5, seed=2)))
    ra = replay_file(a, out=io.StringIO(), progress=False)
    rb = replay_file(b, out=io.StringIO(), progress=False)
    rc = replay_file(a, out=io.StringIO(), progress=False, service_name="other")
    assert len({ra.run_id, rb.run_id, rc.run_id}) == 3
    assert run_id_for("x", format="swift", framework="swift", service_name="s", experiment=None) == run_id_for(
        "x", format="swift", framework="swift", service_name="s", experiment=None
    )


@pytest.mark.parametrize(
    "fmt, make, name",
    [
        ("verl-console", lambda d: samples.verl_console(d), "verl.log"),
        ("verl-jsonl", lambda d: samples.verl_jsonl(d), "exp.jsonl"),
        ("roll-stdout", lambda d: samples.roll_stdout(d), "roll.log"),
        ("trl-state", lambda d: samples.trainer_state(d), "trainer_state.json"),
    ],
)
def test_each_format_replays_every_step(tmp_path, fmt, make, name):
    data = samples.steps(12)
    src = tmp_path / name
    src.write_text(make(data))
    result = replay_file(src, out=io.StringIO(), progress=False)
    assert result.format == fmt
    events = step_events(result.run_dir)
    assert [e["attributes"][A.RL_STEP] for e in events] == [s for s, _ in data]
    assert events[0]["resource"][A.RL_FRAMEWORK] == result.framework
    assert result.points == sum(len(v) for _, v in data)


def test_roll_stdout_keeps_the_logged_timestamps(tmp_path):
    src = tmp_path / "roll.log"
    src.write_text(samples.roll_stdout(samples.steps(3)))
    result = replay_file(src, out=io.StringIO(), progress=False)
    parsed = parse_file(src)
    assert [e["timestamp"] for e in step_events(result.run_dir)] == [r.time_ns for r in parsed.records]


def test_log_takes_an_explicit_time_and_a_bad_one_never_raises(make_telemetry, caplog):
    tel = make_telemetry()
    tel.log({"actor/pg_loss": 0.5}, step=3, time_ns=1_700_000_000_123_456_789)
    tel.log({"actor/pg_loss": 0.6}, step=4, time_ns="yesterday")  # type: ignore[arg-type]
    tel.flush()
    events = step_events(tel.run_dir)
    assert events[0]["timestamp"] == 1_700_000_000_123_456_789
    assert events[1]["body"] == {"actor/pg_loss": 0.6} and events[1]["timestamp"] > 1_700_000_000_123_456_789
    assert "time_ns='yesterday'" in caplog.text


def test_cli_parses_and_reports_a_bad_file(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="otel-rl")
    add_cli(parser.add_subparsers(dest="command"))
    src = tmp_path / "logging.jsonl"
    src.write_text(samples.swift(samples.steps(3)))
    junk = tmp_path / "junk.txt"
    junk.write_text("nothing to see\n")
    args = parser.parse_args(["replay", str(src), str(junk), "-q"])
    assert args.func(args) == 1
    captured = capsys.readouterr()
    assert "3 steps" in captured.out
    assert "junk.txt" in captured.err and "--format" in captured.err
    help_text = parser._subparsers._group_actions[0].choices["replay"].format_help()  # type: ignore[union-attr]
    for word in ("swift", "trl-state", "hf-console", "verl-console", "roll-stdout", "--step-seconds", "replay.json"):
        assert word in help_text


def test_progress_bar_only_on_request():
    stream = io.StringIO()
    bar = Progress(10, "replay x", stream=stream, interval_s=0)  # not a TTY: silent
    bar.update(5, 50)
    bar.close()
    assert stream.getvalue() == ""
    bar = Progress(10, "replay x", stream=stream, enabled=True, interval_s=0)
    bar.update(5, 50)
    bar.close()
    assert "50%" in stream.getvalue() and "5/10" in stream.getvalue() and "points/s" in stream.getvalue()


def test_get_telemetry_unaffected_after_replay(tmp_path):
    src = tmp_path / "logging.jsonl"
    src.write_text(samples.swift(samples.steps(2)))
    replay_file(src, out=io.StringIO(), progress=False)
    assert otel_rl.get_telemetry() is None  # the replay's telemetry was shut down


def test_a_run_folder_replays_elsewhere_never_into_itself(tmp_path, make_telemetry):
    tel = make_telemetry(framework="verl")
    for step in range(1, 6):
        tel.log({"actor/pg_loss": 0.1 * step}, step=step)
    tel.flush()
    source = tel.run_dir
    with pytest.raises(ValueError, match="into itself"):
        replay_file(source, run_dir=source, out=io.StringIO(), progress=False)
    result = replay_file(source, run_dir=tmp_path / "copy", out=io.StringIO(), progress=False)
    original = step_events(source)
    copied = step_events(result.run_dir)
    assert [e["body"] for e in copied] == [e["body"] for e in original]
    assert [e["timestamp"] for e in copied] == [e["timestamp"] for e in original]
    assert result.framework == "verl"
