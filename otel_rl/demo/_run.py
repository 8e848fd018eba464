"""The demo's training loop: a real (tiny) GRPO / PPO run, instrumented like ROLL.

Every step goes through the stages of ROLL's RLVR pipeline, each inside a telemetry stage
span, and ends with one ``tel.log`` carrying the keys ROLL logs plus every stage's
``time/*`` and ``memory/*`` keys, and whole per-sample arrays through ``tel.record``.
``DemoDfx`` adds the RL DFX metrics (correctness, performance, memory, load balance, data
quality, per-stage and async) computed by ``otel_rl.dfx`` from the same tensors and stages.

The run's knobs are in ``_config`` (:class:`DemoConfig`), its DFX metrics in ``_dfx_metrics``
(:class:`DemoDfx`), its rank in a process group in ``_rank_context`` (:class:`RankContext`).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import copy
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import otel_rl.demo._algorithms as alg
from otel_rl.demo._config import DemoConfig
from otel_rl.demo._dfx_metrics import DemoDfx
from otel_rl.demo._policy import HostOffload, Rollout, TinyCausalLM, generate, response_log_probs, response_values
from otel_rl.demo._rank_context import RankContext
from otel_rl.demo._task import ReverseDigitsTask, sample_rows
from otel_rl.semconv import metrics as M

__all__ = ["DemoTrainer", "StepReport", "TrainState"]


@dataclass
class StepReport:
    step: int
    metrics: dict[str, float]
    seconds: float


@dataclass
class TrainState:
    rewards: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    val_scores: dict[int, float] = field(default_factory=dict)
    checkpoints: list[Path] = field(default_factory=list)
    samples_total: int = 0


def _stats(prefix: str, x: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    mean, mx, mn = alg.masked_stats(x, mask)
    return {f"{prefix}/mean": mean, f"{prefix}/max": mx, f"{prefix}/min": mn}


class DemoTrainer:
    """Owns the models (actor_infer, actor_train, reference, critic) and runs the steps."""

    def __init__(self, cfg: DemoConfig, telemetry: Any, out: Path, *, progress: bool = True, ranks: RankContext = RankContext()) -> None:
        if cfg.prompts_per_step % ranks.world:
            raise ValueError(f"prompts_per_step ({cfg.prompts_per_step}) must divide evenly over {ranks.world} ranks")
        if cfg.slow_rank is not None and not 0 <= cfg.slow_rank < ranks.world:
            raise ValueError(f"slow_rank {cfg.slow_rank} is not a rank of this run (0..{ranks.world - 1})")
        self.cfg = cfg
        self.tel = telemetry
        self.out = out
        self.progress = progress
        self.ranks = ranks
        self.task = ReverseDigitsTask()
        self.state = TrainState()
        self.local_prompts = cfg.prompts_per_step // ranks.world  # data parallel: each rank its share

        # sampling, prompts, shuffles: each rank its own stream (rank 0 keeps the 1-rank stream)
        self.gen = torch.Generator().manual_seed(cfg.seed + 7919 * ranks.rank)
        # async: the rollout thread samples with a generator of its own (never shared across threads)
        self.rollout_gen = torch.Generator().manual_seed(cfg.seed + 7919 * ranks.rank + 1)
        self.pending: Any = None  # async: the next batch's rollout, running during this step
        self.executor: Any = None
        self.model_kwargs = dict(d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_ff=2 * cfg.d_model)
        # seeded initialisation without touching the caller's global RNG state
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.actor = TinyCausalLM(**self.model_kwargs, eos_logit=cfg.eos_prior_logit)
            self.critic = TinyCausalLM(**self.model_kwargs, out_dim=1) if cfg.algo == "ppo" else None
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr)
        self.actor_host = HostOffload(self.actor, self.actor_optim)
        self.dfx = DemoDfx(telemetry, cfg, self.actor, ranks)  # before offloading: it counts the actor's weights
        self.last_update_seconds = 0.0
        # rollout policy (actor_infer) and reference are separate modules; the reference
        # is the frozen initial policy, the rollout policy gets the weights every step
        self.infer = copy.deepcopy(self.actor).eval()
        self.ref = copy.deepcopy(self.actor).eval()
        for p in (*self.infer.parameters(), *self.ref.parameters()):
            p.requires_grad_(False)
        self.ref_host = HostOffload(self.ref)
        if self.critic is not None:
            self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
            self.critic_host = HostOffload(self.critic, self.critic_optim)
            self.critic_host.offload()

        # training-side models start offloaded, as ROLL's workers between stages
        self.actor_host.offload()
        self.ref_host.offload()

        val_gen = torch.Generator().manual_seed(cfg.seed + 10_007)
        self.val_prompts = self.task.sample_prompts(cfg.val_prompts, val_gen)

    # ---- stages ------------------------------------------------------------------------

    def _generate(self, gen: torch.Generator | None = None) -> tuple[list[list[int]], Rollout, list[float]]:
        gen = self.gen if gen is None else gen
        prompts = self.task.sample_prompts(self.local_prompts, gen)
        prompts = [p for p in prompts for _ in range(self.cfg.group_size)]  # groups adjacent
        ids, mask = self.task.encode(prompts)
        token_times: list[float] = []
        if self.cfg.slow_rank == self.ranks.rank:
            time.sleep(self.cfg.slow_rank_seconds)  # the straggler, on purpose
        rollout = generate(
            self.infer,
            ids,
            mask,
            max_new_tokens=self.task.max_new_tokens,
            temperature=self.cfg.temperature,
            generator=gen,
            token_times=token_times,
        )
        return prompts, rollout, token_times

    def _generate_stage(self, gen: torch.Generator | None = None) -> tuple[Any, dict[str, float], int]:
        """A rollout inside its stage span: (prompts, rollout, token_times), the stage's keys, and
        the policy version that generated it."""
        version = self.dfx.policy_version if self.dfx.enabled else 0
        with self.dfx.stage(self.tel.stage("generate", cluster="actor_infer")) as st:
            batch = self._generate(gen)
        return batch, st.metrics, version

    def _next_rollout(self) -> tuple[Any, dict[str, float], int]:
        """This step's batch. Sync: generated now. Async: the one generated during the last step
        (generated now on the first step), while the next one starts in a thread, as a child
        of this step's span running concurrently with the training stages."""
        if not self.cfg.async_rollout:
            return self._generate_stage()
        if self.pending is None:
            current = self._generate_stage(self.rollout_gen)
        else:  # its stage's keys were logged with the step it ran in
            batch, _, version = self.pending.result()
            current = (batch, {}, version)
        if self.executor is None:
            self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="otel-rl-demo-rollout")
        context = contextvars.copy_context()  # the thread's spans join this step's trace
        self.pending = self.executor.submit(context.run, self._generate_stage, self.rollout_gen)
        return current

    def _finish_rollout(self) -> None:
        """Async: the rollout running for the next step must end before the weights change."""
        if self.pending is not None:
            concurrent.futures.wait([self.pending])

    def _offloaded(self, st: Any, host: HostOffload, fn, *, with_optimizer: bool):
        with st.phase("onload"):
            host.onload(with_optimizer=with_optimizer)
        with st.phase("execute"):
            result = fn()
        with st.phase("offload"):
            host.offload()
        return result

    def _train_actor(self, rollout: Rollout, old_logp, ref_logp, advantages, spike: bool) -> dict[str, float]:
        cfg, op = self.cfg, self.dfx.op
        t0 = time.perf_counter()
        final_mask = rollout.response_mask.clone()
        if cfg.max_len_mask:
            final_mask[rollout.truncated] = 0
        weights = alg.compute_sample_weights(rollout.response_mask, length_weighting=cfg.length_weighting)
        spike_lr = cfg.actor_lr * cfg.spike_lr_factor
        loss_scale = cfg.spike_loss_scale if spike else 1.0
        last_update = (cfg.ppo_epochs - 1, cfg.mini_batches - 1)
        per_mb: list[dict[str, float]] = []
        lrs: list[float] = []
        for epoch in range(cfg.ppo_epochs):
            perm = torch.randperm(rollout.input_ids.shape[0], generator=self.gen)
            for i, idx in enumerate(perm.chunk(cfg.mini_batches)):
                # an injected spike runs the first update (ratios, KL and grad norm blow up
                # inside this step) and the last one (the next rollout meets a collapsed
                # policy) at a huge learning rate
                lr = spike_lr if spike and (epoch, i) in ((0, 0), last_update) else cfg.actor_lr
                for group in self.actor_optim.param_groups:
                    group["lr"] = lr
                lrs.append(lr)
                mb = rollout.select(idx)
                with op("train_step", "forward"):
                    logp, entropy = response_log_probs(self.actor, mb, temperature=cfg.temperature)
                    loss, m = alg.ppo_policy_loss(
                        log_probs=logp,
                        old_log_probs=old_logp[idx],
                        ref_log_probs=ref_logp[idx],
                        advantages=advantages[idx],
                        response_mask=mb.response_mask,
                        final_response_mask=final_mask[idx],
                        sample_weights=weights[idx],
                        entropy=entropy,
                        clip=cfg.pg_clip,
                        dual_clip=cfg.dual_clip,
                        kl_coef=cfg.kl_coef,
                        entropy_coef=cfg.entropy_coef,
                    )
                    # an injected spike also scales the loss that is really backpropagated
                    loss = loss * loss_scale
                m["actor/total_loss"] = loss.item()
                self.actor_optim.zero_grad(set_to_none=True)
                with op("train_step", "backward"):
                    loss.backward()
                if self.ranks.distributed:
                    with op("train_step", "communication"), self.dfx.communication():
                        self.ranks.all_reduce_mean(self.actor.parameters())
                with op("train_step", "optimizer_step"):
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.actor.parameters(), cfg.max_grad_norm)
                    if torch.isfinite(grad_norm):
                        self.actor_optim.step()
                # else: skip the update, as loss scalers do, rather than write inf/nan weights
                m["actor/grad_norm"] = grad_norm.item()
                per_mb.append(m)
        self.actor_optim.zero_grad(set_to_none=True)
        for group in self.actor_optim.param_groups:
            group["lr"] = cfg.actor_lr
        out = alg.reduce_minibatch_metrics(per_mb)
        out["actor/lr"] = max(lrs)
        self.last_update_seconds = time.perf_counter() - t0
        return out

    def _train_critic(self, rollout: Rollout, old_values, returns) -> dict[str, float]:
        cfg = self.cfg
        assert self.critic is not None
        per_mb: list[dict[str, float]] = []
        for _ in range(cfg.ppo_epochs):
            perm = torch.randperm(rollout.input_ids.shape[0], generator=self.gen)
            for idx in perm.chunk(cfg.mini_batches):
                mb = rollout.select(idx)
                vpred = response_values(self.critic, mb)
                loss, m = alg.value_loss(
                    values=vpred, old_values=old_values[idx], returns=returns[idx], mask=mb.response_mask, clip=cfg.value_clip
                )
                self.critic_optim.zero_grad(set_to_none=True)
                loss.backward()
                if self.ranks.distributed:
                    with self.dfx.communication():
                        self.ranks.all_reduce_mean(self.critic.parameters())
                torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm)
                self.critic_optim.step()
                per_mb.append(m)
        self.critic_optim.zero_grad(set_to_none=True)
        out = alg.reduce_minibatch_metrics(per_mb)
        out["critic/lr"] = self.critic_optim.param_groups[0]["lr"]
        return out

    def _save_checkpoint(self, step: int) -> Path:
        ckpt_dir = self.out / "checkpoints"
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        path = ckpt_dir / f"checkpoint-{step}.pt"
        payload: dict[str, Any] = {
            "step": step,
            "algo": self.cfg.algo,
            "model_kwargs": dict(self.model_kwargs),
            "config": asdict(self.cfg),
            "actor": {k: v.detach().clone() for k, v in self.actor.state_dict().items()},
            "actor_optimizer": self.actor_optim.state_dict(),
        }
        if self.critic is not None:
            self.critic_host.onload()
            payload["critic"] = {k: v.detach().clone() for k, v in self.critic.state_dict().items()}
            payload["critic_optimizer"] = self.critic_optim.state_dict()
            self.critic_host.offload()
        tmp = path.with_suffix(".pt.tmp")
        torch.save(payload, tmp)
        tmp.replace(path)
        return path

    @torch.no_grad()
    def _validate(self) -> torch.Tensor:
        ids, mask = self.task.encode(self.val_prompts)
        rollout = generate(self.infer, ids, mask, max_new_tokens=self.task.max_new_tokens, greedy=True)
        parts = self.task.score(self.val_prompts, rollout.responses)
        return torch.tensor([p.score for p in parts])

    # ---- one step ----------------------------------------------------------------------

    def step(self, step: int) -> StepReport:
        cfg, tel, d = self.cfg, self.tel, self.dfx
        t0 = time.perf_counter()
        logs: dict[str, float] = {}
        spike = cfg.inject_spike_at is not None and step == cfg.inject_spike_at
        with self.ranks.step_scope(tel, step):
            d.begin_step(step)
            (prompts, rollout, token_times), generate_keys, version = self._next_rollout()
            logs.update(generate_keys)
            d.after_generate(rollout, token_times, version)
            mask = rollout.response_mask

            with d.stage(tel.stage("compute_rewards", cluster="reward")) as st:
                parts = [d.score(p, r) for p, r in zip(prompts, rollout.responses.tolist())]
                scores = torch.tensor([p.score for p in parts])
            logs.update(st.metrics)
            d.after_rewards(getattr(st, "elapsed", None), rollout)

            with d.stage(tel.stage("compute_log_probs", cluster="actor_train", offload=True)) as st:

                def old_log_probs():
                    with torch.no_grad(), d.op("compute_log_probs", "forward"):
                        return response_log_probs(self.actor, rollout, temperature=cfg.temperature)

                old_logp, entropy = self._offloaded(st, self.actor_host, old_log_probs, with_optimizer=False)
            logs.update(st.metrics)
            d.after_log_probs(st, "compute_log_probs", old_logp, rollout)

            with d.stage(tel.stage("compute_ref_log_probs", cluster="reference", offload=True)) as st:

                def ref_log_probs():
                    with torch.no_grad(), d.op("compute_ref_log_probs", "forward"):
                        return response_log_probs(self.ref, rollout, temperature=cfg.temperature)[0]

                ref_logp = self._offloaded(st, self.ref_host, ref_log_probs, with_optimizer=False)
            logs.update(st.metrics)
            d.after_log_probs(st, "compute_ref_log_probs", ref_logp, rollout)

            values = None
            if self.critic is not None:
                with d.stage(tel.stage("compute_values", cluster="critic", offload=True)) as st:

                    def critic_values():
                        with torch.no_grad():
                            critic = self.critic
                            assert critic is not None  # this stage runs only with a critic
                            return response_values(critic, rollout) * mask

                    values = self._offloaded(st, self.critic_host, critic_values, with_optimizer=False)
                logs.update(st.metrics)
                d.after_values(values, rollout)

            with d.stage(tel.stage("advantage")) as st:
                if cfg.algo == "grpo":
                    rewards = alg.group_normalize(scores, cfg.group_size)
                    rewards, reward_clip_frac = alg.clip_rewards(rewards, cfg.reward_clip)
                    advantages = rewards[:, None] * mask
                    returns = advantages
                else:
                    rewards, reward_clip_frac = alg.clip_rewards(scores, cfg.reward_clip)
                    token_rewards = alg.token_level_rewards(rewards, mask)
                    assert values is not None  # GAE runs only with a critic, which computed them
                    raw_adv, returns = alg.compute_gae(token_rewards, values, mask, gamma=cfg.gamma, lam=cfg.lam)
                    advantages = alg.masked_whiten(raw_adv, mask)
            logs.update(st.metrics)
            d.after_advantage(advantages, rollout)

            if self.critic is not None:
                with d.stage(tel.stage("train_step", cluster="critic", offload=True)) as st:
                    critic_metrics = self._offloaded(
                        st, self.critic_host, lambda: self._train_critic(rollout, values, returns), with_optimizer=True
                    )
                logs.update(st.metrics)
                logs.update(critic_metrics)

            waiting = rollout.input_ids.shape[0]
            if self.pending is not None and self.pending.done():
                waiting += self.pending.result()[0][1].input_ids.shape[0]
            d.before_actor_update(waiting)
            with d.stage(tel.stage("train_step", cluster="actor_train", offload=True)) as st:
                actor_metrics = self._offloaded(
                    st, self.actor_host, lambda: self._train_actor(rollout, old_logp, ref_logp, advantages, spike), with_optimizer=True
                )
            logs.update(st.metrics)
            logs.update(actor_metrics)
            trained = {"old_log_probs": old_logp, "ref_log_probs": ref_logp, "advantages": advantages}
            d.after_actor_update(st, rollout, trained, self.last_update_seconds)

            self._finish_rollout()
            if self.pending is not None:  # the next batch's rollout ran inside this step
                logs.update(self.pending.result()[1])
            with d.stage(tel.stage("model_update", cluster="actor_infer")) as st:
                # weight sync: the rollout policy takes the freshly trained weights
                with d.op("model_update", "communication"):
                    staged = self.actor_host.host_state_dict()
                    self.infer.load_state_dict(staged)
            logs.update(st.metrics)
            d.after_model_update(staged)

            lead = self.ranks.rank == 0  # checkpoints and validation: rank 0 only
            if lead and (step % cfg.checkpoint_every == 0 or step == cfg.last_step):
                with d.stage(tel.stage("do_checkpoint", cluster="actor_train", offload=True)) as st:
                    path = self._offloaded(st, self.actor_host, lambda: self._save_checkpoint(step), with_optimizer=True)
                logs.update(st.metrics)
                self.state.checkpoints.append(path)

            if lead and (step % cfg.val_every == 0 or step == cfg.last_step):
                with d.stage(tel.stage("validation", cluster="actor_infer")) as st:
                    val = self._validate()
                logs.update(st.metrics)
                logs.update(_stats("val/score", val))
                self.state.val_scores[step] = val.mean().item()

            # ---- the step's ROLL keys --------------------------------------------------
            n = scores.numel()
            self.state.samples_total += n
            prompt_len = rollout.prompt_lengths
            resp_len = rollout.response_lengths
            logs.update(_stats("critic/score", scores))
            logs.update(_stats("critic/rewards", rewards))
            logs.update(_stats("critic/advantages", advantages, mask))
            logs.update(_stats("critic/returns", returns, mask))
            if values is not None:
                logs.update(_stats("critic/values", values, mask))
            logs["critic/ref_log_prob/mean"] = alg.masked_mean(ref_logp, mask).item()
            logs["critic/old_log_prob/mean"] = alg.masked_mean(old_logp, mask).item()
            logs["critic/entropy/mean"] = alg.masked_mean(entropy, mask).item()
            logs["critic/reward_clip_frac"] = reward_clip_frac
            logs.update(_stats("tokens/response_length", resp_len.float()))
            logs.update(_stats("tokens/prompt_length", prompt_len.float()))
            seconds = time.perf_counter() - t0
            logs["system/tps"] = float(prompt_len.sum() + resp_len.sum()) / max(seconds, 1e-9)
            logs["system/samples"] = float(self.state.samples_total)
            # no ROLL key carries the truncation rate; log it under its registry name
            logs[M.RL_RESPONSE_CLIPPED_RATIO] = rollout.truncated.float().mean().item()

            tel.record(M.RL_SAMPLE_RESPONSE_LENGTH, resp_len.numpy())
            tel.record(M.RL_SAMPLE_PROMPT_LENGTH, prompt_len.numpy())
            tel.record(M.RL_SAMPLE_REWARD, rewards.numpy())
            sample_advantages = alg.masked_mean(advantages, mask, dim=-1)
            tel.record(M.RL_SAMPLE_ADVANTAGE, sample_advantages.numpy())
            if getattr(getattr(tel, "config", None), "log_samples", 0):  # init(log_samples=K): K per step, as text
                rows = sample_rows(prompts, rollout.responses, parts, resp_len, rollout.truncated, sample_advantages, cfg.group_size)
                tel.log_samples(rows, step=step)
            checked = {**trained, "scores": scores, "rewards": rewards, **({"values": values} if values is not None else {})}
            d.end_step(seconds=seconds, rollout=rollout, tensors=checked)
            tel.log(logs, step=step)

        self.state.rewards.append(logs["critic/score/mean"])
        self.state.step_seconds.append(seconds)
        if self.progress:
            line = (
                f"step {step}/{cfg.last_step} reward {logs['critic/score/mean']:.3f} "
                f"kl {logs['actor/kl_loss']:.4f} ent {logs['critic/entropy/mean']:.2f} "
                f"gnorm {logs['actor/grad_norm']:.2f}"
            )
            if "val/score/mean" in logs:
                line += f" val {logs['val/score/mean']:.3f}"
            print(f"{line} {seconds:.2f}s", file=sys.stderr, flush=True)
        return StepReport(step=step, metrics=logs, seconds=seconds)

    def run(self) -> TrainState:
        try:
            for step in range(self.cfg.first_step, self.cfg.last_step + 1):
                self.step(step)
        finally:
            if self.executor is not None:
                self.executor.shutdown(wait=True)
        return self.state
