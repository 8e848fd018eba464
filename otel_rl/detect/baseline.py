"""The robust baseline shared by the offline findings and the online alerts.

A value is judged against the median and a spread estimate of the values before it
(:func:`baseline`, :func:`rolling_baseline`): its robust z-score ``(value - median) / scale``
must pass a threshold AND the change must be large in the metric's own terms. The scale never
drops below what the numbers can resolve (:func:`resolution`: a loss rounded to 4 decimals moves
in steps of 1e-4), so a series that is constant but for its rounding gives no absurd z-score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x 1.4826 = its standard deviation
MEAN_AD_TO_SIGMA = 1.2533  # mean absolute deviation x sqrt(pi/2) = standard deviation


@dataclass(frozen=True)
class DetectorConfig:
    """Thresholds of the detectors; the defaults are what ``otel-rl analyze`` uses."""

    window: int = 30  # previous values the baseline is computed from
    min_baseline: int = 5  # earlier values needed for a rolling baseline; earlier points are judged
    # against the first 2 x min_baseline values (themselves excluded)
    z: float = 8.0  # robust z-score of an anomalous point
    min_rel_change: float = 0.1  # ... and at least this fraction of |median| away from it
    rel_floor: float = 0.01  # the scale is at least this fraction of |median| (rounded, near-constant series)
    abs_floor: float = 1e-12
    magnitude_quantile: float = 0.95  # the series' typical magnitude: this quantile of |value| ...
    magnitude_fraction: float = 0.01  # ... and a change below this fraction of it is never an event
    spike_max_points: int = 3  # an excursion back to the baseline within this many points is a spike
    settle_points: int = 5  # points after an excursion that decide whether it came back
    return_z: float = 3.0  # "back" = within this many scales (or min_rel_change) of the old median
    explosion_factor: float = 10.0  # peak >= 10x max(|median|, scale): an explosion
    collapse_factor: float = 0.5  # a drop to <= half of a positive median: a collapse
    relative_z: float = 3.0  # a drop to <= collapse_factor x a clearly positive median (> 2 scales) needs only this z
    jump_factor: float = 3.0  # a rise to >= 3x a clearly positive median ...
    jump_z: float = 5.0  # ... needs only this z (a 4x grad-norm spike on a noisy baseline)
    texture_factor: float = 3.0  # on a long series, a relative-only event is also >= 3x the series' usual
    texture_quantile: float = 0.75  # excursion (this quantile of |value - median| of its ordinary points)
    texture_min_points: int = 50
    bursty_min_runs: int = 5  # events on >= 5 separate runs (and >= 2% of the points): the series'
    bursty_fraction: float = 0.02  # texture (a loss jittering around 0), not events; 5x bigger ones stay
    periodic_z: float = 4.0  # lower bar for the candidates of a periodic pattern
    periodic_min_count: int = 4
    periodic_coverage: float = 0.7
    pinned_min_points: int = 3
    pinned_min_fraction: float = 0.1
    drift_windows: int = 8  # drift: medians of windows of max(drift_min_window, n // drift_windows) points
    drift_min_window: int = 5
    drift_ratio: float = 1.5  # ... the last windows >= 1.5x (or <= 1/1.5 x) the first one (log scale)
    drift_relative: float = 0.25  # ... or, for series that reach 0 or below, >= this fraction of the typical magnitude
    drift_se: float = 4.0  # ... and >= this many standard errors of a window median away


def _trimmed(n: int) -> int:
    """How many of the largest deviations the mean absolute deviation leaves out: one spike in a
    window must not widen the scale for the next 30 steps (a KL of 197 would hide one of 67)."""
    return max(1, n // 10) if n >= 10 else 0


def baseline(window: Sequence[float], cfg: DetectorConfig = DetectorConfig()) -> tuple[float, float]:
    """``(median, scale)`` of ``window``: scale = max(1.4826 MAD, 1.2533 trimmed mean |dev|,
    rel_floor |median|, abs_floor).

    The mean absolute deviation is a floor for series that sit on one value most of the time
    (a clipped ratio that is 0 but for an occasional 1/16): their MAD is 0, yet those values
    are normal for them. It leaves out the largest 10% of the deviations, so a single spike
    is not carried into the scale of the steps after it. Pure Python: for the ~30 values of a
    window it is faster than numpy.
    """
    ordered = sorted(window)
    med = middle(ordered)
    return med, spread(ordered, med, cfg)


def middle(ordered: Sequence[float]) -> float:
    """The median of values already sorted."""
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def spread(ordered: Sequence[float], med: float, cfg: DetectorConfig = DetectorConfig()) -> float:
    """:func:`baseline`'s scale of sorted values whose median is ``med``. Apart from the median
    because the online rules refuse most values on the median alone (a value below it can be no
    rise), and this second sort is most of a baseline's cost."""
    # Called per watched value in training (and per step of a replayed log): a list, not a generator.
    n = len(ordered)
    mid = n // 2
    devs = sorted([abs(v - med) for v in ordered])
    mad = devs[mid] if n % 2 else (devs[mid - 1] + devs[mid]) / 2.0
    k = n - _trimmed(n)
    mean_ad = sum(devs[:k]) / k
    return max(MAD_TO_SIGMA * mad, MEAN_AD_TO_SIGMA * mean_ad, cfg.rel_floor * abs(med), cfg.abs_floor)


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
        # row blocks: each row's result is its own, and a 455,000-step series' windows materialized
        # at once are ~100 MB per temporary
        # Medians by index into sorted rows: a sort of 30 values is faster than np.median's partition,
        # and the deviations are sorted anyway. The same values as baseline(): (a + b) / 2 of the middle two.
        lo, hi = (w - 1) // 2, w // 2
        for start in range(0, len(windows), _ROWS_PER_BLOCK):
            block = np.sort(windows[start : start + _ROWS_PER_BLOCK], axis=1)
            m = (block[:, lo] + block[:, hi]) / 2.0
            m[np.isnan(block[:, -1])] = np.nan  # a window with a NaN has no median (np.median's answer)
            devs = np.sort(np.abs(block - m[:, None]), axis=1)
            mad = (devs[:, lo] + devs[:, hi]) / 2.0
            mean_ad = devs[:, : w - _trimmed(w)].mean(axis=1)
            s = np.maximum.reduce(
                [MAD_TO_SIGMA * mad, MEAN_AD_TO_SIGMA * mean_ad, cfg.rel_floor * np.abs(m), np.full_like(m, cfg.abs_floor)]
            )
            med[w + start : w + start + len(block)] = m
            scale[w + start : w + start + len(block)] = s
    return med, scale


