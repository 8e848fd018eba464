"""What the bridge's HTTP threads share with its worker: the counters, the bounded queue of decoded
requests, the request slots, the decode lock and the bearer token.

The queue is bounded in bytes (``max_queue_mb``): each request's estimated decoded size is
reserved before it is decoded and freed once the worker delivered it, so a slow tracker slows the
senders down (503 with Retry-After) instead of growing memory.
"""

from __future__ import annotations

import hmac
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from otel_rl.bridge.admission import ClientSlots
from otel_rl.bridge.config import BridgeConfig
from otel_rl.bridge.connections import ConnectionTable
from otel_rl.bridge.disconnects import DisconnectLog
from otel_rl.bridge.limits import Counts, RequestLimits

__all__ = ["STAT_NAMES", "Intake"]

STAT_NAMES = (
    "requests",
    "bad_requests",
    "busy_responses",
    "client_share_refusals",
    "stalled_bodies",
    "bodies_cut_off",
    "connections_refused",
    "client_disconnects",
    "unauthorized",
    "records_bad",
    "log_records",
    "events_delivered",
    "hparams_delivered",
    "samples_delivered",
    "records_ignored",
    "records_other_ranks",
    "records_over_max_runs",
    "requests_over_max_runs",
    "records_over_run_budget",
    "runs_given_back",
    "metric_exports",
    "metric_steps_written",
    "metric_exports_ignored",
    "runs",
    "runs_failed",
    "runs_closed_for_room",
    "worker_errors",
)


class Intake:
    """The receiving side's shared state (thread-safe). ``report(line)`` prints a line for the operator."""

    def __init__(self, config: BridgeConfig, token: bytes | None, report: Callable[[str], None]) -> None:
        self.limits = RequestLimits()
        per_client = min(config.max_requests_per_client, config.max_requests_in_flight)
        self.slots = ClientSlots(config.max_requests_in_flight, per_client)
        self.connections = ConnectionTable(config.max_connections, min(config.max_connections_per_client, config.max_connections))
        self.decoding = threading.Lock()  # one inflate + decode at a time: it holds the GIL anyway, and it bounds the peak
        self.body_timeout_s = config.body_timeout_s
        self.disconnects = DisconnectLog(report)
        self.cond = threading.Condition()  # guards queue, queued_bytes, stopping, busy
        self.queue: deque[tuple[str, Any, int, Counts]] = deque()
        self.queued_bytes = 0
        self.max_bytes = int(config.max_queue_mb * (1 << 20))
        self.stopping = False
        self.busy = False  # the worker is delivering a request taken off the queue
        self._token = token
        self._stats_lock = threading.Lock()
        self._stats: dict[str, int] = dict.fromkeys(STAT_NAMES, 0)
        # Why a decoded request would be dropped, to answer it so (the runs' max_runs); None: taken.
        self.refusal: Callable[[str, Any, Counts], str | None] = lambda kind, message, counts: None

    # -- counters ---------------------------------------------------------------------------------

    def count(self, name: str, amount: int = 1) -> None:
        with self._stats_lock:
            self._stats[name] += amount

    def counters(self) -> dict[str, int]:
        with self._stats_lock:
            return dict(self._stats)

    def note_disconnect(self, kind: str) -> None:
        """A sender left mid-request (or stalled): counted, summed up in the log now and then."""
        self.count("client_disconnects")
        self.disconnects.note(kind)

    def authorized(self, header: str | None) -> bool:
        if self._token is None:
            return True
        scheme, _, given = (header or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    # -- the queue --------------------------------------------------------------------------------

    def reserve(self, size: int) -> bool:
        """Reserve queue space for a request about to be decoded; False when full (or closing)."""
        with self.cond:
            # (like a request the worker is delivering, one reserved while the queue is empty always fits)
            if self.stopping or (self.queue and self.queued_bytes + size > self.max_bytes):
                return False
            self.queued_bytes += size
            return True

    def release(self, size: int) -> None:
        with self.cond:
            self.queued_bytes -= size
            self.cond.notify_all()

    def submit(self, kind: str, message: Any, size: int, counts: Counts) -> bool:
        """Queue a decoded request whose ``size`` was reserved; False when closing (the reservation is freed)."""
        with self.cond:
            if self.stopping:
                self.queued_bytes -= size
                return False
            self.queue.append((kind, message, size, counts))
            self.cond.notify_all()
            return True
