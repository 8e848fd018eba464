"""Data quality: length distributions, clip and abort ratios, rewards.

Whole per-sample arrays go into the registry histograms (so percentiles and the mass at the
generation limit are visible); their mean / max / min go into the statistic gauges. Everything
is queued on the StepStats and recorded at its flush.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import otel_rl.dfx._tensors as T
from otel_rl.dfx._collector import StepStats
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

_STAT = A.RlStatisticValues
_MEAN_MAX_MIN = (_STAT.MEAN.value, _STAT.MAX.value, _STAT.MIN.value)


def lengths(
    stats: StepStats,
    *,
    prompt_lengths: Any = None,
    response_lengths: Any = None,
    truncated: Any = None,
    max_response_length: int | None = None,
    histograms: bool = True,
) -> None:
    """Prompt and response length distributions and the clip ratio.

    prompt_lengths / response_lengths: [B] token counts -> histograms ``rl.sample.prompt_length``
    / ``rl.sample.response_length`` and gauges ``rl.prompt.length`` / ``rl.response.length``
    {mean, max, min}. The clip ratio ``rl.response.clipped_ratio`` is the share of responses cut
    at the generation limit: ``truncated`` ([B] flags from the engine, e.g. finish_reason ==
    'length') when given, else response_length >= max_response_length. ``histograms=False``
    leaves the per-sample arrays to a caller that records them itself.
    """
    if prompt_lengths is not None and T.numel(prompt_lengths):
        stats.defer(
            [T.as_vector(prompt_lengths)],
            lambda v: _distribution(stats, v[0], M.RL_SAMPLE_PROMPT_LENGTH if histograms else None, M.RL_PROMPT_LENGTH),
        )
    clip_limit = None if truncated is not None else max_response_length
    if response_lengths is not None and T.numel(response_lengths):
        stats.defer([T.as_vector(response_lengths)], lambda v: _responses(stats, v[0], clip_limit, histograms))
    if truncated is not None and T.numel(truncated):
        clipped_ratio(stats, truncated)


def _responses(stats: StepStats, values: np.ndarray, clip_limit: int | None, histograms: bool) -> None:
    _distribution(stats, values, M.RL_SAMPLE_RESPONSE_LENGTH if histograms else None, M.RL_RESPONSE_LENGTH)
    if clip_limit is not None:
        stats.record(M.RL_RESPONSE_CLIPPED_RATIO, float((values >= clip_limit).mean()))


def _distribution(stats: StepStats, values: np.ndarray, histogram: str | None, gauge: str) -> None:
    if histogram is not None:
        stats.record(histogram, values)
    for stat, value in zip(_MEAN_MAX_MIN, (values.mean(), values.max(), values.min())):
        stats.record(gauge, float(value), {A.RL_STATISTIC: stat})


def clipped_ratio(stats: StepStats, truncated: Any) -> None:
    """Share of truncated responses ([B] 0/1 flags) -> ``rl.response.clipped_ratio``."""
    size = T.numel(truncated)
    if size:
        stats.defer([T.total(truncated)], lambda v: stats.record(M.RL_RESPONSE_CLIPPED_RATIO, v[0] / size))


def aborted_ratio(stats: StepStats, aborted: Any) -> None:
    """Share of aborted samples ([B] 0/1 flags) -> ``rl.rollout.abort_ratio``.

    ``rollout.record_requests`` computes the same ratio from inference-engine outputs.
    """
    size = T.numel(aborted)
    if size:
        stats.defer([T.total(aborted)], lambda v: stats.record(M.RL_ROLLOUT_ABORT_RATIO, v[0] / size))


def reward_distribution(stats: StepStats, rewards: Any, *, histogram: bool = True, statistics: bool = True) -> None:
    """Per-sample rewards -> histogram ``rl.sample.reward`` and gauges ``rl.reward{mean, max, min,
    std}`` (std: population, over the finite rewards). ``histogram=False`` / ``statistics=False``
    skip what the caller records itself. NaN rewards are left out of the histogram by the core
    and counted in ``rl.telemetry.rejected``; count them per tensor with ``count_nonfinite``."""
    if not T.numel(rewards):
        return
    values = [T.as_vector(rewards)]
    stats.defer(values, lambda v: _rewards(stats, v[0], histogram, statistics))


def _rewards(stats: StepStats, values: np.ndarray, histogram: bool, statistics: bool) -> None:
    if histogram:
        stats.record(M.RL_SAMPLE_REWARD, values)
    finite = values[np.isfinite(values)]
    if statistics and finite.size:
        for stat, value in ((_STAT.MEAN, finite.mean()), (_STAT.MAX, finite.max()), (_STAT.MIN, finite.min()), (_STAT.STD, finite.std())):
            stats.record(M.RL_REWARD, float(value), {A.RL_STATISTIC: stat.value})
