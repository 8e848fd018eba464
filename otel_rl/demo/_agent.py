"""The demo's agent mode (``otel-rl demo --agent``): multi-turn rollouts with a tool, trained on CPU.

Each step asks ``questions_per_step`` arithmetic questions ``group_size`` times each (a GRPO
group). Every rollout is a coroutine, all of a step's run at once inside the ``generate`` stage,
and each is recorded with ``async with tel.trajectory(...)``: per turn the tiny policy (a small
MLP) decides whether to call the ``calculator`` tool or to answer; a tool call runs the real
calculator under a timeout (some calls hang and time out, ``x / 0`` raises), and the trajectory
gets its reward. The policy then takes a REINFORCE step on group-normalized rewards (GRPO's
advantage), and the rollout copy takes the new weights.

The engine's time per turn is simulated (an ``asyncio.sleep`` per prompt and generated token, as
a server's prefill and decode would take) so that turns and tool calls overlap the way they do
against an inference server; the policy's forward pass, the tool and the update are real.
"""

from __future__ import annotations

import asyncio
import copy
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import otel_rl.demo._algorithms as alg
from otel_rl.demo._agent_task import (
    ANSWER,
    CALL,
    FEATURES,
    TOOL_NAME,
    UNDEFINED,
    Question,
    ToolTiming,
    calculator,
    count_tokens,
    features,
    make_questions,
    score_answer,
)
from otel_rl.demo._config import demo_service
from otel_rl.runs.trajectories import REASON_ORDER
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

__all__ = ["AgentConfig", "AgentDemoResult", "run_agent_demo"]


@dataclass
class AgentConfig:
    """Knobs of the agent demo. The defaults run 20 steps of 128 trajectories in a few seconds."""

    steps: int = 20
    first_step: int = 1
    seed: int = 0
    questions_per_step: int = 16
    group_size: int = 8  # rollouts per question: GRPO's group
    max_turns: int = 3  # the last turn always answers
    hidden: int = 16
    lr: float = 1.0  # plain SGD on a gradient clipped to max_grad_norm
    max_grad_norm: float = 1.0
    tool_cost: float = 0.05  # reward taken per tool call
    tool_timeout_s: float = 0.04
    tool_timing: ToolTiming = field(default_factory=ToolTiming)
    prefill_s_per_token: float = 0.00002  # the simulated engine
    decode_s_per_token: float = 0.0004

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        if self.questions_per_step < 1 or self.group_size < 2:
            raise ValueError("questions_per_step must be >= 1 and group_size >= 2 (a group normalizes rewards)")
        if self.max_turns < 2:
            raise ValueError("max_turns must be >= 2 (a tool call and the answer after it)")


@dataclass
class AgentDemoResult:
    """What an agent demo run did: the mean reward and answer accuracy per step, the trajectories,
    tool calls and their failures by error type, and how many trajectories were kept as traces (by
    reason) or only counted."""

    steps: int
    first_step: int
    out: Path | None
    rewards: list[float]
    accuracy: list[float]
    trajectories: int
    tool_calls: int
    tool_errors: dict[str, int]
    kept: dict[str, int]
    not_kept: dict[str, int]
    step_seconds: list[float] = field(default_factory=list)

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1


@dataclass
class _Episode:
    """One rollout's outcome, for the update: its decisions (features, action) and its reward."""

    question: Question
    decisions: list[tuple[list[float], int]] = field(default_factory=list)
    answer: str | None = None
    reward: float = 0.0
    correct: bool = False
    tool_calls: int = 0
    tool_errors: dict[str, int] = field(default_factory=dict)
    tokens_in: int = 0
    tokens_out: int = 0


