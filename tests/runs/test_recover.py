"""``otel-rl recover``: the metric points a killed run had not exported, rebuilt from its events.

The crash is an image of a live run folder (what a SIGKILL would leave on disk: the events of
every drained step, metric points only up to the last export); the same run then shuts down
cleanly, and its final export is what the rebuilt points must agree with. The real SIGKILL is in
tests/e2e/test_sigkill.py.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID

from otel_rl.cli import main
from otel_rl.runs.folder import read_log_records, read_metrics
from otel_rl.runs.recover import recover
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

PG_LOSS = {A.RL_LOSS_TYPE: "policy", A.RL_MODEL_ROLE: "actor"}


def step_values(step: int) -> dict[str, object]:
    return {
        "actor/pg_loss": 0.5 / step,  # a gauge (ROLL's key)
        M.RL_PROGRESS_TOKENS: 1000.0 * step,  # a counter, logged as its running total
        "time/step_train": 0.25,  # a histogram (a stage duration)
        "note": "warm-up",  # text: stays in the event, no point
    }


def wait_for_events(run: Path, count: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if sum(r["event_name"] == N.RL_LOG_EVENT for r in read_log_records(run)) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{count} step events did not reach {run} in 10 s")


def series(points, name: str, attributes: dict | None = None) -> list:
    return sorted((p for p in points if p.name == name and (attributes is None or p.attributes == attributes)), key=lambda p: p.time_ns)


@pytest.fixture
def crashed(make_telemetry, tmp_path: Path):
    """(image of the run folder after step 10, with its last metric export after step 5; the live telemetry)."""
    tel = make_telemetry(framework="roll", metric_export_interval_s=3600)
    for step in range(1, 6):
        tel.log(step_values(step), step=step)
    tel.flush()  # the last metric export before the crash
    for step in range(6, 11):
        tel.log(step_values(step), step=step)
    run = Path(tel.config.run_dir)
    wait_for_events(run, 10)
    image = tmp_path / "crashed"
    shutil.copytree(run, image)
    return image, tel


def test_the_points_after_the_last_export_are_rebuilt_as_the_run_would_have_exported_them(crashed) -> None:
    image, tel = crashed
    before = read_metrics(image)
    assert len(series(before, M.RL_LOSS, PG_LOSS)) == 1  # the export after step 5 only

    said: list[str] = []
    (report,) = recover(image, resolution_s=0, say=said.append)
    assert (report.steps, report.first_step, report.last_step) == (5, 6, 10)
    assert report.histogram_series == 1 and report.not_numeric == 5  # time/step_train; the text key
    assert "steps 6-10" in said[0] and "1 histogram series" in said[0]

    after = read_metrics(image)
    assert not after.problems
    events = {r["attributes"][A.RL_STEP]: r["timestamp"] for r in read_log_records(image) if r["event_name"] == N.RL_LOG_EVENT}
    loss = series(after, M.RL_LOSS, PG_LOSS)[1:]
    assert [(p.time_ns, p.value) for p in loss] == [(events[s], 0.5 / s) for s in range(6, 11)]  # every step, at its own time
    tokens = series(after, M.RL_PROGRESS_TOKENS)
    assert [p.value for p in tokens[1:]] == [1000.0 * s for s in range(6, 11)]
    assert {p.start_time_ns for p in tokens} == {tokens[0].start_time_ns}  # the counter goes on, no reset
    assert tokens[-1].kind == "sum" and tokens[-1].is_monotonic
    assert {p.resource[SERVICE_INSTANCE_ID] for p in after} == {tel.resource.attributes[SERVICE_INSTANCE_ID]}

    # What the run itself exports when it ends cleanly: the same latest values.
    tel.shutdown()
    final = read_metrics(tel.config.run_dir)
    assert series(final, M.RL_LOSS, PG_LOSS)[-1].value == loss[-1].value
    assert series(final, M.RL_PROGRESS_TOKENS)[-1].value == tokens[-1].value
    assert series(final, M.RL_PROGRESS_TOKENS)[-1].start_time_ns == tokens[-1].start_time_ns

    (again,) = recover(image, say=said.append)
    assert again.steps == 0 and len(read_metrics(image)) == len(after)
    assert "nothing to recover" in said[-1]


def test_resolution_keeps_the_latest_value_of_each_window(crashed) -> None:
    image, _ = crashed
    (report,) = recover(image, resolution_s=3600, say=lambda line: None)
    loss = series(read_metrics(image), M.RL_LOSS, PG_LOSS)
    assert report.points == 2 and [p.value for p in loss[1:]] == [0.5 / 10]  # one window: step 10's value


def test_a_torn_last_line_stays_apart_from_the_rebuilt_points(crashed) -> None:
    image, _ = crashed
    with open(image / "metrics.jsonl", "ab") as f:
        f.write(b'{"resourceMetrics": [{"reso')  # the export the kill cut short
    recover(image, resolution_s=0, say=lambda line: None)
    after = read_metrics(image)
    assert [(p.file, p.line) for p in after.problems] == [("metrics.jsonl", 2)]  # the torn line alone
    assert len(series(after, M.RL_LOSS, PG_LOSS)) == 6


def test_a_live_run_folder_is_left_alone(make_telemetry, capsys) -> None:
    tel = make_telemetry(framework="roll", metric_export_interval_s=3600)
    tel.log(step_values(1), step=1)
    run = Path(tel.config.run_dir)
    wait_for_events(run, 1)
    assert main(["recover", str(run)]) == 1
    out = capsys.readouterr().out
    assert "left alone" in out and "still writing rank 0" in out
    assert not (run / "metrics.jsonl").exists() or not read_metrics(run)


def test_before_takes_only_what_was_written_before_it_while_a_live_process_writes_the_folder(make_telemetry, capsys) -> None:
    # What a process that found its predecessor killed starts: the folder is live (this telemetry
    # holds it), and what was written after the cut (events, and an export whose time would hide
    # the events before it) belongs to the live process, not to the one being recovered.
    tel = make_telemetry(framework="roll", metric_export_interval_s=3600)
    run = Path(tel.config.run_dir)
    for step in range(1, 6):
        tel.log(step_values(step), step=step)
    tel.flush()  # the last export before the cut
    for step in range(6, 11):
        tel.log(step_values(step), step=step)
    wait_for_events(run, 10)
    cut = time.time_ns()
    for step in range(11, 13):
        tel.log(step_values(step), step=step)
    tel.flush()  # an export after the cut, of the same resource
    assert main(["recover", str(run), "--before", str(cut), "--rank", "0", "--resolution", "0"]) == 0
    assert "steps 6-10" in capsys.readouterr().out
    loss = series(read_metrics(run), M.RL_LOSS, PG_LOSS)
    rebuilt = [p for p in loss if p.time_ns < cut][1:]  # after the export following step 5
    assert [p.value for p in rebuilt] == [0.5 / s for s in range(6, 11)]
    assert [p.value for p in loss if p.time_ns >= cut] == [0.5 / 12]  # the live export alone
    assert main(["recover", str(run), "--rank", "1", "--before", str(cut)]) == 1  # no rank 1 here
    assert "nothing to recover from" in capsys.readouterr().out


def test_a_second_recover_of_a_rank_leaves_it_to_the_first(crashed, capsys) -> None:
    # Two processes resuming one folder in turn may start two recoveries of a rank at once: the
    # second would append the same points again, so it stands aside while the first holds the rank.
    image, _ = crashed
    with open(image / ".recover.rank0", "a") as held:
        fcntl = pytest.importorskip("fcntl")
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running recover holds it
        assert main(["recover", str(image)]) == 1
        assert "another otel-rl recover is rebuilding rank 0" in capsys.readouterr().out
        assert len(series(read_metrics(image), M.RL_LOSS, PG_LOSS)) == 1  # nothing written
    assert main(["recover", str(image), "--resolution", "0"]) == 0  # freed: the next one does it
    assert len(series(read_metrics(image), M.RL_LOSS, PG_LOSS)) == 6


def test_the_command_names_a_missing_folder(tmp_path: Path, capsys) -> None:
    assert main(["recover", str(tmp_path / "nope")]) == 1
    assert f"{tmp_path / 'nope'} is not a run folder" in capsys.readouterr().err


def test_large_files_are_announced_before_they_are_read(crashed, monkeypatch) -> None:
    import otel_rl.runs.recover as recover_module

    image, _ = crashed
    monkeypatch.setattr(recover_module, "LARGE_BYTES", 0)
    said: list[str] = []
    recover(image, say=said.append)
    assert said[0].startswith("reading logs.jsonl and metrics.jsonl (") and said[1].startswith("metrics.jsonl: wrote")
