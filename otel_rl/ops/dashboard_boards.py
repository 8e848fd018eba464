"""The eight otel-rl Grafana boards, defined from registry metrics: E2E timeline, per-rank heatmap,
memory timeline, training stability, data quality, rollout, algorithm and system.

Each board function takes the registry's metrics (``Metrics``) and returns a ``Board`` of rows and
panels; ``NOT_ON_A_BOARD`` lists the registry metrics deliberately left off every board, with why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from otel_rl.codegen.registry import Registry
from otel_rl.ops.dashboard_model import (
    CLUSTER,
    DEVICE,
    DEVICE_LABELS,
    DEVICE_LEGEND,
    MEASURED_RANK,
    OBSERVATIONS,
    RUN,
    STAGE_SPAN_OF_SERIES,
    STAT,
    STEP_SPAN,
    TRAJECTORY_SPAN,
    Board,
    Metrics,
    Panel,
    Row,
    Target,
    trace_links,
)
from otel_rl.ops.promql import by, enum_value, eq, grown, increase, legend, match, mean_per_call, ne, one_of, quantile, rate
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

# Registry metrics deliberately on no board, with why. A new registry metric must be placed on a
# board or listed here (tests/grafana checks it), so no metric is forgotten silently.
NOT_IN_DEMO = "not emitted by the reference run (the demo), so a panel could not be checked against data"
NOT_ON_A_BOARD: Mapping[str, str] = {
    M.RL_TENSOR_CHECKSUM: "a checksum is compared across stages (rl.shape_ledger.mismatches is on the data-quality board), not read as a curve",
    M.RL_UNMAPPED: "one series per unknown framework key: a fallback to find in Explore, not a panel",
    M.RL_TRAIN_INFER_PROB_ABS_DIFF: "the probability-space twin of rl.train_infer.logprob.abs_diff, which the "
    "training-stability board shows",
    M.RL_TELEMETRY_REJECTED: "only present after bad values arrived; the alert rules watch it",
    M.RL_TELEMETRY_DROPPED: NOT_IN_DEMO + " (it counts only when delivery to the collector fails)",
    M.RL_TELEMETRY_SPOOL_USAGE: NOT_IN_DEMO + " (it is non-zero only while the collector is unreachable)",
    M.RL_ALERT: NOT_IN_DEMO + " (alerts fire only on an unhealthy run; grafana/alerts has the rules)",
    M.RL_THROUGHPUT_STEPS: NOT_IN_DEMO + "; rl.step.duration shows the same",
    M.RL_STEP_TOKENS: NOT_IN_DEMO + "; rl.throughput.tokens is on the timeline",
    **{metric: NOT_IN_DEMO + " (read from a vLLM / SGLang /metrics page; the demo runs no inference engine)"
       for metric in (M.RL_ROLLOUT_REQUESTS, M.RL_ROLLOUT_ENGINE_PREEMPTIONS)},
    **{metric: NOT_IN_DEMO for metric in (
        M.RL_PROGRESS_STEP, M.RL_PROGRESS_EPOCH, M.RL_PROGRESS_MAX_STEPS, M.RL_PROGRESS_RATIO, M.RL_PROGRESS_TOKENS,
        M.RL_RUN_ELAPSED_TIME, M.RL_RUN_REMAINING_TIME, M.RL_RUN_FLOPS, M.RL_RUN_LOSS, M.RL_STAGE_TIME_PER_TOKEN,
        M.RL_CRITIC_EXPLAINED_VARIANCE, M.RL_RESPONSE_TERMINATED_LENGTH, M.RL_RESPONSE_NON_ABORTED_LENGTH,
        M.RL_RESPONSE_NON_ABORTED_CLIPPED_RATIO, M.RL_PROMPT_CLIPPED_RATIO, M.RL_REWARD_COMPONENT, M.RL_REWARD_ZERO_STD_RATIO,
        M.RL_KL_COEFFICIENT, M.RL_ROLLOUT_PREEMPTIONS, M.RL_ROLLOUT_SAMPLE_DURATION,
    )},
}


# --------------------------------------------------------------------------------------------
# Building blocks shared by the boards

S = A.RlStageValues
# The E2E timeline: rollout -> reward -> logprob/ref -> update -> checkpoint, in pipeline order. Every
# stage of the registry's enum is in exactly one group (tests/grafana checks it).
STAGE_GROUPS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("rollout", (S.ROLLOUT, S.GENERATE, S.TOOL_CALLS)),
    ("reward", (S.COMPUTE_REWARDS,)),
    ("logprob / ref", (S.COMPUTE_LOG_PROBS, S.COMPUTE_REF_LOG_PROBS, S.OLD_LOG_PROBS_VALUES, S.REF_LOG_PROBS_VALUES_REWARD,
                       S.MAKE_EXPERIENCE)),
    ("values / advantage", (S.COMPUTE_VALUES, S.ADVANTAGE)),
    ("update", (S.TRAIN_STEP,)),
    ("weight sync", (S.MODEL_UPDATE,)),
    ("checkpoint", (S.DO_CHECKPOINT,)),
    ("validation", (S.VALIDATION,)),
)
TOTAL = eq(A.RL_STAGE_PHASE, enum_value(A.RlStagePhaseValues.TOTAL))


_ACROSS_RANKS = {enum_value(A.RlStatisticValues.MAX): "max", enum_value(A.RlStatisticValues.MIN): "min",
                 enum_value(A.RlStatisticValues.MEAN): "avg"}


def _stats(m: Metrics, metric: str, *matchers: str,
           stats: Sequence[Any] = (A.RlStatisticValues.MEAN, A.RlStatisticValues.MAX, A.RlStatisticValues.MIN),
           extra: Sequence[str] = ()) -> Target:
    """A by-statistic gauge as one series per statistic, each combined across ranks as itself
    (the max of the ranks' maxima, the min of their minima, the mean of their means)."""
    parts = [f"{_ACROSS_RANKS[enum_value(stat)]} {by(STAT, *extra)} ({m.sel(metric, eq(STAT, enum_value(stat)), *matchers)})"
             for stat in stats]
    return Target(" or ".join(parts), legend(*extra, STAT))


AGENT_LOOP_NOTE = "Agent loops only: recorded by Telemetry.trajectory(); empty on a run without trajectories."


def _rollout_latency(m: Metrics) -> list[Panel | Row]:
    """Agent trajectories: p50 / p95 / p99 of whole trajectories, of their turns and of their tool
    calls by tool, their size, and which were kept as traces (every one is measured)."""

    def quantiles(metric: str, *per: str, qs: Sequence[float] = (0.5, 0.95, 0.99), what: str = "",
                  unit: str | None = None) -> list[Target]:
        buckets = m.sel(metric, suffix="_bucket")
        return [Target(quantile(q, buckets, per), legend(*per, prefix=f"{what}p{int(q * 100)} "), unit=unit) for q in qs]

    count = lambda kept: m.sel(M.RL_TRAJECTORY_COUNT, eq(A.RL_TRAJECTORY_KEPT, kept))  # noqa: E731
    reasons = [Target(f"sum {by(A.RL_TRAJECTORY_REASON)} ({grown(count(kept))})", legend(A.RL_TRAJECTORY_REASON, prefix=prefix))
               for kept, prefix in (("true", "kept: "), ("false", "not kept: "))]
    return [
        Row("Rollout latency by turn and tool (agent trajectories)"),
        Panel("timeseries", "Trajectory duration p50 / p95 / p99", quantiles(M.RL_TRAJECTORY_DURATION),
              m.unit(M.RL_TRAJECTORY_DURATION), w=8, links=trace_links(TRAJECTORY_SPAN, scope="trajectory"),
              note=AGENT_LOOP_NOTE + " The p99 is the long tail a step's rollout waits for; click a point to open "
                   "the kept trajectories at least that slow in Jaeger or Tempo."),
        Panel("timeseries", "Turn (generation) duration p50 / p95 / p99", quantiles(M.RL_TURN_DURATION),
              m.unit(M.RL_TURN_DURATION), w=8, note=AGENT_LOOP_NOTE),
        Panel("timeseries", "Tool call duration p50 / p95 / p99 by tool", quantiles(M.RL_TOOL_DURATION, A.GEN_AI_TOOL_NAME),
              m.unit(M.RL_TOOL_DURATION), w=8, note=AGENT_LOOP_NOTE),
        Panel("timeseries", "Trajectories kept as traces and sampled out", reasons, m.unit(M.RL_TRAJECTORY_COUNT), w=12,
              stack=True, bars=True,
              note=AGENT_LOOP_NOTE + " Stacked: trajectories ended per interval, by why their spans were kept (failed, "
                   "slowest, highest / lowest reward, head sampled) or not (sampled out, over the limit)."),
        Panel("timeseries", "Turns and tool calls per trajectory p50 / p95",
              [*quantiles(M.RL_TRAJECTORY_TURNS, qs=(0.5, 0.95), what="turns "),
               *quantiles(M.RL_TRAJECTORY_TOOL_CALLS, qs=(0.5, 0.95), what="tool calls ", unit=m.unit(M.RL_TRAJECTORY_TOOL_CALLS))],
              m.unit(M.RL_TRAJECTORY_TURNS), w=12, note=AGENT_LOOP_NOTE),
    ]


# --------------------------------------------------------------------------------------------
# The boards, in the order Grafana lists them


def e2e_timeline(m: Metrics) -> Board:
    stage = lambda suffix, *extra: m.sel(M.RL_STAGE_DURATION, CLUSTER, *extra, suffix=suffix)  # noqa: E731
    per_stage = (A.RL_CLUSTER, A.RL_STAGE)
    # Each group: the sum over its stages of their mean duration per call, so a stage group reads as
    # the seconds it adds to the steps that ran it (a checkpoint shows at the step that wrote it).
    split = [
        Target(f"sum({mean_per_call(stage('_sum', TOTAL, group), stage('_count', TOTAL, group), per_stage)})", name)
        for name, stages in STAGE_GROUPS for group in [match(A.RL_STAGE, one_of(stages))]
    ]
    step_sum, step_count = m.sel(M.RL_STEP_DURATION, suffix="_sum"), m.sel(M.RL_STEP_DURATION, suffix="_count")
    step_mean = mean_per_call(step_sum, step_count, ())
    step_buckets = m.sel(M.RL_STEP_DURATION, suffix="_bucket")
    stage_buckets = stage("_bucket", TOTAL)
    phases = ne(A.RL_STAGE_PHASE, enum_value(A.RlStagePhaseValues.TOTAL))
    phase_mean = mean_per_call(stage("_sum", phases), stage("_count", phases), (A.RL_CLUSTER, A.RL_STAGE, A.RL_STAGE_PHASE))
    compute_group = (A.RL_STAGE, A.RL_COMPUTE_OP)
    compute = mean_per_call(m.sel(M.RL_COMPUTE_DURATION, suffix="_sum"), m.sel(M.RL_COMPUTE_DURATION, suffix="_count"), compute_group)
    # Every rank runs the stages, one rank (the one opening the step's trace) times the steps: a
    # stage's share is its mean over ranks over the step time of the rank(s) that record steps.
    share = (f"avg {by(A.RL_STAGE)} (sum {by(A.RL_STAGE, A.RL_RANK)} ({grown(stage('_sum', TOTAL), '$__range')})) / "
             f"scalar(max(sum {by(A.RL_RANK)} ({grown(step_sum, '$__range')})))")
    # Goodput: each step's seconds in the productive / overhead / idle buckets (NeMo-RL's efficiency
    # summary, split three ways), in that stacking order, and the latest step's productive share.
    goodput = lambda suffix, bucket: m.sel(M.RL_STEP_GOODPUT_DURATION, eq(A.RL_GOODPUT_BUCKET, enum_value(bucket)), suffix=suffix)  # noqa: E731
    goodput_split = [Target(mean_per_call(goodput("_sum", b), goodput("_count", b), ()), enum_value(b)) for b in A.RlGoodputBucketValues]
    goodput_ratio = m.sel(M.RL_STEP_GOODPUT_RATIO)
    return Board("e2e-timeline", "otel-rl / E2E timeline",
                 "Where each training step's time goes: rollout -> reward -> logprob/ref -> update -> checkpoint, "
                 "from rl.stage.duration by rl.stage and rl.cluster; step time, throughput and MFU; an agent loop's "
                 "rollout latency by trajectory, turn and tool.",
                 [
                     Row("Step"),
                     Panel("stat", "Step time (mean)", [Target(step_mean, "step")], m.unit(M.RL_STEP_DURATION), w=6, h=4),
                     Panel("stat", "Tokens / s", [Target(f"max({m.sel(M.RL_THROUGHPUT_TOKENS)})", "tokens/s")],
                           m.unit(M.RL_THROUGHPUT_TOKENS), w=6, h=4),
                     Panel("stat", "Samples / s", [Target(f"max({m.sel(M.RL_THROUGHPUT_SAMPLES)})", "samples/s")],
                           m.unit(M.RL_THROUGHPUT_SAMPLES), w=6, h=4),
                     Panel("stat", "MFU", [Target(f"avg {by(A.RL_MODEL_ROLE)} ({m.sel(M.RL_MFU)})", legend(A.RL_MODEL_ROLE))],
                           m.unit(M.RL_MFU), w=6, h=4),
                     Row("Where each step's time goes"),
                     Panel("timeseries", "Seconds per step by stage (pipeline order)",
                           [*split, Target(step_mean, "step time")], m.unit(M.RL_STAGE_DURATION), w=24, h=9,
                           stack=True, bars=True, links=trace_links(STEP_SPAN, slower_than_value=False, scope=STEP_SPAN),
                           note="Stacked: the seconds each stage group takes per call (its stages' mean durations), in "
                                "pipeline order; periodic stages (checkpoint, validation) appear where they ran. The line "
                                "is the mean step time; the gap above the stack is time outside any stage."),
                     Panel("timeseries", "Goodput: productive / overhead / idle seconds per step",
                           goodput_split, m.unit(M.RL_STEP_GOODPUT_DURATION), w=16, h=8,
                           stack=True, bars=True,
                           note="Stacked: each step's seconds doing the model's work (generate, rewards, log-probs, train), "
                                "moving or saving it (onload / offload, weight sync, checkpoint, validation) and idle (no stage, "
                                "or a wait stage: waiting on other ranks); overlapping stages count once, productive first, so the stack's "
                                "top is the mean step time."),
                     Panel("timeseries", "Goodput ratio (productive / step time)",
                           [Target(f"avg({goodput_ratio})", "mean over ranks"), Target(f"min({goodput_ratio})", "worst rank")],
                           m.unit(M.RL_STEP_GOODPUT_RATIO), w=8, h=8, min=0, max=1,
                           note="The latest step's productive share of its wall time, per rank: the mean and the worst rank."),
                     Panel("timeseries", "Stage duration p95", [Target(quantile(0.95, stage_buckets, [A.RL_CLUSTER, A.RL_STAGE]),
                                                                      legend(A.RL_CLUSTER, A.RL_STAGE), exemplar=True)],
                           m.unit(M.RL_STAGE_DURATION), w=16, links=trace_links(STAGE_SPAN_OF_SERIES, scope="stage"),
                           note="Click a point to open this stage's spans at least that slow in Jaeger or Tempo."),
                     Panel("bargauge", "Share of step time by stage (time range)", [Target(share, legend(A.RL_STAGE), instant=True)],
                           "percentunit", w=8, min=0, max=1,
                           note="Each stage's total seconds over the dashboard's time range as a share of all steps' seconds."),
                     Panel("timeseries", "Onload / execute / offload by stage and cluster",
                           [Target(phase_mean, legend(A.RL_CLUSTER, A.RL_STAGE, A.RL_STAGE_PHASE))], m.unit(M.RL_STAGE_DURATION),
                           note="Mean seconds per call of each phase: moving weights on and off the device vs. the work itself."),
                     Panel("timeseries", "Forward / backward / optimizer / communication by stage",
                           [Target(compute, legend(A.RL_STAGE, A.RL_COMPUTE_OP))], m.unit(M.RL_COMPUTE_DURATION),
                           note="Mean seconds per measurement of each operation inside a stage."),
                     Row("Throughput and efficiency"),
                     Panel("timeseries", "Step time p50 / p95",
                           [Target(quantile(0.5, step_buckets), "p50", exemplar=True),
                            Target(quantile(0.95, step_buckets), "p95", exemplar=True)],
                           m.unit(M.RL_STEP_DURATION), links=trace_links(STEP_SPAN, scope=STEP_SPAN),
                           note="Click a point to open the steps at least that slow in Jaeger or Tempo."),
                     Panel("timeseries", "Tokens / s and samples / s",
                           [Target(f"max({m.sel(M.RL_THROUGHPUT_TOKENS)})", "tokens/s"),
                            Target(f"max({m.sel(M.RL_THROUGHPUT_SAMPLES)})", "samples/s", unit=m.unit(M.RL_THROUGHPUT_SAMPLES))],
                           m.unit(M.RL_THROUGHPUT_TOKENS)),
                     Panel("timeseries", "MFU over time", [Target(f"avg {by(A.RL_MODEL_ROLE)} ({m.sel(M.RL_MFU)})",
                                                                  legend(A.RL_MODEL_ROLE))], m.unit(M.RL_MFU)),
                     Panel("timeseries", "Pipeline bubble by cluster",
                           [Target(f"max {by(A.RL_CLUSTER)} ({m.sel(M.RL_PIPELINE_BUBBLE_RATIO, CLUSTER)})", legend(A.RL_CLUSTER))],
                           m.unit(M.RL_PIPELINE_BUBBLE_RATIO), min=0, max=1),
                     *_rollout_latency(m),
                 ], tags=("timeline", "performance"))


def rank_heatmap(m: Metrics) -> Board:
    run_scope = RUN  # balance values come from the measuring process, whatever its own rank

    def per_rank(metric: str) -> Target:
        expr = f"max {by(A.RL_MEASURED_RANK)} ({m.sel(metric, *MEASURED_RANK, scope=run_scope)})"
        return Target(expr, legend(A.RL_MEASURED_RANK, prefix="rank "))

    def heat(title: str, metric: str) -> Panel:
        return Panel("heatmap", title, [per_rank(metric)], m.unit(metric), y_unit="none",
                     note="One row per rank (rl.measured_rank): a row darker than the others is the rank that holds the step back.")

    summary = one_of((A.RlStatisticValues.MAX, A.RlStatisticValues.MEAN, A.RlStatisticValues.MIN, A.RlStatisticValues.MINMAX_DIFF))
    return Board("rank-heatmap", "otel-rl / Per-rank heatmap",
                 "Load balance across ranks: tokens, active, idle and communication time per rank "
                 "(rl.measured_rank), and the straggler.",
                 [
                     Row("Per rank"),
                     heat("Tokens per rank", M.RL_RANK_TOKENS),
                     heat("Active time per rank", M.RL_RANK_ACTIVE_TIME),
                     heat("Idle time per rank", M.RL_RANK_IDLE_TIME),
                     heat("Communication time per rank", M.RL_RANK_COMMUNICATION_TIME),
                     Panel("bargauge", "Tokens per rank (latest)", [Target(per_rank(M.RL_RANK_TOKENS).expr,
                                                                        per_rank(M.RL_RANK_TOKENS).legend, instant=True)],
                           m.unit(M.RL_RANK_TOKENS), w=8),
                     Panel("timeseries", "Active / idle / communication time by rank",
                           [Target(per_rank(M.RL_RANK_ACTIVE_TIME).expr, "active " + per_rank(M.RL_RANK_ACTIVE_TIME).legend),
                            Target(per_rank(M.RL_RANK_IDLE_TIME).expr, "idle " + per_rank(M.RL_RANK_IDLE_TIME).legend),
                            Target(per_rank(M.RL_RANK_COMMUNICATION_TIME).expr,
                                   "communication " + per_rank(M.RL_RANK_COMMUNICATION_TIME).legend)],
                           m.unit(M.RL_RANK_ACTIVE_TIME), w=16),
                     Row("Straggler"),
                     Panel("stat", "Straggler rank", [Target(f"max({m.sel(M.RL_STRAGGLER_RANK, scope=run_scope)})", "rank")],
                           m.unit(M.RL_STRAGGLER_RANK), w=6, h=6),
                     Panel("stat", "Straggler margin", [Target(f"max({m.sel(M.RL_STRAGGLER_MARGIN, scope=run_scope)})", "margin")],
                           m.unit(M.RL_STRAGGLER_MARGIN), w=6, h=6),
                     Panel("timeseries", "Straggler rank and margin over time",
                           [Target(f"max({m.sel(M.RL_STRAGGLER_MARGIN, scope=run_scope)})", "margin"),
                            Target(f"max({m.sel(M.RL_STRAGGLER_RANK, scope=run_scope)})", "straggler rank",
                                   unit=m.unit(M.RL_STRAGGLER_RANK))],
                           m.unit(M.RL_STRAGGLER_MARGIN), h=6),
                     Panel("timeseries", "Token imbalance across ranks",
                           [Target(f"max {by(STAT)} ({m.sel(M.RL_RANK_TOKENS, match(STAT, summary), scope=run_scope)})",
                                   legend(STAT))], m.unit(M.RL_RANK_TOKENS),
                           note="max / mean / min over ranks and their spread (minmax_diff): dynamic batching out of balance."),
                     Panel("timeseries", "Async queue depth",
                           [Target(f"max {by(A.RL_QUEUE_NAME)} ({m.sel(M.RL_QUEUE_DEPTH)})", legend(A.RL_QUEUE_NAME))],
                           m.unit(M.RL_QUEUE_DEPTH)),
                 ], tags=("load-balance",))


def memory_timeline(m: Metrics) -> Board:
    gpu = lambda metric, *extra: m.sel(metric, DEVICE, *extra)  # noqa: E731
    mem = M.RL_GPU_MEMORY_USAGE
    kinds = lambda *k: match(A.RL_MEMORY_KIND, one_of(k))  # noqa: E731
    K = A.RlMemoryKindValues
    snapshot = (*DEVICE_LABELS, A.RL_CLUSTER, A.RL_STAGE, A.RL_MEMORY_WHEN, A.RL_MEMORY_STATE)
    host = (A.RL_CLUSTER, A.RL_STAGE, A.RL_MEMORY_WHEN)
    gpu_note = "GPU only: from torch.cuda's allocator at stage boundaries; empty on a CPU-only run."
    return Board("memory-timeline", "otel-rl / Memory timeline",
                 "Allocated, reserved, KV-cache and activation peaks per device and stage phase, and fragmentation; "
                 "host memory per stage.",
                 [
                     Row("GPU memory at stage boundaries"),
                     Panel("timeseries", "Allocated and reserved by device",
                           [Target(f"max {by(*DEVICE_LABELS, A.RL_MEMORY_KIND)} ({gpu(mem, CLUSTER, kinds(K.ALLOCATED, K.RESERVED))})",
                                   legend(A.RL_MEMORY_KIND, prefix=DEVICE_LEGEND + " "))],
                           m.unit(mem), note=gpu_note),
                     Panel("timeseries", "Allocated by stage and phase (start / end, onload / offload)",
                           [Target(f"max {by(*snapshot)} ({gpu(mem, CLUSTER, kinds(K.ALLOCATED))})",
                                   legend(A.RL_STAGE, A.RL_MEMORY_WHEN, A.RL_MEMORY_STATE, prefix=DEVICE_LEGEND + " "))],
                           m.unit(mem), note=gpu_note),
                     Panel("timeseries", "Peak allocated / reserved by stage",
                           [Target(f"max {by(*DEVICE_LABELS, A.RL_STAGE, A.RL_MEMORY_KIND)} "
                                   f"({gpu(mem, CLUSTER, kinds(K.MAX_ALLOCATED, K.MAX_RESERVED))})",
                                   legend(A.RL_STAGE, A.RL_MEMORY_KIND, prefix=DEVICE_LEGEND + " "))], m.unit(mem), note=gpu_note),
                     Panel("timeseries", "Peak memory as a share of the device",
                           [Target(f"max {by(*DEVICE_LABELS, A.RL_MEMORY_KIND)} ({gpu(M.RL_GPU_MEMORY_UTILIZATION, CLUSTER)})",
                                   legend(A.RL_MEMORY_KIND, prefix=DEVICE_LEGEND + " "))],
                           m.unit(M.RL_GPU_MEMORY_UTILIZATION), thresholds=(0.9,), min=0, max=1,
                           note=gpu_note + " Reserved near the device's size is the memory-risk alert's first half."),
                     Panel("timeseries", "Fragmentation (1 - allocated / reserved)",
                           [Target(f"max {by(*DEVICE_LABELS, A.RL_STAGE)} ({gpu(M.RL_GPU_MEMORY_FRAGMENTATION)})",
                                   legend(A.RL_STAGE, prefix=DEVICE_LEGEND + " "))],
                           m.unit(M.RL_GPU_MEMORY_FRAGMENTATION), min=0, max=1,
                           note=gpu_note + " A growing gap between reserved and allocated is the alert's second half."),
                     Panel("timeseries", "Activation peak by stage",
                           [Target(f"max {by(*DEVICE_LABELS, A.RL_STAGE)} ({gpu(M.RL_GPU_MEMORY_ACTIVATION_PEAK)})",
                                   legend(A.RL_STAGE, prefix=DEVICE_LEGEND + " "))], m.unit(M.RL_GPU_MEMORY_ACTIVATION_PEAK), note=gpu_note),
                     Panel("timeseries", "KV-cache and communication-buffer peaks",
                           [Target(f"max {by(*DEVICE_LABELS)} ({gpu(M.RL_GPU_MEMORY_KV_CACHE_PEAK)})",
                                   "KV cache " + DEVICE_LEGEND),
                            Target(f"max {by(*DEVICE_LABELS)} ({gpu(M.RL_GPU_MEMORY_COMM_BUFFER_PEAK)})",
                                   "communication buffers " + DEVICE_LEGEND)],
                           m.unit(M.RL_GPU_MEMORY_KV_CACHE_PEAK), w=24, h=7),
                     Row("Host memory"),
                     Panel("timeseries", "Process RSS by stage (start / end)",
                           [Target(f"max {by(*host)} ({m.sel(M.PROCESS_MEMORY_USAGE, CLUSTER)})", legend(*host, prefix="RSS "))],
                           m.unit(M.PROCESS_MEMORY_USAGE)),
                     Panel("timeseries", "Process virtual memory by stage (start / end)",
                           [Target(f"max {by(*host)} ({m.sel(M.PROCESS_MEMORY_VIRTUAL, CLUSTER)})", legend(*host, prefix="virtual "))],
                           m.unit(M.PROCESS_MEMORY_VIRTUAL)),
                 ], tags=("memory",))


def training_stability(m: Metrics) -> Board:
    full: dict[str, Any] = dict(w=24, h=6)
    R = A.RlStatisticValues
    clip_stat = match(STAT, one_of((R.MEAN,)) + "|")  # the mean where a statistic is given, else the value
    return Board("training-stability", "otel-rl / Training stability",
                 "Reward, KL, entropy, grad norm and clip fraction on one time axis (shared crosshair): a KL spike "
                 "with a grad-norm spike and an entropy collapse is the divergence pattern.",
                 [
                     Panel("timeseries", "Reward and score",
                           [_stats(m, M.RL_REWARD),
                            Target(f"avg({m.sel(M.RL_SCORE, eq(STAT, enum_value(R.MEAN)))})", "score mean")],
                           m.unit(M.RL_REWARD), **full),
                     Panel("timeseries", "KL divergence",
                           [Target(f"avg {by(A.RL_POLICY, A.RL_KL_ESTIMATOR)} ({m.sel(M.RL_POLICY_KL)})",
                                   legend(A.RL_POLICY, A.RL_KL_ESTIMATOR, prefix="KL ")),
                            Target(f"avg {by(A.RL_MODEL_ROLE)} "
                                   f"({m.sel(M.RL_LOSS, eq(A.RL_LOSS_TYPE, enum_value(A.RlLossTypeValues.KL)))})",
                                   legend(A.RL_MODEL_ROLE, prefix="KL loss "))],
                           m.unit(M.RL_POLICY_KL), **full),
                     Panel("timeseries", "Entropy", [_stats(m, M.RL_POLICY_ENTROPY)], m.unit(M.RL_POLICY_ENTROPY), **full,
                           note="A collapse towards 0 means the policy stopped exploring."),
                     Panel("timeseries", "Grad norm",
                           [Target(f"avg {by(A.RL_MODEL_ROLE)} ({m.sel(M.RL_GRAD_NORM)})", legend(A.RL_MODEL_ROLE))],
                           m.unit(M.RL_GRAD_NORM), **full),
                     Panel("timeseries", "Clip fraction",
                           [Target(f"avg {by(A.RL_CLIP_KIND)} ({m.sel(M.RL_CLIP_FRACTION, clip_stat)})", legend(A.RL_CLIP_KIND))],
                           m.unit(M.RL_CLIP_FRACTION), min=0, max=1, **full),
                     Panel("timeseries", "Training-inference mismatch (rollout engine vs trainer log-probs)",
                           [Target(f"max {by(A.RL_MODEL_ROLE, A.RL_KL_ESTIMATOR)} ({m.sel(M.RL_TRAIN_INFER_KL)})",
                                   legend(A.RL_MODEL_ROLE, A.RL_KL_ESTIMATOR, prefix="KL ")),
                            Target(f"max {by(A.RL_MODEL_ROLE)} "
                                   f"({m.sel(M.RL_TRAIN_INFER_LOGPROB_ABS_DIFF, eq(STAT, enum_value(R.MEAN)))})",
                                   legend(A.RL_MODEL_ROLE, prefix="mean |log-prob gap| ")),
                            Target(f"max {by(A.RL_MODEL_ROLE)} ({m.sel(M.RL_TRAIN_INFER_NONFINITE_RATIO)})",
                                   legend(A.RL_MODEL_ROLE, prefix="non-finite share "))],
                           m.unit(M.RL_TRAIN_INFER_KL), w=12, h=6,
                           note="Matched engines sit near 0.001; a growing gap biases every update "
                                "(alert RLTrainInferMismatch). Importance-ratio tails: rl.train_infer.importance_ratio."),
                     Panel("timeseries", "Importance ratio trainer / engine (min / mean / max)",
                           [_stats(m, M.RL_TRAIN_INFER_IMPORTANCE_RATIO, extra=(A.RL_MODEL_ROLE,))],
                           m.unit(M.RL_TRAIN_INFER_IMPORTANCE_RATIO), w=12, h=6),
                     Panel("timeseries", "Learning rate",
                           [Target(f"avg {by(A.RL_MODEL_ROLE)} ({m.sel(M.RL_LEARNING_RATE)})", legend(A.RL_MODEL_ROLE))],
                           m.unit(M.RL_LEARNING_RATE), w=12, h=6),
                     Panel("timeseries", "Validation score", [_stats(m, M.RL_VALIDATION_SCORE)],
                           m.unit(M.RL_VALIDATION_SCORE), w=12, h=6),
                 ], tags=("stability",))


def data_quality(m: Metrics) -> Board:
    def distribution(title: str, metric: str) -> Panel:
        buckets = m.sel(metric, suffix="_bucket")
        return Panel("heatmap", title, [Target(f"sum by (le) ({increase(buckets)})", "{{le}}", heatmap=True)],
                     OBSERVATIONS, y_unit=m.unit(metric),
                     note="Samples per bucket in each interval: the whole distribution, not only its mean.")

    def quantiles(title: str, metric: str) -> Panel:
        buckets = m.sel(metric, suffix="_bucket")
        return Panel("timeseries", title, [Target(quantile(q, buckets), f"p{int(q * 100)}") for q in (0.1, 0.5, 0.9)],
                     m.unit(metric))

    mismatches = [
        Target(f"sum {by(A.RL_STAGE)} ({grown(m.sel(M.RL_SHAPE_LEDGER_MISMATCHES))})", legend(A.RL_STAGE, prefix="shape mismatches ")),
        Target(f"sum {by(A.RL_STAGE)} ({grown(m.sel(M.RL_BATCH_ID_MISALIGNED))})", legend(A.RL_STAGE, prefix="id misaligned ")),
        Target(f"sum {by(A.RL_STAGE)} ({grown(m.sel(M.RL_BATCH_TOKEN_MISALIGNED))})", legend(A.RL_STAGE, prefix="token misaligned ")),
    ]
    return Board("data-quality", "otel-rl / Data quality",
                 "Prompt and response length distributions, truncation, aborts, reward distribution, and the "
                 "correctness checks (shape ledger, alignment, masks, NaN / Inf).",
                 [
                     Row("Lengths"),
                     Panel("timeseries", "Prompt length (mean / max / min)", [_stats(m, M.RL_PROMPT_LENGTH)], m.unit(M.RL_PROMPT_LENGTH)),
                     Panel("timeseries", "Response length (mean / max / min)", [_stats(m, M.RL_RESPONSE_LENGTH)],
                           m.unit(M.RL_RESPONSE_LENGTH)),
                     distribution("Prompt length distribution", M.RL_SAMPLE_PROMPT_LENGTH),
                     distribution("Response length distribution", M.RL_SAMPLE_RESPONSE_LENGTH),
                     Row("Truncation and aborts"),
                     Panel("timeseries", "Response clip ratio", [Target(f"avg({m.sel(M.RL_RESPONSE_CLIPPED_RATIO)})", "clipped")],
                           m.unit(M.RL_RESPONSE_CLIPPED_RATIO), w=8, thresholds=(0.3,), min=0, max=1,
                           note="The red line is 0.3, above which a GRPO run's lengths and KL tend to blow up together."),
                     Panel("timeseries", "Aborted and timed-out requests",
                           [Target(f"avg({m.sel(M.RL_ROLLOUT_ABORT_RATIO)})", "aborted"),
                            Target(f"avg({m.sel(M.RL_ROLLOUT_TIMEOUT_RATIO)})", "timed out")],
                           m.unit(M.RL_ROLLOUT_ABORT_RATIO), w=8, min=0, max=1),
                     Panel("timeseries", "Valid samples",
                           [Target(f"avg({m.sel(M.RL_BATCH_VALID_RATIO)})", "valid share"),
                            Target(f"sum({m.sel(M.RL_BATCH_VALID_SAMPLES)})", "valid samples (all ranks)",
                                   unit=m.unit(M.RL_BATCH_VALID_SAMPLES)),
                            Target(f"sum({m.sel(M.RL_BATCH_SAMPLES)})", "batch size (all ranks)", unit=m.unit(M.RL_BATCH_SAMPLES))],
                           m.unit(M.RL_BATCH_VALID_RATIO), w=8, min=0, max=1),
                     Row("Rewards"),
                     distribution("Reward distribution", M.RL_SAMPLE_REWARD),
                     quantiles("Reward p10 / p50 / p90", M.RL_SAMPLE_REWARD),
                     Panel("timeseries", "Sample loss weights", [_stats(m, M.RL_SAMPLE_WEIGHT)], m.unit(M.RL_SAMPLE_WEIGHT)),
                     Panel("timeseries", "Reward function exceptions",
                           [Target(f"sum {by(A.RL_REWARD_FUNCTION)} ({grown(m.sel(M.RL_REWARD_EXCEPTIONS))})",
                                   legend(A.RL_REWARD_FUNCTION))], m.unit(M.RL_REWARD_EXCEPTIONS)),
                     Row("Correctness"),
                     Panel("timeseries", "Shape-ledger mismatches and misaligned samples", mismatches,
                           m.unit(M.RL_SHAPE_LEDGER_MISMATCHES), w=12,
                           note="Each is new occurrences per interval; any non-zero value is a bug in the data path."),
                     Panel("timeseries", "NaN / Inf values in checked tensors",
                           [Target(f"sum {by(A.RL_TENSOR_NAME, A.RL_NONFINITE_KIND)} ({grown(m.sel(M.RL_TENSOR_NONFINITE))})",
                                   legend(A.RL_TENSOR_NAME, A.RL_NONFINITE_KIND))], m.unit(M.RL_TENSOR_NONFINITE), w=12),
                     Panel("timeseries", "Response mask ratio by stage",
                           [Target(f"avg {by(A.RL_STAGE)} ({m.sel(M.RL_RESPONSE_MASK_RATIO)})", legend(A.RL_STAGE))],
                           m.unit(M.RL_RESPONSE_MASK_RATIO), min=0, max=1),
                     Panel("timeseries", "Log-prob tensor shape by stage",
                           [Target(f"avg {by(A.RL_STAGE, A.RL_TENSOR_DIM)} ({m.sel(M.RL_LOGPROB_SHAPE)})",
                                   legend(A.RL_STAGE, A.RL_TENSOR_DIM, prefix="dim "))], m.unit(M.RL_LOGPROB_SHAPE)),
                 ], tags=("data",))


def rollout(m: Metrics) -> Board:
    def latency(title: str, metric: str, qs: Sequence[float] = (0.5, 0.95)) -> Panel:
        buckets = m.sel(metric, suffix="_bucket")
        return Panel("timeseries", title, [Target(quantile(q, buckets), f"p{int(q * 100)}") for q in qs], m.unit(metric), w=8)

    T = A.GenAiTokenTypeValues
    tokens = lambda kind: f"sum({rate(m.sel(M.RL_ROLLOUT_TOKENS, eq(A.GEN_AI_TOKEN_TYPE, enum_value(kind))))})"  # noqa: E731
    generate = eq(A.RL_STAGE, enum_value(S.GENERATE))
    generate_time = mean_per_call(m.sel(M.RL_STAGE_DURATION, CLUSTER, generate, TOTAL, suffix="_sum"),
                                  m.sel(M.RL_STAGE_DURATION, CLUSTER, generate, TOTAL, suffix="_count"), (A.RL_CLUSTER,))
    micro = m.sel(M.RL_LOGPROB_MICRO_BATCH_TOKENS, suffix="_bucket")
    return Board("rollout", "otel-rl / Rollout and inference",
                 "The rollout engine (TTFT, TPOT, request latency, prefill / decode tokens, KV cache, aborts and "
                 "timeouts), the reward and log-prob stages, and async staleness.",
                 [
                     Row("Latency"),
                     latency("Time to first token", M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN),
                     latency("Time per output token", M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN),
                     latency("Request latency", M.GEN_AI_SERVER_REQUEST_DURATION, (0.5, 0.95, 0.99)),
                     Row("Tokens, cache and failures"),
                     Panel("timeseries", "Prefill and decode tokens / s",
                           [Target(tokens(T.INPUT), "prefill (input)"), Target(tokens(T.OUTPUT), "decode (output)")],
                           m.rate_unit(M.RL_ROLLOUT_TOKENS), w=8),
                     Panel("timeseries", "KV-cache utilization", [Target(f"avg({m.sel(M.RL_ROLLOUT_KV_CACHE_UTILIZATION)})", "in use")],
                           m.unit(M.RL_ROLLOUT_KV_CACHE_UTILIZATION), w=8, min=0, max=1),
                     Panel("timeseries", "Abort and timeout ratios",
                           [Target(f"avg({m.sel(M.RL_ROLLOUT_ABORT_RATIO)})", "aborted"),
                            Target(f"avg({m.sel(M.RL_ROLLOUT_TIMEOUT_RATIO)})", "timed out")],
                           m.unit(M.RL_ROLLOUT_ABORT_RATIO), w=8, min=0, max=1),
                     Panel("timeseries", "Rollout stage time per call", [Target(generate_time, legend(A.RL_CLUSTER))],
                           m.unit(M.RL_STAGE_DURATION), w=24, h=6,
                           links=trace_links(N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", enum_value(S.GENERATE)),
                                             scope="rollout")),
                     Row("Reward stage"),
                     latency("Reward latency", M.RL_REWARD_DURATION),
                     Panel("timeseries", "Reward batch tokens and reward throughput",
                           [Target(f"avg({m.sel(M.RL_REWARD_BATCH_TOKENS)})", "batch tokens"),
                            Target(f"avg({m.sel(M.RL_REWARD_THROUGHPUT)})", "tokens scored / s", unit=m.unit(M.RL_REWARD_THROUGHPUT))],
                           m.unit(M.RL_REWARD_BATCH_TOKENS), w=8),
                     Panel("timeseries", "Tokens per log-prob micro batch",
                           [Target(quantile(q, micro, [A.RL_STAGE]), legend(A.RL_STAGE, prefix=f"p{int(q * 100)} ")) for q in (0.5, 0.95)],
                           m.unit(M.RL_LOGPROB_MICRO_BATCH_TOKENS), w=8),
                     Row("Async rollout"),
                     Panel("timeseries", "Policy lag and stale samples",
                           [_stats(m, M.RL_ASYNC_POLICY_LAG),
                            Target(f"avg({m.sel(M.RL_ASYNC_STALE_SAMPLE_RATIO)})", "stale share",
                                   unit=m.unit(M.RL_ASYNC_STALE_SAMPLE_RATIO))],
                           m.unit(M.RL_ASYNC_POLICY_LAG)),
                     Panel("heatmap", "Policy lag distribution",
                           [Target(f"sum by (le) ({increase(m.sel(M.RL_SAMPLE_POLICY_LAG, suffix='_bucket'))})", "{{le}}", heatmap=True)],
                           OBSERVATIONS, y_unit=m.unit(M.RL_SAMPLE_POLICY_LAG)),
                 ], tags=("rollout", "inference"))


def algorithm(m: Metrics) -> Board:
    role = lambda r: eq(A.RL_MODEL_ROLE, enum_value(r))  # noqa: E731
    Role = A.RlModelRoleValues
    return Board("algorithm", "otel-rl / Algorithm",
                 "Actor and critic losses, importance ratios, advantages, returns, values, log-probs and the "
                 "validation score.",
                 [
                     Row("Losses"),
                     Panel("timeseries", "Actor losses",
                           [Target(f"avg {by(A.RL_LOSS_TYPE)} ({m.sel(M.RL_LOSS, role(Role.ACTOR))})", legend(A.RL_LOSS_TYPE))],
                           m.unit(M.RL_LOSS)),
                     Panel("timeseries", "Critic loss and error",
                           [Target(f"avg {by(A.RL_LOSS_TYPE)} ({m.sel(M.RL_LOSS, role(Role.CRITIC))})", legend(A.RL_LOSS_TYPE, prefix="loss ")),
                            Target(f"avg({m.sel(M.RL_CRITIC_ERROR)})", "error (MSE)")], m.unit(M.RL_LOSS)),
                     Row("Policy"),
                     Panel("timeseries", "Importance ratio (mean / max / min)", [_stats(m, M.RL_POLICY_RATIO)], m.unit(M.RL_POLICY_RATIO)),
                     Panel("timeseries", "Log-probs under the old and reference policies",
                           [Target(f"avg {by(A.RL_POLICY)} "
                                   f"({m.sel(M.RL_LOGPROB, match(STAT, enum_value(A.RlStatisticValues.MEAN) + '|'))})",
                                   legend(A.RL_POLICY))], m.unit(M.RL_LOGPROB)),
                     Row("Advantages, returns and values"),
                     Panel("timeseries", "Advantages (mean / max / min)", [_stats(m, M.RL_ADVANTAGE)], m.unit(M.RL_ADVANTAGE), w=8),
                     Panel("heatmap", "Advantage distribution",
                           [Target(f"sum by (le) ({increase(m.sel(M.RL_SAMPLE_ADVANTAGE, suffix='_bucket'))})", "{{le}}", heatmap=True)],
                           OBSERVATIONS, y_unit=m.unit(M.RL_SAMPLE_ADVANTAGE), w=16),
                     Panel("timeseries", "Returns (mean / max / min)", [_stats(m, M.RL_RETURN)], m.unit(M.RL_RETURN), w=8),
                     Panel("timeseries", "Values (mean / max / min)", [_stats(m, M.RL_VALUE)], m.unit(M.RL_VALUE), w=8),
                     Panel("timeseries", "Critic predictions",
                           [Target(f"avg {by(A.RL_POLICY)} ({m.sel(M.RL_CRITIC_PREDICTION)})", legend(A.RL_POLICY))],
                           m.unit(M.RL_CRITIC_PREDICTION), w=8),
                     Row("Scores"),
                     Panel("timeseries", "Training score (mean / max / min)", [_stats(m, M.RL_SCORE)], m.unit(M.RL_SCORE)),
                     Panel("timeseries", "Validation score (mean / max / min)", [_stats(m, M.RL_VALIDATION_SCORE)],
                           m.unit(M.RL_VALIDATION_SCORE)),
                 ], tags=("algorithm",))


def system(m: Metrics) -> Board:
    gpu = lambda metric: f"max {by(*DEVICE_LABELS)} ({m.sel(metric, DEVICE)})"  # noqa: E731
    gpu_legend = DEVICE_LEGEND
    nvml = "GPU only: read from NVML; empty on a CPU-only run."
    return Board("system", "otel-rl / System",
                 "GPU utilization, memory, power and temperature per device; process memory and CPU per rank.",
                 [
                     Row("GPUs"),
                     Panel("timeseries", "GPU utilization", [Target(gpu(M.HW_GPU_UTILIZATION), gpu_legend)],
                           m.unit(M.HW_GPU_UTILIZATION), w=8, min=0, max=1, note=nvml),
                     Panel("timeseries", "SM activity", [Target(gpu(M.RL_SM_ACTIVITY), gpu_legend)], m.unit(M.RL_SM_ACTIVITY),
                           w=8, min=0, max=1, note="GPU only: from DCGM / NVML sampling; empty on a CPU-only run."),
                     Panel("timeseries", "GPU memory used and size",
                           [Target(gpu(M.HW_GPU_MEMORY_USAGE), "used " + DEVICE_LEGEND),
                            Target(gpu(M.HW_GPU_MEMORY_LIMIT), "size " + DEVICE_LEGEND)],
                           m.unit(M.HW_GPU_MEMORY_USAGE), w=8, note=nvml),
                     Panel("timeseries", "GPU power", [Target(gpu(M.HW_POWER), gpu_legend)], m.unit(M.HW_POWER), note=nvml),
                     Panel("timeseries", "GPU temperature", [Target(gpu(M.HW_TEMPERATURE), gpu_legend)], m.unit(M.HW_TEMPERATURE),
                           note=nvml),
                     Row("Processes"),
                     Panel("timeseries", "Process CPU utilization by rank",
                           [Target(f"max {by(A.RL_RANK)} ({m.sel(M.PROCESS_CPU_UTILIZATION)})", legend(A.RL_RANK, prefix="rank "))],
                           m.unit(M.PROCESS_CPU_UTILIZATION), w=8),
                     Panel("timeseries", "Process memory by rank (latest stage snapshot)",
                           [Target(f"max {by(A.RL_RANK)} ({m.sel(M.PROCESS_MEMORY_USAGE)})", legend(A.RL_RANK, prefix="RSS rank ")),
                            Target(f"max {by(A.RL_RANK)} ({m.sel(M.PROCESS_MEMORY_VIRTUAL)})", legend(A.RL_RANK, prefix="virtual rank "))],
                           m.unit(M.PROCESS_MEMORY_USAGE), w=8),
                     Panel("timeseries", "Samples processed / s",
                           [Target(f"sum({rate(m.sel(M.RL_PROGRESS_SAMPLES))})", "samples/s")], m.rate_unit(M.RL_PROGRESS_SAMPLES), w=8),
                 ], tags=("system",))


BOARDS: tuple[Callable[[Metrics], Board], ...] = (
    e2e_timeline, rank_heatmap, memory_timeline, training_stability, data_quality, rollout, algorithm, system,
)


def boards(registry: Registry) -> list[Board]:
    """Every board, built over the registry's metrics."""
    m = Metrics(registry)
    return [make(m) for make in BOARDS]
