"""Reading text files whose content nobody vouches for: regular files only, lines of bounded length.

A log or run-folder path may name a FIFO (``open`` blocks until a writer comes, ``read`` until it
closes), a device (``/dev/zero`` never ends) or a file with one line of gigabytes. The readers
refuse anything but a regular file up front, and read in bounded chunks, skipping any line longer
than :data:`MAX_LINE_BYTES` (it is reported by its number), so memory stays bounded by the file's
ordinary lines.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["MAX_LINE_BYTES", "NotRegularFileError", "bounded_lines", "read_bounded", "require_regular_file"]

#: Longest line read (bytes, newline included); longer lines are skipped and reported.
MAX_LINE_BYTES = 16 * 1024 * 1024
_CHUNK = 1024 * 1024


class NotRegularFileError(ValueError):
    """The path exists but is a FIFO, a device, a socket...: reading it could block or never end."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def require_regular_file(path: str | os.PathLike[str]) -> None:
    """Raise :class:`NotRegularFileError` naming ``path`` unless it is a regular file (or a folder).

    ``FileNotFoundError`` propagates for a path that does not exist."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    raise NotRegularFileError(f"{os.fspath(path)} is {_kind(mode)}: a regular file is needed (copy the data into a file first)")


def read_bounded(path: str | os.PathLike[str], limit: int = MAX_LINE_BYTES) -> tuple[bytearray, list[tuple[int, int]]]:
    """The content of the regular file ``path``, with each line longer than ``limit`` bytes replaced
    by an empty line (line numbers stay right), and ``(line number, bytes)`` of each such line.

    Reads ``limit``-bounded chunks: a line of any length never sits in memory whole. The content
    grows in one buffer (a list of parts joined at the end holds the file twice)."""
    require_regular_file(path)
    chunk_size = max(1, min(_CHUNK, limit))
    parts = bytearray()
    skipped: list[tuple[int, int]] = []
    pending: list[bytes] = []  # the current line's bytes so far (while it is within the limit)
    pending_len = 0
    long_line = False  # the current line went past the limit: its bytes are dropped
    lines = 0  # complete lines so far
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            first = chunk.find(b"\n")
            if first < 0:
                pending_len += len(chunk)
                if not long_line:
                    pending.append(chunk)
                    if pending_len > limit:
                        long_line, pending = True, []
                continue
            # the current line ends in this chunk
            pending_len += first + 1
            lines += 1
            if long_line or pending_len > limit:
                skipped.append((lines, pending_len))
                parts += b"\n"
            else:
                for piece in pending:
                    parts += piece
                parts += chunk[: first + 1]
            last = chunk.rfind(b"\n")
            if last > first:
                # complete lines between: each shorter than the chunk, so within the limit
                parts += memoryview(chunk)[first + 1 : last + 1]
                lines += chunk.count(b"\n", first + 1, last + 1)
            tail = chunk[last + 1 :]
            pending, pending_len, long_line = ([tail] if tail else []), len(tail), False
    if long_line or pending_len > limit:
        skipped.append((lines + 1, pending_len))
    else:
        for piece in pending:
            parts += piece
    return parts, skipped


def bounded_lines(f: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None, int]]:
    """``(line number, line, length)`` of each line of ``f``; ``line`` is None for a line longer
    than ``limit`` bytes, which is skipped in bounded reads."""
    number = 0
    while line := f.readline(limit + 1):
        number += 1
        if len(line) <= limit:
            yield number, line, len(line)
            continue
        length = len(line)
        while not line.endswith(b"\n"):
            line = f.readline(_CHUNK)
            if not line:
                break
            length += len(line)
        yield number, None, length
