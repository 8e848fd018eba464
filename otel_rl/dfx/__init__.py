"""DFX metrics computed for the user: correctness, performance, memory, load balance, data
quality, per-stage and async metrics (design-for-observability metrics for RL), from
the tensors and outputs a trainer already has, recorded as registry metrics.

Every helper takes a ``StepStats`` (one per trainer, wrapping the ``Telemetry``). Helpers that
read tensors compute their small results on the tensor's device and queue them; ``flush()``
once per step moves all of them to the host in one batched transfer and records them. Torch
tensors (CPU or GPU), numpy arrays and Python numbers are all accepted::

    from otel_rl import dfx

    stats = dfx.StepStats(tel)
    ledger = dfx.ShapeLedger(stats)
    timeline = dfx.StepTimeline()
    for step in range(num_steps):
        with tel.step(step):
            timeline.begin()
            with timeline.track(tel.stage("generate", cluster="actor_infer")):
                outputs = llm.generate(prompts, params)
            dfx.record_requests(stats, outputs)                       # tokens, TTFT, TPOT, aborts
            with timeline.track(tel.stage("compute_log_probs", cluster="actor_train")):
                old_logp = forward(batch)
            ledger.record(dfx.batch_id(step), "compute_log_probs", {"input_ids": ids, "old_log_probs": old_logp})
            dfx.count_nonfinite(stats, {"old_log_probs": old_logp})
            dfx.logprob_stage(stats, "compute_log_probs", old_logp, response_mask)
            dfx.train_infer_mismatch(stats, old_logp, rollout_logp, response_mask)  # trainer vs engine
            ...
            dfx.pipeline_bubble(stats, timeline)
            stats.flush()                                             # the step's one transfer

Attributes are low-cardinality only (stage, cluster, tensor name, op, rank, device, statistic).
"""

from __future__ import annotations

from otel_rl.dfx._collector import StepStats
from otel_rl.dfx.asynchronous import policy_lag, queue_depth
from otel_rl.dfx.correctness import (
    BatchId,
    LedgerEntry,
    Mismatch,
    ShapeLedger,
    ShapeLedgerMismatch,
    batch_id,
    count_nonfinite,
    id_alignment,
    response_mask_ratio,
    token_alignment,
)
from otel_rl.dfx.data_quality import aborted_ratio, clipped_ratio, lengths, reward_distribution
from otel_rl.dfx.load_balance import Straggler, find_straggler, gather_columns_per_rank, gather_per_rank, rank_balance
from otel_rl.dfx.memory import (
    activation_peak_from_stage,
    comm_buffer_peak,
    fragmentation,
    kv_cache,
    kv_cache_bytes_per_token,
    record_activation_peak,
    tensors_nbytes,
)
from otel_rl.dfx.performance import (
    PEAK_BF16_FLOPS,
    ModelSpec,
    SmActivityProbe,
    StepTimeline,
    measure_peak_flops,
    mfu,
    model_flops,
    peak_flops_for,
    pipeline_bubble,
    record_sm_activity,
    throughput,
)
from otel_rl.dfx.reward import GuardedReward, guard_reward, reward_batch
from otel_rl.dfx.rollout import RequestStats, from_sglang, from_vllm, record_requests, request_stats
from otel_rl.dfx.train_infer import train_infer_mismatch
from otel_rl.dfx.training import ComputeTimer, grad_norm, logprob_stage, losses

__all__ = [
    "PEAK_BF16_FLOPS",
    "BatchId",
    "ComputeTimer",
    "GuardedReward",
    "LedgerEntry",
    "Mismatch",
    "ModelSpec",
    "RequestStats",
    "ShapeLedger",
    "ShapeLedgerMismatch",
    "SmActivityProbe",
    "StepStats",
    "StepTimeline",
    "Straggler",
    "aborted_ratio",
    "activation_peak_from_stage",
    "batch_id",
    "clipped_ratio",
    "comm_buffer_peak",
    "count_nonfinite",
    "find_straggler",
    "fragmentation",
    "from_sglang",
    "from_vllm",
    "gather_columns_per_rank",
    "gather_per_rank",
    "grad_norm",
    "guard_reward",
    "id_alignment",
    "kv_cache",
    "kv_cache_bytes_per_token",
    "lengths",
    "logprob_stage",
    "losses",
    "measure_peak_flops",
    "mfu",
    "model_flops",
    "peak_flops_for",
    "pipeline_bubble",
    "policy_lag",
    "queue_depth",
    "rank_balance",
    "record_activation_peak",
    "record_requests",
    "record_sm_activity",
    "request_stats",
    "response_mask_ratio",
    "reward_batch",
    "reward_distribution",
    "tensors_nbytes",
    "throughput",
    "token_alignment",
    "train_infer_mismatch",
]
