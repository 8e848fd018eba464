"""A script run twice with one ``run_dir``: both runs land in the folder's files, and every reader
takes one run at a time (the latest by default, ``--run-id`` for another), never a row of two."""

from __future__ import annotations

import csv
import io
import logging
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import otel_rl
from otel_rl import cli
from otel_rl.runs.steps import read_step_rows, read_step_seconds


def one_run(run_dir: Path, run_id: str, score: float, steps: int = 3) -> None:
    tel = otel_rl.init(run_dir=str(run_dir), run_id=run_id, console=False, exporters="file")
    try:
        for step in range(steps):
            with tel.step(step):
                with tel.stage("generate"):
                    pass
                tel.log({"critic/score/mean": score + step}, step=step)
    finally:
        tel.shutdown()


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def shared_folder(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Path:
    run_dir = tmp_path / "run"
    one_run(run_dir, "first", 10.0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        one_run(run_dir, "second", 20.0, steps=2)
    told = [r.getMessage() for r in caplog.records if "already holds run first" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
    assert "this run (second)" in told[0] and "--run-id first" in told[0]
    return run_dir


def test_readers_take_the_latest_run_and_name_the_other(shared_folder: Path) -> None:
    rows = read_step_rows(shared_folder)
    assert [(r.step, r.values["critic/score/mean"]) for r in rows] == [(0, 20.0), (1, 21.0)]
    assert rows.run.run_id == "second" and rows.run.others == ("first",)
    assert set(read_step_seconds(shared_folder, rows.run)) == {(0, 0), (1, 0)}
    earlier = read_step_rows(shared_folder, "first")
    assert [(r.step, r.values["critic/score/mean"]) for r in earlier] == [(0, 10.0), (1, 11.0), (2, 12.0)]
    # a row's time is its own run's: the second run's steps start after the first run ended
    assert min(r.time_ns for r in rows) > max(r.time_ns for r in earlier)
    with pytest.raises(LookupError, match="runs there: first, second"):
        read_step_rows(shared_folder, "third")


def test_export_and_show_never_mix_two_runs(shared_folder: Path) -> None:
    rc, out, err = run_cli("export", str(shared_folder))
    assert rc == 0, err
    table = list(csv.DictReader(io.StringIO(out)))
    assert [(row["step"], row["critic/score/mean"]) for row in table] == [("0", "20.0"), ("1", "21.0")]
    assert "reading second; the other(s): first (--run-id ID reads one" in err
    rc, out, err = run_cli("export", str(shared_folder), "--run-id", "first")
    assert rc == 0 and [row["critic/score/mean"] for row in csv.DictReader(io.StringIO(out))] == ["10.0", "11.0", "12.0"]
    rc, out, err = run_cli("show", str(shared_folder))
    assert rc == 0 and out.startswith("2 steps (0-1)"), (out, err)
    rc, out, err = run_cli("show", str(shared_folder), "--step", "2")
    assert rc == 1 and "step 2" in err  # step 2 is the first run's only
    rc, out, err = run_cli("show", str(shared_folder), "--step", "2", "--run-id", "first")
    assert rc == 0 and "rl.step" in out, err
    rc, out, err = run_cli("trace", str(shared_folder), "--step", "1", "--run-id", "nope")
    assert rc == 2 and "no run 'nope'" in err and "first, second" in err


def test_the_same_run_resumed_in_its_folder_is_one_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    one_run(run_dir, "same", 1.0, steps=2)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        one_run(run_dir, "same", 1.0, steps=2)
    assert not [r for r in caplog.records if "already holds run" in r.getMessage()]
    rows = read_step_rows(run_dir)
    assert rows.run.others == () and len(rows) == 2


def _ranks_at_once(run_dir: Path, run_ids: tuple[str | None, str | None]) -> None:
    """Two processes' telemetry writing one folder at the same time, rank 0 and rank 1, step by step."""
    tels = [
        otel_rl.Telemetry(
            otel_rl.resolve_config(
                dict(run_dir=str(run_dir), run_id=run_id, rank=rank, world_size=2, console=False, exporters="file", service_name="ranks")
            )
        )
        for rank, run_id in enumerate(run_ids)
    ]
    try:
        for step in range(3):
            for rank, tel in enumerate(tels):
                tel.log({"critic/score/mean": 10.0 * (rank + 1) + step}, step=step)
    finally:
        for tel in tels:
            tel.shutdown()


def test_two_named_runs_writing_one_folder_at_once_are_never_read_as_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _ranks_at_once(run_dir, ("run-X", "run-Y"))
    rows = read_step_rows(run_dir)
    assert rows.run.run_id == "run-X" and rows.run.others == ("run-Y",)
    assert [(r.step, r.rank, r.values["critic/score/mean"]) for r in rows] == [(0, 0, 10.0), (1, 0, 11.0), (2, 0, 12.0)]
    assert "at the same time" in rows.run.note and "run-Y" in rows.run.note
    other = read_step_rows(run_dir, "run-Y")
    assert [(r.step, r.values["critic/score/mean"]) for r in other] == [(0, 20.0), (1, 21.0), (2, 22.0)]
    for command in ("export", "show"):
        rc, out, err = run_cli(command, str(run_dir))
        assert rc == 0 and "run-Y" in err and "at the same time" in err, (command, err)
        assert "rank" not in out.splitlines()[0 if command == "export" else 1], (command, out)  # one rank's rows: no rank column
    exported = list(csv.DictReader(io.StringIO(run_cli("export", str(run_dir))[1])))
    assert [float(r["critic/score/mean"]) for r in exported] == [10.0, 11.0, 12.0]


def test_one_jobs_ranks_with_generated_ids_are_read_together_and_said_so(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _ranks_at_once(run_dir, (None, None))
    rows = read_step_rows(run_dir)
    assert sorted({r.rank for r in rows}) == [0, 1] and len(rows) == 6
    assert "different generated run ids" in rows.run.note and "OTEL_RL_RUN_ID" in rows.run.note
