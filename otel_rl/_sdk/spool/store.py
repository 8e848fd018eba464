"""A bounded disk spool between otel-rl's exporters and the OTLP collector.

The SDK's OTLP exporters send each batch once and give up after their timeout: a collector that
restarts, or a network that drops for a minute, loses what was exported meanwhile, and a batch
processor whose exporter blocks for 10 s fills its queue and drops spans. Here the exporters only
encode a batch into the OTLP protobuf request the SDK would send and append it to a file; one
sender thread per signal delivers the files' records in order with the settings of the SDK
exporter it stands in for (same endpoint, headers, TLS and compression settings), backs off while
the collector is unreachable, and deletes what the collector acknowledged. So:

* the batch processors never wait for the network: their queues never overflow during an outage;
* what could not be delivered waits on disk, up to ``max_bytes``; past it the oldest segment is
  dropped, its items are counted (``rl.telemetry.dropped{signal, drop_reason="spool_full"}``) and
  the first drop is reported;
* a crash (SIGKILL, ``os._exit``) leaves the spool behind: the next start with the same spool
  folder, or ``otel-rl push RUN_DIR``, delivers it. Delivery is at least once: a crash between the
  collector's acknowledgement and the cursor update resends one batch.

This module holds :class:`Spool` (opening a folder, storing records within the bound, shutting
down); beside it: ``spool_files`` (the on-disk format), ``spool_delivery`` (the sender threads),
``spool_transports`` (one request over HTTP or gRPC) and ``spool_exporters`` (what the SDK calls).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from otel_rl._sdk.spool.delivery import BACKEND_REJECTED, SPOOL_FULL, SignalState, SignalStats, SpoolDelivery, damage_note
from otel_rl._sdk.spool.files import (
    CURSOR_FILE,
    FORMAT_VERSION,
    HEADER_SIZE,
    LOCK_FILE,
    LOGS,
    MARKER_FILE,
    METRICS,
    SEGMENT_SUFFIX,
    SIGNALS,
    TRACES,
    Record,
    Segment,
    SpoolBusy,
    format_bytes,
    frame,
    item_word,
    lock_folder,
    read_cursor,
    salvage_segment,
    segment_path,
    unlink_quietly,
    write_marker,
)
from otel_rl._sdk.spool.transports import GrpcTransport, HttpTransport, Outcome, ca_setting, describe_error, redact_endpoint, transport_for

__all__ = [  # what other modules import from here (some defined beside it)
    "BACKEND_REJECTED",
    "CURSOR_FILE",
    "DEFAULT_MAX_BYTES",
    "FORMAT_VERSION",
    "GrpcTransport",
    "HttpTransport",
    "LOCK_FILE",
    "LOGS",
    "MARKER_FILE",
    "METRICS",
    "Outcome",
    "SEGMENT_SUFFIX",
    "SIGNALS",
    "SPOOL_FULL",
    "SignalStats",
    "Spool",
    "SpoolBusy",
    "TRACES",
    "ca_setting",
    "describe_error",
    "damage_note",
    "format_bytes",
    "item_word",
    "redact_endpoint",
    "transport_for",
]

logger = logging.getLogger("otel_rl")

DEFAULT_MAX_BYTES = 256 * 2**20


class Spool(SpoolDelivery):
    """A per-process disk spool for the three OTLP signals; see the module docstring.

    ``on_drop(signal, reason, items)`` and ``on_usage(bytes)`` feed otel-rl's own metrics; they run
    on the spool's threads and must not block.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        on_drop: Callable[[str, str, int], None] | None = None,
        on_usage: Callable[[int], None] | None = None,
        segment_bytes: int | None = None,
        shutdown_timeout_s: float = 5.0,
        announce: bool = True,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("a spool needs max_bytes > 0")
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.segment_bytes = int(segment_bytes or max(4096, min(4 * 2**20, self.max_bytes // 8)))
        self.shutdown_timeout_s = shutdown_timeout_s
        self._on_drop = on_drop
        self._on_usage = on_usage
        self._announce = announce  # log what an earlier run left and what this one leaves (not for push)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._total = 0
        self._next_seq = 1
        self._deadline: float | None = None
        self._stopping = False
        self._outage_reported = 0
        self._drop_reported = False
        self._tls_reported: set[str] = set()
        self._rejected_reported: set[str] = set()
        self._lock_fd = lock_folder(self.directory)
        try:
            self._signals = {s: SignalState(s, self.directory / s) for s in SIGNALS}
            self._recover()
            write_marker(self.directory, self.max_bytes)
        except BaseException:
            os.close(self._lock_fd)
            raise

    # -- opening ----------------------------------------------------------------------------
    def _recover(self) -> None:
        """Index what an earlier process left: records after each signal's cursor."""
        highest = 0
        for state in self._signals.values():
            state.folder.mkdir(parents=True, exist_ok=True)
            cursor_seq, cursor_offset = read_cursor(state.folder / CURSOR_FILE)
            for path in sorted(state.folder.glob("*" + SEGMENT_SUFFIX)):
                try:
                    seq = int(path.stem)
                except ValueError:
                    continue
                highest = max(highest, seq)
                if seq < cursor_seq:
                    unlink_quietly(path)
                    continue
                start = cursor_offset if seq == cursor_seq else 0
                # a record cut short by a crash: cut out, counted; the whole records around it stay
                records, damaged, damaged_bytes = salvage_segment(path, seq, start)
                state.stats.damaged += damaged
                state.stats.damaged_bytes += damaged_bytes
                if not records:
                    unlink_quietly(path)
                    continue
                size = path.stat().st_size
                state.segments[seq] = Segment(seq, path, size, pending=len(records))
                state.records.extend(records)
                self._total += size
                items = sum(r.items for r in records)
                state.stats.recovered += items
            if state.records:
                state.idle.clear()
        self._next_seq = highest + 1
        damaged = {s: st.stats for s, st in self._signals.items() if st.stats.damaged}
        if damaged and self._announce:  # push says it itself (damage_note)
            logger.warning("otel-rl: %s", damage_note(self.directory, self.stats()))
        recovered = {s: st.stats.recovered for s, st in self._signals.items() if st.stats.recovered}
        if recovered and self._announce:
            logger.warning(
                "otel-rl: found %s left undelivered in %s by an earlier run (%s); delivering it first",
                format_bytes(self._total),
                self.directory,
                ", ".join(f"{n} {item_word(s)}" for s, n in recovered.items()),
            )
        self._usage()

    # -- writing (SDK worker threads) --------------------------------------------------------
    def append(self, signal: str, payload: bytes, items: int) -> bool:
        """Store one serialized request; False when it could not be stored (counted as dropped)."""
        if os.getpid() != self._pid:
            return False
        frame_len = HEADER_SIZE + len(payload)
        state = self._signals[signal]
        with self._lock:
            if state.closed or self._stopping:
                return False
            state.stats.appended += items
            if frame_len > self.max_bytes:
                self._count_drop(state, SPOOL_FULL, items)
                return False
            try:
                self._write_locked(state, payload, items)
            except OSError as exc:  # a full disk: this batch is lost, counted
                self._count_drop(state, SPOOL_FULL, items)
                self._report_write_error(exc)
                # A partial frame may sit at the segment's end: later records start a new one.
                self._close_active_locked(state)
                return False
            while self._total > self.max_bytes:
                if not self._drop_oldest_locked():
                    break
            state.idle.clear()
        state.wake.set()
        self._usage()
        return True

    def _write_locked(self, state: SignalState, payload: bytes, items: int) -> None:
        if state.active is None:
            seq = self._next_seq
            self._next_seq += 1
            path = segment_path(state.folder, seq)
            state.folder.mkdir(parents=True, exist_ok=True)
            state.active_file = open(path, "ab")  # noqa: SIM115 - kept open while active
            state.active = state.segments[seq] = Segment(seq, path, 0)
        segment = state.active
        record = Record(segment.seq, segment.size, len(payload), items)
        # One write of the whole frame: a crash cuts at most this record, which the CRC catches.
        state.active_file.write(frame(payload, items))
        state.active_file.flush()
        segment.size += HEADER_SIZE + len(payload)
        segment.pending += 1
        self._total += HEADER_SIZE + len(payload)
        state.records.append(record)
        if segment.size >= self.segment_bytes:
            self._close_active_locked(state)

    def _close_active_locked(self, state: SignalState) -> None:
        if state.active_file is not None:
            try:
                state.active_file.close()
            except OSError:
                pass
        segment, state.active, state.active_file = state.active, None, None
        if segment is not None and segment.pending == 0:  # everything in it is delivered already
            self._remove_segment_locked(state, segment)

    def _remove_segment_locked(self, state: SignalState, segment: Segment) -> None:
        state.segments.pop(segment.seq, None)
        self._total -= segment.size
        unlink_quietly(segment.path)

    def _drop_oldest_locked(self) -> bool:
        """Delete the oldest segment of any signal, counting its undelivered items; False if none."""
        oldest: tuple[SignalState, Segment] | None = None
        for state in self._signals.values():
            if state.segments:
                segment = state.segments[min(state.segments)]
                if oldest is None or segment.seq < oldest[1].seq:
                    oldest = (state, segment)
        if oldest is None:
            return False
        state, segment = oldest
        if segment is state.active:
            self._close_active_locked(state)
            if segment.seq not in state.segments:  # it was fully delivered: closing removed it
                return True
        dropped = 0
        while state.records and state.records[0].seq == segment.seq:
            record = state.records.popleft()
            if any(record is sent for sent in state.inflight):  # being sent now: its outcome decides (see _ack)
                record.orphaned = True
                continue
            dropped += record.items
        for sent in state.inflight:
            if sent.seq == segment.seq:
                sent.orphaned = True
        self._remove_segment_locked(state, segment)
        if dropped:
            self._count_drop(state, SPOOL_FULL, dropped)
        if not state.records and not state.inflight:
            state.idle.set()
        return True

    def _count_drop(self, state: SignalState, reason: str, items: int) -> None:
        state.stats.dropped[reason] = state.stats.dropped.get(reason, 0) + items
        if self._on_drop is not None:
            try:
                self._on_drop(state.signal, reason, items)
            except Exception:  # noqa: BLE001 - a metrics callback must not stop the spool
                pass
        if reason == SPOOL_FULL and not self._drop_reported:
            self._drop_reported = True
            logger.warning(
                "otel-rl: the spool %s reached its bound of %s while the collector was unreachable; the oldest "
                "telemetry is being dropped and counted in rl.telemetry.dropped (raise OTEL_RL_SPOOL_MAX_BYTES / "
                "spool_max_bytes to keep more; reported once)",
                self.directory,
                format_bytes(self.max_bytes),
            )

    def _report_write_error(self, exc: OSError) -> None:
        if not self._drop_reported:
            self._drop_reported = True
            logger.warning(
                "otel-rl: cannot write to the spool %s (%s); telemetry that the collector does not take "
                "right away is dropped and counted in rl.telemetry.dropped (reported once)",
                self.directory,
                exc,
            )

    def _usage(self) -> None:
        if self._on_usage is not None:
            try:
                self._on_usage(max(self._total, 0))
            except Exception:  # noqa: BLE001
                pass

    # -- shutdown -----------------------------------------------------------------------------
    def begin_shutdown(self, timeout_s: float | None = None) -> None:
        """Start the shutdown clock: delivery attempts stop ``timeout_s`` from now (first call wins)."""
        if self._deadline is None:
            self._deadline = time.monotonic() + (self.shutdown_timeout_s if timeout_s is None else timeout_s)
            for state in self._signals.values():
                state.kick.set()  # skip any backoff: one more try now
                state.hurry.set()
                state.wake.set()

    def close_signal(self, signal: str, timeout_s: float | None = None) -> bool:
        """No more appends for ``signal``; deliver what is pending until the shutdown deadline.
        True when everything of the signal was delivered."""
        # The SDK hands its own (30 s) budget down; otel-rl's shutdown bound is shutdown_timeout_s.
        self.begin_shutdown(self.shutdown_timeout_s if timeout_s is None else min(timeout_s, self.shutdown_timeout_s))
        state = self._signals[signal]
        with self._lock:
            state.closed = True
            if state.active is not None:
                self._close_active_locked(state)
        state.wake.set()
        delivered = True
        if state.thread is not None and state.thread.is_alive():
            while not state.idle.is_set():
                remaining = (self._deadline or 0) - time.monotonic()
                if remaining <= 0 or state.gave_up or not state.thread.is_alive():
                    break
                state.idle.wait(min(remaining, 0.05))
            delivered = state.idle.is_set() and not state.records
        else:
            delivered = not state.records
        if all(s.closed for s in self._signals.values() if s.transport is not None or s.records):
            self.close()
        return delivered

    def close(self) -> None:
        """Stop the senders, close the files and release the folder (what is left stays on disk)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            for state in self._signals.values():
                state.closed = True
                if state.active_file is not None:
                    self._close_active_locked(state)
        for state in self._signals.values():
            state.kick.set()
            state.hurry.set()  # a sender waiting for its next turn ends now
            state.wake.set()
        pending = {s: sum(r.items for r in st.records) for s, st in self._signals.items() if st.records}
        if pending and self._announce and os.getpid() == self._pid:
            logger.warning(
                "otel-rl: %s of telemetry could not be delivered before shutdown (%s); it stays in %s and is "
                "sent by the next start with this spool folder or by `otel-rl push %s`",
                format_bytes(self._total),
                ", ".join(f"{n} {item_word(s)}" for s, n in pending.items()),
                self.directory,
                self.directory,
            )
        for state in self._signals.values():
            if state.transport is not None:
                # Wait briefly for a sender between two attempts; one stuck in a request is a
                # daemon thread and does not hold the process.
                if state.thread is not None:
                    state.thread.join(0.05)
                state.transport.close()
        if not pending and os.getpid() == self._pid:
            self._remove_folder()
        try:
            os.close(self._lock_fd)
        except OSError:
            pass

    def _remove_folder(self) -> None:
        """Everything was delivered: leave no empty spool behind (still holding the lock)."""
        try:
            for state in self._signals.values():
                if state.folder.is_dir():
                    for path in state.folder.iterdir():
                        unlink_quietly(path)
                    state.folder.rmdir()
            unlink_quietly(self.directory / MARKER_FILE)
            unlink_quietly(self.directory / LOCK_FILE)
            self.directory.rmdir()
            if self.directory.parent.name == "spool":  # the run folder's spool/, once no rank's is left
                self.directory.parent.rmdir()
        except OSError:
            pass

    # -- inspection ---------------------------------------------------------------------------
    @property
    def pending_bytes(self) -> int:
        return self._total

    def stats(self) -> dict[str, SignalStats]:
        return {s: st.stats for s, st in self._signals.items()}

    def pending_items(self) -> dict[str, int]:
        with self._lock:
            return {s: sum(r.items for r in st.records) for s, st in self._signals.items()}
