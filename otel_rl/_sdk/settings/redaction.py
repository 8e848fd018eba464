"""One way to make a URL or a message safe to print, log or store.

Collector and engine URLs may carry credentials in three places: ``user:password@`` in the
authority, token values in the query string (``?token=...``) and, more rarely, the fragment.
:func:`redact_url` removes all three while keeping the URL recognisable (scheme, host, port, path
and the query's keys); :func:`redact_text` does the same for every URL or query string inside a
free-text message (a ``requests`` error names the URL it failed on); :func:`redact_library_logs`
installs a filter on the loggers of the OpenTelemetry exporters, whose own warnings quote the URL
they could not reach.

This module imports nothing from otel_rl, so every layer (config, spool, engine scraper, push, demo)
can use it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["MASK", "RedactingFilter", "redact_library_logs", "redact_text", "redact_url"]

MASK = "***"

# A URL with a scheme: up to the first character that cannot be part of one in a message.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{},]+")
# user:password@ before a host where no scheme says it is a URL (a gRPC target as its errors quote it).
_USERINFO = re.compile(r"(?<![\w.+-])[^\s@/:'\"<>()\[\]{},]+:[^\s@/'\"<>()\[\]{},]*@(?=[\w\[])")
# A query parameter's value anywhere (also in a bare "/path?token=..." as urllib3 prints it).
_QUERY_VALUE = re.compile(r"([?&;][^=\s&#'\"<>()?]+=)[^&;\s#'\"<>()]*")


def redact_url(url: str | None) -> str | None:
    """``url`` without user:password, with every query value replaced by ``***`` and no fragment.

    ``http://u:p@host:4318/v1?token=x#f`` -> ``http://host:4318/v1?token=***``. A value that is not
    a URL (``host:4317`` for gRPC) is returned with the same masking applied to any query in it."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # not parseable as a URL (bad port, bad IPv6): mask what looks like secrets
        return _QUERY_VALUE.sub(rf"\1{MASK}", url.split("#", 1)[0]).rpartition("@")[2]
    if not parts.scheme or not parts.netloc:
        return _QUERY_VALUE.sub(rf"\1{MASK}", url.split("#", 1)[0]).rpartition("@")[2]
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    if port is not None:
        host += f":{port}"
    query = "&".join(f"{pair.partition('=')[0]}={MASK}" if "=" in pair else MASK for pair in parts.query.split("&") if pair)
    return urlunsplit((parts.scheme, host, parts.path, query, ""))


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`), every ``user:password@`` before a
    host removed and every query value masked."""
    if not text:
        return text
    text = _URL.sub(lambda m: str(redact_url(m.group(0))), text)
    text = _USERINFO.sub("", text)
    return _QUERY_VALUE.sub(rf"\1{MASK}", text)


class RedactingFilter(logging.Filter):
    """Rewrites a log record's message (and its traceback text) with :func:`redact_text`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the library's problem; leave it as it is
            return True
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            # Formatters print exc_text when set; the traceback's exception text names the URL.
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


_FILTER = RedactingFilter()


def redact_library_logs(objects: Iterable[Any]) -> None:
    """Install the redacting filter on the logger of each module that defines the classes of
    ``objects`` (and their bases): libraries log with ``logging.getLogger(__name__)``, and a filter
    only applies to records of the logger it is set on, not its children."""
    for obj in objects:
        for cls in type(obj).__mro__:
            module = cls.__module__
            if module.startswith("opentelemetry."):
                log = logging.getLogger(module)
                if _FILTER not in log.filters:
                    log.addFilter(_FILTER)
