"""The bridge process's C allocator, told to give large buffers back.

A request body is inflated, scanned and decoded in buffers of up to 20 MiB, on whichever of the
server's threads read it. glibc's malloc raises its mmap threshold after each such buffer is
freed (up to 32 MiB), so the next ones come from per-thread arenas that keep what they held:
measured under 4 senders of 18 MiB bodies, the bridge's peak RSS was 200-350 MB for ~90 MB of
live data. A fixed threshold (buffers over 256 KiB are mapped and unmapped whole) and two
arenas keep the peak near the live size (90-110 MB in the same test). Only ``otel-rl bridge``
calls this, at its start: it changes the whole process's allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["give_large_buffers_back"]

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters (malloc.h)
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 256 << 10
ARENAS = 2


def give_large_buffers_back() -> bool:
    """Set glibc's mmap threshold and arena count for this process; False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt, nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_ARENA_MAX, ARENAS))
