"""Shared mechanics of the Hugging Face ``Trainer`` callbacks (TRL, ms-swift).

transformers' callback events (``on_step_begin`` ... ``on_train_end``) mark where an optimizer
step starts and ends, when it logs, evaluates and saves. What happens inside a step is visible
through the frameworks' own profiling helpers: TRL's ``trl.extras.profiling.profiling_context``
and ms-swift's ``swift.rlhf_trainers.utils.profiling_context`` time ``transformers.generate`` /
``vLLM.generate``, the reward computation, the log-prob passes and ``compute_loss``. While a
run trains, :class:`ProfilingHook` puts a wrapper in place of those functions in every loaded
module that imported them (the decorator ``profiling_decorator`` looks the name up in its own
module at call time, so that covers the decorated methods too); the wrapper still runs the
original and only adds a stage span around it. The originals are put back at ``on_train_end``.

This module imports neither transformers nor the frameworks: the callback classes that subclass
``transformers.TrainerCallback`` live in ``trl.py`` / ``swift.py`` and mix in :class:`HFCallbackMixin`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

import otel_rl
from otel_rl.integrations._hf_samples import TrainerSamples
from otel_rl.semconv import attributes as A

logger = logging.getLogger("otel_rl")

_STAGE = A.RlStageValues
# Worker groups as the other integrations and the demo name them (rl.cluster is a free string).
CLUSTER_ACTOR_TRAIN = "actor_train"
CLUSTER_ACTOR_INFER = "actor_infer"
CLUSTER_REFERENCE = "reference"
CLUSTER_REWARD = "reward"

# A profiled block's name (without the trainer class prefix) -> the stage it is. TRL:
# grpo_trainer.py / rloo_trainer.py; ms-swift: rlhf_trainers/grpo_trainer.py, rollout_mixin.py.
# Blocks not listed (``_prepare_inputs``, ``_generate_and_score_completions``, reward functions,
# ``_score_completions``, ...) contain stages or sit inside one; they add no span.
LOGPROB_BLOCK = "logprob"
BLOCK_STAGES: dict[str, tuple[str, str]] = {
    "transformers.generate": (_STAGE.GENERATE.value, CLUSTER_ACTOR_INFER),
    "transformers.generate_batch": (_STAGE.GENERATE.value, CLUSTER_ACTOR_INFER),
    "vLLM.generate": (_STAGE.GENERATE.value, CLUSTER_ACTOR_INFER),
    "generate": (_STAGE.GENERATE.value, CLUSTER_ACTOR_INFER),  # ms-swift _engine_infer
    "sync_weights": (_STAGE.MODEL_UPDATE.value, CLUSTER_ACTOR_INFER),
    "_move_model_to_vllm": (_STAGE.MODEL_UPDATE.value, CLUSTER_ACTOR_INFER),
    "_calculate_rewards": (_STAGE.COMPUTE_REWARDS.value, CLUSTER_REWARD),
    "_compute_rewards_per_func": (_STAGE.COMPUTE_REWARDS.value, CLUSTER_REWARD),  # ms-swift
    "_get_per_token_logps_and_entropies": (LOGPROB_BLOCK, CLUSTER_ACTOR_TRAIN),
    "_get_per_token_logps": (LOGPROB_BLOCK, CLUSTER_ACTOR_TRAIN),  # TRL < 0.20
    "compute_loss": (_STAGE.TRAIN_STEP.value, CLUSTER_ACTOR_TRAIN),
}
# Methods whose first argument says which model a log-prob pass runs (policy or reference).
_LOGPROB_METHODS = ("_get_per_token_logps_and_entropies", "_get_per_token_logps")
# Where the frameworks define profiling_context: (module, attribute).
PROFILING_SOURCES = (("trl.extras.profiling", "profiling_context"), ("swift.rlhf_trainers.utils", "profiling_context"))

# TrainingArguments fields never logged as hyperparameters (hub_token, api keys, passwords, ...).
_SECRET_RE = re.compile(r"token|key|secret|password|passwd|credential", re.IGNORECASE)
_FRAME_SEARCH_DEPTH = 16
# otel_rl.init() option <- TrainingArguments property.
_PLACEMENT_FIELDS = (("rank", "process_index"), ("local_rank", "local_process_index"), ("world_size", "world_size"))
_EPOCH_TOLERANCE = 1e-9

# Telemetry objects a callback shut down: a later run must not reuse them.
_finished: weakref.WeakSet[otel_rl.Telemetry] = weakref.WeakSet()


def hparams_from_args(args: Any) -> dict[str, Any]:
    """TrainingArguments as a flat-able dict, without fields whose name looks like a secret."""
    if hasattr(args, "to_dict"):
        raw = args.to_dict()
    elif dataclasses.is_dataclass(args) and not isinstance(args, type):
        raw = dataclasses.asdict(args)
    else:
        raw = dict(vars(args))
    return _drop_secrets(raw)


def _drop_secrets(mapping: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = str(key)
        if _SECRET_RE.search(name):
            continue
        if isinstance(value, Mapping):
            value = _drop_secrets(value)
        elif isinstance(value, Enum):
            value = value.value
        out[name] = value
    return out


def find_trainer(callback: Any) -> Any | None:
    """The trainer whose callback list holds ``callback``, found among the callers' ``self``.

    transformers fires callback events from inside ``Trainer`` methods and hands the callbacks
    no trainer; a ``TrainerCallback`` created before its trainer (``callbacks=[...]``) finds it
    here once, at ``on_train_begin``.
    """
    frame = sys._getframe(1)
    for _ in range(_FRAME_SEARCH_DEPTH):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        handler = getattr(owner, "callback_handler", None)
        if handler is not None and any(cb is callback for cb in getattr(handler, "callbacks", ())):
            return owner
        frame = frame.f_back
    return None


# --------------------------------------------------------------------------------------------------
# Profiling hook


class _HookedBlock:
    """The framework's profiling context, plus a stage span around it for the listening runs."""

    __slots__ = ("_inner", "_trainer", "_name", "_tokens")

    def __init__(self, inner: Any, trainer: Any, name: str) -> None:
        self._inner = inner
        self._trainer = trainer
        self._name = name
        self._tokens: list[list[tuple[Any, Any]]] = []

    def __enter__(self) -> Any:
        self._tokens.append(_notify_enter(self._trainer, self._name))
        try:
            return self._inner.__enter__()
        except BaseException as exc:
            _notify_exit(self._tokens.pop(), exc)
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return self._inner.__exit__(exc_type, exc, tb)
        finally:
            if self._tokens:
                _notify_exit(self._tokens.pop(), exc)

    def __getattr__(self, name: str) -> Any:
        # ProfilingContext attributes (name, step, ...) stay readable.
        if name in _HookedBlock.__slots__:
            raise AttributeError(name)
        return getattr(self._inner, name)


