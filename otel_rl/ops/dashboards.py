"""Grafana dashboards generated from the semantic-convention registry (``otel-rl dashboards``).

Every panel query names registry metrics through ``otel_rl.semconv`` constants and their
Prometheus names (``prometheus_name``); units and descriptions come from the registry too, so a
renamed metric or a changed unit changes the boards, and ``otel-rl dashboards generate --check``
fails until they are regenerated. The boards are written to ``grafana/dashboards/*.json``, which
Grafana's file provider loads (``grafana/provisioning/dashboards``).

Queries are scoped by template variables: ``$service`` (``service_name``), ``$run``
(``rl_run_id``), ``$cluster`` (``rl_cluster``), ``$rank`` (``rl_rank``, or ``rl_measured_rank`` on
per-rank balance metrics) and ``$device`` (``hw_id``), on the Prometheus data source picked by
``$datasource`` (default uid ``prometheus``). Step panels link to the step's traces in Jaeger and
Tempo (data source uids ``jaeger`` and ``tempo``).
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from otel_rl.codegen.generate import check_or_write, differences, find_repo_root, prometheus_name, write_changed
from otel_rl.codegen.registry import Group, Registry, load_registry
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

DASHBOARDS_DIR = Path("grafana") / "dashboards"
SCHEMA_VERSION = 39  # Grafana 10.x / 11.x dashboard JSON; newer Grafana migrates it on load
PROMETHEUS_UID = "prometheus"  # the provisioned data source (grafana/provisioning/datasources)
JAEGER_UID = "jaeger"
TEMPO_UID = "tempo"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TAG = "otel-rl"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# Metrics that only a GPU produces (NVML probes, torch.cuda allocator counters, SM activity). On a
# CPU-only run their panels stay empty; the end-to-end test asserts exactly these are empty.
GPU_ONLY_METRICS: frozenset[str] = frozenset({
    M.HW_GPU_UTILIZATION, M.HW_GPU_MEMORY_USAGE, M.HW_GPU_MEMORY_LIMIT, M.HW_POWER, M.HW_TEMPERATURE,
    M.RL_SM_ACTIVITY, M.RL_GPU_MEMORY_USAGE, M.RL_GPU_MEMORY_UTILIZATION, M.RL_GPU_MEMORY_FRAGMENTATION,
    M.RL_GPU_MEMORY_ACTIVATION_PEAK,
})

# Registry metrics deliberately on no board, with why. A new registry metric must be placed on a
# board or listed here (tests/grafana checks it), so no metric is forgotten silently.
_NOT_IN_DEMO = "not emitted by the reference run (the demo), so a panel could not be checked against data"
NOT_ON_A_BOARD: Mapping[str, str] = {
    M.RL_TENSOR_CHECKSUM: "a checksum is compared across stages (rl.shape_ledger.mismatches is on the data-quality board), not read as a curve",
    M.RL_UNMAPPED: "one series per unknown framework key: a fallback to find in Explore, not a panel",
    M.RL_TELEMETRY_REJECTED: "only present after bad values arrived; the alert rules watch it",
    M.RL_TELEMETRY_DROPPED: _NOT_IN_DEMO + " (it counts only when delivery to the collector fails)",
    M.RL_TELEMETRY_SPOOL_USAGE: _NOT_IN_DEMO + " (it is non-zero only while the collector is unreachable)",
    M.RL_ALERT: _NOT_IN_DEMO + " (alerts fire only on an unhealthy run; grafana/alerts has the rules)",
    M.RL_THROUGHPUT_STEPS: _NOT_IN_DEMO + "; rl.step.duration shows the same",
    M.RL_STEP_TOKENS: _NOT_IN_DEMO + "; rl.throughput.tokens is on the timeline",
    **{metric: _NOT_IN_DEMO for metric in (
        M.RL_PROGRESS_STEP, M.RL_PROGRESS_EPOCH, M.RL_PROGRESS_MAX_STEPS, M.RL_PROGRESS_RATIO, M.RL_PROGRESS_TOKENS,
        M.RL_RUN_ELAPSED_TIME, M.RL_RUN_REMAINING_TIME, M.RL_RUN_FLOPS, M.RL_RUN_LOSS, M.RL_STAGE_TIME_PER_TOKEN,
        M.RL_CRITIC_EXPLAINED_VARIANCE, M.RL_RESPONSE_TERMINATED_LENGTH, M.RL_RESPONSE_NON_ABORTED_LENGTH,
        M.RL_RESPONSE_NON_ABORTED_CLIPPED_RATIO, M.RL_PROMPT_CLIPPED_RATIO, M.RL_REWARD_COMPONENT, M.RL_REWARD_ZERO_STD_RATIO,
        M.RL_KL_COEFFICIENT, M.RL_ROLLOUT_PREEMPTIONS, M.RL_ROLLOUT_SAMPLE_DURATION,
    )},
}

# Registry units -> Grafana unit ids. "{annotation}" counts become Grafana's "count:<unit>" custom
# unit (1.2K tokens); a dimensionless "1" is a fraction (percentunit) only for FRACTIONS.
_GRAFANA_UNITS = {"s": "s", "ms": "ms", "us": "µs", "ns": "ns", "By": "bytes", "W": "watt", "Cel": "celsius", "Hz": "hertz"}
_COUNT_WORDS = {"token": "tokens", "sample": "samples", "step": "steps", "version": "versions", "value": "values",
                "exception": "exceptions", "mismatch": "mismatches", "request": "requests"}
_IDENTIFIERS = {"rank"}  # an annotation that names something (a rank number), not an amount
FRACTIONS: frozenset[str] = frozenset({
    M.RL_CLIP_FRACTION, M.RL_RESPONSE_CLIPPED_RATIO, M.RL_RESPONSE_MASK_RATIO, M.RL_BATCH_VALID_RATIO,
    M.RL_ROLLOUT_ABORT_RATIO, M.RL_ROLLOUT_TIMEOUT_RATIO, M.RL_ROLLOUT_KV_CACHE_UTILIZATION, M.RL_ASYNC_STALE_SAMPLE_RATIO,
    M.RL_PIPELINE_BUBBLE_RATIO, M.RL_MFU, M.RL_SM_ACTIVITY, M.HW_GPU_UTILIZATION, M.RL_GPU_MEMORY_UTILIZATION,
    M.RL_GPU_MEMORY_FRAGMENTATION, M.PROCESS_CPU_UTILIZATION, M.RL_STRAGGLER_MARGIN,
})

# Template variables and the matchers built from them.
VARIABLES = ("datasource", "service", "run", "cluster", "rank", "device")
ALL_VALUE = ".*"  # "All" of a multi-value variable also matches series that lack the label (CPU runs have no hw_id)


def label(attribute: str) -> str:
    """The Prometheus label an OTel attribute becomes (``rl.stage`` -> ``rl_stage``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


def eq(attribute: str, value: str) -> str:
    return f'{label(attribute)}="{value}"'


def ne(attribute: str, value: str) -> str:
    return f'{label(attribute)}!="{value}"'


def match(attribute: str, pattern: str) -> str:
    return f'{label(attribute)}=~"{pattern}"'


def one_of(values: Iterable[Any]) -> str:
    """A regex alternation of enum values (``generate|rollout``)."""
    return "|".join(re.escape(str(getattr(v, "value", v))) for v in values)


def _v(enum_member: Any) -> str:
    return str(getattr(enum_member, "value", enum_member))


RUN = (eq(A.SERVICE_NAME, "$service"), eq(A.RL_RUN_ID, "$run"))
RANK = match(A.RL_RANK, "$rank")
CLUSTER = match(A.RL_CLUSTER, "$cluster")
DEVICE = match(A.HW_ID, "$device")
# A device is a GPU index on a host: GPU 0 of every node has hw.id 0.
DEVICE_LABELS = (A.HOST_NAME, A.HW_ID)
DEVICE_LEGEND = "{{" + label(A.HOST_NAME) + "}} gpu {{" + label(A.HW_ID) + "}}"
# Per-rank balance values are recorded by one process about every rank: filter the measured rank.
MEASURED_RANK = (ne(A.RL_MEASURED_RANK, ""), match(A.RL_MEASURED_RANK, "$rank"))
STAT = A.RL_STATISTIC


# --------------------------------------------------------------------------------------------
# The board model


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False
    heatmap: bool = False  # Prometheus "heatmap" format: histogram buckets, de-accumulated by Grafana
    exemplar: bool = False
    unit: str | None = None  # when it differs from the panel's: its series get this unit on the right axis


@dataclass
class Panel:
    """A panel before layout: kind is timeseries, stat, heatmap or bargauge."""

    kind: str
    title: str
    targets: Sequence[Target]
    unit: str
    w: int = 12
    h: int = 8
    note: str = ""
    stack: bool = False
    bars: bool = False
    y_unit: str | None = None  # heatmap: the unit of the rows (a histogram's buckets)
    links: Sequence[dict[str, Any]] = ()
    thresholds: Sequence[float] = ()  # drawn as red lines (alert levels the seeds name)
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Row:
    title: str


@dataclass
class Board:
    slug: str
    title: str
    description: str
    items: list[Panel | Row]
    tags: tuple[str, ...] = ()
    cursor_sync: int = 1  # 1: shared crosshair, 2: shared tooltip

    @property
    def uid(self) -> str:
        return f"{TAG}-{self.slug}"

    @property
    def path(self) -> Path:
        return DASHBOARDS_DIR / f"{self.slug}.json"


class Metrics:
    """Registry metrics as PromQL: Prometheus names, scoped selectors, units and briefs."""

    def __init__(self, registry: Registry) -> None:
        self.groups: dict[str, Group] = registry.metrics
        self.by_series: dict[str, str] = {}
        for name, group in self.groups.items():
            base = prometheus_name(name, str(group.unit), str(group.instrument))
            for series in ([base + s for s in HISTOGRAM_SUFFIXES] if group.instrument == "histogram" else [base]):
                self.by_series[series] = name

    def group(self, metric: str) -> Group:
        try:
            return self.groups[metric]
        except KeyError:
            raise KeyError(f"{metric} is not a registry metric (semconv/registry/*.yaml)") from None

    def prom(self, metric: str, suffix: str = "") -> str:
        """The metric's Prometheus series name; histograms need a suffix (_bucket, _sum, _count)."""
        group = self.group(metric)
        if group.instrument == "histogram" and suffix not in HISTOGRAM_SUFFIXES:
            raise ValueError(f"{metric} is a histogram: name one of its series {HISTOGRAM_SUFFIXES}")
        if group.instrument != "histogram" and suffix:
            raise ValueError(f"{metric} is a {group.instrument}: it has no {suffix} series")
        return prometheus_name(metric, str(group.unit), str(group.instrument)) + suffix

    def sel(self, metric: str, *matchers: str, suffix: str = "", scope: tuple[str, ...] = (*RUN, RANK)) -> str:
        """``name{service, run, rank, *matchers}``: a selector scoped to the dashboard's variables."""
        return f"{self.prom(metric, suffix)}{{{', '.join((*scope, *matchers))}}}"

    def brief(self, metric: str) -> str:
        return " ".join(self.group(metric).brief.split())

    def unit(self, metric: str) -> str:
        """The Grafana unit of the metric's values."""
        return grafana_unit(str(self.group(metric).unit), fraction=metric in FRACTIONS)

    def rate_unit(self, metric: str) -> str:
        """The Grafana unit of the metric's per-second rate (a counter's rate())."""
        return grafana_unit(f"{self.group(metric).unit}/s")

    def used_in(self, expr: str) -> list[str]:
        """Registry metric names in an expression, in order of appearance."""
        out: list[str] = []
        for series in promql_metric_names(expr):
            metric = self.by_series.get(series)
            if metric is None:
                raise ValueError(f"{series} in {expr!r} is not a registry metric's Prometheus series")
            if metric not in out:
                out.append(metric)
        return out


def grafana_unit(unit: str, *, fraction: bool = False) -> str:
    """A registry (UCUM) unit as a Grafana unit id: s -> s, By -> bytes, {token}/s -> count:tokens/s."""
    if unit == "1":
        return "percentunit" if fraction else "none"
    main, _, per = unit.partition("/")
    if main.startswith("{") and main.endswith("}"):
        word = main[1:-1]
        if word in _IDENTIFIERS:
            return "none"
        amount = _COUNT_WORDS.get(word, word)
        return f"count:{amount}/{per}" if per else f"count:{amount}"
    if per.startswith("{"):  # s/{token}: a duration per item, shown as a duration
        return _GRAFANA_UNITS.get(main, main)
    if per:
        return f"{_GRAFANA_UNITS.get(main, main)}/{per}"
    return _GRAFANA_UNITS.get(main, f"suffix: {main}")


# The cell unit of a per-sample histogram's heatmap: how many samples fell in a bucket.
OBSERVATIONS = grafana_unit("{sample}")


# --------------------------------------------------------------------------------------------
# PromQL helpers


def rate(selector: str, window: str = "$__rate_interval") -> str:
    return f"rate({selector}[{window}])"


def increase(selector: str, window: str = "$__rate_interval") -> str:
    return f"increase({selector}[{window}])"


def grown(selector: str, window: str = "$__rate_interval") -> str:
    """How much a cumulative series grew in the window, counting a series that first appeared in it.

    The OTel SDK creates a histogram's or counter's series at its first recording, so the first
    checkpoint, validation or NaN would be invisible to increase() alone (it needs two samples):
    a series absent one window ago grew by its whole value.
    """
    return f"(increase({selector}[{window}]) or ({selector} unless {selector} offset {window}))"


def mean_per_call(histogram_sum: str, histogram_count: str, group: Sequence[str], window: str = "$__rate_interval") -> str:
    """Mean value per observation in the window (seconds per stage call), per group."""
    total = f"sum {by(*group)} " if group else "sum"
    return f"{total}({grown(histogram_sum, window)}) / {total}({grown(histogram_count, window)})"


def quantile(q: float, buckets: str, by: Sequence[str] = ()) -> str:
    """histogram_quantile over a histogram's _bucket selector, grouped by the given attributes."""
    labels = ", ".join(["le", *(label(a) for a in by)])
    return f"histogram_quantile({q}, sum by ({labels}) ({rate(buckets)}))"


def by(*attributes: str) -> str:
    return f"by ({', '.join(label(a) for a in attributes)})"


def legend(*attributes: str, prefix: str = "") -> str:
    """A legend template such as ``{{rl_stage}} {{rl_cluster}}``."""
    return (prefix + " ".join("{{" + label(a) + "}}" for a in attributes)).strip()


# --------------------------------------------------------------------------------------------
# Trace links (data links from step and stage panels to Jaeger and Tempo in Grafana's Explore)


def _explore_url(uid: str, kind: str, query: dict[str, Any]) -> str:
    """A Grafana Explore URL that opens ``query`` on data source ``uid`` over the dashboard's time range.

    Grafana's ``${...}`` placeholders stay unescaped so Grafana fills them in when the link is clicked.
    """
    panes = {"traces": {"datasource": uid, "queries": [{"refId": "A", "datasource": {"type": kind, "uid": uid}, **query}],
                        "range": {"from": "${__from}", "to": "${__to}"}}}
    text = json.dumps(panes, separators=(",", ":"))
    return "/explore?schemaVersion=1&orgId=1&panes=" + urllib.parse.quote(text, safe="${}:._-")


def trace_links(operation: str, *, slower_than_value: bool = True, scope: str = "") -> list[dict[str, Any]]:
    """Data links to the traces of ``operation`` spans of this run, in Jaeger and in Tempo.

    With ``slower_than_value`` the search keeps spans at least as long as the clicked value (a
    duration in seconds), i.e. the steps behind a slow point.
    """
    tags = f"{A.RL_RUN_ID}=${{run}}"
    jaeger = {"queryType": "search", "service": "${service}", "operation": operation, "tags": tags, "limit": 20}
    traceql = [f'resource.{A.SERVICE_NAME}="${{service}}"', f'resource.{A.RL_RUN_ID}="${{run}}"', f'name="{operation}"']
    if slower_than_value:
        jaeger["minDuration"] = "${__value.numeric}s"
        traceql.append("duration >= ${__value.numeric}s")
    tempo = {"queryType": "traceql", "query": "{" + " && ".join(traceql) + "}", "limit": 20}
    what = f"{scope} spans" if scope else "spans"
    cond = " at least this slow" if slower_than_value else ""
    return [
        {"title": f"{what}{cond} in Jaeger", "url": _explore_url(JAEGER_UID, "jaeger", jaeger), "targetBlank": True},
        {"title": f"{what}{cond} in Tempo", "url": _explore_url(TEMPO_UID, "tempo", tempo), "targetBlank": True},
    ]


STEP_SPAN = N.RL_STEP_SPAN
# The stage span of a series: the span name template with the series' rl_stage label filled in.
STAGE_SPAN_OF_SERIES = N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", "${__field.labels." + label(A.RL_STAGE) + "}")


# --------------------------------------------------------------------------------------------
# The boards

S = A.RlStageValues
# The E2E timeline: rollout -> reward -> logprob/ref -> update -> checkpoint, in pipeline order. Every
# stage of the registry's enum is in exactly one group (tests/grafana checks it).
STAGE_GROUPS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("rollout", (S.ROLLOUT, S.GENERATE, S.TOOL_CALLS)),
    ("reward", (S.COMPUTE_REWARDS,)),
    ("logprob / ref", (S.COMPUTE_LOG_PROBS, S.COMPUTE_REF_LOG_PROBS, S.OLD_LOG_PROBS_VALUES, S.REF_LOG_PROBS_VALUES_REWARD)),
    ("values / advantage", (S.COMPUTE_VALUES, S.ADVANTAGE)),
    ("update", (S.TRAIN_STEP,)),
    ("weight sync", (S.MODEL_UPDATE,)),
    ("checkpoint", (S.DO_CHECKPOINT,)),
    ("validation", (S.VALIDATION,)),
)
TOTAL = eq(A.RL_STAGE_PHASE, _v(A.RlStagePhaseValues.TOTAL))


