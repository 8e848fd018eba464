"""How a step's values are applied, planned once: per key (``Plan``: the metric, attributes and
conversion a key resolves to, kept in a bounded ``KeyPlans``) and per key set (``StepPlan``: where a whole step's values go, for the
telemetry worker's bulk path, kept in a bounded ``KeySets``), and ``packed_step``: the caller's half
of that path."""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Mapping
from operator import countOf
from typing import Any, TypeVar

from otel_rl._sdk.keys.resolver import RESOLUTION_CACHE_LIMIT, KeyResolver
from otel_rl._sdk.pipeline.aggregation import Attrs, BulkHistograms, LatestValues, SlotRow
from otel_rl._sdk.pipeline.summary import HEADLINE_LABELS
from otel_rl._sdk.pipeline.values import FLOAT_TYPES
from otel_rl.semconv import METRICS


class Plan:
    """How a key's values are applied, computed once per key."""

    __slots__ = ("metric", "attrs", "transform", "histogram", "counter_overflow")

    def __init__(
        self, metric: str, attrs: Attrs, transform: Callable[[Any], float] | None, histogram: bool, counter_overflow: bool
    ) -> None:
        self.metric = metric
        self.attrs = attrs
        self.transform = transform
        self.histogram = histogram
        self.counter_overflow = counter_overflow


class KeyPlans:
    """The plan of each key, from its resolution: kept for up to ``RESOLUTION_CACHE_LIMIT`` keys (past
    it, a key is planned again each time it comes), so a stream of new keys holds a bounded number.
    The keys that are only counted (past the unmapped-key limit, or empty) share one plan per reason."""

    def __init__(self, resolver: KeyResolver, framework: str | None) -> None:
        self._resolver = resolver
        self._framework = framework
        self.by_key: dict[str, Plan] = {}
        self._counted: dict[Attrs, Plan] = {}

    def plan(self, key: str) -> Plan:
        plan = self.by_key.get(key)
        if plan is None:
            res = self._resolver.resolve(key, self._framework)
            if res.counted_only:
                plan = self._counted.get(res.attributes)
                if plan is None:
                    plan = self._counted[res.attributes] = Plan(res.metric, res.attributes, None, False, counter_overflow=True)
            else:
                mdef = METRICS.get(res.metric)
                plan = Plan(res.metric, tuple(res.attributes), res.transform, mdef is not None and mdef.instrument == "histogram", False)
            if len(self.by_key) < RESOLUTION_CACHE_LIMIT:
                self.by_key[key] = plan
        return plan


UNPLANNED: Any = object()  # sentinel in StepPlan | None lookups; Any so an identity check can rule it out
STEP_PLANS = 8  # key sets whose plans are kept
PLAN_TRIES = 3  # steps of a key set with a series that has no value yet, before it goes per key for good
KEY_SET_KEYS = 1 << 16  # keys held by the remembered key sets of one kind, all together

_V = TypeVar("_V")


class KeySets(dict[tuple[Any, ...], _V]):
    """What is remembered per key set (a step's keys, in order), bounded twice: at most ``limit``
    key sets and ``keys_limit`` keys in all, the oldest forgotten first, so that steps whose keys
    change every step (a step or a sample id inside the keys) hold a bounded number of key names.
    A key set larger than ``keys_limit`` alone is not remembered. Insert with :meth:`keep`."""

    def __init__(self, limit: int = STEP_PLANS, keys_limit: int = KEY_SET_KEYS) -> None:
        super().__init__()
        self.limit = limit
        self.keys_limit = keys_limit
        self.keys_held = 0

    def keep(self, keys: tuple[Any, ...], value: _V) -> None:
        if keys in self:
            self[keys] = value
            return
        if len(keys) > self.keys_limit:
            return
        while self and (len(self) >= self.limit or self.keys_held + len(keys) > self.keys_limit):
            self.pop(next(iter(self)))
        self[keys] = value
        self.keys_held += len(keys)

    def pop(self, keys: tuple[Any, ...], *default: Any) -> Any:  # type: ignore[override]
        if keys in self:
            self.keys_held -= len(keys)
        return super().pop(keys, *default)

    def clear(self) -> None:
        super().clear()
        self.keys_held = 0


