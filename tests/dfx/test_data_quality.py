"""Data quality: length distributions and statistics, clip and abort ratios, reward distribution."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dfx_support import histogram, latest  # noqa: E402

from otel_rl import dfx  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402


def stat(tel, metric, name):
    return latest(tel, metric, {A.RL_STATISTIC: name})


def test_lengths_histograms_statistics_and_clip_ratio_from_the_limit(stats, tel):
    prompts = torch.tensor([10, 20, 30, 40])
    responses = torch.tensor([[1] * 5 + [0] * 3, [1] * 8, [1] * 2 + [0] * 6, [1] * 8]).sum(-1)  # 5, 8, 2, 8
    dfx.lengths(stats, prompt_lengths=prompts, response_lengths=responses, max_response_length=8)
    stats.flush()
    assert histogram(tel, M.RL_SAMPLE_PROMPT_LENGTH) == (4, 100.0)
    assert histogram(tel, M.RL_SAMPLE_RESPONSE_LENGTH) == (4, 23.0)
    assert [stat(tel, M.RL_PROMPT_LENGTH, s) for s in ("mean", "max", "min")] == [25.0, 40.0, 10.0]
    assert [stat(tel, M.RL_RESPONSE_LENGTH, s) for s in ("mean", "max", "min")] == [5.75, 8.0, 2.0]
    assert latest(tel, M.RL_RESPONSE_CLIPPED_RATIO) == 0.5  # two of four hit the limit of 8


def test_clip_ratio_from_engine_flags_wins_and_histograms_can_be_left_to_the_caller(stats, tel):
    truncated = np.array([False, True, False, False])  # e.g. finish_reason == "length"
    dfx.lengths(stats, response_lengths=[5, 8, 2, 8], truncated=truncated, max_response_length=8, histograms=False)
    stats.flush()
    assert latest(tel, M.RL_RESPONSE_CLIPPED_RATIO) == 0.25
    assert histogram(tel, M.RL_SAMPLE_RESPONSE_LENGTH) is None
    assert stat(tel, M.RL_RESPONSE_LENGTH, "mean") == 5.75


def test_aborted_ratio(stats, tel):
    dfx.aborted_ratio(stats, torch.tensor([0, 1, 0, 0, 0, 0, 0, 1]))
    stats.flush()
    assert latest(tel, M.RL_ROLLOUT_ABORT_RATIO) == 0.25


def test_reward_distribution(stats, tel):
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, -2.0])
    dfx.reward_distribution(stats, rewards)
    stats.flush()
    assert histogram(tel, M.RL_SAMPLE_REWARD) == (5, 1.0)
    values = [stat(tel, M.RL_REWARD, s) for s in ("mean", "max", "min", "std")]
    assert values == pytest.approx([0.2, 1.0, -2.0, np.std([0.0, 1, 1, 1, -2])])
