"""Which requests the bridge reads now: a fixed number of request slots, shared fairly by address.

A slot is held while a request's body is read, decoded and queued; it bounds the memory that
bodies in progress take. One address holds at most ``per_client`` slots (its requests waiting
for one included), so a flood from one host, or senders that stall mid-body, cannot take every
slot. A request that finds every slot taken waits a short while; a freed slot goes to the
waiting request whose address holds the fewest slots, then whose address held slots the fewest
seconds lately (decayed, half-life ``USAGE_HALF_LIFE_S``), then the earliest. So a sender that has
nothing in flight is served next however busy the others keep the bridge, and among those, one
that sends a small batch now and then goes before hosts that keep asking again the moment they are
answered (asking first is no advantage: they always have a request waiting).

Slots are held while bodies arrive, so senders that send just fast enough could keep every slot
for minutes (a 60 MB body at 100 KiB/s). When a request has waited ``cut_after_s`` and no slot is
free, the slowest body in progress (read for over a second, slower than ``cut_below_rate``) of an
address holding more slots than the waiter's is cut off (its reading side shut: the sender is
answered 408) and its slot goes to the waiter. A collector's batch arrives in milliseconds and is
never cut.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Admission", "ClientSlots", "Slot"]

CUT_AFTER_S = 0.5  # how long a request waits for a free slot before a slow body is cut off for it
CUT_BELOW_RATE = 1 << 20  # bytes per second: a body arriving slower than this (after a second) may be cut off
USAGE_HALF_LIFE_S = 10.0  # how fast an address's slot-seconds are forgotten
_USAGE_KEPT = 1024  # addresses whose usage is remembered before the negligible ones are forgotten


@dataclass(eq=False)
class Slot:
    """One held slot: whose it is and how its body is arriving (the handler updates both)."""

    client: str
    taken_at: float = field(default_factory=time.monotonic)
    reading_since: float | None = None  # time.monotonic() the body began to arrive; None when not reading
    received: int = 0
    cut: Callable[[], None] | None = None  # shuts the body's reading side (set by the handler)
    was_cut: bool = False
    released: bool = False  # given back (the handler gives it back before answering, and again in a finally)

    def rate(self, now: float) -> float:
        """Bytes per second the body has arrived at so far (inf when not reading or too young to judge)."""
        if self.reading_since is None or now - self.reading_since < 1.0:
            return float("inf")
        return self.received / (now - self.reading_since)


@dataclass(frozen=True)
class Admission:
    """The answer to :meth:`ClientSlots.acquire`: ``admitted``, or why not (a line for the sender)."""

    admitted: bool
    why: str = ""
    per_client: bool = False  # refused because its address holds its share already
    slot: Slot | None = field(default=None, compare=False)  # the slot taken, when admitted


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
        self._slots: list[Slot] = []  # the held slots
        self._usage: dict[str, tuple[float, float]] = {}  # address -> (slot-seconds, as of this monotonic time)
        self.cut_after_s, self.cut_below_rate = CUT_AFTER_S, CUT_BELOW_RATE

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
            arrived = time.monotonic()
            deadline = arrived + self.wait_s
            admitted = False
            try:
                while not (self._used < self.total and self._next() == ticket):
                    now = time.monotonic()
                    left = deadline - now
                    if left <= 0:
                        return Admission(False, "too many requests in flight")
                    if self._used >= self.total and now - arrived >= self.cut_after_s:
                        self._cut_slowest_for(client, now)
                    self._cond.wait(min(left, max(0.05, arrived + self.cut_after_s - now)))
                self._used += 1
                self._held[client] = self._held.get(client, 0) + 1
                slot = Slot(client)
                self._slots.append(slot)
                admitted = True
                return Admission(True, slot=slot)
            finally:
                self._waiting.remove(ticket)
                if not admitted:
                    self._leave(client)
                self._cond.notify_all()  # the next in line may go now

    def release(self, slot: Slot) -> None:
        """Give back a slot that :meth:`acquire` gave; a slot already given back is left as it is."""
        client = slot.client
        with self._cond:
            if slot.released:
                return
            slot.released = True
            self._slots.remove(slot)
            now = time.monotonic()
            self._usage[client] = (self._usage_of(client, now) + now - slot.taken_at, now)
            if len(self._usage) > _USAGE_KEPT:
                self._forget_negligible_usage(now)
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

    def _cut_slowest_for(self, client: str, now: float) -> None:
        """Cut off the slowest body in progress of an address holding more slots than ``client``."""
        mine = self._held.get(client, 0)
        slow = [
            s
            for s in self._slots
            if not s.was_cut and s.cut is not None and self._held[s.client] > mine and s.rate(now) < self.cut_below_rate
        ]
        if slow:
            victim = min(slow, key=lambda s: s.rate(now))
            victim.was_cut = True
            try:
                victim.cut()  # type: ignore[misc]
            except OSError:  # its sender already left: its slot is on its way back
                pass

    def _next(self) -> tuple[int, str]:
        """The waiting request a free slot goes to: fewest slots held by its address, then least
        slot-time used lately by it, then earliest."""
        now = time.monotonic()
        return min(self._waiting, key=lambda t: (self._held.get(t[1], 0), self._usage_of(t[1], now), t[0]))

    def _usage_of(self, client: str, now: float) -> float:
        seconds, at = self._usage.get(client, (0.0, now))
        return seconds * 0.5 ** ((now - at) / USAGE_HALF_LIFE_S)

    def _forget_negligible_usage(self, now: float) -> None:
        """Bound the table (many addresses, e.g. IPv6 senders): forgetting a small figure only
        helps that address a little; the busiest are kept."""
        ranked = sorted(self._usage, key=lambda c: self._usage_of(c, now), reverse=True)
        for client in ranked[_USAGE_KEPT // 2 :]:
            del self._usage[client]
