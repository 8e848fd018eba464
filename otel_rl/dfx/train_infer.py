"""The training-inference mismatch, from the two log-prob tensors a trainer already holds.

The rollout engine returns each sampled token's log-prob (vLLM ``logprobs``, SGLang
``return_logprob``); the trainer recomputes the same tokens' log-probs before the update (the
"old" log-probs). Where a framework logs no comparison of the two (verl's ``rollout_corr/*``,
AReaL's ``ppo_actor/train_infer/*``), ``train_infer_mismatch`` computes it::

    dfx.train_infer_mismatch(stats, old_log_probs, rollout_log_probs, response_mask)
    stats.flush()

All of it is reduced on the tensors' device into one small vector, read in the step's single
batched transfer at ``flush()``; nothing here waits for the device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import otel_rl.dfx._tensors as T
from otel_rl.dfx._collector import StepStats
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

# exp() of a larger log-ratio overflows float32; a token this far apart is reported at the bound
# (the ratio's max then reads e^20, about 5e8: the mismatch is total either way).
LOG_RATIO_BOUND = 20.0

_MEAN = A.RlStatisticValues.MEAN.value
_MAX = A.RlStatisticValues.MAX.value
_MIN = A.RlStatisticValues.MIN.value
_STD = A.RlStatisticValues.STD.value
_K1 = A.RlKlEstimatorValues.K1.value
_K3 = A.RlKlEstimatorValues.K3.value


def train_infer_mismatch(
    stats: StepStats, train_logprobs: Any, infer_logprobs: Any, response_mask: Any = None, *, role: str = A.RlModelRoleValues.ACTOR.value
) -> None:
    """Compare the trainer's and the rollout engine's log-probs of the same response tokens.

    train_logprobs, infer_logprobs: [B, R] (or any equal shape), the trainer's recomputed and the
    engine's sampled log-probs; response_mask: 1 on the response tokens (default: all).
    Records, by ``rl.model.role``:

    - ``rl.train_infer.logprob.abs_diff`` and ``rl.train_infer.prob.abs_diff`` (mean, max, std);
    - ``rl.train_infer.kl`` with estimators k1 (mean log pi_infer - log pi_train) and k3;
    - ``rl.train_infer.importance_ratio`` pi_train / pi_infer (mean, min, max);
    - ``rl.train_infer.nonfinite_ratio``: tokens where either side is NaN or infinite. Those are
      left out of everything else; a batch with no finite token records only this share.
    """
    train_shape, infer_shape = T.shape_of(train_logprobs), T.shape_of(infer_logprobs)
    if train_shape != infer_shape:
        raise ValueError(f"train_logprobs {train_shape} and infer_logprobs {infer_shape} must have the same shape")
    if response_mask is not None and T.shape_of(response_mask) != train_shape:
        raise ValueError(f"response_mask {T.shape_of(response_mask)} must have the log-probs' shape {train_shape}")
    if T.numel(train_logprobs) == 0:
        return
    summary = _summary(train_logprobs, infer_logprobs, response_mask)
    size = T.numel(train_logprobs)
    stats.defer([summary], lambda v: _record(stats, role, size, v[0]))


def _summary(train: Any, infer: Any, mask: Any) -> Any:
    """One vector on the tensors' device: [tokens, finite tokens, then the sums and extremes below]."""
    if T.is_torch(train) or T.is_torch(infer):
        torch = T.loaded_torch()
        like = train if T.is_torch(train) else infer
        train = torch.as_tensor(train, device=like.device).detach().float()
        infer = torch.as_tensor(infer, device=like.device).detach().float()
        mask = torch.ones_like(train, dtype=torch.bool) if mask is None else torch.as_tensor(mask, device=like.device) != 0
        xp: Any = torch
    else:
        train, infer = np.asarray(train, dtype=np.float64), np.asarray(infer, dtype=np.float64)
        mask = np.ones(train.shape, dtype=bool) if mask is None else np.asarray(mask) != 0
        xp = np
    # train - infer is finite exactly where both are: one isfinite pass instead of two
    gap = train - infer
    finite = mask & xp.isfinite(gap)
    kept = finite.to(train.dtype) if xp is not np else finite.astype(np.float64)
    # Every token left out (padding, non-finite) gets a gap of 0: it adds nothing to the sums and is
    # never above a real gap, so only the ratio's extremes need the mask again.
    log_ratio = xp.where(finite, gap, 0.0).clip(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    abs_log = xp.abs(log_ratio)
    abs_prob = xp.where(finite, xp.abs(xp.exp(train) - xp.exp(infer)), 0.0)
    # (r - 1) - log r is never negative; expm1 and the floor keep float32 rounding from making it so
    k3 = xp.maximum(xp.expm1(log_ratio) - log_ratio, xp.zeros_like(log_ratio))
    outside = (1.0 - kept) * (2 * LOG_RATIO_BOUND + 1)  # pushes left-out tokens past either extreme
    flat_log, flat_prob = abs_log.reshape(-1), abs_prob.reshape(-1)
    parts = [
        (mask if xp is np else mask.to(train.dtype)).sum(),
        kept.sum(),
        flat_log.sum(),
        flat_log @ flat_log,
        flat_log.max(),
        flat_prob.sum(),
        flat_prob @ flat_prob,
        flat_prob.max(),
        -log_ratio.sum(),
        k3.sum(),
        xp.exp(log_ratio).sum(),  # left-out tokens add exp(0) = 1 each: taken off on the host
        (log_ratio + outside).min(),
        (log_ratio - outside).max(),
    ]
    if xp is np:
        return np.array([float(p) for p in parts])
    wide = xp.float32 if train.device.type == "mps" else xp.float64  # MPS has no float64
    return xp.stack([p.to(wide) for p in parts])


def _record(stats: StepStats, role: str, size: int, v: Any) -> None:
    tokens, n = float(v[0]), float(v[1])
    if tokens <= 0:
        return
    by_role = {A.RL_MODEL_ROLE: role}
    stats.record(M.RL_TRAIN_INFER_NONFINITE_RATIO, (tokens - n) / tokens, by_role)
    if n <= 0:
        return
    for metric, total, squares, largest in (
        (M.RL_TRAIN_INFER_LOGPROB_ABS_DIFF, v[2], v[3], v[4]),
        (M.RL_TRAIN_INFER_PROB_ABS_DIFF, v[5], v[6], v[7]),
    ):
        mean = total / n
        spread = max(squares / n - mean * mean, 0.0) ** 0.5
        for statistic, value in ((_MEAN, mean), (_MAX, largest), (_STD, spread)):
            stats.record(metric, float(value), {**by_role, A.RL_STATISTIC: statistic})
    stats.record(M.RL_TRAIN_INFER_KL, float(v[8]) / n, {**by_role, A.RL_KL_ESTIMATOR: _K1})
    stats.record(M.RL_TRAIN_INFER_KL, float(v[9]) / n, {**by_role, A.RL_KL_ESTIMATOR: _K3})
    ratio_sum = float(v[10]) - (size - n)  # less the 1 each left-out token added
    for statistic, value in ((_MEAN, ratio_sum / n), (_MIN, math.exp(float(v[11]))), (_MAX, math.exp(float(v[12])))):
        stats.record(M.RL_TRAIN_INFER_IMPORTANCE_RATIO, value, {**by_role, A.RL_STATISTIC: statistic})
