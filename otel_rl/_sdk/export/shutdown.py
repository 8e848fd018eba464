"""Shut the SDK providers down within one deadline, whatever their exporters wait for.

The SDK's OTLP exporters wait their own timeout (10 s, then retries) on a collector that accepts
connections and never answers, and the span and log providers' ``shutdown()`` takes no timeout
at all: they held a process's exit for 13 s against a 2 s shutdown timeout. The signals shut down
in a daemon thread, and the caller waits for it only until the deadline; what the signals not shut
down by then still held is not delivered, and that is said once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

logger = logging.getLogger("otel_rl")


def _shut(providers: Sequence[Any], timeout_ms: int) -> None:
    for provider in providers:
        try:
            if hasattr(provider, "get_meter"):  # the meter provider bounds its readers' final export itself
                provider.shutdown(timeout_millis=timeout_ms)
            else:
                provider.shutdown()
        except Exception as exc:  # noqa: BLE001 - shutdown never raises into the caller
            logger.warning("otel-rl: shutting down %s failed: %s", type(provider).__name__, exc)


def shutdown_within(
    parts: Mapping[str, Sequence[Any]],
    timeout_s: float,
    destinations: Sequence[str],
    hint: str = "",
    held: Callable[[str], int] | None = None,
) -> list[str]:
    """Shut down each signal's providers (``{"traces": [...], ...}``) in turn, waiting at most
    ``timeout_s`` in all; the signals not shut down at the deadline (reported once, here, with ``hint``).
    ``held(signal)``: the records a signal's queues still held at the deadline, said with it.

    In turn, in one thread, as before: the disk spool closes itself when its last signal closes, so
    a signal shut down beside another still delivering would cut that one short."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    done: list[str] = []

    def shut_all() -> None:
        for signal, providers in parts.items():
            _shut(providers, max(0, int((deadline - time.monotonic()) * 1000)))
            done.append(signal)

    thread = threading.Thread(target=shut_all, name="otel-rl-shutdown", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    unfinished = [signal for signal in parts if signal not in done]
    if unfinished:
        logger.warning(
            "otel-rl: shutdown stopped waiting after %.1f s: the %s it had not finished were not delivered to %s "
            "(the destination did not answer in time).%s",
            timeout_s,
            ", ".join(_with_held(signal, held) for signal in unfinished),
            "; ".join(destinations) or "the exporters",
            hint,
        )
    return unfinished


def _with_held(signal: str, held: Callable[[str], int] | None) -> str:
    """The signal, with the records its queues held at the deadline where there were any (they may
    still be written, in part, by the export that was running: at most this many are missing)."""
    count = held(signal) if held is not None else 0
    return f"{signal} ({count:,} record{'s' if count != 1 else ''} still queued or being written)" if count else signal
