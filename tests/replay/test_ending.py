"""How the run ended, read from a log's own lines (otel_rl/replay/_ending.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_rl.replay import ParsedLog, StepRecord, parse_file
from otel_rl.replay._ending import read_ending


def _verl(steps: int, tail: str = "", head: str = "") -> str:
    lines = [head] if head else []
    for step in range(1, steps + 1):
        lines.append(f"step:{step} - actor/grad_norm:0.5 - critic/score/mean:{0.1 * step:.2f} - actor/entropy:0.3")
        lines.append(f"Training Progress: {100 * step // steps}%|#####| {step}/{steps} [00:{step:02d}<00:00, 1.0s/it]")
    return "\n".join(lines) + "\n" + tail


def _ending(tmp_path: Path, text: str):
    path = tmp_path / "console.log"
    path.write_text(text, encoding="utf-8")
    return parse_file(path).ending


def test_a_traceback_after_the_last_step_is_a_crash_named_by_its_cause(tmp_path: Path) -> None:
    tail = (
        "Error executing job with overrides: ['trainer.save_freq=350']\n"
        "Traceback (most recent call last):\n"
        '  File "main_ppo.py", line 40, in main\n'
        "    run_ppo(config)\n"
        "ray.exceptions.RayTaskError(RuntimeError): ray::TaskRunner.run() (pid=46086)\n"
        "RuntimeError: [enforce fail at inline_container.cc:815] . PytorchStreamWriter failed writing file data/721: file write failed\n"
    )
    ending = _ending(tmp_path, _verl(12, tail))
    assert ending.status == "crashed" and ending.step == 12
    assert ending.cause == "write failed"  # the named cause, not Ray's or Hydra's wrapper
    assert "PytorchStreamWriter" in ending.evidence
    assert "crashed after step 12" in ending.text


@pytest.mark.parametrize(
    "line, cause",
    [
        ("OSError: [Errno 28] No space left on device", "disk full"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "GPU out of memory"),
        ("[rank0]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)", "NCCL timeout"),
        ("Killed", "process killed"),
    ],
)
def test_fatal_lines_without_a_traceback_name_their_cause(tmp_path: Path, line: str, cause: str) -> None:
    ending = _ending(tmp_path, _verl(9, line + "\n"))
    assert (ending.status, ending.cause, ending.step) == ("crashed", cause, 9)


def test_an_error_the_run_lived_through_before_is_not_its_end(tmp_path: Path) -> None:
    # A worker's caught exception, printed between steps and again after the last one: the run went
    # on after the first, so the second is not why the log ends.
    error = (
        "(CursorLoopWorker pid=7) Traceback (most recent call last):\n"
        '(CursorLoopWorker pid=7)   File "loop.py", line 9, in run\n'
        "(CursorLoopWorker pid=7) ValueError: step 0 - extract action failed\n"
    )
    text = _verl(4) + error + _verl(8).split("\n", 8)[8] + error
    ending = _ending(tmp_path, text)
    assert ending.status != "crashed"
    assert ending.survived and "ValueError" in ending.survived[0][1]


def test_a_bar_at_its_total_is_a_finish_and_a_rounded_100_percent_is_not(tmp_path: Path) -> None:
    assert _ending(tmp_path, _verl(10)).status == "finished"
    # tqdm prints 100% at 699/700: the bar is not at its total, and what follows is the run's end.
    text = _verl(3) + "Training Progress: 100%|#####| 699/700 [7:22:37<00:37]\nOSError: No space left on device\n"
    assert _ending(tmp_path, text).status == "crashed"


def test_a_shutdown_error_after_the_end_of_training_is_not_a_crash(tmp_path: Path) -> None:
    text = _verl(5) + "Final validation metrics: {'val/score': 0.5}\nTraceback (most recent call last):\nBrokenPipeError: wandb\n"
    ending = _ending(tmp_path, text)
    assert ending.status == "finished"
    assert any("after the end of training" in why for _, why in ending.survived)


def test_a_log_that_stops_short_of_its_planned_total_says_so() -> None:
    text = _verl(6).replace("/6 [", "/300 [")  # the bar counts towards the planned 300
    out = ParsedLog(
        path=Path("x.log"),
        format="verl-console",
        framework="verl",
        records=[StepRecord(step, {}, 2 * step - 1) for step in range(1, 7)],
        settings={"max_steps": 300},
    )
    ending = read_ending(text, out)
    assert (ending.status, ending.step, ending.planned) == ("stopped", 6, 300)
    assert read_ending(_verl(6), out).status == "finished"  # the bar at its total


def test_a_log_of_many_blocks_keeps_its_line_numbers_and_the_errors_between_steps(tmp_path: Path) -> None:
    # Over 3 MB: the blocks with no cue are skipped with one search each. An error survived in the
    # middle (line numbers counted as splitlines() counts them: \r and \x0c break lines too), a
    # traceback that ends in the next block, and the crash after the last step.
    middle = "\r".join(["progress"] * 5) + "\x0cOSError: [Errno 28] No space left on device\n"
    traceback = "Traceback (most recent call last):\n" + '  File "x.py", line 1\n' * 60_000 + "KeyError: 'actor'\n"
    steps = _verl(16_000)
    cut = steps.index("step:8001 ")
    text = steps[:cut] + middle + traceback + steps[cut:] + "Killed\n"
    assert len(text) > 3 * (1 << 20)
    ending = _ending(tmp_path, text)
    assert (ending.status, ending.cause) == ("crashed", "process killed")
    lines = text.splitlines()
    assert ending.line == len(lines)
    disk = next(line for line, evidence in ending.survived if "No space left" in evidence)
    assert "No space left" in lines[disk - 1] and lines[disk - 6] == "progress"
    key_error = next(line for line, evidence in ending.survived if evidence.startswith("KeyError"))
    assert lines[key_error - 1] == "KeyError: 'actor'"
