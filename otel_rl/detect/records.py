"""Finding records and how they read: the :class:`Finding` of one event of one series, whether
its direction is the bad one for its metric and how severe it is, the terms each metric is
judged in (registry direction, smallest meaningful change, fixed danger thresholds), and the
text of a finding (:func:`describe`, :func:`format_number`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

__all__ = [
    "EXTREME_STATISTICS",
    "FRACTION_METRICS",
    "FRACTION_MIN_CHANGE",
    "Finding",
    "GRAD_CLIP_FACTOR",
    "KINDS",
    "LENGTH_METRICS",
    "LEVEL_STATISTICS",
    "MIN_CHANGE_BY_UNIT",
    "SPREAD_STATISTICS",
    "danger_bounds",
    "describe",
    "direction_of",
    "floor_for",
    "format_number",
    "is_bad_change",
    "is_performance_unit",
    "min_change_for",
    "severity_of",
]

KINDS = ("threshold", "spike", "level shift", "collapse", "explosion", "drift", "pinned-at-limit", "periodic")


@dataclass
class Finding:
    """One detected event of one series (see ``KINDS``); steps are the log's steps."""

    series: str  # the key as logged (or the registry name)
    metric: str
    attributes: dict[str, str]
    kind: str
    direction: str  # "up" | "down"
    first_step: int
    last_step: int
    peak_step: int
    peak_value: float  # drift: the median of the last window
    baseline: float  # median before the event (drift: of the first window; threshold: of the series' other points)
    scale: float  # robust spread before the event
    z: float  # robust z-score of the peak
    magnitude: float  # peak / baseline when the baseline is positive, else the change in scales
    recovered_step: int | None = None  # first step back near the baseline; None: not by the end of the log
    severity: str = "warning"
    bad: bool | None = None  # whether the direction is the bad one for this metric (registry); None: unknown
    period: float | None = None  # periodic: steps between occurrences
    count: int | None = None  # periodic / pinned / threshold: occurrences (points)
    limit: float | None = None  # pinned-at-limit: the value it sits at; threshold (or an event past one): the threshold
    detail: str = ""
    why: str | None = None  # threshold: what the threshold means and where it comes from

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v is not None}
        for key in ("peak_value", "baseline", "scale", "z", "magnitude", "period", "limit"):
            if key in out and isinstance(out[key], float):
                out[key] = _json_float(out[key])
        return out


