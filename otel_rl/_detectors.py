"""Anomaly detectors for RL training metrics: one core for the offline analyzer and the online alerts.

The core is a robust baseline: the median and a spread estimate of the previous ``window``
values of a series (:func:`baseline`). A value is anomalous when its robust z-score
``(value - median) / scale`` passes a threshold AND the change is large in the metric's own terms
(a fraction of the median, an absolute amount): fixed thresholds alone would fire on one metric's
noise and miss another's collapse, z-scores alone would fire on a series that is constant but for
its rounding.

- Offline (``otel-rl analyze``): :func:`detect_series` turns a whole series into findings (spike,
  level shift, collapse, explosion, pinned-at-limit, periodic) with their first and last step,
  magnitude against the baseline and recovery; :func:`build_chains` orders co-occurring findings
  by lead/lag.
- Online (inside training): :class:`AlertEngine` runs alert rules (:class:`Rule`, YAML-configurable;
  defaults: the RL DFX composite rules and the fixed thresholds of a 6000-step GRPO analysis) on the values each ``log()`` resolves, in the
  telemetry worker thread, and emits ``rl.alert`` events, counts ``rl.alert`` and calls hooks.

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

import numpy as np

from .semconv import METRICS
from .semconv import attributes as A
from .semconv import metrics as M
from .semconv import names as N

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
    "default_rules",
    "default_rules_yaml",
    "detect_series",
    "direction_of",
    "is_anomalous",
    "load_rules",
    "min_change_for",
    "parse_rules",
    "rolling_baseline",
    "telemetry_sink",
]

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x 1.4826 = its standard deviation
MEAN_AD_TO_SIGMA = 1.2533  # mean absolute deviation x sqrt(pi/2) = standard deviation
KINDS = ("spike", "level shift", "collapse", "explosion", "pinned-at-limit", "periodic")
SEVERITIES = tuple(m.value for m in A.RlAlertSeverityValues)


# ==================================================================================================
# Robust baseline


@dataclass(frozen=True)
class DetectorConfig:
    """Thresholds of the detectors; the defaults are what ``otel-rl analyze`` uses."""

    window: int = 30  # previous values the baseline is computed from
    min_baseline: int = 5  # values needed before a point is judged
    z: float = 8.0  # robust z-score of an anomalous point
    min_rel_change: float = 0.1  # ... and at least this fraction of |median| away from it
    rel_floor: float = 0.01  # the scale is at least this fraction of |median| (rounded, near-constant series)
    abs_floor: float = 1e-12
    spike_max_points: int = 3  # an excursion back to the baseline within this many points is a spike
    settle_points: int = 5  # points after an excursion that decide whether it came back
    return_z: float = 3.0  # "back" = within this many scales (or min_rel_change) of the old median
    explosion_factor: float = 10.0  # peak >= 10x max(|median|, scale): an explosion
    collapse_factor: float = 0.5  # a drop to <= half of a positive median: a collapse
    relative_z: float = 3.0  # a drop to <= collapse_factor x a clearly positive median (> 2 scales) needs only this z
    texture_factor: float = 3.0  # on a long series, a relative-only event is also >= 3x the series' usual
    texture_quantile: float = 0.75  # excursion (this quantile of |value - median| of its ordinary points)
    texture_min_points: int = 50
    bursty_min_runs: int = 8  # events on >= 8 separate runs (and >= 4% of the points): the series'
    bursty_fraction: float = 0.04  # texture (a loss jittering around 0), not events; 5x bigger ones stay
    periodic_z: float = 4.0  # lower bar for the candidates of a periodic pattern
    periodic_min_count: int = 4
    periodic_coverage: float = 0.7
    pinned_min_points: int = 3
    pinned_min_fraction: float = 0.1


def _median_sorted(values: list[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2.0


def baseline(window: Sequence[float], cfg: DetectorConfig = DetectorConfig()) -> tuple[float, float]:
    """``(median, scale)`` of ``window``: scale = max(1.4826 MAD, 1.2533 mean |dev|, rel_floor |median|, abs_floor).

    The mean absolute deviation is a floor for series that sit on one value most of the time
    (a clipped ratio that is 0 but for an occasional 1/16): their MAD is 0, yet those values
    are normal for them. Pure Python: for the ~30 values of a window it is faster than numpy.
    """
    ordered = sorted(window)
    med = _median_sorted(ordered)
    devs = sorted(abs(v - med) for v in ordered)
    mad = _median_sorted(devs)
    mean_ad = sum(devs) / len(devs)
    return med, max(MAD_TO_SIGMA * mad, MEAN_AD_TO_SIGMA * mean_ad, cfg.rel_floor * abs(med), cfg.abs_floor)


def rolling_baseline(x: np.ndarray, cfg: DetectorConfig = DetectorConfig()) -> tuple[np.ndarray, np.ndarray]:
    """Per index i, :func:`baseline` of ``x[max(0, i - window):i]`` (NaN before ``min_baseline`` values)."""
    n = len(x)
    med = np.full(n, np.nan)
    scale = np.full(n, np.nan)
    w = cfg.window
    for i in range(cfg.min_baseline, min(n, w)):
        med[i], scale[i] = baseline(x[:i].tolist(), cfg)
    if n > w:
        windows = np.lib.stride_tricks.sliding_window_view(x[:-1], w)  # row k: x[k:k+w], judged at i = k + w
        m = np.median(windows, axis=1)
        devs = np.abs(windows - m[:, None])
        mad = np.median(devs, axis=1)
        mean_ad = devs.mean(axis=1)
        s = np.maximum.reduce([MAD_TO_SIGMA * mad, MEAN_AD_TO_SIGMA * mean_ad, cfg.rel_floor * np.abs(m),
                               np.full_like(m, cfg.abs_floor)])
        med[w:] = m
        scale[w:] = s
    return med, scale


def is_anomalous(value: float, med: float, scale: float, *, z: float, min_rel_change: float, min_change: float = 0.0) -> bool:
    delta = abs(value - med)
    return delta >= z * scale and delta >= min_rel_change * abs(med) and delta >= min_change


# ==================================================================================================
# Offline: findings


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
    peak_value: float
    baseline: float  # median before the event
    scale: float  # robust spread before the event
    z: float  # robust z-score of the peak
    magnitude: float  # peak / baseline when the baseline is positive, else the change in scales
    recovered_step: int | None = None  # first step back near the baseline; None: not by the end of the log
    severity: str = "warning"
    bad: bool | None = None  # whether the direction is the bad one for this metric (registry); None: unknown
    period: float | None = None  # periodic: steps between occurrences
    count: int | None = None  # periodic / pinned: occurrences
    limit: float | None = None  # pinned-at-limit: the value it sits at
    detail: str = ""

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
    if attributes and attributes.get(A.RL_STATISTIC) == A.RlStatisticValues.STD.value:
        return None
    mdef = METRICS.get(metric)
    return mdef.direction if mdef is not None else None


def _bad(direction: str | None, sign: str) -> bool | None:
    if direction == "higher":
        return sign == "down"
    if direction == "lower":
        return sign == "up"
    if direction == "range":
        return True  # leaving the range either way is the problem
    return None


# Metrics whose exact 0 means the step did nothing (no gradient reached the optimizer).
_ZERO_MEANS_STALLED = frozenset({M.RL_GRAD_NORM})
# Fractions of samples / tokens (0..1): a change of less than 10 points is not an event, however
# flat the series was (a clipped ratio going 0 -> 1/16 is one truncated response in 16).
FRACTION_METRICS = frozenset({
    M.RL_RESPONSE_CLIPPED_RATIO, M.RL_RESPONSE_NON_ABORTED_CLIPPED_RATIO, M.RL_PROMPT_CLIPPED_RATIO, M.RL_CLIP_FRACTION,
    M.RL_ROLLOUT_ABORT_RATIO, M.RL_ROLLOUT_TIMEOUT_RATIO, M.RL_REWARD_ZERO_STD_RATIO, M.RL_BATCH_VALID_RATIO,
    M.RL_RESPONSE_MASK_RATIO, M.RL_ASYNC_STALE_SAMPLE_RATIO,
})
FRACTION_MIN_CHANGE = 0.1
# Lengths bounded by a generation / prompt limit.
LENGTH_METRICS = frozenset({M.RL_RESPONSE_LENGTH, M.RL_RESPONSE_NON_ABORTED_LENGTH, M.RL_PROMPT_LENGTH})
# Smallest change worth an event, by unit: stage timings jitter by milliseconds.
MIN_CHANGE_BY_UNIT = {"s": 0.1}


def min_change_for(metric: str) -> float:
    """The absolute change below which a value of ``metric`` is never an event."""
    if metric in FRACTION_METRICS:
        return FRACTION_MIN_CHANGE
    mdef = METRICS.get(metric)
    return MIN_CHANGE_BY_UNIT.get(mdef.unit, 0.0) if mdef is not None else 0.0


def detect_series(
    steps: Sequence[int] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    *,
    series: str,
    metric: str,
    attributes: Mapping[str, str] | None = None,
    cfg: DetectorConfig = DetectorConfig(),
) -> list[Finding]:
    """Findings of one series (values in step order; non-finite values are findings themselves)."""
    mdef = METRICS.get(metric)
    attrs = dict(attributes or {})
    direction = direction_of(metric, attrs)
    unit = mdef.unit if mdef is not None else ""
    s_all = np.asarray(steps, dtype=np.int64)
    v_all = np.asarray(values, dtype=np.float64)
    findings: list[Finding] = []

    finite = np.isfinite(v_all)
    if not finite.all():
        findings.extend(_nonfinite(s_all, v_all, finite, series, metric, attrs, direction))
    s, x = s_all[finite], v_all[finite]
    n = len(x)
    if n == 0:
        return findings
    findings.extend(_pinned(s, x, series, metric, attrs, direction, unit, cfg))
    if n <= cfg.min_baseline:
        return findings
    med, scale = rolling_baseline(x, cfg)
    z = np.zeros(n)
    judged = ~np.isnan(med)
    z[judged] = (x[judged] - med[judged]) / scale[judged]
    m = np.where(judged, med, 0.0)
    delta = np.abs(x - np.where(judged, med, x))
    big = (delta >= cfg.min_rel_change * np.abs(m)) & (delta >= min_change_for(metric))
    positive = judged & (m > 2.0 * np.where(judged, scale, np.inf))
    strict = judged & big & (np.abs(z) >= cfg.z)
    # A drop to half of a clearly positive median is big in the metric's own terms even when a short,
    # trending baseline keeps its z-score low (entropy or score collapsing after a KL blow-up).
    relative = judged & big & positive & (x <= cfg.collapse_factor * m) & (z <= -cfg.relative_z)
    ordinary = judged & ~strict & ~relative
    if int(ordinary.sum()) >= cfg.texture_min_points:
        # A long series tells what its ordinary excursions are (a noisy reward dipping now and then):
        # an event found by its size relative to the median must also stand out from those.
        usual = float(np.quantile(delta[ordinary], cfg.texture_quantile))
        relative &= delta >= cfg.texture_factor * usual
    flag = strict | relative
    flag = _drop_bursty(flag, z, delta, n, cfg)

    periodic, grid = _periodic(s, x, med, scale, z, judged, series, metric, attrs, direction, cfg)
    findings.extend(periodic)
    if grid.size:
        # A far bigger excursion than the schedule's usual one, on the grid, is still an event.
        # (Compared in value terms: z-scores shrink once earlier occurrences widen the window.)
        size = np.abs(x[grid] - med[grid])
        keep = size > 3.0 * float(np.median(size))
        flag[grid[~keep]] = False

    events = _runs(flag, np.sign(z))
    out: list[Finding] = []
    suppressed: set[int] = set()
    for index, (a, b, sign) in enumerate(events):
        if index in suppressed:
            continue
        finding, back = _classify(a, b, sign, s, x, med, scale, series, metric, attrs, direction, cfg)
        out.append(finding)
        if back is not None and back > b + 1:
            # The series came back to its old level after the baseline had adapted: that return is
            # part of this event, not an event of its own.
            for later, (a2, _b2, sign2) in enumerate(events[index + 1:], start=index + 1):
                if sign2 != sign and abs(a2 - back) <= 3:
                    suppressed.add(later)
    findings.extend(out)
    findings.sort(key=lambda f: (f.first_step, f.series))
    return findings


def _drop_bursty(flag: np.ndarray, z: np.ndarray, delta: np.ndarray, n: int, cfg: DetectorConfig) -> np.ndarray:
    """Excursions scattered over many separate runs (a loss jittering around 0 with a heavy tail, a
    std that is 0 but for a recurring 1/16) are the series' texture, not events: they are dropped,
    except ones far larger (5x) than its usual excursion. Real events come in few runs."""
    runs = _runs(flag, np.sign(z))
    if len(runs) < max(cfg.bursty_min_runs, int(math.ceil(cfg.bursty_fraction * n))):
        return flag
    usual = float(np.median(delta[flag]))
    return flag & (delta > 5.0 * usual)


def _runs(flag: np.ndarray, sign: np.ndarray, gap: int = 1) -> list[tuple[int, int, int]]:
    """Runs of flagged indices of one sign, allowing ``gap`` unflagged points inside a run."""
    runs: list[tuple[int, int, int]] = []
    idx = np.flatnonzero(flag)
    for i in idx:
        sg = int(sign[i])
        if runs and runs[-1][2] == sg and i - runs[-1][1] <= gap + 1:
            runs[-1] = (runs[-1][0], int(i), sg)
        else:
            runs.append((int(i), int(i), sg))
    return runs


def _classify(a: int, b: int, sign: int, s: np.ndarray, x: np.ndarray, med: np.ndarray, scale: np.ndarray, series: str,
              metric: str, attrs: dict[str, str], direction: str | None, cfg: DetectorConfig) -> tuple[Finding, int | None]:
    m0, s0 = float(med[a]), float(scale[a])
    seg = x[a:b + 1]
    p = a + int(np.argmax(sign * (seg - m0)))
    peak = float(x[p])
    tol = max(cfg.return_z * s0, cfg.min_rel_change * abs(m0))
    post = x[b + 1:b + 1 + cfg.settle_points]
    returned = post.size > 0 and abs(float(np.median(post)) - m0) <= tol
    back: int | None = b + 1 if returned else None
    if not returned:
        for j in range(b + 1, len(x)):
            nxt = x[j:j + 3]
            if np.all(np.abs(nxt - m0) <= tol):
                back = j
                break
    length = b - a + 1
    up = sign > 0
    if up and peak > 0 and peak >= cfg.explosion_factor * max(abs(m0), s0):
        kind = "explosion"
    elif not up and m0 > 0 and peak <= cfg.collapse_factor * m0 and direction != "lower" and (length > 1 or not returned):
        kind = "collapse"  # a single-point dip straight back is a spike down, however deep
    elif length <= cfg.spike_max_points and (returned or post.size == 0):
        kind = "spike"
    else:
        kind = "level shift"
    magnitude = peak / m0 if m0 > 0 and peak >= 0 else (peak - m0) / s0
    zpeak = (peak - m0) / s0
    sign_text = "up" if up else "down"
    bad = _bad(direction, sign_text)
    severe = kind in ("explosion", "collapse")
    if bad is True:
        severity = "critical" if severe else "warning"
    elif bad is None:
        severity = "warning" if severe else "info"  # lengths, spreads: notable, not bad in themselves
    else:
        severity = "info"
    last_step = int(s[b])
    if kind == "level shift" and back is None:
        # the new level holds: the event lasts to where the baseline caught up
        last_step = int(s[b])
    finding = Finding(
        series=series, metric=metric, attributes=attrs, kind=kind, direction=sign_text,
        first_step=int(s[a]), last_step=last_step, peak_step=int(s[p]), peak_value=peak, baseline=m0, scale=s0,
        z=zpeak, magnitude=magnitude, recovered_step=int(s[back]) if back is not None and back < len(s) else None,
        severity=severity, bad=bad,
    )
    finding.detail = _describe(finding)
    return finding, back


def _fmt(value: float) -> str:
    if value == 0 or not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.3g}"
    return f"{value:.4g}"


def _describe(f: Finding) -> str:
    if f.kind == "periodic":
        return (f"every {f.period:g} steps the value goes {f.direction} (x{f.magnitude:.3g} of the baseline, {f.count} times "
                f"from step {f.first_step} to {f.last_step}): a schedule (checkpointing, validation), not an anomaly")
    if f.kind == "pinned-at-limit":
        return f"sits at {_fmt(f.limit or 0.0)} on {f.count} logged steps (steps {f.first_step}-{f.last_step})"
    span = f"step {f.first_step}" if f.first_step == f.last_step else f"steps {f.first_step}-{f.last_step}"
    change = f"x{f.magnitude:.3g}" if f.baseline > 0 and f.peak_value >= 0 else f"{f.z:+.1f} scales"
    text = f"{f.kind} {f.direction} at {span}: peak {_fmt(f.peak_value)} at step {f.peak_step} vs baseline {_fmt(f.baseline)} ({change}, z {f.z:+.1f})"
    if f.recovered_step is not None:
        text += f"; back near the baseline at step {f.recovered_step}"
    else:
        text += "; not back to the baseline by the end of the log"
    return text


def _nonfinite(s: np.ndarray, v: np.ndarray, finite: np.ndarray, series: str, metric: str, attrs: dict[str, str],
               direction: str | None) -> list[Finding]:
    out = []
    for a, b, _ in _runs(~finite, np.ones_like(v), gap=0):
        peak = float(v[a])
        f = Finding(series=series, metric=metric, attributes=attrs, kind="explosion", direction="up",
                    first_step=int(s[a]), last_step=int(s[b]), peak_step=int(s[a]), peak_value=peak, baseline=float("nan"),
                    scale=float("nan"), z=float("inf"), magnitude=float("inf"), severity="critical", bad=True)
        following = np.flatnonzero(finite[b + 1:])
        f.recovered_step = int(s[b + 1 + following[0]]) if following.size else None
        f.detail = (f"non-finite values ({'NaN' if math.isnan(peak) else peak}) at steps {f.first_step}-{f.last_step}: "
                    "a numerical blow-up" + (f"; finite again at step {f.recovered_step}" if f.recovered_step is not None else ""))
        out.append(f)
    return out


def _pinned(s: np.ndarray, x: np.ndarray, series: str, metric: str, attrs: dict[str, str], direction: str | None,
            unit: str, cfg: DetectorConfig) -> list[Finding]:
    """A series that sits exactly at a hard limit: a ratio at 1.0, a length at the generation limit,
    a gradient norm at exactly 0 (no update). Saturating a higher-is-better metric is not one."""
    n = len(x)
    out: list[Finding] = []
    constant = float(x.min()) == float(x.max())
    # A constant series is only a limit when it is a maximum: every step's longest response at the
    # same length is the generation limit, every response clipped is a ratio of 1.
    is_max = attrs.get(A.RL_STATISTIC) == A.RlStatisticValues.MAX.value
    if n < cfg.pinned_min_points or (constant and not (is_max or float(x.max()) == 1.0)):
        return out
    need = max(cfg.pinned_min_points, int(math.ceil(cfg.pinned_min_fraction * n)))
    top = float(x.max())
    at_top = np.isclose(x, top, rtol=1e-9, atol=0.0)
    ratio_like = unit == "1" and top == 1.0 and float(x.min()) >= 0.0 and metric in FRACTION_METRICS
    # a constant prompt length is the dataset's, not a limit the run runs into
    length_like = unit == "{token}" and metric in LENGTH_METRICS and (not constant or metric != M.RL_PROMPT_LENGTH)
    if direction != "higher" and (ratio_like or length_like) and int(at_top.sum()) >= need:
        out.append(_pinned_finding(s, x, at_top, top, "up", series, metric, attrs, direction,
                                   "the generation length limit" if length_like else "its maximum, 1"))
    if metric in _ZERO_MEANS_STALLED:
        zero = x == 0.0
        if int(zero.sum()) >= need and float(x.max()) > 0:
            f = _pinned_finding(s, x, zero, 0.0, "down", series, metric, attrs, direction, "0: no gradient reached the optimizer")
            out.append(f)
    return out


def _pinned_finding(s: np.ndarray, x: np.ndarray, mask: np.ndarray, limit: float, sign: str, series: str, metric: str,
                    attrs: dict[str, str], direction: str | None, what: str) -> Finding:
    idx = np.flatnonzero(mask)
    frac = idx.size / len(x)
    others = x[~mask]
    base = float(np.median(others)) if others.size else limit
    f = Finding(series=series, metric=metric, attributes=attrs, kind="pinned-at-limit", direction=sign,
                first_step=int(s[idx[0]]), last_step=int(s[idx[-1]]), peak_step=int(s[idx[0]]), peak_value=limit,
                baseline=base, scale=0.0, z=0.0, magnitude=frac, count=int(idx.size), limit=limit,
                severity="warning" if frac >= 0.5 or limit == 0.0 else "info", bad=True)
    f.detail = (f"at {_fmt(limit)} ({what}) on {idx.size} of {len(x)} logged steps ({frac:.0%}), "
                f"steps {f.first_step}-{f.last_step}" + (f"; median elsewhere {_fmt(base)}" if others.size else ""))
    return f


def _periodic(s: np.ndarray, x: np.ndarray, med: np.ndarray, scale: np.ndarray, z: np.ndarray, judged: np.ndarray,
              series: str, metric: str, attrs: dict[str, str], direction: str | None,
              cfg: DetectorConfig) -> tuple[list[Finding], np.ndarray]:
    """Excursions on a regular grid (every P logged points): a schedule such as checkpointing or
    validation. Returns the finding and the grid's indices (kept out of the anomalies)."""
    empty = np.array([], dtype=np.int64)
    rel_ok = np.abs(x - np.where(judged, med, x)) >= cfg.min_rel_change * np.abs(np.where(judged, med, 0.0))
    for sign in (1, -1):
        cand = np.flatnonzero(judged & (sign * z >= cfg.periodic_z) & rel_ok)
        if cand.size < cfg.periodic_min_count:
            continue
        diffs = np.diff(cand)
        values, counts = np.unique(diffs, return_counts=True)
        period = int(values[np.argmax(counts)])
        if period < 2 or counts.max() < 0.6 * diffs.size:
            continue
        # anchor on the phase most candidates share
        phases, phase_counts = np.unique(cand % period, return_counts=True)
        phase = int(phases[np.argmax(phase_counts)])
        on_grid = cand[(cand % period) == phase]
        first, last = int(on_grid[0]), int(on_grid[-1])
        grid = np.arange(first, last + 1, period)
        coverage = on_grid.size / grid.size
        if on_grid.size < cfg.periodic_min_count or coverage < cfg.periodic_coverage:
            continue
        step_period = float(np.median(np.diff(s[on_grid]))) if on_grid.size > 1 else float(period)
        ratios = x[on_grid] / med[on_grid] if np.all(med[on_grid] > 0) else np.full(on_grid.size, np.nan)
        f = Finding(series=series, metric=metric, attributes=attrs, kind="periodic", direction="up" if sign > 0 else "down",
                    first_step=int(s[first]), last_step=int(s[last]), peak_step=int(s[on_grid[np.argmax(sign * z[on_grid])]]),
                    peak_value=float(np.max(sign * x[on_grid]) * sign), baseline=float(np.median(med[on_grid])),
                    scale=float(np.median(scale[on_grid])), z=float(np.median(z[on_grid])),
                    magnitude=float(np.nanmedian(ratios)) if not np.all(np.isnan(ratios)) else float(np.median(z[on_grid])),
                    severity="info", bad=None, period=step_period, count=int(on_grid.size))
        f.detail = _describe(f)
        return [f], grid
    return [], empty


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
            text = f"{name}={_fmt(float(cond['value']))}"
            if "baseline" in cond:
                text += f" (baseline {_fmt(float(cond['baseline']))}, z {float(cond['z']):+.1f})"
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
