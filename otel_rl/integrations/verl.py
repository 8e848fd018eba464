"""verl: ``trainer.logger=['console','otel']`` sends every metric verl logs through otel-rl.

verl's ``Tracking`` (verl/utils/tracking.py) builds its backends from a fixed list of names
(``Tracking.supported_backend``) and has no registry for new ones, so :class:`VerlInstrumentor`
adds ``"otel"`` to that list and wraps ``Tracking.__init__`` (build an :class:`OtelBackend` when
``"otel"`` is asked for) and ``Tracking.finish`` (flush it). Nothing else of verl changes, and
``VerlInstrumentor().uninstrument()`` puts those back.

That must happen in the process that builds the trainer's ``Tracking``: with
``verl.trainer.main_ppo`` that is the TaskRunner Ray actor, not the driver. Importing this
module does it when verl is installed (:func:`install`), and verl imports it in every process
when told to:

* otel-rl registers this module as a ``verl.plugins`` entry point, which verl loads on
  ``import verl`` (verl >= 0.9): nothing to add but ``trainer.logger=['console','otel']``;
* otherwise ``VERL_USE_EXTERNAL_MODULES=otel_rl.integrations.verl`` in the environment (verl
  >= 0.6; on a multi-node Ray cluster pass it to the workers with
  ``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=otel_rl.integrations.verl``);
* or call ``VerlInstrumentor().instrument()`` (which checks verl's version) or ``install()``
  yourself where your own trainer builds ``Tracking``.

The backend reuses the telemetry of an earlier ``otel_rl.init()`` in the process (and leaves it
running at ``finish``); otherwise it starts one with ``framework="verl"``, the experiment name as
``rl.experiment.name`` and the project name as ``service.name`` (``OTEL_*`` / ``OTEL_RL_*``
variables win), and shuts it down at ``finish``. verl logs a step's metrics once the step is
over, so they arrive as metrics and an ``rl.log`` event, and its ``timing_s/*`` become that step's
trace after the fact (``Telemetry.trace_finished_step``): an ``rl.step`` span of ``timing_s/step``
ending at the log call, with the stage timers as children in the order verl's trainer runs them,
each marked ``rl.span.reconstructed``. ``reconstruct_spans=False`` turns that off.

Validation generations: with ``trainer.log_val_generations=N`` verl's trainer hands N
``(input, output, score)`` samples per validation to ``ValidationGenerationsLogger.log(loggers,
samples, step)``; when ``loggers`` names ``"otel"`` they go to ``Telemetry.log_samples`` of the
process's telemetry (``prompt``, ``response``, ``reward``), so with ``log_samples=K`` /
``OTEL_RL_LOG_SAMPLES=K`` up to K of them reach the run folder and the trackers.

Agent loop: the same import has verl's agent loop instrumented when verl imports it
(:mod:`otel_rl.integrations.verl_agent_loop`): each rollout of an ``AgentLoopWorker`` becomes a
trajectory (turns, tool calls, reward). ``VerlInstrumentor().instrument(agent_loop=False)`` leaves
it out.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import weakref
from collections.abc import Collection, Mapping
from typing import Any

import otel_rl
from otel_rl.integrations._import_hooks import when_imported
from otel_rl.integrations.base import GuardedCalls, Instrumentor, Patches
from otel_rl.integrations.verl_agent_loop import BACKEND, VerlAgentLoopInstrumentor, init_options
from otel_rl.integrations.verl_timers import step_stages

logger = logging.getLogger("otel_rl")

AGENT_LOOP_MODULE = "verl.experimental.agent_loop"  # its import (hydra, Ray, transformers) waits for verl's own
_INSTALLED = "_otel_rl_installed"  # marks a Tracking class already wrapped
# Telemetry objects an OtelBackend shut down: a later Tracking must start a fresh one.
_finished: weakref.WeakSet[otel_rl.Telemetry] = weakref.WeakSet()


class OtelBackend:
    """A verl ``Tracking`` backend (``log(data, step)``, ``finish()``) that forwards to otel-rl.

    ``telemetry`` overrides the choice between the process's current telemetry and a new one.
    Errors while logging are reported once through the ``otel_rl`` logger, never raised
    (except ``ValueError`` in otel-rl's strict mode, which asks for exactly that).
    """

    def __init__(
        self,
        project_name: str | None = None,
        experiment_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        telemetry: otel_rl.Telemetry | None = None,
        reconstruct_spans: bool = True,
    ) -> None:
        self._calls = GuardedCalls(f"the verl {BACKEND!r} backend")
        self._reconstruct_spans = reconstruct_spans
        self._closed = False
        current = otel_rl.get_telemetry()
        if telemetry is None and current is not None and current not in _finished:
            telemetry = current
        self._owned = telemetry is None
        if telemetry is None:
            telemetry = otel_rl.init(**init_options(project_name, experiment_name))
        self.telemetry = telemetry
        if isinstance(config, Mapping) and config:
            self._guard("log_hparams", telemetry.log_hparams, config)

    def log(self, data: Mapping[str, Any], step: int | None) -> None:
        """One step's metrics as verl's trainer logs them (``Tracking.log`` calls this)."""
        if not self._closed:
            self._guard("log", self.telemetry.log, data, step)
            if self._reconstruct_spans and step is not None:
                self._guard("trace", self._trace_step, data, step)

    def _trace_step(self, data: Mapping[str, Any], step: int) -> None:
        stages, step_seconds = step_stages(data)
        if stages:
            self.telemetry.trace_finished_step(step, stages, step_seconds=step_seconds)

    def finish(self) -> None:
        """Flush; shut the telemetry down if this backend started it. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._owned:
            _finished.add(self.telemetry)
            self._guard("shutdown", self.telemetry.shutdown)
        else:
            self._guard("flush", self.telemetry.flush)

    def _guard(self, what: str, function: Any, *args: Any) -> None:
        self._calls(what, self.telemetry.config.strict, function, *args)


def _finish_backend(tracking: Any) -> None:
    backend = (getattr(tracking, "logger", None) or {}).get(BACKEND)
    if isinstance(backend, OtelBackend):
        backend.finish()


def install() -> bool:
    """Make ``"otel"`` a backend name of verl's ``Tracking`` (what importing this module does:
    :class:`VerlInstrumentor` instrumented on import). Returns False when verl cannot be imported
    (reported once); safe to call again."""
    try:
        from verl.utils import tracking  # noqa: F401 - imported here to report a broken verl
    except Exception as exc:  # verl's import pulls torch, ray, tensordict: any of them may fail
        logger.warning(
            "otel-rl: verl could not be imported (%s: %s); trainer.logger=[..., %r] is not available. pip install 'otel-rl[verl]'",
            type(exc).__name__,
            exc,
            BACKEND,
        )
        return False
    return VerlInstrumentor().instrument_on_import()


class VerlInstrumentor(Instrumentor):
    """verl's ``Tracking`` accepts ``"otel"`` (``trainer.logger=['console','otel']``) and builds an
    :class:`OtelBackend` for it.

    ``instrument(reconstruct_spans=True)``: the backends' option (see :class:`OtelBackend`);
    ``agent_loop=True``: verl's agent loop is instrumented when verl imports it
    (:class:`~otel_rl.integrations.verl_agent_loop.VerlAgentLoopInstrumentor`).
    ``uninstrument()`` puts ``Tracking`` back as verl defines it: ``"otel"`` is rejected again;
    the agent loop, when instrumented through this, is put back too.
    """

    pip_extra = "verl"

    def instrumentation_dependencies(self) -> Collection[str]:
        # Tracking.supported_backend and finish() as wrapped here, and VERL_USE_EXTERNAL_MODULES
        # (verl >= 0.6) as the module docstring documents; the key set is verl 0.9.1's.
        return ("verl >= 0.6",)

    def _instrument(self, *, reconstruct_spans: bool = True, agent_loop: bool = True) -> None:
        try:
            from verl.utils import tracking
        except Exception as exc:  # verl's import pulls torch, ray, tensordict: any of them may fail
            raise ImportError(
                f"otel_rl.integrations.verl could not import verl ({type(exc).__name__}: {exc}): pip install 'otel-rl[verl]'"
            ) from exc
        if agent_loop:
            _watch_agent_loop(self.patches)
        cls = tracking.Tracking
        if getattr(cls, _INSTALLED, False):
            # Wrapped by an earlier import of this module (one instrumentor per module object).
            logger.debug("otel-rl: verl's Tracking already builds the %r backend", BACKEND)
            return
        _wrap_tracking(cls, self.patches, reconstruct_spans)
        generations = getattr(tracking, "ValidationGenerationsLogger", None)
        if generations is not None and callable(getattr(generations, "log", None)):
            _wrap_generations_logger(generations, self.patches)


def _watch_agent_loop(patches: Patches) -> None:
    """Instrument verl's agent loop once verl imports it (now, if it has); undone with the rest."""
    instrumentor = VerlAgentLoopInstrumentor()
    by_us: list[bool] = []

    def on_import(module: Any) -> None:
        if not instrumentor.is_instrumented:
            by_us.append(instrumentor.instrument_on_import())

    patches.on_restore(when_imported(AGENT_LOOP_MODULE, on_import))

    def undo() -> None:
        if by_us and instrumentor.is_instrumented:
            instrumentor.uninstrument()

    patches.on_restore(undo)


def log_val_generations(samples: Any, step: Any) -> None:
    """verl's validation samples (``(input, output, score)`` tuples) to the process's telemetry."""
    telemetry = otel_rl.get_telemetry()
    if telemetry is None or not telemetry.config.log_samples:
        return
    rows: list[Any] = []
    for sample in samples:
        if isinstance(sample, (tuple, list)) and len(sample) >= 3:
            rows.append({"prompt": sample[0], "response": sample[1], "reward": sample[2]})
        else:
            rows.append(sample)  # log_samples reports it (not a mapping)
    telemetry.log_samples(rows, None if step is None else int(step))


def _wrap_generations_logger(cls: Any, patches: Patches) -> None:
    """``ValidationGenerationsLogger.log`` also hands the samples to otel-rl when ``"otel"`` is a logger."""
    original_log = cls.log
    reported: set[str] = set()

    @functools.wraps(original_log)
    def log(self: Any, loggers: Any, samples: Any, step: Any) -> Any:
        result = original_log(self, loggers, samples, step)
        names = [loggers] if isinstance(loggers, str) else list(loggers or ())
        if BACKEND in names:
            try:
                log_val_generations(samples, step)
            except Exception:  # never into verl's validation
                if "generations" not in reported:
                    reported.add("generations")
                    logger.warning("otel-rl: handing verl's validation generations to log_samples failed (reported once)", exc_info=True)
        return result

    patches.replace(cls, "log", log)


def _wrap_tracking(cls: Any, patches: Patches, reconstruct_spans: bool) -> None:
    """Add ``"otel"`` to ``Tracking.supported_backend`` and wrap ``__init__`` / ``finish`` (through ``patches``)."""
    if BACKEND not in cls.supported_backend:
        patches.replace(cls, "supported_backend", [*cls.supported_backend, BACKEND])

    original_init = cls.__init__
    signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        backends = given.get("default_backend")
        names = [backends] if isinstance(backends, str) else list(backends or ())
        if BACKEND in names:
            self.logger[BACKEND] = OtelBackend(
                given.get("project_name"), given.get("experiment_name"), given.get("config"), reconstruct_spans=reconstruct_spans
            )

    patches.replace(cls, "__init__", __init__)

    original_finish = cls.__dict__.get("finish")
    if original_finish is not None:

        @functools.wraps(original_finish)
        def finish(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original_finish(self, *args, **kwargs)
            finally:
                _finish_backend(self)

        patches.replace(cls, "finish", finish)
    else:
        # Older verl flushes its backends only in __del__.
        original_del = cls.__dict__.get("__del__")

        def __del__(self: Any) -> None:
            try:
                if original_del is not None:
                    original_del(self)
            finally:
                _finish_backend(self)

        patches.replace(cls, "__del__", __del__)
    patches.replace(cls, _INSTALLED, True)


# Loaded by verl's plugin / VERL_USE_EXTERNAL_MODULES hooks, or imported by the user: install now.
# find_spec of a top-level name only looks verl up; install() imports it.
if importlib.util.find_spec("verl") is not None:
    install()
