"""The alert rules in their neutral form: thresholds and windows, the PromQL pieces they are built
from, and one builder per rule (``build_groups`` gathers them into rule groups).

``otel_rl.ops.alerts`` renders these rules as Prometheus / vmalert and Grafana files; see its
docstring for what each rule watches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from otel_rl.codegen.generate import prometheus_name
from otel_rl.ops.promql import label
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

FAST_TIME_SCALE = 60  # the variant the end-to-end test runs against the demo (1h -> 1m, 10m -> 10s)

# Durations of the standard rules, in seconds. Real RL steps take minutes: the recent window holds
# the last few steps, the baseline the hour before them (offset by the recent window so a spike is
# never part of its own baseline).
INTERVAL_S = 60
RECENT_S = 600
BASELINE_S = 3600
SPIKE_WINDOW_S = 120  # two evaluations: a one-sample spike between evaluations is still seen

# Divergence (composite; as in the 6000-step GRPO analysis: KL spike + grad-norm explosion + entropy
# collapse). Factors against the baseline, floors so a tiny baseline cannot make noise look big.
KL_FACTOR, KL_FLOOR = 5, 1.0  # healthy KL is 0.01-5 (6000-step GRPO analysis); its spikes reached 6-19
GRAD_NORM_FACTOR, GRAD_NORM_FLOOR = 10, 1.0  # that analysis: 2-5e4 normally, 1e7-5e7 when exploding
ENTROPY_FACTOR, ENTROPY_MIN_CHANGE = 3, 0.1  # collapse below 1/3 or jump above 3x, by > 0.1 nats
KL_QUANTILE, ENTROPY_QUANTILE = 0.9, 0.5  # p90 baseline ignores a short earlier spike

# The 6000-step GRPO analysis: "kl > 10 or clipped_ratio > 0.3: snapshot and roll back".
KL_THRESHOLD = 10
CLIPPED_RATIO_THRESHOLD = 0.3

# The training-inference mismatch (KL between the rollout engine's and the trainer's token
# distributions): public verl runs with matched engines log about 0.001, and public monitoring
# notes for verl's rollout correction alarm above 0.1. Growth alone counts from 0.01 up, at 5x.
TRAIN_INFER_KL_THRESHOLD = 0.1
TRAIN_INFER_KL_FACTOR, TRAIN_INFER_KL_FLOOR = 5, 0.01
# Rollout ratios (0..1) rising: by 10 points and by half again over the baseline average.
RATIO_RISE_MIN, RATIO_RISE_FACTOR = 0.1, 1.5
# Tokens per step: the recent average twice the baseline median and 1000 tokens more.
TOKENS_FACTOR, TOKENS_MIN_RISE = 2, 1000
# GPU memory: peak reserved above 90% of the device while the reserved - allocated gap grows by
# a quarter and by at least 1 GiB over its baseline.
MEMORY_NEAR_LIMIT, GAP_FACTOR, GAP_MIN_RISE_BYTES = 0.9, 1.25, 2**30
# Ranks: the slowest rank 30% (and 2 s) above the median rank; the busiest rank's tokens 50% (and
# 1000 tokens) above the mean rank.
ACTIVE_TIME_FACTOR, ACTIVE_TIME_MIN_GAP_S = 1.3, 2
RANK_TOKENS_FACTOR, RANK_TOKENS_MIN_GAP = 1.5, 1000

SEVERITIES = ("critical", "warning")


def metric(name: str) -> str:
    """The Prometheus name of registry metric ``name``."""
    mdef = METRICS[name]
    return prometheus_name(name, mdef.unit, mdef.instrument)


RUN_LABELS = (label(A.RL_RUN_ID), label(A.SERVICE_NAME))


def _by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)})"


def _number(value: float) -> str:
    """A threshold as PromQL reads it and people write it: ``1.0`` -> ``1``, ``0.3`` -> ``0.3``."""
    return f"{value:g}"


@dataclass(frozen=True)
class Timing:
    """Durations of one variant: every standard duration divided by ``scale``."""

    scale: int = 1

    def seconds(self, standard_s: int) -> int:
        if standard_s % self.scale:
            raise ValueError(f"time scale {self.scale} does not divide {standard_s} s")
        return standard_s // self.scale

    def __call__(self, standard_s: int) -> str:
        """The Prometheus duration of ``standard_s`` seconds in this variant (``10m``, ``20s``)."""
        return duration(self.seconds(standard_s))


def duration(seconds: int) -> str:
    """``3600`` -> ``1h``, ``600`` -> ``10m``, ``90`` -> ``1m30s``, ``0`` -> ``0s``."""
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def parse_duration(text: str) -> int:
    """Seconds of a Prometheus duration such as ``1h``, ``10m``, ``1m30s``."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    found = re.fullmatch(r"((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?", text)
    if not text or found is None:
        raise ValueError(f"not a duration: {text!r}")
    total = 0
    for unit, amount in zip("dhms", found.groups()[1::2]):
        total += int(amount or 0) * units[unit]
    return total


class Selector:
    """A series selector: a registry metric with label matchers."""

    def __init__(self, name: str, **matchers: str) -> None:
        self.metric = name
        self.matchers = {label(k): v for k, v in matchers.items()}

    def __str__(self) -> str:
        if not self.matchers:
            return metric(self.metric)
        inner = ", ".join(f'{k}="{v}"' for k, v in self.matchers.items())
        return f"{metric(self.metric)}{{{inner}}}"


@dataclass(frozen=True)
class Rule:
    """One alerting rule in its neutral form, rendered to both Prometheus and Grafana."""

    alert: str
    expr: str
    for_s: int
    severity: str
    category: str
    summary: str
    description: str
    runbook: str
    uid: str  # Grafana's rule uid: at most 40 letters, digits, - and _

    @property
    def labels(self) -> dict[str, str]:
        return {"severity": self.severity, "category": self.category}

    @property
    def annotations(self) -> dict[str, str]:
        return {"summary": self.summary, "description": self.description, "runbook": self.runbook}


@dataclass(frozen=True)
class Group:
    name: str
    interval_s: int
    rules: tuple[Rule, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------------------------------
# Expression pieces


def _agg(fn: str, inner: str, labels: Sequence[str] = RUN_LABELS) -> str:
    return f"{fn} {_by(labels)} ({inner})"


def _over(fn: str, sel: Selector, window: str, *, offset: str = "", quantile: float | None = None) -> str:
    shifted = f"{sel}[{window}]" + (f" offset {offset}" if offset else "")
    return f"{fn}_over_time({_number(quantile)}, {shifted})" if quantile is not None else f"{fn}_over_time({shifted})"


def _indent(text: str, spaces: int = 2) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line else line for line in text.splitlines())


def _both(first: str, second: str) -> str:
    """``(first and second)`` over identical label sets, laid out one condition per block."""
    return f"(\n{_indent(first)}\nand\n{_indent(second)}\n)"


def _signal(expr: str, name: str) -> str:
    """Tag a branch with ``signal="<metric>"`` so one alert per branch names what moved."""
    return f'label_replace(\n{_indent(expr)},\n  "signal", "{name}", "", ""\n)'


def _either(parts: Iterable[str]) -> str:
    return "\nor\n".join(parts)


def _spike(sel: Selector, ident: Sequence[str], t: Timing, factor: float, floor: float, quantile: float) -> str:
    """The recent max of ``sel`` above ``floor`` and above ``factor`` x its baseline quantile."""
    # per run and source, not per series: a restarted process has a new service_instance_id (a new
    # series with no baseline), and several ranks may report the same value
    by = (*RUN_LABELS, *ident)
    recent = _agg("max", _over("max", sel, t(RECENT_S)), by)
    base = _agg("max", _over("quantile", sel, t(BASELINE_S), offset=t(RECENT_S), quantile=quantile), by)
    return _both(f"{recent} > {_number(floor)}", f"{recent}\n  > {_number(factor)} * {base}")


# ---------------------------------------------------------------------------------------------
# The rules


def _divergence(t: Timing) -> Rule:
    kl_sources = [
        (Selector(M.RL_POLICY_KL), (label(A.RL_POLICY), label(A.RL_KL_ESTIMATOR))),
        (Selector(M.RL_LOSS, **{A.RL_LOSS_TYPE: A.RlLossTypeValues.KL.value}), (label(A.RL_MODEL_ROLE),)),
    ]
    kl = _agg("max", "\n" + _indent(_either(_spike(s, ident, t, KL_FACTOR, KL_FLOOR, KL_QUANTILE) for s, ident in kl_sources)) + "\n")
    grad_sel = Selector(M.RL_GRAD_NORM, **{A.RL_MODEL_ROLE: A.RlModelRoleValues.ACTOR.value})
    grad = _spike(grad_sel, (), t, GRAD_NORM_FACTOR, GRAD_NORM_FLOOR, KL_QUANTILE)
    ent_sel = Selector(M.RL_POLICY_ENTROPY, **{A.RL_STATISTIC: A.RlStatisticValues.MEAN.value})
    base = _agg("max", _over("quantile", ent_sel, t(BASELINE_S), offset=t(RECENT_S), quantile=ENTROPY_QUANTILE))
    low = _agg("min", _over("min", ent_sel, t(RECENT_S)))
    high = _agg("max", _over("max", ent_sel, t(RECENT_S)))
    collapse = _both(f"{low}\n  < {base} / {ENTROPY_FACTOR}", f"{low}\n  < {base} - {_number(ENTROPY_MIN_CHANGE)}")
    jump = _both(f"{high}\n  > {ENTROPY_FACTOR} * {base}", f"{high}\n  > {base} + {_number(ENTROPY_MIN_CHANGE)}")
    # a bad update usually collapses entropy (the policy turns deterministic); a jump (the policy
    # turns uniform) is the same instability the other way
    entropy = f"(\n{_indent(_either([collapse, jump]))}\n)"
    on = f"and on ({', '.join(RUN_LABELS)})"
    expr = f"{kl}\n{on}\n{grad}\n{on}\n{entropy}"
    recent, baseline = t(RECENT_S), t(BASELINE_S)
    return Rule(
        alert="RLTrainingDivergence",
        uid="otel-rl-divergence",
        expr=expr,
        for_s=t.seconds(120),
        severity="critical",
        category="stability",
        summary=(
            "Run {{ $labels.rl_run_id }} ({{ $labels.service_name }}) is diverging: KL, grad norm and "
            "entropy are anomalous together (KL now {{ $value | humanize }})"
        ),
        description=(
            f"Within the last {recent}, all three against the run's own baseline (the {baseline} before): "
            f"KL ({metric(M.RL_POLICY_KL)}, or {kl_sources[1][0]}) rose above {KL_FACTOR}x its p{int(KL_QUANTILE * 100)} "
            f"and above {_number(KL_FLOOR)}; the actor's gradient norm ({grad_sel}) above {GRAD_NORM_FACTOR}x its "
            f"p{int(KL_QUANTILE * 100)} and above {_number(GRAD_NORM_FLOOR)}; the mean token entropy ({ent_sel}) "
            f"fell below 1/{ENTROPY_FACTOR} of its median or rose above {ENTROPY_FACTOR}x it, by more than "
            f"{_number(ENTROPY_MIN_CHANGE)}. One of them alone is often noise; together they are the "
            "KL spike + gradient explosion + entropy collapse that precedes a reward and format collapse."
        ),
        runbook=(
            "Snapshot the run and roll back to the last good checkpoint; raise the KL coefficient (beta) or use "
            "an adaptive KL, set or lower max_grad_norm, lower the learning rate or lengthen its warmup. The "
            "stability dashboard shows the three together; the spike step's trace shows what it ran."
        ),
    )


def _kl_threshold(t: Timing) -> Rule:
    ref = Selector(M.RL_POLICY_KL, **{A.RL_POLICY: A.RlPolicyValues.REFERENCE.value})
    loss = Selector(M.RL_LOSS, **{A.RL_LOSS_TYPE: A.RlLossTypeValues.KL.value})
    window = t(SPIKE_WINDOW_S)
    expr = _agg("max", f"\n  {_over('max', ref, window)}\n  or\n  {_over('max', loss, window)}\n") + f" > {KL_THRESHOLD}"
    return Rule(
        alert="RLKLAboveThreshold",
        uid="otel-rl-kl-threshold",
        expr=expr,
        for_s=t.seconds(60),
        severity="critical",
        category="stability",
        summary=(
            "Run {{ $labels.rl_run_id }} ({{ $labels.service_name }}): KL to the reference model is "
            "{{ $value | humanize }}, above " + str(KL_THRESHOLD)
        ),
        description=(
            f"The largest KL to the reference model in the last {window} ({ref}, or the KL loss {loss} "
            f"that ROLL and verl log) is above {KL_THRESHOLD}. Healthy runs stay around 0.01-5; "
            "in the analysed GRPO run KL 6-19 came with reward and format collapse."
        ),
        runbook=(
            "Snapshot the run and roll back to a checkpoint before the spike; raise the KL coefficient (beta) "
            "or use an adaptive KL controller; lower the learning rate."
        ),
    )


def _clipped_threshold(t: Timing) -> Rule:
    sel = Selector(M.RL_RESPONSE_CLIPPED_RATIO)
    window = t(SPIKE_WINDOW_S)
    expr = _agg("max", _over("max", sel, window)) + f" > {_number(CLIPPED_RATIO_THRESHOLD)}"
    return Rule(
        alert="RLResponseClippedRatioAboveThreshold",
        uid="otel-rl-clipped-ratio-threshold",
        expr=expr,
        for_s=t.seconds(60),
        severity="critical",
        category="data_quality",
        summary=(
            "Run {{ $labels.rl_run_id }} ({{ $labels.service_name }}): {{ $value | humanizePercentage }} "
            f"of responses hit the length limit ({sel}), above {CLIPPED_RATIO_THRESHOLD:.0%}"
        ),
        description=(
            f"The share of responses truncated at the maximum completion length ({sel}) exceeded "
            f"{_number(CLIPPED_RATIO_THRESHOLD)} in the last {window}. Truncated responses lose their format "
            "and reward; a rising share usually follows a policy shift (check KL)."
        ),
        runbook=(
            "Snapshot and roll back if KL rose too; otherwise lower max_completion_length or penalise truncated "
            "responses in the reward, and add stop words / EOS handling."
        ),
    )


def _train_infer_mismatch(t: Timing) -> Rule:
    sel = Selector(M.RL_TRAIN_INFER_KL)
    recent_w, base_w = t(RECENT_S), t(BASELINE_S)
    above = f"{_agg('max', _over('max', sel, recent_w))} > {_number(TRAIN_INFER_KL_THRESHOLD)}"
    growing = _spike(sel, (), t, TRAIN_INFER_KL_FACTOR, TRAIN_INFER_KL_FLOOR, KL_QUANTILE)
    return Rule(
        alert="RLTrainInferMismatch",
        uid="otel-rl-train-infer-mismatch",
        expr=_agg("max", "\n" + _indent(_either([above, growing])) + "\n"),
        for_s=t.seconds(120),
        severity="warning",
        category="stability",
        summary=(
            "Run {{ $labels.rl_run_id }} ({{ $labels.service_name }}): the rollout engine and the trainer disagree "
            'on the sampled tokens (KL {{ $value | printf "%.3g" }})'
        ),
        description=(
            f"The largest KL between the rollout engine's and the trainer's token log-probs ({sel}) in the last "
            f"{recent_w} is above {_number(TRAIN_INFER_KL_THRESHOLD)}, or above {_number(TRAIN_INFER_KL_FLOOR)} and "
            f"{TRAIN_INFER_KL_FACTOR}x its p90 of the {base_w} before. Matched engines sit near 0.001; a growing gap "
            "biases every update that treats the rollout as on-policy and can precede a collapse."
        ),
        runbook=(
            "Check the weight sync to the rollout engine (a failed or partial sync), the engine's dtype and kernels "
            "against the trainer's, and recent engine upgrades; enable truncated importance sampling or rejection "
            "sampling (verl rollout_correction, AReaL's decoupled loss) while you look."
        ),
    )


def _inference_anomaly(t: Timing) -> Rule:
    sources = [Selector(M.RL_ROLLOUT_ABORT_RATIO), Selector(M.RL_ROLLOUT_TIMEOUT_RATIO), Selector(M.RL_RESPONSE_CLIPPED_RATIO)]
    recent_w, base_w = t(RECENT_S), t(BASELINE_S)
    branches = []
    for sel in sources:
        recent = _agg("max", _over("avg", sel, recent_w))
        base = _agg("max", _over("avg", sel, base_w, offset=recent_w))
        cond = _both(f"{recent}\n  > {_number(RATIO_RISE_MIN)} + {base}", f"{recent}\n  > {_number(RATIO_RISE_FACTOR)} * {base}")
        branches.append(_signal(cond, metric(sel.metric)))
    return Rule(
        alert="RLInferenceAnomaly",
        uid="otel-rl-inference-anomaly",
        expr=_either(branches),
        for_s=t.seconds(300),
        severity="warning",
        category="rollout",
        summary=(
            "Run {{ $labels.rl_run_id }} ({{ $labels.service_name }}): rollout {{ $labels.signal }} rising "
            "(now {{ $value | humanizePercentage }})"
        ),
        description=(
            f"Averaged over the last {recent_w}, the rollout's abort ratio ({metric(M.RL_ROLLOUT_ABORT_RATIO)}), "
            f"timeout ratio ({metric(M.RL_ROLLOUT_TIMEOUT_RATIO)}) or response clip ratio "
            f"({metric(M.RL_RESPONSE_CLIPPED_RATIO)}) - the one in the signal label - rose by more than "
            f"{_number(RATIO_RISE_MIN)} and to over {_number(RATIO_RISE_FACTOR)}x its average in the {base_w} before."
        ),
        runbook=(
            "Aborts / timeouts: check the inference engine (KV cache, preemption, request timeouts, a failing "
            "server). Clip ratio: responses getting longer; check KL and the length penalty."
        ),
    )


def _batch_runaway(t: Timing) -> Rule:
    sources = [Selector(M.RL_STEP_TOKENS), Selector(M.RL_RANK_TOKENS, **{A.RL_STATISTIC: A.RlStatisticValues.MAX.value})]
    recent_w, base_w = t(RECENT_S), t(BASELINE_S)
    branches = []
    for sel in sources:
        recent = _agg("max", _over("avg", sel, recent_w))
        base = _agg("max", _over("quantile", sel, base_w, offset=recent_w, quantile=0.5))
        cond = _both(f"{recent}\n  > {TOKENS_FACTOR} * {base}", f"{recent}\n  > {TOKENS_MIN_RISE} + {base}")
        branches.append(_signal(cond, metric(sel.metric)))
    return Rule(
        alert="RLDynamicBatchRunaway",
        uid="otel-rl-batch-runaway",
        expr=_either(branches),
        for_s=t.seconds(300),
        severity="warning",
        category="performance",
        summary=(
            "Run {{ $labels.rl_run_id }} ({{ $labels.service_name }}): tokens per step ({{ $labels.signal }}) "
            "jumped to {{ $value | humanize }}"
        ),
        description=(
            f"The average tokens per step over the last {recent_w} ({metric(M.RL_STEP_TOKENS)}, or the busiest "
            f"rank's {sources[1]}) is over {TOKENS_FACTOR}x the median of the {base_w} before and "
            f"{TOKENS_MIN_RISE} tokens more: dynamic batching is packing far more tokens per step."
        ),
        runbook=(
            "Check the dynamic-batching limits (max tokens per micro batch / per GPU) and response lengths; "
            "expect step time and memory to follow (memory timeline dashboard)."
        ),
    )


def _memory_risk(t: Timing) -> Rule:
    device = (*RUN_LABELS, label(A.HOST_NAME), label(A.RL_RANK), label(A.HW_ID), label(A.RL_CLUSTER), label(A.RL_STAGE))
    near = Selector(M.RL_GPU_MEMORY_UTILIZATION, **{A.RL_MEMORY_KIND: A.RlMemoryKindValues.MAX_RESERVED.value})
    reserved = Selector(M.RL_GPU_MEMORY_USAGE, **{A.RL_MEMORY_KIND: A.RlMemoryKindValues.RESERVED.value})
    allocated = Selector(M.RL_GPU_MEMORY_USAGE, **{A.RL_MEMORY_KIND: A.RlMemoryKindValues.ALLOCATED.value})
    recent_w, base_w = t(RECENT_S), t(BASELINE_S)
    kind = label(A.RL_MEMORY_KIND)

    def gap(offset: str) -> str:
        # avg is linear, so the average gap is the average reserved minus the average allocated
        window = base_w if offset else recent_w
        inner = (
            f"{_over('avg', reserved, window, offset=offset)}\n  - ignoring ({kind})\n  {_over('avg', allocated, window, offset=offset)}"
        )
        return _agg("max", f"\n{_indent(inner, 2)}\n", device)

    now, base = gap(""), gap(recent_w)
    on = f"and on ({', '.join(device)})"
    expr = (
        f"{_agg('max', _over('max', near, recent_w), device)} > {_number(MEMORY_NEAR_LIMIT)}\n"
        f"{on}\n(\n{_indent(now)}\n  > {_number(GAP_FACTOR)} *\n{_indent(base)}\n)\n"
        f"{on}\n(\n{_indent(now)}\n  > {GAP_MIN_RISE_BYTES} +\n{_indent(base)}\n)"
    )
    return Rule(
        alert="RLGPUMemoryRisk",
        uid="otel-rl-gpu-memory-risk",
        expr=expr,
        for_s=t.seconds(300),
        severity="warning",
        category="memory",
        summary=(
            "Run {{ $labels.rl_run_id }} ({{ $labels.service_name }}): GPU {{ $labels.hw_id }} of rank "
            "{{ $labels.rl_rank }} on {{ $labels.host_name }} reserved {{ $value | humanizePercentage }} of its "
            "memory in {{ $labels.rl_cluster }}/{{ $labels.rl_stage }} while the allocated/reserved gap widens"
        ),
        description=(
            f"Peak reserved memory ({near}, the fraction of the device) exceeded "
            f"{MEMORY_NEAR_LIMIT:.0%} in the last {recent_w}, and the gap between reserved and allocated "
            f"memory ({reserved} minus {allocated}) averaged over {recent_w} grew to over "
            f"{_number(GAP_FACTOR)}x and by more than 1 GiB over its average in the {base_w} before: "
            "the caching allocator is fragmenting towards an out-of-memory error."
        ),
        runbook=(
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, empty the cache between stages "
            "(offload/onload), reduce micro-batch tokens; see the memory timeline dashboard."
        ),
    )


def _rank_imbalance(t: Timing) -> Rule:
    active = Selector(M.RL_RANK_ACTIVE_TIME)
    tokens_max = Selector(M.RL_RANK_TOKENS, **{A.RL_STATISTIC: A.RlStatisticValues.MAX.value})
    tokens_mean = Selector(M.RL_RANK_TOKENS, **{A.RL_STATISTIC: A.RlStatisticValues.MEAN.value})
    w = t(RECENT_S)
    # one value per measured rank first, so two processes reporting the same rank count once
    per_rank = _agg("max", _over("avg", active, w), (*RUN_LABELS, label(A.RL_MEASURED_RANK)))
    slowest = _agg("max", per_rank)
    median = f"quantile {_by(RUN_LABELS)} (0.5, {per_rank})"
    time_skew = _both(f"{slowest}\n  > {_number(ACTIVE_TIME_FACTOR)} * {median}", f"{slowest}\n  > {ACTIVE_TIME_MIN_GAP_S} + {median}")
    busiest = _agg("max", _over("avg", tokens_max, w))
    mean = _agg("max", _over("avg", tokens_mean, w))
    token_skew = _both(f"{busiest}\n  > {_number(RANK_TOKENS_FACTOR)} * {mean}", f"{busiest}\n  > {RANK_TOKENS_MIN_GAP} + {mean}")
    return Rule(
        alert="RLRankImbalance",
        uid="otel-rl-rank-imbalance",
        expr=_either([_signal(time_skew, metric(active.metric)), _signal(token_skew, metric(tokens_max.metric))]),
        for_s=t.seconds(600),
        severity="warning",
        category="load_balance",
        summary=(
            "Run {{ $labels.rl_run_id }} ({{ $labels.service_name }}): ranks are imbalanced in "
            "{{ $labels.signal }} (busiest rank {{ $value | humanize }})"
        ),
        description=(
            f"Averaged over the last {w}: the slowest rank's active time ({active}, per rl_measured_rank) is "
            f"over {_number(ACTIVE_TIME_FACTOR)}x the median rank's and {ACTIVE_TIME_MIN_GAP_S} s more, or the "
            f"busiest rank's tokens ({tokens_max}) are over {_number(RANK_TOKENS_FACTOR)}x the mean rank's "
            f"({tokens_mean}) and {RANK_TOKENS_MIN_GAP} tokens more. Every other rank waits for the slowest."
        ),
        runbook=(
            "Enable sequence / token balancing across data-parallel ranks (verl balance_batch, dynamic batch "
            "by tokens); look for a slow device or host (per-rank heatmap dashboard, rl_straggler_rank)."
        ),
    )


def build_groups(time_scale: int = 1) -> list[Group]:
    """Every rule group; ``time_scale`` divides every window, ``for`` and interval (thresholds stay)."""
    t = Timing(time_scale)
    interval = t.seconds(INTERVAL_S)
    return [
        Group("otel-rl-training-stability", interval, (_divergence(t), _kl_threshold(t), _clipped_threshold(t), _train_infer_mismatch(t))),
        Group("otel-rl-rollout", interval, (_inference_anomaly(t), _batch_runaway(t))),
        Group("otel-rl-resources", interval, (_memory_risk(t), _rank_imbalance(t))),
    ]
