"""From a parsed log to registry-named numeric series: key -> (registry metric, attributes) -> values by step."""

from __future__ import annotations

import contextlib
import logging
from array import array
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl._sdk.pipeline.worker import Rejected, to_number
from otel_rl.replay import ParsedLog
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
_NONFINITE = (A.RlTelemetryReasonValues.NAN.value, A.RlTelemetryReasonValues.INF.value)


class StepValues(Mapping[int, float]):
    """A series' values by step, held as two arrays in step order (16 bytes a point; a dict of
    floats by int is ~100): what :func:`build_series` gives every series, 455,000 steps long or 3."""

    __slots__ = ("step_array", "value_array")

    def __init__(self, steps: np.ndarray, values: np.ndarray) -> None:
        self.step_array, self.value_array = steps, values  # int64 ascending and unique; float64 of the same length

    def __len__(self) -> int:
        return len(self.step_array)

    def __iter__(self) -> Iterator[int]:
        return iter(self.step_array.tolist())

    def __contains__(self, step: object) -> bool:
        return self._index(step) is not None

    def __getitem__(self, step: int) -> float:
        i = self._index(step)
        if i is None:
            raise KeyError(step)
        return float(self.value_array[i])

    def items(self) -> Iterator[tuple[int, float]]:  # type: ignore[override]
        return zip(self.step_array.tolist(), self.value_array.tolist())

    def _index(self, step: object) -> int | None:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            return None
        i = int(np.searchsorted(self.step_array, step))
        return i if i < len(self.step_array) and self.step_array[i] == step else None

    @classmethod
    def of(cls, steps: list[int], values: array[float]) -> StepValues:
        """From values appended in log order: a later value for a step replaces an earlier one."""
        s, v = np.asarray(steps, dtype=np.int64), np.frombuffer(values, dtype=np.float64).copy()
        if len(s) > 1 and not bool(np.all(s[1:] > s[:-1])):  # out of order or repeated: the last of each step
            by_step = dict(zip(s.tolist(), v.tolist()))
            s = np.fromiter(sorted(by_step), dtype=np.int64, count=len(by_step))
            v = np.fromiter((by_step[k] for k in s.tolist()), dtype=np.float64, count=len(by_step))
        return cls(s, v)


@dataclass
class Series:
    """One registry series of a run: the values by step (a later value for a step replaces an earlier one)."""

    metric: str
    attributes: dict[str, str]
    label: str  # the first key the log used for it
    keys: list[str] = field(default_factory=list)
    by_step: Mapping[int, float] = field(default_factory=dict)
    # arrays() of by_step as it was when computed: (id and size of by_step, steps, values)
    _sorted: tuple[tuple[int, int], np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def key(self) -> SeriesKey:
        return self.metric, tuple(sorted(self.attributes.items()))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) in step order; computed once per content of ``by_step`` (the analysis asks
        for them many times, and a 455k-step series costs seconds to sort)."""
        if isinstance(self.by_step, StepValues):
            return self.by_step.step_array.copy(), self.by_step.value_array.copy()
        stamp = (id(self.by_step), len(self.by_step))
        if self._sorted is None or self._sorted[0] != stamp:
            items = sorted(self.by_step.items())
            steps = np.fromiter((k for k, _ in items), dtype=np.int64, count=len(items))
            values = np.fromiter((v for _, v in items), dtype=np.float64, count=len(items))
            self._sorted = (stamp, steps, values)
        return self._sorted[1].copy(), self._sorted[2].copy()

    @property
    def direction(self) -> str | None:
        mdef = METRICS.get(self.metric)
        return mdef.direction if mdef is not None else None


class _Quiet(logging.Filter):
    """Unmapped keys are listed in the report; the resolver's per-key warning would repeat them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "no mapping knows the metric key" not in message and "more metric keys no mapping knows" not in message


