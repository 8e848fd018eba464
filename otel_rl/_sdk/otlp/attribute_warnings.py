"""The SDK's warnings about attribute values, said once per key instead of at every span or event.

The SDK cleans each attribute set it is handed (``opentelemetry.attributes``): a value of another
type becomes its ``str()``, a string past the length limit is cut, an empty key is dropped, and
each time it logs a warning that does not name the key. A stage span's attribute that is too long,
or a non-OTLP value, would print one line a step for the whole run. While otel-rl builds its own
spans and events (on its worker), those warnings are held and said once per place and key, with
the key named; the SDK still cleans the values as before, and warnings of any other thread pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry.attributes import BoundedAttributes

_SDK_LOGGER = "opentelemetry.attributes"
_local = threading.local()
_install_lock = threading.Lock()
_installed = False


class _HeldOnThisThread(logging.Filter):
    """Holds the SDK's attribute warnings of a thread inside :func:`held_warnings`; passes all others."""

    def filter(self, record: logging.LogRecord) -> bool:
        held = getattr(_local, "held", None)
        if held is None:
            return True
        held.append(record)
        return False


def _install() -> None:
    global _installed
    with _install_lock:
        if not _installed:
            logging.getLogger(_SDK_LOGGER).addFilter(_HeldOnThisThread())
            _installed = True


@contextmanager
def held_warnings() -> Iterator[list[logging.LogRecord]]:
    """The SDK's attribute warnings logged on this thread within the block, held back from its log."""
    if not _installed:
        _install()
    previous = getattr(_local, "held", None)
    held: list[logging.LogRecord] = []
    _local.held = held
    try:
        yield held
    finally:
        _local.held = previous


def say_once(
    held: list[logging.LogRecord],
    where: str,
    attributes: Mapping[str, Any] | None,
    later: Any,
    max_value_len: int | None,
    report: Callable[[str, str, str], Any],
) -> None:
    """Name the keys behind ``held`` warnings (each pair cleaned alone by the SDK again, its warnings
    held) and ``report(key, reason, message)`` each, once per place, key and kind of warning."""
    if not held:
        return
    named = False
    for key, value in list((attributes or {}).items()) + list(later or ()):
        with held_warnings() as alone:
            BoundedAttributes(None, {key: value}, immutable=False, max_value_len=max_value_len)
        for record in alone:
            named = True
            report(
                f"{where} {key!r}",
                str(record.msg),
                f"otel-rl: {where}, attribute {key!r}: {record.getMessage()} (the SDK's cleaning; said once for this key)",
            )
    if not named:  # not reproduced pair by pair: said once per place and kind, unnamed
        for record in held:
            report(where, str(record.msg), f"otel-rl: {where}: {record.getMessage()} (the SDK's cleaning; said once)")
