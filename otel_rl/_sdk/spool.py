"""A bounded disk spool between otel-rl's exporters and the OTLP collector.

The SDK's OTLP exporters send each batch once and give up after their timeout: a collector that
restarts, or a network that drops for a minute, loses what was exported meanwhile, and a batch
processor whose exporter blocks for 10 s fills its queue and drops spans. Here the exporters only
encode a batch into the OTLP protobuf request the SDK would send and append it to a file; one
sender thread per signal delivers the files' records in order through the SDK exporter's own
transport (same endpoint, headers, TLS and compression settings), backs off while the collector
is unreachable, and deletes what the collector acknowledged. So:

* the batch processors never wait for the network: their queues never overflow during an outage;
* what could not be delivered waits on disk, up to ``max_bytes``; past it the oldest segment is
  dropped, its items are counted (``rl.telemetry.dropped{signal, drop_reason="spool_full"}``) and
  the first drop is reported;
* a crash (SIGKILL, ``os._exit``) leaves the spool behind: the next start with the same spool
  folder, or ``otel-rl push RUN_DIR``, delivers it.

Layout of one spool folder (one per process; the lock file keeps a second process out)::

    <spool>/spool.json              marker: format version, pid, endpoint of the writer
    <spool>/.lock                   flock()ed while a process owns the folder
    <spool>/<signal>/<seq>.seg      records, appended; <seq> is global across signals (age order)
    <spool>/<signal>/cursor         "<seq> <offset>": everything before it was delivered

A record is a 16-byte header (magic, payload length, item count, CRC-32) and the serialized
``Export{Trace,Metrics,Logs}ServiceRequest``. A record cut short by a crash fails its length or
CRC check and is discarded, with what follows it in that segment. Delivery is at least once: a
crash between the collector's acknowledgement and the cursor update resends one batch.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import ssl
import struct
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_rl._sdk.config import redact_url
from otel_rl.semconv import attributes as A

try:  # POSIX: a spool folder belongs to one live process at a time
    import fcntl
except ImportError:  # pragma: no cover - Windows: no folder lock, one process per spool_dir by convention
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("otel_rl")
# The transports' own retry chatter (one line per attempt during an outage) goes here, at debug
# level: the spool reports an outage once, naming the endpoint and the spool folder.
_transport_logger = logging.getLogger("otel_rl.spool.transport")

TRACES = A.RlTelemetrySignalValues.TRACES.value
METRICS = A.RlTelemetrySignalValues.METRICS.value
LOGS = A.RlTelemetrySignalValues.LOGS.value
SIGNALS = (TRACES, METRICS, LOGS)
SPOOL_FULL = A.RlTelemetryDropReasonValues.SPOOL_FULL.value
BACKEND_REJECTED = A.RlTelemetryDropReasonValues.BACKEND_REJECTED.value

DEFAULT_MAX_BYTES = 256 * 2**20
MARKER_FILE = "spool.json"
LOCK_FILE = ".lock"
CURSOR_FILE = "cursor"
SEGMENT_SUFFIX = ".seg"
FORMAT_VERSION = 1

_HEADER = struct.Struct("<4sIII")  # magic, payload length, item count, crc32(payload)
_MAGIC = b"ORS1"
_MIN_BACKOFF_S = 0.25
_MAX_BACKOFF_S = 5.0


class SpoolBusy(RuntimeError):
    """Another live process owns this spool folder."""


def redact_endpoint(url: str | None) -> str:
    """An endpoint without user:password, for messages."""
    return str(redact_url(url))


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# ---------------------------------------------------------------------------------------------
# Sending a serialized request through an SDK exporter's transport


@dataclass(frozen=True)
class Outcome:
    """One delivery attempt: ``ok``; else ``permanent`` (drop it) or retry later; ``detail`` for messages."""

    ok: bool
    permanent: bool = False
    detail: str = ""
    tls: bool = False  # a certificate problem: reported with the CA setting


_HTTP_HOLD = {401, 403, 407}  # auth: keep the data (a fixed token delivers it), retry slowly
_HTTP_RETRY = {408, 429}


class HttpTransport:
    """Posts serialized OTLP requests with an SDK OTLP/HTTP exporter's client (its session, TLS,
    headers, compression), one attempt per call: the spool does the retrying."""

    protocol = "http/protobuf"

    def __init__(self, exporter: Any, signal: str) -> None:
        client = exporter._client
        # Fail now, not at the first export, if the SDK's internals moved.
        for name in ("_submit", "_compress", "_transport"):
            if not hasattr(client, name):
                raise TypeError(f"unsupported OTLP/HTTP exporter client (no {name})")
        client._logger = _transport_logger
        self.exporter = exporter
        self.signal = signal
        self.endpoint = str(exporter._endpoint)
        self.timeout_s = float(getattr(client, "_timeout", 10.0) or 10.0)
        self._client = client

    def send(self, payload: bytes, timeout_s: float) -> Outcome:
        client = self._client
        result = client._submit(client._compress(payload), max(timeout_s, 0.001))
        status = result.status_code
        if result.error is None and status is not None and 200 <= status < 300:
            return Outcome(True)
        if status is None:
            error = result.error
            return Outcome(False, detail=describe_error(error), tls=_is_tls_error(error))
        detail = f"HTTP {status} {result.reason or ''}".strip()
        if status in _HTTP_HOLD or status in _HTTP_RETRY or status >= 500:
            return Outcome(False, detail=detail)
        return Outcome(False, permanent=True, detail=detail)

    def close(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception:  # noqa: BLE001 - closing a session must not stop the others
            pass


_GRPC_PATHS = {
    TRACES: "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    METRICS: "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    LOGS: "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
}


class GrpcTransport:
    """Sends serialized OTLP requests on an SDK OTLP/gRPC exporter's channel (its credentials,
    headers, compression) as raw bytes, one attempt per call."""

    protocol = "grpc"

    def __init__(self, exporter: Any, signal: str) -> None:
        for name in ("_channel", "_headers", "_initialize_channel_and_stub"):
            if not hasattr(exporter, name):
                raise TypeError(f"unsupported OTLP/gRPC exporter (no {name})")
        import grpc

        self._grpc = grpc
        self.exporter = exporter
        self.signal = signal
        self.endpoint = str(exporter._endpoint)
        self.timeout_s = float(getattr(exporter, "_timeout", 10.0) or 10.0)
        self._path = _GRPC_PATHS[signal]
        self._channel: Any = None
        self._call: Any = None

    def _method(self) -> Any:
        channel = self.exporter._channel
        if channel is not self._channel:  # the exporter re-created its channel
            self._channel = channel
            # No serializers: the request is already the serialized protobuf.
            self._call = channel.unary_unary(self._path)
        return self._call

    def send(self, payload: bytes, timeout_s: float) -> Outcome:
        grpc = self._grpc
        try:
            self._method()(payload, metadata=self.exporter._headers or None, timeout=max(timeout_s, 0.001))
            return Outcome(True)
        except grpc.RpcError as error:
            code = error.code() if callable(getattr(error, "code", None)) else None
            details = error.details() if callable(getattr(error, "details", None)) else str(error)
            detail = _short(f"gRPC {getattr(code, 'name', code)}: {details}")
            if code == grpc.StatusCode.UNAVAILABLE:
                # A channel in gRPC's own reconnect backoff can wait up to minutes; a fresh one
                # connects as soon as the collector is back (as the SDK exporter does).
                try:
                    if self.exporter._channel is not None:
                        self.exporter._channel.close()
                    self.exporter._initialize_channel_and_stub()
                except Exception:  # noqa: BLE001
                    pass
            if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS):
                return Outcome(False, permanent=True, detail=detail)
            return Outcome(False, detail=detail, tls=_is_tls_text(details))
        except ValueError as error:  # a closed channel
            return Outcome(False, detail=_short(str(error)))

    def close(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception:  # noqa: BLE001
            pass


def transport_for(exporter: Any, signal: str) -> HttpTransport | GrpcTransport:
    """The transport of an SDK OTLP exporter (HTTP or gRPC); TypeError for anything else."""
    module = type(exporter).__module__
    if ".proto.grpc" in module:
        return GrpcTransport(exporter, signal)
    if ".proto.http" in module:
        return HttpTransport(exporter, signal)
    raise TypeError(f"not an SDK OTLP exporter: {type(exporter).__name__}")


def describe_error(error: BaseException | None) -> str:
    """The root cause of a transport error in a few words ("[Errno 111] Connection refused"),
    not the whole chain of wrapper exceptions that requests and urllib3 build around it."""
    if error is None:
        return "no response"
    seen: set[int] = set()
    stack: list[BaseException] = [error]
    root: BaseException = error
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return _short(f"[Errno {current.errno}] {current.strerror}")
        if isinstance(current, ssl.SSLError):
            return _short(f"{type(current).__name__}: {getattr(current, 'verify_message', None) or current.reason or current}")
        root = current
        stack.extend(a for a in getattr(current, "args", ()) if isinstance(a, BaseException))
        for nested in (current.__cause__, current.__context__, getattr(current, "reason", None)):
            if isinstance(nested, BaseException):
                stack.append(nested)
    text = str(root)
    # urllib3 wraps the reason as "<...>: Failed to establish a new connection: [Errno 111] ..."
    if "Errno" in text:
        text = text[text.index("[Errno"):] if "[Errno" in text else text
    return _short(f"{type(root).__name__}: {text}" if not text.startswith("[Errno") else text)


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_tls_text(text: str) -> bool:
    low = text.lower()
    return "certificate" in low or "ssl" in low or "handshake" in low or "tls" in low


def _is_tls_error(error: BaseException | None) -> bool:
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, ssl.SSLError) or type(error).__name__ == "SSLError":
            return True
        for arg in getattr(error, "args", ()):
            if isinstance(arg, BaseException) and _is_tls_error(arg):
                return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def ca_setting(signal: str, protocol: str = "http/protobuf", environ: Any = None) -> str:
    """Which CA file the SDK exporters verify the collector's certificate with, for messages."""
    environ = os.environ if environ is None else environ
    for name in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"):
        if environ.get(name):
            return f"{name}={environ[name]}"
    if protocol == "grpc":
        return "gRPC's default roots (OTEL_EXPORTER_OTLP_CERTIFICATE is not set)"
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        if environ.get(name):
            return f"{name}={environ[name]} (OTEL_EXPORTER_OTLP_CERTIFICATE is not set)"
    return "the CA bundle of the requests library (OTEL_EXPORTER_OTLP_CERTIFICATE is not set)"


