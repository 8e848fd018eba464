"""Anomaly detectors for RL training metrics: one core for the offline analyzer and the online alerts.

The core is a robust baseline (:mod:`otel_rl.detect.baseline`): the median and a spread estimate of the
previous ``window`` values of a series (:func:`baseline`). A value is anomalous when its robust
z-score ``(value - median) / scale`` passes a threshold AND the change is large in the metric's own
terms (a fraction of the median, an absolute amount): fixed thresholds alone would fire on one
metric's noise and miss another's collapse, z-scores alone would fire on a series that is constant
but for its rounding.

- Offline (``otel-rl analyze``): :func:`detect_series` (:mod:`otel_rl.detect.findings`) turns a whole
  series into findings (threshold, spike, level shift, collapse, explosion, drift, pinned-at-limit,
  periodic) with their first and last step, magnitude against the baseline and recovery;
  :func:`build_chains` orders co-occurring findings by lead/lag.
- Online (inside training): :class:`AlertEngine` runs alert rules (:class:`Rule`, YAML-configurable;
  defaults: the RL DFX composite rules and the fixed thresholds of a 6000-step GRPO analysis) on the
  values each ``log()`` resolves, in the telemetry worker thread, and emits ``rl.alert`` events,
  counts ``rl.alert`` and calls hooks.

Both use :func:`baseline` (online, one value at a time) or :func:`rolling_baseline` (offline, the
same numbers vectorized), so an alert and an analyzer finding agree on what was anomalous.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_rl.detect.baseline import MAD_TO_SIGMA, MEAN_AD_TO_SIGMA, DetectorConfig, baseline, is_anomalous, rolling_baseline  # noqa: F401
from otel_rl.detect.findings import (FRACTION_METRICS, KINDS, LENGTH_METRICS, Finding, danger_bounds, format_number,  # noqa: F401
                        detect_series, direction_of, min_change_for)
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

logger = logging.getLogger("otel_rl")

__all__ = [
    "Alert",
    "AlertEngine",
    "Chain",
    "Condition",
    "DetectorConfig",
    "FRACTION_METRICS",
    "Finding",
    "KINDS",
    "LENGTH_METRICS",
    "Rule",
    "Selector",
    "baseline",
    "build_alert_engine",
    "build_chains",
    "danger_bounds",
    "default_rules",
    "default_rules_yaml",
    "detect_series",
    "direction_of",
    "format_number",
    "is_anomalous",
    "load_rules",
    "min_change_for",
    "parse_rules",
    "rolling_baseline",
    "telemetry_sink",
]

SEVERITIES = tuple(m.value for m in A.RlAlertSeverityValues)


# ==================================================================================================
# Offline: chains of co-occurring findings


# Reading order for findings of the same step: the chain seen in a 6000-step GRPO run, KL -> ratio/clip -> length ->
# entropy -> reward -> loss -> grad norm.
_CAUSAL_RANK = {
    M.RL_POLICY_KL: 0, M.RL_POLICY_RATIO: 1, M.RL_CLIP_FRACTION: 1, M.RL_RESPONSE_LENGTH: 2,
    M.RL_RESPONSE_CLIPPED_RATIO: 2, M.RL_RESPONSE_TERMINATED_LENGTH: 2, M.RL_POLICY_ENTROPY: 3, M.RL_REWARD: 4,
    M.RL_REWARD_COMPONENT: 4, M.RL_SCORE: 4, M.RL_VALIDATION_SCORE: 4, M.RL_LOSS: 5, M.RL_GRAD_NORM: 6,
}
CHAIN_KINDS = frozenset({"spike", "level shift", "collapse", "explosion"})


def _rank(f: Finding) -> int:
    if f.metric == M.RL_LOSS and f.attributes.get(A.RL_LOSS_TYPE) == A.RlLossTypeValues.KL.value:
        return 0
    return _CAUSAL_RANK.get(f.metric, 7)


def _family(f: Finding) -> tuple[str, tuple[tuple[str, str], ...]]:
    return f.metric, tuple(sorted((k, v) for k, v in f.attributes.items() if k != A.RL_STATISTIC))


@dataclass
class Chain:
    """Findings of different metrics that happened together, in lead/lag order."""

    findings: list[Finding]
    first_step: int
    last_step: int
    divergence: bool = False  # KL, grad norm and entropy or reward all in it (the composite divergence rule)

    def text(self) -> str:
        start = self.findings[0].first_step
        parts = []
        for f in self.findings:
            lag = f.first_step - start
            parts.append(f"{f.series} {f.kind} {f.direction} @{f.first_step}" + (f" (+{lag})" if lag else ""))
        return " -> ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_step": self.first_step, "last_step": self.last_step, "divergence": self.divergence,
            "order": [{"series": f.series, "metric": f.metric, "kind": f.kind, "direction": f.direction,
                       "first_step": f.first_step, "lag_steps": f.first_step - self.first_step} for f in self.findings],
            "text": self.text(),
        }


def build_chains(findings: Iterable[Finding], *, gap_steps: int = 1) -> list[Chain]:
    """Group findings of different metric families whose [first, last] steps overlap or lie within
    ``gap_steps`` of each other; order each group by first step, then by the causal reading order.
    Periodic, pinned and improving (good-direction) findings are states, not links of a chain."""
    events = sorted((f for f in findings if f.kind in CHAIN_KINDS and f.bad is not False),
                    key=lambda f: (f.first_step, _rank(f)))
    groups: list[list[Finding]] = []
    end = None
    for f in events:
        if groups and end is not None and f.first_step <= end + gap_steps:
            groups[-1].append(f)
            end = max(end, f.last_step)
        else:
            groups.append([f])
            end = f.last_step
    chains = []
    for group in groups:
        seen: dict[tuple[str, tuple[tuple[str, str], ...]], Finding] = {}
        for f in group:
            key = _family(f)
            if key not in seen:  # the earliest finding of a metric family stands for it
                seen[key] = f
        members = sorted(seen.values(), key=lambda f: (f.first_step, _rank(f), f.series))
        if len({f.metric for f in members}) < 2:
            continue
        metrics = {f.metric for f in members} | {M.RL_POLICY_KL for f in members if _rank(f) == 0}
        divergence = M.RL_POLICY_KL in metrics and M.RL_GRAD_NORM in metrics and bool(
            metrics & {M.RL_POLICY_ENTROPY, M.RL_REWARD, M.RL_REWARD_COMPONENT, M.RL_SCORE})
        chains.append(Chain(members, min(f.first_step for f in members), max(f.last_step for f in members), divergence))
    return chains


# ==================================================================================================
# Online: rules


@dataclass(frozen=True)
class Selector:
    """A registry metric and attributes its series must have (a subset match). ``minus`` /
    ``divided_by``: attribute overrides naming a second series of the same metric (and otherwise
    the same attributes) that is subtracted from / divides this one, e.g. reserved - allocated."""

    metric: str
    attributes: tuple[tuple[str, str], ...] = ()
    minus: tuple[tuple[str, str], ...] | None = None
    divided_by: tuple[tuple[str, str], ...] | None = None

    def matches(self, metric: str, attrs: Mapping[str, Any]) -> bool:
        return metric == self.metric and all(attrs.get(k) == v for k, v in self.attributes)


@dataclass(frozen=True)
class Condition:
    """One test on the series a selector matches: a threshold (``above`` / ``below``) and/or an
    anomaly against the series' own robust baseline (``anomaly``: up, down or any; ``z``;
    ``factor``: value >= factor x median for up, <= median / factor for down; ``min_change``: an
    absolute change; ``floor``: the value itself must pass it, above for up, below for down)."""

    series: tuple[Selector, ...]
    above: float | None = None
    below: float | None = None
    anomaly: str | None = None
    z: float = 6.0
    factor: float | None = None
    min_change: float = 0.0
    min_rel_change: float = 0.1
    floor: float | None = None

    def describe(self) -> str:
        names = " or ".join(_selector_text(s) for s in self.series)
        parts = []
        if self.above is not None:
            parts.append(f"> {self.above:g}")
        if self.below is not None:
            parts.append(f"< {self.below:g}")
        if self.anomaly:
            extra = [f"z >= {self.z:g}"]
            if self.factor:
                extra.append(f"x{self.factor:g} its median" if self.anomaly == "up" else f"1/{self.factor:g} of its median")
            if self.min_change:
                extra.append(f"by >= {self.min_change:g}")
            if self.floor is not None:
                extra.append(f"{'>=' if self.anomaly != 'down' else '<='} {self.floor:g}")
            parts.append(f"anomalous {self.anomaly} ({', '.join(extra)})")
        return f"{names} {' and '.join(parts)}"


def _selector_text(sel: Selector) -> str:
    text = sel.metric + ("{" + ",".join(f"{k}={v}" for k, v in sel.attributes) + "}" if sel.attributes else "")
    if sel.minus is not None:
        text += " - {" + ",".join(f"{k}={v}" for k, v in sel.minus) + "}"
    if sel.divided_by is not None:
        text += " / {" + ",".join(f"{k}={v}" for k, v in sel.divided_by) + "}"
    return text


@dataclass(frozen=True)
class Rule:
    """An alert rule: ``all`` conditions within ``within_steps`` steps of each other, or ``any``."""

    name: str
    severity: str
    conditions: tuple[Condition, ...]
    mode: str = "all"  # "all" | "any"
    description: str = ""
    within_steps: int = 0
    cooldown_steps: int = 10
    warmup_points: int = 5  # values a series needs before its conditions count (a run's first steps)
    window: int = 30
    actions: tuple[str, ...] = ()  # "stop" sets Telemetry.should_stop; other names are for hooks


RULE_FIELDS = frozenset({"name", "severity", "description", "all", "any", "within_steps", "cooldown_steps",
                         "warmup_points", "window", "actions"})
CONDITION_FIELDS = frozenset({"series", "metric", "attributes", "minus", "divided_by", "above", "below", "anomaly", "z",
                              "factor", "min_change", "min_rel_change", "floor"})
ACTIONS_BUILTIN = ("stop",)


def _attribute_names() -> frozenset[str]:
    return frozenset(v for k, v in vars(A).items() if k.isupper() and isinstance(v, str))


def _pairs(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping attribute -> value, got {raw!r}")
    known = _attribute_names()
    bad = [k for k in raw if k not in known]
    if bad:
        raise ValueError(f"{where}: unknown attribute(s) {bad} (registry attributes such as {A.RL_STATISTIC}, {A.RL_POLICY})")
    return tuple(sorted((str(k), _scalar(v)) for k, v in raw.items()))


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _number(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ValueError(f"{where}: expected a number, got {raw!r}")
    return float(raw)


def _selector(raw: Any, where: str) -> Selector:
    if not isinstance(raw, Mapping) or "metric" not in raw:
        raise ValueError(f"{where}: a series is {{metric: <registry metric>, attributes: {{...}}}}, got {raw!r}")
    metric = raw["metric"]
    if metric not in METRICS:
        raise ValueError(f"{where}: {metric!r} is not a registry metric (see docs/semconv/ or otel_rl.semconv.metrics)")
    unknown = sorted(set(raw) - {"metric", "attributes", "minus", "divided_by"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown} (metric, attributes, minus, divided_by)")
    minus = _pairs(raw.get("minus"), f"{where}.minus") if raw.get("minus") is not None else None
    divided = _pairs(raw.get("divided_by"), f"{where}.divided_by") if raw.get("divided_by") is not None else None
    return Selector(metric, _pairs(raw.get("attributes"), f"{where}.attributes"), minus, divided)


def _condition(raw: Any, where: str) -> Condition:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: a condition is a mapping, got {raw!r}")
    unknown = sorted(set(raw) - CONDITION_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(CONDITION_FIELDS)}")
    if "series" in raw:
        items = raw["series"]
        if not isinstance(items, list) or not items:
            raise ValueError(f"{where}.series: expected a non-empty list of {{metric: ..., attributes: ...}}")
        series = tuple(_selector(item, f"{where}.series[{i}]") for i, item in enumerate(items))
    else:
        series = (_selector({k: raw[k] for k in ("metric", "attributes", "minus", "divided_by") if k in raw}, where),)
    anomaly = raw.get("anomaly")
    if anomaly not in (None, "up", "down", "any"):
        raise ValueError(f"{where}.anomaly: expected up, down or any, got {anomaly!r}")
    cond = Condition(
        series=series,
        above=_number(raw["above"], f"{where}.above") if raw.get("above") is not None else None,
        below=_number(raw["below"], f"{where}.below") if raw.get("below") is not None else None,
        anomaly=anomaly,
        z=_number(raw.get("z", 6.0), f"{where}.z"),
        factor=_number(raw["factor"], f"{where}.factor") if raw.get("factor") is not None else None,
        min_change=_number(raw.get("min_change", 0.0), f"{where}.min_change"),
        min_rel_change=_number(raw.get("min_rel_change", 0.1), f"{where}.min_rel_change"),
        floor=_number(raw["floor"], f"{where}.floor") if raw.get("floor") is not None else None,
    )
    if cond.above is None and cond.below is None and cond.anomaly is None:
        raise ValueError(f"{where}: a condition needs above, below or anomaly")
    return cond


def parse_rules(data: Any, source: str = "<rules>") -> list[Rule]:
    """Rules from the parsed YAML document ``{rules: [...]}``; errors name ``source`` and the rule."""
    if not isinstance(data, Mapping) or not isinstance(data.get("rules"), list):
        raise ValueError(f"{source}: expected a mapping with a `rules:` list")
    rules: list[Rule] = []
    names: set[str] = set()
    for index, raw in enumerate(data["rules"]):
        where = f"{source}: rules[{index}]"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: a rule is a mapping")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: `name` is required")
        where = f"{source}: rule {name!r}"
        unknown = sorted(set(raw) - RULE_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(RULE_FIELDS)}")
        if name in names:
            raise ValueError(f"{where}: two rules are named {name!r}")
        names.add(name)
        severity = raw.get("severity", "warning")
        if severity not in SEVERITIES:
            raise ValueError(f"{where}: severity {severity!r} is not one of {SEVERITIES}")
        if ("all" in raw) == ("any" in raw):
            raise ValueError(f"{where}: give exactly one of `all:` (every condition) or `any:` (one is enough)")
        mode = "all" if "all" in raw else "any"
        items = raw[mode]
        if not isinstance(items, list) or not items:
            raise ValueError(f"{where}.{mode}: expected a non-empty list of conditions")
        conditions = tuple(_condition(item, f"{where}.{mode}[{i}]") for i, item in enumerate(items))
        actions = raw.get("actions") or []
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise ValueError(f"{where}.actions: expected a list of names (built in: {', '.join(ACTIONS_BUILTIN)})")
        ints = {}
        for key, default in (("within_steps", 0), ("cooldown_steps", 10), ("warmup_points", 5), ("window", 30)):
            value = raw.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
            ints[key] = value
        if ints["window"] < 3:
            raise ValueError(f"{where}.window: at least 3 values")
        rules.append(Rule(name=name, severity=severity, conditions=conditions, mode=mode,
                          description=str(raw.get("description", "")), actions=tuple(actions), **ints))
    return rules


def load_rules(source: str | Path | None) -> list[Rule]:
    """``"default"`` (or None): the built-in rules; ``"off"`` / ``"none"``: none; else a YAML file."""
    if source is None or str(source) == "default":
        return default_rules()
    if str(source).lower() in ("off", "none", "false", "0"):
        return []
    import yaml

    path = Path(source)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"alert rules file {path} does not exist (set by alert_rules= / OTEL_RL_ALERT_RULES; "
                                "use 'default' for the built-in rules)") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"alert rules file {path} is not valid YAML: {exc}") from None
    return parse_rules(data, str(path))


def _default_rules_data() -> dict[str, Any]:
    kl_sources = [{"metric": M.RL_POLICY_KL}, {"metric": M.RL_LOSS, "attributes": {A.RL_LOSS_TYPE: A.RlLossTypeValues.KL.value}}]
    kl_reference = [{"metric": M.RL_POLICY_KL, "attributes": {A.RL_POLICY: A.RlPolicyValues.REFERENCE.value}},
                    {"metric": M.RL_LOSS, "attributes": {A.RL_LOSS_TYPE: A.RlLossTypeValues.KL.value}}]
    mean = {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}
    return {"rules": [
        {"name": "divergence", "severity": "critical", "within_steps": 2, "cooldown_steps": 20,
         "description": "Training divergence: KL, gradient norm and entropy anomalous together, "
                        "each against its own recent baseline.",
         "all": [
             {"series": kl_sources, "anomaly": "up", "factor": 5, "floor": 1.0},
             {"series": [{"metric": M.RL_GRAD_NORM}], "anomaly": "up", "factor": 10, "floor": 1.0},
             {"series": [{"metric": M.RL_POLICY_ENTROPY, "attributes": mean}], "anomaly": "any", "factor": 2, "min_change": 0.1},
         ]},
        {"name": "kl_above_threshold", "severity": "critical", "cooldown_steps": 20,
         "description": "KL to the reference policy above 10: snapshot and roll back.",
         "any": [{"series": kl_reference, "above": 10}]},
        {"name": "clipped_ratio_above_threshold", "severity": "warning", "cooldown_steps": 20,
         "description": "More than 30% of the responses truncated at the length limit : snapshot and roll back.",
         "any": [{"metric": M.RL_RESPONSE_CLIPPED_RATIO, "above": 0.3}]},
        {"name": "memory_risk", "severity": "critical", "within_steps": 0,
         "description": "GPU memory risk: peak reserved memory near the device limit while the "
                        "reserved - allocated gap widens (fragmentation).",
         "all": [
             {"metric": M.RL_GPU_MEMORY_UTILIZATION, "attributes": {A.RL_MEMORY_KIND: A.RlMemoryKindValues.MAX_RESERVED.value},
              "above": 0.9},
             {"series": [{"metric": M.RL_GPU_MEMORY_USAGE, "attributes": {A.RL_MEMORY_KIND: A.RlMemoryKindValues.RESERVED.value},
                          "minus": {A.RL_MEMORY_KIND: A.RlMemoryKindValues.ALLOCATED.value}},
                         {"metric": M.RL_GPU_MEMORY_FRAGMENTATION}],
              "anomaly": "up", "factor": 1.25, "z": 4},
         ]},
        {"name": "dynamic_batch_runaway", "severity": "warning",
         "description": "Dynamic batch runaway: the tokens of one step jump far above the recent steps.",
         "any": [{"series": [{"metric": M.RL_STEP_TOKENS},
                             {"metric": M.RL_RANK_TOKENS, "attributes": {A.RL_STATISTIC: A.RlStatisticValues.MAX.value}}],
                  "anomaly": "up", "factor": 2, "min_change": 1000}]},
        {"name": "rank_imbalance", "severity": "warning",
         "description": "Multi-rank imbalance: the slowest rank 30% above the median rank, or the "
                        "busiest rank's tokens 50% above the mean rank.",
         "any": [{"metric": M.RL_STRAGGLER_MARGIN, "above": 0.3},
                 {"metric": M.RL_RANK_TOKENS, "attributes": {A.RL_STATISTIC: A.RlStatisticValues.MAX.value},
                  "divided_by": {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}, "above": 1.5}]},
        {"name": "inference_anomaly", "severity": "warning",
         "description": "Inference anomaly: the rollout's abort ratio, timeout ratio or response "
                        "clip ratio rising by more than 10 points over its recent baseline.",
         "any": [{"series": [{"metric": M.RL_ROLLOUT_ABORT_RATIO}, {"metric": M.RL_ROLLOUT_TIMEOUT_RATIO},
                             {"metric": M.RL_RESPONSE_CLIPPED_RATIO}],
                  "anomaly": "up", "min_change": 0.1}]},
    ]}


def default_rules() -> list[Rule]:
    """The built-in alert rules (composite rules and fixed thresholds)."""
    return parse_rules(_default_rules_data(), "<default rules>")


def default_rules_yaml() -> str:
    """The built-in rules as a YAML file, a starting point for ``alert_rules: FILE``."""
    import yaml

    head = ("# otel-rl alert rules (the built-in defaults). Use with otel_rl.init(alert_rules=\"this.yaml\") or\n"
            "# OTEL_RL_ALERT_RULES=this.yaml. Metrics and attributes are registry names (docs/semconv/).\n")
    return head + yaml.safe_dump(_default_rules_data(), sort_keys=False, width=110)


# ==================================================================================================
# Online: the engine


@dataclass
class Alert:
    """One firing of a rule."""

    name: str
    severity: str
    step: int | None
    time_ns: int
    message: str
    description: str
    conditions: list[dict[str, Any]]
    actions: tuple[str, ...] = ()

    def as_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"rule": self.name, "severity": self.severity, "message": self.message,
                                "description": self.description}
        if self.step is not None:
            body["step"] = self.step
        for i, cond in enumerate(self.conditions):
            for key, value in cond.items():
                body[f"conditions/{i}/{key}"] = value
        if self.actions:
            body["actions"] = ",".join(self.actions)
        return body


class _SeriesWindow:
    __slots__ = ("values",)

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)


class _CondState:
    __slots__ = ("cond", "windows", "last_true_step", "last_hit")

    def __init__(self, cond: Condition) -> None:
        self.cond = cond
        self.windows: dict[tuple[Any, ...], _SeriesWindow] = {}
        self.last_true_step: int | None = None
        self.last_hit: dict[str, Any] | None = None


class AlertEngine:
    """Evaluates rules on resolved values, one ``observe()`` per ``log()``; thread-compatible (one
    worker calls ``observe``; ``should_stop`` / ``take_alerts`` may be read from any thread).

    ``emit(alert)`` publishes an alert (the telemetry's event + counter); hooks added with
    :meth:`add_hook` are called after it, each guarded so a failing hook is reported once and
    never stops the others or the telemetry.
    """

    def __init__(self, rules: Sequence[Rule], *, emit: Callable[[Alert, Any], None] | None = None,
                 report: Callable[[str, str, str], None] | None = None, keep: int = 1000) -> None:
        self.rules = tuple(rules)
        self._emit = emit
        self._report = report or (lambda key, reason, message: logger.warning(message))
        self._hooks: list[Callable[[Alert], Any]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: deque[Alert] = deque(maxlen=keep)
        self.fired: deque[Alert] = deque(maxlen=keep)
        self._states: list[list[_CondState]] = [[_CondState(c) for c in rule.conditions] for rule in self.rules]
        self._last_fired: list[int | None] = [None] * len(self.rules)
        # metric -> [(rule index, condition index, selector)]: values of other metrics cost one dict miss
        self._by_metric: dict[str, list[tuple[int, int, Selector]]] = {}
        for r, rule in enumerate(self.rules):
            for c, cond in enumerate(rule.conditions):
                for sel in cond.series:
                    self._by_metric.setdefault(sel.metric, []).append((r, c, sel))
        self.watched_metrics = frozenset(self._by_metric)
        # (metric, attributes) -> the selectors that match that series: computed once per series
        self._matches: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[int, int, Selector]]] = {}
        # For an `all` rule, the anomaly tests (a sort of the window each) are skipped while one of its
        # threshold-only conditions does not hold: the windows still take every value.
        self._gates: list[tuple[int, ...]] = [
            tuple(c for c, cond in enumerate(rule.conditions) if cond.anomaly is None) if rule.mode == "all" else ()
            for rule in self.rules
        ]

    # -- public ----------------------------------------------------------------------------------
    def add_hook(self, hook: Callable[[Alert], Any]) -> None:
        if not callable(hook):
            raise TypeError(f"on_alert takes a callable (alert) -> None, got {type(hook).__name__}")
        self._hooks.append(hook)

    @property
    def should_stop(self) -> bool:
        return self._stop.is_set()

    def clear_stop(self) -> None:
        self._stop.clear()

    def take_alerts(self) -> list[Alert]:
        """Alerts fired since the last call (for a training loop that acts on its own thread)."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
        return out

    # -- the worker's side ------------------------------------------------------------------------
    def observe(self, step: int | None, time_ns: int, resolved: Sequence[tuple[str, tuple[tuple[str, str], ...], float]],
                context: Any = None) -> list[Alert]:
        """Feed one log() call's resolved values ``(metric, attributes, value)``; returns new alerts."""
        by_metric = self._by_metric
        hits = [(metric, attrs, value) for metric, attrs, value in resolved if metric in by_metric]
        if not hits:
            return []
        current = {(metric, attrs): value for metric, attrs, value in hits}
        touched: set[int] = set()
        deferred = []
        for metric, attrs, value in hits:
            matched = self._matches.get((metric, attrs))
            if matched is None:
                attr_map = dict(attrs)
                matched = self._matches[(metric, attrs)] = [m for m in by_metric[metric] if m[2].matches(metric, attr_map)]
            for r, c, sel in matched:
                if self.rules[r].conditions[c].anomaly is not None:
                    deferred.append((r, c, sel, metric, attrs, value))  # after this call's thresholds
                    continue
                derived = self._derive(sel, metric, attrs, value, current)
                if derived is not None:
                    touched.add(r)
                    self._evaluate(r, c, sel, attrs, derived, step, test=True)
        gates: dict[int, bool] = {}
        for r, c, sel, metric, attrs, value in deferred:
            derived = self._derive(sel, metric, attrs, value, current)
            if derived is None:
                continue
            touched.add(r)
            gate = gates.get(r)
            if gate is None:
                gate = gates[r] = self._gate_open(r, step)
            self._evaluate(r, c, sel, attrs, derived, step, test=gate)
        fired = []
        for r in sorted(touched):
            alert = self._maybe_fire(r, step, time_ns)
            if alert is not None:
                fired.append(alert)
                self._publish(alert, context)
        return fired

    def _gate_open(self, r: int, step: int | None) -> bool:
        gates = self._gates[r]
        if not gates:
            return True
        now = step if step is not None else -1
        within = self.rules[r].within_steps
        states = self._states[r]
        return all(states[c].last_true_step is not None and 0 <= now - states[c].last_true_step <= within for c in gates)

    def _derive(self, sel: Selector, metric: str, attrs: tuple[tuple[str, str], ...], value: float,
                current: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]) -> float | None:
        if sel.minus is None and sel.divided_by is None:
            return value
        other_attrs = dict(attrs)
        other_attrs.update(sel.minus if sel.minus is not None else sel.divided_by or ())
        other = current.get((metric, tuple(sorted(other_attrs.items()))))
        if other is None:
            return None
        if sel.minus is not None:
            return value - other
        return value / other if other else None

    def _evaluate(self, r: int, c: int, sel: Selector, attrs: tuple[tuple[str, str], ...], value: float, step: int | None,
                  *, test: bool) -> None:
        rule = self.rules[r]
        state = self._states[r][c]
        cond = state.cond
        key = (sel, attrs)
        window = state.windows.get(key)
        if window is None:
            window = state.windows[key] = _SeriesWindow(rule.window)
        values = window.values
        ready = test and len(values) >= rule.warmup_points
        hit: dict[str, Any] | None = None
        if ready:
            hit = self._test(cond, values, value)
        values.append(value)
        if hit is not None:
            hit = {"metric": sel.metric, **{f"attributes/{k}": v for k, v in attrs}, **hit}
            state.last_true_step = step if step is not None else -1
            state.last_hit = hit

    @staticmethod
    def _test(cond: Condition, window: Sequence[float], value: float) -> dict[str, Any] | None:
        out: dict[str, Any] = {"value": value}
        if cond.above is not None:
            if not value > cond.above:
                return None
            out["above"] = cond.above
        if cond.below is not None:
            if not value < cond.below:
                return None
            out["below"] = cond.below
        if cond.anomaly is not None:
            med, scale = baseline(window)
            z = (value - med) / scale
            up = value >= med
            if cond.anomaly == "up" and not up or cond.anomaly == "down" and up:
                return None
            if not is_anomalous(value, med, scale, z=cond.z, min_rel_change=cond.min_rel_change, min_change=cond.min_change):
                return None
            if cond.factor is not None:
                if up and not (med > 0 and value >= cond.factor * med or med <= 0 and value > 0):
                    return None
                if not up and not (med > 0 and value <= med / cond.factor):
                    return None
            if cond.floor is not None and (value < cond.floor if up else value > cond.floor):
                return None
            out.update({"baseline": med, "scale": scale, "z": z})
        return out

    def _maybe_fire(self, r: int, step: int | None, time_ns: int) -> Alert | None:
        rule = self.rules[r]
        states = self._states[r]
        now = step if step is not None else -1
        if rule.mode == "all":
            ok = all(s.last_true_step is not None and 0 <= now - s.last_true_step <= rule.within_steps for s in states)
            held = states
        else:
            held = [s for s in states if s.last_true_step == now]
            ok = bool(held)
        if not ok:
            return None
        last = self._last_fired[r]
        if last is not None and 0 <= now - last < max(rule.cooldown_steps, 1):
            return None
        self._last_fired[r] = now
        conditions = [dict(s.last_hit or {}) for s in held]
        for s in held:  # a condition is used once: the next firing needs fresh evidence
            s.last_true_step = None
        parts = []
        for cond in conditions:
            name = cond.get("metric", "?")
            text = f"{name}={format_number(float(cond['value']))}"
            if "baseline" in cond:
                text += f" (baseline {format_number(float(cond['baseline']))}, z {float(cond['z']):+.1f})"
            parts.append(text)
        where = f"step {step}" if step is not None else "a log() without a step"
        message = f"{rule.name} at {where}: " + "; ".join(parts)
        return Alert(name=rule.name, severity=rule.severity, step=step, time_ns=time_ns, message=message,
                     description=rule.description, conditions=conditions, actions=rule.actions)

    def _publish(self, alert: Alert, context: Any) -> None:
        with self._lock:
            self._pending.append(alert)
            self.fired.append(alert)
        if "stop" in alert.actions:
            self._stop.set()
        if self._emit is not None:
            try:
                self._emit(alert, context)
            except Exception as exc:  # publishing must never stop detection
                self._report("<alerts>", "emit", f"otel-rl: could not emit alert {alert.name!r}: {exc!r}")
        for hook in list(self._hooks):
            try:
                hook(alert)
            except Exception as exc:
                name = getattr(hook, "__qualname__", repr(hook))
                self._report(f"<hook {name}>", type(exc).__name__,
                             f"otel-rl: on_alert hook {name} raised {exc!r} for alert {alert.name!r}; "
                             "it is still called for later alerts (reported once)")


