"""The RL DFX metrics of the demo run (:class:`DemoDfx`): correctness, performance, memory, load
balance, data quality, per-stage and async metrics, computed by ``otel_rl.dfx`` from the tensors,
decoding timestamps and stages the demo's training loop already has, and flushed once a step."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import torch

from otel_rl import dfx
from otel_rl.demo._config import DemoConfig
from otel_rl.demo._policy import Rollout, TinyCausalLM
from otel_rl.demo._rank_context import RankContext
from otel_rl.demo._task import EOS, RewardParts, score_response

__all__ = ["DemoDfx"]


class DemoDfx:
    """The DFX metrics (correctness, performance, memory, load balance, data, stages, async) for the demo, computed by ``otel_rl.dfx``
    from what the demo already has: its tensors, its decoding loop's timestamps, its stages.

    All tensor-derived values of a step reach the host in ``stats.flush()`` at the end of the
    step. It needs the whole Telemetry API (``record`` with attributes, ``add``); with a
    stand-in that lacks it (the tests' NoopTelemetry) every method does nothing.

    What a CPU run cannot have: SM activity (no NVML), GPU allocator memory, fragmentation and
    activation peaks (no CUDA allocator) stay absent. The demo's decoding recomputes the whole
    sequence each token (no KV cache): KV-cache use and peak are reported as 0. Its weight sync
    stages a copy of the actor's state dict: that copy's size is its communication buffer. MFU
    is taken against this machine's measured float32 matmul throughput (a CPU has no datasheet
    peak in the table).
    """

    TIMED_STAGES = ("compute_log_probs", "compute_ref_log_probs", "train_step", "model_update")

    def __init__(self, telemetry: Any, cfg: DemoConfig, actor: TinyCausalLM, ranks: RankContext = RankContext()) -> None:
        self.enabled = callable(getattr(telemetry, "add", None))
        if not self.enabled:
            return
        self.cfg = cfg
        self.ranks = ranks
        self.comm_seconds = 0.0  # this step's gradient all_reduce time (waiting for peers included)
        self.stats = dfx.StepStats(telemetry)
        self.ledger = dfx.ShapeLedger(self.stats)
        self.timeline = dfx.StepTimeline()
        self.sma = dfx.SmActivityProbe()
        self.timers = {stage: dfx.ComputeTimer(self.stats, stage, device="cpu") for stage in self.TIMED_STAGES}
        self.actor_spec = dfx.ModelSpec.from_module(actor, num_layers=cfg.n_layers, hidden_size=cfg.d_model)
        self.peak_flops = dfx.measure_peak_flops("cpu")
        self.guarded_score = dfx.guard_reward(self.stats, score_response, RewardParts(0.0, 0.0, False), name="reverse_digits")
        self.policy_version = 0  # bumped at every weight sync to the rollout policy
        self.batch = dfx.batch_id(0)
        self.engine_lengths: list[int] = []
        self.sample_versions: torch.Tensor | None = None

    # -- plumbing the demo's step calls -------------------------------------------------------
    def stage(self, stage_cm: Any) -> Any:
        """A telemetry stage whose busy time also goes into the step timeline (pipeline bubble)."""
        return self.timeline.track(stage_cm) if self.enabled else stage_cm

    def op(self, stage: str, name: str) -> Any:
        """Time a forward / backward / optimizer_step / communication op of a stage."""
        return self.timers[stage].op(name) if self.enabled else contextlib.nullcontext()

    def score(self, prompt: list[int], response: list[int]) -> RewardParts:
        """The rule reward, guarded: an exception scores 0 and is counted."""
        return self.guarded_score(prompt, response) if self.enabled else score_response(prompt, response)

    def begin_step(self, step: int) -> None:
        if self.enabled:
            self.batch = dfx.batch_id(step)  # one micro-batch: the whole step's batch
            self.timeline.begin()
            self.sma.begin()
            self.comm_seconds = 0.0

    @contextlib.contextmanager
    def communication(self) -> Any:
        """Time a collective (gradient all_reduce): it is waiting for peers, not this rank's work."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.enabled:
                self.comm_seconds += time.perf_counter() - t0

    # -- per stage ------------------------------------------------------------------------------
    def after_generate(self, rollout: Rollout, token_times: list[float], version: int | None = None) -> None:
        """``version``: the policy version that generated the batch (async: an older one)."""
        if not self.enabled:
            return
        requests = self._requests(rollout, token_times)
        self.engine_lengths = [r.output_tokens[0] for r in requests]
        dfx.record_requests(self.stats, requests)
        dfx.kv_cache(self.stats, {"kv_cache_usage": 0.0, "kv_cache_bytes": 0})  # no KV cache: recomputes
        self.ledger.record(
            self.batch,
            "generate",
            {"input_ids": rollout.input_ids, "attention_mask": rollout.attention_mask, "response_mask": rollout.response_mask},
            sample_ids=rollout.sample_ids,
        )
        self.sample_versions = torch.full((rollout.input_ids.shape[0],), self.policy_version if version is None else version)

    def _requests(self, rollout: Rollout, token_times: list[float]) -> list[dfx.RequestStats]:
        """The decoding loop as an inference engine's request outputs: every sample arrives at
        the start, gets a token per iteration, and ends at its EOS or the token budget."""
        start, times = token_times[0], token_times
        prompt_lengths = rollout.prompt_lengths.tolist()
        requests = []
        for prompt_len, tokens in zip(prompt_lengths, rollout.responses.tolist()):
            stop = EOS in tokens
            n = tokens.index(EOS) + 1 if stop else len(tokens)  # no EOS: it used the whole budget
            requests.append(
                dfx.RequestStats(
                    prompt_tokens=int(prompt_len),
                    output_tokens=[n],
                    finish_reasons=["stop" if stop else "length"],
                    latency=times[n] - start,
                    ttft=times[1] - start,
                    tpot=(times[n] - times[1]) / (n - 1) if n > 1 else None,
                )
            )
        return requests

    def after_rewards(self, seconds: float | None, rollout: Rollout) -> None:
        if self.enabled and seconds is not None:
            dfx.reward_batch(self.stats, seconds=seconds, tokens=rollout.attention_mask.sum())

    def after_log_probs(self, st: Any, stage: str, log_probs: torch.Tensor, rollout: Rollout) -> None:
        if not self.enabled:
            return
        mask = rollout.response_mask
        dfx.logprob_stage(self.stats, stage, log_probs, mask, micro_batch_tokens=[rollout.attention_mask.sum()])
        dfx.token_alignment(self.stats, stage, mask, logprobs=log_probs, response_lengths=self.engine_lengths)
        if stage == "compute_log_probs" and rollout.rollout_log_probs is not None:
            dfx.train_infer_mismatch(self.stats, log_probs, rollout.rollout_log_probs, mask)
        name = "old_log_probs" if stage == "compute_log_probs" else "ref_log_probs"
        self.ledger.record(
            self.batch, stage, {"input_ids": rollout.input_ids, "response_mask": mask, name: log_probs}, sample_ids=rollout.sample_ids
        )
        dfx.activation_peak_from_stage(self.stats, st)

    def after_values(self, values: torch.Tensor, rollout: Rollout) -> None:
        if self.enabled:
            self.ledger.record(
                self.batch, "compute_values", {"input_ids": rollout.input_ids, "values": values}, sample_ids=rollout.sample_ids
            )

    def after_advantage(self, advantages: torch.Tensor, rollout: Rollout) -> None:
        if self.enabled:
            self.ledger.record(
                self.batch, "advantage", {"response_mask": rollout.response_mask, "advantages": advantages}, sample_ids=rollout.sample_ids
            )

    def before_actor_update(self, waiting_samples: int) -> None:
        """Samples generated and not yet trained on (sync: the batch handed over; async: that
        batch plus the next one if its rollout already finished)."""
        if self.enabled:
            dfx.queue_depth(self.stats, "rollout", waiting_samples)

    def after_actor_update(self, st: Any, rollout: Rollout, tensors: dict[str, torch.Tensor], seconds: float) -> None:
        if not self.enabled:
            return
        mask = rollout.response_mask
        dfx.response_mask_ratio(self.stats, "train_step", mask)
        dfx.token_alignment(self.stats, "train_step", mask, logprobs=tensors["old_log_probs"], response_lengths=self.engine_lengths)
        self.ledger.record(
            self.batch, "train_step", {"input_ids": rollout.input_ids, "response_mask": mask, **tensors}, sample_ids=rollout.sample_ids
        )
        dfx.policy_lag(self.stats, self.sample_versions, self.policy_version, max_lag=self.cfg.max_staleness)
        # every PPO epoch runs every sample at the full padded width through forward + backward
        passes = rollout.input_ids.shape[0] * self.cfg.ppo_epochs
        seq_lens = np.full(passes, rollout.input_ids.shape[1])
        dfx.mfu(self.stats, self.actor_spec, seq_lens, seconds, peak_flops=self.peak_flops)
        dfx.activation_peak_from_stage(self.stats, st)

    def after_model_update(self, staged: dict[str, torch.Tensor]) -> None:
        if self.enabled:
            dfx.comm_buffer_peak(self.stats, dfx.tensors_nbytes(staged))
            self.policy_version += 1

    # -- end of step ------------------------------------------------------------------------------
    def end_step(self, *, seconds: float, rollout: Rollout, tensors: dict[str, torch.Tensor]) -> None:
        if not self.enabled:
            return
        stats = self.stats
        dfx.count_nonfinite(stats, tensors)
        dfx.lengths(
            stats,
            prompt_lengths=rollout.prompt_lengths,
            response_lengths=rollout.response_lengths,
            truncated=rollout.truncated,
            histograms=False,
        )  # the demo records the arrays itself
        dfx.reward_distribution(stats, tensors["rewards"], histogram=False)
        tokens = rollout.attention_mask.sum()
        dfx.throughput(stats, seconds=seconds, tokens=tokens, samples=rollout.input_ids.shape[0])
        # active = busy in stages minus waiting for peers in all_reduce; every rank's, on rank 0
        ranks = self.ranks
        active = max(self.timeline.busy_seconds() - self.comm_seconds, 0.0)
        if ranks.distributed:
            rank_tokens, rank_active, rank_comm = dfx.gather_columns_per_rank(float(tokens), active, self.comm_seconds)
            if ranks.rank == 0:
                dfx.rank_balance(
                    stats,
                    tokens=rank_tokens,
                    active_time=rank_active,
                    communication_time=rank_comm,
                    step_time=seconds,
                    ranks=list(range(ranks.world)),
                )
        else:
            dfx.rank_balance(
                stats, tokens=[tokens], active_time=[active], step_time=seconds, ranks=[int(getattr(stats.tel, "rank", 0) or 0)]
            )
        dfx.pipeline_bubble(stats, self.timeline)
        dfx.fragmentation(stats)
        self.sma.record(stats)
        stats.flush()
