"""OpenRLHF's agent functions as trajectories.

With ``--train.agent_func_path``, OpenRLHF runs the user's ``AgentExecutor`` inside each vLLM
engine actor (``openrlhf/utils/agent.py``, 0.11.2): ``MultiTurnAgentExecutor.execute`` builds one
``AgentInstance`` per prompt and alternates ``llm_engine.generate`` with ``agent_instance.step``
until the instance says ``done``. Each ``execute`` becomes one otel-rl trajectory: a turn per
generation (prompt tokens, tokens out, finish reason), an ``environment`` tool call per ``step``
(its feedback as the result when samples are on), and the summed reward. Nothing of the rollout
changes: the engine and the instance are wrapped for that one call and the executor's result is
returned as it was.

:func:`otel_rl.integrations.openrlhf.install` (the Ray setup hook) also instruments this when a
worker imports ``openrlhf.utils.agent``. The trajectories go to the process's telemetry, or to one
started in the engine's process with ``framework="openrlhf"`` (once; the ``OTEL_*`` variables the
launcher passed say where).
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import os
from collections.abc import Collection
from typing import Any

from otel_rl.integrations.base import Instrumentor, Patches, TelemetryOnFirstUse
from otel_rl.semconv import attributes as A

logger = logging.getLogger("otel_rl")

FRAMEWORK = A.RlFrameworkValues.OPENRLHF.value

AGENT_MODULE = "openrlhf.utils.agent"
ENVIRONMENT_TOOL = "environment"  # AgentInstance.step: the environment's answer to one action


class _RecordingEngine:
    """The vLLM engine an executor generates with, each ``generate`` recorded as a turn."""

    def __init__(self, engine: Any, trajectory: Any) -> None:
        self._engine, self._trajectory = engine, trajectory

    async def generate(self, prompt_token_ids: Any, sampling_params: Any, **kwargs: Any) -> Any:
        with self._trajectory.turn(tokens_in=_length(prompt_token_ids)) as turn:
            output = await self._engine.generate(prompt_token_ids, sampling_params, **kwargs)
            first = output.outputs[0] if getattr(output, "outputs", None) else None
            if first is not None:
                turn.done(_length(getattr(first, "token_ids", None)), getattr(first, "finish_reason", None), getattr(first, "text", None))
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def _length(tokens: Any) -> int | None:
    try:
        return len(tokens)
    except TypeError:
        return None


def _recording_instance(cls: type, trajectory: Any) -> type:
    """The user's AgentInstance class with each ``step`` recorded as an ``environment`` tool call."""

    async def step(self: Any, state_dict: dict, **kwargs: Any) -> Any:
        with trajectory.tool(ENVIRONMENT_TOOL) as call:
            result = await cls.step(self, state_dict, **kwargs)
            if isinstance(result, dict):
                call.done(result=result.get("environment_feedback"))
        return result

    return type(cls.__name__, (cls,), {"step": step, "__module__": cls.__module__, "__qualname__": cls.__qualname__})


def _wrap_execute(cls: Any, patches: Patches) -> None:
    original = cls.execute
    source = TelemetryOnFirstUse(FRAMEWORK, "the OpenRLHF agent's rollouts")
    ids = itertools.count()

    @functools.wraps(original)
    async def execute(
        self: Any, prompt: Any, label: Any, sampling_params: Any, max_length: int, hf_tokenizer: Any, llm_engine: Any, images: Any = None
    ) -> Any:
        tel = source.telemetry()
        instance_cls = getattr(self, "agent_instance_cls", None)
        if tel is None or not isinstance(instance_cls, type):
            return await original(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images)
        async with tel.trajectory(f"{os.getpid()}-{next(ids)}") as trajectory:
            recording = copy.copy(self)
            recording.agent_instance_cls = _recording_instance(instance_cls, trajectory)
            engine = _RecordingEngine(llm_engine, trajectory)
            result = await original(recording, prompt, label, sampling_params, max_length, hf_tokenizer, engine, images)
            reward = result.get("reward") if isinstance(result, dict) else None
            if isinstance(reward, (int, float)):
                trajectory.reward(float(reward))
        return result

    patches.replace(cls, "execute", execute)


class OpenRLHFAgentInstrumentor(Instrumentor):
    """Each ``MultiTurnAgentExecutor.execute`` is a trajectory (see the module docstring);
    ``uninstrument()`` puts ``execute`` back."""

    pip_extra = "openrlhf"

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("openrlhf >= 0.11",)

    def _instrument(self, **kwargs: Any) -> None:
        try:
            from openrlhf.utils import agent
        except Exception as exc:
            raise ImportError(f"otel_rl.integrations.openrlhf_agent could not import OpenRLHF ({type(exc).__name__}: {exc})") from exc
        _wrap_execute(agent.MultiTurnAgentExecutor, self.patches)