class ToolPolicy(nn.Module):
    """The tiny policy: a turn's features -> logits of (call the tool, answer)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _BatchedPolicy:
    """The rollout policy served the way an inference engine serves: the decisions that are waiting
    when it runs go through one forward pass together (continuous batching, in miniature)."""

    def __init__(self, model: nn.Module, generator: torch.Generator) -> None:
        self.model = model
        self.generator = generator
        self.pending: list[tuple[list[float], asyncio.Future[int]]] = []

    async def decide(self, x: list[float]) -> int:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        if not self.pending:  # the first to wait schedules the pass; it runs after the coroutines ready now
            loop.call_soon(self._forward)
        self.pending.append((x, future))
        return await future

    def _forward(self) -> None:
        batch, self.pending = self.pending, []
        with torch.no_grad():
            probs = torch.softmax(self.model(torch.tensor([x for x, _ in batch])), dim=-1)
        actions = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1).tolist()
        for (_, future), action in zip(batch, actions):
            if not future.done():
                future.set_result(int(action))


class AgentTrainer:
    """Runs the steps: concurrent rollouts in ``generate``, rewards, advantages, the update, the weight sync."""

    def __init__(self, cfg: AgentConfig, telemetry: Any, *, progress: bool = False) -> None:
        self.cfg = cfg
        self.tel = telemetry
        self.progress = progress
        self.rng = random.Random(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        with torch.random.fork_rng(devices=[]):  # seeded weights, the caller's RNG untouched
            torch.manual_seed(cfg.seed)
            self.actor = ToolPolicy(cfg.hidden)
        self.infer = copy.deepcopy(self.actor).eval()  # the rollout copy, synced after each update
        for p in self.infer.parameters():
            p.requires_grad_(False)
        self.engine = _BatchedPolicy(self.infer, self.gen)
        self.rewards: list[float] = []
        self.accuracy: list[float] = []
        self.step_seconds: list[float] = []
        self.trajectories = 0
        self.tool_calls = 0
        self.tool_errors: dict[str, int] = {}

    # ---- one rollout ------------------------------------------------------------------------

    async def _engine(self, tokens_in: int, tokens_out: int) -> None:
        cfg = self.cfg
        await asyncio.sleep(cfg.prefill_s_per_token * tokens_in + cfg.decode_s_per_token * tokens_out)

    async def _rollout(self, question: Question, index: int, sample: int) -> _Episode:
        cfg, ep = self.cfg, _Episode(question)
        async with self.tel.trajectory(f"q{index}.{sample}", group=index) as traj:
            prompt = f"Q: {question.expression} = ?"
            result: str | None = None
            last_failed = False
            for turn_index in range(cfg.max_turns):
                final = turn_index == cfg.max_turns - 1
                x = features(question, has_result=result is not None, last_failed=last_failed, turn=turn_index, max_turns=cfg.max_turns)
                tokens_in = count_tokens(prompt)
                async with traj.turn(tokens_in=tokens_in, prompt=prompt) as turn:
                    action = ANSWER if final else await self.engine.decide(x)
                    if action == CALL:
                        response = f'{TOOL_NAME}({{"expression": "{question.expression}"}})'
                    else:
                        response = result if result is not None else question.estimate()
                    tokens_out = count_tokens(response)
                    await self._engine(tokens_in, tokens_out)
                    turn.done(tokens_out=tokens_out, finish_reason="tool_calls" if action == CALL else "stop", response=response)
                ep.tokens_in += tokens_in
                ep.tokens_out += tokens_out
                if not final:
                    ep.decisions.append((x, action))
                if action == ANSWER:
                    ep.answer = response
                    break
                prompt += f"\n{response}"
                result, last_failed = await self._call_tool(traj, ep, question, index, sample, turn_index)
                prompt += f"\n[{TOOL_NAME}] {result if result is not None else 'error: timeout'}"
            score = score_answer(ep.answer, question)
            ep.correct = score == 1.0
            ep.reward = score - cfg.tool_cost * ep.tool_calls
            traj.reward(ep.reward, components={"answer": score, "tool_cost": 0.0 - cfg.tool_cost * ep.tool_calls})
        return ep

    async def _call_tool(self, traj: Any, ep: _Episode, question: Question, index: int, sample: int, turn: int) -> tuple[str | None, bool]:
        """One calculator call under the timeout: (what the agent learnt, whether the call failed).
        A failure leaves the tool's block as an exception: the span gets status ERROR and error.type."""
        cfg = self.cfg
        attempt = ep.tool_calls
        ep.tool_calls += 1
        arguments = {"expression": question.expression}
        try:
            async with traj.tool(TOOL_NAME, call_id=f"call-{index}.{sample}.{turn}", arguments=arguments) as tool:
                try:
                    value = await asyncio.wait_for(
                        calculator(question.expression, key=f"{sample}#{attempt}", timing=cfg.tool_timing), timeout=cfg.tool_timeout_s
                    )
                except asyncio.TimeoutError:  # the bare one says nothing; the span's status carries this text (samples on)
                    raise TimeoutError(f"{TOOL_NAME} gave no answer within {cfg.tool_timeout_s:g} s") from None
                tool.done(result=value)
            return value, False
        except ZeroDivisionError:
            ep.tool_errors["ZeroDivisionError"] = ep.tool_errors.get("ZeroDivisionError", 0) + 1
            return UNDEFINED, False  # the error is the answer: x / 0 is undefined
        except TimeoutError:
            ep.tool_errors["TimeoutError"] = ep.tool_errors.get("TimeoutError", 0) + 1
            return None, True

    async def _rollouts(self, questions: list[Question]) -> list[_Episode]:
        group = self.cfg.group_size
        # every rollout of the step at once; gather keeps the order (a question's group adjacent)
        return list(await asyncio.gather(*(self._rollout(q, i, s) for i, q in enumerate(questions) for s in range(group))))

    # ---- the update -------------------------------------------------------------------------

    def _update(self, episodes: list[_Episode], advantages: torch.Tensor) -> dict[str, float]:
        """REINFORCE on every sampled decision, weighted by its trajectory's group-normalized reward."""
        rows = [(x, action, float(advantages[i])) for i, ep in enumerate(episodes) for x, action in ep.decisions]
        if not rows:
            return {"actor/pg_loss": 0.0, "actor/grad_norm": 0.0, "critic/entropy/mean": 0.0}
        x = torch.tensor([r[0] for r in rows])
        actions = torch.tensor([r[1] for r in rows])
        weights = torch.tensor([r[2] for r in rows])
        log_probs = torch.log_softmax(self.actor(x), dim=-1)
        taken = log_probs.gather(-1, actions[:, None]).squeeze(-1)
        loss = -(weights * taken).mean()
        params = list(self.actor.parameters())
        for p in params:
            p.grad = None
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        # plain SGD: torch.optim's first use imports torch._dynamo, seconds of the demo's run
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p -= self.cfg.lr * p.grad
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        return {"actor/pg_loss": loss.item(), "actor/grad_norm": grad_norm.item(), "critic/entropy/mean": entropy.item()}

    # ---- one step ---------------------------------------------------------------------------

    def step(self, step: int) -> None:
        cfg, tel = self.cfg, self.tel
        t0 = time.perf_counter()
        questions = make_questions(cfg.questions_per_step, self.rng)
        logs: dict[str, float] = {}
        with tel.step(step):
            with tel.stage("generate", cluster="actor_infer") as st:
                episodes = asyncio.run(self._rollouts(questions))
            logs.update(st.metrics)
            with tel.stage("compute_rewards", cluster="reward") as st:
                scores = torch.tensor([ep.reward for ep in episodes])
            logs.update(st.metrics)
            with tel.stage("advantage") as st:
                advantages = alg.group_normalize(scores, cfg.group_size)
            logs.update(st.metrics)
            with tel.stage("train_step", cluster="actor_train") as st:
                logs.update(self._update(episodes, advantages))
            logs.update(st.metrics)
            with tel.stage("model_update", cluster="actor_infer") as st:
                self.infer.load_state_dict(self.actor.state_dict())
            logs.update(st.metrics)

            self.trajectories += len(episodes)
            calls = sum(ep.tool_calls for ep in episodes)
            self.tool_calls += calls
            for ep in episodes:
                for error, count in ep.tool_errors.items():
                    self.tool_errors[error] = self.tool_errors.get(error, 0) + count
            mean, high, low = alg.masked_stats(scores)
            logs.update({"critic/score/mean": mean, "critic/score/max": high, "critic/score/min": low})
            logs.update(
                dict(zip(("critic/advantages/mean", "critic/advantages/max", "critic/advantages/min"), alg.masked_stats(advantages)))
            )
            logs["actor/lr"] = cfg.lr
            logs["tokens/response_length/mean"] = sum(ep.tokens_out for ep in episodes) / len(episodes)
            logs["tokens/prompt_length/mean"] = sum(ep.tokens_in for ep in episodes) / len(episodes)
            logs["system/samples"] = float(self.trajectories)
            tel.record(M.RL_SAMPLE_REWARD, scores.numpy())
            tel.log(logs, step=step)
        seconds = time.perf_counter() - t0
        accuracy = sum(ep.correct for ep in episodes) / len(episodes)
        self.rewards.append(mean)
        self.accuracy.append(accuracy)
        self.step_seconds.append(seconds)
        if self.progress:
            print(
                f"step {step}/{cfg.last_step} reward {mean:.3f} exact {accuracy:.0%} tool calls {calls / len(episodes):.2f}/trajectory "
                f"{seconds:.2f}s",
                file=sys.stderr,
                flush=True,
            )

    def run(self) -> None:
        # One intra-op thread: the model is tiny, and idle OpenMP workers spinning between its passes
        # would take the CPU the event loop and the telemetry worker need.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for step in range(self.cfg.first_step, self.cfg.last_step + 1):
                self.step(step)
        finally:
            torch.set_num_threads(threads)


