"""Ray: remote actor calls made inside a stage become child spans in the worker's process.

Driver, with :class:`RayInstrumentor` (actor calls and actor creation as usual)::

    from otel_rl.integrations import ray as otel_ray

    otel_ray.RayInstrumentor().instrument()
    Worker = ray.remote(WorkerClass)                     # new actors get worker_env() (rank: yours)
    with tel.step(step), tel.stage("generate", cluster="actor_infer"):
        refs = [w.generate.remote(batch) for w in workers]   # carries the trace context

Driver, by hand (what the instrumentor does for you)::

    from otel_rl.integrations import ray as otel_ray

    Worker = ray.remote(WorkerClass).options(runtime_env={"env_vars": otel_ray.worker_env(rank=1)})
    with tel.step(step), tel.stage("generate", cluster="actor_infer"):
        refs = [otel_ray.remote(w.generate, batch) for w in workers]

Worker (an actor class)::

    class WorkerClass:
        @otel_ray.stage("generate", cluster="actor_infer")
        def generate(self, batch): ...

``remote`` adds the caller's trace context and step as a keyword argument; ``stage`` takes it
off again, joins the caller's trace and runs the method inside a stage span, so the step's
trace holds the driver's spans and every worker's. A worker starts its own telemetry on the
first call (``otel_rl.init()`` reading the environment ``worker_env`` sets) unless it already has.

``RayInstrumentor().instrument()`` wraps Ray's ``ActorMethod._remote`` (every ``.remote()`` /
``.options(...).remote()`` of an actor method goes through it) to add the context to calls of
methods decorated with ``stage`` while a span is current, and ``ActorClass._remote`` to add
``worker_env()`` to new actors' ``runtime_env`` env_vars (the actor's own values win; Ray merges
env_vars with the job's). ``uninstrument()`` puts both back.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import otel_rl
from otel_rl._sdk.spans.propagation import inject_context
from otel_rl.integrations.base import Instrumentor

logger = logging.getLogger("otel_rl")

CONTEXT_KWARG = "otel_rl_context"
F = TypeVar("F", bound=Callable[..., Any])


def carrier() -> dict[str, Any]:
    """The current trace context and step, as a dict to send with remote work."""
    tel = otel_rl.get_telemetry()
    return tel.inject() if tel is not None else dict(inject_context())


def remote(method: Any, *args: Any, **kwargs: Any) -> Any:
    """``method.remote(*args, **kwargs)`` carrying the caller's trace context to a method
    decorated with ``stage``; returns Ray's ObjectRef."""
    return method.remote(*args, **kwargs, **{CONTEXT_KWARG: carrier()})


def worker_env(rank: int | None = None, *, world_size: int | None = None, telemetry: otel_rl.Telemetry | None = None) -> dict[str, str]:
    """Environment for a Ray worker's ``runtime_env={"env_vars": ...}``: the driver's run id,
    service, framework and destination (OTLP endpoint or run folder), plus the worker's rank.

    OTLP headers are left out on purpose (they may hold credentials): give workers their own
    ``OTEL_EXPORTER_OTLP_HEADERS`` through the cluster's secret handling.
    """
    tel = telemetry or otel_rl.get_telemetry()
    env: dict[str, str] = {}
    if tel is not None:
        cfg = tel.config
        env["OTEL_SERVICE_NAME"] = cfg.service_name
        env["OTEL_RL_RUN_ID"] = str(cfg.run_id)
        for name, value in (("OTEL_RL_FRAMEWORK", cfg.framework), ("OTEL_RL_EXPERIMENT", cfg.experiment)):
            if value:
                env[name] = value
        if cfg.otlp_enabled and cfg.endpoint:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = cfg.endpoint
            env["OTEL_EXPORTER_OTLP_PROTOCOL"] = cfg.protocol
        env["OTEL_RL_EXPORTERS"] = ",".join(cfg.exporters)
        if cfg.file_enabled:
            env["OTEL_RL_RUN_DIR"] = os.path.abspath(str(cfg.run_dir))
        env["OTEL_METRIC_EXPORT_INTERVAL"] = str(int(cfg.metric_export_interval_s * 1000))
        env["OTEL_RL_CONSOLE"] = "false"
    if rank is not None:
        env["RANK"] = str(rank)
    if world_size is not None:
        env["WORLD_SIZE"] = str(world_size)
    elif tel is not None and tel.config.world_size:
        env["WORLD_SIZE"] = str(tel.config.world_size)
    return env


