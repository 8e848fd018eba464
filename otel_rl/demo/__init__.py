"""A real, small RL run on CPU that shows what otel-rl records.

A tiny random-initialised transformer learns to reverse a few digits with GRPO or PPO
(rollout sampling, rule reward, old / reference log-probs, PPO-clip with a k3 KL penalty,
Adam, weight sync, checkpoints, greedy validation). Every stage runs inside a telemetry
stage span and each step logs the keys ROLL logs, so traces, metrics and events look like
those of a ROLL run. Needs torch (CPU is enough); 20 steps take well under a minute.

    from otel_rl.demo import run_demo
    result = run_demo(steps=20, algo="grpo", out="runs/demo")
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._run import ALGOS, DemoConfig, DemoTrainer

__all__ = ["DemoConfig", "DemoResult", "run_demo"]


@dataclass
class DemoResult:
    """What a demo run did. ``rewards`` is the mean rule score (critic/score/mean) per step."""

    steps: int
    algo: str
    out: Path
    rewards: list[float]
    checkpoints: list[Path]
    final_val_score: float | None
    val_scores: dict[int, float] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.out


def _default_out(telemetry: Any, algo: str) -> Path:
    run_dir = getattr(telemetry, "run_dir", None)
    if isinstance(run_dir, (str, Path)) and str(run_dir):
        return Path(run_dir)
    return Path("runs") / f"otel-rl-demo-{algo}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_demo(
    *,
    steps: int = 20,
    algo: str = "grpo",
    out: str | Path | None = None,
    seed: int = 0,
    telemetry: Any = None,
    inject_spike_at: int | None = None,
    progress: bool = True,
    config: DemoConfig | None = None,
    first_step: int = 1,
) -> DemoResult:
    """Train the tiny policy for ``steps`` steps (numbered first_step.., default 1..steps) and record it.

    telemetry: an ``otel_rl.Telemetry``; when None, one is created with
    ``otel_rl.init(service_name=f"otel-rl-demo-{algo}", run_dir=out, framework="roll")``
    and shut down at the end. A given one is used and left open.
    out: folder for checkpoints (``checkpoints/checkpoint-<step>.pt``); defaults to the
    telemetry's run folder when it has one, else ``runs/otel-rl-demo-<algo>-<time>``.
    inject_spike_at: a real instability for trying alerts. At this step the first and the
    last actor update run at ``actor_lr * config.spike_lr_factor`` (x500) and every actor
    loss is scaled by ``config.spike_loss_scale`` (x100): KL, grad norm and ratio clip
    fractions jump at that step, and the next rollouts meet a collapsed policy (entropy
    falls, responses run to the token limit, reward drops). Nothing logged is faked.
    config: every other knob (batch size, learning rates, clip ranges, ...).
    """
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, not {algo!r}")
    base = config if config is not None else DemoConfig()
    cfg = DemoConfig(**{**vars(base), "algo": algo, "steps": steps, "seed": seed, "inject_spike_at": inject_spike_at,
                           "first_step": first_step})

    own_telemetry = telemetry is None
    if own_telemetry:
        import otel_rl

        telemetry = otel_rl.init(service_name=f"otel-rl-demo-{algo}", run_dir=out, framework="roll")
    out_path = Path(out) if out is not None else _default_out(telemetry, algo)
    try:
        state = DemoTrainer(cfg, telemetry, out_path, progress=progress).run()
    finally:
        if own_telemetry:
            telemetry.shutdown()
    final_val = state.val_scores.get(cfg.last_step)
    return DemoResult(
        steps=cfg.steps,
        algo=algo,
        out=out_path,
        rewards=list(state.rewards),
        checkpoints=list(state.checkpoints),
        final_val_score=final_val,
        val_scores=dict(state.val_scores),
        step_seconds=list(state.step_seconds),
    )
