"""OpenRLHF: each step as a live trace, with the Ray model workers' calls in it.

Trainer side (``openrlhf/trainer/ppo_trainer.py``, 0.11.2). ``PPOTrainer.fit`` runs a step as
``samples_generator.generate_samples`` (vLLM), then ``train_step(rollout_samples, global_step)``:
``experience_maker.make_experience_batch``, ``ppo_train``, ``broadcast_to_vllm``; then
``save_logs_and_checkpoints(global_step + 1, ...)`` hands the step's logs to the trackers. Those four
calls are the ones its ``timing/*`` keys time, so each runs as the stage the mapping
(``semconv/mappings/openrlhf.yaml``) gives its timer: ``generate`` (``actor_infer``),
``make_experience``, ``train_step`` (``actor_train``), ``model_update``, inside one ``rl.step`` span
per step (:class:`LiveSteps`). The step number is the one ``train_step`` returns and
``log_train`` gets: ``fit`` starts from 0, or from the checkpoint's ``global_step`` it hands to
``restore_best_checkpoint_state``, and each ``train_step(.., global_step)`` is step
``global_step + 1``. The step opens at generation (in the asynchronous ``TrainingActor``, which
gets its rollouts from another actor, at ``train_step``) and closes when
``save_logs_and_checkpoints`` begins, so the logged ``timing/*`` seconds and the spans measure the
same stages once; the step's ``rl.log`` event joins its trace.

Worker side (``openrlhf/trainer/ray/launcher.py``). The trainer reaches its Ray model actors through
``RayActorGroup.async_run_method`` (``fit``, ``broadcast_to_vllm``, ...) and
``async_run_method_batch`` (``forward`` and ``append``, through each actor's ``execute_batch``).
Inside a stage, a call that is a stage of its own (:func:`worker_stage`: each model's ``forward`` --
old log-probs, reference log-probs, values, rewards --, ``fit``, ``broadcast_to_vllm``) goes to the
actor as ``__ray_call__(run_method, method, context, stage, cluster, *args, **kwargs)``: Ray's
built-in actor method, whose signature takes any arguments, so Ray's check of the call against
the method's signature holds (an extra keyword on ``fit`` would fail it). :func:`run_method` runs,
in the worker's process, the very method the trainer asked for with the same arguments (Ray
resolves top-level object refs of ``__ray_call__`` as of any call), inside a stage span that joins
the trainer's stage; the task keeps its name (``PolicyModelActor.fit``). Other calls, and calls
outside a step, go as before. The worker starts its telemetry on its first such call
(``OTEL_*`` / ``OTEL_RL_*`` variables); it needs otel-rl importable, as the setup hook makes it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from otel_rl.integrations.base import GuardedCalls, Patches, TelemetryOnFirstUse
from otel_rl.integrations.ray import carrier
from otel_rl.integrations.stage_timers import stage_of
from otel_rl.semconv import attributes as A

logger = logging.getLogger("otel_rl")

FRAMEWORK = A.RlFrameworkValues.OPENRLHF.value
GENERATION_TIMER, MAKE_EXPERIENCE_TIMER = "timing/generation", "timing/make_experience"
PPO_TRAIN_TIMER, BROADCAST_TIMER = "timing/ppo_train", "timing/broadcast"
# (attribute of the trainer that holds the object, its method, the timer around the call)
HELPER_STAGES = (
    ("samples_generator", "generate_samples", GENERATION_TIMER),
    ("experience_maker", "make_experience_batch", MAKE_EXPERIENCE_TIMER),
)
# BasePPOTrainer's methods the live trace wraps; without any of them it is left out
TRAINER_METHODS = ("train_step", "ppo_train", "broadcast_to_vllm", "save_logs_and_checkpoints", "restore_best_checkpoint_state")
GROUP_METHODS = ("async_run_method", "async_run_method_batch")
ROUTE_MARK = "__otel_rl_stage__"  # set on the wrappers of a trainer's helper objects

_S = A.RlStageValues
# The model actors by class name (launcher.py, ppo_actor.py, ppo_critic.py): (rl.cluster, stage of forward)
ROLES = {
    "PolicyModelActor": ("actor_train", _S.COMPUTE_LOG_PROBS.value),
    "ReferenceModelActor": ("reference", _S.COMPUTE_REF_LOG_PROBS.value),
    "CriticModelActor": ("critic", _S.COMPUTE_VALUES.value),
    "RewardModelActor": ("reward", _S.COMPUTE_REWARDS.value),
}
METHOD_STAGES = {"fit": _S.TRAIN_STEP.value, "broadcast_to_vllm": _S.MODEL_UPDATE.value}

# "on": the trainer methods are wrapped (instrument() did, uninstrument() undid); "route": the model
# actors' calls in a step go through run_method (the workers can import otel-rl)
_state = {"on": False, "route": False}


class _Scope:
    """A telemetry context manager entered and left without ever raising into the framework: a
    failure is reported once through ``calls``; the framework's own exception goes on as it was."""

    __slots__ = ("_calls", "_what", "_open", "_scope")

    def __init__(self, calls: GuardedCalls, what: str, open_scope: Callable[[], Any] | None) -> None:
        self._calls, self._what, self._open, self._scope = calls, what, open_scope, None

    def __enter__(self) -> _Scope:
        if self._open is not None:
            try:
                scope = self._open()
                scope.__enter__()
                self._scope = scope
            except Exception:
                self._calls.report(self._what)
        return self

    @property
    def opened(self) -> bool:
        return self._scope is not None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            try:
                scope.__exit__(exc_type, exc, tb)
            except Exception:
                self._calls.report(self._what)


