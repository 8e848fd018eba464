"""What a framework's logged steps must become, by the key mapping: the last value of each gauge
series and every value of each histogram series, for comparing with the exported points."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl.semconv import METRICS

Series = tuple[str, tuple[tuple[str, str], ...]]


def expected_series(
    steps: Iterable[Mapping[str, Any]], resolver: KeyResolver, framework: str
) -> tuple[dict[Series, float], dict[Series, list[float]]]:
    """(gauges: series -> last value, histograms: series -> values) of the steps' values, in order."""
    gauges: dict[Series, float] = {}
    histograms: dict[Series, list[float]] = defaultdict(list)
    for values in steps:
        for key, raw in values.items():
            res = resolver.resolve(key, framework)
            value = res.transform(raw) if res.transform else float(raw)
            if METRICS[res.metric].instrument == "histogram":
                histograms[(res.metric, res.attributes)].append(value)
            else:
                gauges[(res.metric, res.attributes)] = value
    return gauges, histograms
