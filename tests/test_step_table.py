"""Reading a run folder without writing code: ``otel-rl show RUN`` prints a per-step table of the
headline values, ``otel-rl export RUN`` writes one row per step with every logged key. Each test
writes a real run folder through otel-rl (``otel_rl.testing.capture``) and reads it back through
the command line entry point."""

from __future__ import annotations

import csv
import datetime as dt
import io
import sys
from pathlib import Path

import pytest

from otel_rl.cli import main
from otel_rl.runs.folder import read_log_records
from otel_rl.semconv import names as N
from otel_rl.testing import capture

# verl keys (semconv/mappings/verl.yaml): score mean, policy loss, old-policy KL, entropy, response length
STEPS = {
    1: {"critic/score/mean": 0.25, "actor/pg_loss": -0.5, "actor/ppo_kl": 0.125, "actor/entropy": 2.5, "response_length/mean": 101},
    2: {"critic/score/mean": 0.5, "actor/pg_loss": -0.25, "actor/ppo_kl": 0.0625, "actor/entropy": 2.0, "response_length/mean": 202},
    3: {"critic/score/mean": 0.75, "actor/pg_loss": 0.1, "actor/ppo_kl": 0.03, "actor/entropy": 1.5, "response_length/mean": 303},
}


def _write_run(folder: Path, steps: dict[int, dict[str, object]], **options: object) -> None:
    with capture(folder, framework="verl", **options) as cap:
        for step, values in steps.items():
            with cap.telemetry.step(step):
                cap.telemetry.log({**values, "trainer/note": f"s{step}"}, step=step)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _event_times(folder: Path) -> dict[int, int]:
    return {r["attributes"]["rl.step"]: r["timestamp"] for r in read_log_records(folder) if r["event_name"] == N.RL_LOG_EVENT}


def _iso(time_ns: int) -> str:
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


