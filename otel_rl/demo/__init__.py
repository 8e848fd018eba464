"""A real, small RL run on CPU that shows what otel-rl records.

A tiny random-initialised transformer learns to reverse a few digits with GRPO or PPO
(rollout sampling, rule reward, old / reference log-probs, PPO-clip with a k3 KL penalty,
Adam, weight sync, checkpoints, greedy validation). Every stage runs inside a telemetry
stage span and each step logs the keys ROLL logs, so traces, metrics and events look like
those of a ROLL run. Needs torch (CPU is enough); 20 steps take well under a minute.

    from otel_rl.demo import run_demo
    result = run_demo(steps=20, algo="grpo", out="runs/demo")

``run_agent_demo`` (``otel-rl demo --agent``) trains a tool-calling policy instead: multi-turn
rollouts with a calculator tool, each recorded as an agent trajectory (see ``_agent``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rl.demo._agent import AgentConfig, AgentDemoResult, run_agent_demo
from otel_rl.demo._config import ALGOS, DemoConfig, demo_service
from otel_rl.demo._run import DemoTrainer

__all__ = ["AgentConfig", "AgentDemoResult", "DemoConfig", "DemoResult", "demo_service", "run_agent_demo", "run_demo"]


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
    ranks: int = 1,
    telemetry_options: dict[str, Any] | None = None,
    async_rollout: bool | None = None,
    slow_rank: int | None = None,
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
    ranks: processes to train on (torch.distributed with gloo on this machine's CPU); each rank
    starts its own telemetry from ``telemetry_options`` (``otel_rl.init`` keywords; a shared
    run id is added), so ``telemetry`` must be None then. The step's prompts are split over
    the ranks. slow_rank: that rank sleeps ``config.slow_rank_seconds`` in every rollout.
    async_rollout: train each step on the batch generated during the previous one (one-step
    off-policy) while the next rollout runs concurrently: queue depth, policy lag and stale
    samples get real values.
    """
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, not {algo!r}")
    base = config if config is not None else DemoConfig()
    overrides: dict[str, Any] = {"algo": algo, "steps": steps, "seed": seed, "inject_spike_at": inject_spike_at, "first_step": first_step}
    if async_rollout is not None:
        overrides["async_rollout"] = async_rollout
    if slow_rank is not None:
        overrides["slow_rank"] = slow_rank
    cfg = DemoConfig(**{**vars(base), **overrides})
    if ranks > 1:
        return _run_ranks(cfg, ranks, telemetry, telemetry_options, out, progress)
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, not {ranks}")
    if slow_rank not in (None, 0):
        raise ValueError(f"slow_rank {slow_rank} needs ranks > {slow_rank}")

    own_telemetry = telemetry is None
    if own_telemetry:
        import otel_rl

        options = {**demo_service(f"otel-rl-demo-{algo}"), "run_dir": out, "framework": "roll", **(telemetry_options or {})}
        telemetry = otel_rl.init(**options)
    out_path = Path(out) if out is not None else _default_out(telemetry, algo)
    try:
        state = DemoTrainer(cfg, telemetry, out_path, progress=progress).run()
    finally:
        if own_telemetry:
            telemetry.shutdown()
    return _result(cfg, out_path, state.rewards, state.checkpoints, state.val_scores, state.step_seconds)


def _run_ranks(
    cfg: DemoConfig, ranks: int, telemetry: Any, telemetry_options: dict[str, Any] | None, out: str | Path | None, progress: bool
) -> DemoResult:
    if telemetry is not None:
        raise ValueError(
            "run_demo(ranks > 1) starts telemetry in each rank's process: pass telemetry_options "
            "(otel_rl.init keywords) instead of a Telemetry object"
        )
    from otel_rl._sdk.settings.config import resolve_config
    from otel_rl.demo._ranks import run_ranks

    options = {**demo_service(f"otel-rl-demo-{cfg.algo}"), "framework": "roll", **(telemetry_options or {})}
    if out is not None:
        options.setdefault("run_dir", str(out))
    resolved = resolve_config(options)  # one run id and run folder for every rank
    options.update(run_id=resolved.run_id, run_dir=resolved.run_dir)
    out_path = Path(out) if out is not None else Path(str(resolved.run_dir))
    got = run_ranks(cfg, ranks, options, out_path, progress=progress)
    return _result(
        cfg,
        out_path,
        got["rewards"],
        [Path(p) for p in got["checkpoints"]],
        {int(k): v for k, v in got["val_scores"].items()},
        got["step_seconds"],
    )


def _result(
    cfg: DemoConfig, out: Path, rewards: list[float], checkpoints: list[Path], val_scores: dict[int, float], step_seconds: list[float]
) -> DemoResult:
    return DemoResult(
        steps=cfg.steps,
        algo=cfg.algo,
        out=out,
        rewards=list(rewards),
        checkpoints=list(checkpoints),
        final_val_score=val_scores.get(cfg.last_step),
        val_scores=dict(val_scores),
        step_seconds=list(step_seconds),
    )
