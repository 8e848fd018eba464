"""Give every ``transformers.Trainer`` built while an instrumentor is active an otel-rl callback.

TRL's trainers and ms-swift's are ``transformers.Trainer`` subclasses, and every one of them runs
``Trainer.__init__``: wrapping it reaches trainers whatever their class and wherever they are
built. The wrapper adds the callback after the original ``__init__`` (through the public
``Trainer.add_callback``) unless the trainer already holds an otel-rl callback (one the user
passed, or ms-swift's ``--callbacks otel_rl``): one callback per trainer.

Several instrumentors (TRL, ms-swift) may be active at once: they share one wrapper, put in place
by the first and removed with the last; the earliest active one builds the callback.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from otel_rl.integrations._hf_trainer import HFCallbackMixin

logger = logging.getLogger("otel_rl")

CallbackFactory = Callable[[Any], Any]  # trainer -> a TrainerCallback for it

_factories: list[CallbackFactory] = []  # of the active instrumentors, earliest first
_state: dict[str, Any] = {}  # "trainer_class", "original", "wrapper" while the wrapper is in place
_lock = threading.Lock()
_reported: set[str] = set()


def attach_to_new_trainers(factory: CallbackFactory, pip_extra: str) -> Callable[[], None]:
    """From now on, give each new ``transformers.Trainer`` the callback ``factory(trainer)``.

    Returns the function that stops it. ImportError (naming ``pip_extra``) without transformers.
    """
    try:
        from transformers import Trainer
    except ImportError as exc:
        raise ImportError(f"otel-rl's trainer instrumentation needs transformers: pip install 'otel-rl[{pip_extra}]'") from exc
    with _lock:
        if not _factories:
            _wrap_init(Trainer)
        _factories.append(factory)

    def detach() -> None:
        with _lock:
            if factory in _factories:
                _factories.remove(factory)
            if not _factories:
                _unwrap_init()

    return detach


def _wrap_init(trainer_class: type) -> None:
    original = trainer_class.__dict__["__init__"]

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _attach(self)

    trainer_class.__init__ = __init__  # type: ignore[method-assign]
    _state.update(trainer_class=trainer_class, original=original, wrapper=__init__)


def _unwrap_init() -> None:
    if not _state:
        return
    trainer_class, original, wrapper = _state.pop("trainer_class"), _state.pop("original"), _state.pop("wrapper")
    if trainer_class.__dict__.get("__init__") is wrapper:  # leave a later patch by someone else alone
        trainer_class.__init__ = original
    else:
        logger.debug("otel-rl: transformers.Trainer.__init__ was replaced again since; left as it is")


def _attach(trainer: Any) -> None:
    """Add the earliest active instrumentor's callback, unless the trainer holds an otel-rl one."""
    factories = tuple(_factories)
    if not factories:
        return  # detached since: a wrapper someone else kept in place still calls this
    try:
        handler = getattr(trainer, "callback_handler", None)
        callbacks = getattr(handler, "callbacks", None)
        if callbacks is None or any(isinstance(c, HFCallbackMixin) for c in callbacks):
            return
        trainer.add_callback(factories[0](trainer))
    except Exception:  # building the trainer goes on without telemetry
        if "attach" not in _reported:
            _reported.add("attach")
            logger.warning(
                "otel-rl: could not add the otel-rl callback to a %s; it trains without it (reported once)",
                type(trainer).__name__,
                exc_info=True,
            )
