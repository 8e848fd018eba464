"""ms-swift: ``--callbacks otel_rl`` (or ``SwiftInstrumentor().instrument()``) traces and meters a GRPO run.

ms-swift 4.x builds a trainer's callbacks from ``--callbacks NAME ...`` through its registry
``swift.callbacks.callbacks_map`` (``callbacks_map[name](args, trainer)``, swift/trainers/mixin.py),
and imports ``--external_plugins FILE.py`` before that. Importing this module registers
:class:`OtelRLSwiftCallback` as ``otel_rl``, so a one-line plugin file enables it::

    # otel_rl_plugin.py
    import otel_rl.integrations.swift

    swift rlhf --rlhf_type grpo ... --external_plugins otel_rl_plugin.py --callbacks otel_rl

(Name the plugin file anything but ``swift.py``: ms-swift imports it by its file name.) With
:class:`SwiftInstrumentor` the plugin file needs no ``--callbacks`` flag, on ms-swift 4.x and 3.x::

    # otel_rl_plugin.py
    from otel_rl.integrations.swift import SwiftInstrumentor
    SwiftInstrumentor().instrument()   # keyword arguments go to the callback (and otel_rl.init())

On 4.x it registers ``otel_rl`` and gives every trainer built afterwards the callback (one it
already holds from ``--callbacks otel_rl`` is kept); on 3.x, which has no ``--callbacks``, it
appends one to ``swift.plugin.extra_callbacks``, as a 3.x plugin file would by hand::

    from swift.plugin import extra_callbacks
    from otel_rl.integrations.swift import OtelRLSwiftCallback
    extra_callbacks.append(OtelRLSwiftCallback())

The callback is the TRL one (:mod:`otel_rl.integrations.trl`) with ``framework="swift"``:
ms-swift's GRPOTrainer is TRL's GRPOTrainer underneath, its ``profiling_context``
(swift/rlhf_trainers/utils.py) marks the same stages, and the keys it logs (its progress fields
``global_step/max_steps``, ``elapsed_time``, ``train_speed(s/it)``, ``memory(GiB)`` ...) are
mapped by ``semconv/mappings/swift.yaml``. ms-swift adds those progress fields to the log dict
in its own progress callback; this callback moves itself behind it to forward them.
Settings for ``otel_rl.init()`` come from the ``OTEL_*`` / ``OTEL_RL_*`` environment.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, MutableMapping, MutableSequence
from typing import Any

from otel_rl.integrations._hf_instrument import attach_to_new_trainers
from otel_rl.integrations._hf_trainer import HFCallbackMixin
from otel_rl.integrations.base import Instrumentor
from otel_rl.semconv import attributes as A

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("otel_rl.integrations.swift needs ms-swift and transformers: pip install 'otel-rl[swift]'") from exc

logger = logging.getLogger("otel_rl")

FRAMEWORK = A.RlFrameworkValues.SWIFT.value
CALLBACK_NAME = "otel_rl"

__all__ = ["CALLBACK_NAME", "OtelRLSwiftCallback", "SwiftInstrumentor", "register"]


class OtelRLSwiftCallback(HFCallbackMixin, TrainerCallback):
    """An ms-swift callback (``callbacks_map[name](args, trainer)``) that sends the run to otel-rl.

    Built by ms-swift with its arguments and trainer; built by hand it takes neither (the trainer
    is found at ``on_train_begin``). Keyword arguments go to ``otel_rl.init()``.
    """

    framework = FRAMEWORK

    def __init__(self, args: Any = None, trainer: Any = None, *, main_process_only: bool = False, **init_kwargs: Any) -> None:
        self.args = args  # as ms-swift's own TrainerCallback base keeps it
        self._otel_setup(trainer, main_process_only, **init_kwargs)


def register(name: str = CALLBACK_NAME) -> bool:
    """Make ``--callbacks NAME`` build :class:`OtelRLSwiftCallback` (what importing this module
    does: ``SwiftInstrumentor`` instrumented on import, registering only). False without ms-swift 4.x."""
    callbacks_map = _callbacks_map()
    if callbacks_map is None:
        return False
    SwiftInstrumentor().instrument_on_import(callback_name=name, attach_to_trainers=False)
    registered = callbacks_map.get(name)
    if getattr(registered, "func", registered) is not OtelRLSwiftCallback:  # instrumented under another name
        callbacks_map[name] = OtelRLSwiftCallback
    return True


def _callbacks_map() -> MutableMapping[str, Any] | None:
    """ms-swift 4.x's registry of ``--callbacks`` names; None without it."""
    try:
        from swift.callbacks import callbacks_map
    except Exception as exc:  # ms-swift's import pulls in a lot: any part of it may be missing
        logger.debug("otel-rl: ms-swift's callbacks_map is not importable (%s: %s)", type(exc).__name__, exc)
        return None
    return callbacks_map


def _extra_callbacks() -> MutableSequence[Any] | None:
    """ms-swift 3.x's list of callbacks every trainer gets (``swift.plugin.extra_callbacks``); None without it."""
    try:
        from swift.plugin import extra_callbacks
    except Exception as exc:
        logger.debug("otel-rl: ms-swift's extra_callbacks is not importable (%s: %s)", type(exc).__name__, exc)
        return None
    return extra_callbacks


class SwiftInstrumentor(Instrumentor):
    """ms-swift trainers send their runs to otel-rl: :class:`OtelRLSwiftCallback` on each.

    ``instrument(callback_name="otel_rl", attach_to_trainers=True, main_process_only=False,
    **init_kwargs)``: on ms-swift 4.x, registers ``--callbacks callback_name`` and (with
    ``attach_to_trainers``) gives every trainer built afterwards the callback; on 3.x, appends one
    callback to ``swift.plugin.extra_callbacks``. Other keyword arguments go to the callback.
    ``uninstrument()`` undoes that; trainers built before keep their callback.
    """

    pip_extra = "swift"

    def instrumentation_dependencies(self) -> Collection[str]:
        # 4.x: --callbacks and callbacks_map; 3.x: swift.plugin.extra_callbacks (the swift extra's floor).
        return ("ms-swift >= 3.0",)

    def _instrument(
        self, *, callback_name: str = CALLBACK_NAME, attach_to_trainers: bool = True, main_process_only: bool = False, **init_kwargs: Any
    ) -> None:
        callbacks_map = _callbacks_map()
        if callbacks_map is not None:
            # ms-swift builds it as callbacks_map[name](args, trainer): the options ride along.
            factory: Any = OtelRLSwiftCallback
            if main_process_only or init_kwargs:
                factory = functools.partial(OtelRLSwiftCallback, main_process_only=main_process_only, **init_kwargs)
            self.patches.set_item(callbacks_map, callback_name, factory)
            if attach_to_trainers:

                def callback_for(trainer: Any) -> OtelRLSwiftCallback:
                    return factory(getattr(trainer, "args", None), trainer)

                self.patches.on_restore(attach_to_new_trainers(callback_for, self.pip_extra or "swift"))
            return
        extra_callbacks = _extra_callbacks()
        if extra_callbacks is None:
            raise ImportError(
                "otel_rl.integrations.swift found neither ms-swift 4.x's swift.callbacks.callbacks_map "
                "nor 3.x's swift.plugin.extra_callbacks: pip install 'otel-rl[swift]'"
            )
        self.patches.append(extra_callbacks, OtelRLSwiftCallback(main_process_only=main_process_only, **init_kwargs))


# ms-swift imports the user's plugin file, which imports this module: register now.
register()
