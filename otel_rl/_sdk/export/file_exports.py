"""The run folder's spans and events, written by the telemetry worker instead of two SDK threads.

The SDK's batch processors each keep a thread that wakes every ``schedule_delay`` whether or not
there is anything to export. With the run folder's 20 ms bound that is 100 timed wake-ups a
second, and a timed wait costs tens of microseconds of CPU on a virtual machine: ~12 ms of CPU a
second for a process that logs nothing (measured per thread on a 2-core VM; ``bench_total.py``
counts each way's idle threads). Here the SDK's simple processors hand each span or record to a ``QueuedExport``, which
only queues it and wakes the telemetry worker; the worker writes what is queued after each drain
of its own queue, so the files get their lines within the same bound, with no thread of their own.
``force_flush`` and ``shutdown`` write what is left on the caller's thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_rl._sdk.otlp.sdk_compat import LogRecordExporter, LogRecordExportResult


class QueuedExport:
    """Queues what the SDK exports; :meth:`write` hands it to ``inner`` in one batch."""

    _success: Any = None

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._items: deque[Any] = deque()
        self._lock = threading.Lock()  # the worker and a flush may write at once
        self._exporting = 0  # items of the batch being handed to ``inner`` now
        # Wakes the worker that calls write(): Telemetry binds it once its pipeline runs.
        self.wake: Callable[[], None] | None = None

    def export(self, batch: Sequence[Any]) -> Any:
        self._items.extend(batch)
        wake = self.wake
        if wake is not None:
            wake()
        return self._success

    @property
    def pending(self) -> bool:
        """Whether something is queued."""
        return bool(self._items)

    @property
    def held(self) -> int:
        """Items queued or being exported now: what a shutdown that stops waiting leaves undelivered."""
        return len(self._items) + self._exporting

    def write(self) -> bool:
        """Export what is queued (on the worker after each drain, or on flush and shutdown);
        whether there was anything."""
        items = self._items
        if not items:
            return False
        with self._lock:
            batch = [items.popleft() for _ in range(len(items))]
            if batch:
                self._exporting = len(batch)
                try:
                    self.inner.export(batch)
                finally:
                    self._exporting = 0
        return True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.write()
        return bool(self.inner.force_flush(timeout_millis))

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self.write()
        self.inner.shutdown(*args, **kwargs)


class QueuedSpanExport(QueuedExport, SpanExporter):
    _success = SpanExportResult.SUCCESS


class QueuedLogExport(QueuedExport, LogRecordExporter):
    _success = LogRecordExportResult.SUCCESS
