"""Offline detection (``otel-rl analyze``): a whole series in, its findings out.

:func:`detect_series` judges each value against the robust baseline of the values before it
(the first values against each other) and reports spike, level shift, collapse, explosion,
pinned-at-limit and periodic patterns; fixed danger thresholds of the registry from the first
point on ("threshold"); and slow changes, window against window ("drift").

Each metric is judged on its own scale: a change below the metric's registry floor, below the
series' resolution (the quantum of rounded values) or below 1% of its typical magnitude is never
an event, and the scale of a z-score never drops below those, so a loss rounded to 1e-4 or a
timer that is 0 at most steps gives no absurd z-score.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from otel_rl.detect.baseline import (MAD_TO_SIGMA, DetectorConfig, drift_windows, early_baseline, median_se, resolution,
                        rolling_baseline, typical_magnitude)
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

__all__ = [
    "FRACTION_METRICS", "Finding", "GRAD_CLIP_FACTOR", "KINDS", "LENGTH_METRICS", "danger_bounds", "detect_series",
    "direction_of", "floor_for", "format_number", "min_change_for",
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
    if attributes and attributes.get(A.RL_STATISTIC) in _SPREAD_STATISTICS:
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
# A gradient norm this many times the configured clip is far above it.
GRAD_CLIP_FACTOR = 10.0
# Spreads (a std going to 0 when a group's samples agree) and the extremes of a batch (one sample
# sets them) move a lot without the run changing: they are context, never critical.
_SPREAD_STATISTICS = frozenset({
    A.RlStatisticValues.STD.value, A.RlStatisticValues.BEST_STD.value, A.RlStatisticValues.WORST_STD.value,
    A.RlStatisticValues.MAJ_STD.value, A.RlStatisticValues.MINMAX_DIFF.value,
})
_EXTREME_STATISTICS = frozenset({
    A.RlStatisticValues.MAX.value, A.RlStatisticValues.MIN.value, A.RlStatisticValues.SLOWEST.value,
    A.RlStatisticValues.BALANCED_MIN.value, A.RlStatisticValues.BALANCED_MAX.value,
})
_LEVEL_STATISTICS = (None, A.RlStatisticValues.MEAN.value, A.RlStatisticValues.P50.value)


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


def _is_performance(unit: str) -> bool:
    """Durations and rates: a slow step costs time, it does not break the run."""
    return unit == "s" or unit.startswith("s/") or unit.endswith("/s")


def danger_bounds(metric: str, attributes: Mapping[str, str] | None = None,
                  settings: Mapping[str, float] | None = None) -> list[tuple[str, float, bool, str]]:
    """The fixed danger thresholds of a series: ``(direction, threshold, inclusive, why)``.

    The registry's ``danger`` applies to a series' level (its mean, or the metric itself): the
    largest KL of a batch above 10 or its smallest entropy below 0.01 says nothing of the policy.
    With ``settings["grad_clip"]``, a gradient norm >= 10x the clip is one too.
    """
    stat = (attributes or {}).get(A.RL_STATISTIC)
    mdef = METRICS.get(metric)
    out: list[tuple[str, float, bool, str]] = []
    if mdef is not None:
        if mdef.danger_above is not None and stat in (*_LEVEL_STATISTICS, A.RlStatisticValues.MIN.value):
            out.append(("up", float(mdef.danger_above), False, mdef.danger_why or ""))
        if mdef.danger_below is not None and stat in (*_LEVEL_STATISTICS, A.RlStatisticValues.MAX.value):
            out.append(("down", float(mdef.danger_below), False, mdef.danger_why or ""))
    clip = (settings or {}).get("grad_clip")
    if (metric == M.RL_GRAD_NORM and isinstance(clip, (int, float)) and not isinstance(clip, bool)
            and math.isfinite(clip) and clip > 0 and stat in (*_LEVEL_STATISTICS, A.RlStatisticValues.MIN.value)):
        out.append(("up", GRAD_CLIP_FACTOR * float(clip), True,
                    f"a gradient norm of {GRAD_CLIP_FACTOR:g}x the configured clip (grad_clip = {format_number(float(clip))}) or more "
                    "is far above the configured clip: those updates are cut to the clip, and a norm that large "
                    "usually comes with a loss or KL blow-up"))
    return out


def _severity(kind: str, bad: bool | None, attrs: Mapping[str, str], unit: str) -> str:
    severe = kind in ("explosion", "collapse", "threshold")
    if bad is True:
        severity = "critical" if severe else "warning"
    elif bad is None:
        severity = "warning" if severe else "info"  # lengths, spreads: notable, not bad in themselves
    else:
        severity = "info"
    stat = attrs.get(A.RL_STATISTIC)
    if stat in _SPREAD_STATISTICS or (kind == "spike" and (stat in _EXTREME_STATISTICS or _is_performance(unit))):
        return "info"
    if severity == "critical" and (stat in _EXTREME_STATISTICS or _is_performance(unit)):
        return "warning"
    return severity


def detect_series(
    steps: Sequence[int] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    *,
    series: str,
    metric: str,
    attributes: Mapping[str, str] | None = None,
    cfg: DetectorConfig = DetectorConfig(),
    settings: Mapping[str, float] | None = None,
) -> list[Finding]:
    """Findings of one series (values in step order; non-finite values are findings themselves).

    ``settings``: the run's configuration where known, e.g. ``{"grad_clip": 1.0}`` (a gradient
    norm >= 10x the clip is a threshold finding)."""
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
    for sign, limit, inclusive, why in danger_bounds(metric, attrs, settings):
        findings.extend(_threshold(s, x, sign, limit, inclusive, why, series, metric, attrs, direction, unit, cfg))
    findings.extend(_pinned(s, x, series, metric, attrs, direction, unit, cfg))
    if n <= cfg.min_baseline:
        findings.sort(key=lambda f: (f.first_step, f.series))
        return findings

    # The metric's own scale: nothing below its registry floor, its resolution or 1% of its size.
    quantum = resolution(x)
    typical = typical_magnitude(x, cfg)
    min_change = max(min_change_for(metric), quantum, cfg.magnitude_fraction * typical)
    scale_floor = max(quantum, floor_for(metric), cfg.magnitude_fraction * typical, min_change / cfg.z, cfg.abs_floor)

    med, scale = rolling_baseline(x, cfg)
    k = min(cfg.min_baseline, n)
    med[:k], scale[:k] = early_baseline(x, cfg)
    judged = ~np.isnan(med)
    scale = np.where(judged, np.maximum(scale, scale_floor), np.inf)
    m = np.where(judged, med, 0.0)
    z = np.where(judged, (x - m) / scale, 0.0)
    delta = np.where(judged, np.abs(x - m), 0.0)
    big = judged & (delta >= cfg.min_rel_change * np.abs(m)) & (delta >= min_change)
    positive = judged & (m > 2.0 * scale)
    strict = big & (np.abs(z) >= cfg.z)
    # A drop to half of a clearly positive median is big in the metric's own terms even when a short,
    # trending baseline keeps its z-score low (entropy or score collapsing after a KL blow-up); so is
    # a rise to 3x it (a grad-norm spike on a noisy baseline).
    drop = big & positive & (x <= cfg.collapse_factor * m) & (z <= -cfg.relative_z)
    jump = big & positive & (x >= cfg.jump_factor * m) & (z >= cfg.jump_z)
    ordinary = judged & ~strict & ~drop & ~jump
    if int(ordinary.sum()) >= cfg.texture_min_points:
        # A long series tells what its ordinary excursions are (a noisy reward dipping now and then):
        # an event found by its size relative to the median must also stand out from those (a
        # count ratio of 16 going 1/16 -> 4/16 is three of its usual steps, not more).
        usual = float(np.quantile(delta[ordinary], cfg.texture_quantile))
        drop &= delta >= cfg.texture_factor * usual
        jump &= delta > cfg.texture_factor * usual
    relative = drop | jump
    flag = strict | relative
    if metric in _ZERO_MEANS_STALLED:
        flag &= x != 0.0  # an exact 0 is a step without an update (pinned-at-limit), not a value
    flag = _drop_bursty(flag, z, delta, n, cfg)

    periodic, grid = _periodic(s, x, med, scale, z, judged, series, metric, attrs, direction, cfg)
    findings.extend(periodic)
    if grid.size:
        # A far bigger excursion than the schedule's usual one, on the grid, is still an event.
        # (Compared in value terms: z-scores shrink once earlier occurrences widen the window.)
        size = np.abs(x[grid] - med[grid])
        keep = size > 3.0 * float(np.median(size))
        flag[grid[~keep]] = False

    events = [e for e in _runs(flag, np.sign(z)) if e[0] >= cfg.min_baseline or _early_event(e, x, med, scale, z, direction, unit, cfg)]
    out: list[Finding] = []
    suppressed: set[int] = set()
    for index, (a, b, sign) in enumerate(events):
        if index in suppressed:
            continue
        finding, back = _classify(a, b, sign, s, x, med, scale, series, metric, attrs, direction, unit, cfg)
        out.append(finding)
        if back is not None and back > b + 1:
            # The series came back to its old level after the baseline had adapted: that return is
            # part of this event, not an event of its own.
            for later, (a2, _b2, sign2) in enumerate(events[index + 1:], start=index + 1):
                if sign2 != sign and abs(a2 - back) <= 3:
                    suppressed.add(later)
    findings.extend(out)
    findings.extend(_lasting(s, x, findings, series, metric, attrs, direction, unit, min_change, typical, scale_floor, cfg))
    findings = _merge_thresholds(findings)
    findings.sort(key=lambda f: (f.first_step, f.series))
    return findings


_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def _merge_thresholds(findings: list[Finding]) -> list[Finding]:
    """One event, one finding: a threshold run that a spike / explosion / collapse / level shift in
    the same direction overlaps becomes part of that event (its threshold and why named in the
    detail); a threshold run that no statistical event explains stays on its own."""
    events = [f for f in findings if f.kind in ("spike", "explosion", "collapse", "level shift")]
    out = []
    for f in findings:
        if f.kind != "threshold":
            out.append(f)
            continue
        host = next((e for e in events if e.direction == f.direction and e.first_step <= f.last_step
                     and f.first_step <= e.last_step), None)
        if host is None:
            out.append(f)
            continue
        host.limit, host.why = f.limit, f.why
        if _SEVERITY_RANK.get(f.severity, 0) > _SEVERITY_RANK.get(host.severity, 0):
            host.severity = f.severity
        host.detail = _describe(host)
    return out


def _early_event(event: tuple[int, int, int], x: np.ndarray, med: np.ndarray, scale: np.ndarray, z: np.ndarray,
                 direction: str | None, unit: str, cfg: DetectorConfig) -> bool:
    """Whether an event among the first points (judged against the first values, later ones
    included) stands: only a short excursion with ordinary points on both sides, so a series that
    trends from its start (lengths collapsing from the first step) is not its own outlier.

    The first logged value is the state before training: one that differs from everything after
    it is usually the training's effect (a format reward learned in 10 steps, a validation score
    that fell after step 0) or warm-up (a first step's timings). It stands only as a strict outlier
    in the metric's bad direction, and among the extremes of the whole series (a KL or grad norm
    far above the rest)."""
    a, b, sign = event
    if b - a + 1 > cfg.spike_max_points:
        return False
    m0 = float(med[a])
    tol = max(cfg.return_z * float(scale[a]), cfg.min_rel_change * abs(m0))
    # Back within a few points (a KL spike decays over two or three logs), not necessarily the next.
    after = x[b + 1:b + 1 + cfg.spike_max_points]
    if after.size == 0 or not bool((np.abs(after - m0) <= tol).any()):
        return False
    if a > 0:
        return abs(float(x[a - 1]) - m0) <= tol
    rest = x[1:]
    extreme = x[0] > np.quantile(rest, 0.95) if sign > 0 else x[0] < np.quantile(rest, 0.05)
    return (abs(float(z[0])) >= cfg.z and bool(extreme) and _bad(direction, "up" if sign > 0 else "down") is True
            and not _is_performance(unit))


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
              metric: str, attrs: dict[str, str], direction: str | None, unit: str,
              cfg: DetectorConfig) -> tuple[Finding, int | None]:
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
    # A fraction cannot grow tenfold in any useful sense: from 0 every rise would be "infinite".
    if up and peak > 0 and peak >= cfg.explosion_factor * max(abs(m0), s0) and metric not in FRACTION_METRICS:
        kind = "explosion"
    elif not up and m0 > 0 and peak <= cfg.collapse_factor * m0 and direction != "lower" and (length > 1 or not returned):
        kind = "collapse"  # a single-point dip straight back is a spike down, however deep
    elif length <= cfg.spike_max_points and (returned or post.size == 0):
        kind = "spike"
    else:
        kind = "level shift"
    magnitude = peak / m0 if m0 > 0 and peak >= 0 else (peak - m0) / s0
    sign_text = "up" if up else "down"
    bad = _bad(direction, sign_text)
    finding = Finding(
        series=series, metric=metric, attributes=attrs, kind=kind, direction=sign_text,
        first_step=int(s[a]), last_step=int(s[b]), peak_step=int(s[p]), peak_value=peak, baseline=m0, scale=s0,
        z=(peak - m0) / s0, magnitude=magnitude, recovered_step=int(s[back]) if back is not None and back < len(s) else None,
        severity=_severity(kind, bad, attrs, unit), bad=bad,
    )
    finding.detail = _describe(finding)
    return finding, back


def _threshold(s: np.ndarray, x: np.ndarray, sign: str, limit: float, inclusive: bool, why: str, series: str, metric: str,
               attrs: dict[str, str], direction: str | None, unit: str, cfg: DetectorConfig) -> list[Finding]:
    """One finding per run of consecutive points past a fixed danger threshold, from the first point."""
    up = sign == "up"
    if up:
        past = x >= limit if inclusive else x > limit
    else:
        past = x <= limit if inclusive else x < limit
    if not past.any():
        return []
    rest = x[~past]
    if rest.size:
        base = float(np.median(rest))
        spread = max(MAD_TO_SIGMA * float(np.median(np.abs(rest - base))), cfg.rel_floor * abs(base),
                     floor_for(metric), cfg.abs_floor)
    else:
        base, spread = limit, max(cfg.rel_floor * abs(limit), cfg.abs_floor)
    bad = _bad(direction, sign)
    out = []
    for a, b, _ in _runs(past, np.ones(len(x)), gap=0):
        seg = x[a:b + 1]
        p = a + int(np.argmax(seg) if up else np.argmin(seg))
        peak = float(x[p])
        f = Finding(series=series, metric=metric, attributes=attrs, kind="threshold", direction=sign,
                    first_step=int(s[a]), last_step=int(s[b]), peak_step=int(s[p]), peak_value=peak, baseline=base,
                    scale=spread, z=(peak - base) / spread, magnitude=peak / base if base > 0 and peak >= 0 else (peak - base) / spread,
                    recovered_step=int(s[b + 1]) if b + 1 < len(s) else None, severity=_severity("threshold", bad, attrs, unit),
                    bad=bad, count=b - a + 1, limit=limit, why=why or None)
        f.detail = _describe(f)
        out.append(f)
    return out


def _explained(findings: Sequence[Finding], sign_text: str) -> bool:
    """An unrecovered collapse / explosion / level shift / threshold run already tells a lasting change."""
    return any(f.kind in ("collapse", "explosion", "level shift", "threshold") and f.direction == sign_text
               and f.recovered_step is None for f in findings)


def _lasting(s: np.ndarray, x: np.ndarray, findings: Sequence[Finding], series: str, metric: str, attrs: dict[str, str],
             direction: str | None, unit: str, min_change: float, typical: float, scale_floor: float,
             cfg: DetectorConfig) -> list[Finding]:
    """Changes that last to the end of the log, against where the series started: a collapse from
    the start that is too gradual for the rolling baseline (lengths 1759 -> 1014 -> 278 -> 1 over six
    steps widen their own baseline as they fall), then a slow drift, window against window."""
    chunks = drift_windows(x, cfg)
    if len(chunks) < 3:
        return []
    fast = _from_start(s, x, chunks, findings, series, metric, attrs, direction, unit, scale_floor, cfg)
    if fast is not None:
        return [fast]
    drift = _drift(s, x, chunks, findings, series, metric, attrs, direction, unit, min_change, typical, scale_floor, cfg)
    return [drift] if drift is not None else []


def _from_start(s: np.ndarray, x: np.ndarray, chunks: list[np.ndarray], findings: Sequence[Finding], series: str,
                metric: str, attrs: dict[str, str], direction: str | None, unit: str, scale_floor: float,
                cfg: DetectorConfig) -> Finding | None:
    """A collapse from the start: the last two windows at half or less of the first points' median
    (not for lower-is-better metrics), reached within one window and held. Rises are left to the
    rolling baseline and the thresholds: a KL that starts at 0 rises by construction."""
    k = cfg.min_baseline
    head = x[:k]
    h = float(np.median(head))
    e, e2 = float(np.median(x[chunks[-1]])), float(np.median(x[chunks[-2]]))
    if not (h > 0 and e >= 0 and max(e, e2) <= cfg.collapse_factor * h and direction != "lower"):
        return None
    if _explained(findings, "down"):
        return None
    # the series' point-to-point noise (from its differences, so a trend does not count as noise):
    # five noisy first values must not make a start level that the rest "collapses" from
    diffs = np.diff(x)
    noise = max(MAD_TO_SIGMA * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2.0), scale_floor)
    se = math.hypot(median_se(noise, len(head)), median_se(noise, len(chunks[-1])))
    if h - max(e, e2) < cfg.drift_se * se:
        return None
    h_scale = max(MAD_TO_SIGMA * float(np.median(np.abs(head - h))), scale_floor)
    tol = max(cfg.return_z * h_scale, cfg.min_rel_change * h)
    # arrived: within a tenth of the way (on a log scale when the end level is positive)
    near = e * (h / e) ** 0.1 if e > 0 else e + 0.1 * (h - e)
    n = len(x)
    ahead = np.array([float(np.median(x[i:i + k])) for i in range(n)])  # each point and the next k - 1
    left = np.flatnonzero((np.arange(n) >= 1) & (x < h - tol) & (ahead < h - tol))
    if left.size == 0:
        return None
    a = int(left[0])
    arrived = np.flatnonzero((np.arange(n) >= a) & (x <= near) & (ahead <= near))
    if arrived.size == 0:
        return None
    b = int(arrived[0])
    if b - a + 1 > len(chunks[0]):
        return None  # a slow change: a drift
    p = a + int(np.argmin(x[a:b + 1]))
    peak = float(x[p])
    bad = _bad(direction, "down")
    f = Finding(series=series, metric=metric, attributes=attrs, kind="collapse", direction="down",
                first_step=int(s[a]), last_step=int(s[b]), peak_step=int(s[p]), peak_value=peak, baseline=h, scale=h_scale,
                z=(peak - h) / h_scale, magnitude=peak / h if peak >= 0 else (peak - h) / h_scale,
                severity=_severity("collapse", bad, attrs, unit), bad=bad)
    f.detail = (_describe(f) + f" (against the median of the first {len(head)} logged values; the last window's "
                f"median is {format_number(e)})")
    return f


def _drift(s: np.ndarray, x: np.ndarray, chunks: list[np.ndarray], findings: Sequence[Finding], series: str, metric: str,
           attrs: dict[str, str], direction: str | None, unit: str, min_change: float, typical: float, scale_floor: float,
           cfg: DetectorConfig) -> Finding | None:
    """A slow, lasting change: the median of each window against the first window's, on a log scale
    for positive series (a KL going 4e-4 -> 0.05 and an entropy halving are alike there). The last
    two windows must both have moved, by more than the metric's floor and than the windows' own noise."""
    w = min(len(c) for c in chunks)
    meds = np.array([float(np.median(x[c])) for c in chunks])
    log = bool(np.all(x >= 0.0) and np.all(meds > 0.0))
    if log:
        t = np.log(meds)
        spreads = []
        for c in chunks:
            v = x[c][x[c] > 0]
            lv = np.log(v) if v.size else np.zeros(1)
            spreads.append(MAD_TO_SIGMA * float(np.median(np.abs(lv - np.median(lv)))))
        need = math.log(cfg.drift_ratio)
    else:
        t = meds
        spreads = [max(MAD_TO_SIGMA * float(np.median(np.abs(x[c] - np.median(x[c])))), scale_floor) for c in chunks]
        need = max(cfg.drift_relative * typical, min_change, scale_floor)
    noise = float(np.median(spreads))
    need = max(need, cfg.drift_se * math.sqrt(2.0) * median_se(noise, w))
    d = t - t[0]
    sign = 1.0 if d[-1] > 0 else -1.0
    m0, m1 = float(meds[0]), float(meds[-1])
    if not (sign * d[-1] >= need and sign * d[-2] >= need) or abs(m1 - m0) < max(min_change, scale_floor):
        return None
    sign_text = "up" if sign > 0 else "down"
    if _explained(findings, sign_text):
        return None
    k0 = next(j for j in range(1, len(chunks)) if np.all(sign * d[j:] >= need / 2.0))
    far = int(np.argmax(sign * d))
    last = chunks[-1]
    bad = _bad(direction, sign_text)
    stat = attrs.get(A.RL_STATISTIC)
    # a slower stage as outputs grow is a cost, and a batch's extreme or spread is context
    quiet = stat in _SPREAD_STATISTICS or stat in _EXTREME_STATISTICS or _is_performance(unit)
    spread_lin = max(MAD_TO_SIGMA * float(np.median(np.abs(x[chunks[0]] - m0))), scale_floor)
    f = Finding(series=series, metric=metric, attributes=attrs, kind="drift", direction=sign_text,
                first_step=int(s[chunks[k0][0]]), last_step=int(s[-1]), peak_step=int(s[last[len(last) // 2]]), peak_value=m1,
                baseline=m0, scale=spread_lin, z=(m1 - m0) / spread_lin,
                magnitude=m1 / m0 if m0 > 0 and m1 >= 0 else (m1 - m0) / spread_lin,
                severity="warning" if bad and not quiet else "info", bad=bad, count=len(chunks))
    f.detail = _describe(f)
    if far not in (0, len(chunks) - 1) and abs(float(meds[far]) - m0) > 1.5 * abs(m1 - m0):
        f.detail += (f"; it went furthest around step {int(s[chunks[far][len(chunks[far]) // 2]])} "
                     f"(window median {format_number(float(meds[far]))})")
    return f


def format_number(value: float) -> str:
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
        return f"sits at {format_number(f.limit or 0.0)} on {f.count} logged steps (steps {f.first_step}-{f.last_step})"
    span = f"step {f.first_step}" if f.first_step == f.last_step else f"steps {f.first_step}-{f.last_step}"
    if f.kind == "threshold":
        side = "above" if f.direction == "up" else "below"
        text = (f"{side} the danger threshold {format_number(f.limit or 0.0)} at {span} ({f.count} logged point(s)): "
                f"{'peak' if f.direction == 'up' else 'lowest'} {format_number(f.peak_value)} at step {f.peak_step}, "
                f"{format_number(f.baseline)} at the other steps")
        text += f"; back past the threshold at step {f.recovered_step}" if f.recovered_step is not None else \
            "; still past it at the end of the log"
        return text + (f". {f.why[0].upper()}{f.why[1:]}" if f.why else "")
    change = f"x{f.magnitude:.3g}" if f.baseline > 0 and f.peak_value >= 0 else f"{f.z:+.1f} scales"
    if f.kind == "drift":
        return (f"drift {f.direction} from step {f.first_step} to the end of the log (step {f.last_step}): the median of "
                f"the last of {f.count} windows is {format_number(f.peak_value)} against {format_number(f.baseline)} in the first ({change})")
    text = f"{f.kind} {f.direction} at {span}: peak {format_number(f.peak_value)} at step {f.peak_step} vs baseline {format_number(f.baseline)} ({change}, z {f.z:+.1f})"
    if f.recovered_step is not None:
        text += f"; back near the baseline at step {f.recovered_step}"
    else:
        text += "; not back to the baseline by the end of the log"
    if f.limit is not None:
        text += f"; past the danger threshold {format_number(f.limit)}" + (f" ({f.why})" if f.why else "")
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
    if n < cfg.pinned_min_points or (constant and not (is_max or (float(x.max()) == 1.0 and metric in FRACTION_METRICS))):
        return out
    need = max(cfg.pinned_min_points, int(math.ceil(cfg.pinned_min_fraction * n)))
    top = float(x.max())
    at_top = np.isclose(x, top, rtol=1e-9, atol=0.0)
    ratio_like = unit == "1" and top == 1.0 and float(x.min()) >= 0.0 and metric in FRACTION_METRICS
    # a constant prompt length is the dataset's, not a limit the run runs into
    # nor is a shortest response at its own top (the minimum says nothing about the limit)
    length_like = (unit == "{token}" and metric in LENGTH_METRICS and (not constant or metric != M.RL_PROMPT_LENGTH)
                   and attrs.get(A.RL_STATISTIC) != A.RlStatisticValues.MIN.value)
    if direction != "higher" and (ratio_like or length_like) and int(at_top.sum()) >= need:
        out.append(_pinned_finding(s, x, at_top, top, "up", series, metric, attrs, direction,
                                   "the generation length limit" if length_like else "its maximum, 1"))
    low = float(x.min())
    at_low = x == low
    if (direction == "higher" and not constant and attrs.get(A.RL_STATISTIC) in _LEVEL_STATISTICS
            and bool(at_low[-1]) and int(at_low.sum()) >= max(need, int(math.ceil(0.5 * n)))):
        # A score that sits exactly at its lowest value for most of the run, to the end: nothing
        # scores above the floor any more (every answer wrong, or only the format reward left).
        out.append(_pinned_finding(s, x, at_low, low, "down", series, metric, attrs, direction,
                                   "its lowest value, held to the end"))
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
    f.detail = (f"at {format_number(limit)} ({what}) on {idx.size} of {len(x)} logged steps ({frac:.0%}), "
                f"steps {f.first_step}-{f.last_step}" + (f"; median elsewhere {format_number(base)}" if others.size else ""))
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
