"""``--out`` never writes over a run folder's own files, and a path a command cannot use (a missing
folder, a folder, a file where a folder is wanted, /dev/full) is one line on stderr and exit status 2,
not a traceback, a silent overwrite or "wrote 5 rows" over the run's events."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import otel_rl
from otel_rl import cli


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    tel = otel_rl.init(run_dir=str(tmp_path / "run"), service_name="out-paths", console=False)
    for step in range(1, 4):
        with tel.step(step):
            with tel.stage("generate"):
                pass
            tel.log({"actor/entropy": 0.5, "critic/score/mean": step / 3})
    tel.shutdown()
    return tmp_path / "run"


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _cases(run: Path, tmp: Path) -> list[tuple[list[str], str]]:
    full = ["/dev/full"] if os.path.exists("/dev/full") else []
    cases = [
        (["export", str(run), "--out", str(run / "logs.jsonl")], "a file the command reads"),
        (["export", str(run / "logs.jsonl"), "--out", str(run / "logs.jsonl")], "a file the command reads"),
        (["export", str(run), "--out", str(tmp / "missing" / "x.csv")], "does not exist"),
        (["export", str(run), "--out", str(tmp)], "is a folder"),
        (["trace", str(run), "--step", "2", "--out", str(run / "traces.jsonl")], "a file the command reads"),
        (["trace", str(run), "--step", "2", "--format", "chrome", "--out", str(tmp / "missing" / "x.json")], "does not exist"),
        (["analyze", str(run), "--no-plots", "-q", "--out", str(run / "run.json")], "is a file, not a folder"),
        (["analyze", str(run), "--no-plots", "-q", "--out", str(run / "metrics.jsonl")], "is a file, not a folder"),
    ]
    for path in full:
        cases += [
            (["export", str(run), "--out", path], "No space left on device"),
            (["trace", str(run), "--step", "2", "--out", path], "No space left on device"),
            (["trace", str(run), "--step", "2", "--format", "chrome", "--out", path], "No space left on device"),
        ]
    return cases


def test_every_bad_out_is_one_line_and_status_2_and_the_run_is_untouched(run_dir: Path, tmp_path: Path, capsys) -> None:
    before = _digest(run_dir)
    for argv, said in _cases(run_dir, tmp_path):
        rc = cli.main(argv)
        _, err = capsys.readouterr()
        lines = [line for line in err.splitlines() if line.startswith("otel-rl")]
        assert rc == 2, (argv, err)
        assert "Traceback" not in err and said in lines[-1], (argv, err)
    assert _digest(run_dir) == before, "a run file was written"
    # and the run still reads: every step's values
    assert cli.main(["export", str(run_dir), "--out", str(tmp_path / "steps.csv")]) == 0
    assert len((tmp_path / "steps.csv").read_text().splitlines()) == 4


def test_a_new_file_inside_the_run_folder_is_fine(run_dir: Path, capsys) -> None:
    assert cli.main(["export", str(run_dir), "--out", str(run_dir / "steps.csv")]) == 0
    assert cli.main(["export", str(run_dir), "--out", str(run_dir / "steps.csv")]) == 0  # its own export, again