class LiveSteps:
    """One trainer's steps as live traces: the step scope it opens and closes across the trainer's
    calls, the stages around them, and the last step it traced (for that step's logs)."""

    def __init__(self, telemetry: Any, calls: GuardedCalls) -> None:
        self.telemetry = telemetry
        self.calls = calls
        self.next_step = 1  # fit(global_step=0) without a checkpoint starts at step 1
        self.step: int | None = None  # the open step
        self._scope: _Scope | None = None
        self._context: dict[str, Any] | None = None
        self.finished: tuple[int, dict[str, Any] | None] | None = None  # (step, its context): the last step traced
        self._mismatch_reported = False

    @property
    def on(self) -> bool:
        return _state["on"]

    # -- the step ----------------------------------------------------------------------------------
    def begin(self, step: int | None) -> None:
        """Be in step ``step``: open it, unless it is open already (another open step is closed)."""
        if step is None or step == self.step:
            return
        if self.step is not None:  # not in 0.11.2's loops: the open step is closed as it is
            if not self._mismatch_reported:
                self._mismatch_reported = True
                logger.warning(
                    "otel-rl: OpenRLHF's step %s began while step %s was open; the trace of step %s may be wrong",
                    step,
                    self.step,
                    self.step,
                )
            self.end()
        scope = _Scope(self.calls, "step", lambda: self.telemetry.step(step))
        scope.__enter__()
        self._scope, self.step = scope, step
        try:
            self._context = self.telemetry.inject()  # the step span's context: its logs join the trace
        except Exception:
            self.calls.report("step")
            self._context = None

    def end(self, exc: BaseException | None = None) -> None:
        """Close the open step, if any (marked failed with ``exc``)."""
        scope, step, self._scope, self.step = self._scope, self.step, None, None
        if scope is None or step is None:
            return
        traced = scope.opened  # a step whose span could not start is rebuilt from its timers
        scope.__exit__(type(exc) if exc is not None else None, exc, None)
        self.finished = (step, self._context) if traced else None
        self.next_step = step + 1

    def traced(self, step: int) -> dict[str, Any] | None:
        """The context of step ``step`` if it was traced live (else None: rebuild it from its timers)."""
        if self.finished is None or self.finished[0] != step:
            return None
        return self.finished[1] or {}

    def stage(self, timer: str) -> _Scope:
        """The stage the mapping gives ``timer``, as a child of the open step (nothing without one)."""
        return _Scope(self.calls, "stage", None if self.step is None else lambda: self._stage(timer))

    def _stage(self, timer: str) -> Any:
        name, cluster = stage_of(timer, FRAMEWORK)
        return self.telemetry.stage(name, cluster=cluster)

    def close(self) -> None:
        self.end()

    # -- the trainer's helper objects ---------------------------------------------------------------
    def attach(self, trainer: Any) -> None:
        """Wrap the trainer's sample generator and experience maker (again if they were replaced)."""
        if not self.on:
            return
        for holder, method, timer in HELPER_STAGES:
            try:
                target = getattr(trainer, holder, None)
                original = getattr(target, method, None)
                if original is None or not callable(original) or getattr(original, ROUTE_MARK, None) is self:
                    continue
                wrapper = self._opening_step(original, timer) if timer == GENERATION_TIMER else self._in_stage(original, timer)
                setattr(wrapper, ROUTE_MARK, self)
                setattr(target, method, wrapper)
            except Exception:  # an object that takes no attributes, say: its calls go untraced
                self.calls.report("attach")

    def _in_stage(self, original: Callable[..., Any], timer: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return original(*args, **kwargs)
            with self.stage(timer):
                return original(*args, **kwargs)

        return call

    def _opening_step(self, original: Callable[..., Any], timer: str) -> Callable[..., Any]:
        # generation comes first in a step: it opens the step fit is about to run
        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return original(*args, **kwargs)
            if self.step is None:
                self.begin(self.next_step)
            try:
                with self.stage(timer):
                    return original(*args, **kwargs)
            except BaseException as exc:
                self.end(exc)
                raise

        return call


def log_in_step(telemetry: Any, context: Mapping[str, Any], values: Mapping[str, Any], step: int) -> None:
    """``telemetry.log(values, step)`` with the rl.log event in the trace ``context`` came from."""
    if not context:
        return telemetry.log(values, step)
    with telemetry.join(context):
        telemetry.log(values, step)


def live_steps(trainer: Any) -> LiveSteps | None:
    """The live trace of a trainer whose TensorBoard slot holds otel-rl's logger, while instrumented."""
    live = getattr(getattr(trainer, "tensorboard_logger", None), "live_steps", None)
    return live if isinstance(live, LiveSteps) and live.on else None


# -- trainer methods ---------------------------------------------------------------------------------
def _train_step(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def train_step(self: Any, rollout_samples: Any, global_step: Any, *args: Any, **kwargs: Any) -> Any:
        live = live_steps(self)
        if live is None:
            return original(self, rollout_samples, global_step, *args, **kwargs)
        step = global_step + 1 if isinstance(global_step, int) else None  # what train_step returns and log_train gets
        live.begin(step)
        live.attach(self)  # the experience maker may have been replaced since __init__
        try:
            return original(self, rollout_samples, global_step, *args, **kwargs)
        except BaseException as exc:
            live.end(exc)
            raise

    return train_step


def _staged(original: Callable[..., Any], timer: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        live = live_steps(self)
        if live is None:
            return original(self, *args, **kwargs)
        with live.stage(timer):
            return original(self, *args, **kwargs)

    return call


def _save_logs_and_checkpoints(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save_logs_and_checkpoints(self: Any, *args: Any, **kwargs: Any) -> Any:
        live = live_steps(self)
        if live is not None:
            live.end()  # before log_train: the step's span measured its stages, the logs are counted once
        return original(self, *args, **kwargs)

    return save_logs_and_checkpoints


def _restore_best_checkpoint_state(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def restore_best_checkpoint_state(self: Any, checkpoint_states: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, checkpoint_states, *args, **kwargs)
        live = live_steps(self)
        resumed = checkpoint_states.get("global_step") if isinstance(checkpoint_states, Mapping) else None
        if live is not None and isinstance(resumed, int) and resumed > 0:
            live.next_step = resumed + 1  # fit goes on from the checkpoint's step
        return result

    return restore_best_checkpoint_state


# -- the model actors' calls ---------------------------------------------------------------------------
def worker_stage(actor_class: Any, method_name: str) -> tuple[str, str, str] | None:
    """``(actor class name, rl.stage, rl.cluster)`` of a model actor's method that is a stage of
    the step, by the OpenRLHF class the actor is (or derives from); None for other calls."""
    cls = getattr(actor_class, "__ray_actor_class__", actor_class)  # the class under @ray.remote
    for base in getattr(cls, "__mro__", ()):
        role = ROLES.get(base.__name__)
        if role is not None:
            cluster, forward_stage = role
            stage = forward_stage if method_name == "forward" else METHOD_STAGES.get(method_name)
            return None if stage is None else (cls.__name__, stage, cluster)
    return None


class _Route:
    __slots__ = ("actor", "stage", "cluster", "context", "calls")

    def __init__(self, actor: str, stage: str, cluster: str, context: dict[str, Any], calls: GuardedCalls) -> None:
        self.actor, self.stage, self.cluster, self.context, self.calls = actor, stage, cluster, context, calls


class _RoutedMethod:
    """``handle.<method>`` whose ``.remote(*args, **kwargs)`` goes through ``__ray_call__``."""

    __slots__ = ("_handle", "_name", "_route")

    def __init__(self, handle: Any, name: str, route: _Route) -> None:
        self._handle, self._name, self._route = handle, name, route

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        route = self._route
        if "fn" not in kwargs:  # __ray_call__'s own parameter
            try:
                call = self._handle.__ray_call__.options(name=f"{route.actor}.{self._name}")
                return call.remote(run_method, self._name, route.context, route.stage, route.cluster, *args, **kwargs)
            except Exception:  # a Ray without __ray_call__, say: the call goes as it would have
                route.calls.report("route")
        return getattr(self._handle, self._name).remote(*args, **kwargs)


class _RoutedActor:
    __slots__ = ("_handle", "_route")

    def __init__(self, handle: Any, route: _Route) -> None:
        self._handle, self._route = handle, route

    def __getattr__(self, name: str) -> Any:
        return _RoutedMethod(self._handle, name, self._route)


class _RoutedGroup:
    """A RayActorGroup as its ``async_run_method(_batch)`` read it (``_actor_handlers``,
    ``duplicate_actors``), with every actor call routed through :func:`run_method`."""

    def __init__(self, group: Any, route: _Route) -> None:
        self._group = group
        self._actor_handlers = [_RoutedActor(handle, route) for handle in group._actor_handlers]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)


def _route(group: Any, method_name: Any, calls: GuardedCalls) -> _Route | None:
    if (
        not (_state["on"] and _state["route"])
        or not isinstance(method_name, str)
        or not isinstance(getattr(group, "_actor_handlers", None), list)
    ):
        return None
    found = worker_stage(getattr(group, "ray_actor_type", None), method_name)
    if found is None:
        return None
    context = carrier()
    if not context.get("traceparent"):  # no step running here: the call goes as before
        return None
    return _Route(*found, context, calls)


def _routing(original: Callable[..., Any], calls: GuardedCalls) -> Callable[..., Any]:
    @functools.wraps(original)
    def run(self: Any, method_name: Any, *args: Any, **kwargs: Any) -> Any:
        group = self
        try:
            route = _route(self, method_name, calls)
            if route is not None:
                group = _RoutedGroup(self, route)
        except Exception:
            calls.report("route")
        return original(group, method_name, *args, **kwargs)

    return run


# In a model worker: its telemetry, started on the first traced call, and its failures, each said once
WORKER_TELEMETRY = TelemetryOnFirstUse(FRAMEWORK, "the OpenRLHF model workers' calls")
WORKER_CALLS = GuardedCalls("the OpenRLHF model worker")


def run_method(actor: Any, method_name: str, context: Mapping[str, Any], stage: str, cluster: str, /, *args: Any, **kwargs: Any) -> Any:
    """In the model worker: ``actor.<method_name>(*args, **kwargs)`` as stage ``stage`` of
    ``cluster``, a child of the trainer's span ``context`` came from. Returns what the method
    returns and raises what it raises; otel-rl's own failures are reported once, never raised."""
    method = getattr(actor, method_name)
    tel = WORKER_TELEMETRY.telemetry()
    if tel is None:
        return method(*args, **kwargs)
    with _Scope(WORKER_CALLS, "join", lambda: tel.join(context)):
        with _Scope(WORKER_CALLS, "stage", lambda: tel.stage(stage, cluster=cluster)):
            return method(*args, **kwargs)


def routes_worker_calls() -> bool:
    """Whether the model actors' calls in a step are being sent through :func:`run_method`."""
    return _state["on"] and _state["route"]


def instrument_live_steps(trainer_cls: Any, group_cls: Any, patches: Patches, *, route_workers: bool = False) -> bool:
    """Wrap ``BasePPOTrainer``'s step methods and ``RayActorGroup``'s calls; False (nothing
    wrapped: the steps are rebuilt from their timers) when this OpenRLHF lacks one of them.
    ``route_workers``: the model actors' calls become spans in their processes, which must be able
    to import otel-rl (else the trainer's stages alone are traced)."""
    missing = [name for name in TRAINER_METHODS if not callable(vars(trainer_cls).get(name))]
    missing += [name for name in GROUP_METHODS if group_cls is None or not callable(vars(group_cls).get(name))]
    if missing:
        logger.info("otel-rl: this OpenRLHF has no %s; each step's trace is rebuilt from its timers", ", ".join(missing))
        return False
    methods = vars(trainer_cls)
    patches.replace(trainer_cls, "train_step", _train_step(methods["train_step"]))
    patches.replace(trainer_cls, "ppo_train", _staged(methods["ppo_train"], PPO_TRAIN_TIMER))
    patches.replace(trainer_cls, "broadcast_to_vllm", _staged(methods["broadcast_to_vllm"], BROADCAST_TIMER))
    patches.replace(trainer_cls, "save_logs_and_checkpoints", _save_logs_and_checkpoints(methods["save_logs_and_checkpoints"]))
    patches.replace(trainer_cls, "restore_best_checkpoint_state", _restore_best_checkpoint_state(methods["restore_best_checkpoint_state"]))
    calls = GuardedCalls("the OpenRLHF model groups' calls")
    for name in GROUP_METHODS:
        patches.replace(group_cls, name, _routing(vars(group_cls)[name], calls))
    _state.update(on=True, route=route_workers)
    patches.on_restore(functools.partial(_state.update, on=False, route=False))
    return True


__all__ = [
    "WORKER_CALLS",
    "WORKER_TELEMETRY",
    "LiveSteps",
    "instrument_live_steps",
    "live_steps",
    "log_in_step",
    "routes_worker_calls",
    "run_method",
    "worker_stage",
]
