"""The RL maths of the demo, as small pure functions over tensors.

Each function follows what ROLL computes for the key it feeds (roll/pipeline/rlvr
actor_worker.loss_func, critic_worker.loss_func, functionals.compute_gae / reward norm),
so the values the demo logs under ROLL's keys mean what they mean in ROLL. Masks are
float or long tensors of 0/1 with the same shape as the values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

_EPS = 1e-8


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / (mask.sum() + _EPS)
    return (x * mask).sum(dim) / (mask.sum(dim) + _EPS)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over the masked entries (unbiased variance), zero where masked."""
    mask = mask.to(x.dtype)
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = (((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1.0)
    return (x - mean) * torch.rsqrt(var + _EPS) * mask


def masked_stats(x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[float, float, float]:
    """(mean, max, min) of the entries where mask is 1 (all entries without a mask)."""
    vals = x.flatten() if mask is None else x[mask.bool()]
    if vals.numel() == 0:
        return 0.0, 0.0, 0.0
    vals = vals.float()
    return vals.mean().item(), vals.max().item(), vals.min().item()


def group_normalize(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: (score - group mean) / (group std + eps) over the G samples of each prompt.

    ``scores`` is [num_prompts * G] with each prompt's samples adjacent; std is the unbiased
    one (torch.std), as ROLL's group_reward_norm. A group whose samples all score the same
    gets zeros (no learning signal from that prompt).
    """
    grouped = scores.view(-1, group_size)
    mean = grouped.mean(-1, keepdim=True)
    std = grouped.std(-1, keepdim=True)
    return ((grouped - mean) / (std + eps)).view(-1)


def clip_rewards(rewards: torch.Tensor, clip: float) -> tuple[torch.Tensor, float]:
    """Clamp to [-clip, clip]; also the fraction of values that were outside (reward_clip_frac)."""
    frac = ((rewards > clip) | (rewards < -clip)).float().mean().item()
    return rewards.clamp(-clip, clip), frac


def token_level_rewards(response_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each response's reward on its last response token ([B] -> [B, R])."""
    out = torch.zeros(response_mask.shape, dtype=response_rewards.dtype)
    last = (response_mask.sum(-1) - 1).clamp(min=0).long()
    out[torch.arange(out.shape[0]), last] = response_rewards
    return out * response_mask


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response tokens, [B, R] each.

    delta_t = r_t + gamma * V_{t+1} - V_t;  A_t = delta_t + gamma * lam * A_{t+1};
    returns = A + V. Past the end of a response V is 0 (the episode ended).
    """
    mask = mask.to(values.dtype)
    values = values * mask
    rewards = rewards * mask
    last = torch.zeros(values.shape[0], dtype=values.dtype)
    advantages = torch.zeros_like(values)
    length = values.shape[1]
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t + 1 < length else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        advantages[:, t] = last
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(current || reference): exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    log_ratio = ref_log_probs - log_probs
    return log_ratio.exp() - log_ratio - 1.0


def compute_sample_weights(response_mask: torch.Tensor, *, length_weighting: bool = True) -> torch.Tensor:
    """ROLL's length-based sample weights: longer responses weigh less, weights average 1."""
    batch = response_mask.shape[0]
    weights = torch.ones(batch)
    if length_weighting:
        lengths = response_mask.sum(-1).float()
        norm = (lengths - lengths.min()) / (lengths.max() - lengths.min() + _EPS)
        weights = weights * (1.5 - norm)
    if weights.sum() > 0:
        weights = weights * (batch / (weights.sum() + _EPS))
    return weights


def ppo_policy_loss(
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    final_response_mask: torch.Tensor,
    sample_weights: torch.Tensor,
    entropy: torch.Tensor | None = None,
    clip: float = 0.2,
    dual_clip: float | None = 3.0,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip (optionally dual-clip) loss with a k3 KL penalty to the reference.

    ``response_mask`` marks every generated token; ``final_response_mask`` is what the loss
    trains on (the demo drops truncated responses there, as ROLL's max_len_mask). Returns the
    total loss to backpropagate and ROLL's ``actor/*`` metrics for this mini-batch.
    """
    response_mask = response_mask.float()
    final_response_mask = final_response_mask.float()
    valid_samples = (final_response_mask > 0).any(-1).float()

    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip, 1 + clip) * advantages
    loss = -torch.min(surr1, surr2)
    if dual_clip is not None:
        # dual clip bounds the loss of a negative-advantage token whose ratio ran away
        loss = torch.where(advantages < 0, torch.min(loss, -dual_clip * advantages), loss)

    pg_loss_per_sample = masked_mean(loss, final_response_mask, dim=-1)
    n_valid = valid_samples.sum() + _EPS
    weighted_pg_loss = (pg_loss_per_sample * sample_weights * valid_samples).sum() / n_valid
    pg_loss = pg_loss_per_sample.sum() / n_valid

    kl = masked_mean(k3_kl(log_probs, ref_log_probs), final_response_mask, dim=-1).mean()
    total = weighted_pg_loss + kl_coef * kl
    if entropy is not None and entropy_coef > 0:
        total = total - entropy_coef * masked_mean(entropy, response_mask)

    with torch.no_grad():
        approxkl = 0.5 * (log_probs - old_log_probs) ** 2
        policykl = log_probs - old_log_probs
        clipped_low = (ratio < 1 - clip).float()
        clipped_high = (ratio > 1 + clip).float()
        metrics = {
            "actor/ppo_ratio_high_clipfrac": masked_mean(clipped_high, response_mask).item(),
            "actor/ppo_ratio_low_clipfrac": masked_mean(clipped_low, response_mask).item(),
            "actor/ppo_ratio_clipfrac": masked_mean(clipped_low + clipped_high, response_mask).item(),
            "actor/ratio_mean": masked_mean(ratio, response_mask, dim=-1).mean().item(),
            "actor/ratio_max": ratio[response_mask.bool()].max().item(),
            "actor/ratio_min": ratio[response_mask.bool()].min().item(),
            "actor/clipfrac": masked_mean((surr2 < surr1).float(), response_mask, dim=-1).mean().item(),
            "actor/pg_loss": pg_loss.item(),
            "actor/weighted_pg_loss": weighted_pg_loss.item(),
            "actor/kl_loss": kl.item(),
            "actor/total_loss": total.item(),
            "actor/approxkl": masked_mean(approxkl, response_mask, dim=-1).mean().item(),
            "actor/policykl": masked_mean(policykl, response_mask, dim=-1).mean().item(),
            "actor/valid_samples": valid_samples.sum().item(),
            "actor/total_samples": float(valid_samples.numel()),
            "actor/valid_sample_ratio": (valid_samples.sum() / valid_samples.numel()).item(),
            "actor/sample_weights_mean": sample_weights.mean().item(),
            "actor/sample_weights_min": sample_weights.min().item(),
            "actor/sample_weights_max": sample_weights.max().item(),
        }
    return total, metrics


def value_loss(
    *, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None = 0.5
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss 0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2); ROLL's critic/* metrics."""
    mask = mask.float()
    surr1 = (values - returns) ** 2
    if clip is not None:
        clipped = torch.max(torch.min(values, old_values + clip), old_values - clip)
        surr2 = (clipped - returns) ** 2
        loss_mat = torch.max(surr1, surr2)
        clipfrac = masked_mean((surr2 > surr1).float(), mask, dim=-1).mean()
    else:
        loss_mat = surr1
        clipfrac = torch.zeros(())
    loss = 0.5 * masked_mean(loss_mat, mask, dim=-1).mean()
    with torch.no_grad():
        metrics = {
            "critic/loss": loss.item(),
            "critic/value": masked_mean(old_values, mask, dim=-1).mean().item(),
            "critic/vpred": masked_mean(values, mask, dim=-1).mean().item(),
            "critic/clipfrac": clipfrac.item(),
            "critic/error": masked_mean(surr1, mask, dim=-1).mean().item(),
        }
    return loss, metrics


_REDUCE_MAX = ("_max", "/max")
_REDUCE_MIN = ("_min", "/min")
_REDUCE_SUM = ("actor/valid_samples", "actor/total_samples")


def reduce_minibatch_metrics(per_minibatch: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Combine mini-batch metrics into one value per key for the step.

    max/min keys take the max/min over mini-batches, sample counts add up to the batch,
    everything else is the mean; valid_sample_ratio is recomputed from the sums.
    """
    out: dict[str, float] = {}
    for key in per_minibatch[0]:
        vals = [m[key] for m in per_minibatch]
        if key in _REDUCE_SUM:
            out[key] = float(sum(vals))
        elif key.endswith(_REDUCE_MAX):
            out[key] = float(max(vals))
        elif key.endswith(_REDUCE_MIN):
            out[key] = float(min(vals))
        else:
            out[key] = float(sum(vals) / len(vals))
    if "actor/valid_samples" in out and out.get("actor/total_samples"):
        out["actor/valid_sample_ratio"] = out["actor/valid_samples"] / out["actor/total_samples"]
    return out
