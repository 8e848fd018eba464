"""verl's agent loop: every rollout an ``AgentLoopWorker`` runs becomes an otel-rl trajectory.

verl's own rollout tracing (``verl.utils.rollout_trace``: ``rollout_trace_op``,
``RolloutTraceConfig``) picks its backend from a fixed list (weave, mlflow, trackio) and does not
see tool calls, so :class:`VerlAgentLoopInstrumentor` wraps the points where verl already knows
what a trajectory is made of, all async methods of verl 0.9.1:

* ``AgentLoopWorker._run_agent_loop``: one trajectory per sample (``Telemetry.trajectory``), from
  verl's own fields: ``rl.sample.id`` ``"<sample_index>-<rollout_n>"`` (``session_id`` instead of
  ``rollout_n`` where verl passes one), ``rl.sample.group_id`` the sample's ``uid`` (its GRPO
  group; the sample index without one), ``rl.step`` the trainer's ``global_steps``; the reward
  verl computed in the loop (``reward_score``, with the numeric ``reward_extra_info`` as its
  components). Validation rollouts are left out unless ``instrument(validation=True)``.
* ``LLMServerClient.generate`` (and its subclasses', ``FullyAsyncLLMServerClient``): one turn per
  generation, whichever agent loop asks for it: prompt and response token counts, verl's stop
  reason, and the server's address as the load balancer picked it (``_acquire_server``).
* ``ToolAgentLoop._handle_generating_state``: the turn's finish reason as the loop decided it
  (``"length"`` when the response budget ran out: the trajectory counts as truncated;
  ``"tool_calls"``; ``"stop"``) and, when samples are on, the assistant's text.
* ``ToolAgentLoop._call_tool``: one tool call per call, with the tool's name, call id and
  arguments; verl turns a tool's failure into a reply (unknown tool, arguments that are no JSON,
  an exception in the tool), which marks the call failed (``error.type`` ``unknown_tool``,
  ``invalid_arguments``, ``tool_error``; status ERROR).

The trajectory is carried to the turns and tool calls by a context variable, so hundreds of
rollouts run at once in one event loop. Nothing here raises into verl: a failure inside otel-rl
is logged once (the ``otel_rl`` logger) and the rollout goes on unrecorded.

Turning it on: importing :mod:`otel_rl.integrations.verl` (verl's plugin loader does, in every
verl process) instruments the agent loop when verl imports it. Trajectories go to the process's
telemetry; an agent-loop worker (a Ray actor of its own) without one starts it, as the trainer's
``Tracking`` does, when verl's config names the ``otel`` logger (``trainer.logger=[...,'otel']``),
reading the ``OTEL_*`` / ``OTEL_RL_*`` environment. ``VerlAgentLoopInstrumentor().instrument()``
does the same by hand (``start_telemetry=False``: only where a telemetry runs already);
``uninstrument()`` puts verl's methods back.
"""

from __future__ import annotations

import functools
import logging
import numbers
from collections.abc import Callable, Collection, Mapping
from contextvars import ContextVar
from typing import Any

import otel_rl
from otel_rl._sdk.spans.trajectory_spans import TRUNCATED_FINISH_REASON
from otel_rl.integrations.base import Instrumentor, Patches, framework_init_options
from otel_rl.reporting import LOGGER_NAME, ReportOnce
from otel_rl.semconv import attributes as A

logger = logging.getLogger(LOGGER_NAME)

FRAMEWORK = A.RlFrameworkValues.VERL.value
BACKEND = "otel"  # the trainer.logger name that asks for telemetry (integrations/verl.py: the trainer's; here: a worker's)
TRUNCATED, TOOL_CALLS, STOPPED = TRUNCATED_FINISH_REASON, "tool_calls", "stop"
# verl's own replies for a tool call that failed (ToolAgentLoop._call_tool, verl 0.9.1): the
# prefix before the tool's name, and the error type the call gets.
TOOL_FAILURES = (
    ("Unknown function '", "unknown_tool"),
    ("Invalid JSON in arguments for '", "invalid_arguments"),
    ("Error executing tool '", "tool_error"),
)


class _Rollout:
    """One running trajectory and the turn that generated last (for its finish reason)."""

    __slots__ = ("traj", "last_turn")

    def __init__(self, traj: Any) -> None:
        self.traj = traj
        self.last_turn: Any = None


