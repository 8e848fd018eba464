"""What happens to a process's telemetry when the process forks or is asked to terminate.

Fork (a DataLoader worker, ``multiprocessing`` with the fork start method, a bare ``os.fork``):
the child gets a copy of the parent's Telemetry, whose worker threads do not exist in the child
and whose locks may have been held at the moment of the fork. Using it there would deadlock or
send the parent's data a second time, so the child's copy is switched off at once
(``os.register_at_fork``): its ``log()`` calls are dropped and counted
(``Telemetry.dropped_calls``), reported once, and never block; its exporters refuse to write
(see the fork guards in ``_providers``). A child that wants telemetry of its own calls
``otel_rl.init()``; a spawned child starts clean.

SIGTERM (what launchers, schedulers and ``kill`` send): Python's default ends the process
without running ``atexit``, losing what the batch processors still hold. When no handler is
installed yet, otel-rl installs one that shuts telemetry down (bounded by
``SIGTERM_FLUSH_TIMEOUT_S``) and then ends the process with SIGTERM exactly as before. A handler
the application installs, before or after, takes precedence.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("otel_rl")

SIGTERM_FLUSH_TIMEOUT_S = 5.0

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_fork_hook_registered = False
_sigterm_installed = False


def track(telemetry: Any) -> None:
    """Watch ``telemetry`` for fork and SIGTERM (idempotent hooks, one set per process)."""
    global _fork_hook_registered
    with _lock:
        _live.add(telemetry)
        if not _fork_hook_registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_registered = True
    _install_sigterm_handler()


def exit_hook(telemetry: Any) -> Callable[[], None]:
    """The function ``atexit`` calls to shut ``telemetry`` down: one per instance, holding it weakly
    (an exit hook must not keep a dropped instance alive)."""
    ref = weakref.ref(telemetry)

    def shutdown_at_exit() -> None:
        live = ref()
        if live is not None:
            live.shutdown()

    return shutdown_at_exit


def _after_fork_in_child() -> None:
    # Runs in the child right after fork, before any other code: touch no lock the parent held.
    global _sigterm_installed
    parent = os.getppid()
    for telemetry in list(_live):
        try:
            telemetry._disable_in_forked_child(parent)
        except Exception:  # noqa: BLE001 - the child must start whatever happens here
            pass
    # The inherited handler has nothing to flush here, and a Python handler can miss a SIGTERM that
    # lands just before the main thread blocks (a Pool worker waiting for its next task), which
    # Pool.terminate() then waits on forever: the child gets the default back. Its own init() sets ours again.
    if _sigterm_installed:
        _sigterm_installed = False
        try:
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except (ValueError, OSError):  # forked from a thread other than the main one
            pass


def _install_sigterm_handler() -> None:
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # the application (or its framework) handles SIGTERM: leave it alone
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True
    except (ValueError, OSError, AttributeError):  # no signals here (an embedded interpreter)
        pass


def _on_sigterm(signum: int, frame: Any) -> None:
    live = [t for t in list(_live) if not t.closed]
    if live:
        # In a thread, joined with a timeout: the main thread may have been interrupted while
        # holding a lock the shutdown needs (a flush in progress), which must not hang the exit.
        worker = threading.Thread(target=_shutdown_all, args=(live,), name="otel-rl-sigterm", daemon=True)
        worker.start()
        worker.join(SIGTERM_FLUSH_TIMEOUT_S + 1.0)
    # End the process as SIGTERM's default would have (exit status, no further Python code).
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def _shutdown_all(live: list[Any]) -> None:
    for telemetry in live:
        try:
            telemetry.shutdown(SIGTERM_FLUSH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001
            logger.warning("otel-rl: shutting telemetry down on SIGTERM failed: %r", exc)
