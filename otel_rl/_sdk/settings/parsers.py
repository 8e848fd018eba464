"""Parsers of option values that name other parts' inputs: engine metrics endpoints
(``engine_endpoints``, read by ``engine_scrape``) and profiler step windows (``profile_steps``,
opened by ``profiling``). Here, beside the configuration that parses them, so that reading the
configuration does not import the parts that use it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from otel_rl._sdk.settings.redaction import redact_url

__all__ = ["Window", "endpoint_url", "parse_endpoints", "parse_profile_steps"]


def _redacted(url: str) -> str:
    """The URL without user:password, query values or fragment (any may hold a token), for messages."""
    return str(redact_url(url))


def endpoint_url(endpoint: str) -> str:
    """``host:port``, ``http://host:port`` or a full URL -> the URL of the engine's metrics page."""
    text = endpoint.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError:
        raise ValueError(f"bad port in {_redacted(text)!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected http(s)://host:port[/metrics], got {_redacted(endpoint)!r}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path if parts.path not in ("", "/") else "/metrics", parts.query, ""))


def comma_list(raw: Any, expected: str) -> list[str]:
    """The stripped, non-empty items of a comma-separated string or a list of strings (else
    ValueError saying what was ``expected``)."""
    if isinstance(raw, str):
        items = raw.split(",")
    elif isinstance(raw, (list, tuple)) and all(isinstance(i, str) for i in raw):
        items = list(raw)
    else:
        raise ValueError(expected)
    return [i.strip() for i in items if i.strip()]


def parse_endpoints(raw: Any) -> tuple[str, ...]:
    """``init(engine_endpoints=...)``: a comma-separated string or a list of endpoints."""
    items = comma_list(raw, "expected a comma-separated list of engine endpoints (http://127.0.0.1:8000/metrics)")
    return tuple(dict.fromkeys(endpoint_url(i) for i in items))


Window = tuple[int, int]
_STEPS_HINT = "expected steps such as 10-12, 5 or 5,9-11 (non-negative integers, first <= last)"


def _parse_item(item: Any) -> Window:
    if isinstance(item, bool):
        raise ValueError(f"{_STEPS_HINT}; got {item!r}")
    if isinstance(item, int):
        if item < 0:
            raise ValueError(f"{_STEPS_HINT}; got {item!r}")
        return item, item
    if not isinstance(item, str):
        raise ValueError(f"{_STEPS_HINT}; got {item!r}")
    first, dash, last = item.strip().partition("-")
    try:
        window = (int(first), int(last) if dash else int(first))
    except ValueError:
        raise ValueError(f"{_STEPS_HINT}; {item.strip()!r} is not a step or a range") from None
    if window[0] < 0 or window[0] > window[1]:
        raise ValueError(f"{_STEPS_HINT}; {item.strip()!r} is not a range of steps")
    return window


def parse_profile_steps(raw: Any) -> tuple[Window, ...]:
    """``"10-12"``, ``"5"``, ``"5,9-11"``, an int or a list of those -> sorted windows ``(first, last)``,
    inclusive, overlapping ones merged. Bad input raises ValueError naming the bad part."""
    if isinstance(raw, str):
        items: Iterable[Any] = [part for part in raw.split(",") if part.strip()]
    elif isinstance(raw, (list, tuple)):
        items = raw
    else:
        items = [raw]
    windows = sorted(_parse_item(item) for item in items)
    if not windows:
        raise ValueError(f"{_STEPS_HINT}; got {raw!r}")
    merged = [windows[0]]
    for first, last in windows[1:]:
        if first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(last, merged[-1][1]))
        else:
            merged.append((first, last))
    return tuple(merged)
