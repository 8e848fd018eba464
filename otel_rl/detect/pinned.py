"""Findings of a series that sits at a hard limit: a ratio at 1.0, a length at the generation limit,
a gradient norm at exactly 0 (no update), a reward without spread, a reward function that never fires.
"""

from __future__ import annotations

import math
import re

import numpy as np

from otel_rl.detect.baseline import DetectorConfig
from otel_rl.detect.records import FRACTION_METRICS, LENGTH_METRICS, LEVEL_STATISTICS, Finding, format_number
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

# A reward function read as silent only over this many logged steps, and never a penalty's.
_SILENT_MIN_POINTS = 10
_PENALTY = re.compile(r"penal|punish|overlong|length|len_|_len|repetit|cost|negative", re.IGNORECASE)

# A reward without spread read over the run's last third only with this many logged steps.
_TAIL_MIN_POINTS = 30

# Metrics whose exact 0 means the step did nothing (no gradient reached the optimizer).
ZERO_MEANS_STALLED = frozenset({M.RL_GRAD_NORM})


def silent_reward_function(metric: str, attrs: dict[str, str], series: str, x: np.ndarray) -> bool:
    """A reward function that never paid out: 0 on every one of its (at least _SILENT_MIN_POINTS)
    logged steps, and not a penalty (a penalty at 0 is one never incurred)."""
    if metric != M.RL_REWARD_COMPONENT or len(x) < _SILENT_MIN_POINTS or x.any():
        return False
    return not _PENALTY.search(attrs.get(A.RL_REWARD_FUNCTION, series))


def pinned(
    s: np.ndarray, x: np.ndarray, series: str, metric: str, attrs: dict[str, str], direction: str | None, unit: str, cfg: DetectorConfig
) -> list[Finding]:
    """A series that sits exactly at a hard limit: a ratio at 1.0, a length at the generation limit,
    a gradient norm at exactly 0 (no update). Saturating a higher-is-better metric is not one."""
    n = len(x)
    out: list[Finding] = []
    constant = float(x.min()) == float(x.max())
    # A constant series is only a limit when it is a maximum: every step's longest response at the
    # same length is the generation limit, every response clipped is a ratio of 1.
    is_max = attrs.get(A.RL_STATISTIC) == A.RlStatisticValues.MAX.value
    if n >= cfg.pinned_min_points and metric == M.RL_REWARD and attrs.get(A.RL_STATISTIC) == A.RlStatisticValues.STD.value:
        zero = x == 0.0
        # GRPO's advantage is the reward minus its group's mean: no spread, nothing to learn from
        what = "0: every group's completions scored alike, so no advantage to learn from"
        tail = np.arange(n) >= n - n // 3
        if int(zero.sum()) >= int(math.ceil(0.5 * n)):  # on most steps, or on every one (a constant 0 too)
            out.append(_pinned_finding(s, x, zero, 0.0, "down", series, metric, attrs, direction, what))
        elif n >= _TAIL_MIN_POINTS and int((zero & tail).sum()) >= int(math.ceil(0.5 * tail.sum())):
            # The signal dying as the run goes on (groups all solved, or all failed): most of its last third
            out.append(
                _pinned_finding(s, x, zero & tail, 0.0, "down", series, metric, attrs, direction, what + ", in the run's last third")
            )
    if silent_reward_function(metric, attrs, series, x):
        # A correctness check no answer passes, a format the model never produces: its share of the signal is missing.
        what = "0 on every logged step: this reward function never fired, so it gave nothing to learn from"
        out.append(_pinned_finding(s, x, x == 0.0, 0.0, "down", series, metric, attrs, direction, what))
        return out
    if n < cfg.pinned_min_points or (constant and not (is_max or (float(x.max()) == 1.0 and metric in FRACTION_METRICS))):
        return out
    need = max(cfg.pinned_min_points, int(math.ceil(cfg.pinned_min_fraction * n)))
    top = float(x.max())
    at_top = np.isclose(x, top, rtol=1e-9, atol=0.0)
    ratio_like = unit == "1" and top == 1.0 and float(x.min()) >= 0.0 and metric in FRACTION_METRICS
    # a constant prompt length is the dataset's, not a limit the run runs into
    # nor is a shortest response at its own top (the minimum says nothing about the limit)
    length_like = (
        unit == "{token}"
        and metric in LENGTH_METRICS
        and (not constant or metric != M.RL_PROMPT_LENGTH)
        and attrs.get(A.RL_STATISTIC) != A.RlStatisticValues.MIN.value
    )
    if direction != "higher" and (ratio_like or length_like) and int(at_top.sum()) >= need:
        out.append(
            _pinned_finding(
                s,
                x,
                at_top,
                top,
                "up",
                series,
                metric,
                attrs,
                direction,
                "one length on most steps (the generation limit only if the config or a truncation ratio says so)"
                if length_like
                else "its maximum, 1",
            )
        )
    low = float(x.min())
    at_low = x == low
    if (
        direction == "higher"
        and not constant
        and attrs.get(A.RL_STATISTIC) in LEVEL_STATISTICS
        and bool(at_low[-1])
        and int(at_low.sum()) >= max(need, int(math.ceil(0.5 * n)))
    ):
        # A score that sits exactly at its lowest value for most of the run, to the end: nothing
        # scores above the floor any more (every answer wrong, or only the format reward left).
        out.append(_pinned_finding(s, x, at_low, low, "down", series, metric, attrs, direction, "its lowest value, held to the end"))
    if metric in ZERO_MEANS_STALLED:
        zero = x == 0.0
        if int(zero.sum()) >= need and float(x.max()) > 0:
            f = _pinned_finding(s, x, zero, 0.0, "down", series, metric, attrs, direction, "0: no gradient reached the optimizer")
            out.append(f)
    return out


def _pinned_finding(
    s: np.ndarray,
    x: np.ndarray,
    mask: np.ndarray,
    limit: float,
    sign: str,
    series: str,
    metric: str,
    attrs: dict[str, str],
    direction: str | None,
    what: str,
) -> Finding:
    idx = np.flatnonzero(mask)
    frac = idx.size / len(x)
    others = x[~mask]
    base = float(np.median(others)) if others.size else limit
    f = Finding(
        series=series,
        metric=metric,
        attributes=attrs,
        kind="pinned-at-limit",
        direction=sign,
        first_step=int(s[idx[0]]),
        last_step=int(s[idx[-1]]),
        peak_step=int(s[idx[0]]),
        peak_value=limit,
        baseline=base,
        scale=0.0,
        z=0.0,
        magnitude=frac,
        count=int(idx.size),
        limit=limit,
        severity="warning" if frac >= 0.5 or limit == 0.0 else "info",
        bad=True,
    )
    f.detail = (
        f"at {format_number(limit)} ({what}) on {idx.size} of {len(x)} logged steps ({frac:.0%}), "
        f"steps {f.first_step}-{f.last_step}" + (f"; median elsewhere {format_number(base)}" if others.size else "")
    )
    return f