# ---------------------------------------------------------------------------------------------
# The spool


@dataclass(eq=False)
class _Record:
    seq: int
    offset: int  # of the header in the segment file
    length: int  # payload bytes
    items: int
    orphaned: bool = False  # its segment was dropped while the record was being sent

    @property
    def end(self) -> int:
        return self.offset + _HEADER.size + self.length


@dataclass(eq=False)
class _Segment:
    seq: int
    path: Path
    size: int
    pending: int = 0  # records not yet delivered


@dataclass
class SignalStats:
    appended: int = 0  # items accepted from the SDK
    delivered: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # by drop reason
    recovered: int = 0  # items found on disk at open (left by an earlier process)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


class _SignalState:
    def __init__(self, signal: str, folder: Path) -> None:
        self.signal = signal
        self.folder = folder
        self.records: deque[_Record] = deque()
        self.segments: dict[int, _Segment] = {}
        self.active: _Segment | None = None
        self.active_file: Any = None
        self.stats = SignalStats()
        self.wake = threading.Event()  # new records (or shutdown) for an idle sender
        self.kick = threading.Event()  # cut a backoff short (shutdown)
        self.idle = threading.Event()  # set while nothing is pending or in flight
        self.idle.set()
        self.inflight: _Record | None = None
        self.failing_since: float | None = None  # monotonic time of the first failure of an outage
        self.last_error = ""
        self.transport: HttpTransport | GrpcTransport | None = None
        self.thread: threading.Thread | None = None
        self.closed = False  # no more appends (the exporter was shut down)
        self.gave_up = False  # shutdown: the collector is unreachable, leave the rest on disk


