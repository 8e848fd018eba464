"""Which connections the bridge keeps: at most ``total`` open, at most ``per_client`` from one address.

Each open connection holds one of the server's threads, so idle connections alone could exhaust
them (2,000 kept-open sockets held 2,004 threads). A connection over the address's share is
closed at once. When every place is taken, a new connection from an address with fewer
connections than the busiest one takes the place of that address's longest idle connection (one
waiting between requests, not reading or answering one): the idle one is shut, and its sender,
like any HTTP client whose keep-alive connection was closed, reconnects when it next sends.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ConnectionTable"]


@dataclass
class _Connection:
    client: str
    sock: Any
    idle_since: float | None = field(default_factory=time.monotonic)  # None while a request is handled


class ConnectionTable:
    """The open connections by socket (thread-safe); :meth:`admit` before a connection is served."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total, self.per_client = total, per_client
        self._lock = threading.Lock()
        self._open: dict[int, _Connection] = {}  # id(socket) -> connection
        self._by_client: dict[str, int] = {}

    def admit(self, client: str, sock: Any) -> bool:
        """Take a new connection from ``client``; False when it must be closed (over its address's share,
        or every place taken and no busier address has an idle connection to give up)."""
        victim = None
        with self._lock:
            mine = self._by_client.get(client, 0)
            if mine >= self.per_client:
                return False
            if len(self._open) >= self.total:
                victim = self._idle_of_busiest(mine)
                if victim is None:
                    return False
                self._forget(victim.sock)
            self._open[id(sock)] = _Connection(client, sock)
            self._by_client[client] = mine + 1
        if victim is not None:
            try:  # wakes its thread, which is waiting for a request line: it reads EOF and ends
                victim.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return True

    def busy(self, sock: Any, busy: bool) -> None:
        """Mark a connection handling a request (not evictable) or back to waiting for the next one."""
        with self._lock:
            connection = self._open.get(id(sock))
            if connection is not None:
                connection.idle_since = None if busy else time.monotonic()

    def close(self, sock: Any) -> None:
        """The connection ended (or was refused): its place is free."""
        with self._lock:
            self._forget(sock)

    def counts(self) -> tuple[int, int]:
        """(open connections, addresses they come from)."""
        with self._lock:
            return len(self._open), len(self._by_client)

    def _forget(self, sock: Any) -> None:
        connection = self._open.pop(id(sock), None)
        if connection is not None:
            left = self._by_client[connection.client] - 1
            if left:
                self._by_client[connection.client] = left
            else:
                del self._by_client[connection.client]

    def _idle_of_busiest(self, mine: int) -> _Connection | None:
        """The longest idle connection of an address holding more connections than ``mine + 1``."""
        best: _Connection | None = None
        best_key: tuple[int, float] | None = None
        for connection in self._open.values():
            held = self._by_client[connection.client]
            if connection.idle_since is None or held <= mine + 1:
                continue
            key = (-held, connection.idle_since)
            if best_key is None or key < best_key:
                best, best_key = connection, key
        return best
