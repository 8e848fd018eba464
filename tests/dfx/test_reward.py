"""Reward stage: guarded rule rewards count their exceptions; batch latency, tokens, throughput."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dfx_support import histogram, latest  # noqa: E402

from otel_rl import dfx  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402


def math_accuracy(answer: str, target: str) -> float:
    return float(int(answer) == int(target))  # raises on unparsable answers


def test_guarded_rule_reward_counts_exceptions_by_function_and_scores_the_default(stats, tel, caplog):
    guarded = dfx.guard_reward(stats, math_accuracy, default=0.0)
    format_ok = dfx.guard_reward(stats, lambda text: float(text.startswith("<think>")), default=0.0, name="Format")
    assert latest(tel, M.RL_REWARD_EXCEPTIONS, {A.RL_REWARD_FUNCTION: "math_accuracy"}) == 0.0  # series from the start
    scores = [guarded(a, "4") for a in ("4", "four", "5", "", "4")]
    assert scores == [1.0, 0.0, 0.0, 0.0, 1.0] and guarded.exceptions == 2
    assert format_ok("<think>x") == 1.0
    assert latest(tel, M.RL_REWARD_EXCEPTIONS, {A.RL_REWARD_FUNCTION: "math_accuracy"}) == 2.0
    assert latest(tel, M.RL_REWARD_EXCEPTIONS, {A.RL_REWARD_FUNCTION: "Format"}) == 0.0
    assert len([r for r in caplog.records if "math_accuracy" in r.getMessage()]) == 1  # one ValueError type, logged once


def test_reward_batch_latency_tokens_and_throughput(stats, tel):
    mask = torch.ones(8, 128, dtype=torch.long)  # 1024 tokens scored
    dfx.reward_batch(stats, seconds=0.5, tokens=mask.sum())
    stats.flush()
    assert histogram(tel, M.RL_REWARD_DURATION) == (1, 0.5)
    assert latest(tel, M.RL_REWARD_BATCH_TOKENS) == 1024.0
    assert latest(tel, M.RL_REWARD_THROUGHPUT) == 2048.0
