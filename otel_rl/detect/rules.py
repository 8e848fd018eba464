"""Online alert rules: their records (:class:`Rule`, :class:`Condition`, :class:`Selector`), the
YAML reader that checks them against the registry (:func:`parse_rules`, :func:`load_rules`), and
the built-in rules (:func:`default_rules`: the RL DFX composite rules and the fixed thresholds of a
6000-step GRPO analysis). A bad rules file fails here, with the rule and field named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

__all__ = [
    "ACTIONS_BUILTIN",
    "CONDITION_FIELDS",
    "Condition",
    "RULE_FIELDS",
    "Rule",
    "SEVERITIES",
    "Selector",
    "default_rules",
    "default_rules_yaml",
    "load_rules",
    "parse_rules",
]

SEVERITIES = tuple(m.value for m in A.RlAlertSeverityValues)


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


RULE_FIELDS = frozenset(
    {"name", "severity", "description", "all", "any", "within_steps", "cooldown_steps", "warmup_points", "window", "actions"}
)
CONDITION_FIELDS = frozenset(
    {
        "series",
        "metric",
        "attributes",
        "minus",
        "divided_by",
        "above",
        "below",
        "anomaly",
        "z",
        "factor",
        "min_change",
        "min_rel_change",
        "floor",
    }
)
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
        rules.append(
            Rule(
                name=name,
                severity=severity,
                conditions=conditions,
                mode=mode,
                description=str(raw.get("description", "")),
                actions=tuple(actions),
                **ints,
            )
        )
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
        raise FileNotFoundError(
            f"alert rules file {path} does not exist (set by alert_rules= / OTEL_RL_ALERT_RULES; use 'default' for the built-in rules)"
        ) from None
    except yaml.YAMLError as exc:
        raise ValueError(f"alert rules file {path} is not valid YAML: {exc}") from None
    return parse_rules(data, str(path))


def _default_rules_data() -> dict[str, Any]:
    kl_sources = [{"metric": M.RL_POLICY_KL}, {"metric": M.RL_LOSS, "attributes": {A.RL_LOSS_TYPE: A.RlLossTypeValues.KL.value}}]
    kl_reference = [
        {"metric": M.RL_POLICY_KL, "attributes": {A.RL_POLICY: A.RlPolicyValues.REFERENCE.value}},
        {"metric": M.RL_LOSS, "attributes": {A.RL_LOSS_TYPE: A.RlLossTypeValues.KL.value}},
    ]
    mean = {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}
    return {
        "rules": [
            {
                "name": "divergence",
                "severity": "critical",
                "within_steps": 2,
                "cooldown_steps": 20,
                "description": "Training divergence: KL, gradient norm and entropy anomalous together, "
                "each against its own recent baseline.",
                "all": [
                    {"series": kl_sources, "anomaly": "up", "factor": 5, "floor": 1.0},
                    {"series": [{"metric": M.RL_GRAD_NORM}], "anomaly": "up", "factor": 10, "floor": 1.0},
                    {"series": [{"metric": M.RL_POLICY_ENTROPY, "attributes": mean}], "anomaly": "any", "factor": 2, "min_change": 0.1},
                ],
            },
            {
                "name": "kl_above_threshold",
                "severity": "critical",
                "cooldown_steps": 20,
                "description": "KL to the reference policy above 10: snapshot and roll back.",
                "any": [{"series": kl_reference, "above": 10}],
            },
            {
                "name": "clipped_ratio_above_threshold",
                "severity": "warning",
                "cooldown_steps": 20,
                "description": "More than 30% of the responses truncated at the length limit : snapshot and roll back.",
                "any": [{"metric": M.RL_RESPONSE_CLIPPED_RATIO, "above": 0.3}],
            },
            {
                "name": "memory_risk",
                "severity": "critical",
                "within_steps": 0,
                "description": "GPU memory risk: peak reserved memory near the device limit while the "
                "reserved - allocated gap widens (fragmentation).",
                "all": [
                    {
                        "metric": M.RL_GPU_MEMORY_UTILIZATION,
                        "attributes": {A.RL_MEMORY_KIND: A.RlMemoryKindValues.MAX_RESERVED.value},
                        "above": 0.9,
                    },
                    {
                        "series": [
                            {
                                "metric": M.RL_GPU_MEMORY_USAGE,
                                "attributes": {A.RL_MEMORY_KIND: A.RlMemoryKindValues.RESERVED.value},
                                "minus": {A.RL_MEMORY_KIND: A.RlMemoryKindValues.ALLOCATED.value},
                            },
                            {"metric": M.RL_GPU_MEMORY_FRAGMENTATION},
                        ],
                        "anomaly": "up",
                        "factor": 1.25,
                        "z": 4,
                    },
                ],
            },
            {
                "name": "dynamic_batch_runaway",
                "severity": "warning",
                "description": "Dynamic batch runaway: the tokens of one step jump far above the recent steps.",
                "any": [
                    {
                        "series": [
                            {"metric": M.RL_STEP_TOKENS},
                            {"metric": M.RL_RANK_TOKENS, "attributes": {A.RL_STATISTIC: A.RlStatisticValues.MAX.value}},
                        ],
                        "anomaly": "up",
                        "factor": 2,
                        "min_change": 1000,
                    }
                ],
            },
            {
                "name": "rank_imbalance",
                "severity": "warning",
                "description": "Multi-rank imbalance: the slowest rank 30% above the median rank, or the "
                "busiest rank's tokens 50% above the mean rank.",
                "any": [
                    {"metric": M.RL_STRAGGLER_MARGIN, "above": 0.3},
                    {
                        "metric": M.RL_RANK_TOKENS,
                        "attributes": {A.RL_STATISTIC: A.RlStatisticValues.MAX.value},
                        "divided_by": {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value},
                        "above": 1.5,
                    },
                ],
            },
            {
                "name": "inference_anomaly",
                "severity": "warning",
                "description": "Inference anomaly: the rollout's abort ratio, timeout ratio or response "
                "clip ratio rising by more than 10 points over its recent baseline.",
                "any": [
                    {
                        "series": [
                            {"metric": M.RL_ROLLOUT_ABORT_RATIO},
                            {"metric": M.RL_ROLLOUT_TIMEOUT_RATIO},
                            {"metric": M.RL_RESPONSE_CLIPPED_RATIO},
                        ],
                        "anomaly": "up",
                        "min_change": 0.1,
                    }
                ],
            },
        ]
    }


def default_rules() -> list[Rule]:
    """The built-in alert rules (composite rules and fixed thresholds)."""
    return parse_rules(_default_rules_data(), "<default rules>")


def default_rules_yaml() -> str:
    """The built-in rules as a YAML file, a starting point for ``alert_rules: FILE``."""
    import yaml

    head = (
        '# otel-rl alert rules (the built-in defaults). Use with otel_rl.init(alert_rules="this.yaml") or\n'
        "# OTEL_RL_ALERT_RULES=this.yaml. Metrics and attributes are registry names (docs/semconv/).\n"
    )
    return head + yaml.safe_dump(_default_rules_data(), sort_keys=False, width=110)
