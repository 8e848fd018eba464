"""TRL: ``GRPOTrainer(..., callbacks=[OtelRLCallback()])`` traces and meters the run.

Works with the trainers built on ``transformers.Trainer``'s loop (TRL's GRPO, RLOO, DPO, SFT,
online DPO, distillation, ...; a plain ``Trainer`` too)::

    from otel_rl.integrations.trl import OtelRLCallback

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                          callbacks=[OtelRLCallback()])   # keyword arguments go to otel_rl.init()
    trainer.train()

What it does:

* ``on_train_begin`` reuses the telemetry of an earlier ``otel_rl.init()`` or starts one with
  ``framework="trl"`` and the rank, local rank and world size of ``TrainingArguments``
  (``process_index``, ``local_process_index``, ``world_size``); logs the arguments once as
  hyperparameters, without ``hub_token`` or any field named like a token, key, secret or password.
* Each optimizer step is one trace: root span ``rl.step`` with the stages TRL's profiling
  helpers show as children (``generate``, ``compute_log_probs``, ``compute_ref_log_probs``,
  ``compute_rewards``, ``model_update``, ``train_step``) and the step's ``validation`` and
  ``do_checkpoint``. See :mod:`otel_rl.integrations._hf_trainer` for how the stages are found.
* ``on_log`` forwards everything the trainer logs (``semconv/mappings/trl.yaml`` maps the keys).
* ``on_train_end`` flushes, and shuts down the telemetry the callback started itself.

The callback finds its trainer among its callers at ``on_train_begin`` (transformers hands
callbacks none); pass ``trainer=`` when you build the callback after the trainer. TRL < 1.0's
PPOTrainer runs a loop of its own that sends no ``on_step_begin``: its logs arrive, without traces.
"""

from __future__ import annotations

from typing import Any

from otel_rl.semconv import attributes as A

from otel_rl.integrations._hf_trainer import HFCallbackMixin, hparams_from_args

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "otel_rl.integrations.trl needs transformers (and TRL for its stage spans): pip install 'otel-rl[trl]'"
    ) from exc

FRAMEWORK = A.RlFrameworkValues.TRL.value

__all__ = ["OtelRLCallback", "hparams_from_args"]


class OtelRLCallback(HFCallbackMixin, TrainerCallback):
    """A ``transformers.TrainerCallback`` that sends the run to otel-rl (see the module docstring).

    ``trainer``: the trainer, when known (found automatically otherwise). ``main_process_only``:
    start telemetry on the world's rank 0 only (default: every rank, each with its rank).
    Other keyword arguments go to ``otel_rl.init()`` (``run_dir``, ``track_with``, ...).
    """

    framework = FRAMEWORK

    def __init__(self, *, trainer: Any = None, main_process_only: bool = False, **init_kwargs: Any) -> None:
        self._otel_setup(trainer, main_process_only, **init_kwargs)
