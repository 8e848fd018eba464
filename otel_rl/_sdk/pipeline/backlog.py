"""The telemetry worker's queue: the kinds of items on it, the calls dropped with it full, and what
``shutdown()`` could not write of it.

``shutdown(timeout_s)`` gives the worker a deadline. Past it the worker stops in the middle of an
item (a ``log()`` of 100,000 keys is checked every few hundred keys) and drops what is still
queued; :class:`Unwritten` counts those calls in ``rl.telemetry.dropped{drop_reason=
shutdown_timeout}`` and says in one line what was not written, so a large backlog can no longer
hold a process's exit far past its timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

logger = logging.getLogger("otel_rl")

# The kinds of queued items: (kind, ...) tuples that Telemetry and its scopes append.
LOG, RECORD, STAGE, STEP_END, ADD, CALL, LOG_PACKED = range(7)

_SIGNALS = A.RlTelemetrySignalValues
_SHUTDOWN_TIMEOUT = (A.RL_TELEMETRY_DROP_REASON, A.RlTelemetryDropReasonValues.SHUTDOWN_TIMEOUT.value)
_QUEUE_FULL = (A.RL_TELEMETRY_DROP_REASON, A.RlTelemetryDropReasonValues.QUEUE_FULL.value)
# log() calls (their step event) and calls that become events or spans count as logs; the rest are metric points.
_SIGNAL_OF = {
    LOG: _SIGNALS.LOGS.value,
    LOG_PACKED: _SIGNALS.LOGS.value,
    CALL: _SIGNALS.LOGS.value,
    RECORD: _SIGNALS.METRICS.value,
    ADD: _SIGNALS.METRICS.value,
    STAGE: _SIGNALS.METRICS.value,
    STEP_END: _SIGNALS.METRICS.value,
}


class QueueDrops:
    """``log()`` (signal "logs") and ``record()`` ("metrics") calls the caller dropped with the queue
    ``max_queue`` items long, counted on the caller's thread; the worker publishes the counts."""

    def __init__(self) -> None:
        self.counts = {_SIGNALS.LOGS.value: 0, _SIGNALS.METRICS.value: 0}
        self._published = dict(self.counts)

    @property
    def pending(self) -> bool:
        return self.counts != self._published

    def publish(self, latest: Any, report_once: Callable[[str, str, str], None]) -> None:
        for signal, dropped in self.counts.items():
            published = self._published[signal]
            if dropped == published:
                continue
            # attribute pairs in key order, as every other series of the metric
            latest.add(M.RL_TELEMETRY_DROPPED, (_QUEUE_FULL, (A.RL_TELEMETRY_SIGNAL, signal)), dropped - published)
            self._published[signal] = dropped
            report_once(
                "<queue>",
                "queue_full",
                "otel-rl: the telemetry worker fell max_queue items behind the training "
                "loop; log() / record() calls past that are dropped (never blocking training) and counted in "
                f"{M.RL_TELEMETRY_DROPPED}{{{A.RL_TELEMETRY_DROP_REASON}={A.RlTelemetryDropReasonValues.QUEUE_FULL.value}}}. "
                "Log less often, or raise "
                "max_queue / OTEL_RL_MAX_QUEUE (reported once)",
            )


class OutOfTime(Exception):
    """Raised inside a long item when the shutdown deadline has passed: the item is dropped."""


class Unwritten:
    """What shutdown's deadline left unwritten: ``log()`` calls (their values and steps) and other calls."""

    def __init__(self) -> None:
        self.log_calls = 0
        self.values = 0
        self.other_calls = 0
        self.steps: list[int] = []  # the lowest and the highest int step among the log() calls
        self.by_signal: dict[str, int] = {}
        self._published: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.log_calls or self.other_calls)

    def count(self, item: tuple) -> None:
        """One queued item not (or not wholly) processed."""
        kind = item[0]
        signal = _SIGNAL_OF.get(kind, _SIGNALS.LOGS.value)
        self.by_signal[signal] = self.by_signal.get(signal, 0) + 1
        if kind not in (LOG, LOG_PACKED):
            self.other_calls += 1
            return
        self.log_calls += 1
        values = item[4]
        try:
            self.values += len(values if kind == LOG else values.keys)
        except Exception:  # noqa: BLE001 - a mapping without a length: counted as a call only
            pass
        step = item[1]
        if type(step) is int:
            self.steps = [min(self.steps[0], step), max(self.steps[1], step)] if self.steps else [step, step]

    def publish(self, latest: Any) -> None:
        """Add what was counted since the last call to ``rl.telemetry.dropped`` (``latest``: LatestValues)."""
        for signal, total in self.by_signal.items():
            new = total - self._published.get(signal, 0)
            if new:
                latest.add(M.RL_TELEMETRY_DROPPED, (_SHUTDOWN_TIMEOUT, (A.RL_TELEMETRY_SIGNAL, signal)), new)
                self._published[signal] = total

    def describe(self) -> str:
        parts = []
        if self.log_calls:
            steps = ""
            if self.steps:
                low, high = self.steps
                steps = f", step {low:,}" if low == high else f", steps {low:,} to {high:,}"
            parts.append(f"{self.log_calls:,} log() call{'s' if self.log_calls != 1 else ''} ({self.values:,} values{steps})")
        if self.other_calls:
            parts.append(
                f"{self.other_calls:,} other queued item{'s' if self.other_calls != 1 else ''} (spans' timings, record() / event() calls)"
            )
        return " and ".join(parts)

    def report(self, timeout_s: float) -> None:
        """Say once what was not written (nothing when everything was)."""
        if not self:
            return
        logger.warning(
            "otel-rl: shutdown(timeout_s=%g) ran out of time before the telemetry worker had processed "
            "everything queued: %s were not written (counted in rl.telemetry.dropped{rl.telemetry.drop_reason="
            "shutdown_timeout}). Give shutdown() a longer timeout_s, or log fewer distinct keys per step.",
            timeout_s,
            self.describe(),
        )
