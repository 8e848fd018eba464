"""From a parsed log to registry-named numeric series: key -> (registry metric, attributes) -> values by step."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
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


@dataclass
class Series:
    """One registry series of a run: the values by step (a later value for a step replaces an earlier one)."""

    metric: str
    attributes: dict[str, str]
    label: str  # the first key the log used for it
    keys: list[str] = field(default_factory=list)
    by_step: dict[int, float] = field(default_factory=dict)
    # arrays() of by_step as it was when computed: (id and size of by_step, steps, values)
    _sorted: tuple[tuple[int, int], np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def key(self) -> SeriesKey:
        return self.metric, tuple(sorted(self.attributes.items()))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) in step order; computed once per content of ``by_step`` (the analysis asks
        for them many times, and a 455k-step series costs seconds to sort)."""
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
    cache: dict[str, tuple[Any, SeriesKey | None]] = {}
    with quiet_unmapped():
        for record in parsed.records:
            for key, raw in record.values.items():
                hit = cache.get(key)
                if hit is None:
                    res = resolver.resolve(key, framework)
                    skey: SeriesKey | None = None
                    if res.metric != M.RL_TELEMETRY_REJECTED:
                        skey = (res.metric, tuple(sorted(res.attributes)))
                    if res.fallback and res.metric == M.RL_UNMAPPED:
                        unmapped[key] = None
                    hit = cache[key] = (res, skey)
                res, skey = hit
                if skey is None:
                    continue
                value = resolve_value(res, raw)
                if value is None:
                    continue
                series = out.get(skey)
                if series is None:
                    series = out[skey] = Series(metric=skey[0], attributes=dict(skey[1]), label=key)
                if key not in series.keys:
                    series.keys.append(key)
                series.by_step[record.step] = value
    return out, list(unmapped)


def resolved_records(
    parsed: ParsedLog, resolver: KeyResolver | None = None
) -> Iterator[tuple[int, list[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    """``(step, [(metric, attributes, value), ...])`` per record, as the pipeline hands them to the
    online detectors (finite values only)."""
    resolver = resolver or KeyResolver.default(unmapped_key_limit=1 << 20)
    cache: dict[str, Any] = {}
    with quiet_unmapped():
        for record in parsed.records:
            resolved = []
            for key, raw in record.values.items():
                res = cache.get(key)
                if res is None:
                    res = cache[key] = resolver.resolve(key, parsed.framework)
                value = resolve_value(res, raw)
                if value is None or value != value or value in (float("inf"), float("-inf")):
                    continue
                resolved.append((res.metric, tuple(res.attributes), value))
            yield record.step, resolved