def _json_float(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float(f"{value:.6g}")


def direction_of(metric: str, attributes: Mapping[str, Any] | None = None) -> str | None:
    """The registry's good direction of ``metric`` (higher / lower / range / None); None for a
    spread statistic: "higher is better" is said of a metric's level, not of its std."""
    if attributes and attributes.get(A.RL_STATISTIC) in SPREAD_STATISTICS:
        return None
    mdef = METRICS.get(metric)
    return mdef.direction if mdef is not None else None


def is_bad_change(direction: str | None, sign: str) -> bool | None:
    """Whether a change ``sign`` (up / down) goes the bad way for a metric whose good direction is
    ``direction`` (see :func:`direction_of`); None when the metric has no good direction."""
    if direction == "higher":
        return sign == "down"
    if direction == "lower":
        return sign == "up"
    if direction == "range":
        return True  # leaving the range either way is the problem
    return None


# Fractions of samples / tokens (0..1): a change of less than 10 points is not an event, however
# flat the series was (a clipped ratio going 0 -> 1/16 is one truncated response in 16).
FRACTION_METRICS = frozenset(
    {
        M.RL_RESPONSE_CLIPPED_RATIO,
        M.RL_RESPONSE_NON_ABORTED_CLIPPED_RATIO,
        M.RL_PROMPT_CLIPPED_RATIO,
        M.RL_CLIP_FRACTION,
        M.RL_ROLLOUT_ABORT_RATIO,
        M.RL_ROLLOUT_TIMEOUT_RATIO,
        M.RL_REWARD_ZERO_STD_RATIO,
        M.RL_BATCH_VALID_RATIO,
        M.RL_RESPONSE_MASK_RATIO,
        M.RL_ASYNC_STALE_SAMPLE_RATIO,
    }
)
FRACTION_MIN_CHANGE = 0.1
# Lengths bounded by a generation / prompt limit.
LENGTH_METRICS = frozenset({M.RL_RESPONSE_LENGTH, M.RL_RESPONSE_NON_ABORTED_LENGTH, M.RL_PROMPT_LENGTH})
# Smallest change worth an event, by unit: stage timings jitter by milliseconds.
MIN_CHANGE_BY_UNIT = {"s": 0.1}
# A gradient norm this many times the configured clip is far above it.
GRAD_CLIP_FACTOR = 10.0
# Spreads (a std going to 0 when a group's samples agree) and the extremes of a batch (one sample
# sets them) move a lot without the run changing: they are context, never critical.
SPREAD_STATISTICS = frozenset(
    {
        A.RlStatisticValues.STD.value,
        A.RlStatisticValues.BEST_STD.value,
        A.RlStatisticValues.WORST_STD.value,
        A.RlStatisticValues.MAJ_STD.value,
        A.RlStatisticValues.MINMAX_DIFF.value,
    }
)
EXTREME_STATISTICS = frozenset(
    {
        A.RlStatisticValues.MAX.value,
        A.RlStatisticValues.MIN.value,
        A.RlStatisticValues.SLOWEST.value,
        A.RlStatisticValues.BALANCED_MIN.value,
        A.RlStatisticValues.BALANCED_MAX.value,
    }
)
LEVEL_STATISTICS = (None, A.RlStatisticValues.MEAN.value, A.RlStatisticValues.P50.value)


def floor_for(metric: str) -> float:
    """The registry floor of ``metric``: the smallest absolute change of it that can matter (0: none)."""
    mdef = METRICS.get(metric)
    return float(mdef.floor) if mdef is not None and mdef.floor is not None else 0.0


def min_change_for(metric: str) -> float:
    """The absolute change below which a value of ``metric`` is never an event."""
    if metric in FRACTION_METRICS:
        return max(FRACTION_MIN_CHANGE, floor_for(metric))
    mdef = METRICS.get(metric)
    by_unit = MIN_CHANGE_BY_UNIT.get(mdef.unit, 0.0) if mdef is not None else 0.0
    return max(by_unit, floor_for(metric))


def is_performance_unit(unit: str) -> bool:
    """Durations and rates: a slow step costs time, it does not break the run."""
    return unit == "s" or unit.startswith("s/") or unit.endswith("/s")


def danger_bounds(
    metric: str, attributes: Mapping[str, str] | None = None, settings: Mapping[str, float] | None = None
) -> list[tuple[str, float, bool, str]]:
    """The fixed danger thresholds of a series: ``(direction, threshold, inclusive, why)``.

    The registry's ``danger`` applies to a series' level (its mean, or the metric itself): the
    largest KL of a batch above 10 or its smallest entropy below 0.01 says nothing of the policy.
    With ``settings["grad_clip"]``, a gradient norm >= 10x the clip is one too.
    """
    stat = (attributes or {}).get(A.RL_STATISTIC)
    mdef = METRICS.get(metric)
    out: list[tuple[str, float, bool, str]] = []
    if mdef is not None:
        if mdef.danger_above is not None and stat in (*LEVEL_STATISTICS, A.RlStatisticValues.MIN.value):
            out.append(("up", float(mdef.danger_above), False, mdef.danger_why or ""))
        if mdef.danger_below is not None and stat in (*LEVEL_STATISTICS, A.RlStatisticValues.MAX.value):
            out.append(("down", float(mdef.danger_below), False, mdef.danger_why or ""))
    clip = (settings or {}).get("grad_clip")
    if (
        metric == M.RL_GRAD_NORM
        and isinstance(clip, (int, float))
        and not isinstance(clip, bool)
        and math.isfinite(clip)
        and clip > 0
        and stat in (*LEVEL_STATISTICS, A.RlStatisticValues.MIN.value)
    ):
        out.append(
            (
                "up",
                GRAD_CLIP_FACTOR * float(clip),
                True,
                f"a gradient norm of {GRAD_CLIP_FACTOR:g}x the configured clip (grad_clip = {format_number(float(clip))}) or more "
                "is far above the configured clip: those updates are cut to the clip, and a norm that large "
                "usually comes with a loss or KL blow-up",
            )
        )
    return out


def severity_of(kind: str, bad: bool | None, attrs: Mapping[str, str], unit: str) -> str:
    """The severity (info / warning / critical) of a finding of ``kind`` on a series with these
    attributes and unit: spreads, batch extremes and timings are context, never critical."""
    severe = kind in ("explosion", "collapse", "threshold")
    if bad is True:
        severity = "critical" if severe else "warning"
    elif bad is None:
        severity = "warning" if severe else "info"  # lengths, spreads: notable, not bad in themselves
    else:
        severity = "info"
    stat = attrs.get(A.RL_STATISTIC)
    if stat in SPREAD_STATISTICS or (kind == "spike" and (stat in EXTREME_STATISTICS or is_performance_unit(unit))):
        return "info"
    if severity == "critical" and (stat in EXTREME_STATISTICS or is_performance_unit(unit)):
        return "warning"
    return severity


def format_number(value: float) -> str:
    """A value as findings and alerts print it: four significant digits, three for the very large or small."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.3g}"
    return f"{value:.4g}"


def describe(f: Finding) -> str:
    """The one-line text of a finding (its ``detail``): what happened, when, against which baseline."""
    if f.kind == "periodic":
        return (
            f"every {f.period:g} steps the value goes {f.direction} (x{f.magnitude:.3g} of the baseline, {f.count} times "
            f"from step {f.first_step} to {f.last_step}): a schedule (checkpointing, validation), not an anomaly"
        )
    if f.kind == "pinned-at-limit":
        return f"sits at {format_number(f.limit or 0.0)} on {f.count} logged steps (steps {f.first_step}-{f.last_step})"
    span = f"step {f.first_step}" if f.first_step == f.last_step else f"steps {f.first_step}-{f.last_step}"
    if f.kind == "threshold":
        side = "above" if f.direction == "up" else "below"
        text = (
            f"{side} the danger threshold {format_number(f.limit or 0.0)} at {span} ({f.count} logged point(s)): "
            f"{'peak' if f.direction == 'up' else 'lowest'} {format_number(f.peak_value)} at step {f.peak_step}, "
            f"{format_number(f.baseline)} at the other steps"
        )
        text += (
            f"; back past the threshold at step {f.recovered_step}"
            if f.recovered_step is not None
            else "; still past it at the end of the log"
        )
        return text + (f". {f.why[0].upper()}{f.why[1:]}" if f.why else "")
    change = f"x{f.magnitude:.3g}" if f.baseline > 0 and f.peak_value >= 0 else f"{f.z:+.1f} scales"
    if f.kind == "drift":
        return (
            f"drift {f.direction} from step {f.first_step} to the end of the log (step {f.last_step}): the median of "
            f"the last of {f.count} windows is {format_number(f.peak_value)} against {format_number(f.baseline)} in the first ({change})"
        )
    text = f"{f.kind} {f.direction} at {span}: peak {format_number(f.peak_value)} at step {f.peak_step} vs baseline {format_number(f.baseline)} ({change}, z {f.z:+.1f})"
    if f.recovered_step is not None:
        text += f"; back near the baseline at step {f.recovered_step}"
    else:
        text += "; not back to the baseline by the end of the log"
    if f.limit is not None:
        text += f"; past the danger threshold {format_number(f.limit)}" + (f" ({f.why})" if f.why else "")
    return text