_ACROSS_RANKS = {_v(A.RlStatisticValues.MAX): "max", _v(A.RlStatisticValues.MIN): "min", _v(A.RlStatisticValues.MEAN): "avg"}


def _stats(m: Metrics, metric: str, *matchers: str,
           stats: Sequence[Any] = (A.RlStatisticValues.MEAN, A.RlStatisticValues.MAX, A.RlStatisticValues.MIN),
           extra: Sequence[str] = ()) -> Target:
    """A by-statistic gauge as one series per statistic, each combined across ranks as itself
    (the max of the ranks' maxima, the min of their minima, the mean of their means)."""
    parts = [f"{_ACROSS_RANKS[_v(stat)]} {by(STAT, *extra)} ({m.sel(metric, eq(STAT, _v(stat)), *matchers)})" for stat in stats]
    return Target(" or ".join(parts), legend(*extra, STAT))


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
    phases = ne(A.RL_STAGE_PHASE, _v(A.RlStagePhaseValues.TOTAL))
    phase_mean = mean_per_call(stage("_sum", phases), stage("_count", phases), (A.RL_CLUSTER, A.RL_STAGE, A.RL_STAGE_PHASE))
    compute_group = (A.RL_STAGE, A.RL_COMPUTE_OP)
    compute = mean_per_call(m.sel(M.RL_COMPUTE_DURATION, suffix="_sum"), m.sel(M.RL_COMPUTE_DURATION, suffix="_count"), compute_group)
    # Every rank runs the stages, one rank (the one opening the step's trace) times the steps: a
    # stage's share is its mean over ranks over the step time of the rank(s) that record steps.
    share = (f"avg {by(A.RL_STAGE)} (sum {by(A.RL_STAGE, A.RL_RANK)} ({grown(stage('_sum', TOTAL), '$__range')})) / "
             f"scalar(max(sum {by(A.RL_RANK)} ({grown(step_sum, '$__range')})))")
    return Board("e2e-timeline", "otel-rl / E2E timeline",
                 "Where each training step's time goes: rollout -> reward -> logprob/ref -> update -> checkpoint, "
                 "from rl.stage.duration by rl.stage and rl.cluster; step time, throughput and MFU.",
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
    full = dict(w=24, h=6)
    R = A.RlStatisticValues
    clip_stat = match(STAT, one_of((R.MEAN,)) + "|")  # the mean where a statistic is given, else the value
    return Board("training-stability", "otel-rl / Training stability",
                 "Reward, KL, entropy, grad norm and clip fraction on one time axis (shared crosshair): a KL spike "
                 "with a grad-norm spike and an entropy collapse is the divergence pattern.",
                 [
                     Panel("timeseries", "Reward and score",
                           [_stats(m, M.RL_REWARD), Target(f"avg({m.sel(M.RL_SCORE, eq(STAT, _v(R.MEAN)))})", "score mean")],
                           m.unit(M.RL_REWARD), **full),
                     Panel("timeseries", "KL divergence",
                           [Target(f"avg {by(A.RL_POLICY, A.RL_KL_ESTIMATOR)} ({m.sel(M.RL_POLICY_KL)})",
                                   legend(A.RL_POLICY, A.RL_KL_ESTIMATOR, prefix="KL ")),
                            Target(f"avg {by(A.RL_MODEL_ROLE)} ({m.sel(M.RL_LOSS, eq(A.RL_LOSS_TYPE, _v(A.RlLossTypeValues.KL)))})",
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
    tokens = lambda kind: f"sum({rate(m.sel(M.RL_ROLLOUT_TOKENS, eq(A.GEN_AI_TOKEN_TYPE, _v(kind))))})"  # noqa: E731
    generate = eq(A.RL_STAGE, _v(S.GENERATE))
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
                           links=trace_links(N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", _v(S.GENERATE)), scope="rollout")),
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
    role = lambda r: eq(A.RL_MODEL_ROLE, _v(r))  # noqa: E731
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
                           [Target(f"avg {by(A.RL_POLICY)} ({m.sel(M.RL_LOGPROB, match(STAT, _v(A.RlStatisticValues.MEAN) + '|'))})",
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
    m = Metrics(registry)
    return [make(m) for make in BOARDS]


# --------------------------------------------------------------------------------------------
# Grafana JSON


def _datasource_variable() -> dict[str, Any]:
    return {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "current": {"text": "Prometheus", "value": PROMETHEUS_UID}, "hide": 0, "regex": "", "refresh": 1,
            "description": "The Prometheus-compatible store (Prometheus, Mimir, VictoriaMetrics) holding the run's metrics."}


def _query_variable(name: str, title: str, query: str, description: str, *, multi: bool, sort: int) -> dict[str, Any]:
    variable: dict[str, Any] = {"name": name, "label": title, "type": "query", "datasource": dict(DATASOURCE), "query": query,
                                "refresh": 2, "sort": sort, "multi": multi, "includeAll": multi, "hide": 0, "regex": "",
                                "description": description}
    if multi:  # "All" selected from the start (else Grafana would pick the first value alone)
        variable["allValue"] = ALL_VALUE
        variable["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return variable


def variables(m: Metrics) -> list[dict[str, Any]]:
    """The boards' template variables: datasource, service, run, cluster, rank, device."""
    run = ", ".join(RUN)
    any_run = ne(A.RL_RUN_ID, "")
    stage_count = m.prom(M.RL_STAGE_DURATION, "_count")
    return [
        _datasource_variable(),
        _query_variable("service", "Service", f"label_values({{{any_run}}}, {label(A.SERVICE_NAME)})",
                        "service.name of the training job (every otel-rl series carries rl.run.id).", multi=False, sort=1),
        _query_variable("run", "Run", f"label_values({{{eq(A.SERVICE_NAME, '$service')}, {any_run}}}, {label(A.RL_RUN_ID)})",
                        "rl.run.id; newest first when run ids start with their start time (otel-rl's default).", multi=False, sort=2),
        _query_variable("cluster", "Cluster", f"label_values({stage_count}{{{run}}}, {label(A.RL_CLUSTER)})",
                        f"{A.RL_CLUSTER}: the worker group that ran a stage (actor_train, actor_infer, reference, ...).", multi=True, sort=1),
        _query_variable("rank", "Rank", f"label_values({{{run}}}, {label(A.RL_RANK)})",
                        f"Global rank: {A.RL_RANK} of the reporting process; on per-rank balance panels, {A.RL_MEASURED_RANK}.",
                        multi=True, sort=3),
        _query_variable("device", "Device", f"label_values({{{run}, {ne(A.HW_ID, '')}}}, {label(A.HW_ID)})",
                        f"{A.HW_ID}: the GPU index (none on a CPU-only run).", multi=True, sort=3),
    ]


def _target_json(target: Target, ref: str) -> dict[str, Any]:
    out: dict[str, Any] = {"refId": ref, "datasource": dict(DATASOURCE), "editorMode": "code", "expr": target.expr,
                           "legendFormat": target.legend or "__auto", "range": not target.instant, "instant": target.instant}
    if target.heatmap:
        out["format"] = "heatmap"
    if target.exemplar:
        out["exemplar"] = True
    return out


def _hide_from() -> dict[str, bool]:
    return {"legend": False, "tooltip": False, "viz": False}


def _thresholds(values: Sequence[float]) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": "red", "value": v} for v in values]
    return {"mode": "absolute", "steps": steps}


def _timeseries(panel: Panel) -> tuple[dict[str, Any], dict[str, Any]]:
    custom: dict[str, Any] = {
        "drawStyle": "bars" if panel.bars else "line", "lineWidth": 1, "fillOpacity": 70 if panel.bars else 10,
        "gradientMode": "none", "showPoints": "auto", "pointSize": 4, "lineInterpolation": "linear", "spanNulls": True,
        "insertNulls": False, "barAlignment": 0, "axisPlacement": "auto", "axisLabel": "", "axisBorderShow": False,
        "axisCenteredZero": False, "axisColorMode": "text", "scaleDistribution": {"type": "linear"},
        "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        "thresholdsStyle": {"mode": "line" if panel.thresholds else "off"}, "hideFrom": _hide_from(),
    }
    options = {"legend": {"calcs": ["lastNotNull", "max"], "displayMode": "table", "placement": "bottom", "showLegend": True},
               "tooltip": {"mode": "multi", "sort": "desc"}}
    return options, custom


def _stat(panel: Panel) -> tuple[dict[str, Any], dict[str, Any] | None]:
    options = {"colorMode": "value", "graphMode": "area", "justifyMode": "auto", "orientation": "auto",
               "percentChangeColorMode": "standard", "showPercentChange": False, "textMode": "auto", "wideLayout": True,
               "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return options, None


def _bargauge(panel: Panel) -> tuple[dict[str, Any], dict[str, Any] | None]:
    options = {"displayMode": "gradient", "orientation": "horizontal", "namePlacement": "auto", "showUnfilled": True,
               "sizing": "auto", "valueMode": "color", "minVizHeight": 16, "minVizWidth": 8, "maxVizHeight": 300,
               "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
               "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": False}}
    return options, None


def _heatmap(panel: Panel) -> tuple[dict[str, Any], dict[str, Any]]:
    rows = "le" if any(t.heatmap for t in panel.targets) else "auto"  # histogram buckets are upper bounds
    options = {"calculate": False, "cellGap": 1, "cellValues": {"unit": panel.unit},
               "color": {"exponent": 0.5, "fill": "dark-orange", "mode": "scheme", "reverse": False, "scale": "exponential",
                         "scheme": "Oranges", "steps": 64},
               "exemplars": {"color": "rgba(255,0,255,0.7)"}, "filterValues": {"le": 1e-9}, "legend": {"show": True},
               "rowsFrame": {"layout": rows}, "selectionMode": "x", "showValue": "never",
               "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": False},
               "yAxis": {"axisPlacement": "left", "reverse": False, "unit": panel.y_unit or "none"}}
    custom = {"hideFrom": _hide_from(), "scaleDistribution": {"type": "linear"}}
    return options, custom


_KINDS = {"timeseries": _timeseries, "stat": _stat, "bargauge": _bargauge, "heatmap": _heatmap}


def panel_json(panel: Panel, panel_id: int, grid: dict[str, int], m: Metrics) -> dict[str, Any]:
    """One Grafana panel: queries, unit, the registry briefs as its description, links, overrides."""
    if panel.kind not in _KINDS:
        raise ValueError(f"{panel.title}: unknown panel kind {panel.kind}")
    used: list[str] = []
    for target in panel.targets:
        used += [name for name in m.used_in(target.expr) if name not in used]
    description = " ".join([m.brief(name) for name in used] + ([panel.note] if panel.note else []))
    options, custom = _KINDS[panel.kind](panel)
    defaults: dict[str, Any] = {"unit": panel.unit, "color": {"mode": "palette-classic"}, "mappings": [],
                                "thresholds": _thresholds(panel.thresholds)}
    if panel.kind in ("stat", "bargauge"):
        defaults["color"] = {"mode": "thresholds"}
    if custom is not None:
        defaults["custom"] = custom
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.links:
        defaults["links"] = [dict(link) for link in panel.links]
    refs = [chr(ord("A") + i) for i in range(len(panel.targets))]
    overrides = []
    for ref, target in zip(refs, panel.targets):
        if target.unit and target.unit != panel.unit:
            properties: list[dict[str, Any]] = [{"id": "unit", "value": target.unit}]
            if panel.kind == "timeseries":
                properties.append({"id": "custom.axisPlacement", "value": "right"})
            if panel.min is not None or panel.max is not None:  # the panel's 0..1 range is not this series'
                properties += [{"id": "min"}, {"id": "max"}]
            overrides.append({"matcher": {"id": "byFrameRefID", "options": ref}, "properties": properties})
    return {
        "id": panel_id, "type": panel.kind, "title": panel.title, "description": description, "datasource": dict(DATASOURCE),
        "gridPos": grid, "fieldConfig": {"defaults": defaults, "overrides": overrides}, "options": options,
        "targets": [_target_json(t, ref) for ref, t in zip(refs, panel.targets)],
    }


def _layout(items: Sequence[Panel | Row]) -> list[tuple[Panel | Row, dict[str, int]]]:
    """Grafana grid positions: rows span the width; panels flow left to right, 24 columns wide."""
    placed: list[tuple[Panel | Row, dict[str, int]]] = []
    x = y = line_h = 0
    for item in items:
        if isinstance(item, Row):
            if x:
                y, x, line_h = y + line_h, 0, 0
            placed.append((item, {"h": 1, "w": 24, "x": 0, "y": y}))
            y += 1
            continue
        if x + item.w > 24:
            y, x, line_h = y + line_h, 0, 0
        placed.append((item, {"h": item.h, "w": item.w, "x": x, "y": y}))
        x += item.w
        line_h = max(line_h, item.h)
    return placed


def board_json(board: Board, m: Metrics) -> dict[str, Any]:
    """The dashboard JSON Grafana imports."""
    panels: list[dict[str, Any]] = []
    for number, (item, grid) in enumerate(_layout(board.items), start=1):
        if isinstance(item, Row):
            panels.append({"id": number, "type": "row", "title": item.title, "collapsed": False, "gridPos": grid, "panels": []})
        else:
            panels.append(panel_json(item, number, grid, m))
    return {
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
                                  "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
                                  "type": "dashboard"}]},
        "description": f"{board.description} Generated from semconv/registry by `otel-rl dashboards generate` "
                       "(otel_rl/_dashboards.py); edit that, not this file.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": board.cursor_sync,
        "id": None,
        "links": [{"title": "otel-rl boards", "type": "dashboards", "tags": [TAG], "asDropdown": True, "includeVars": True,
                   "keepTime": True, "icon": "external link", "targetBlank": False, "tooltip": "", "url": ""}],
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": [TAG, *board.tags],
        "templating": {"list": variables(m)},
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": board.title,
        "uid": board.uid,
        "version": 1,
        "weekStart": "",
    }


# --------------------------------------------------------------------------------------------
# PromQL reading (metric names, template variables)

_PROMQL_TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<variable>\$\{[^}]*\}|\$[A-Za-z_]\w*)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?(?![\w.]))
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<open>[({])
  | (?P<close>[)}])
  | (?P<other>\S)
""", re.VERBOSE)
_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
                    "unless", "inf", "nan", "atan2"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def promql_metric_names(expr: str) -> list[str]:
    """Metric names an expression selects, in order (label matchers, label lists and functions skipped)."""
    tokens = [(m.lastgroup, m.group()) for m in _PROMQL_TOKEN.finditer(expr)]
    names: list[str] = []
    i, braces = 0, 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "open" and text == "{":
            braces += 1
        elif kind == "close" and text == "}":
            braces -= 1
        elif kind == "ident" and not braces:
            if text.lower() in _LABEL_LISTS and following == ("open", "("):
                while i < len(tokens) and tokens[i] != ("close", ")"):  # a label list: (le, rl_stage)
                    i += 1
            elif (following == ("open", "(") or text.lower() in _PROMQL_KEYWORDS
                  or (following[0] == "ident" and following[1].lower() in ("by", "without"))):
                pass  # a function call, an aggregation (sum by (...) (...)) or an operator keyword
            elif text not in names:
                names.append(text)
        i += 1
    return names


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """An expression with Grafana's template variables (``$run``, ``${run}``, ``$__rate_interval``) replaced."""
    def one(found: re.Match) -> str:
        name = (found.group(1) or found.group(2)).split(":")[0]
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{([^}]+)\}|\$(\w+)", one, expr)


def template_values(*, service: str, run: str, rate_interval: str = "1m", interval: str = "15s", range_: str = "1h",
                    cluster: str = ALL_VALUE, rank: str = ALL_VALUE, device: str = ALL_VALUE) -> dict[str, str]:
    """Concrete values for every template variable the boards' queries use."""
    return {"service": service, "run": run, "cluster": cluster, "rank": rank, "device": device,
            "__rate_interval": rate_interval, "__interval": interval, "__range": range_}


def dashboard_targets(board: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of a dashboard JSON, rows' nested panels included."""
    out = []
    for panel in board.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []) or []:
                out.append((inner, target))
    return out


def uses_gpu_only_metric(expr: str, m: Metrics) -> bool:
    return any(name in GPU_ONLY_METRICS for name in m.used_in(expr))


# --------------------------------------------------------------------------------------------
# Files and the command


def generate(repo_root: Path | str) -> dict[Path, str]:
    """Every dashboard file (path relative to the repository) and its content."""
    registry = load_registry(Path(repo_root) / "semconv")
    m = Metrics(registry)
    return {board.path: json.dumps(board_json(board, m), indent=2, ensure_ascii=False) + "\n" for board in boards(registry)}


def _stale(repo_root: Path, files: Mapping[Path, str]) -> list[Path]:
    folder = repo_root / DASHBOARDS_DIR
    return [p.relative_to(repo_root) for p in sorted(folder.glob("*.json")) if p.relative_to(repo_root) not in files]


def write(repo_root: Path | str) -> list[Path]:
    """Write the dashboards whose content changed and remove stale ones; return the paths touched."""
    root = Path(repo_root)
    files = generate(root)
    return write_changed(root, files, _stale(root, files))


STALE_BOARD = "stale: no board produces it"


def check(repo_root: Path | str) -> list[str]:
    """What differs between the committed dashboards and the registry's (empty: up to date)."""
    root = Path(repo_root)
    files = generate(root)
    return differences(root, files, _stale(root, files), STALE_BOARD)


def _cmd_generate(args: argparse.Namespace) -> int:
    root = find_repo_root(args.repo, "--repo")
    files = generate(root)
    return check_or_write("otel-rl dashboards generate", root, files, _stale(root, files), check=args.check,
                          source="semconv/registry", stale_reason=STALE_BOARD)


def _cmd_render(args: argparse.Namespace) -> int:
    from otel_rl.ops.grafana_render import render_command

    return render_command(args)


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl dashboards generate [--check]`` and ``otel-rl dashboards render``."""
    parser = subparsers.add_parser("dashboards", help="generate the Grafana dashboards from the registry; render them to PNG")
    sub = parser.add_subparsers(dest="dashboards_command", metavar="SUBCOMMAND")
    gen = sub.add_parser("generate", help="write grafana/dashboards/*.json from semconv/registry")
    gen.add_argument("--check", action="store_true", help="write nothing; exit 1 if the committed boards differ from the registry's")
    gen.add_argument("--repo", metavar="DIR", help="the otel-rl checkout (default: found from the working directory)")
    gen.set_defaults(func=_cmd_generate)
    from otel_rl.ops.grafana_render import add_render_arguments

    render = sub.add_parser("render", help="draw each board's panels from a VictoriaMetrics / Prometheus query API into PNGs")
    add_render_arguments(render)
    render.set_defaults(func=_cmd_render)
    parser.set_defaults(func=lambda a: (parser.print_help(), 2)[1])
    return parser
