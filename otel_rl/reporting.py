"""Saying a problem once: bad input is reported with its key named, the first time only.

Telemetry runs inside the training loop for days; a bad value logged every step must not print
a warning every step. Every part of otel-rl that reports a repeated problem keeps one
:class:`ReportOnce` (per object, or per module for process-wide problems) instead of its own set.
Problems too many to name one by one (a key per sample, a step inside every key) are counted by a
:class:`Tally`, which says how many at most once per interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable
from typing import Any

LOGGER_NAME = "otel_rl"
"""The one logger otel-rl writes to: ``logging.getLogger("otel_rl").setLevel(...)`` governs it all."""

logger = logging.getLogger(LOGGER_NAME)

SUMMARY_INTERVAL_S = 60.0
"""A :class:`Tally` says its count at most once per this many seconds (and when flushed)."""


class Tally:
    """Counts a repeated problem and says how many at most once per ``interval_s``.

    ``message`` is formatted with ``count`` (the number since the last line, with thousands
    separators) and ``seconds`` (how long that was). A count not said yet is said by the first
    :meth:`add` after the interval, or by :meth:`flush` (at shutdown). Thread-safe.
    """

    def __init__(self, message: str, log: logging.Logger | None = None, interval_s: float = SUMMARY_INTERVAL_S) -> None:
        self._message = message
        self._logger = log or logger
        self.interval_s = interval_s
        self.total = 0
        self._pending = 0
        self._since = 0.0  # when the first of the pending ones came
        self._lock = threading.Lock()

    def add(self, count: int = 1) -> None:
        """Count ``count`` more; say the count when the interval has passed since the first unsaid one."""
        now = time.monotonic()
        with self._lock:
            self.total += count
            if not self._pending:
                self._since = now
            self._pending += count
            if now - self._since < self.interval_s:
                return
            pending, since, self._pending = self._pending, self._since, 0
        self._say(pending, now - since)

    def flush(self) -> bool:
        """Say the count not said yet (if any); whether there was one."""
        with self._lock:
            pending, since, self._pending = self._pending, self._since, 0
        if pending:
            self._say(pending, time.monotonic() - since)
        return bool(pending)

    def _say(self, count: int, seconds: float) -> None:
        self._logger.warning(self._message.format(count=f"{count:,}", seconds=f"{max(1, round(seconds)):,}"))


class ReportOnce:
    """Logs a message the first time its key is seen, and never again for that key.

    ``limit`` bounds what is remembered (keys built from user input, such as metric keys, could grow
    without end). Past it, new keys are not named one by one any more: the first is said with a
    line that says so, and the others are counted and said as one line at most every
    ``interval_s`` (a :class:`Tally`; :meth:`flush` says the rest), so a stream of distinct keys
    prints a few lines, never one per key, and is never silent. Thread-safe: the training thread
    and the telemetry worker share one.
    """

    def __init__(self, log: logging.Logger | None = None, limit: int = 10_000, interval_s: float = SUMMARY_INTERVAL_S) -> None:
        self._logger = log or logger
        self._limit = limit
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()
        self._past_limit = False
        self.unsaid = Tally(
            f"otel-rl: {{count}} more problems with other keys in the last {{seconds}} s were not reported one by one "
            f"(the first {limit:,} keys were; the rest are counted, e.g. in rl.telemetry.rejected)",
            self._logger,
            interval_s,
        )

    def __call__(self, key: Hashable, message: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Log ``message % args`` at ``level`` unless ``key`` was reported before; True when it logged."""
        if not self.first(key):
            return False
        self._logger.log(level, message, *args)
        return True

    def first(self, key: Hashable) -> bool:
        """True the first time ``key`` is seen (and remembers it), for callers that report otherwise.
        Past ``limit`` keys: False, and the key is counted in :attr:`unsaid` instead."""
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) < self._limit:
                self._seen.add(key)
                return True
            first_past = not self._past_limit
            self._past_limit = True
        if first_past:
            self._logger.warning(
                "otel-rl: problems with more than %s distinct keys were reported; %r and further new ones are "
                "counted and summarized at most once every %.0f s instead of one line each",
                f"{self._limit:,}",
                key,
                self.unsaid.interval_s,
            )
        else:
            self.unsaid.add()
        return False

    def __contains__(self, key: Hashable) -> bool:
        return key in self._seen

    def __iter__(self) -> Any:
        with self._lock:
            return iter(list(self._seen))

    def __len__(self) -> int:
        return len(self._seen)

    def flush(self) -> None:
        """Say how many keys past the limit were not reported one by one since the last summary."""
        self.unsaid.flush()

    def forget(self) -> None:
        """Report everything again (a new run in the same process)."""
        with self._lock:
            self._seen.clear()
            self._past_limit = False
