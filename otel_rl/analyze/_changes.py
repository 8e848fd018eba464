"""Where one series changed, over the whole series at once: the parts an incident is made of.

- **Level changes and slow climbs**: changepoints of the whole series by PELT (the L2 cost, exact;
  the penalty scaled to the series' own noise),
  after one-step spikes are set aside;
  adjacent changes in one direction are one change from where it starts to where it settles
  ("shift" when it takes a few logs, "drift" when it takes longer). Unlike a window test judged
  against the first values, this finds a change at the second logged point, and a climb where it
  starts, not where a later window first passes a test.
- **Spikes**: the robust one-step outliers that came back (the detectors' spike findings).
- **Sustained conditions**: a registry danger threshold crossed, or a limit the series sits at,
  for much of the run: one condition with its share of steps, not one finding per excursion.

Positive series spanning orders of magnitude (KL, gradient norms, lengths) are segmented on a
log scale, so 1e-5 -> 0.1 is as clear a change as 0.1 -> 1000.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from otel_rl.analyze._series import Series
from otel_rl.detect.records import Finding, direction_of, format_number, is_bad_change, min_change_for
from otel_rl.semconv import metrics as M

# The PELT penalty, in units of the series' noise variance per log(n): higher finds fewer changes.
PENALTY = 8.0
# Past this many points a series is segmented on the means of equal bins (see _binned_ends).
PELT_POINTS = 4000
# A level change must be this many standard errors of the levels' difference to be a part ...
MIN_Z = 6.0
# ... and this large in the metric's own terms (decades, see change_size): a fold of 1.5 on a log
# scale, a quarter of the level (or of the series' spread) on a linear one.
MIN_SIZE = math.log10(1.5)
# A change that settles within this many logs (or this share of the run) is a shift; a longer one is a drift.
SHIFT_LOGS = 4
SHIFT_SHARE = 0.05
# A point this many spreads away from its neighbours, that they come back from, is a spike.
SPIKE_Z = 5.0
USUAL_RANGE = 2.0
USUAL_SHARE = 0.2
USUAL_WINDOW = 20
TEXTURE = 1.5
# Sustained: a condition over at least this share of the logged steps (or this many logs in a row).
SUSTAINED_SHARE = 0.2
SUSTAINED_RUN = 8
# A condition is left for good when at most this share of the series' last quarter (at least
# TAIL_POINTS points) is still in it: responses that hit the length cap early and stop hitting it.
LEFT_SHARE = 0.1
TAIL_POINTS = 5


# The reward's spread: 0 on a step means no learning signal there.
_SPREAD_METRICS = frozenset({M.RL_REWARD, M.RL_REWARD_ZERO_STD_RATIO})


@dataclass
class Change:
    """One series' part in an incident."""

    series: str  # the key as logged
    metric: str
    attributes: dict[str, str]
    kind: str  # "shift" | "drift" | "spike" | "sustained"
    direction: str  # "up" | "down"
    first_step: int
    last_step: int
    before: float  # the level before (spike: the baseline; sustained: the run's typical level)
    after: float  # the level after (spike: the peak; sustained: the level held)
    bad: bool | None  # the registry's bad direction; None: no good direction
    size: float  # how big, comparably across series: log10 of the fold, else the relative change
    recovered: bool = False  # back near ``before`` by the end of the log
    steps: list[int] = field(default_factory=list)  # the marked steps (each spike; else first and last)
    center: int = 0  # where the change is steepest (groups parts by when they happened)
    share: float | None = None  # sustained: the share of logged steps in the condition
    limit: float | None = None  # sustained: the threshold or limit it sits at
    why: str = ""  # sustained: what the threshold means
    past: bool = False  # sustained: past a danger threshold (``limit``), not sitting at one value

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v is not None and not (isinstance(v, (str, list)) and not v)}
        for key in ("before", "after", "size", "share", "limit"):
            if key in out:
                value = float(getattr(self, key))
                out[key] = float(f"{value:.6g}") if math.isfinite(value) else str(value)
        return out

    @property
    def text(self) -> str:
        if self.kind == "spike":
            return f"{self.series} {format_number(self.after)} (typically {format_number(self.before)})"
        # (sustained parts below; shifts and drifts at the end)
        if self.kind == "sustained":
            share = f" for {self.share:.0%} of the logged steps" if self.share is not None else ""
            because = f" ({self.why})" if self.why and self.bad is False else ""
            if self.past and self.limit is not None:
                side = "above" if self.direction == "up" else "below"
                return f"{self.series} {side} its danger threshold {format_number(self.limit)}{share} (at most {format_number(self.after)})"
            return f"{self.series} at {format_number(self.after)}{share}{because}"
        return f"{self.series} {format_number(self.before)} -> {format_number(self.after)}"


