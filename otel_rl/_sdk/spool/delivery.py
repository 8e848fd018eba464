"""The disk spool's delivery side: one sender thread per signal that sends the stored records in
order through its transport, backs off while the collector is unreachable, and acknowledges what
was delivered (or refused); and the waits for that delivery (flush, drain).

:class:`SpoolDelivery` is the half of :class:`otel_rl._sdk.spool.store.Spool` that runs on the sender
threads; it shares the spool's lock and bookkeeping (declared below) with the writing half.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.environment_variables import OTEL_BLRP_SCHEDULE_DELAY, OTEL_BSP_SCHEDULE_DELAY

from otel_rl._sdk.spool.files import CURSOR_FILE, LOGS, TRACES, Record, Segment, format_bytes, read_payload, write_cursor
from otel_rl._sdk.spool.transports import GrpcTransport, HttpTransport, Outcome, _short, ca_setting, redact_endpoint
from otel_rl.semconv import attributes as A

logger = logging.getLogger("otel_rl")

SPOOL_FULL = A.RlTelemetryDropReasonValues.SPOOL_FULL.value
BACKEND_REJECTED = A.RlTelemetryDropReasonValues.BACKEND_REJECTED.value

_MIN_BACKOFF_S = 0.25
_MAX_BACKOFF_S = 5.0
_IDLE_WAIT_S = 60.0  # an idle sender's wait when nothing wakes it
# At most one request per signal this often: what arrives meanwhile (a step's spans, a step's
# events) waits on disk and goes in the next request, so a job at a step a second pays for one
# request every few seconds, not one per step. The first records after a quiet spell, a flush and
# a shutdown go at once. The SDK's span processor's delay (its log processor's is 1 s, a request
# a second at one step a second), and set by the SDK processors' variables.
SEND_EVERY_S = 5.0
SEND_EVERY_VARIABLES = {TRACES: OTEL_BSP_SCHEDULE_DELAY, LOGS: OTEL_BLRP_SCHEDULE_DELAY}
# Metric exports do not wait: each is already one request per metric interval (10 s by default),
# and a held export would reach the store a scrape or two late, so a short run's counters and
# histograms could first appear complete, with no increase for rate() to see.
LINGERING = (TRACES, LOGS)
# One request's stored payloads, together: well under the 4 MiB a collector's gRPC receiver takes.
BATCH_BYTES = 2 << 20


@dataclass
class SignalStats:
    """What became of one signal's items since the spool was opened."""

    appended: int = 0  # items accepted from the SDK
    delivered: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # by drop reason
    recovered: int = 0  # items found on disk at open (left by an earlier process)
    damaged: int = 0  # records found torn at open (a crash mid-write), discarded
    damaged_bytes: int = 0

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


def damage_note(directory: Path, stats: dict[str, SignalStats]) -> str:
    """What recovery discarded as torn, for the start-up warning and ``otel-rl push``."""
    torn = {s: st for s, st in stats.items() if st.damaged}
    parts = ", ".join(f"{st.damaged} {s} record{'s' if st.damaged != 1 else ''}" for s, st in torn.items())
    size = format_bytes(sum(st.damaged_bytes for st in torn.values()))
    return (
        f"discarded {sum(st.damaged for st in torn.values())} torn record(s) ({parts}; {size}) in {directory}, "
        "cut short by a crash or a disk error; every whole record around them was kept"
    )


def send_every_s(signal: str) -> float:
    """Seconds between two requests of ``signal``: ``OTEL_BSP_SCHEDULE_DELAY`` (spans) or
    ``OTEL_BLRP_SCHEDULE_DELAY`` (events) in milliseconds, as for the SDK's batch processors, else
    SEND_EVERY_S. A value that is not a number of milliseconds >= 0 is said once, by name."""
    variable = SEND_EVERY_VARIABLES.get(signal)
    raw = os.environ.get(variable, "").strip() if variable else ""
    if not raw:
        return SEND_EVERY_S
    try:
        delay_ms = float(raw)
        if not delay_ms >= 0 or delay_ms == float("inf"):
            raise ValueError(raw)
    except ValueError:
        logger.warning("otel-rl: %s=%r is not a delay in milliseconds (>= 0); the spool sends every %g s", variable, raw, SEND_EVERY_S)
        return SEND_EVERY_S
    return delay_ms / 1000.0


