"""OpenRLHF: ``python -m otel_rl.integrations.openrlhf ARGS`` runs ``openrlhf.cli.train_ppo_ray ARGS``
with every step it logs sent through otel-rl.

OpenRLHF's trainer (``openrlhf/trainer/ppo_trainer.py``, 0.11.2) builds its trackers in
``BasePPOTrainer.__init__`` into two fixed slots, ``wandb_logger`` and ``tensorboard_logger``, and
has no registry for others. After each step it calls ``log_train(global_step, logs)`` on each, after
each evaluation ``log_eval(global_step, logs)``, and ``close()`` at the end of ``fit``.
:class:`OpenRLHFInstrumentor` wraps ``BasePPOTrainer.__init__`` so that the TensorBoard slot holds
an :class:`OtelLogger`, which hands every call to the TensorBoard logger it found there (when
``--logger.tensorboard_dir`` asked for one) and to otel-rl. The synchronous ``PPOTrainer`` and the
asynchronous ``TrainingActor`` both derive from ``BasePPOTrainer``. Calls follow
``--logger.logging_steps`` (default 1), as the trainer's own trackers do.

The trainer runs in a Ray actor, so the wrap has to happen in that actor's process:

* ``python -m otel_rl.integrations.openrlhf`` with OpenRLHF's arguments starts Ray with a
  ``worker_process_setup_hook`` that installs this module in every Ray worker, then runs
  ``openrlhf.cli.train_ppo_ray`` as ``python -m`` would (``OTEL_*`` / ``OTEL_RL_*`` variables
  travel to the workers with it);
* on a Ray cluster you start yourself, put the hook in the job's runtime environment:
  ``{"worker_process_setup_hook": "otel_rl.integrations.openrlhf.install"}``;
* in a script that builds a ``BasePPOTrainer`` itself: ``OpenRLHFInstrumentor().instrument()``
  (``instrument(worker_spans=True)`` when otel-rl is installed where the model actors run: their
  calls become spans of the step in their processes, as the setup hook does).

Installing only watches for ``openrlhf.trainer.ppo_trainer``: a Ray worker that never imports it
(a vLLM engine, a model shard) imports nothing more (a model shard: until its first traced call).
What arrives: every logged key as a metric (``semconv/mappings/openrlhf.yaml``; evaluation keys as ``eval/<key>``) and an ``rl.log`` event;
each step as a live trace (:mod:`otel_rl.integrations.openrlhf_trace`): an ``rl.step`` span around
the trainer's stage calls, ``generate`` (``actor_infer``), ``make_experience``, ``train_step``
(``actor_train``) and ``model_update``, and in them the Ray model workers' own calls, each in the
worker's process as a stage of its cluster: the actor's, reference model's, critic's and reward
model's ``forward`` (``compute_log_probs`` / ``actor_train``, ``compute_ref_log_probs`` /
``reference``, ``compute_values`` / ``critic``, ``compute_rewards`` / ``reward``), their ``fit``
(``train_step``) and the actor's ``broadcast_to_vllm`` (``model_update``); the step's ``rl.log``
event is in its trace. Where the trainer's methods cannot be wrapped (another OpenRLHF), the
step's trace is rebuilt after the fact from ``timing/generation``, ``timing/make_experience``,
``timing/ppo_train`` and ``timing/broadcast`` instead (``rl.span.reconstructed``), never both.
And the step's sample (``generated_samples``: the decoded sequence, prompt included, as the
response, and its reward) goes to ``log_samples`` when ``OTEL_RL_LOG_SAMPLES`` asks for samples.
With ``--train.agent_func_path``, each agent rollout in the vLLM engines is a trajectory
(:mod:`otel_rl.integrations.openrlhf_agent`). The telemetry is that of an earlier
``otel_rl.init()`` in the process, or one started with ``framework="openrlhf"``, the W&B run name
as ``rl.experiment.name`` and the W&B project as ``service.name`` (the environment wins), and shut
down at ``close()``; a model worker starts its own on its first traced call, from the same
``OTEL_*`` / ``OTEL_RL_*`` variables (``python -m otel_rl.integrations.openrlhf`` gives them all
one ``OTEL_RL_RUN_ID``).
"""

from __future__ import annotations

import functools
import logging
import os
import runpy
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import otel_rl
from otel_rl import environment_variables as ENV
from otel_rl.integrations._import_hooks import when_imported
from otel_rl.integrations.base import GuardedCalls, Instrumentor, Patches, framework_init_options
from otel_rl.integrations.openrlhf_trace import LiveSteps, instrument_live_steps, log_in_step
from otel_rl.integrations.stage_timers import timed_stages
from otel_rl.semconv import attributes as A

