"""Saying a problem once: bad input is reported with its key named, the first time only.

Telemetry runs inside the training loop for days; a bad value logged every step must not print
a warning every step. Every part of otel-rl that reports a repeated problem keeps one
:class:`ReportOnce` (per object, or per module for process-wide problems) instead of its own set.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from typing import Any

LOGGER_NAME = "otel_rl"
"""The one logger otel-rl writes to: ``logging.getLogger("otel_rl").setLevel(...)`` governs it all."""

logger = logging.getLogger(LOGGER_NAME)


class ReportOnce:
    """Logs a message the first time its key is seen, and never again for that key.

    ``limit`` bounds what is remembered (keys built from user input, such as metric keys, could grow
    without end); past it, new keys are still reported once each time they come, never silently
    dropped. Thread-safe: the training thread and the telemetry worker share one.
    """

    def __init__(self, log: logging.Logger | None = None, limit: int = 10_000) -> None:
        self._logger = log or logger
        self._limit = limit
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def __call__(self, key: Hashable, message: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Log ``message % args`` at ``level`` unless ``key`` was reported before; True when it logged."""
        if not self.first(key):
            return False
        self._logger.log(level, message, *args)
        return True

    def first(self, key: Hashable) -> bool:
        """True the first time ``key`` is seen (and remembers it), for callers that report otherwise."""
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) < self._limit:
                self._seen.add(key)
            return True

    def __contains__(self, key: Hashable) -> bool:
        return key in self._seen

    def forget(self) -> None:
        """Report everything again (a new run in the same process)."""
        with self._lock:
            self._seen.clear()
