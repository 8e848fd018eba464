"""The dashboard model: boards, rows, panels and their queries, registry metrics as PromQL, units
and the template-variable scope every query shares, and the data links from panels to traces.

The board definitions (``otel_rl.ops.dashboard_boards``) are built from these pieces, as data the
registry fills in; ``otel_rl.ops.grafana_boards`` turns them into Grafana dashboards with Grafana's
own builders (grafana-foundation-sdk). What stays here is what the SDK has no notion of: registry
metrics as PromQL, registry units as Grafana unit ids, GPU-only / agent-loop metrics, Explore URLs.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_rl.codegen.generate import prometheus_name
from otel_rl.codegen.registry import Group, Registry
from otel_rl.ops.promql import eq, label, match, ne, promql_metric_names
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

DASHBOARDS_DIR = Path("grafana") / "dashboards"
PROMETHEUS_UID = "prometheus"  # the provisioned data source (grafana/provisioning/datasources)
JAEGER_UID = "jaeger"
TEMPO_UID = "tempo"
DATASOURCE_TYPE = "prometheus"
DATASOURCE_VARIABLE = "${datasource}"  # every panel and query reads the data source the board's variable picks
TAG = "otel-rl"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# Metrics that only a GPU produces (NVML probes, torch.cuda allocator counters, SM activity). On a
# CPU-only run their panels stay empty; the end-to-end test asserts exactly these are empty.
GPU_ONLY_METRICS: frozenset[str] = frozenset(
    {
        M.HW_GPU_UTILIZATION,
        M.HW_GPU_MEMORY_USAGE,
        M.HW_GPU_MEMORY_LIMIT,
        M.HW_POWER,
        M.HW_TEMPERATURE,
        M.RL_SM_ACTIVITY,
        M.RL_GPU_MEMORY_USAGE,
        M.RL_GPU_MEMORY_UTILIZATION,
        M.RL_GPU_MEMORY_FRAGMENTATION,
        M.RL_GPU_MEMORY_ACTIVATION_PEAK,
    }
)

# Metrics only an agent loop records (Telemetry.trajectory()). The reference run (the demo's
# single-turn task) has none, so their panels stay empty on it; the end-to-end tests check their
# queries on a run with trajectories instead.
AGENT_LOOP_METRICS: frozenset[str] = frozenset(
    {
        M.RL_TRAJECTORY_DURATION,
        M.RL_TURN_DURATION,
        M.RL_TOOL_DURATION,
        M.RL_TRAJECTORY_TURNS,
        M.RL_TRAJECTORY_TOOL_CALLS,
        M.RL_TRAJECTORY_COUNT,
    }
)

# Registry units -> Grafana unit ids. "{annotation}" counts become Grafana's "count:<unit>" custom
# unit (1.2K tokens); a dimensionless "1" is a fraction (percentunit) only for FRACTIONS.
_GRAFANA_UNITS = {"s": "s", "ms": "ms", "us": "µs", "ns": "ns", "By": "bytes", "W": "watt", "Cel": "celsius", "Hz": "hertz"}
_COUNT_WORDS = {
    "token": "tokens",
    "sample": "samples",
    "step": "steps",
    "version": "versions",
    "value": "values",
    "exception": "exceptions",
    "mismatch": "mismatches",
    "request": "requests",
    "trajectory": "trajectories",
    "turn": "turns",
    "call": "calls",
}
_IDENTIFIERS = {"rank"}  # an annotation that names something (a rank number), not an amount
FRACTIONS: frozenset[str] = frozenset(
    {
        M.RL_CLIP_FRACTION,
        M.RL_RESPONSE_CLIPPED_RATIO,
        M.RL_RESPONSE_MASK_RATIO,
        M.RL_BATCH_VALID_RATIO,
        M.RL_ROLLOUT_ABORT_RATIO,
        M.RL_ROLLOUT_TIMEOUT_RATIO,
        M.RL_ROLLOUT_KV_CACHE_UTILIZATION,
        M.RL_ASYNC_STALE_SAMPLE_RATIO,
        M.RL_PIPELINE_BUBBLE_RATIO,
        M.RL_STEP_GOODPUT_RATIO,
        M.RL_MFU,
        M.RL_SM_ACTIVITY,
        M.HW_GPU_UTILIZATION,
        M.RL_GPU_MEMORY_UTILIZATION,
        M.RL_GPU_MEMORY_FRAGMENTATION,
        M.PROCESS_CPU_UTILIZATION,
        M.RL_STRAGGLER_MARGIN,
    }
)

# Template variables and the matchers built from them.
VARIABLES = ("datasource", "service", "run", "cluster", "rank", "device")
ALL_VALUE = ".*"  # "All" of a multi-value variable also matches series that lack the label (CPU runs have no hw_id)

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
# The board model. Ours: the boards as plain data (one line per panel in dashboard_boards.py) that
# grafana_boards hands to the SDK's builders, so only writing the JSON needs the optional SDK.


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False
    heatmap: bool = False  # Prometheus "heatmap" format: histogram buckets, de-accumulated by Grafana
    exemplar: bool = False
    unit: str | None = None  # when it differs from the panel's: its series get this unit on the right axis


@dataclass(frozen=True)
class TraceLink:
    """A data link from a panel's point to its traces: a title and an Explore URL."""

    title: str
    url: str


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
    links: Sequence[TraceLink] = ()
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
    items: Sequence[Panel | Row]
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
            for series in [base + s for s in HISTOGRAM_SUFFIXES] if group.instrument == "histogram" else [base]:
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
# Trace links (data links from step and stage panels to Jaeger and Tempo in Grafana's Explore).
# Ours: the SDK builds a data link from a URL, but has no builder for Explore's URL format.


