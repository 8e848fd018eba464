"""Asynchronous RL: queue depth, policy lag, stale samples.

A policy version is a counter the trainer bumps at every weight sync (the rollout workers'
weights are version v after the v-th sync). Each sample carries the version that generated
it; the lag of a sample trained on at version V is V - version. Synchronous on-policy training
has lag 0 everywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import otel_rl.dfx._tensors as T
from otel_rl.dfx._collector import StepStats
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

_STAT = A.RlStatisticValues


def queue_depth(stats: StepStats, name: str, depth: float) -> None:
    """Samples waiting in an async queue (rollout buffer, replay buffer) -> ``rl.queue.depth{rl.queue.name}``."""
    stats.record(M.RL_QUEUE_DEPTH, float(depth), {A.RL_QUEUE_NAME: name})


def policy_lag(stats: StepStats, sample_versions: Any, current_version: int, *, max_lag: int = 0) -> None:
    """Policy lag of the samples trained on at ``current_version``.

    sample_versions: [B] policy version that generated each sample (a tensor or host numbers).
    Records the per-sample lags as ``rl.sample.policy_lag`` (histogram), their mean / max / min as
    ``rl.async.policy_lag{rl.statistic}``, and the share with lag > ``max_lag`` (the configured
    staleness limit; 0 = on-policy) as ``rl.async.stale_sample_ratio``.
    """
    if not T.numel(sample_versions):
        return
    stats.defer([T.as_vector(sample_versions)], lambda v: _record_lag(stats, current_version - v[0], max_lag))


def _record_lag(stats: StepStats, lags: np.ndarray, max_lag: int) -> None:
    stats.record(M.RL_SAMPLE_POLICY_LAG, lags)
    for stat, value in ((_STAT.MEAN, lags.mean()), (_STAT.MAX, lags.max()), (_STAT.MIN, lags.min())):
        stats.record(M.RL_ASYNC_POLICY_LAG, float(value), {A.RL_STATISTIC: stat.value})
    stats.record(M.RL_ASYNC_STALE_SAMPLE_RATIO, float((lags > max_lag).mean()))
