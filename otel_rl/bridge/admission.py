"""Which requests the bridge reads now: a fixed number of request slots, shared fairly by address.

A slot is held while a request's body is read, decoded and queued; it bounds the memory that
bodies in progress take. One address holds at most ``per_client`` slots (its requests waiting
for one included), so a flood from one host, or senders that stall mid-body, cannot take every
slot. A request that finds every slot taken waits a short while; a freed slot goes to the
waiting request whose address holds the fewest slots (the earliest first among equals), so a
sender that has nothing in flight is served next however busy the others keep the bridge.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

__all__ = ["Admission", "ClientSlots"]


@dataclass(frozen=True)
class Admission:
    """The answer to :meth:`ClientSlots.acquire`: ``admitted``, or why not (a line for the sender)."""

    admitted: bool
    why: str = ""
    per_client: bool = False  # refused because its address holds its share already


class ClientSlots:
    """``total`` request slots, at most ``per_client`` held (or waited for) by one address."""

    def __init__(self, total: int, per_client: int, wait_s: float = 2.0, max_waiting: int | None = None) -> None:
        self.total, self.per_client, self.wait_s = total, per_client, wait_s
        self.max_waiting = max_waiting if max_waiting is not None else 4 * total
        self._cond = threading.Condition()
        self._used = 0
        self._held: dict[str, int] = {}  # address -> slots it holds
        self._open: dict[str, int] = {}  # address -> requests it has here (holding or waiting)
        self._waiting: list[tuple[int, str]] = []  # (arrival number, address)
        self._arrivals = itertools.count()

    def acquire(self, client: str) -> Admission:
        """Take a slot for a request from ``client`` (waiting up to ``wait_s``), or say why not."""
        with self._cond:
            if self._open.get(client, 0) >= self.per_client:
                return Admission(
                    False, f"this address has {self.per_client} requests in progress, its share of the bridge", per_client=True
                )
            if len(self._waiting) >= self.max_waiting:
                return Admission(False, "too many requests waiting")
            ticket = (next(self._arrivals), client)
            self._waiting.append(ticket)
            self._open[client] = self._open.get(client, 0) + 1
            deadline = time.monotonic() + self.wait_s
            admitted = False
            try:
                while not (self._used < self.total and self._next() == ticket):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return Admission(False, "too many requests in flight")
                    self._cond.wait(left)
                self._used += 1
                self._held[client] = self._held.get(client, 0) + 1
                admitted = True
                return Admission(True)
            finally:
                self._waiting.remove(ticket)
                if not admitted:
                    self._leave(client)
                self._cond.notify_all()  # the next in line may go now

    def release(self, client: str) -> None:
        """Give back a slot that :meth:`acquire` gave ``client``."""
        with self._cond:
            self._used -= 1
            self._held[client] -= 1
            if not self._held[client]:
                del self._held[client]
            self._leave(client)
            self._cond.notify_all()

    def in_use(self) -> int:
        with self._cond:
            return self._used

    def _leave(self, client: str) -> None:
        self._open[client] -= 1
        if not self._open[client]:
            del self._open[client]

    def _next(self) -> tuple[int, str]:
        """The waiting request a free slot goes to: fewest slots held by its address, then earliest."""
        return min(self._waiting, key=lambda t: (self._held.get(t[1], 0), t[0]))
