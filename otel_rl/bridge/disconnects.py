"""Senders that leave mid-request (connection reset, broken pipe) or stall: counted, and reported
in one summary line at most once per interval, never a traceback each (a flood of resets must
not flood the bridge's log)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

__all__ = ["DisconnectLog", "is_disconnect"]


def is_disconnect(exc: BaseException | None) -> bool:
    """True for what a sender that went away (or went quiet) raises on its connection."""
    return isinstance(exc, (ConnectionError, TimeoutError))


class DisconnectLog:
    """Counts disconnects by kind; ``report(line)`` gets a summary at the first one, then at most
    one per ``interval_s`` (with what was counted since), and one at :meth:`flush`."""

    def __init__(self, report: Callable[[str], None], interval_s: float = 60.0) -> None:
        self._report, self.interval_s = report, interval_s
        self._lock = threading.Lock()
        self._pending: Counter[str] = Counter()
        self._last: float | None = None  # time.monotonic() of the last summary

    def note(self, kind: str) -> None:
        """Count one (``kind``: "reset", "stalled body", ...); print a summary when one is due."""
        with self._lock:
            self._pending[kind] += 1
            now = time.monotonic()
            if self._last is not None and now - self._last < self.interval_s:
                return
            line = self._summary(now)
        self._report(line)

    def flush(self) -> None:
        """Report what was counted since the last summary (at shutdown)."""
        with self._lock:
            line = self._summary(time.monotonic()) if self._pending else None
        if line:
            self._report(line)

    def _summary(self, now: float) -> str:
        since = "" if self._last is None else f" in the last {now - self._last:.0f} s"
        kinds = ", ".join(f"{kind}: {n}" for kind, n in sorted(self._pending.items()))
        total = sum(self._pending.values())
        self._pending.clear()
        self._last = now
        later = f"; further ones are summed up here at most every {self.interval_s:.0f} s" if not since else ""
        return f"otel-rl bridge: {total} sender(s) left or stalled mid-request{since} ({kinds}){later} (client_disconnects in /stats)"
