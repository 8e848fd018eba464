"""OTLP/HTTP posts on one kept-alive ``http.client`` connection, for a collector URL that needs
nothing ``requests`` adds: plaintext ``http``, no user:password in it, no proxy for it in the
environment, no ``~/.netrc`` entry for its host, no credential provider (a node's own agent, as a
rank usually sends to).

A post through ``requests`` costs a sender ~1.5 ms of CPU at a request every few seconds (its
session merges settings, prepares the request, wraps urllib3's pool and builds a response object);
the same post on ``http.client`` costs ~0.4 ms. Any other URL keeps the ``requests`` session,
with its proxies, TLS and credential providers.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from otel_rl._sdk.otlp.settings import OtlpSettings

__all__ = ["PlainHttpPoster", "plain_http_target"]


def plain_http_target(settings: OtlpSettings) -> tuple[str, int, str] | None:
    """``(host, port, path)`` of the settings' URL when a post there needs nothing ``requests``
    adds (see the module docstring); None otherwise. The environment is read here, once: a proxy
    variable set after ``init()`` applies from the next start (as for the ``requests`` session)."""
    if settings.credential_provider:
        return None
    parts = urlsplit(settings.endpoint)
    if parts.scheme != "http" or parts.username is not None or parts.password is not None or not parts.hostname:
        return None
    from requests.utils import get_environ_proxies, get_netrc_auth, select_proxy

    if select_proxy(settings.endpoint, get_environ_proxies(settings.endpoint)) or get_netrc_auth(settings.endpoint):
        return None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port or 80, path


class PlainHttpPoster:
    """POSTs bytes to one URL on a connection kept open between posts; one post at a time."""

    def __init__(self, host: str, port: int, path: str, headers: Mapping[str, str]) -> None:
        self.host, self.port, self.path = host, port, path
        self.headers = dict(headers)
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def post(self, body: bytes, timeout_s: float) -> tuple[int, str]:
        """``(status, reason)`` of the response; OSError or HTTPException when none came. A kept
        connection the collector closed meanwhile is opened again once, as ``requests`` does."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            reused = self._connection is not None
            try:
                return self._post_locked(body, deadline)
            except (OSError, http.client.HTTPException):
                if not reused or deadline - time.monotonic() <= 0:
                    raise
            return self._post_locked(body, deadline)  # on a new connection

    def _post_locked(self, body: bytes, deadline: float) -> tuple[int, str]:
        left_s = max(deadline - time.monotonic(), 0.001)
        if self._connection is None:
            self._connection = http.client.HTTPConnection(self.host, self.port, timeout=left_s)
        connection = self._connection
        try:
            if connection.sock is not None:
                connection.sock.settimeout(left_s)
            connection.request("POST", self.path, body=body, headers=self.headers)
            response = connection.getresponse()
            response.read()  # the whole body, so the connection can carry the next post
        except (OSError, http.client.HTTPException):
            self._close_locked()
            raise
        if response.will_close:
            self._close_locked()
        return response.status, response.reason or ""

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