def _trajectory_counts(telemetry: Any) -> tuple[dict[str, int], dict[str, int]]:
    """(kept by reason, not kept by reason) from rl.trajectory.count, after a flush."""

    def count(kept: bool, reason: str) -> int:
        value = telemetry.latest(M.RL_TRAJECTORY_COUNT, {A.RL_TRAJECTORY_KEPT: kept, A.RL_TRAJECTORY_REASON: reason})
        return int(value or 0)

    kept = {reason: n for reason in REASON_ORDER if (n := count(True, reason))}
    not_kept = {reason: n for reason in REASON_ORDER if (n := count(False, reason))}
    return kept, not_kept


def run_agent_demo(
    *,
    steps: int = 20,
    out: str | Path | None = None,
    seed: int = 0,
    telemetry: Any = None,
    progress: bool = True,
    config: AgentConfig | None = None,
    telemetry_options: dict[str, Any] | None = None,
) -> AgentDemoResult:
    """Train the tool-calling policy for ``steps`` steps, every rollout recorded as a trajectory.

    telemetry: an ``otel_rl.Telemetry`` (used and left open; flushed at the end so that its
    trajectory counts are final); when None, one is started with ``otel_rl.init(service_name=
    "otel-rl-demo-agent", run_dir=out, framework="roll", **telemetry_options)`` and shut down.
    Runs its own event loop per step (``asyncio.run``): call it where no loop is running.
    """
    base = config if config is not None else AgentConfig()
    cfg = AgentConfig(**{**vars(base), "steps": steps, "seed": seed})
    own = telemetry is None
    if own:
        import otel_rl

        options: dict[str, Any] = {**demo_service("otel-rl-demo-agent"), "framework": "roll", **(telemetry_options or {})}
        if out is not None:
            options["run_dir"] = str(out)
        telemetry = otel_rl.init(**options)
    trainer = AgentTrainer(cfg, telemetry, progress=progress)
    try:
        trainer.run()
        telemetry.flush()  # decides the last step's trajectories: the counts below are final
        kept, not_kept = _trajectory_counts(telemetry)
    finally:
        if own:
            telemetry.shutdown()
    run_dir = getattr(telemetry, "run_dir", None)
    return AgentDemoResult(
        steps=cfg.steps,
        first_step=cfg.first_step,
        out=Path(run_dir) if run_dir is not None else (Path(out) if out is not None else None),
        rewards=trainer.rewards,
        accuracy=trainer.accuracy,
        trajectories=trainer.trajectories,
        tool_calls=trainer.tool_calls,
        tool_errors=dict(sorted(trainer.tool_errors.items())),
        kept=kept,
        not_kept=not_kept,
        step_seconds=trainer.step_seconds,
    )