class SignalState:
    """One signal's part of the spool: its records and segments, its sender thread and that thread's signals."""

    def __init__(self, signal: str, folder: Path) -> None:
        self.signal = signal
        self.send_every_s = send_every_s(signal) if signal in LINGERING else 0.0
        self.folder = folder
        self.records: deque[Record] = deque()
        self.segments: dict[int, Segment] = {}
        self.active: Segment | None = None
        self.active_file: Any = None
        self.stats = SignalStats()
        self.wake = threading.Event()  # new records (or shutdown) for an idle sender
        self.kick = threading.Event()  # cut a backoff short (shutdown)
        self.idle = threading.Event()  # set while nothing is pending or in flight
        self.idle.set()
        self.inflight: list[Record] = []  # the records of the request being sent
        self.hurry = threading.Event()  # a flush or a shutdown waits: send what is pending now
        self.last_send = float("-inf")  # monotonic time of the last request
        self.failing_since: float | None = None  # monotonic time of the first failure of an outage
        self.last_error = ""
        self.transport: HttpTransport | GrpcTransport | None = None
        self.thread: threading.Thread | None = None
        self.closed = False  # no more appends (the exporter was shut down)
        self.gave_up = False  # shutdown: the collector is unreachable, leave the rest on disk


class SpoolDelivery:
    """Sending, acknowledging and waiting for delivery; mixed into :class:`otel_rl._sdk.spool.store.Spool`."""

    # The spool's state this half reads and updates (set by Spool.__init__), under _lock.
    directory: Path
    max_bytes: int
    shutdown_timeout_s: float
    _lock: threading.Lock
    _signals: dict[str, SignalState]
    _total: int
    _deadline: float | None
    _stopping: bool
    _outage_reported: int
    _tls_reported: set[str]
    _rejected_reported: set[str]
    _count_drop: Callable[[SignalState, str, int], None]
    _remove_segment_locked: Callable[[SignalState, Segment], None]
    _usage: Callable[[], None]

    def attach(self, signal: str, transport: HttpTransport | GrpcTransport) -> None:
        """Deliver ``signal``'s records through ``transport`` from a thread of its own."""
        state = self._signals[signal]
        state.transport = transport
        state.thread = threading.Thread(target=self._deliver_loop, args=(state,), name=f"otel-rl-spool-{signal}", daemon=True)
        state.thread.start()

    def _deliver_loop(self, state: SignalState) -> None:
        transport = state.transport
        if transport is None:  # attach() sets it before it starts this thread
            return
        backoff = 0.0
        while True:
            if backoff:  # new records do not cut this short: a dead collector is not hammered
                state.kick.wait(backoff)
                state.kick.clear()
            elif self._linger(state):
                continue
            with self._lock:
                if self._stopping or state.gave_up:
                    return
                batch = self._take_batch_locked(state)
                if not batch:
                    state.idle.set()
                    state.hurry.clear()
                    # Under the lock: append() refuses once closed, so nothing can come after this
                    # check. Read outside it, a last batch appended just before the close was left.
                    if state.closed:
                        return
                paths = [state.segments[r.seq].path if r.seq in state.segments else None for r in batch]
            if not batch:
                # Whatever gives this thread work sets ``wake`` (an append, a shutdown, a close): the
                # timeout is only a safety net, long because each timed wake-up costs the process CPU.
                state.wake.wait(_IDLE_WAIT_S)
                state.wake.clear()
                continue
            payloads = self._read_batch(state, batch, paths)
            if not payloads:
                continue
            timeout = transport.timeout_s
            if self._deadline is not None:
                timeout = min(timeout, self._deadline - time.monotonic())
                if timeout <= 0:
                    with self._lock:
                        state.inflight = []
                        self._count_orphans_locked(state, [record for record, _ in payloads])
                        state.gave_up = True
                        state.idle.set()
                    return
            state.last_send = time.monotonic()
            # Serialized OTLP requests hold one repeated field each: their bytes put end to end
            # are one request holding all their resources (protobuf's rule for repeated fields).
            outcome = self._send(transport, b"".join(payload for _, payload in payloads), timeout)
            outcomes = [(record, outcome) for record, _ in payloads]
            if outcome.permanent and len(payloads) > 1:  # one bad record must not take the others with it
                outcomes = []
                for record, payload in payloads:
                    outcomes.append((record, self._send(transport, payload, timeout)))
                    if not outcomes[-1][1].ok and not outcomes[-1][1].permanent:
                        break  # the rest stay pending, in order
            backoff = self._settle(state, [record for record, _ in payloads], outcomes, backoff)
            if backoff < 0:
                return

    def _linger(self, state: SignalState) -> bool:
        """Wait out the rest of the signal's send interval since the last request; True if it waited."""
        wait = state.last_send + state.send_every_s - time.monotonic()
        if state.signal not in LINGERING or wait <= 0 or state.hurry.is_set() or self._deadline is not None or self._stopping:
            return False
        with self._lock:
            pending = 0
            for record in state.records:  # (stops at a request's worth: a backlog can be long)
                pending += record.length
                if pending >= BATCH_BYTES:
                    return False
            if not pending:
                return False
        state.hurry.wait(wait)
        return True

    def _take_batch_locked(self, state: SignalState) -> list[Record]:
        """The oldest pending records, up to BATCH_BYTES together (one at least), now in flight."""
        batch: list[Record] = []
        size = 0
        for record in state.records:
            if batch and size + record.length > BATCH_BYTES:
                break
            batch.append(record)
            size += record.length
        state.inflight = batch
        return batch

    def _read_batch(self, state: SignalState, batch: list[Record], paths: list[Any]) -> list[tuple[Record, bytes]]:
        """The batch's records with their payloads. A first record whose file vanished (dropped
        meanwhile) or is damaged is acknowledged as lost; past the first, such a record and those
        after it wait for the next request."""
        payloads: list[tuple[Record, bytes]] = []
        left: list[Record] = []
        for at, (record, path) in enumerate(zip(batch, paths, strict=True)):
            try:
                payload = read_payload(path, record)
            except (OSError, ValueError):
                payload = None
            if payload is None:
                if not payloads:
                    self._ack(state, record, delivered=False, reason=SPOOL_FULL)
                    continue
                left = batch[at:]
                break
            payloads.append((record, payload))
        with self._lock:
            state.inflight = [record for record, _ in payloads]
            self._count_orphans_locked(state, left)
        return payloads

    def _count_orphans_locked(self, state: SignalState, records: list[Record]) -> None:
        """Records taken off the request whose segment was dropped meanwhile (the drop left their
        count to whoever sent them): lost now, counted."""
        for record in records:
            if record.orphaned:
                self._count_drop(state, SPOOL_FULL, record.items)

    @staticmethod
    def _send(transport: HttpTransport | GrpcTransport, payload: bytes, timeout: float) -> Outcome:
        try:
            return transport.send(payload, timeout)
        except Exception as exc:  # noqa: BLE001 - a transport bug must not kill delivery
            return Outcome(False, detail=_short(f"{type(exc).__name__}: {exc}"))

    def _settle(self, state: SignalState, sent: list[Record], outcomes: list[tuple[Record, Outcome]], backoff: float) -> float:
        """Acknowledge what was delivered or refused of the ``sent`` records; the next backoff
        (0 after a success, -1: stop, shutting down)."""
        failure = next((o for _, o in outcomes if not o.ok and not o.permanent), None)
        settled = 0
        cursor: tuple[int, int] | None = None
        for record, outcome in outcomes:
            if outcome.ok:
                cursor = self._ack(state, record, delivered=True, persist=False) or cursor
            elif outcome.permanent:
                self._report_rejected(state, outcome)
                cursor = self._ack(state, record, delivered=False, reason=BACKEND_REJECTED, persist=False) or cursor
            else:
                break
            settled += 1
        if settled:  # the cursor once per request, not per record: each write is a file replaced
            self._persist(state, cursor)
        if failure is None:
            self._recovered(state)
            return 0.0
        self._failed(state, failure)
        with self._lock:
            state.inflight = []
            self._count_orphans_locked(state, sent[settled:])  # dropped from disk while we tried
            if self._deadline is not None:  # shutting down: keep the rest for the next start
                state.gave_up = True
                state.idle.set()
                return -1.0
            if not state.records:
                state.idle.set()
        return min(max(backoff * 2, _MIN_BACKOFF_S), _MAX_BACKOFF_S)

    def _ack(
        self, state: SignalState, record: Record, *, delivered: bool, reason: str = "", persist: bool = True
    ) -> tuple[int, int] | None:
        """Settle one record; its end as the new cursor, written now unless ``persist`` is False
        (the caller writes the last of a request's records)."""
        cursor: tuple[int, int] | None = None
        with self._lock:
            state.inflight = [r for r in state.inflight if r is not record]
            if record.orphaned:
                if not delivered:
                    self._count_drop(state, reason or SPOOL_FULL, record.items)
                else:
                    state.stats.delivered += record.items
            else:
                if state.records and state.records[0] is record:
                    state.records.popleft()
                if delivered:
                    state.stats.delivered += record.items
                else:
                    self._count_drop(state, reason, record.items)
                segment = state.segments.get(record.seq)
                if segment is not None:
                    segment.pending -= 1
                    if segment.pending <= 0 and segment is not state.active:
                        self._remove_segment_locked(state, segment)
                cursor = (record.seq, record.end)
        if persist:
            self._persist(state, cursor)
        return cursor

    def _persist(self, state: SignalState, cursor: tuple[int, int] | None) -> None:
        """Write the cursor, then say the signal is idle if nothing is left: a flush that finds it
        delivered finds the cursor written too."""
        if cursor is not None:
            write_cursor(state.folder / CURSOR_FILE, *cursor)
        self._usage()
        with self._lock:
            if not state.records:
                state.idle.set()

    def _failed(self, state: SignalState, outcome: Outcome) -> None:
        state.last_error = outcome.detail
        endpoint = redact_endpoint(state.transport.endpoint if state.transport else "")
        if outcome.tls and endpoint not in self._tls_reported:
            self._tls_reported.add(endpoint)
            logger.error(
                "otel-rl: TLS certificate verification failed for the collector at %s (%s). The CA file used is %s: "
                "set OTEL_EXPORTER_OTLP_CERTIFICATE (or OTEL_EXPORTER_OTLP_%s_CERTIFICATE) to the PEM file of the CA "
                "that signed the collector's certificate. Telemetry waits in the spool %s meanwhile.",
                endpoint,
                outcome.detail,
                ca_setting(state.signal, state.transport.protocol if state.transport else ""),
                state.signal.upper(),
                self.directory,
            )
        if state.failing_since is None:
            state.failing_since = time.monotonic()
            others_failing = any(s.failing_since is not None for s in self._signals.values() if s is not state)
            if others_failing:  # the same outage, seen by another signal
                logger.debug("otel-rl: cannot deliver %s to %s (%s) either", state.signal, endpoint, outcome.detail)
                return
            self._outage_reported += 1
            # The first outage is a warning; later ones (a flapping collector) are info.
            level = logging.WARNING if self._outage_reported == 1 else logging.INFO
            logger.log(
                level,
                "otel-rl: cannot deliver %s to the collector at %s (%s); telemetry waits in the spool %s "
                "(up to %s, OTEL_RL_SPOOL_MAX_BYTES) and is retried; the training run is not affected",
                state.signal,
                endpoint,
                outcome.detail,
                self.directory,
                format_bytes(self.max_bytes),
            )

    def _recovered(self, state: SignalState) -> None:
        if state.failing_since is not None:
            seconds = time.monotonic() - state.failing_since
            state.failing_since = None
            if not any(s.failing_since is not None for s in self._signals.values()):
                logger.info(
                    "otel-rl: the collector takes telemetry again (%s after %.1f s); delivering the spooled backlog (%s)",
                    state.signal,
                    seconds,
                    format_bytes(self._total),
                )

    def _report_rejected(self, state: SignalState, outcome: Outcome) -> None:
        if state.signal not in self._rejected_reported:
            self._rejected_reported.add(state.signal)
            endpoint = redact_endpoint(state.transport.endpoint if state.transport else "")
            logger.warning(
                "otel-rl: the collector at %s refused a batch of %s (%s); it is dropped and counted in "
                "rl.telemetry.dropped (reported once per signal)",
                endpoint,
                state.signal,
                outcome.detail,
            )

    # -- waiting for delivery (flush, push) ---------------------------------------------------
    def failing(self, signal: str) -> bool:
        return self._signals[signal].failing_since is not None

    def wait_delivered(self, signal: str, timeout_s: float) -> bool:
        """Wait until ``signal`` has nothing pending. Returns at once (False) while the collector
        is unreachable: a flush must not hold the training loop for the length of an outage."""
        state = self._signals[signal]
        end = time.monotonic() + max(timeout_s, 0.0)
        state.hurry.set()
        while not state.idle.is_set():
            if state.failing_since is not None or state.thread is None or not state.thread.is_alive():
                return False
            remaining = end - time.monotonic()
            if remaining <= 0:
                return False
            state.idle.wait(min(remaining, 0.05))
        return True

    def drain(self, timeout_s: float, *, give_up_after_s: float | None = None) -> bool:
        """Wait until every attached signal has delivered everything, for at most ``timeout_s``;
        with ``give_up_after_s``, stop early once every pending signal has failed that long."""
        end = time.monotonic() + timeout_s
        for state in self._signals.values():
            state.hurry.set()
        while True:
            busy = [st for st in self._signals.values() if st.transport is not None and not st.idle.is_set()]
            if not busy:
                return not any(st.records for st in self._signals.values())
            now = time.monotonic()
            if now >= end:
                return False
            if give_up_after_s is not None and all(
                st.failing_since is not None and now - st.failing_since >= give_up_after_s for st in busy
            ):
                return False
            busy[0].idle.wait(min(end - now, 0.05))
