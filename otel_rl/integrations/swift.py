"""ms-swift: ``--callbacks otel_rl`` traces and meters a ``swift rlhf --rlhf_type grpo`` run.

ms-swift 4.x builds a trainer's callbacks from ``--callbacks NAME ...`` through its registry
``swift.callbacks.callbacks_map`` (``callbacks_map[name](args, trainer)``, swift/trainers/mixin.py),
and imports ``--external_plugins FILE.py`` before that. Importing this module registers
:class:`OtelRLSwiftCallback` as ``otel_rl``, so a one-line plugin file enables it::

    # otel_rl_plugin.py
    import otel_rl.integrations.swift

    swift rlhf --rlhf_type grpo ... --external_plugins otel_rl_plugin.py --callbacks otel_rl

(Name the plugin file anything but ``swift.py``: ms-swift imports it by its file name.) ms-swift
3.x has no ``--callbacks``; its plugin file appends an instance instead::

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

import logging
from typing import Any

from otel_rl.semconv import attributes as A

from otel_rl.integrations._hf_trainer import HFCallbackMixin

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("otel_rl.integrations.swift needs ms-swift and transformers: pip install 'otel-rl[swift]'") from exc

logger = logging.getLogger("otel_rl")

FRAMEWORK = A.RlFrameworkValues.SWIFT.value
CALLBACK_NAME = "otel_rl"

__all__ = ["CALLBACK_NAME", "OtelRLSwiftCallback", "register"]


class OtelRLSwiftCallback(HFCallbackMixin, TrainerCallback):
    """An ms-swift callback (``callbacks_map[name](args, trainer)``) that sends the run to otel-rl.

    Built by ms-swift with its arguments and trainer; built by hand it takes neither (the trainer
    is found at ``on_train_begin``). Keyword arguments go to ``otel_rl.init()``.
    """

    framework = FRAMEWORK

    def __init__(self, args: Any = None, trainer: Any = None, *, main_process_only: bool = False,
                 **init_kwargs: Any) -> None:
        self.args = args  # as ms-swift's own TrainerCallback base keeps it
        self._otel_setup(trainer, main_process_only, **init_kwargs)


def register(name: str = CALLBACK_NAME) -> bool:
    """Make ``--callbacks NAME`` build :class:`OtelRLSwiftCallback`. False without ms-swift 4.x."""
    try:
        from swift.callbacks import callbacks_map
    except Exception as exc:  # ms-swift's import pulls in a lot: any part of it may be missing
        logger.debug("otel-rl: ms-swift's callbacks_map is not importable (%s: %s)", type(exc).__name__, exc)
        return False
    callbacks_map[name] = OtelRLSwiftCallback
    return True


# ms-swift imports the user's plugin file, which imports this module: register now.
register()