_ROLLOUT: ContextVar[_Rollout | None] = ContextVar("otel_rl_verl_rollout", default=None)
_TURN: ContextVar[Any] = ContextVar("otel_rl_verl_turn", default=None)  # the open turn (nested generate calls pass)
_reported = ReportOnce(logger)


def _report(what: str) -> None:
    """Say once per kind of failure that recording it failed; the rollout goes on."""
    if _reported.first(what):
        logger.warning(
            "otel-rl: recording verl's agent loop failed in %s; the rollout goes on unrecorded there (reported once)", what, exc_info=True
        )


def _guard(what: str, function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except Exception:  # never into verl
        _report(what)
        return None


def _exit(block: Any, exc: BaseException | None) -> None:
    if exc is None:
        block.__exit__(None, None, None)
    else:
        block.__exit__(type(exc), exc, exc.__traceback__)


# --------------------------------------------------------------------------------------------------
# Where trajectories go


class TelemetrySource:
    """The process's telemetry or, in an agent-loop worker whose verl config names the ``otel``
    logger, one started there (once per process; a failure is said once and not retried)."""

    def __init__(self, start_telemetry: bool, validation: bool) -> None:
        self.start_telemetry = start_telemetry
        self.validation = validation
        self._tried = False

    def telemetry(self, worker: Any) -> otel_rl.Telemetry | None:
        tel = otel_rl.get_telemetry()
        if tel is not None or self._tried or not self.start_telemetry:
            return tel
        self._tried = True
        trainer = _section(getattr(worker, "config", None), "trainer")
        if not _names_backend(_section(trainer, "logger")):
            return None
        options = init_options(_section(trainer, "project_name"), _section(trainer, "experiment_name"))
        return _guard("starting telemetry in the agent-loop worker", lambda: otel_rl.init(**options))


def init_options(project_name: Any, experiment_name: Any) -> dict[str, Any]:
    """``otel_rl.init()`` options for a verl process (the trainer's backend, integrations/verl.py,
    and an agent-loop worker): verl's names only as defaults, the environment wins over them."""
    return framework_init_options(FRAMEWORK, project_name, experiment_name)


def _section(config: Any, key: str) -> Any:
    if config is None:
        return None
    try:
        return config.get(key) if hasattr(config, "get") else getattr(config, key, None)
    except Exception:  # an OmegaConf node that cannot resolve: as absent
        return None


def _names_backend(loggers: Any) -> bool:
    if isinstance(loggers, str):
        return loggers == BACKEND
    try:
        return BACKEND in list(loggers or ())
    except TypeError:
        return False


# --------------------------------------------------------------------------------------------------
# Trajectories: AgentLoopWorker._run_agent_loop


def _plain(value: Any) -> Any:
    """A numpy / torch scalar as the Python value it holds."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _open_trajectory(source: TelemetrySource, worker: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> _Rollout | None:
    # verl calls _run_agent_loop(sampling_params, trajectory, *, agent_name, trace, **sample);
    # AgentLoopWorkerTQ passes trajectory= and session_id= by keyword.
    info = args[0] if args else kwargs.get("trajectory")
    if not isinstance(info, Mapping) or (info.get("validate") and not source.validation):
        return None
    tel = source.telemetry(worker)
    if tel is None:
        return None
    index = _plain(info.get("sample_index"))
    rollout_n = _plain(kwargs.get("session_id", info.get("rollout_n")))
    sample_id = index if rollout_n is None else f"{index}-{rollout_n}"
    uid = _plain(kwargs.get("uid"))
    step = _plain(info.get("step"))
    step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None  # -1: verl does not know it
    traj = tel.trajectory(sample_id, group=index if uid is None else uid, step=step)
    traj.__enter__()
    return _Rollout(traj)


def _reward(traj: Any, output: Any) -> None:
    """The reward verl computed inside the loop (none when the trainer scores the batch later)."""
    score = getattr(output, "reward_score", None)
    if score is None:
        return
    extra = getattr(output, "extra_fields", None)
    info = extra.get("reward_extra_info") if isinstance(extra, Mapping) else None
    components = None
    if isinstance(info, Mapping):
        # Only the numbers: reward functions also hand back text (the extracted answer).
        components = {str(name): float(value) for name, value in info.items() if isinstance(value, numbers.Real)} or None
    traj.reward(score, components=components)


def _wrap_run_agent_loop(original: Callable[..., Any], source: TelemetrySource) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _run_agent_loop(self: Any, sampling_params: Any, *args: Any, **kwargs: Any) -> Any:
        rollout = _guard("a trajectory's start", _open_trajectory, source, self, args, kwargs)
        if rollout is None:
            return await original(self, sampling_params, *args, **kwargs)
        token = _ROLLOUT.set(rollout)
        try:
            output = await original(self, sampling_params, *args, **kwargs)
        except BaseException as exc:  # the trajectory failed (cancelled included); verl gets it unchanged
            _guard("a trajectory's end", _exit, rollout.traj, exc)
            raise
        finally:
            _ROLLOUT.reset(token)
        _guard("the reward", _reward, rollout.traj, output)
        _guard("a trajectory's end", _exit, rollout.traj, None)
        return output

    return _run_agent_loop


# --------------------------------------------------------------------------------------------------
# Turns: LLMServerClient.generate / _acquire_server, ToolAgentLoop._handle_generating_state


def _open_turn(traj: Any, prompt_ids: Any) -> Any:
    turn = traj.turn(tokens_in=None if prompt_ids is None else len(prompt_ids))
    turn.__enter__()
    return turn


def _close_turn(turn: Any, output: Any) -> None:
    token_ids = getattr(output, "token_ids", None)
    stop_reason = getattr(output, "stop_reason", None)  # verl's: "completed", "aborted", "length"
    turn.done(tokens_out=None if token_ids is None else len(token_ids), finish_reason=stop_reason)
    turn.__exit__(None, None, None)


def _wrap_generate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        rollout = _ROLLOUT.get()
        if rollout is None or _TURN.get() is not None:  # no trajectory, or a subclass's generate calling its base
            return await original(self, *args, **kwargs)
        turn = _guard("a turn's start", _open_turn, rollout.traj, kwargs.get("prompt_ids"))
        if turn is None:
            return await original(self, *args, **kwargs)
        token = _TURN.set(turn)
        try:
            output = await original(self, *args, **kwargs)
        except BaseException as exc:
            _guard("a turn's end", _exit, turn, exc)
            raise
        finally:
            _TURN.reset(token)
        _guard("a turn's end", _close_turn, turn, output)
        rollout.last_turn = turn
        return output

    return generate


def _wrap_acquire_server(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _acquire_server(self: Any, *args: Any, **kwargs: Any) -> Any:
        picked = await original(self, *args, **kwargs)  # (server id: its "host:port", actor handle)
        turn = _TURN.get()
        if turn is not None:
            # Known only once the balancer chose, after the turn began: set on the open turn.
            server = _guard("a turn's server", lambda: picked[0])
            if isinstance(server, str):
                turn.engine = server
        return picked

    return _acquire_server


def _finish_turn(loop: Any, agent_data: Any, state: Any, turn: Any) -> None:
    if len(agent_data.response_mask) >= loop.response_length:
        reason = TRUNCATED  # ToolAgentLoop stops here: the response budget is spent
    elif turn.finish_reason == "completed":  # vLLM's stop and length both read "completed"
        reason = TOOL_CALLS if getattr(state, "name", None) == "PROCESSING_TOOLS" else STOPPED
    else:
        reason = None
    messages = agent_data.messages
    last = messages[-1] if messages else None
    response = last.get("content") if isinstance(last, Mapping) and last.get("role") == "assistant" else None
    turn.done(finish_reason=reason, response=response if isinstance(response, str) and response else None)


def _wrap_generating_state(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _handle_generating_state(self: Any, agent_data: Any, *args: Any, **kwargs: Any) -> Any:
        rollout = _ROLLOUT.get()
        state = await original(self, agent_data, *args, **kwargs)
        if rollout is not None and rollout.last_turn is not None:
            turn, rollout.last_turn = rollout.last_turn, None
            _guard("a turn's finish reason", _finish_turn, self, agent_data, state, turn)
        return state

    return _handle_generating_state


# --------------------------------------------------------------------------------------------------
# Tool calls: ToolAgentLoop._call_tool


def _open_tool(traj: Any, tool_call: Any) -> Any:
    tool = traj.tool(tool_call.name, call_id=getattr(tool_call, "tool_call_id", None), arguments=getattr(tool_call, "arguments", None))
    tool.__enter__()
    return tool


def tool_failure(text: Any, name: Any) -> str | None:
    """The error type of verl's reply for a failed call (see TOOL_FAILURES), None for a tool's answer."""
    if isinstance(text, str):
        for prefix, error in TOOL_FAILURES:
            if text.startswith(f"{prefix}{name}'"):
                return error
    return None


def _close_tool(tool: Any, tool_call: Any, result: Any) -> None:
    response = result[0] if isinstance(result, tuple) and result else None  # (ToolResponse, reward, metrics)
    text = getattr(response, "text", None)
    tool.done(result=text, error=tool_failure(text, tool_call.name))
    tool.__exit__(None, None, None)


def _wrap_call_tool(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _call_tool(self: Any, tool_call: Any, *args: Any, **kwargs: Any) -> Any:
        rollout = _ROLLOUT.get()
        tool = None if rollout is None else _guard("a tool call's start", _open_tool, rollout.traj, tool_call)
        if tool is None:
            return await original(self, tool_call, *args, **kwargs)
        try:
            result = await original(self, tool_call, *args, **kwargs)
        except BaseException as exc:
            _guard("a tool call's end", _exit, tool, exc)
            raise
        _guard("a tool call's end", _close_tool, tool, tool_call, result)
        return result

    return _call_tool


# --------------------------------------------------------------------------------------------------
# The instrumentor


def _client_classes(agent_loop: Any) -> list[type]:
    """verl's LLM client classes and their subclasses defined so far (older verl: AsyncLLMServerManager)."""
    roots: list[type] = []
    try:
        from verl.workers.rollout.llm_server import LLMServerClient

        roots.append(LLMServerClient)
    except ImportError:
        pass
    older = getattr(agent_loop, "AsyncLLMServerManager", None)
    if isinstance(older, type):
        roots.append(older)
    found: list[type] = []
    while roots:
        cls = roots.pop()
        if cls not in found:
            found.append(cls)
            roots.extend(cls.__subclasses__())
    return found


def _patch(patches: Patches, cls: Any, name: str, wrap: Callable[[Any], Any], missing: list[str]) -> None:
    original = vars(cls).get(name) if isinstance(cls, type) else None
    if original is None:
        missing.append(f"{getattr(cls, '__name__', cls)}.{name}")
        return
    patches.replace(cls, name, wrap(original))


class VerlAgentLoopInstrumentor(Instrumentor):
    """verl's agent-loop rollouts as otel-rl trajectories (see the module docstring).

    ``instrument(start_telemetry=True, validation=False)``: ``start_telemetry`` starts a
    telemetry in an agent-loop worker that has none when verl's config names the ``otel``
    logger; ``validation`` records validation rollouts too. ``uninstrument()`` puts verl's
    methods back (rollouts running then finish as they started).
    """

    pip_extra = "verl"

    def instrumentation_dependencies(self) -> Collection[str]:
        # LLMServerClient and the agent loop's methods as wrapped here are verl 0.9's.
        return ("verl >= 0.9.1",)

    def _instrument(self, *, start_telemetry: bool = True, validation: bool = False) -> None:
        try:
            from verl.experimental.agent_loop import agent_loop, tool_agent_loop
        except Exception as exc:  # verl's agent loop pulls hydra, ray, torch, transformers: any may fail
            raise ImportError(
                f"otel_rl.integrations.verl_agent_loop could not import verl's agent loop ({type(exc).__name__}: {exc}): "
                "pip install 'otel-rl[verl]'"
            ) from exc
        source = TelemetrySource(start_telemetry, validation)
        missing: list[str] = []
        patches = self.patches
        _patch(patches, agent_loop.AgentLoopWorker, "_run_agent_loop", lambda f: _wrap_run_agent_loop(f, source), missing)
        loop = getattr(tool_agent_loop, "ToolAgentLoop", None)
        _patch(patches, loop, "_handle_generating_state", _wrap_generating_state, missing)
        _patch(patches, loop, "_call_tool", _wrap_call_tool, missing)
        clients = _client_classes(agent_loop)
        for cls in clients:
            if "generate" in vars(cls):
                _patch(patches, cls, "generate", _wrap_generate, missing)
            if "_acquire_server" in vars(cls):
                _patch(patches, cls, "_acquire_server", _wrap_acquire_server, missing)
        if not clients:
            missing.append("LLMServerClient.generate")
        if "AgentLoopWorker._run_agent_loop" in missing:
            raise ImportError(f"otel_rl.integrations.verl_agent_loop: this verl has no {missing[0]}; pip install 'otel-rl[verl]'")
        if missing:
            logger.warning("otel-rl: this verl lacks %s; its agent-loop trajectories are recorded without those parts", ", ".join(missing))


__all__ = ["TOOL_FAILURES", "TelemetrySource", "VerlAgentLoopInstrumentor", "init_options", "tool_failure"]