def _log_scale(x: np.ndarray) -> bool:
    """Whether to judge ``x`` on a log scale: positive (but for a few exact zeros) across a decade or more."""
    positive = x[x > 0]
    if x.size == 0 or positive.size < 0.9 * x.size or bool((x < 0).any()):
        return False
    lo, hi = np.quantile(positive, [0.05, 0.95])
    return hi / lo >= 10.0


def change_size(before: float, after: float, *, log: bool, spread: float = 0.0) -> float:
    """How big a change is, comparably across series, in decades: on a log scale the fold's, on a
    linear one that of the share r of the level (or of the series' spread) it takes away or adds,
    -log10(1 - r): a reward 1.0 -> 0 is two decades, 1.0 -> 0.5 a third of one, and a value near
    zero moving by a little of the series' spread stays small."""
    if log and before > 0 and after > 0:
        return abs(math.log10(after / before))
    r = abs(after - before) / max(abs(before), abs(after), spread, 1e-12)
    return -math.log10(1.0 - min(r, 0.99))


def _noise(y: np.ndarray) -> float:
    """The series' step-to-step noise: the MAD of first differences, as a standard deviation (robust to
    spikes and steps). A quantized series (a ratio over 4 completions: 0, 0.25, 0.5 ...) repeats its
    value often, so most differences are 0 and the MAD says no noise at all; there every difference
    counts."""
    d = np.diff(y)
    if d.size == 0:
        return 0.0
    robust = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2.0)
    # The standard deviation of differences, over sqrt(2), is the per-point spread of independent
    # noise whatever its shape (a 0/1 series with p = 0.25 has sqrt(p(1-p)) = 0.43). Its isolated
    # values are its noise, not spikes to set aside: the raw differences count.
    every_move = float(np.std(d)) / math.sqrt(2.0)
    return every_move if robust < 0.5 * every_move else robust


def _spikes(y: np.ndarray, log: bool) -> tuple[np.ndarray, np.ndarray]:
    """The one-point excursions that come back: a mask, and ``y`` with them replaced by the median of
    the three points on each side. Robust and local: a point beyond SPIKE_Z spreads of those six
    points (their MAD, at least 0.05 of a decade on a log scale or 5% of their level), which both
    sides come back to, and beyond TEXTURE times the series' usual excursion that way (its 90th
    percentile). Twice: the second time the neighbours are the points the first did not flag, so
    steps that drop to ~0 (a gradient norm without a learning signal) do not hide a spike next to
    them. The series' global noise is no floor: a few big spikes inflate it."""
    candidate = _flag(y, log, np.zeros(y.size, dtype=bool))[0]
    candidate, medians, excursion = _flag(y, log, candidate)
    up = y > medians
    for side in (up, ~up):
        usual = excursion[side & ~candidate]
        if usual.size >= 20:  # fewer points say too little of the series' texture
            # (a tenfold excursion on a log scale stands whatever the texture)
            candidate &= ~side | (excursion >= min(TEXTURE * float(np.quantile(usual, 0.9)), 1.0 if log else np.inf))
    return candidate, np.where(candidate, medians, y)


