"""``otel-rl demo --log-samples K`` keeps K rollout samples of the reverse-digits task per step, and
``otel-rl show RUN --step N --samples`` prints them; both through ``otel_rl.cli.main``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import otel_rl  # noqa: E402
from otel_rl.cli import main  # noqa: E402
from otel_rl.demo._task import VOCAB, score_response  # noqa: E402
from otel_rl.runs.samples import read_samples  # noqa: E402


@pytest.fixture
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "run"
    try:
        assert main(["demo", "--steps", "2", "--log-samples", "3", "--out", str(out), "--quiet"]) == 0
    finally:
        otel_rl.shutdown()
    return out


def digits(text: str) -> list[int]:
    return [int(c) for c in text if c.isdigit()]


def tokens(text: str) -> list[int]:
    """The token ids of a decoded text (the demo's vocabulary: <bos>, <eos>, =, +, -, digits)."""
    ids = []
    while text:
        token = next(t for t in VOCAB if t and text.startswith(t))
        ids.append(VOCAB.index(token))
        text = text[len(token) :]
    return ids


def test_demo_logs_k_samples_per_step_with_the_task_reward(demo_run: Path) -> None:
    rows = read_samples(demo_run)
    assert [(r["step"]) for r in rows] == [1, 1, 1, 2, 2, 2]
    for row in rows:
        assert row["prompt"].startswith("<bos>") and row["prompt"].endswith("=")
        assert set(row) >= {"response", "reward", "rewards/accuracy", "rewards/format", "advantage", "response_length", "truncated"}
        # the task's own rule reward, recomputed from the logged text
        parts = score_response(digits(row["prompt"]), tokens(row["response"]))
        assert row["reward"] == pytest.approx(parts.score)
        assert row["rewards/accuracy"] == pytest.approx(parts.accuracy)
        assert row["rewards/format"] == float(parts.format_ok) == float(not row["truncated"])
        assert row["group_id"] == str(row["index"] // 8)


def test_show_prints_a_steps_samples(demo_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(demo_run), "--step", "2", "--samples"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 2: 3 rollout samples\n")
    for row in read_samples(demo_run, 2):
        assert f"#{row['index']}  group {row['group_id']}  reward " in out
        assert f"  prompt: {row['prompt']}\n" in out and f"  response: {row['response']}" in out

    assert main(["show", str(demo_run), "--step", "99", "--samples"]) == 1
    err = capsys.readouterr().err
    assert "no rollout samples of step 99" in err and "steps with samples: 1, 2" in err


def test_show_without_samples_says_how_to_get_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tel = otel_rl.Telemetry(otel_rl.TelemetryConfig(run_dir=str(tmp_path), console=False))
    tel.log_samples([{"prompt": "p"}], step=1)  # off: nothing kept
    tel.shutdown()
    assert main(["show", str(tmp_path), "--step", "1", "--samples"]) == 1
    assert "OTEL_RL_LOG_SAMPLES" in capsys.readouterr().err