logger = logging.getLogger("otel_rl")

FRAMEWORK = A.RlFrameworkValues.OPENRLHF.value
TRAINER_MODULE = "openrlhf.trainer.ppo_trainer"
CLI_MODULE = "openrlhf.cli.train_ppo_ray"
SETUP_HOOK = f"{__name__}.install"
SAMPLES_KEY = "generated_samples"  # [decoded sequence, reward]: a sample, not a metric
EVAL_PREFIX = "eval/"
# The timed phases of BasePPOTrainer.train_step / PPOTrainer.fit, in the order a step runs them;
# their stages and clusters come from semconv/mappings/openrlhf.yaml.
STEP_TIMERS = ("timing/generation", "timing/make_experience", "timing/ppo_train", "timing/broadcast")
STEP_TOTAL = "timing/step_total"
USAGE = (
    "usage: python -m otel_rl.integrations.openrlhf [OpenRLHF's train_ppo_ray options]\n\n"
    "Runs openrlhf.cli.train_ppo_ray with those options on a Ray whose workers all send what the\n"
    "trainer logs through otel-rl (OTEL_EXPORTER_OTLP_ENDPOINT for a collector, else a run folder).\n"
    "OpenRLHF's own options follow.\n"
)


def step_stages(logs: Mapping[str, Any]) -> tuple[list[tuple[str, Any, str | None]], Any]:
    """``([(rl.stage, seconds, rl.cluster), ...], timing/step_total)`` of one logged step, for
    ``Telemetry.trace_finished_step``; no stages when the step logged no timer."""
    return timed_stages(logs, STEP_TIMERS, FRAMEWORK), logs.get(STEP_TOTAL)