class StepPlan:
    """What a step whose keys are exactly ``keys`` does, built once from the per-key plans after the
    first step with those keys took the per-key path: the latest-value slots its values go to and
    the linear transforms (``row``: a SlotRow), the timers' histograms, and the console summary's
    values (``headline``: index, label, factor).
    Only steps whose every key is a plain gauge or a linearly transformed one get a plan."""

    __slots__ = (
        "keys",
        "row",
        "series",
        "headline",
        "histograms",
        "histogram_rows",
        "histogram_values",
        "histogram_picker",
        "template",
        "int_templates",
        "packer",
        "packable",
    )

    def __init__(
        self,
        keys: list[str],
        slots: list[list[Any]],
        series: list[tuple[str, Attrs]],
        scaled: list[tuple[int, float]],
        headline: list[tuple[int, str]],
        histograms: list[tuple[int, Any]],
        histogram_rows: Any = None,
    ) -> None:
        self.keys, self.series = keys, series
        self.row = SlotRow(slots, scaled, frozenset(series))
        factors = dict(scaled)
        self.headline = [(index, label, factors.get(index, 1.0)) for index, label in headline]
        self.histograms = histograms  # (index, histogram state) of the keys recorded into histograms (timers)
        self.histogram_rows = histogram_rows  # where a step's row of those values goes (binned in bulk later)
        self.template: Any = None  # the step event's bytes around its numbers (the direct writers' templates)
        self.int_templates: dict[tuple[int, ...], Any] = {}  # the same, per set of positions holding ints
        # A float-only step packed by log() on the caller's thread, and its histogram values read back.
        self.packer = struct.Struct(f"<{len(keys)}d")
        # False once a step of these keys held an int or a value of another type (verl logs ints
        # every step): log() then copies such steps without first trying to pack them.
        self.packable = True
        indices = [i for i, _ in histograms]
        self.histogram_picker = struct.Struct("<" + "".join(f"{8 * (i - j - 1)}xd" for j, i in zip([-1, *indices], indices)))
        # the row of a step's histogram values in one C call (itemgetter of one index is no tuple)
        self.histogram_values = (
            operator.itemgetter(*indices) if len(indices) > 1 else (lambda floats: (floats[indices[0]],)) if indices else None
        )

    @classmethod
    def build(cls, plans: Mapping[str, Plan], latest: LatestValues, bulk: BulkHistograms, values: Mapping[Any, Any]) -> Any:
        """The plan from the per-key ``plans``; None when these keys always go per key;
        ``UNPLANNED`` to try again later."""
        keys = list(values)
        slots: list[list[Any]] = []
        series, scaled, headline, histograms = [], [], [], []
        for index, key in enumerate(keys):
            if type(key) is not str:
                return None
            plan = plans.get(key)
            if plan is None or plan.counter_overflow:
                return None
            if plan.transform is not None:
                factor = getattr(plan.transform, "factor", None)
                if factor is None:
                    return None
                scaled.append((index, factor))
            # A series with no value yet (the first one was NaN, or a stage span measured it) or
            # refused by the series cap: no plan now; the per-key path stores or counts it.
            if plan.histogram:
                state = bulk.series_state(plan.metric, plan.attrs)
                if state is None:
                    return UNPLANNED
                histograms.append((index, state))
                slots.append([0.0])  # the converted value, recorded from here
            else:
                slot = latest.series(plan.metric).get(plan.attrs)
                if slot is None:
                    return UNPLANNED
                slots.append(slot)
            series.append((plan.metric, plan.attrs))
            label = HEADLINE_LABELS.get(plan.metric)
            if label is not None:
                headline.append((index, label(plan.attrs)))
        factors = dict(scaled)
        rows = bulk.rows([state for _, state in histograms], [factors.get(i, 1.0) for i, _ in histograms]) if histograms else None
        return cls(keys, slots, series, scaled, headline, histograms, rows)


def packed_step(plans: Mapping[tuple[Any, ...], StepPlan | None], values: dict[Any, Any]) -> tuple[StepPlan, bytes] | None:
    """For ``log()``, on the caller's thread: a step of a key set the worker has a plan for, every
    value a float (Python's or a numpy float scalar), as its plan and its values packed in key order (one C call over objects
    this thread just made: the worker then touches one buffer instead of every key and value).
    None for anything else: the worker's per-step paths take it."""
    plan = plans.get(tuple(values))
    if plan is None or not plan.packable:
        return None
    # Python floats (one cheap pass), else numpy float scalars among them (a set of the types)
    if countOf(map(type, values.values()), float) != len(values) and not set(map(type, values.values())) <= FLOAT_TYPES:
        return None
    return plan, plan.packer.pack(*values.values())  # NaN and infinities: the worker sends those steps per key


# 1 where a double's top byte (sign bit aside) is all ones: its exponent is at least 0x7F0, so it is a
# NaN, an infinity or past ~5e303; every other value is finite.
_TOP_BYTE_HIGH = bytes(1 if byte & 0x7F == 0x7F else 0 for byte in range(256))


def surely_finite(packed: bytes) -> bool:
    """Whether every little-endian double in ``packed`` is finite (False also for a few finite
    values past ~5e303, which then take the per-key path): two C calls over one byte per value, a
    third of numpy's ``sum()`` for a step's few hundred, and no floating-point warning."""
    return 1 not in packed[7::8].translate(_TOP_BYTE_HIGH)
