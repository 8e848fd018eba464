"""Where a replay sends its metric points, and whether they stay there.

A metrics store drops samples older than its retention (VictoriaMetrics logs ``too small
timestamp ... outside the retention``; the OTLP request itself succeeds), so a replay checks its
points' times against the target's retention before sending and, where the target can be read
back, counts what was stored afterwards. ``ReplayTarget`` is what a target offers; the local
stack provides one (``otel_rl.stack.replay_target``), any other endpoint has unknown retention.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

__all__ = ["ReplayNotStored", "ReplayTarget", "format_duration", "samples_of", "window_problem"]

# The store would still take points this far inside its retention edge: a replay that takes a
# while to send must not have its oldest points cross the edge while it runs.
RETENTION_MARGIN_S = 3600.0
# VictoriaMetrics refuses samples more than 2 days ahead of its clock (``too big timestamp``).
FUTURE_LIMIT_S = 86400.0


class ReplayNotStored(ValueError):
    """The target stored fewer points than the replay sent."""


class ReplayTarget(Protocol):
    """A store a replay's metric points end up in, which knows its retention and can be read back."""

    description: str  # e.g. "the local stack's VictoriaMetrics (http://127.0.0.1:8428)"
    retention: str  # as the store's setting says it, e.g. "10y"
    retention_s: float

    def count_stored(self, run_id: str, times_ms: Sequence[int], expected: int, deadline_s: float) -> int:
        """Samples of ``run_id`` stored at ``times_ms``, polled until ``expected`` or the deadline."""
        ...


def format_duration(seconds: float) -> str:
    """``3.2 days``, ``5 h``: a span of time for messages."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.0f} days"
    if seconds >= 7200:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 60:.0f} min"


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def window_problem(target: ReplayTarget, first_ns: int, last_ns: int, *, fixed_clock: bool, now_ns: int | None = None) -> str | None:
    """Why ``target`` would not keep points from ``first_ns`` to ``last_ns`` (None when it would).

    ``fixed_clock``: the times come from --start-time (else from the log's own timestamps)."""
    now = time.time_ns() if now_ns is None else now_ns
    oldest_kept = now - int((target.retention_s - RETENTION_MARGIN_S) * 1e9)
    span = f"the replayed points span {_iso(first_ns)} to {_iso(last_ns)}"
    if first_ns < oldest_kept:
        age = (now - first_ns) / 1e9
        fix = (
            "leave out --start-time (the replayed run then ends now) or give a later one"
            if fixed_clock
            else "the log's own timestamps are used as they are; a store with a longer retention keeps them"
        )
        return (
            f"{span}; {target.description} keeps {target.retention} (-retentionPeriod), so it would drop points "
            f"{format_duration(age)} old without an error: nothing sent. {fix}"
        )
    if last_ns > now + int(FUTURE_LIMIT_S * 1e9):
        fix = (
            "give an earlier --start-time, or leave it out (the replayed run then ends now)" if fixed_clock else "the log's clock is ahead"
        )
        return f"{span}; {target.description} refuses points more than a day ahead of now: nothing sent. {fix}"
    return None


def samples_of(metrics: Iterable[Any]) -> tuple[int, set[int]]:
    """(samples a Prometheus-style store holds for these SDK metrics, their times in ms).

    A gauge or sum point is one sample; a histogram point is one per bucket plus _sum and _count."""
    count = 0
    times: set[int] = set()
    for metric in metrics:
        for point in getattr(metric.data, "data_points", ()):
            counts = getattr(point, "bucket_counts", None)
            count += len(counts) + 2 if counts is not None else 1
            times.add(int(point.time_unix_nano) // 1_000_000)
    return count, times