def _worker_telemetry() -> otel_rl.Telemetry | None:
    tel = otel_rl.get_telemetry()
    if tel is None:
        try:
            tel = otel_rl.init()
        except Exception as exc:  # the worker's real work goes on without telemetry
            logger.warning("otel-rl: could not start telemetry in this Ray worker: %s", exc)
            return None
    return tel


def stage(name: str | None = None, *, cluster: str | None = None, offload: bool = False) -> Callable[[F], F]:
    """Decorate an actor method: run it as stage ``name`` (default: the method's name) in the
    trace of the caller that used ``remote``. Called without a context, it runs as a stage of
    its own trace (or of the worker's current step)."""

    def decorate(fn: F) -> F:
        stage_name = name or fn.__name__

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            context = kwargs.pop(CONTEXT_KWARG, None)
            tel = _worker_telemetry()
            if tel is None:
                return fn(*args, **kwargs)
            if context is None:
                with tel.stage(stage_name, cluster=cluster, offload=offload):
                    return fn(*args, **kwargs)
            with tel.join(context), tel.stage(stage_name, cluster=cluster, offload=offload):
                return fn(*args, **kwargs)

        # Ray checks call arguments against the method's signature, unwrapping decorators
        # through __wrapped__: drop that link and declare the extra keyword instead.
        signature = inspect.signature(fn)
        del wrapper.__wrapped__  # type: ignore[attr-defined]
        if CONTEXT_KWARG not in signature.parameters:
            params = list(signature.parameters.values())
            extra = inspect.Parameter(CONTEXT_KWARG, inspect.Parameter.KEYWORD_ONLY, default=None)
            at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
            params.insert(at, extra)
            signature = signature.replace(parameters=params)
        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


class RayInstrumentor(Instrumentor):
    """Actor calls carry the caller's trace context, new actors the driver's run: no ``remote()``
    or ``worker_env()`` by hand. Actor methods still declare their stage with ``@stage``.

    ``instrument(carry_context=True, actor_env=True)``: either part can be left out.
    ``uninstrument()``: calls and actors made afterwards are plain Ray ones again.
    """

    pip_extra = "ray"

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("ray >= 2.9",)  # the ray extra's floor

    def _instrument(self, *, carry_context: bool = True, actor_env: bool = True) -> None:
        try:
            from ray import actor
        except ImportError as exc:
            raise ImportError("otel_rl.integrations.ray needs Ray: pip install 'otel-rl[ray]'") from exc
        if carry_context:
            self.patches.replace(actor.ActorMethod, "_remote", _with_context(actor.ActorMethod.__dict__["_remote"]))
        if actor_env:
            self.patches.replace(actor.ActorClass, "_remote", _with_run_env(actor.ActorClass.__dict__["_remote"]))


def _takes_context(method: Any) -> bool:
    """Whether a Ray ``ActorMethod`` is a ``stage``-decorated method (its signature declares the keyword)."""
    params = getattr(method, "_signature", None)
    if params is None:  # Ray before ActorMethod kept its signature
        signatures = getattr(getattr(method, "_actor", None), "_ray_method_signatures", None) or {}
        params = signatures.get(getattr(method, "_method_name", None))
    return any(getattr(p, "name", None) == CONTEXT_KWARG for p in params or ())


def _with_context(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _remote(self: Any, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        if (kwargs is None or CONTEXT_KWARG not in kwargs) and _takes_context(self):
            context = carrier()
            if context.get("traceparent"):  # no current span: the worker's stage starts its own trace
                kwargs = {**(kwargs or {}), CONTEXT_KWARG: context}
        return original(self, args, kwargs, *rest, **options)

    return _remote


def _with_run_env(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _remote(self: Any, args: Any = None, kwargs: Any = None, **actor_options: Any) -> Any:
        env = worker_env() if otel_rl.get_telemetry() is not None else {}
        if env:
            from ray.runtime_env import RuntimeEnv

            runtime_env = dict(actor_options.get("runtime_env") or {})
            runtime_env["env_vars"] = {**env, **dict(runtime_env.get("env_vars") or {})}
            actor_options["runtime_env"] = RuntimeEnv(**runtime_env)
        return original(self, args, kwargs, **actor_options)

    return _remote


def shutdown() -> None:
    """Flush and stop this worker's telemetry; call it before the actor goes away
    (``ray.kill`` skips a process's exit handlers)."""
    otel_rl.shutdown()


__all__ = ["CONTEXT_KWARG", "RayInstrumentor", "carrier", "remote", "shutdown", "stage", "worker_env"]