_ROWS_PER_BLOCK = 32_768


def early_baseline(x: np.ndarray, cfg: DetectorConfig = DetectorConfig()) -> tuple[np.ndarray, np.ndarray]:
    """``(median, scale)`` for the first ``min_baseline`` points, which have no rolling baseline yet:
    :func:`baseline` of the first ``2 x min_baseline`` values without the point itself."""
    k = min(cfg.min_baseline, len(x))
    head = x[: 2 * cfg.min_baseline].tolist()
    med = np.full(k, np.nan)
    scale = np.full(k, np.nan)
    for i in range(k):
        others = head[:i] + head[i + 1 :]
        if len(others) >= cfg.min_baseline:
            med[i], scale[i] = baseline(others, cfg)
    return med, scale


def is_anomalous(value: float, med: float, scale: float, *, z: float, min_rel_change: float, min_change: float = 0.0) -> bool:
    delta = abs(value - med)
    return delta >= z * scale and delta >= min_rel_change * abs(med) and delta >= min_change


def resolution(x: np.ndarray, max_decimals: int = 10) -> float:
    """The quantum of a rounded series: the largest ``10**-k`` (k = 0..max_decimals) that every
    value is a multiple of (a loss logged with 4 decimals: 1e-4); 0 when there is none."""
    v = np.asarray(x, dtype=np.float64)
    v = v[np.isfinite(v) & (v != 0.0)]
    if v.size == 0:
        return 0.0
    for k in range(max_decimals + 1):
        scaled = v * 10.0**k
        if float(np.max(np.abs(scaled))) >= 1e15:  # past float precision: no quantum can be told
            break
        if np.all(np.abs(scaled - np.round(scaled)) <= 1e-9 * np.maximum(1.0, np.abs(scaled))):
            return 10.0**-k
    return 0.0


def typical_magnitude(x: np.ndarray, cfg: DetectorConfig = DetectorConfig()) -> float:
    """The series' typical size: a high quantile of |value|, so one explosion does not set it."""
    return float(np.quantile(np.abs(x), cfg.magnitude_quantile)) if len(x) else 0.0


def drift_windows(x: np.ndarray, cfg: DetectorConfig = DetectorConfig()) -> list[np.ndarray]:
    """Index chunks of the non-overlapping drift windows (at least ``drift_min_window`` points each)."""
    n = len(x)
    w = max(cfg.drift_min_window, n // cfg.drift_windows)
    k = n // w
    return np.array_split(np.arange(n), k) if k else []


def median_se(spread: float, points: int) -> float:
    """Standard error of the median of ``points`` values of standard deviation ``spread``."""
    return MEAN_AD_TO_SIGMA * spread / math.sqrt(max(points, 1))
