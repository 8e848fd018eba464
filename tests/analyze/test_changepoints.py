"""The changepoint search (``pelt_l2``) against ruptures' KernelCPD (linear kernel), the maintained
implementation it replaces: the same segment ends on random series and on every series of the
real logs, and the exact optimum on series small enough to search exhaustively."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from shared_files import LOGS, needs_shared_logs

from otel_rl.analyze._changes import PENALTY, _row_nanmedian, pelt_l2
from otel_rl.replay import parse_file


def reference_ends(y: np.ndarray, penalty: float) -> list[int]:
    """ruptures' segment ends (ruptures is in the 'test' extra; without it the comparisons skip, naming it)."""
    ruptures = pytest.importorskip("ruptures", reason="ruptures (the 'test' extra) is the reference the changepoints are checked against")
    return [int(e) for e in ruptures.KernelCPD(kernel="linear", min_size=2).fit(y.reshape(-1, 1)).predict(pen=penalty)]


def penalised_cost(y: np.ndarray, ends: list[int], penalty: float) -> float:
    start, total = 0, 0.0
    for end in ends:
        part = y[start:end]
        total += float(((part - part.mean()) ** 2).sum()) + penalty
        start = end
    return total


def test_a_shift_is_found_at_its_index() -> None:
    y = np.concatenate([np.zeros(50), np.full(30, 10.0), np.zeros(20)]) + 0.1 * np.random.default_rng(3).standard_normal(100)
    assert pelt_l2(y, 8 * math.log(100)) == [50, 80, 100]


@pytest.mark.parametrize("seed", range(3))
def test_same_ends_as_ruptures_on_random_series(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(60):
        n = int(rng.integers(4, 800))
        y = rng.standard_normal(n)
        for _ in range(int(rng.integers(0, 6))):
            y[int(rng.integers(0, n)) :] += rng.normal(0, 4)
        if rng.random() < 0.3:
            y = np.round(y)  # ties: quantised series
        penalty = PENALTY * math.log(n)
        assert pelt_l2(y, penalty) == reference_ends(y, penalty), n


def test_the_optimum_on_small_series_by_exhaustive_search() -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(4, 11))
        y = rng.standard_normal(n) * 3 + np.repeat(rng.normal(0, 5, 3), -(-n // 3))[:n]
        penalty = 2.0
        best = min(
            penalised_cost(y, [*cuts, n], penalty)
            for k in range(n // 2)
            for cuts in itertools.combinations(range(2, n - 1), k)
            if all(b - a >= 2 for a, b in zip((0, *cuts), (*cuts, n)))
        )
        assert penalised_cost(y, pelt_l2(y, penalty), penalty) == pytest.approx(best)


@needs_shared_logs
def test_same_ends_as_ruptures_on_every_series_of_the_real_logs() -> None:
    compared = 0
    for path in sorted(p for p in LOGS.iterdir() if p.is_file() and p.name != "README.md"):
        records = parse_file(path).records
        keys = {key for r in records for key, value in r.values.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
        for key in sorted(keys):
            x = np.asarray([float(r.values[key]) for r in records if isinstance(r.values.get(key), (int, float))], dtype=float)
            x = x[np.isfinite(x)]
            if x.size < 8 or x.min() == x.max():
                continue
            y = (x - np.median(x)) / max(float(np.std(x)), 1e-12)
            penalty = PENALTY * math.log(x.size)
            assert pelt_l2(y, penalty) == reference_ends(y, penalty), (path.name, x.size)
            compared += 1
    assert compared > 500


def test_a_long_series_is_segmented_on_bins_and_keeps_its_changes_within_a_bin() -> None:
    from otel_rl.analyze._changes import PELT_POINTS, _segments

    rng = np.random.default_rng(5)
    n = 45_000
    y = rng.standard_normal(n) + np.where(np.arange(n) >= 30_000, 3.0, 0.0)
    size = -(-n // PELT_POINTS)
    segments = _segments(y, 1.0)
    assert len(segments) == 2 and abs(segments[0][1] - 30_000) <= size and segments[-1][1] == n
    assert _segments(rng.standard_normal(n), 1.0) == [(0, n)]  # noise alone: one level


def test_the_neighbours_median_is_numpys_nanmedian_row_by_row() -> None:
    rng = np.random.default_rng(3)
    rows = np.round(rng.standard_normal((5_000, 6)), 1)
    rows[rng.random(rows.shape) < 0.3] = np.nan  # the ends of a series have neighbours on one side only
    rows[:10] = np.nan
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        expected = np.nanmedian(rows, axis=1)
    assert np.array_equal(_row_nanmedian(rows), expected, equal_nan=True)