class Spool:
    """A per-process disk spool for the three OTLP signals; see the module docstring.

    ``on_drop(signal, reason, items)`` and ``on_usage(bytes)`` feed otel-rl's own metrics; they run
    on the spool's threads and must not block.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES, *,
                 on_drop: Callable[[str, str, int], None] | None = None,
                 on_usage: Callable[[int], None] | None = None,
                 segment_bytes: int | None = None, shutdown_timeout_s: float = 5.0, announce: bool = True) -> None:
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
        self._lock_fd = self._acquire_lock()
        try:
            self._signals = {s: _SignalState(s, self.directory / s) for s in SIGNALS}
            self._recover()
            self._write_marker()
        except BaseException:
            os.close(self._lock_fd)
            raise

    # -- opening ----------------------------------------------------------------------------
    def _acquire_lock(self) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is None:
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise SpoolBusy(f"the spool folder {self.directory} is in use by another process") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    def _write_marker(self) -> None:
        info = {"format": FORMAT_VERSION, "pid": os.getpid(), "max_bytes": self.max_bytes,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        tmp = self.directory / (MARKER_FILE + ".tmp")
        tmp.write_text(json.dumps(info) + "\n", encoding="utf-8")
        os.replace(tmp, self.directory / MARKER_FILE)

    def _recover(self) -> None:
        """Index what an earlier process left: records after each signal's cursor."""
        highest = 0
        for state in self._signals.values():
            state.folder.mkdir(parents=True, exist_ok=True)
            cursor_seq, cursor_offset = _read_cursor(state.folder / CURSOR_FILE)
            for path in sorted(state.folder.glob("*" + SEGMENT_SUFFIX)):
                try:
                    seq = int(path.stem)
                except ValueError:
                    continue
                highest = max(highest, seq)
                if seq < cursor_seq:
                    _unlink(path)
                    continue
                start = cursor_offset if seq == cursor_seq else 0
                records, valid_end = _scan_segment(path, seq, start)
                if valid_end is not None:  # a record cut short by a crash: drop the tail
                    with open(path, "r+b") as f:
                        f.truncate(valid_end)
                if not records:
                    _unlink(path)
                    continue
                size = path.stat().st_size
                state.segments[seq] = _Segment(seq, path, size, pending=len(records))
                state.records.extend(records)
                self._total += size
                items = sum(r.items for r in records)
                state.stats.recovered += items
            if state.records:
                state.idle.clear()
        self._next_seq = highest + 1
        recovered = {s: st.stats.recovered for s, st in self._signals.items() if st.stats.recovered}
        if recovered and self._announce:
            logger.warning("otel-rl: found %s left undelivered in %s by an earlier run (%s); delivering it first",
                           format_bytes(self._total), self.directory,
                           ", ".join(f"{n} {item_word(s)}" for s, n in recovered.items()))
        self._usage()

    # -- writing (SDK worker threads) --------------------------------------------------------
    def append(self, signal: str, payload: bytes, items: int) -> bool:
        """Store one serialized request; False when it could not be stored (counted as dropped)."""
        if os.getpid() != self._pid:
            return False
        frame_len = _HEADER.size + len(payload)
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

    def _write_locked(self, state: _SignalState, payload: bytes, items: int) -> None:
        if state.active is None:
            seq = self._next_seq
            self._next_seq += 1
            path = state.folder / f"{seq:012d}{SEGMENT_SUFFIX}"
            state.folder.mkdir(parents=True, exist_ok=True)
            state.active_file = open(path, "ab")  # noqa: SIM115 - kept open while active
            state.active = state.segments[seq] = _Segment(seq, path, 0)
        segment = state.active
        header = _HEADER.pack(_MAGIC, len(payload), items, zlib.crc32(payload))
        record = _Record(segment.seq, segment.size, len(payload), items)
        # One write of the whole frame: a crash cuts at most this record, which the CRC catches.
        state.active_file.write(header + payload)
        state.active_file.flush()
        segment.size += _HEADER.size + len(payload)
        segment.pending += 1
        self._total += _HEADER.size + len(payload)
        state.records.append(record)
        if segment.size >= self.segment_bytes:
            self._close_active_locked(state)

    def _close_active_locked(self, state: _SignalState) -> None:
        if state.active_file is not None:
            try:
                state.active_file.close()
            except OSError:
                pass
        segment, state.active, state.active_file = state.active, None, None
        if segment is not None and segment.pending == 0:  # everything in it is delivered already
            self._remove_segment_locked(state, segment)

    def _remove_segment_locked(self, state: _SignalState, segment: _Segment) -> None:
        state.segments.pop(segment.seq, None)
        self._total -= segment.size
        _unlink(segment.path)

    def _drop_oldest_locked(self) -> bool:
        """Delete the oldest segment of any signal, counting its undelivered items; False if none."""
        oldest: tuple[_SignalState, _Segment] | None = None
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
            if record is state.inflight:  # being sent now: its outcome decides (see _ack)
                record.orphaned = True
                continue
            dropped += record.items
        if state.inflight is not None and state.inflight.seq == segment.seq:
            state.inflight.orphaned = True
        self._remove_segment_locked(state, segment)
        if dropped:
            self._count_drop(state, SPOOL_FULL, dropped)
        if not state.records and state.inflight is None:
            state.idle.set()
        return True

    def _count_drop(self, state: _SignalState, reason: str, items: int) -> None:
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
                "spool_max_bytes to keep more; reported once)", self.directory, format_bytes(self.max_bytes))

    def _report_write_error(self, exc: OSError) -> None:
        if not self._drop_reported:
            self._drop_reported = True
            logger.warning("otel-rl: cannot write to the spool %s (%s); telemetry that the collector does not take "
                           "right away is dropped and counted in rl.telemetry.dropped (reported once)",
                           self.directory, exc)

    def _usage(self) -> None:
        if self._on_usage is not None:
            try:
                self._on_usage(max(self._total, 0))
            except Exception:  # noqa: BLE001
                pass

    # -- delivering (one thread per signal) --------------------------------------------------
    def attach(self, signal: str, transport: HttpTransport | GrpcTransport) -> None:
        """Deliver ``signal``'s records through ``transport`` from a thread of its own."""
        state = self._signals[signal]
        state.transport = transport
        state.thread = threading.Thread(target=self._deliver_loop, args=(state,), name=f"otel-rl-spool-{signal}",
                                        daemon=True)
        state.thread.start()

    def _deliver_loop(self, state: _SignalState) -> None:
        backoff = 0.0
        while True:
            if backoff:  # new records do not cut this short: a dead collector is not hammered
                state.kick.wait(backoff)
                state.kick.clear()
            with self._lock:
                if self._stopping or state.gave_up:
                    return
                if not state.records:
                    state.inflight = None
                    state.idle.set()
                    record = None
                else:
                    record = state.inflight = state.records[0]
                    segment = state.segments.get(record.seq)
            if record is None:
                if state.closed:
                    return
                state.wake.wait(1.0)
                state.wake.clear()
                continue
            try:
                payload = _read_payload(segment.path if segment else None, record)
            except (OSError, ValueError):
                payload = None
            if payload is None:  # its file vanished (dropped meanwhile) or is damaged
                self._ack(state, record, delivered=False, reason=SPOOL_FULL)
                continue
            timeout = state.transport.timeout_s
            if self._deadline is not None:
                timeout = min(timeout, self._deadline - time.monotonic())
                if timeout <= 0:
                    with self._lock:
                        state.inflight = None
                        state.gave_up = True
                        state.idle.set()
                    return
            try:
                outcome = state.transport.send(payload, timeout)
            except Exception as exc:  # noqa: BLE001 - a transport bug must not kill delivery
                outcome = Outcome(False, detail=_short(f"{type(exc).__name__}: {exc}"))
            if outcome.ok:
                self._ack(state, record, delivered=True)
                self._recovered(state)
                backoff = 0.0
            elif outcome.permanent:
                self._report_rejected(state, outcome)
                self._ack(state, record, delivered=False, reason=BACKEND_REJECTED)
            else:
                self._failed(state, outcome)
                with self._lock:
                    state.inflight = None
                    if record.orphaned:  # dropped from disk while we tried: it is lost now
                        self._count_drop(state, SPOOL_FULL, record.items)
                    if self._deadline is not None:  # shutting down: keep the rest for the next start
                        state.gave_up = True
                        state.idle.set()
                        return
                    if not state.records:
                        state.idle.set()
                backoff = min(max(backoff * 2, _MIN_BACKOFF_S), _MAX_BACKOFF_S)

    def _ack(self, state: _SignalState, record: _Record, *, delivered: bool, reason: str = "") -> None:
        cursor: tuple[int, int] | None = None
        with self._lock:
            state.inflight = None
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
            if not state.records:
                state.idle.set()
        if cursor is not None:
            _write_cursor(state.folder / CURSOR_FILE, *cursor)
        self._usage()

    def _failed(self, state: _SignalState, outcome: Outcome) -> None:
        state.last_error = outcome.detail
        endpoint = redact_endpoint(state.transport.endpoint if state.transport else "")
        if outcome.tls and endpoint not in self._tls_reported:
            self._tls_reported.add(endpoint)
            logger.error(
                "otel-rl: TLS certificate verification failed for the collector at %s (%s). The CA file used is %s: "
                "set OTEL_EXPORTER_OTLP_CERTIFICATE (or OTEL_EXPORTER_OTLP_%s_CERTIFICATE) to the PEM file of the CA "
                "that signed the collector's certificate. Telemetry waits in the spool %s meanwhile.",
                endpoint, outcome.detail, ca_setting(state.signal, state.transport.protocol if state.transport else ""),
                state.signal.upper(), self.directory)
        if state.failing_since is None:
            state.failing_since = time.monotonic()
            others_failing = any(s.failing_since is not None for s in self._signals.values() if s is not state)
            if others_failing:  # the same outage, seen by another signal
                logger.debug("otel-rl: cannot deliver %s to %s (%s) either", state.signal, endpoint, outcome.detail)
                return
            self._outage_reported += 1
            # The first outage is a warning; later ones (a flapping collector) are info.
            level = logging.WARNING if self._outage_reported == 1 else logging.INFO
            logger.log(level, "otel-rl: cannot deliver %s to the collector at %s (%s); telemetry waits in the spool %s "
                       "(up to %s, OTEL_RL_SPOOL_MAX_BYTES) and is retried; the training run is not affected",
                       state.signal, endpoint, outcome.detail, self.directory, format_bytes(self.max_bytes))

    def _recovered(self, state: _SignalState) -> None:
        if state.failing_since is not None:
            seconds = time.monotonic() - state.failing_since
            state.failing_since = None
            if not any(s.failing_since is not None for s in self._signals.values()):
                logger.info("otel-rl: the collector takes telemetry again (%s after %.1f s); delivering the spooled "
                            "backlog (%s)", state.signal, seconds, format_bytes(self._total))

    def _report_rejected(self, state: _SignalState, outcome: Outcome) -> None:
        if state.signal not in self._rejected_reported:
            self._rejected_reported.add(state.signal)
            endpoint = redact_endpoint(state.transport.endpoint if state.transport else "")
            logger.warning("otel-rl: the collector at %s refused a batch of %s (%s); it is dropped and counted in "
                           "rl.telemetry.dropped (reported once per signal)", endpoint, state.signal, outcome.detail)

    # -- flush and shutdown -----------------------------------------------------------------
    def failing(self, signal: str) -> bool:
        return self._signals[signal].failing_since is not None

    def wait_delivered(self, signal: str, timeout_s: float) -> bool:
        """Wait until ``signal`` has nothing pending. Returns at once (False) while the collector
        is unreachable: a flush must not hold the training loop for the length of an outage."""
        state = self._signals[signal]
        end = time.monotonic() + max(timeout_s, 0.0)
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
        while True:
            busy = [st for st in self._signals.values() if st.transport is not None and not st.idle.is_set()]
            if not busy:
                return not any(st.records for st in self._signals.values())
            now = time.monotonic()
            if now >= end:
                return False
            if give_up_after_s is not None and all(
                    st.failing_since is not None and now - st.failing_since >= give_up_after_s for st in busy):
                return False
            busy[0].idle.wait(min(end - now, 0.05))

    def begin_shutdown(self, timeout_s: float | None = None) -> None:
        """Start the shutdown clock: delivery attempts stop ``timeout_s`` from now (first call wins)."""
        if self._deadline is None:
            self._deadline = time.monotonic() + (self.shutdown_timeout_s if timeout_s is None else timeout_s)
            for state in self._signals.values():
                state.kick.set()  # skip any backoff: one more try now
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
            state.wake.set()
        pending = {s: sum(r.items for r in st.records) for s, st in self._signals.items() if st.records}
        if pending and self._announce and os.getpid() == self._pid:
            logger.warning("otel-rl: %s of telemetry could not be delivered before shutdown (%s); it stays in %s and is "
                           "sent by the next start with this spool folder or by `otel-rl push %s`",
                           format_bytes(self._total), ", ".join(f"{n} {item_word(s)}" for s, n in pending.items()),
                           self.directory, self.directory)
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
                        _unlink(path)
                    state.folder.rmdir()
            _unlink(self.directory / MARKER_FILE)
            _unlink(self.directory / LOCK_FILE)
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


