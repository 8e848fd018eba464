"""A small progress bar on stderr (no dependency): shown only on a terminal and when not quiet."""

from __future__ import annotations

import sys
import time
from typing import IO, Any


class Progress:
    """``[label] 42% |████      | 4,200/10,000 records  81,000 points/s  0:03<0:04``.

    Redraws at most every ``interval_s`` seconds; ``enabled=None`` means "when ``stream`` is a
    TTY". Nothing is written when disabled, so piping the command's output stays clean.
    """

    def __init__(
        self,
        total: int | None,
        label: str,
        *,
        unit: str = "records",
        enabled: bool | None = None,
        stream: IO[str] | None = None,
        interval_s: float = 0.1,
        width: int = 24,
    ) -> None:
        self.stream: Any = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.total = total
        self.label = label
        self.unit = unit
        self.count = 0
        self.points = 0
        self._interval = interval_s
        self._width = width
        self._t0 = time.perf_counter()
        self._last = 0.0
        self._drawn = False

    def update(self, count: int = 1, points: int = 0) -> None:
        self.count += count
        self.points += points
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last >= self._interval:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._t0, 1e-9)
        parts = [f"{self.label}"]
        if self.total:
            frac = min(1.0, self.count / self.total)
            filled = int(frac * self._width)
            parts.append(f"{frac * 100:3.0f}% |{'█' * filled}{' ' * (self._width - filled)}| {self.count:,}/{self.total:,} {self.unit}")
            remaining = elapsed / frac - elapsed if frac > 0 else 0.0
            eta = f"  {_clock(elapsed)}<{_clock(remaining)}"
        else:
            parts.append(f"{self.count:,} {self.unit}")
            eta = f"  {_clock(elapsed)}"
        if self.points:
            parts.append(f"{self.points / elapsed:,.0f} points/s")
        self.stream.write("\r" + "  ".join(parts) + eta + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
