"""Rollout samples of TRL's GRPO-style trainers, for ``Telemetry.log_samples``.

TRL's ``GRPOTrainer`` keeps the latest generation batch for its ``log_completions`` table in
``trainer._logs`` (trl/trainer/grpo_trainer.py, ``_generate_and_score_completions``): ``prompt``
and ``completion`` (text, or chat messages in the conversational format), ``rewards`` (reward
function name -> value per completion, before weighting), ``advantages``; gathered from every
process and filled whether or not ``log_completions`` is on. At each ``on_log`` of the main
process, :class:`TrainerSamples` hands that batch to ``log_samples`` (only when ``log_samples``
is on, and once per batch: TRL keeps it until the next generation). Each sample's ``reward`` is
TRL's weighted sum of the function rewards (``reward_weights``, NaN ones skipped, as TRL sums
them), ``group_id`` its position // ``num_generations`` (TRL's sampler repeats each prompt that
many times in a row). Response length and truncation are not in ``_logs``: those keys are absent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["TrainerSamples", "as_text"]


def as_text(value: Any) -> str:
    """A prompt or completion as text: strings as they are, chat messages as ``role: content`` lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(m, Mapping) for m in value):
        lines = []
        for message in value:
            content = message.get("content", "")
            if isinstance(content, (list, tuple)):  # multimodal parts: their text only
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            lines.append(f"{message.get('role', '?')}: {content}")
        return "\n".join(lines)
    return str(value)


def _weights(trainer: Any, count: int) -> list[float]:
    weights = getattr(trainer, "reward_weights", None)
    try:
        got = [float(w) for w in (weights.tolist() if hasattr(weights, "tolist") else weights)]  # type: ignore[union-attr]
    except Exception:
        return [1.0] * count
    return got if len(got) == count else [1.0] * count


class TrainerSamples:
    """Sends the trainer's latest completions batch to ``log_samples`` once."""

    def __init__(self) -> None:
        self._last: Any = None

    def log(self, telemetry: Any, trainer: Any, state: Any) -> None:
        if not telemetry.config.log_samples or trainer is None or not getattr(state, "is_world_process_zero", True):
            return
        logs = getattr(trainer, "_logs", None)
        if not isinstance(logs, Mapping):
            return
        prompts, completions = list(logs.get("prompt") or ()), list(logs.get("completion") or ())
        if not prompts or len(prompts) != len(completions):
            return
        advantages = list(logs.get("advantages") or ())
        rewards = {str(name): list(values) for name, values in (logs.get("rewards") or {}).items()}
        # The same batch stays in _logs until the next generation (TRL reuses it num_iterations times).
        fingerprint = (len(prompts), as_text(prompts[0]), as_text(completions[-1]), advantages[:1])
        if fingerprint == self._last:
            return
        self._last = fingerprint
        weights = _weights(trainer, len(rewards))
        group = int(getattr(trainer, "num_generations", 0) or 0)
        samples = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            parts = {name: values[i] for name, values in rewards.items() if i < len(values)}
            sample: dict[str, Any] = {"prompt": as_text(prompt), "response": as_text(completion), "rewards": parts}
            scored = [(w, float(r)) for w, r in zip(weights, parts.values()) if not math.isnan(float(r))]
            if scored:
                sample["reward"] = sum(w * r for w, r in scored)
            if i < len(advantages):
                sample["advantage"] = advantages[i]
            if group > 0:
                sample["group_id"] = i // group
            samples.append(sample)
        telemetry.log_samples(samples, int(state.global_step))