_listeners: list[Any] = []  # StepTracer objects of the runs training now
_patched: list[tuple[Any, str, Any, Any]] = []  # (module, attribute, original, replacement)
_hook_lock = threading.Lock()


def _notify_enter(trainer: Any, name: str) -> list[tuple[Any, Any]]:
    tokens = []
    for listener in tuple(_listeners):
        token = listener.block_enter(trainer, name)
        if token is not None:
            tokens.append((listener, token))
    return tokens


def _notify_exit(tokens: list[tuple[Any, Any]], exc: BaseException | None) -> None:
    for listener, token in reversed(tokens):
        listener.block_exit(token, exc)


def _replacement(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def profiling_context(trainer: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        return _HookedBlock(original(trainer, name, *args, **kwargs), trainer, str(name))

    profiling_context._otel_rl_original = original  # type: ignore[attr-defined]
    return profiling_context


def _install_profiling_hook() -> None:
    """Swap every loaded module's reference to a framework profiling_context for the wrapper."""
    originals: dict[int, tuple[Any, Any]] = {}
    for module_name, attribute in PROFILING_SOURCES:
        module = sys.modules.get(module_name)
        original = getattr(module, attribute, None) if module is not None else None
        if callable(original) and not hasattr(original, "_otel_rl_original"):
            originals[id(original)] = (original, _replacement(original))
    if not originals:
        return
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        try:
            found = [(k, v) for k, v in list(namespace.items()) if id(v) in originals and v is originals[id(v)][0]]
        except RuntimeError:  # a module being imported by another thread right now
            continue
        for attribute, original in found:
            replacement = originals[id(original)][1]
            namespace[attribute] = replacement
            _patched.append((module, attribute, original, replacement))


def _remove_profiling_hook() -> None:
    while _patched:
        module, attribute, original, replacement = _patched.pop()
        if module.__dict__.get(attribute) is replacement:  # leave a later patch by someone else alone
            setattr(module, attribute, original)


class ProfilingHook:
    """Feeds a tracer the framework's profiled blocks while its run trains (reference counted)."""

    @staticmethod
    def add(listener: Any) -> None:
        with _hook_lock:
            if listener in _listeners:
                return
            if not _listeners:
                _install_profiling_hook()
            _listeners.append(listener)

    @staticmethod
    def remove(listener: Any) -> None:
        with _hook_lock:
            if listener in _listeners:
                _listeners.remove(listener)
            if not _listeners:
                _remove_profiling_hook()


# --------------------------------------------------------------------------------------------------
# The step tracer


_NESTED = object()  # token of a block inside a stage: no span of its own
_OWNER = object()  # token of the block that opened the current stage

# Events a step waits for after on_step_end, in the order transformers sends them.
_LOG, _EVALUATE, _SAVE, _EPOCH_END = "log", "evaluate", "save", "epoch_end"


class StepTracer:
    """Turns callback events and profiled blocks into one trace per optimizer step.

    * ``on_step_begin`` opens the step's root span ``rl.step`` (step = the ``global_step`` the
      step will have when it ends, the step TRL logs with);
    * generation, reward and log-prob blocks become ``generate``, ``compute_rewards``,
      ``compute_log_probs`` / ``compute_ref_log_probs`` and ``model_update`` stages;
    * the actor update ``train_step`` runs from ``compute_loss`` (from ``on_step_begin`` for
      trainers that generate nothing) to ``on_optimizer_step``;
    * evaluation (``validation``) and checkpointing (``do_checkpoint``) that the step triggers
      stay inside its trace; the step ends after the last of them.

    Stages are siblings under the step span; a block inside a stage adds nothing.
    """

    def __init__(self, telemetry: otel_rl.Telemetry, trainer: Any, args: Any) -> None:
        self.tel = telemetry
        self.trainer = trainer
        self.thread = threading.get_ident()
        if trainer is not None:
            generates = callable(getattr(trainer, "_generate_and_score_completions", None))
        else:
            generates = getattr(args, "num_generations", None) is not None
        # Online-RL trainers generate inside the step: the update starts at compute_loss.
        self.train_from_step_begin = not generates
        self._scope: Any = None
        self._stage: Any = None
        self._stage_name: str | None = None
        self._owner_depth = 0  # >0 while the block that opened the stage (or one inside it) runs
        self._pending: set[str] = set()
        self._last_train_log_step: int | None = None
        self._logprob_ref = False
        self._probes: list[str] = []
        self._reported: set[str] = set()
        self._install_logprob_probe()

    # -- stages ----------------------------------------------------------------------------------
    def _open_stage(self, name: str, cluster: str | None) -> None:
        self._close_stage()
        if self._scope is None:
            return
        stage = self.tel.stage(name, cluster=cluster)
        stage.__enter__()
        self._stage, self._stage_name = stage, name

    def _close_stage(self, exc: BaseException | None = None) -> None:
        stage, self._stage, self._stage_name = self._stage, None, None
        self._owner_depth = 0
        if stage is not None:
            stage.__exit__(type(exc) if exc is not None else None, exc, None)

    def _close_step(self) -> None:
        self._close_stage()
        scope, self._scope = self._scope, None
        self._pending.clear()
        if scope is not None:
            scope.__exit__(None, None, None)

    def close(self) -> None:
        """End whatever is open and stop listening to profiled blocks."""
        try:
            self._close_step()
        finally:
            ProfilingHook.remove(self)
            self._remove_logprob_probe()

    # -- callback events -------------------------------------------------------------------------
    def step_begin(self, state: Any) -> None:
        self._close_step()
        scope = self.tel.step(int(state.global_step) + 1)
        scope.__enter__()
        self._scope = scope
        if self.train_from_step_begin:
            self._open_stage(_STAGE.TRAIN_STEP.value, CLUSTER_ACTOR_TRAIN)

    def optimizer_step(self) -> None:
        if self._stage_name == _STAGE.TRAIN_STEP.value:
            self._close_stage()

    def step_end(self, state: Any, control: Any) -> None:
        self._close_stage()
        if self._scope is None:
            return
        if getattr(control, "should_log", False):
            self._pending.add(_LOG)
        if getattr(control, "should_evaluate", False):
            self._pending.add(_EVALUATE)
        if getattr(control, "should_save", False):
            self._pending.add(_SAVE)
        # Epoch-level log / evaluate / save of the last step follow on_epoch_end.
        epoch = getattr(state, "epoch", None)
        at_epoch_end = isinstance(epoch, (int, float)) and epoch > 0 and abs(epoch - round(epoch)) < _EPOCH_TOLERANCE
        if at_epoch_end or getattr(control, "should_training_stop", False) or getattr(control, "should_epoch_stop", False):
            self._pending.add(_EPOCH_END)
        self._advance()

    def epoch_end(self, state: Any, control: Any) -> None:
        if self._scope is None or _EPOCH_END not in self._pending:
            return
        self._pending.discard(_EPOCH_END)
        # transformers logs again only when steps passed since its last log.
        if getattr(control, "should_log", False) and self._last_train_log_step != int(state.global_step):
            self._pending.add(_LOG)
        if getattr(control, "should_evaluate", False):
            self._pending.add(_EVALUATE)
        if getattr(control, "should_save", False):
            self._pending.add(_SAVE)
        self._advance()

    def logged(self, state: Any) -> None:
        if _LOG in self._pending:
            self._pending.discard(_LOG)
            self._last_train_log_step = int(state.global_step)
            self._advance()

    def evaluated(self) -> None:
        if _EVALUATE in self._pending and self._stage_name == _STAGE.VALIDATION.value:
            self._pending.discard(_EVALUATE)
            self._close_stage()
            self._advance()

    def saved(self) -> None:
        if _SAVE in self._pending and self._stage_name == _STAGE.DO_CHECKPOINT.value:
            self._pending.discard(_SAVE)
            self._close_stage()
            self._advance()

    def _advance(self) -> None:
        """Open the span of the next post-step event, or end the step when none is left."""
        if _LOG in self._pending:
            return  # logging takes no time of its own; the next event follows it
        if _EVALUATE in self._pending:
            if self._stage_name != _STAGE.VALIDATION.value:
                self._open_stage(_STAGE.VALIDATION.value, CLUSTER_ACTOR_INFER)
            return
        if _SAVE in self._pending:
            if self._stage_name != _STAGE.DO_CHECKPOINT.value:
                self._open_stage(_STAGE.DO_CHECKPOINT.value, CLUSTER_ACTOR_TRAIN)
            return
        if _EPOCH_END not in self._pending:
            self._close_step()

    # -- profiled blocks -------------------------------------------------------------------------
    def block_enter(self, trainer: Any, name: str) -> Any:
        """A profiled block starts; returns a token for block_exit, or None to ignore it."""
        try:
            if self._scope is None or threading.get_ident() != self.thread:
                return None
            if self.trainer is not None and trainer is not self.trainer:
                return None
            if self._stage_name in (_STAGE.VALIDATION.value, _STAGE.DO_CHECKPOINT.value):
                return None  # evaluation generates and scores too: that is the validation stage's work
            spec = BLOCK_STAGES.get(name)
            if spec is None:
                return None
            if self._owner_depth > 0:
                self._owner_depth += 1
                return _NESTED
            stage, cluster = spec
            if stage == LOGPROB_BLOCK:
                if self._logprob_ref:
                    stage, cluster = _STAGE.COMPUTE_REF_LOG_PROBS.value, CLUSTER_REFERENCE
                else:
                    stage = _STAGE.COMPUTE_LOG_PROBS.value
            if stage != self._stage_name:  # the held train_step ends when another stage starts
                self._open_stage(stage, cluster)
            self._owner_depth = 1
            return _OWNER
        except Exception:
            _report("profiled block start", self._reported)
            return None

    def block_exit(self, token: Any, exc: BaseException | None) -> None:
        try:
            if token is _NESTED:
                self._owner_depth = max(0, self._owner_depth - 1)
            elif token is _OWNER:
                self._owner_depth = 0
                # The update goes on through backward and the optimizer step: keep train_step open.
                if self._stage_name != _STAGE.TRAIN_STEP.value or exc is not None:
                    self._close_stage(exc)
        except Exception:
            _report("profiled block end", self._reported)

    # -- log-prob passes: policy or reference ---------------------------------------------------
    def _install_logprob_probe(self) -> None:
        trainer = self.trainer
        if trainer is None or getattr(trainer, "ref_model", None) is None:
            return
        for name in _LOGPROB_METHODS:
            method = getattr(trainer, name, None)
            if method is None or name in vars(trainer):
                continue
            trainer.__dict__[name] = self._probe(trainer, method)
            self._probes.append(name)

    def _probe(self, trainer: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        tracer = weakref.ref(self)

        @functools.wraps(method)
        def probe(*args: Any, **kwargs: Any) -> Any:
            owner = tracer()
            if owner is not None:
                model = args[0] if args else kwargs.get("model")
                owner._logprob_ref = model is not None and model is getattr(trainer, "ref_model", None)
            return method(*args, **kwargs)

        probe._otel_rl_probe = True  # type: ignore[attr-defined]
        return probe

    def _remove_logprob_probe(self) -> None:
        trainer = self.trainer
        while self._probes:
            name = self._probes.pop()
            if getattr(vars(trainer).get(name), "_otel_rl_probe", False):
                del trainer.__dict__[name]


def _report(what: str, seen: set[str]) -> None:
    if what not in seen:
        seen.add(what)
        logger.warning("otel-rl: the Trainer callback failed in %s; training goes on (reported once)", what, exc_info=True)


# --------------------------------------------------------------------------------------------------
# The callback


class HFCallbackMixin:
    """The ``on_*`` events of an otel-rl ``TrainerCallback``; mix in before ``TrainerCallback``.

    Subclasses set ``framework``. Errors are reported once through the ``otel_rl`` logger and
    never reach the training loop (except ``ValueError`` under otel-rl's strict mode).
    """

    framework: str = A.RlFrameworkValues.CUSTOM.value

    def _otel_setup(self, trainer: Any = None, main_process_only: bool = False, **init_kwargs: Any) -> None:
        self.trainer = trainer
        self._trainer_given = trainer is not None
        self.init_kwargs = init_kwargs
        self.main_process_only = main_process_only
        self.telemetry: otel_rl.Telemetry | None = None
        self._owned = False
        self._tracer: StepTracer | None = None
        self._reported: set[str] = set()
        self._samples = TrainerSamples()  # GRPO's completions -> Telemetry.log_samples (when log_samples is on)

    # -- setup / teardown ------------------------------------------------------------------------
    def _start(self, args: Any, state: Any) -> None:
        if self.main_process_only and not getattr(state, "is_world_process_zero", True):
            return
        current = otel_rl.get_telemetry()
        if current is not None and current not in _finished and not current.closed:
            self.telemetry, self._owned = current, False
        else:
            options = {"framework": self.framework, **self.init_kwargs}
            for option, field in _PLACEMENT_FIELDS:
                value = getattr(args, field, None)
                if option not in options and isinstance(value, int):
                    options[option] = value
            self.telemetry, self._owned = otel_rl.init(**options), True
        trainer = self.trainer if self._trainer_given else find_trainer(self)
        self.trainer = trainer
        if trainer is not None:
            self._run_last(trainer)
        self.telemetry.log_hparams(hparams_from_args(args))
        self._tracer = StepTracer(self.telemetry, trainer, args)
        ProfilingHook.add(self._tracer)

    def _run_last(self, trainer: Any) -> None:
        """See every log after the other callbacks: ms-swift's progress callback, added after the
        user's, adds its keys (global_step/max_steps, train_speed(s/it), ...) to the same dict."""
        handler: Any = getattr(trainer, "callback_handler", None)
        callbacks = getattr(handler, "callbacks", None)
        if isinstance(callbacks, list) and callbacks and callbacks[-1] is not self and any(c is self for c in callbacks):
            # A new list: transformers is iterating over the old one right now.
            handler.callbacks = [c for c in callbacks if c is not self] + [self]

    def _stop(self) -> None:
        tracer, self._tracer = self._tracer, None
        tel = self.telemetry
        try:
            if tracer is not None:
                tracer.close()
        finally:
            if tel is not None:
                if self._owned:
                    _finished.add(tel)
                    tel.shutdown()
                else:
                    tel.flush()
            self.telemetry = None

    def _guard(self, what: str, function: Callable[..., Any], *args: Any) -> None:
        try:
            function(*args)
        except ValueError:
            tel = self.telemetry
            if tel is not None and tel.config.strict:
                raise
            _report(what, self._reported)
        except Exception:
            _report(what, self._reported)

    # -- events --------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.telemetry is None:
            self._guard("on_train_begin", self._start, args, state)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._tracer is not None:
            self._guard("on_step_begin", self._tracer.step_begin, state)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._tracer is not None:
            self._guard("on_optimizer_step", self._tracer.optimizer_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._tracer is not None:
            self._guard("on_step_end", self._tracer.step_end, state, control)

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        tel = self.telemetry
        if tel is None or not logs:
            return
        self._guard("on_log", tel.log, logs, int(state.global_step))
        self._guard("on_log samples", self._samples.log, tel, self.trainer, state)
        if self._tracer is not None:
            self._guard("on_log", self._tracer.logged, state)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._tracer is not None:
            self._guard("on_evaluate", self._tracer.evaluated)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._tracer is not None:
            self._guard("on_save", self._tracer.saved)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._tracer is not None:
            self._guard("on_epoch_end", self._tracer.epoch_end, state, control)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.telemetry is not None:
            self._guard("on_train_end", self._stop)
