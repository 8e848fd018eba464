"""Hostile input never costs a file: deep nesting, FIFOs and devices, huge lines, regex-quadratic lines."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from otel_rl.replay import FormatError, parse_file
from otel_rl.replay._formats import format_scores
from otel_rl.runs.folder import read_log_records
from otel_rl.runs.textfile import bounded_lines, read_bounded

DEEP = "[" * 100_000  # json.loads raises RecursionError on it


def _swift(step: int) -> str:
    return json.dumps({"loss": 0.5, "global_step/max_steps": f"{step}/3", "elapsed_time": f"{step}s"})


@pytest.mark.parametrize(
    ("fmt", "lines"),
    [
        ("swift", [_swift(1), DEEP, _swift(2), "{" + '"a":' * 1 + DEEP, _swift(3)]),
        (
            "verl-jsonl",
            [json.dumps({"step": s, "data": {"actor/pg_loss": 0.1}}) for s in (1, 2)][:1]
            + [DEEP]
            + [json.dumps({"step": s, "data": {"actor/pg_loss": 0.1}}) for s in (2, 3)],
        ),
        (
            "roll-stdout",
            [
                'metrics_tag: {"step": 1, "metrics": {"a": 1}}',
                "metrics_tag: " + DEEP,
                'metrics_tag: {"step": 2, "metrics": {"a": 1}}',
                'metrics_tag: {"step": 3, "metrics": {"a": 1}}',
            ],
        ),
    ],
)
def test_deep_nesting_skips_the_line(tmp_path: Path, fmt: str, lines: list[str]) -> None:
    path = tmp_path / "log.txt"
    path.write_text("\n".join(lines) + "\n")
    parsed = parse_file(path, fmt)
    assert [r.step for r in parsed.records] == [1, 2, 3]
    assert any("nested too deeply" in p.reason for p in parsed.problems)
    format_scores(path.read_text())  # detection reads the same lines: no RecursionError either


def test_deep_nesting_in_trainer_state(tmp_path: Path) -> None:
    entries = [json.dumps({"step": 1, "loss": 1.0}), DEEP, json.dumps({"step": 2, "loss": 0.5})]
    path = tmp_path / "trainer_state.json"
    path.write_text('{"max_steps": 2, "log_history": [\n  ' + ",\n  ".join(entries) + "\n]}\n")
    parsed = parse_file(path, "trl-state")
    assert any("nested too deeply" in p.reason for p in parsed.problems)
    assert parsed.problems[0].line >= 1


def test_deep_nesting_in_run_folder(tmp_path: Path) -> None:
    good = json.dumps({"resourceLogs": []})
    (tmp_path / "logs.jsonl").write_text(good + "\n" + DEEP + "\n" + good + "\n")
    records = read_log_records(tmp_path)
    assert [(p.line, "nested too deeply" in p.reason) for p in records.problems] == [(2, True)]


def _finishes(fn: Any, seconds: float = 20.0) -> list[Any]:
    """Run ``fn`` in a daemon thread (a FIFO open would block it for ever): [result or exception]."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"{fn} did not finish in {seconds} s"
    return box


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    for fmt in ("auto", "swift"):
        (error,) = _finishes(lambda fmt=fmt: parse_file(fifo, fmt))
        assert isinstance(error, FormatError)
        assert str(fifo) in str(error) and "FIFO" in str(error) and "regular file is needed" in str(error)
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "logs.jsonl")
    (records,) = _finishes(lambda: read_log_records(run))
    assert "regular file is needed" in records.problems[0].reason


def test_dev_zero_is_refused_with_bounded_memory() -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    code = "from otel_rl.replay import parse_file\nparse_file('/dev/zero', 'swift')"

    def limit() -> None:  # a regression must fail the test, not fill the machine
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=limit)
    assert proc.returncode != 0
    assert "/dev/zero is a character device: a regular file is needed" in proc.stderr


@pytest.mark.parametrize("limit", [1, 7, 10, 64, 1000])
def test_read_bounded_against_a_plain_split(tmp_path: Path, limit: int) -> None:
    lines = [b"a" * n + b"\n" for n in (0, 3, 9, 10, 11, 30, 5, 200, 2)] + [b"tail" * 5]
    path = tmp_path / "f"
    path.write_bytes(b"".join(lines))
    text, skipped = read_bounded(path, limit)
    assert text == b"".join(line if len(line) <= limit else b"\n" for line in lines[:-1]) + (lines[-1] if len(lines[-1]) <= limit else b"")
    assert skipped == [(i, len(line)) for i, line in enumerate(lines, start=1) if len(line) > limit]
    with open(path, "rb") as f:
        got = [(n, length) for n, line, length in bounded_lines(f, limit) if line is None]
    assert got == skipped


def test_a_line_past_16_mib_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "logging.jsonl"
    with open(path, "w") as f:
        f.write(_swift(1) + "\n")
        f.write('{"loss": "' + "x" * (17 << 20) + '"}\n')
        f.write(_swift(2) + "\n")
    parsed = parse_file(path, "swift")
    assert [r.step for r in parsed.records] == [1, 2]
    assert [p.line for p in parsed.problems] == [2] and "byte limit" in parsed.problems[0].reason


@pytest.mark.parametrize(
    "line",
    [
        "{'a" * 350_000,  # the dict regex retried ".*" from every "{'": quadratic
        "{'loss" * 170_000 + "}",
        "1" * 1_000_000 + "x%|",  # tqdm's "\d+%" from every digit
        "Total batch size " * 60_000 + "= x",  # the header's unbounded label
    ],
)
def test_adversarial_hf_console_line_is_linear(tmp_path: Path, line: str) -> None:
    path = tmp_path / "train.log"
    path.write_text("{'loss': 1.0, 'epoch': 0.1}\n" + line + "\n{'loss': 2.0, 'epoch': 0.2}\n")
    start = time.process_time()
    parsed = parse_file(path, "hf-console")
    format_scores(path.read_text())
    assert time.process_time() - start < 2.0  # generous: linear code takes ~0.1 s on 1 MB
    assert len(parsed.records) == 2