def _table(out: str) -> list[list[str]]:
    """The whitespace-split lines of the table printed by ``show`` (header first)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["step"])
    return [line.split() for line in lines[start:] if line.strip() and not line.startswith("every logged key")]


def test_show_without_step_prints_one_row_per_step_of_headline_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _write_run(run, STEPS)
    code, out, err = _run(["show", str(run)], capsys)
    assert code == 0, err
    table = _table(out)
    # the console summary's labels; columns no step has (reward, kl, loss, ...) are left out
    assert table[0] == ["step", "seconds", "score", "kl_old", "entropy", "loss_policy", "resp_len"]
    rows = {int(r[0]): r for r in table[1:]}
    assert sorted(rows) == [1, 2, 3]
    for step, values in STEPS.items():
        row = rows[step]
        assert float(row[1]) > 0  # the step span's wall time
        assert [float(x) for x in row[2:]] == pytest.approx(
            [
                values["critic/score/mean"],
                values["actor/ppo_kl"],
                values["actor/entropy"],
                values["actor/pg_loss"],
                values["response_length/mean"],
            ],
            rel=1e-3,
        )
    assert "trainer/note" not in out  # not a headline value; export has it


def test_show_long_run_shows_first_and_last_rows_and_all_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _write_run(run, {s: {"critic/score/mean": s / 100} for s in range(1, 31)})
    code, out, _ = _run(["show", str(run), "--rows", "6"], capsys)
    assert code == 0
    table = _table(out)
    assert [r[0] for r in table[1:]] == ["1", "2", "3", "...", "28", "29", "30"]
    assert "... 24 steps ..." in out
    code, out, _ = _run(["show", str(run), "--all"], capsys)
    assert [int(r[0]) for r in _table(out)[1:]] == list(range(1, 31))
    assert "steps ..." not in out


def test_show_keeps_the_step_waterfall_and_samples_need_a_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _write_run(run, STEPS)
    code, out, _ = _run(["show", str(run), "--step", "2"], capsys)
    assert code == 0 and "rl.step" in out and "score" not in out.splitlines()[0]
    code, _, err = _run(["show", str(run), "--samples"], capsys)
    assert code == 2 and "--samples needs --step" in err


def test_export_csv_writes_every_logged_key_per_step_as_logged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _write_run(run, STEPS)
    out_file = tmp_path / "steps.csv"
    code, _, err = _run(["export", str(run), "--format", "csv", "--out", str(out_file)], capsys)
    assert code == 0, err
    assert "wrote 3 rows" in err
    with open(out_file, newline="") as f:
        rows = list(csv.DictReader(f))
    keys = ["critic/score/mean", "actor/pg_loss", "actor/ppo_kl", "actor/entropy", "response_length/mean", "trainer/note"]
    assert list(rows[0]) == ["step", "time", *keys]
    times = _event_times(run)
    for row, (step, values) in zip(rows, STEPS.items()):
        assert row["step"] == str(step)
        assert row["time"] == _iso(times[step])
        assert {k: row[k] for k in keys} == {**{k: str(v) for k, v in values.items()}, "trainer/note": f"s{step}"}
    # standard output by default: the same table
    code, out, _ = _run(["export", str(run)], capsys)
    assert code == 0 and out == out_file.read_text()


def test_export_adds_a_rank_column_for_per_rank_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _write_run(run, {1: {"critic/score/mean": 0.5}, 2: {"critic/score/mean": 0.75}})
    _write_run(run, {1: {"critic/score/mean": 1.5}, 2: {"critic/score/mean": 1.75}}, rank=3)
    assert (run / "logs.rank3.jsonl").is_file()
    code, out, err = _run(["export", str(run)], capsys)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0])[:3] == ["step", "time", "rank"]
    got = [(r["step"], r["rank"], r["critic/score/mean"]) for r in rows]
    assert got == [("1", "0", "0.5"), ("1", "3", "1.5"), ("2", "0", "0.75"), ("2", "3", "1.75")]
    code, out, _ = _run(["show", str(run)], capsys)
    assert _table(out)[0][:2] == ["step", "rank"]


def test_export_of_a_folder_with_a_torn_last_line_keeps_the_whole_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _write_run(run, STEPS)
    with open(run / "logs.jsonl", "a") as f:
        f.write('{"resourceLogs":[{"resource":{"attributes":[')  # a crash mid-write
    code, out, err = _run(["export", str(run)], capsys)
    assert code == 0
    assert "skipped 1 malformed line" in err and "logs.jsonl:" in err
    assert [r["step"] for r in csv.DictReader(io.StringIO(out))] == ["1", "2", "3"]
    code, out, err = _run(["show", str(run)], capsys)
    assert code == 0 and "skipped 1 malformed line" in err
    assert [r[0] for r in _table(out)[1:]] == ["1", "2", "3"]


def test_export_parquet_round_trips_the_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    run = tmp_path / "run"
    _write_run(run, STEPS)
    out_file = tmp_path / "steps.parquet"
    code, _, err = _run(["export", str(run), "--format", "parquet", "--out", str(out_file)], capsys)
    assert code == 0, err
    table = pq.read_table(out_file)
    assert table.column_names[:2] == ["step", "time"]
    rows = table.to_pylist()
    times = _event_times(run)
    for row, (step, values) in zip(rows, STEPS.items()):
        assert row["step"] == step
        assert table.column("time").cast("int64").to_pylist()[step - 1] == times[step]
        assert {k: row[k] for k in values} == values
        assert row["trainer/note"] == f"s{step}"
    assert str(table.schema.field("response_length/mean").type) == "int64"


def test_export_parquet_without_pyarrow_names_the_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    _write_run(run, STEPS)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # what a Python without pyarrow does: ImportError on import
    code, _, err = _run(["export", str(run), "--format", "parquet", "--out", str(tmp_path / "x.parquet")], capsys)
    assert code == 2
    assert "pip install pyarrow" in err
    assert not (tmp_path / "x.parquet").exists()
