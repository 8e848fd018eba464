"""Reward stage: latency, batch tokens, throughput, rule-reward exceptions."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from otel_rl.dfx._collector import StepStats
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

logger = logging.getLogger("otel_rl")

R = TypeVar("R")


def reward_batch(stats: StepStats, *, seconds: float, tokens: Any = None) -> None:
    """One reward computation over a batch (a rule-reward pass or a reward-model call).

    seconds -> ``rl.reward.duration``; tokens (the batch's prompt + response tokens scored, a
    number or a device scalar) -> ``rl.reward.batch_tokens`` and tokens / seconds ->
    ``rl.reward.throughput`` (for a reward model, its scoring throughput).
    """
    stats.record(M.RL_REWARD_DURATION, [float(seconds)])
    if tokens is None:
        return

    def on_ready(v: list[float]) -> None:
        stats.record(M.RL_REWARD_BATCH_TOKENS, v[0])
        if seconds > 0:
            stats.record(M.RL_REWARD_THROUGHPUT, v[0] / seconds)

    stats.defer([tokens], on_ready)


class GuardedReward(Generic[R]):
    """A rule reward function that never raises: an exception scores ``default`` and is counted.

    ``guarded(*args, **kwargs)`` calls ``fn``; if it raises, ``rl.reward.exceptions
    {rl.reward.function}`` goes up by one, the first exception of each type is logged, and
    ``default`` is returned, so one unparsable sample neither kills the step nor silently
    becomes a 0 nobody counts. The counter starts at 0 for the function when wrapped.
    """

    def __init__(self, stats: StepStats, fn: Callable[..., R], default: R, *, name: str | None = None) -> None:
        self.fn = fn
        self.default = default
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.exceptions = 0
        self._stats = stats
        self._attrs = {A.RL_REWARD_FUNCTION: self.name}
        self._logged: set[type] = set()
        stats.add(M.RL_REWARD_EXCEPTIONS, 0, self._attrs)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        try:
            return self.fn(*args, **kwargs)
        except Exception as exc:
            self.exceptions += 1
            self._stats.add(M.RL_REWARD_EXCEPTIONS, 1, self._attrs)
            if type(exc) not in self._logged:
                self._logged.add(type(exc))
                logger.warning(
                    "otel-rl dfx: reward function %r raised %r; scored %r (counted in rl.reward.exceptions)", self.name, exc, self.default
                )
            return self.default


def guard_reward(stats: StepStats, fn: Callable[..., R], default: R, *, name: str | None = None) -> GuardedReward[R]:
    """Wrap a per-sample rule reward function: see ``GuardedReward``."""
    return GuardedReward(stats, fn, default, name=name)