def telemetry_sink(pipeline: Any, latest: Any) -> Callable[[Alert, Any], None]:
    """An ``emit`` for :class:`AlertEngine` inside telemetry: the ``rl.alert`` event through the
    pipeline's event path (on the worker, with the step's own time and trace) and +1 on ``rl.alert``."""

    def emit(alert: Alert, span_context: Any) -> None:
        attrs: dict[str, Any] = {A.RL_ALERT_NAME: alert.name, A.RL_ALERT_SEVERITY: alert.severity}
        if alert.step is not None:
            attrs[A.RL_STEP] = alert.step
        pipeline.emit_event(N.RL_ALERT_EVENT, alert.as_body(), attrs, alert.time_ns, span_context)
        latest.add(M.RL_ALERT, ((A.RL_ALERT_NAME, alert.name), (A.RL_ALERT_SEVERITY, alert.severity)), 1)

    return emit


def build_alert_engine(source: str | None, pipeline: Any, latest: Any) -> AlertEngine | None:
    """The engine a Telemetry runs (None when the rules are off), publishing through its pipeline.
    A bad rules file raises here, at ``init()``, never in the training loop."""
    rules = load_rules(source)
    if not rules:
        return None
    return AlertEngine(rules, emit=telemetry_sink(pipeline, latest), report=pipeline.report_once)
