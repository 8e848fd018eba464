"""AReaL: ``import otel_rl.integrations.areal`` in the training script sends every step AReaL's
``StatsLogger`` commits through otel-rl.

AReaL (``areal/utils/stats_logger.py``, 1.0.4) builds its tracker backends (W&B, SwanLab, trackio,
TensorBoard) inside ``StatsLogger`` and has no registry for others. Its trainers call
``StatsLogger.commit(epoch, step, global_step, data)`` once per step with what ``stats_tracker``
exported (``ppo_actor/*``, ``rollout/*``, ``timeperf/*``, ...), and ``close()`` at the end.
:class:`AReaLInstrumentor` wraps both: each committed dict (less the ``__count`` keys AReaL itself
drops) goes to ``Telemetry.log`` at the step AReaL logs it at, the ``timeperf/*`` timers become
the step's trace after the fact (``rl.span.reconstructed``; ``rollout``, ``recompute_logp``,
``ref_logp``, ``compute_advantage``, ``train_step``, ``update_weights``, ... in the order
``PPOTrainer.train`` runs them), and ``close()`` flushes. AReaL commits on rank 0 only, and so does
this. The keys map through ``semconv/mappings/areal.yaml``.

The telemetry is that of an earlier ``otel_rl.init()`` in the process, or one started on the first
commit with ``framework="areal"``, the experiment name as ``service.name`` and the trial name as
``rl.experiment.name`` (the environment wins), shut down at ``close()``. Importing this module
instruments AReaL (now if ``areal.utils.stats_logger`` is imported, else when it is);
``AReaLInstrumentor().uninstrument()`` puts AReaL back. The rollout workflows' episodes become
trajectories too (:mod:`otel_rl.integrations.areal_workflow`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import otel_rl
from otel_rl.integrations._import_hooks import when_imported
from otel_rl.integrations.base import GuardedCalls, Instrumentor, Patches, framework_init_options
from otel_rl.integrations.stage_timers import timed_stages
from otel_rl.semconv import attributes as A

logger = logging.getLogger("otel_rl")

FRAMEWORK = A.RlFrameworkValues.AREAL.value
STATS_LOGGER_MODULE = "areal.utils.stats_logger"
TIMER_PREFIX = "timeperf/"
COUNT_SUFFIX = "__count"  # a scalar's sample count, which StatsLogger.commit leaves out
# PPOTrainer.train's timers (areal/trainer/rl_trainer.py, 1.0.4) in the order a step runs them.
STEP_TIMERS = (
    "rollout",
    "critic_values",
    "ref_logp",
    "teacher_logp",
    "recompute_logp",
    "compute_advantage",
    "train_step",
    "critic_train_step",
    "update_weights",
    "save",
    "checkpoint_for_recover",
    "eval",
    "clear_batches",
)


def step_stages(values: Mapping[str, Any]) -> list[tuple[str, Any, str | None]]:
    """``[(rl.stage, seconds, rl.cluster), ...]`` of one committed step, in ``train()``'s order."""
    return timed_stages(values, _TIMER_KEYS, FRAMEWORK)


_TIMER_KEYS = tuple(TIMER_PREFIX + timer for timer in STEP_TIMERS)


class _Sink:
    """Where one StatsLogger's commits go: the process's telemetry or one it started."""

    def __init__(self, stats_logger: Any) -> None:
        self.calls = GuardedCalls("the AReaL StatsLogger hook")
        current = otel_rl.get_telemetry()
        self.owned = current is None
        if current is None:
            config = getattr(stats_logger, "exp_config", None)
            options = framework_init_options(FRAMEWORK, getattr(config, "experiment_name", None), getattr(config, "trial_name", None))
            current = otel_rl.init(**options)
        self.telemetry: otel_rl.Telemetry = current

    def commit(self, first_step: int, data: Sequence[Mapping[str, Any]]) -> None:
        tel = self.telemetry
        for offset, item in enumerate(data):
            step = first_step + offset
            values = {k: v for k, v in item.items() if not str(k).endswith(COUNT_SUFFIX)}
            self.calls("commit", tel.config.strict, tel.log, values, step)
            stages = step_stages(values)
            if stages:
                self.calls("trace", tel.config.strict, tel.trace_finished_step, step, stages)

    def close(self) -> None:
        self.calls("close", self.telemetry.config.strict, self.telemetry.shutdown if self.owned else self.telemetry.flush)


_SINK = "_otel_rl_sink"


def _is_lead_rank() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0)


def _wrap_stats_logger(cls: Any, patches: Patches) -> None:
    original_commit, original_close = cls.commit, cls.close

    @functools.wraps(original_commit)
    def commit(self: Any, epoch: int, step: int, global_step: int, data: Any) -> Any:
        # the step StatsLogger logs the first dict at (it never goes back: a step once logged is past)
        first_step = max(global_step, getattr(self, "_last_commit_step", -1) + 1)
        result = original_commit(self, epoch, step, global_step, data)
        items = [data] if isinstance(data, Mapping) else list(data) if isinstance(data, Sequence) else []
        if _is_lead_rank() and all(isinstance(i, Mapping) for i in items):
            try:
                sink = self.__dict__.get(_SINK) or self.__dict__.setdefault(_SINK, _Sink(self))
            except Exception:  # telemetry must never stop training
                logger.warning("otel-rl: could not start telemetry for AReaL's StatsLogger; it runs without otel-rl", exc_info=True)
                return result
            sink.commit(first_step, items)
        return result

    @functools.wraps(original_close)
    def close(self: Any) -> Any:
        result = original_close(self)
        sink = self.__dict__.get(_SINK)
        if sink is not None:
            sink.close()
        return result

    patches.replace(cls, "commit", commit)
    patches.replace(cls, "close", close)


class AReaLInstrumentor(Instrumentor):
    """AReaL's ``StatsLogger`` sends each commit to otel-rl (see the module docstring)."""

    pip_extra = "areal"

    def instrumentation_dependencies(self) -> Collection[str]:
        # commit(epoch, step, global_step, data) and close() as areal 1.0.4 defines them
        return ("areal >= 1.0",)

    def _instrument(self, **kwargs: Any) -> None:
        try:
            from areal.utils import stats_logger
        except Exception as exc:  # AReaL's import pulls torch, Ray, transformers and its trackers
            raise ImportError(
                f"otel_rl.integrations.areal could not import AReaL ({type(exc).__name__}: {exc}): pip install 'otel-rl[areal]'"
            ) from exc
        _wrap_stats_logger(stats_logger.StatsLogger, self.patches)


def install() -> None:
    """Instrument AReaL's StatsLogger and its rollout workflows (``areal_workflow``) once this
    process imports them (now, for what it has)."""
    from otel_rl.integrations.areal_workflow import EXECUTOR_MODULE, AReaLWorkflowInstrumentor

    when_imported(STATS_LOGGER_MODULE, lambda _module: AReaLInstrumentor().instrument_on_import())
    when_imported(EXECUTOR_MODULE, lambda _module: AReaLWorkflowInstrumentor().instrument_on_import())


install()