def _row_nanmedian(rows: np.ndarray) -> np.ndarray:
    """``np.nanmedian(rows, axis=1)`` for a few columns, by index into sorted rows (NaN sort last):
    numpy's own goes through masked arrays, 10x slower on a long series' (n, 6) neighbours."""
    ordered = np.sort(rows, axis=1)
    count = rows.shape[1] - np.isnan(ordered).sum(axis=1)
    lo, hi = np.maximum(count - 1, 0) // 2, count // 2
    taken = np.take_along_axis(ordered, np.stack([lo, np.minimum(hi, rows.shape[1] - 1)], axis=1), axis=1)
    return np.where(count > 0, (taken[:, 0] + taken[:, 1]) / 2.0, np.nan)


def _flag(y: np.ndarray, log: bool, skip: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flagged, neighbours' median, excursion) of each point, its neighbours the three unskipped points
    each side (all points at once: a 2,000-point series costs milliseconds)."""
    n = y.size
    keep = np.flatnonzero(~skip)
    if keep.size < 2:
        return np.zeros(n, dtype=bool), y.copy(), np.zeros(n)
    idx = np.arange(n)
    k = np.searchsorted(keep, idx)  # the first kept point at or after each point
    at = (k < keep.size) & (keep[np.minimum(k, keep.size - 1)] == idx)
    offsets = np.array([-3, -2, -1, 0, 1, 2])
    # three kept points before (k-3..k-1), three after (k..k+2, or k+1..k+3 when the point itself is kept)
    pos = k[:, None] + offsets[None, :] + at.astype(int)[:, None] * (offsets >= 0)[None, :]
    valid = (pos >= 0) & (pos < keep.size)
    neighbours = np.where(valid, y[keep[np.clip(pos, 0, keep.size - 1)]], np.nan)
    has_both = valid[:, :3].any(axis=1) & valid[:, 3:].any(axis=1)  # the first and last point cannot be seen to come back
    med = _row_nanmedian(neighbours)
    mad = _row_nanmedian(np.abs(neighbours - med[:, None]))
    floor = np.full(n, 0.05) if log else 0.05 * np.abs(med)
    spread = np.maximum.reduce([1.4826 * np.nan_to_num(mad), np.nan_to_num(floor), np.full(n, 1e-12)])
    medians = np.where(has_both, med, y)
    excursion = np.where(has_both, np.abs(y - medians), 0.0)
    # The whole series' level too: a point half as far again out of it (or 30x off it), among neighbours
    # at that level, is a spike even where those few neighbours are restless (the first logs of a run).
    whole = y[keep]
    level = float(np.median(whole))
    level_spread = max(1.4826 * float(np.median(np.abs(whole - level))), 0.05 if log else 0.05 * abs(level), 1e-12)
    out_of_level = np.abs(y - level) > min(1.5 * SPIKE_Z * level_spread, 1.5 if log else np.inf)
    far = out_of_level & (np.abs(medians - level) <= 2 * level_spread)
    flagged = has_both & ((excursion > SPIKE_Z * spread) | far)
    return flagged, medians, excursion


def pelt_l2(y: np.ndarray, penalty: float, min_size: int = 2) -> list[int]:
    """The segment ends of the exact minimum of (sum of squared deviations from each segment's mean +
    ``penalty`` per segment), segments of ``min_size`` points or more: PELT (Killick et al. 2012).

    Written here, not taken from ruptures (whose KernelCPD with a linear kernel gives the same ends,
    a test checks it): importing ruptures imports scipy.stats, 1.5 s of every ``analyze``."""
    n = int(y.size)
    if n < 2 * min_size:
        return [n]
    total = np.concatenate(([0.0], np.cumsum(y)))
    squares = np.concatenate(([0.0], np.cumsum(y * y)))
    best = np.full(n + 1, np.inf)  # best[t]: the minimum for y[:t]; best[0] pays no penalty
    best[0] = -penalty
    last = np.zeros(n + 1, dtype=np.int64)
    starts = np.zeros(1, dtype=np.int64)  # where the last segment may start; pruned as PELT allows
    for t in range(min_size, n + 1):
        if t >= 2 * min_size:
            starts = np.append(starts, t - min_size)
        sums = total[t] - total[starts]
        cost = best[starts] + (squares[t] - squares[starts]) - sums * sums / (t - starts)
        i = int(cost.argmin())
        best[t] = cost[i] + penalty
        last[t] = starts[i]
        starts = starts[cost <= best[t]]  # a start this far behind can never be best again
    ends: list[int] = []
    t = n
    while t > 0:
        ends.append(t)
        t = int(last[t])
    return ends[::-1]


def _binned_ends(scaled: np.ndarray, penalty: float) -> list[int]:
    """Segment ends of a series longer than PELT_POINTS, found on the means of equal bins of it (each
    bin's noise the point noise / sqrt(bin size)), at the resolution of one bin: PELT's cost grows
    with the square of the points on a series without changes (69 s for 7 series of 45,500 steps)."""
    n = scaled.size
    size = -(-n // PELT_POINTS)
    full = n // size * size
    means = scaled[:full].reshape(-1, size).mean(axis=1)
    if full < n:
        means = np.append(means, scaled[full:].mean())
    ends = pelt_l2(means * math.sqrt(size), penalty * math.log(means.size))
    return [min(n, e * size) for e in ends[:-1]] + [n]


def _segments(y: np.ndarray, sigma: float) -> list[tuple[int, int]]:
    """[start, end) index ranges of PELT's segmentation of ``y`` (noise ``sigma``)."""
    n = y.size
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = (y - float(np.median(y))) / sigma
    if not bool(np.isfinite(scaled).all()):
        return [(0, n)]  # values at the edge of floating point (+-1e308): no level to compare
    if n > PELT_POINTS:
        ends = _binned_ends(scaled, PENALTY)
    else:
        ends = pelt_l2(scaled, PENALTY * math.log(n))
    # The first logged point alone is a level when it is far (MIN_Z noise deviations) from the next
    # points, which agree with each other: a collapse right after it starts at the second point.
    if n >= 4 and ends and ends[0] == 2:
        rest = scaled[1 : min(n, 6)]
        if abs(scaled[0] - float(np.median(rest))) > MIN_Z and abs(scaled[1] - float(np.median(rest))) <= 3.0:
            ends = [1, *ends]
    out, start = [], 0
    for end in ends:
        out.append((start, int(end)))
        start = int(end)
    return out


def series_changes(s: Series, interval: int) -> list[Change]:
    """The series' spikes, level changes and slow climbs (see the module doc)."""
    steps, x = s.arrays()
    ok = np.isfinite(x)
    steps, x = steps[ok], x[ok]
    n = x.size
    if n < 8 or float(x.min()) == float(x.max()):
        return []
    log = _log_scale(x)
    # Exact zeros on a log scale (a step without an update) sit a decade below the smallest value.
    y = np.log10(np.where(x > 0, x, float(x[x > 0].min()) / 10.0)) if log else x.copy()
    spiked, clean = _spikes(y, log)
    sigma = _noise(y)
    span = float(np.quantile(y, 0.95) - np.quantile(y, 0.05))
    sigma = max(sigma, 1e-3 * span, 1e-12 * (abs(float(np.median(y))) + 1.0))
    spread = 0.0 if log else float(np.quantile(x, 0.95) - np.quantile(x, 0.05))
    direction = direction_of(s.metric, s.attributes)
    floor = min_change_for(s.metric)
    changes = _spike_changes(s, steps, x, clean, spiked, log, spread, floor, direction)
    segments = _segments(clean, sigma)
    # A level needs some points to be one: short runs at either end join their neighbour, unless they
    # differ from it tenfold or more (a collapse right after the first logged point is one).
    least = 2 if n < 20 else 3

    def apart(a: tuple[int, int], b: tuple[int, int]) -> bool:
        la, lb = float(np.median(clean[a[0] : a[1]])), float(np.median(clean[b[0] : b[1]]))
        before, after = (10.0**la, 10.0**lb) if log else (la, lb)
        return change_size(before, after, log=log, spread=spread) >= 1.0

    def recurs(a: tuple[int, int], b: tuple[int, int]) -> bool:
        """Whether the short level ``a`` comes back in 10% or more of ``b``'s raw points (isolated hits
        of a sparse reward read as spikes there): ``a`` was not a level the run left, but the same hits."""
        la, lb = float(np.median(y[a[0] : a[1]])), float(np.median(clean[b[0] : b[1]]))
        near = np.abs(y[b[0] : b[1]] - la) <= 0.5 * abs(la - lb)
        return bool(abs(la - lb) > 0 and near.mean() >= 0.1)

    while (
        len(segments) > 1
        and segments[0][1] - segments[0][0] < least
        and (not apart(segments[0], segments[1]) or recurs(segments[0], (segments[0][1], n)))
    ):
        segments = [(0, segments[1][1]), *segments[2:]]
    while len(segments) > 1 and segments[-1][1] - segments[-1][0] < least and not apart(segments[-2], segments[-1]):
        segments = [*segments[:-2], (segments[-2][0], n)]
    if len(segments) < 2:
        return changes
    levels = [float(np.median(clean[a:b])) for a, b in segments]
    shift_logs = max(SHIFT_LOGS, int(SHIFT_SHARE * n))
    level_parts: list[Change] = []
    # Runs of adjacent segments that step the same way: one change from the first to the last level,
    # unless most of it happens in a few logs (a slow decline, then a collapse): that core is a shift
    # of its own, and the rest, if it is a change, a drift.
    i = 0
    while i < len(segments) - 1:
        sign = np.sign(levels[i + 1] - levels[i])
        j = i + 1
        while j + 1 < len(segments) and np.sign(levels[j + 1] - levels[j]) == sign:
            j += 1
        a, b = _core(segments, levels, i, j, shift_logs)
        pieces = [(i, j)] if (a, b) == (i, j) or abs(levels[b] - levels[a]) < 0.6 * abs(levels[j] - levels[i]) else [(i, a), (a, b), (b, j)]
        for lo, hi in pieces:
            if hi <= lo:
                continue
            quick = (lo, hi) == (a, b) and (a, b) != (i, j) or _quick(segments, lo, hi, shift_logs)
            change = _change(s, steps, clean, segments, levels, lo, hi, log, spread, sigma, floor, direction, quick)
            if change is not None:
                level_parts.append(change)
        i = j
    return changes + _bumps(level_parts, log)


def _quick(segments: Sequence[tuple[int, int]], lo: int, hi: int, shift_logs: int) -> bool:
    """Whether the change from segment lo to hi settles within ``shift_logs`` logs."""
    return segments[hi][0] - segments[lo + 1][0] <= shift_logs


def _core(segments: Sequence[tuple[int, int]], levels: Sequence[float], i: int, j: int, shift_logs: int) -> tuple[int, int]:
    """Within the run of segments i..j, the stretch of consecutive level steps each within
    ``shift_logs`` of the next that moves the most."""
    best, best_move = (i, i), 0.0
    start = i
    for k in range(i + 1, j + 1):
        if k > start + 1 and segments[k][0] - segments[k - 1][0] > shift_logs:
            start = k - 1
        move = abs(levels[k] - levels[start])
        if move > best_move:
            best, best_move = (start, k), move
    return best


def _bumps(parts: list[Change], log: bool) -> list[Change]:
    """A change followed by one back to about where it started (on the scale the series is judged
    on) is one change that recovered."""

    def scale(v: float) -> float:
        return math.log10(v) if log and v > 0 else v

    out: list[Change] = []
    for p in parts:
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.direction != p.direction
            and abs(scale(p.after) - scale(prev.before)) <= 0.3 * abs(scale(prev.after) - scale(prev.before))
        ):
            prev.recovered = True
            prev.last_step = p.first_step
            prev.steps = [prev.first_step, p.first_step]
            continue
        out.append(p)
    return out


def _change(
    s: Series,
    steps: np.ndarray,
    x: np.ndarray,  # the series without its spikes, on the scale it is judged on
    segments: Sequence[tuple[int, int]],
    levels: Sequence[float],
    i: int,
    j: int,
    log: bool,
    spread: float,
    sigma: float,
    floor: float,
    direction: str | None,
    quick: bool,
) -> Change | None:
    """The change from segment ``i``'s level to segment ``j``'s, if it is one (see MIN_Z and the floors)."""
    y0, y1 = levels[i], levels[j]
    # A z-test of the two levels (each a segment's median, known to sigma / sqrt(its points)).
    n0, n1 = segments[i][1] - segments[i][0], segments[j][1] - segments[j][0]
    if abs(y1 - y0) < MIN_Z * sigma * math.sqrt(1.0 / n0 + 1.0 / n1):
        return None
    before, after = (10.0**y0, 10.0**y1) if log else (y0, y1)
    if abs(after - before) < floor:
        return None
    size = change_size(before, after, log=log, spread=spread)
    if size < MIN_SIZE:
        return None
    start_index = segments[i + 1][0]
    settle_index = segments[j][0]
    first, settled = int(steps[start_index]), int(steps[settle_index])
    kind = "shift" if quick else "drift"
    way = "up" if after > before else "down"
    tail = x[segments[-1][0] :]
    tol = abs(levels[j] - levels[i]) * 0.3
    recovered = j < len(segments) - 1 and abs(float(np.median(tail)) - levels[i]) <= tol
    # Where it happened: the first step past half the change (what groups parts by time).
    begin = max(start_index - 1, 0)
    path = (x[begin : settle_index + 1] - (y0 + 0.5 * (y1 - y0))) * np.sign(y1 - y0)
    past = np.flatnonzero(path >= 0)
    center = int(steps[begin + int(past[0])]) if past.size else first
    return Change(
        series=s.label,
        metric=s.metric,
        attributes=dict(s.attributes),
        kind=kind,
        direction=way,
        first_step=first,
        last_step=settled if kind == "drift" else max(settled, first),
        before=before,
        after=after,
        bad=is_bad_change(direction, way),
        size=size,
        recovered=recovered,
        steps=[first, settled],
        center=center,
    )


def _spike_changes(
    s: Series,
    steps: np.ndarray,
    x: np.ndarray,
    clean: np.ndarray,
    spiked: np.ndarray,
    log: bool,
    spread: float,
    floor: float,
    direction: str | None,
) -> list[Change]:
    """One part per spike big enough to matter (MIN_SIZE). A rise from exactly 0 (a step with an update
    among steps without one) has no size to judge: it is not a spike, but for the reward's spread,
    whose rise from 0 is the step with a learning signal (what explains a gradient there)."""
    out = []

    # On a log scale, a value the series often has around it (USUAL_SHARE of the USUAL_WINDOW points each
    # side within USUAL_RANGE of it) is one of its modes, not a spike: a gradient norm that is ~0.005 on
    # steps whose groups had no spread and ~0.6 on the others is at its usual size on each of the latter.
    def usual(i: int, peak: float) -> bool:
        near = x[max(i - USUAL_WINDOW, 0) : i + USUAL_WINDOW + 1]
        return log and float(np.mean((near >= peak / USUAL_RANGE) & (near <= peak * USUAL_RANGE))) >= USUAL_SHARE

    # A gradient norm at its usual update size (the run's upper quartile) after steps a decade or more
    # below it (steps whose groups had no reward spread, so no advantage) is an update, not a spike.
    update = float(np.quantile(x, 0.75)) if s.metric == M.RL_GRAD_NORM else math.nan

    def back_from_floor(base: float, peak: float) -> bool:
        return base <= update / 10.0 and peak <= update * USUAL_RANGE

    for i in np.flatnonzero(spiked):
        base = 10.0 ** clean[i] if log else float(clean[i])
        peak = float(x[i])
        if abs(peak - base) < floor or (not log and base == 0.0 and s.metric not in _SPREAD_METRICS):
            continue
        if usual(int(i), peak) or back_from_floor(base, peak):
            continue
        size = change_size(base, peak, log=log, spread=spread)
        if size < MIN_SIZE:
            continue
        way = "up" if peak > base else "down"
        step = int(steps[i])
        out.append(
            Change(
                series=s.label,
                metric=s.metric,
                attributes=dict(s.attributes),
                kind="spike",
                direction=way,
                first_step=step,
                last_step=step,
                before=base,
                after=peak,
                bad=is_bad_change(direction, way),
                size=size,
                recovered=True,
                steps=[step],
                center=step,
            )
        )
    return out


def _condition_steps(s: Series, f: Finding) -> tuple[np.ndarray, int, float]:
    """The steps of the whole series in a finding's condition (past its threshold, or at the value it
    is pinned at), the longest run of them in a row, and the share of the series' last quarter in it:
    a share is counted over the whole log, not over the one excursion the finding describes."""
    steps, x = s.arrays()
    ok = np.isfinite(x)
    steps, x = steps[ok], x[ok]
    level = f.limit if f.limit is not None else f.peak_value
    if f.kind == "threshold":
        inside = x > level if f.direction == "up" else x < level
    else:
        inside = np.abs(x - level) <= 1e-9 + 1e-6 * abs(level)
    longest = run = 0
    for flag in inside:
        run = run + 1 if flag else 0
        longest = max(longest, run)
    tail = inside[-max(TAIL_POINTS, inside.size // 4) :]
    return steps[inside], longest, float(tail.mean()) if tail.size else 0.0


def sustained_changes(findings: Sequence[Finding], logged: int, series: Series | None = None) -> list[Change]:
    """Threshold and pinned-at-limit findings that hold for much of the run: one part per series (its
    longest condition), from three logged points on. With the series, the share and the steps are
    those of every step in the condition, and isolated steps (under SUSTAINED_SHARE of the log with
    no SUSTAINED_RUN in a row) are no condition."""
    by_series: dict[str, list[Finding]] = {}
    for f in findings:
        if f.kind in ("threshold", "pinned-at-limit"):
            by_series.setdefault(f.series, []).append(f)
    out = []
    for label, group in by_series.items():
        f = max(group, key=lambda g: (g.count or 1, g.kind == "pinned-at-limit"))
        points = f.count or 1
        first, last = f.first_step, f.last_step
        left = False  # the series left the condition for good: its last quarter is (nearly) out of it
        if series is not None:
            inside, longest, tail_share = _condition_steps(series, f)
            left = tail_share <= LEFT_SHARE
            points = int(inside.size)
            if points and (points / max(logged, 1) >= SUSTAINED_SHARE or longest >= SUSTAINED_RUN):
                first, last = int(inside[0]), int(inside[-1])
            elif points:
                continue  # isolated steps, not a condition held
        share = points / max(logged, 1)
        if points < 3 or (share < SUSTAINED_SHARE and points < SUSTAINED_RUN):
            continue
        level = f.limit if f.kind == "pinned-at-limit" and f.limit is not None else f.peak_value
        out.append(
            Change(
                series=label,
                metric=f.metric,
                attributes=dict(f.attributes),
                kind="sustained",
                direction=f.direction,
                first_step=first,
                last_step=last,
                before=f.baseline,
                after=level,
                bad=f.bad,
                size=max(change_size(f.baseline, level, log=f.baseline > 0 and level > 0), share),
                recovered=left,
                steps=[first, last],
                center=first,
                share=min(share, 1.0),
                limit=f.limit,
                why=f.why or "",
                past=f.kind == "threshold",
            )
        )
    return out
