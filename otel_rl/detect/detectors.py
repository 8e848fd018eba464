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
  :func:`build_chains` (:mod:`otel_rl.detect.chains`) orders co-occurring findings by lead/lag.
- Online (inside training): :class:`AlertEngine` (this module) runs alert rules (:class:`Rule` in
  :mod:`otel_rl.detect.rules`, YAML-configurable; defaults: the RL DFX composite rules and the fixed
  thresholds of a 6000-step GRPO analysis) on the values each ``log()`` resolves, in the telemetry
  worker thread, and emits ``rl.alert`` events, counts ``rl.alert`` and calls hooks.

Both use :func:`baseline` (online, one value at a time) or :func:`rolling_baseline` (offline, the
same numbers vectorized), so an alert and an analyzer finding agree on what was anomalous.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The whole detection API stays importable from here: the baseline, the offline findings and
# chains, the rules.
from otel_rl.detect.baseline import MAD_TO_SIGMA, MEAN_AD_TO_SIGMA, DetectorConfig, baseline, is_anomalous, middle, rolling_baseline, spread  # noqa: F401
from otel_rl.detect.chains import CHAIN_KINDS, Chain, build_chains  # noqa: F401
from otel_rl.detect.findings import (  # noqa: F401
    FRACTION_METRICS,
    KINDS,
    LENGTH_METRICS,
    Finding,
    danger_bounds,
    detect_series,
    direction_of,
    format_number,
    min_change_for,
)
from otel_rl.detect.rules import SEVERITIES, Condition, Rule, Selector, default_rules, default_rules_yaml, load_rules, parse_rules  # noqa: F401
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
        body: dict[str, Any] = {"rule": self.name, "severity": self.severity, "message": self.message, "description": self.description}
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

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        emit: Callable[[Alert, Any], None] | None = None,
        report: Callable[[str, str, str], None] | None = None,
        keep: int = 1000,
    ) -> None:
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
            tuple(c for c, cond in enumerate(rule.conditions) if cond.anomaly is None) if rule.mode == "all" else () for rule in self.rules
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
    def observe(
        self, step: int | None, time_ns: int, resolved: Sequence[tuple[str, tuple[tuple[str, str], ...], float]], context: Any = None
    ) -> list[Alert]:
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
        return all((last := states[c].last_true_step) is not None and 0 <= now - last <= within for c in gates)

    def _derive(
        self,
        sel: Selector,
        metric: str,
        attrs: tuple[tuple[str, str], ...],
        value: float,
        current: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    ) -> float | None:
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

    def _evaluate(
        self, r: int, c: int, sel: Selector, attrs: tuple[tuple[str, str], ...], value: float, step: int | None, *, test: bool
    ) -> None:
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
            if cond.anomaly == "up" and cond.floor is not None and value < cond.floor:
                return None  # under the floor: refused below whatever the baseline (checked first: it is cheap)
            # is_anomalous() in the order of cost: every test that needs the median alone first.
            ordered = sorted(window)
            med = middle(ordered)
            up = value >= med
            if cond.anomaly == "up" and not up or cond.anomaly == "down" and up:
                return None
            delta = abs(value - med)
            if not (delta >= cond.min_rel_change * abs(med) and delta >= cond.min_change):
                return None
            if cond.factor is not None:
                if up and not (med > 0 and value >= cond.factor * med or med <= 0 and value > 0):
                    return None
                if not up and not (med > 0 and value <= med / cond.factor):
                    return None
            if cond.floor is not None and (value < cond.floor if up else value > cond.floor):
                return None
            scale = spread(ordered, med)
            if not delta >= cond.z * scale:
                return None
            out.update({"baseline": med, "scale": scale, "z": (value - med) / scale})
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
        return Alert(
            name=rule.name,
            severity=rule.severity,
            step=step,
            time_ns=time_ns,
            message=message,
            description=rule.description,
            conditions=conditions,
            actions=rule.actions,
        )

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
                self._report(
                    f"<hook {name}>",
                    type(exc).__name__,
                    f"otel-rl: on_alert hook {name} raised {exc!r} for alert {alert.name!r}; "
                    "it is still called for later alerts (reported once)",
                )


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
