"""AReaL's rollout workflows as trajectories.

AReaL (1.0.4) rolls out with ``RolloutWorkflow.arun_episode(engine, data)`` coroutines that its
``WorkflowExecutor`` runs, one per submitted task (``areal/infra/workflow_executor.py``):
``RLVRWorkflow`` generates once, ``MultiTurnWorkflow`` tries again until the reward is positive,
a user's workflow does what it does with ``engine.agenerate(request)``. With group sampling the
engine hands the executor a ``GroupedRolloutWorkflow`` that runs the episode ``group_size`` times
at once.

:class:`AReaLWorkflowInstrumentor` wraps the executor's task (``_create_workflow_task``, where AReaL
itself knows a task's id, workflow and whether it is an evaluation): each episode becomes one
otel-rl trajectory (``Telemetry.trajectory``), ``rl.sample.id`` ``"<task id>-<n>"``, its group the
task id, ``rl.step`` the policy version the engine serves (``engine.get_version()``). A turn per
``agenerate``: prompt tokens, tokens out and AReaL's stop reason (``length`` marks the trajectory
truncated). The reward is what the episode returned: its ``rewards`` tensor, or the last
interaction's reward for the workflows that return interactions (the OpenAI-style agents; AReaL
discounts it backwards to the earlier ones). Evaluation tasks are left out unless
``instrument(validation=True)``.

Nothing of the rollout changes: the workflow and the engine are wrapped for that one task and the
episode's result is returned as it was. A failure inside otel-rl is logged once and the task runs
unrecorded. The trajectories go to the process's telemetry (in AReaL's default single-controller
mode, the training script's), or one started here with ``framework="areal"`` reading the
``OTEL_*`` / ``OTEL_RL_*`` environment. :func:`otel_rl.integrations.areal.install` instruments
this when AReaL's executor is imported.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import logging
from collections.abc import Collection, Mapping
from typing import Any

import otel_rl
from otel_rl.integrations.base import Instrumentor, Patches, TelemetryOnFirstUse
from otel_rl.semconv import attributes as A

logger = logging.getLogger("otel_rl")

FRAMEWORK = A.RlFrameworkValues.AREAL.value

EXECUTOR_MODULE = "areal.infra.workflow_executor"


class _RecordingEngine:
    """The inference engine an episode generates with, each ``agenerate`` recorded as a turn."""

    def __init__(self, engine: Any, trajectory: Any) -> None:
        self._engine, self._trajectory = engine, trajectory

    async def agenerate(self, request: Any) -> Any:
        with self._trajectory.turn(tokens_in=_length(getattr(request, "input_ids", None))) as turn:
            response = await self._engine.agenerate(request)
            turn.done(_length(getattr(response, "output_tokens", None)), getattr(response, "stop_reason", None))
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class _RecordingWorkflow:
    """One task's workflow: each of its episodes is a trajectory of the task's group."""

    def __init__(self, workflow: Any, telemetry: otel_rl.Telemetry, task_id: Any) -> None:
        self._workflow, self._telemetry, self._task_id = workflow, telemetry, task_id
        self._episodes = itertools.count()

    async def arun_episode(self, engine: Any, data: Any) -> Any:
        sample_id = f"{self._task_id}-{next(self._episodes)}"
        async with self._telemetry.trajectory(sample_id, group=self._task_id, step=_version(engine)) as trajectory:
            result = await self._workflow.arun_episode(_RecordingEngine(engine, trajectory), data)
            reward = episode_reward(result)
            if reward is not None:
                trajectory.reward(reward)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workflow, name)


def episode_reward(result: Any) -> float | None:
    """The reward of what one ``arun_episode`` returned: the mean of its ``rewards`` tensor (one
    element for AReaL's own workflows), or the last interaction's for a dict of interactions;
    None for a rejected episode (None), a result without one, or a tensor off the CPU (reading it
    would wait for the device)."""
    if not isinstance(result, Mapping) or not result:
        return None
    rewards = result.get("rewards")
    if rewards is not None:
        device = getattr(rewards, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            return None
        try:
            return float(rewards.float().mean()) if hasattr(rewards, "float") else float(rewards)
        except (TypeError, ValueError, RuntimeError):
            return None
    last = list(result.values())[-1]
    reward = getattr(last, "reward", None)
    return float(reward) if isinstance(reward, (int, float)) else None


def _version(engine: Any) -> int | None:
    try:
        version = engine.get_version()
    except Exception:  # noqa: BLE001 - an engine without versions: the current step is used
        return None
    return version if isinstance(version, int) else None


def _length(tokens: Any) -> int | None:
    try:
        return len(tokens)
    except TypeError:
        return None


def _recording(workflow: Any, telemetry: otel_rl.Telemetry, task_id: Any) -> Any:
    """``workflow`` for one task; a group's inner workflow is wrapped so each episode counts once."""
    inner = getattr(workflow, "workflow", None)
    if type(workflow).__name__ == "GroupedRolloutWorkflow" and inner is not None:
        grouped = copy.copy(workflow)
        grouped.workflow = _RecordingWorkflow(inner, telemetry, task_id)
        return grouped
    return _RecordingWorkflow(workflow, telemetry, task_id)


def _wrap_create_workflow_task(cls: Any, patches: Patches, validation: bool) -> None:
    original = cls._create_workflow_task
    source = TelemetryOnFirstUse(FRAMEWORK, "AReaL's rollouts")
    reported = [False]

    @functools.wraps(original)
    def _create_workflow_task(self: Any, pending_task: Any) -> Any:
        try:
            telemetry = source.telemetry()
            if telemetry is not None and (validation or not getattr(pending_task, "is_eval", False)):
                workflow = _recording(pending_task.workflow, telemetry, pending_task.task_id)
                pending_task = dataclasses.replace(pending_task, workflow=workflow)
        except Exception:  # the task runs unrecorded
            if not reported[0]:
                reported[0] = True
                logger.warning("otel-rl: could not record an AReaL rollout task; such tasks run unrecorded (said once)", exc_info=True)
        return original(self, pending_task)

    patches.replace(cls, "_create_workflow_task", _create_workflow_task)


class AReaLWorkflowInstrumentor(Instrumentor):
    """Each episode AReaL's ``WorkflowExecutor`` runs is a trajectory (see the module docstring);
    ``uninstrument()`` puts the executor back."""

    pip_extra = "areal"

    def instrumentation_dependencies(self) -> Collection[str]:
        # WorkflowExecutor._create_workflow_task(pending_task) and its dataclass, as areal 1.0.4 defines them
        return ("areal >= 1.0",)

    def _instrument(self, *, validation: bool = False, **kwargs: Any) -> None:
        try:
            from areal.infra import workflow_executor
        except Exception as exc:
            raise ImportError(
                f"otel_rl.integrations.areal_workflow could not import AReaL ({type(exc).__name__}: {exc}): pip install 'otel-rl[areal]'"
            ) from exc
        _wrap_create_workflow_task(workflow_executor.WorkflowExecutor, self.patches, validation)