class OtelLogger:
    """A tracker with OpenRLHF's logger interface (``log_train``, ``log_eval``, ``close``, as its
    ``WandbLogger`` and ``TensorboardLogger`` in ``openrlhf/utils/logging_utils.py``) that sends to
    otel-rl and hands every call on to ``inner``, the tracker it took the place of.

    ``live_steps`` holds the trainer's steps as its wrapped calls trace them live
    (:mod:`otel_rl.integrations.openrlhf_trace`): a step traced live has its ``rl.log`` event in
    its trace and is not rebuilt from its timers; any other step is.

    Errors of otel-rl are reported once through the ``otel_rl`` logger and never reach the trainer;
    the inner tracker's own errors reach it as they did before.
    """

    def __init__(self, args: Any = None, inner: Any = None, *, telemetry: otel_rl.Telemetry | None = None) -> None:
        self.inner = inner
        self._calls = GuardedCalls("the OpenRLHF logger")
        self._closed = False
        self._owned = False
        if telemetry is None:
            telemetry = otel_rl.get_telemetry()
        if telemetry is None:
            telemetry = otel_rl.init(**_init_options(args))
            self._owned = True
        self.telemetry = telemetry
        self.live_steps = LiveSteps(telemetry, self._calls)  # filled by the trainer's wrapped calls, if any

    def log_train(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        if self.inner is not None:
            self.inner.log_train(global_step, logs_dict)
        if self._closed or not isinstance(logs_dict, Mapping):
            return
        values = {k: v for k, v in logs_dict.items() if k != SAMPLES_KEY and v is not None}
        context = self.live_steps.traced(global_step)
        self._log("log_train", values, global_step, context)
        stages, total = step_stages(values)
        if stages and context is None:  # a step traced live is not rebuilt from its timers too
            trace = functools.partial(self.telemetry.trace_finished_step, step_seconds=total)
            self._guard("trace", trace, global_step, stages)
        sample = logs_dict.get(SAMPLES_KEY)
        if isinstance(sample, Sequence) and not isinstance(sample, str) and len(sample) >= 2 and self.telemetry.config.log_samples:
            self._guard("samples", self.telemetry.log_samples, [{"response": sample[0], "reward": sample[1]}], global_step)

    def log_eval(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        if self.inner is not None:
            self.inner.log_eval(global_step, logs_dict)
        if self._closed or not isinstance(logs_dict, Mapping):
            return
        values = {EVAL_PREFIX + str(k): v for k, v in logs_dict.items() if v is not None}
        self._log("log_eval", values, global_step, self.live_steps.traced(global_step))

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        if self._closed:
            return
        self._closed = True
        self.live_steps.close()  # a step fit left open (its prompts ran out before it trained)
        self._guard("close", self.telemetry.shutdown if self._owned else self.telemetry.flush)

    def _log(self, what: str, values: Mapping[str, Any], step: int, context: Mapping[str, Any] | None) -> None:
        if context is None:
            self._guard(what, self.telemetry.log, values, step)
        else:  # the step's rl.log event in the step's trace
            self._guard(what, log_in_step, self.telemetry, context, values, step)

    def _guard(self, what: str, function: Any, *args: Any) -> None:
        self._calls(what, self.telemetry.config.strict, function, *args)


def _init_options(args: Any) -> dict[str, Any]:
    """``otel_rl.init()`` options from OpenRLHF's arguments: its W&B project and run name."""
    wandb = getattr(getattr(args, "logger", None), "wandb", None)
    return framework_init_options(FRAMEWORK, getattr(wandb, "project", None), getattr(wandb, "run_name", None))


def _wrap_trainer_init(cls: Any, patches: Patches) -> None:
    original_init = cls.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        inner = getattr(self, "tensorboard_logger", None)
        if isinstance(inner, OtelLogger):
            return
        try:
            otel = OtelLogger(getattr(self, "args", None), inner)
            self.tensorboard_logger = otel
            otel.live_steps.attach(self)
        except Exception:  # telemetry must never stop a training run from starting
            logger.warning("otel-rl: could not attach to OpenRLHF's trainer; it runs without otel-rl", exc_info=True)

    patches.replace(cls, "__init__", __init__)


class OpenRLHFInstrumentor(Instrumentor):
    """OpenRLHF's ``BasePPOTrainer`` sends what it logs to otel-rl (see the module docstring).

    ``uninstrument()`` puts ``BasePPOTrainer.__init__`` back; trainers built before keep their
    logger until they close it.
    """

    pip_extra = "openrlhf"

    def instrumentation_dependencies(self) -> Collection[str]:
        # log_train / log_eval / close on the two tracker slots and the timing/* keys: 0.11.2's
        return ("openrlhf >= 0.11",)

    def _instrument(self, *, worker_spans: bool = False, **kwargs: Any) -> None:
        # worker_spans: the model actors' calls go through otel-rl's run_method, which their
        # processes must be able to import. The setup hook (install) makes sure of it; in a script,
        # only the user knows whether otel-rl is installed where the actors run.
        try:
            from openrlhf.trainer import ppo_trainer
        except Exception as exc:  # OpenRLHF's import pulls torch, Ray, vLLM and DeepSpeed
            raise ImportError(
                f"otel_rl.integrations.openrlhf could not import OpenRLHF ({type(exc).__name__}: {exc}): pip install 'otel-rl[openrlhf]'"
            ) from exc
        _wrap_trainer_init(ppo_trainer.BasePPOTrainer, self.patches)
        instrument_live_steps(
            ppo_trainer.BasePPOTrainer, getattr(ppo_trainer, "RayActorGroup", None), self.patches, route_workers=worker_spans
        )


def install() -> None:
    """Instrument OpenRLHF's trainer, and its agent executor (:mod:`.openrlhf_agent`), when this
    process imports them (now, if it has): the Ray ``worker_process_setup_hook``. Never imports
    OpenRLHF itself."""
    from otel_rl.integrations.openrlhf_agent import AGENT_MODULE, OpenRLHFAgentInstrumentor

    # every worker of a job with this hook runs it, so every model actor can import otel-rl
    when_imported(TRAINER_MODULE, lambda _module: OpenRLHFInstrumentor().instrument_on_import(worker_spans=True))
    when_imported(AGENT_MODULE, lambda _module: OpenRLHFAgentInstrumentor().instrument_on_import())


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m otel_rl.integrations.openrlhf ARGS``: ``openrlhf.cli.train_ppo_ray ARGS`` on a
    local Ray started with this module's setup hook in every worker."""
    args = list(sys.argv[1:] if argv is None else argv)
    import ray

    if {"-h", "--help"} & set(args):
        print(USAGE)
    elif not ray.is_initialized():
        env_vars = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
        try:  # one run for the trainer and every model worker that starts telemetry
            env_vars.setdefault(ENV.OTEL_RL_RUN_ID, str(otel_rl.resolve_config({}).run_id))
        except Exception:  # a setting the trainer will report itself; each process keeps a run of its own
            logger.debug("otel-rl: no run id for the Ray job", exc_info=True)
        # what train_ppo_ray sets when it starts Ray itself (openrlhf/cli/train_ppo_ray.py, train)
        for name, default in (("TOKENIZERS_PARALLELISM", "true"), ("NCCL_DEBUG", "WARN"), ("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1")):
            env_vars[name] = os.environ.get(name, default)
        ray.init(runtime_env={"worker_process_setup_hook": SETUP_HOOK, "env_vars": env_vars})
    install()
    sys.argv = [CLI_MODULE, *args]
    runpy.run_module(CLI_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
