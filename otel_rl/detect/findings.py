"""Offline detection (``otel-rl analyze``): a whole series in, its findings out.

:func:`detect_series` judges each value against the robust baseline of the values before it
(the first values against each other) and reports spike, level shift, collapse, explosion,
pinned-at-limit and periodic patterns; fixed danger thresholds of the registry from the first
point on ("threshold"); and slow changes, window against window ("drift").

Each metric is judged on its own scale: a change below the metric's registry floor, below the
series' resolution (the quantum of rounded values) or below 1% of its typical magnitude is never
an event, and the scale of a z-score never drops below those, so a loss rounded to 1e-4 or a
timer that is 0 at most steps gives no absurd z-score.
The finding records and their text are in :mod:`otel_rl.detect.records`; changes that last to the
end of the log (collapse from the start, drift) in :mod:`otel_rl.detect.lasting`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from otel_rl.detect.baseline import MAD_TO_SIGMA, DetectorConfig, early_baseline, resolution, rolling_baseline, typical_magnitude
from otel_rl.detect.lasting import lasting_changes
from otel_rl.detect.pinned import ZERO_MEANS_STALLED, pinned

# The finding records and the metric terms stay importable from here.
from otel_rl.detect.records import (  # noqa: F401
    FRACTION_METRICS,
    GRAD_CLIP_FACTOR,
    KINDS,
    LENGTH_METRICS,
    LEVEL_STATISTICS,
    Finding,
    danger_bounds,
    describe,
    direction_of,
    floor_for,
    format_number,
    is_bad_change,
    is_performance_unit,
    min_change_for,
    severity_of,
)
from otel_rl.semconv import METRICS

__all__ = [
    "FRACTION_METRICS",
    "Finding",
    "GRAD_CLIP_FACTOR",
    "KINDS",
    "LENGTH_METRICS",
    "danger_bounds",
    "detect_series",
    "direction_of",
    "floor_for",
    "format_number",
    "min_change_for",
]


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
    findings.extend(pinned(s, x, series, metric, attrs, direction, unit, cfg))
    if n <= cfg.min_baseline:
        findings.sort(key=lambda f: (f.first_step, f.series))
        return [f for f in findings if _finite_stats(f)]

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
    if metric in ZERO_MEANS_STALLED:
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
            for later, (a2, _b2, sign2) in enumerate(events[index + 1 :], start=index + 1):
                if sign2 != sign and abs(a2 - back) <= 3:
                    suppressed.add(later)
    findings.extend(out)
    findings.extend(lasting_changes(s, x, findings, series, metric, attrs, direction, unit, min_change, typical, scale_floor, cfg))
    findings = _merge_thresholds(findings)
    findings.sort(key=lambda f: (f.first_step, f.series))
    return [f for f in findings if _finite_stats(f)]


def _finite_stats(f: Finding) -> bool:
    """Finite values whose statistics overflowed (medians of +-1e308) say nothing: never a finding.
    (A non-finite value itself is one: its peak is non-finite.)"""
    return not math.isfinite(f.peak_value) or all(math.isfinite(v) for v in (f.baseline, f.scale, f.z))


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
        host = next((e for e in events if e.direction == f.direction and e.first_step <= f.last_step and f.first_step <= e.last_step), None)
        if host is None:
            out.append(f)
            continue
        host.limit, host.why = f.limit, f.why
        if _SEVERITY_RANK.get(f.severity, 0) > _SEVERITY_RANK.get(host.severity, 0):
            host.severity = f.severity
        host.detail = describe(host)
    return out


def _early_event(
    event: tuple[int, int, int],
    x: np.ndarray,
    med: np.ndarray,
    scale: np.ndarray,
    z: np.ndarray,
    direction: str | None,
    unit: str,
    cfg: DetectorConfig,
) -> bool:
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
    after = x[b + 1 : b + 1 + cfg.spike_max_points]
    if after.size == 0 or not bool((np.abs(after - m0) <= tol).any()):
        return False
    if a > 0:
        return abs(float(x[a - 1]) - m0) <= tol
    rest = x[1:]
    extreme = x[0] > np.quantile(rest, 0.95) if sign > 0 else x[0] < np.quantile(rest, 0.05)
    return (
        abs(float(z[0])) >= cfg.z
        and bool(extreme)
        and is_bad_change(direction, "up" if sign > 0 else "down") is True
        and not is_performance_unit(unit)
    )


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


def _classify(
    a: int,
    b: int,
    sign: int,
    s: np.ndarray,
    x: np.ndarray,
    med: np.ndarray,
    scale: np.ndarray,
    series: str,
    metric: str,
    attrs: dict[str, str],
    direction: str | None,
    unit: str,
    cfg: DetectorConfig,
) -> tuple[Finding, int | None]:
    m0, s0 = float(med[a]), float(scale[a])
    seg = x[a : b + 1]
    p = a + int(np.argmax(sign * (seg - m0)))
    peak = float(x[p])
    tol = max(cfg.return_z * s0, cfg.min_rel_change * abs(m0))
    post = x[b + 1 : b + 1 + cfg.settle_points]
    returned = post.size > 0 and abs(float(np.median(post)) - m0) <= tol
    # "Back at step N" names a step whose own value is back, not the first of a few whose median is.
    close = np.flatnonzero(np.abs(post - m0) <= tol) if returned else np.empty(0, dtype=int)
    back: int | None = b + 1 + int(close[0]) if close.size else None
    if back is None:
        for j in range(b + 1, len(x)):
            nxt = x[j : j + 3]
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
    bad = is_bad_change(direction, sign_text)
    finding = Finding(
        series=series,
        metric=metric,
        attributes=attrs,
        kind=kind,
        direction=sign_text,
        first_step=int(s[a]),
        last_step=int(s[b]),
        peak_step=int(s[p]),
        peak_value=peak,
        baseline=m0,
        scale=s0,
        z=(peak - m0) / s0,
        magnitude=magnitude,
        recovered_step=int(s[back]) if back is not None and back < len(s) else None,
        severity=severity_of(kind, bad, attrs, unit),
        bad=bad,
    )
    finding.detail = describe(finding)
    return finding, back


def _threshold(
    s: np.ndarray,
    x: np.ndarray,
    sign: str,
    limit: float,
    inclusive: bool,
    why: str,
    series: str,
    metric: str,
    attrs: dict[str, str],
    direction: str | None,
    unit: str,
    cfg: DetectorConfig,
) -> list[Finding]:
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
        spread = max(MAD_TO_SIGMA * float(np.median(np.abs(rest - base))), cfg.rel_floor * abs(base), floor_for(metric), cfg.abs_floor)
    else:
        base, spread = limit, max(cfg.rel_floor * abs(limit), cfg.abs_floor)
    bad = is_bad_change(direction, sign)
    out = []
    for a, b, _ in _runs(past, np.ones(len(x)), gap=0):
        seg = x[a : b + 1]
        p = a + int(np.argmax(seg) if up else np.argmin(seg))
        peak = float(x[p])
        f = Finding(
            series=series,
            metric=metric,
            attributes=attrs,
            kind="threshold",
            direction=sign,
            first_step=int(s[a]),
            last_step=int(s[b]),
            peak_step=int(s[p]),
            peak_value=peak,
            baseline=base,
            scale=spread,
            z=(peak - base) / spread,
            magnitude=peak / base if base > 0 and peak >= 0 else (peak - base) / spread,
            recovered_step=int(s[b + 1]) if b + 1 < len(s) else None,
            severity=severity_of("threshold", bad, attrs, unit),
            bad=bad,
            count=b - a + 1,
            limit=limit,
            why=why or None,
        )
        f.detail = describe(f)
        out.append(f)
    return out


def _nonfinite(
    s: np.ndarray, v: np.ndarray, finite: np.ndarray, series: str, metric: str, attrs: dict[str, str], direction: str | None
) -> list[Finding]:
    out = []
    for a, b, _ in _runs(~finite, np.ones_like(v), gap=0):
        peak = float(v[a])
        f = Finding(
            series=series,
            metric=metric,
            attributes=attrs,
            kind="explosion",
            direction="up",
            first_step=int(s[a]),
            last_step=int(s[b]),
            peak_step=int(s[a]),
            peak_value=peak,
            baseline=float("nan"),
            scale=float("nan"),
            z=float("inf"),
            magnitude=float("inf"),
            severity="critical",
            bad=True,
        )
        following = np.flatnonzero(finite[b + 1 :])
        f.recovered_step = int(s[b + 1 + following[0]]) if following.size else None
        f.detail = (
            f"non-finite values ({'NaN' if math.isnan(peak) else peak}) at steps {f.first_step}-{f.last_step}: "
            "a numerical blow-up" + (f"; finite again at step {f.recovered_step}" if f.recovered_step is not None else "")
        )
        out.append(f)
    return out


def _periodic(
    s: np.ndarray,
    x: np.ndarray,
    med: np.ndarray,
    scale: np.ndarray,
    z: np.ndarray,
    judged: np.ndarray,
    series: str,
    metric: str,
    attrs: dict[str, str],
    direction: str | None,
    cfg: DetectorConfig,
) -> tuple[list[Finding], np.ndarray]:
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
        f = Finding(
            series=series,
            metric=metric,
            attributes=attrs,
            kind="periodic",
            direction="up" if sign > 0 else "down",
            first_step=int(s[first]),
            last_step=int(s[last]),
            peak_step=int(s[on_grid[np.argmax(sign * z[on_grid])]]),
            peak_value=float(np.max(sign * x[on_grid]) * sign),
            baseline=float(np.median(med[on_grid])),
            scale=float(np.median(scale[on_grid])),
            z=float(np.median(z[on_grid])),
            magnitude=float(np.nanmedian(ratios)) if not np.all(np.isnan(ratios)) else float(np.median(z[on_grid])),
            severity="info",
            bad=None,
            period=step_period,
            count=int(on_grid.size),
        )
        f.detail = describe(f)
        return [f], grid
    return [], empty
