"""The disk spool's files: the folder layout, the record format, the cursor and the folder lock.

Layout of one spool folder (one per process; the lock file keeps a second process out)::

    <spool>/spool.json              marker: format version, pid, endpoint of the writer
    <spool>/.lock                   flock()ed while a process owns the folder
    <spool>/<signal>/<seq>.seg      records, appended; <seq> is global across signals (age order)
    <spool>/<signal>/cursor         "<seq> <offset>": everything before it was delivered

A record is a 16-byte header (magic, payload length, item count, CRC-32) and the serialized
``Export{Trace,Metrics,Logs}ServiceRequest``. A record cut short by a crash fails its length or
CRC check and is discarded at recovery (counted and reported); the whole records before and after
it are kept.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from otel_rl.semconv import attributes as A

try:  # POSIX: a spool folder belongs to one live process at a time
    import fcntl
except ImportError:  # pragma: no cover - Windows: no folder lock, one process per spool_dir by convention
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("otel_rl")

TRACES = A.RlTelemetrySignalValues.TRACES.value
METRICS = A.RlTelemetrySignalValues.METRICS.value
LOGS = A.RlTelemetrySignalValues.LOGS.value
SIGNALS = (TRACES, METRICS, LOGS)

MARKER_FILE = "spool.json"
LOCK_FILE = ".lock"
CURSOR_FILE = "cursor"
SEGMENT_SUFFIX = ".seg"
FORMAT_VERSION = 1

_HEADER = struct.Struct("<4sIII")  # magic, payload length, item count, crc32(payload)
_MAGIC = b"ORS1"
#: Bytes a record takes on disk besides its payload.
HEADER_SIZE = _HEADER.size


class SpoolBusy(RuntimeError):
    """Another live process owns this spool folder."""


def format_bytes(n: float) -> str:
    """A size for messages: ``512 B``, ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def item_word(signal: str) -> str:
    """What one item of ``signal`` is called, for messages."""
    return {TRACES: "spans", METRICS: "metric points", LOGS: "log records"}[signal]


@dataclass(eq=False)
class Record:
    """Where one stored request lies: its segment, offset and size, and how many items it holds."""

    seq: int
    offset: int  # of the header in the segment file
    length: int  # payload bytes
    items: int
    orphaned: bool = False  # its segment was dropped while the record was being sent

    @property
    def end(self) -> int:
        return self.offset + HEADER_SIZE + self.length


@dataclass(eq=False)
class Segment:
    """One segment file of a signal and how many of its records are not delivered yet."""

    seq: int
    path: Path
    size: int
    pending: int = 0  # records not yet delivered


def segment_path(folder: Path, seq: int) -> Path:
    return folder / f"{seq:012d}{SEGMENT_SUFFIX}"


def frame(payload: bytes, items: int) -> bytes:
    """A record as written: header and payload, to be written in one call (a crash cuts at most it)."""
    return _HEADER.pack(_MAGIC, len(payload), items, zlib.crc32(payload)) + payload


def salvage_segment(path: Path, seq: int, start: int) -> tuple[list[Record], int, int]:
    """The whole records of a segment from ``start``, every one kept, even those after a tear.

    A tear (a crash mid-write, a disk error) damages bytes, not the records around it: the scan
    skips to the next valid record header. When anything was damaged, the segment is rewritten
    without the damaged bytes (so a later recovery neither finds nor reports them again). Returns
    the records, the damaged records discarded (each damaged stretch counts as one) and their bytes.
    """
    try:
        data = path.read_bytes()
    except OSError:
        return [], 0, 0
    kept: list[tuple[int, int, int]] = []  # (old offset, length, items) of each whole record
    damaged = damaged_bytes = 0
    offset = start
    in_damage = False
    while offset < len(data):
        record = _record_at(data, offset)
        if record is not None:
            kept.append((offset, *record))
            offset += HEADER_SIZE + record[0]
            in_damage = False
            continue
        if not in_damage:
            damaged += 1
            in_damage = True
        following = data.find(_MAGIC, offset + 1)
        following = len(data) if following < 0 else following
        damaged_bytes += following - offset
        offset = following
    if not damaged:
        return [Record(seq, o, length, items) for o, length, items in kept], 0, 0
    # Rewrite: the delivered prefix as is, then the whole records, packed (atomic replace).
    out = bytearray(data[:start])
    records = []
    for old, length, items in kept:
        records.append(Record(seq, len(out), length, items))
        out += data[old : old + HEADER_SIZE + length]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(bytes(out))
    os.replace(tmp, path)
    return records, damaged, damaged_bytes


def _record_at(data: bytes, offset: int) -> tuple[int, int] | None:
    """(payload length, items) of a whole, CRC-valid record at ``offset``, else None."""
    if offset + HEADER_SIZE > len(data):
        return None
    magic, length, items, crc = _HEADER.unpack_from(data, offset)
    end = offset + HEADER_SIZE + length
    if magic != _MAGIC or end > len(data) or zlib.crc32(data[offset + HEADER_SIZE : end]) != crc:
        return None
    return length, items


def read_payload(path: Path | None, record: Record) -> bytes | None:
    """The payload of ``record``, or None when its file is gone or the record is damaged."""
    if path is None:
        return None
    with open(path, "rb") as f:
        f.seek(record.offset)
        header = f.read(HEADER_SIZE)
        if len(header) < HEADER_SIZE:
            return None
        magic, length, _items, crc = _HEADER.unpack(header)
        payload = f.read(length)
    if magic != _MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
        return None
    return payload


def read_cursor(path: Path) -> tuple[int, int]:
    try:
        seq, offset = path.read_text(encoding="ascii").split()
        return int(seq), int(offset)
    except (OSError, ValueError):
        return 0, 0


def write_cursor(path: Path, seq: int, offset: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        # Bytes: a text file's codec (ascii) would be imported on the sender's thread, which a fork can catch half done.
        with open(tmp, "wb") as f:
            f.write(b"%d %d\n" % (seq, offset))
        os.replace(tmp, path)
    except OSError as exc:  # a stale cursor only means one batch is sent twice after a crash
        logger.debug("otel-rl: cannot update %s: %s", path, exc)


def unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.debug("otel-rl: cannot remove %s: %s", path, exc)


def lock_folder(directory: Path) -> int:
    """Create ``directory`` and take its lock; the lock's file descriptor. SpoolBusy if a live process holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise SpoolBusy(f"the spool folder {directory} is in use by another process") from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def write_marker(directory: Path, max_bytes: int) -> None:
    """The marker that says a folder is a spool (``otel-rl push`` looks for it)."""
    info = {"format": FORMAT_VERSION, "pid": os.getpid(), "max_bytes": max_bytes, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = directory / (MARKER_FILE + ".tmp")
    tmp.write_text(json.dumps(info) + "\n", encoding="utf-8")
    os.replace(tmp, directory / MARKER_FILE)
