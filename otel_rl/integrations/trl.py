"""TRL: ``TrlInstrumentor().instrument()`` (or ``callbacks=[OtelRLCallback()]``) traces and meters the run.

Either instrument once, before the trainers are built::

    from otel_rl.integrations.trl import TrlInstrumentor

    TrlInstrumentor().instrument()   # keyword arguments go to each callback (and otel_rl.init())
    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)
    trainer.train()

which gives every ``transformers.Trainer`` built afterwards an :class:`OtelRLCallback` (one it
already holds is kept; ``uninstrument()`` stops it for trainers built later), or pass the callback
yourself. Works with the trainers built on ``transformers.Trainer``'s loop (TRL's GRPO, RLOO, DPO, SFT,
online DPO, distillation, ...; a plain ``Trainer`` too)::

    from otel_rl.integrations.trl import OtelRLCallback

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                          callbacks=[OtelRLCallback()])   # keyword arguments go to otel_rl.init()

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
* With ``log_samples=K`` (``OTEL_RL_LOG_SAMPLES``), ``on_log`` also hands GRPO's latest completions
  (the prompts, completions, per-function rewards and advantages its ``log_completions`` table
  shows) to ``Telemetry.log_samples``: K per step reach the run folder and the trackers
  (:mod:`otel_rl.integrations._hf_samples`).
* With tools (``GRPOTrainer(tools=...)`` or ``environment_factory``), each completion of a training
  generation batch is an agent trajectory: a turn per generation, a tool span per tool call, its
  reward once TRL scored the batch (:mod:`otel_rl.integrations.trl_tools`).
* ``on_train_end`` flushes, and shuts down the telemetry the callback started itself.

The callback finds its trainer among its callers at ``on_train_begin`` (transformers hands
callbacks none); pass ``trainer=`` when you build the callback after the trainer. TRL < 1.0's
PPOTrainer runs a loop of its own that sends no ``on_step_begin``: its logs arrive, without traces.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from otel_rl.integrations._hf_instrument import attach_to_new_trainers
from otel_rl.integrations._hf_trainer import HFCallbackMixin, hparams_from_args
from otel_rl.integrations.base import Instrumentor
from otel_rl.integrations.trl_tools import ToolRollouts
from otel_rl.semconv import attributes as A

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("otel_rl.integrations.trl needs transformers (and TRL for its stage spans): pip install 'otel-rl[trl]'") from exc

FRAMEWORK = A.RlFrameworkValues.TRL.value

__all__ = ["OtelRLCallback", "TrlInstrumentor", "hparams_from_args"]


class OtelRLCallback(HFCallbackMixin, TrainerCallback):
    """A ``transformers.TrainerCallback`` that sends the run to otel-rl (see the module docstring).

    ``trainer``: the trainer, when known (found automatically otherwise). ``main_process_only``:
    start telemetry on the world's rank 0 only (default: every rank, each with its rank).
    Other keyword arguments go to ``otel_rl.init()`` (``run_dir``, ``track_with``, ...).
    """

    framework = FRAMEWORK

    def __init__(self, *, trainer: Any = None, main_process_only: bool = False, **init_kwargs: Any) -> None:
        self._otel_setup(trainer, main_process_only, **init_kwargs)
        self._tool_rollouts: ToolRollouts | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_begin(args, state, control, **kwargs)
        if self.telemetry is not None and self._tool_rollouts is None:
            self._guard("on_train_begin tool rollouts", self._record_tool_rollouts)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rollouts, self._tool_rollouts = self._tool_rollouts, None
        if rollouts is not None:
            self._guard("on_train_end tool rollouts", rollouts.close)
        super().on_train_end(args, state, control, **kwargs)

    def _record_tool_rollouts(self) -> None:
        self._tool_rollouts = ToolRollouts.attach(self.telemetry, self.trainer)


class TrlInstrumentor(Instrumentor):
    """Every ``transformers.Trainer`` (TRL's trainers are ones) built while instrumented gets an
    :class:`OtelRLCallback`, unless it already holds an otel-rl callback.

    ``instrument(main_process_only=False, **init_kwargs)``: the callback's options.
    ``uninstrument()``: trainers built afterwards get none; those built before keep theirs.
    """

    pip_extra = "trl"

    def instrumentation_dependencies(self) -> Collection[str]:
        # Stage spans need TRL's profiling_context (TRL >= 0.16); the floors of the trl extra.
        return ("transformers >= 4.40", "trl >= 0.16")

    def _instrument(self, *, main_process_only: bool = False, **init_kwargs: Any) -> None:
        def callback_for(trainer: Any) -> OtelRLCallback:
            return OtelRLCallback(trainer=trainer, main_process_only=main_process_only, **init_kwargs)

        self.patches.on_restore(attach_to_new_trainers(callback_for, self.pip_extra or "trl"))