@contextlib.contextmanager
def quiet_unmapped() -> Iterator[None]:
    log = logging.getLogger("otel_rl")
    filt = _Quiet()
    log.addFilter(filt)
    try:
        yield
    finally:
        log.removeFilter(filt)


def resolve_value(resolution: Any, raw: Any) -> float | None:
    """The measurement a raw logged value gives (as the telemetry pipeline computes it); NaN / inf
    are kept (they are findings), anything that is not a number gives None."""
    if type(raw) is float and resolution.transform is None and raw - raw == 0.0:
        return raw  # a finite float, as most logged values are: what to_number gives it
    try:
        value = resolution.transform(raw) if resolution.transform is not None else raw
        return to_number(value)
    except Rejected as rej:
        if rej.reason == _NONFINITE[0]:
            return float("nan")
        if rej.reason == _NONFINITE[1]:
            return float(value) if isinstance(value, (int, float)) else float("inf")
        return None
    except (TypeError, ValueError):
        return None


def build_series(parsed: ParsedLog, resolver: KeyResolver | None = None) -> tuple[dict[SeriesKey, Series], list[str]]:
    """Series of every numeric key of ``parsed`` and the keys no mapping knows."""
    resolver = resolver or KeyResolver.default(unmapped_key_limit=1 << 20)
    framework = parsed.framework
    out: dict[SeriesKey, Series] = {}
    unmapped: dict[str, None] = {}
    cache: dict[str, list[Any]] = {}  # key -> [resolution, series key or None, its column once it has a value]
    columns: dict[SeriesKey, tuple[list[int], array[float]]] = {}  # steps and values in log order, per series
    with quiet_unmapped():
        for record in parsed.records:
            step = record.step
            for key, raw in record.values.items():
                hit = cache.get(key)
                if hit is None:
                    res = resolver.resolve(key, framework)
                    skey: SeriesKey | None = None
                    if res.metric != M.RL_TELEMETRY_REJECTED:
                        skey = (res.metric, tuple(sorted(res.attributes)))
                    if res.fallback and res.metric == M.RL_UNMAPPED:
                        unmapped[key] = None
                    hit = cache[key] = [res, skey, None]
                res, skey, column = hit
                if skey is None:
                    continue
                value = resolve_value(res, raw)
                if value is None:
                    continue
                if column is None:  # the key's first value: its series, made or shared with another key
                    series = out.get(skey)
                    if series is None:
                        series = out[skey] = Series(metric=skey[0], attributes=dict(skey[1]), label=key)
                        columns[skey] = ([], array("d"))
                    series.keys.append(key)
                    hit[2] = column = columns[skey]
                column[0].append(step)
                column[1].append(value)
    for skey, (steps, values) in columns.items():
        out[skey].by_step = StepValues.of(steps, values)
    return out, list(unmapped)


def resolved_records(
    parsed: ParsedLog, resolver: KeyResolver | None = None, only: Collection[str] | None = None
) -> Iterator[tuple[int, list[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    """``(step, [(metric, attributes, value), ...])`` per record, as the pipeline hands them to the
    online detectors (finite values only); with ``only``, the values of those metrics alone (what
    an engine watches: it skips the others anyway)."""
    resolver = resolver or KeyResolver.default(unmapped_key_limit=1 << 20)
    cache: dict[str, tuple[Any, str, tuple[tuple[str, str], ...]] | None] = {}  # None: a metric not asked for
    with quiet_unmapped():
        for record in parsed.records:
            resolved = []
            for key, raw in record.values.items():
                if key in cache:
                    hit = cache[key]
                else:
                    res = resolver.resolve(key, parsed.framework)
                    hit = cache[key] = None if only is not None and res.metric not in only else (res, res.metric, tuple(res.attributes))
                if hit is None:
                    continue
                value = resolve_value(hit[0], raw)
                if value is None or value - value != 0.0:  # NaN and inf are not handed to the detectors
                    continue
                resolved.append((hit[1], hit[2], value))
            yield record.step, resolved