def item_word(signal: str) -> str:
    """What one item of ``signal`` is called, for messages."""
    return {TRACES: "spans", METRICS: "metric points", LOGS: "log records"}[signal]


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.debug("otel-rl: cannot remove %s: %s", path, exc)


def _read_cursor(path: Path) -> tuple[int, int]:
    try:
        seq, offset = path.read_text(encoding="ascii").split()
        return int(seq), int(offset)
    except (OSError, ValueError):
        return 0, 0


def _write_cursor(path: Path, seq: int, offset: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(f"{seq} {offset}\n")
        os.replace(tmp, path)
    except OSError as exc:  # a stale cursor only means one batch is sent twice after a crash
        logger.debug("otel-rl: cannot update %s: %s", path, exc)


def _scan_segment(path: Path, seq: int, start: int) -> tuple[list[_Record], int | None]:
    """The valid records of a segment from ``start``; and where to truncate it (None if intact)."""
    records: list[_Record] = []
    try:
        data = path.read_bytes()
    except OSError:
        return [], None
    offset = start
    while offset < len(data):
        if offset + _HEADER.size > len(data):
            return records, offset
        magic, length, items, crc = _HEADER.unpack_from(data, offset)
        end = offset + _HEADER.size + length
        if magic != _MAGIC or end > len(data) or zlib.crc32(data[offset + _HEADER.size:end]) != crc:
            return records, offset
        records.append(_Record(seq, offset, length, items))
        offset = end
    return records, None


def _read_payload(path: Path | None, record: _Record) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        f.seek(record.offset)
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        magic, length, _items, crc = _HEADER.unpack(header)
        payload = f.read(length)
    if magic != _MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
        return None
    return payload


# ---------------------------------------------------------------------------------------------
# The exporters the SDK's processors and readers call


def _metric_points(data: MetricsData) -> int:
    count = 0
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                count += len(getattr(metric.data, "data_points", ()) or ())
    return count


class _SpoolingExporterMixin:
    _signal: str

    def _init_spooling(self, spool: Spool, inner: Any) -> None:
        self._spool = spool
        self.inner = inner
        self._pid = os.getpid()
        self._encode_error_reported = False

    def _store(self, encode: Callable[[], Any], items: int) -> bool:
        if os.getpid() != self._pid:  # a forked child: the parent's spool is not ours to write
            return False
        try:
            payload = encode().SerializeToString()
        except Exception as exc:  # noqa: BLE001 - never raise into the SDK
            if not self._encode_error_reported:
                self._encode_error_reported = True
                logger.warning("otel-rl: cannot encode a batch of %s for OTLP (%r); it is dropped (reported once)",
                               self._signal, exc)
            return False
        return self._spool.append(self._signal, payload, items)

    def _flush(self, timeout_millis: float) -> bool:
        if os.getpid() != self._pid:
            return False
        return self._spool.wait_delivered(self._signal, timeout_millis / 1000.0)

    def _close(self, timeout_millis: float | None) -> None:
        if os.getpid() != self._pid:
            return
        self._spool.close_signal(self._signal, None if timeout_millis is None else timeout_millis / 1000.0)


class SpoolingSpanExporter(_SpoolingExporterMixin, SpanExporter):
    """Spans into the spool; the SDK OTLP span exporter ``inner`` delivers them."""

    _signal = TRACES

    def __init__(self, spool: Spool, inner: Any) -> None:
        self._init_spooling(spool, inner)

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        ok = self._store(lambda: encode_spans(spans), len(spans))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._flush(timeout_millis)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        self._close(timeout_millis)


class SpoolingLogExporter(_SpoolingExporterMixin, LogRecordExporter):
    """Log records into the spool; the SDK OTLP log exporter ``inner`` delivers them."""

    _signal = LOGS

    def __init__(self, spool: Spool, inner: Any) -> None:
        self._init_spooling(spool, inner)

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        if not batch:
            return LogRecordExportResult.SUCCESS
        ok = self._store(lambda: encode_logs(batch), len(batch))
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._flush(timeout_millis)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        self._close(timeout_millis)


class SpoolingMetricExporter(_SpoolingExporterMixin, MetricExporter):
    """Metric exports into the spool; the SDK OTLP metric exporter ``inner`` delivers them, and
    its temporality / aggregation preferences (OTEL_EXPORTER_OTLP_METRICS_*) still apply."""

    _signal = METRICS

    def __init__(self, spool: Spool, inner: Any) -> None:
        MetricExporter.__init__(self, preferred_temporality=getattr(inner, "_preferred_temporality", None),
                                preferred_aggregation=getattr(inner, "_preferred_aggregation", None))
        self._init_spooling(spool, inner)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if metrics_data is None or not metrics_data.resource_metrics:
            return MetricExportResult.SUCCESS
        ok = self._store(lambda: encode_metrics(metrics_data), _metric_points(metrics_data))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._close(timeout_millis)
