"""Offline detection of changes that last to the end of the log, against where the series
started: a collapse from the start too gradual for the rolling baseline, and a slow drift,
window against window. :func:`lasting_changes` is called by :func:`otel_rl.detect.findings.detect_series`
once the excursions of a series are known (a change they already tell is not told twice).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from otel_rl.detect.baseline import MAD_TO_SIGMA, DetectorConfig, drift_windows, median_se
from otel_rl.detect.records import (
    EXTREME_STATISTICS,
    SPREAD_STATISTICS,
    Finding,
    describe,
    format_number,
    is_bad_change,
    is_performance_unit,
    severity_of,
)
from otel_rl.semconv import attributes as A

__all__ = ["lasting_changes"]


def _explained(findings: Sequence[Finding], sign_text: str) -> bool:
    """An unrecovered collapse / explosion / level shift / threshold run already tells a lasting change."""
    return any(
        f.kind in ("collapse", "explosion", "level shift", "threshold") and f.direction == sign_text and f.recovered_step is None
        for f in findings
    )


def lasting_changes(
    s: np.ndarray,
    x: np.ndarray,
    findings: Sequence[Finding],
    series: str,
    metric: str,
    attrs: dict[str, str],
    direction: str | None,
    unit: str,
    min_change: float,
    typical: float,
    scale_floor: float,
    cfg: DetectorConfig,
) -> list[Finding]:
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


def _from_start(
    s: np.ndarray,
    x: np.ndarray,
    chunks: list[np.ndarray],
    findings: Sequence[Finding],
    series: str,
    metric: str,
    attrs: dict[str, str],
    direction: str | None,
    unit: str,
    scale_floor: float,
    cfg: DetectorConfig,
) -> Finding | None:
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
    ahead = np.array([float(np.median(x[i : i + k])) for i in range(n)])  # each point and the next k - 1
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
    p = a + int(np.argmin(x[a : b + 1]))
    peak = float(x[p])
    bad = is_bad_change(direction, "down")
    f = Finding(
        series=series,
        metric=metric,
        attributes=attrs,
        kind="collapse",
        direction="down",
        first_step=int(s[a]),
        last_step=int(s[b]),
        peak_step=int(s[p]),
        peak_value=peak,
        baseline=h,
        scale=h_scale,
        z=(peak - h) / h_scale,
        magnitude=peak / h if peak >= 0 else (peak - h) / h_scale,
        severity=severity_of("collapse", bad, attrs, unit),
        bad=bad,
    )
    f.detail = describe(f) + f" (against the median of the first {len(head)} logged values; the last window's median is {format_number(e)})"
    return f


def _drift(
    s: np.ndarray,
    x: np.ndarray,
    chunks: list[np.ndarray],
    findings: Sequence[Finding],
    series: str,
    metric: str,
    attrs: dict[str, str],
    direction: str | None,
    unit: str,
    min_change: float,
    typical: float,
    scale_floor: float,
    cfg: DetectorConfig,
) -> Finding | None:
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
    bad = is_bad_change(direction, sign_text)
    stat = attrs.get(A.RL_STATISTIC)
    # a slower stage as outputs grow is a cost, and a batch's extreme or spread is context
    quiet = stat in SPREAD_STATISTICS or stat in EXTREME_STATISTICS or is_performance_unit(unit)
    spread_lin = max(MAD_TO_SIGMA * float(np.median(np.abs(x[chunks[0]] - m0))), scale_floor)
    f = Finding(
        series=series,
        metric=metric,
        attributes=attrs,
        kind="drift",
        direction=sign_text,
        first_step=int(s[chunks[k0][0]]),
        last_step=int(s[-1]),
        peak_step=int(s[last[len(last) // 2]]),
        peak_value=m1,
        baseline=m0,
        scale=spread_lin,
        z=(m1 - m0) / spread_lin,
        magnitude=m1 / m0 if m0 > 0 and m1 >= 0 else (m1 - m0) / spread_lin,
        severity="warning" if bad and not quiet else "info",
        bad=bad,
        count=len(chunks),
    )
    f.detail = describe(f)
    if far not in (0, len(chunks) - 1) and abs(float(meds[far]) - m0) > 1.5 * abs(m1 - m0):
        f.detail += (
            f"; it went furthest around step {int(s[chunks[far][len(chunks[far]) // 2]])} (window median {format_number(float(meds[far]))})"
        )
    return f
