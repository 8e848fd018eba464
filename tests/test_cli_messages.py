"""What the readers say when a folder is not what they expected: each message names what the folder
is and the command that reads it, and no hint points at a command that would fail."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import otel_rl
from otel_rl import cli


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _console_log(path: Path, records: int = 12) -> Path:
    """A Trainer console log with an epoch on every record, no step, no header, no summary."""
    lines = [
        str({"loss": 0.1, "grad_norm": 0.3, "learning_rate": 1e-6, "reward": 0.5 + i / 100, "kl": i / 1000, "epoch": round(i * 0.05, 2)})
        for i in range(1, records + 1)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_says_once_why_an_epoch_field_cannot_place_the_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _console_log(tmp_path / "console.log")
    rc, out, err = _run(capsys, "replay", str(log), "--run-dir", str(tmp_path / "replayed"))
    assert rc == 0, err
    said = out + err
    assert said.count("their epoch field (0.05 .. 0.6) counts epochs") == 1, said
    assert "no trainer header gives the total steps" in said and "no train_runtime summary" in said
    assert "neither a header, an epoch field" not in said


def test_show_on_a_replayed_folder_without_traces_offers_no_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _console_log(tmp_path / "console.log")
    folder = tmp_path / "replayed"
    assert _run(capsys, "replay", str(log), "--run-dir", str(folder))[0] == 0
    rc, out, err = _run(capsys, "show", str(folder))
    assert rc == 0, err
    assert out.startswith("12 steps (1-12); the values as the console summary names them"), out
    assert "seconds" not in out.splitlines()[1]  # no wall-time column promised or shown
    assert "--step" not in out  # no trace to show: replay of a console log builds none
    assert f"otel-rl export {folder} --format csv" in out


def test_show_on_a_folder_of_runs_lists_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "otel-rl-runs"
    for name in ("a", "b"):
        tel = otel_rl.init(run_dir=str(runs / name), console=False, exporters="file")
        with tel.step(0):
            tel.log({"critic/score/mean": 1.0}, step=0)
        tel.shutdown()
    rc, out, err = _run(capsys, "show", str(runs))
    assert rc == 1
    assert "is a folder of 2 run folder(s), not one run (a, b)" in err and f"otel-rl show {runs / 'b'}" in err


def test_show_on_a_spool_only_folder_points_to_push(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    tel = otel_rl.init(run_dir=str(folder), console=False, exporters="otlp", endpoint=f"http://127.0.0.1:{_closed_port()}")
    with tel.step(0):
        tel.log({"critic/score/mean": 1.0}, step=0)
    tel.shutdown(timeout_s=1)
    assert any((folder / "spool").rglob("*")), "nothing was spooled: the test did not make a spool-only folder"
    rc, out, err = _run(capsys, "show", str(folder))
    assert rc == 1 and f"otel-rl push {folder} delivers it" in err, err


def test_trace_without_a_run_folder_or_a_jaeger_says_no_run_was_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no otel-rl-runs/ here
    monkeypatch.setenv("OTEL_RL_STACK_PORT_OFFSET", str(_closed_port() - 16686))  # a local stack's Jaeger port with none on it
    rc, out, err = _run(capsys, "trace", "--step", "3")
    assert rc == 1
    assert "no run found" in err and "otel-rl-runs" in err, err