def _explore_url(uid: str, kind: str, query: dict[str, Any]) -> str:
    """A Grafana Explore URL that opens ``query`` on data source ``uid`` over the dashboard's time range.

    Grafana's ``${...}`` placeholders stay unescaped so Grafana fills them in when the link is clicked.
    """
    panes = {
        "traces": {
            "datasource": uid,
            "queries": [{"refId": "A", "datasource": {"type": kind, "uid": uid}, **query}],
            "range": {"from": "${__from}", "to": "${__to}"},
        }
    }
    text = json.dumps(panes, separators=(",", ":"))
    return "/explore?schemaVersion=1&orgId=1&panes=" + urllib.parse.quote(text, safe="${}:._-")


def trace_links(operation: str, *, slower_than_value: bool = True, scope: str = "") -> list[TraceLink]:
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
        TraceLink(f"{what}{cond} in Jaeger", _explore_url(JAEGER_UID, "jaeger", jaeger)),
        TraceLink(f"{what}{cond} in Tempo", _explore_url(TEMPO_UID, "tempo", tempo)),
    ]


STEP_SPAN = N.RL_STEP_SPAN
TRAJECTORY_SPAN = N.RL_TRAJECTORY_SPAN
# The stage span of a series: the span name template with the series' rl_stage label filled in.
STAGE_SPAN_OF_SERIES = N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", "${__field.labels." + label(A.RL_STAGE) + "}")


# --------------------------------------------------------------------------------------------
# Template variables, GPU-only and agent-loop panels


def template_values(
    *,
    service: str,
    run: str,
    rate_interval: str = "1m",
    interval: str = "15s",
    range_: str = "1h",
    cluster: str = ALL_VALUE,
    rank: str = ALL_VALUE,
    device: str = ALL_VALUE,
) -> dict[str, str]:
    """Concrete values for every template variable the boards' queries use."""
    return {
        "service": service,
        "run": run,
        "cluster": cluster,
        "rank": rank,
        "device": device,
        "__rate_interval": rate_interval,
        "__interval": interval,
        "__range": range_,
    }


def uses_gpu_only_metric(expr: str, m: Metrics) -> bool:
    """Whether the expression reads a metric only a GPU produces (its panel is empty on a CPU run)."""
    return any(name in GPU_ONLY_METRICS for name in m.used_in(expr))


def uses_agent_loop_metric(expr: str, m: Metrics) -> bool:
    """Whether the expression reads a metric only agent trajectories produce (its panel is empty without them)."""
    return any(name in AGENT_LOOP_METRICS for name in m.used_in(expr))
