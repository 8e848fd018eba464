"""The demo run's knobs: :class:`DemoConfig` (algorithm, batch shape, learning rates, clip ranges,
the injected instability, async rollout, a slow rank) and the algorithms it can run."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ALGOS", "DemoConfig"]

ALGOS = ("grpo", "ppo")


@dataclass
class DemoConfig:
    """Knobs of the demo run. The defaults make the reward rise clearly within ~30 steps
    at about 0.3-0.7 s a step on 2 CPU cores.

    Each step samples ``prompts_per_step`` prompts x ``group_size`` responses (GRPO's group;
    PPO uses the same batch), then runs ``ppo_epochs`` passes of ``mini_batches`` updates.
    ``max_len_mask`` drops truncated responses from the actor loss (ROLL's max_len_mask;
    then actor/valid_samples counts the rest). ``inject_spike_at``: see ``run_demo``.
    """

    algo: str = "grpo"
    steps: int = 20
    first_step: int = 1  # a resumed run continues its step numbers
    seed: int = 0
    prompts_per_step: int = 64
    group_size: int = 8
    temperature: float = 1.0
    # the fresh policy's EOS logit bias: ~18% of its first responses hit the token limit (0.0:
    # ~64%, a truncation alert on every healthy start); see TinyCausalLM
    eos_prior_logit: float = 1.5
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    actor_lr: float = 1e-3
    critic_lr: float = 3e-3
    ppo_epochs: int = 4
    mini_batches: int = 4
    pg_clip: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.02
    entropy_coef: float = 0.0
    reward_clip: float = 2.0
    gamma: float = 1.0
    lam: float = 0.95
    value_clip: float = 0.5
    max_grad_norm: float = 1.0
    max_len_mask: bool = False
    length_weighting: bool = True
    val_every: int = 5
    val_prompts: int = 64
    checkpoint_every: int = 10
    inject_spike_at: int | None = None
    spike_lr_factor: float = 500.0
    spike_loss_scale: float = 100.0
    # async RL: each step trains on the batch generated during the previous step (one-step
    # off-policy, the rollout runs concurrently with training); samples older than
    # max_staleness policy versions count as stale
    async_rollout: bool = False
    max_staleness: int = 0
    # multi-rank runs: a rank made slower on purpose (extra seconds of rollout each step)
    slow_rank: int | None = None
    slow_rank_seconds: float = 0.3

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, not {self.algo!r}")
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        if self.first_step < 0:
            raise ValueError("first_step must be >= 0")
        if self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")


def demo_service(name: str) -> dict[str, str]:
    """The demo's service name as an init() option, unless OTEL_SERVICE_NAME names one: an option
    given to init() wins over the environment, and the user's variable must win over the demo's name."""
    return {} if os.environ.get("OTEL_SERVICE_NAME", "").strip() else {"service_name": name}
