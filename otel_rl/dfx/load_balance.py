"""Load balance: per-rank tokens and time, straggler, queue depth.

The per-rank values are what ``torch.distributed.all_gather`` (or ``gather_per_rank``) gives
on one rank: index r of each sequence is rank r. In a single process the caller passes them.
Record them on one rank (rank 0) so each series is written once.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from otel_rl.dfx._collector import StepStats
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

_STAT = A.RlStatisticValues


@dataclass(frozen=True)
class Straggler:
    """The rank with the longest active time and how much slower it is than the median rank."""

    rank: int
    active_time: float
    margin: float  # active / median - 1 (0 when balanced)


def gather_per_rank(value: float) -> list[float]:
    """This rank's value from every rank, in rank order (all_gather_object when torch.distributed
    is initialized; a one-element list otherwise). A collective: call it on every rank."""
    return gather_columns_per_rank(value)[0]


def gather_columns_per_rank(*values: float) -> list[list[float]]:
    """Several per-rank values in one collective: for each value given, its list over the ranks."""
    row = tuple(float(v) for v in values)
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return [[v] for v in row]
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    return [list(column) for column in zip(*rows)]


def rank_balance(
    stats: StepStats,
    *,
    tokens: Sequence[float] | Any = None,
    active_time: Sequence[float] | Any = None,
    idle_time: Sequence[float] | Any = None,
    communication_time: Sequence[float] | Any = None,
    step_time: float | None = None,
    ranks: Sequence[int] | None = None,
    straggler_margin: float = 0.2,
) -> None:
    """Record per-rank load and the straggler (at ``stats.flush()``).

    tokens -> ``rl.rank.tokens{rl.measured_rank}`` and, across ranks, ``rl.rank.tokens{rl.statistic}``
    (min, max, mean, minmax_diff, as verl's global_seqlen/*); active_time ->
    ``rl.rank.active_time{rl.measured_rank}``; idle_time (default step_time - active_time) ->
    ``rl.rank.idle_time{rl.measured_rank}``; communication_time -> ``rl.rank.communication_time{rl.measured_rank}``;
    the rank with the longest active time -> ``rl.straggler.rank`` and its margin
    (active / median active - 1) -> ``rl.straggler.margin``, and an ``rl.straggler`` event when
    the margin exceeds ``straggler_margin``. Seconds and token counts, as host numbers or tensors
    (e.g. the output of ``all_gather``).
    """
    given = {
        k: v for k, v in (("tokens", tokens), ("active", active_time), ("idle", idle_time), ("comm", communication_time)) if v is not None
    }
    names = list(given)
    stats.defer(
        [_vector(v) for v in given.values()], lambda v: _record_balance(stats, dict(zip(names, v)), step_time, ranks, straggler_margin)
    )


def _record_balance(
    stats: StepStats, values: dict[str, Any], step_time: float | None, ranks: Sequence[int] | None, straggler_margin: float
) -> None:
    values = {k: np.atleast_1d(np.asarray(v, dtype=np.float64)) for k, v in values.items()}
    tokens = values.get("tokens")
    if tokens is not None and tokens.size:
        _per_rank(stats, M.RL_RANK_TOKENS, tokens, ranks)
        for stat, value in (
            (_STAT.MIN, tokens.min()),
            (_STAT.MAX, tokens.max()),
            (_STAT.MEAN, tokens.mean()),
            (_STAT.MINMAX_DIFF, tokens.max() - tokens.min()),
        ):
            stats.record(M.RL_RANK_TOKENS, float(value), {A.RL_STATISTIC: stat.value})
    if "comm" in values:
        _per_rank(stats, M.RL_RANK_COMMUNICATION_TIME, values["comm"], ranks)
    active = values.get("active")
    idle = values.get("idle")
    if idle is None and active is not None and step_time is not None:
        idle = np.maximum(step_time - active, 0.0)
    if idle is not None:
        _per_rank(stats, M.RL_RANK_IDLE_TIME, idle, ranks)
    if active is None or not active.size:
        return
    _per_rank(stats, M.RL_RANK_ACTIVE_TIME, active, ranks)
    straggler = find_straggler(active, ranks)
    stats.record(M.RL_STRAGGLER_RANK, straggler.rank)
    stats.record(M.RL_STRAGGLER_MARGIN, straggler.margin)
    emit = getattr(stats.tel, "event", None)
    if active.size > 1 and straggler.margin > straggler_margin and callable(emit):
        emit(
            N.RL_STRAGGLER_EVENT,
            {"active_time_s": straggler.active_time, "median_active_time_s": float(np.median(active)), "margin": straggler.margin},
            {A.RL_MEASURED_RANK: straggler.rank},
        )


def find_straggler(active_time: Sequence[float] | Any, ranks: Sequence[int] | None = None) -> Straggler:
    """The slowest rank (the lowest rank among ties) and its margin over the median."""
    active = np.asarray(active_time, dtype=np.float64).reshape(-1)
    index = int(np.argmax(active))
    median = float(np.median(active))
    margin = float(active[index]) / median - 1.0 if median > 0 else 0.0
    rank = int(ranks[index]) if ranks is not None else index
    return Straggler(rank=rank, active_time=float(active[index]), margin=margin)


def _per_rank(stats: StepStats, metric: str, values: np.ndarray, ranks: Sequence[int] | None) -> None:
    for i, value in enumerate(values):
        stats.record(metric, float(value), {A.RL_MEASURED_RANK: int(ranks[i]) if ranks is not None else i})


def _vector(values: Any) -> Any:
    """Per-rank values as one vector: a list of device scalars (all_gather's output) is stacked on
    its device, so it still reaches the host in the step's single transfer."""
    if isinstance(values, (list, tuple)) and values and hasattr(values[0], "detach"):
        return sys.modules["torch"].stack([v.detach().reshape(()) for v in values])
    return values
