"""TRL's tool-calling GRPO rollouts as agent trajectories (``Telemetry.trajectory``).

When a ``GRPOTrainer`` has tools (``tools=[...]`` or ``environment_factory``), the TRL callback
records each completion of a training generation batch as one trajectory: sample id = its index
in the batch gathered over processes, group = that index // ``num_generations`` (TRL's sampler
repeats each prompt that many times in a row), step = the optimizer step that generated it
(``global_step + 1``, the step TRL logs it with). What is read where (trl/trainer/grpo_trainer.py):

* ``_generate_and_score_completions`` is the batch: every trajectory starts with it and ends when
  it returns, rewarded with TRL's weighted sum of the reward functions (NaN ones skipped, as TRL
  sums them; a completion no function scored has no reward) and each function's value as a
  component. The values are the host copy TRL keeps for its completions table
  (``_logs["rewards"]``): no device read of otel-rl's own.
* ``_generate_single_turn`` is one generation: a turn of each completion it generates for, with
  the prompt and generated token counts. The first is the whole batch; inside the tool loop, the
  completions whose last message is a tool result added since the previous generation (the ones
  TRL generates for again).
* ``_tool_call_loop``: while it runs, the per-rollout tools TRL calls (``_sync_tool_dicts``,
  ``_async_tool_dicts``) are wrapped, each call a tool span of its trajectory with its name,
  arguments and duration. A tool that raises is status ERROR with the exception's type (the
  exception goes on to TRL, which hands the model its message); one that returns a mapping with an
  ``"error"`` key is ``error.type=tool_error``. When the loop returns, each turn gets its finish
  reason: ``tool_calls`` for a turn whose tool calls ran, and for the last one ``length`` when TRL
  counts the completion truncated (it ends in neither EOS nor pad), ``tool_calls`` when it still
  asks for tools (``max_tool_calling_iterations`` reached, or the result would not fit), else ``stop``.

The methods are replaced on the trainer instance only, while the run trains; TRL's code runs
unchanged on the same values. Anything that fails here is reported once and leaves that part
unrecorded; nothing reaches TRL. Evaluation batches are not recorded. Tool calls TRL rejects
before calling anything (an unknown name, a call that is not a function) have no span; TRL counts
them in ``tools/failure_frequency``. With a ``rollout_func`` the first generation is the
function's and has no turn. Text (the prompt, each turn's reply, tool arguments and results)
leaves the process only when samples are on (``log_samples``).
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from otel_rl._sdk.spans.trajectory_spans import TRUNCATED_FINISH_REASON
from otel_rl.integrations._hf_samples import _weights, as_text
from otel_rl.reporting import LOGGER_NAME, ReportOnce

__all__ = ["TOOL_ERROR", "ToolRollouts"]

logger = logging.getLogger(LOGGER_NAME)

# The trainer methods wrapped while a run trains (GRPOTrainer's tool loop; written against TRL 1.16).
_METHODS = ("_generate_and_score_completions", "_generate_single_turn", "_tool_call_loop")
TOOL_ERROR = "tool_error"  # error.type of a tool call that returned {"error": ...}
_STOP, _TOOL_CALLS = "stop", "tool_calls"
_LENGTH = TRUNCATED_FINISH_REASON
_MARK = "_otel_rl_tool_rollouts"
_ABSENT = object()


def _argument(args: tuple[Any, ...], kwargs: Mapping[str, Any], index: int, name: str) -> Any:
    """A wrapped method's argument, passed by position or by name."""
    return args[index] if len(args) > index else kwargs.get(name)


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def _reply_text(message: Mapping[str, Any]) -> str:
    """An assistant message as exported text: its content, or its tool calls as JSON."""
    content = message.get("content")
    if content:
        return as_text(content) if not isinstance(content, str) else content
    calls = message.get("tool_calls")
    return json.dumps(calls, default=str) if calls else ""


class _Batch:
    """The training generation batch being recorded: a trajectory per completion."""

    __slots__ = ("trajs", "turns", "prompts", "in_loop", "completions", "seen")

    def __init__(self, trajs: list[Any], prompts: list[str | None]) -> None:
        self.trajs = trajs
        self.turns: list[list[Any]] = [[] for _ in trajs]
        self.prompts = prompts  # the first turn's prompt text (samples on), else Nones
        self.in_loop = False
        self.completions: Sequence[Any] | None = None  # the message lists TRL's tool loop extends
        self.seen: list[int] = []  # their lengths at the previous generation


class ToolRollouts:
    """Records a tool-calling ``GRPOTrainer``'s training rollouts as trajectories (module docstring).

    ``ToolRollouts.attach(telemetry, trainer)`` wraps the trainer's methods (None when it has no
    tools or lacks them); ``close()`` ends an unfinished batch and puts the methods back.
    """

    def __init__(self, telemetry: Any, trainer: Any) -> None:
        self.telemetry = telemetry
        self.trainer = trainer
        self._text = bool(getattr(telemetry.config, "log_samples", 0))
        self._batch: _Batch | None = None
        self._wrapped: dict[str, tuple[Callable[..., Any], Any]] = {}  # name -> (wrapper, the instance's own before)
        self._report_once = ReportOnce(logger)

    @classmethod
    def attach(cls, telemetry: Any, trainer: Any) -> ToolRollouts | None:
        if trainer is None or not getattr(trainer, "tools", None):
            return None
        rollouts = cls(telemetry, trainer)
        missing = [name for name in _METHODS if not callable(getattr(trainer, name, None))]
        if missing:
            rollouts._report("methods", f"this TRL has no {', '.join(missing)}; tool-calling rollouts are not recorded")
            return None
        if any(getattr(getattr(trainer, name), _MARK, False) for name in _METHODS):
            return None  # another callback records this trainer's rollouts already
        rollouts._wrap("_generate_and_score_completions", rollouts._around_batch)
        rollouts._wrap("_generate_single_turn", rollouts._around_generation)
        rollouts._wrap("_tool_call_loop", rollouts._around_tool_loop)
        return rollouts

    def close(self) -> None:
        """End an unfinished batch (no reward) and put the trainer's methods back."""
        batch, self._batch = self._batch, None
        self._end(batch)
        namespace = vars(self.trainer)
        for name, (wrapper, before) in self._wrapped.items():
            if namespace.get(name) is not wrapper:
                continue  # leave a later replacement by someone else alone
            if before is _ABSENT:
                del namespace[name]
            else:
                namespace[name] = before
        self._wrapped.clear()

    # -- plumbing ------------------------------------------------------------------------------
    def _wrap(self, name: str, around: Callable[..., Any]) -> None:
        original = getattr(self.trainer, name)
        before = vars(self.trainer).get(name, _ABSENT)  # a replacement on the instance, put back at close()

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return around(original, args, kwargs)

        setattr(wrapper, _MARK, True)
        vars(self.trainer)[name] = wrapper
        self._wrapped[name] = (wrapper, before)

    def _report(self, what: str, message: str | None = None) -> None:
        """Say a problem once: an exception being handled (``message`` None), or ``message``."""
        if not self._report_once.first(what):
            return
        if message is None:
            logger.warning(
                "otel-rl: recording TRL's tool-calling rollouts failed in %s; training goes on (reported once)", what, exc_info=True
            )
        else:
            logger.warning("otel-rl: %s (reported once)", message)

    # -- the batch: trajectories and rewards ----------------------------------------------------
    def _around_batch(self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        batch = self._open(_argument(args, kwargs, 0, "inputs"))
        try:
            output = original(*args, **kwargs)
        except BaseException:
            self._close(batch, rewarded=False)
            raise
        self._close(batch, rewarded=True)
        return output

    def _open(self, inputs: Any) -> _Batch | None:
        stale, self._batch = self._batch, None
        self._end(stale)  # a batch an exception left open
        trajs: list[Any] = []
        try:
            trainer = self.trainer
            if not trainer.model.training:
                return None  # an evaluation batch
            count = len(inputs)
            offset = int(getattr(trainer.accelerator, "process_index", 0)) * count
            group_size = int(getattr(trainer, "num_generations", 0) or 0)
            step = int(trainer.state.global_step) + 1
            prompts: list[str | None] = [None] * count
            if self._text:
                prompts = [as_text(x.get("prompt", "")) if isinstance(x, Mapping) else None for x in inputs]
            for index in range(offset, offset + count):
                traj = self.telemetry.trajectory(index, group=index // group_size if group_size > 0 else None, step=step)
                traj.__enter__()
                trajs.append(traj)
            self._batch = _Batch(trajs, prompts)
            return self._batch
        except Exception:
            self._report("batch start")
            self._end(_Batch(trajs, []) if trajs else None)
            return None

    def _close(self, batch: _Batch | None, rewarded: bool) -> None:
        if batch is None or batch is not self._batch:
            return
        self._batch = None
        if rewarded:
            try:
                self._reward(batch)
            except Exception:
                self._report("rewards")
        self._end(batch)

    def _end(self, batch: _Batch | None) -> None:
        if batch is None:
            return
        try:
            for traj in batch.trajs:
                traj.__exit__(None, None, None)
        except Exception:
            self._report("batch end")

    def _reward(self, batch: _Batch) -> None:
        trainer = self.trainer
        logs = getattr(trainer, "_logs", None)
        rewards = logs.get("rewards") if isinstance(logs, Mapping) else None
        names = [str(name) for name in (getattr(trainer, "reward_func_names", None) or ())]
        count = len(batch.trajs)
        gathered = count * int(getattr(trainer.accelerator, "num_processes", 1))
        offset = int(getattr(trainer.accelerator, "process_index", 0)) * count
        columns: dict[str, list[Any]] = {}
        if isinstance(rewards, Mapping):
            for name in names:
                values = rewards.get(name)
                if values is not None and len(values) >= gathered:  # this batch is the last one TRL added
                    columns[name] = list(values)[-gathered:][offset : offset + count]
        if not columns:
            self._report("reward values", "TRL's rewards were not found where this TRL keeps them (trainer._logs); trajectories carry none")
            return
        weights = dict(zip(names, _weights(trainer, len(names))))
        for i, traj in enumerate(batch.trajs):
            parts: dict[str, float] = {}
            for name, values in columns.items():
                value = float(values[i])
                if not math.isnan(value):  # None from a reward function: not scored by it
                    parts[name] = value
            if parts:
                traj.reward(sum(weights[name] * value for name, value in parts.items()), components=parts)

    # -- generations: turns -----------------------------------------------------------------------
    def _around_generation(self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        batch = self._batch
        turns = self._turns_start(batch, _argument(args, kwargs, 0, "prompt_ids")) if batch is not None else None
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            if turns:
                self._turns_end(turns, None, exc)
            raise
        if turns:
            self._turns_end(turns, result, None)
        return result

    def _turns_start(self, batch: _Batch, prompt_ids: Any) -> list[tuple[int, Any]] | None:
        try:
            samples = self._regenerated(batch) if batch.in_loop else list(range(len(batch.trajs)))
            if samples is None or len(samples) != len(prompt_ids):
                self._report("turns", "could not tell which completions a TRL generation was for; its turns are not recorded")
                return None
            turns = []
            for position, sample in enumerate(samples):
                prompt = batch.prompts[sample] if not batch.in_loop and batch.prompts else None
                turn = batch.trajs[sample].turn(tokens_in=len(prompt_ids[position]), prompt=prompt)
                batch.turns[sample].append(turn)
                turns.append((position, turn))
            for _, turn in turns:
                turn.__enter__()
            return turns
        except Exception:
            self._report("generation start")
            return None

    @staticmethod
    def _regenerated(batch: _Batch) -> list[int] | None:
        """The completions TRL's tool loop generates for now: a tool result added since the last generation."""
        completions = batch.completions
        if completions is None or len(completions) != len(batch.seen):
            return None
        lengths = [len(messages) for messages in completions]
        samples = [
            i for i, (messages, before) in enumerate(zip(completions, batch.seen)) if lengths[i] > before and _role(messages[-1]) == "tool"
        ]
        batch.seen = lengths
        return samples

    def _turns_end(self, turns: list[tuple[int, Any]], result: Any, exc: BaseException | None) -> None:
        try:
            for _, turn in turns:
                turn.__exit__(type(exc) if exc is not None else None, exc, None)
            if result is not None:
                completion_ids = result[0]
                for position, turn in turns:
                    turn.done(tokens_out=len(completion_ids[position]))
        except Exception:
            self._report("generation end")

    # -- the tool loop: tool calls and finish reasons ---------------------------------------------
    def _around_tool_loop(self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        batch = self._batch
        swapped = self._loop_start(batch, _argument(args, kwargs, 3, "completions")) if batch is not None else None
        try:
            result = original(*args, **kwargs)
        finally:
            if batch is not None:
                self._loop_end(batch, swapped)
        if batch is not None:
            self._finish_reasons(batch, result)
        return result

    def _loop_start(self, batch: _Batch, completions: Any) -> tuple[Any, ...] | None:
        try:
            batch.in_loop = True
            if isinstance(completions, Sequence) and len(completions) == len(batch.trajs):
                batch.completions = completions
                batch.seen = [len(messages) for messages in completions]
            trainer = self.trainer
            namespace = vars(trainer)
            sync, async_ = namespace.get("_sync_tool_dicts"), namespace.get("_async_tool_dicts")
            if not (isinstance(sync, list) and isinstance(async_, list) and len(sync) == len(async_) == len(batch.trajs)):
                self._report("tools", "this TRL keeps its rollouts' tools elsewhere; tool calls are not recorded")
                return None
            wrapped_sync = [
                {name: self._sync_tool(traj, name, tool) for name, tool in tools.items()} for traj, tools in zip(batch.trajs, sync)
            ]
            wrapped_async = [
                {name: self._async_tool(traj, name, tool) for name, tool in tools.items()} for traj, tools in zip(batch.trajs, async_)
            ]
            trainer._sync_tool_dicts, trainer._async_tool_dicts = wrapped_sync, wrapped_async
            return sync, async_, wrapped_sync, wrapped_async
        except Exception:
            self._report("tool loop start")
            return None

    def _loop_end(self, batch: _Batch, swapped: tuple[Any, ...] | None) -> None:
        batch.in_loop = False
        batch.completions = None
        if swapped is None:
            return
        try:
            sync, async_, wrapped_sync, wrapped_async = swapped
            namespace = vars(self.trainer)
            if namespace.get("_sync_tool_dicts") is wrapped_sync:
                namespace["_sync_tool_dicts"] = sync
            if namespace.get("_async_tool_dicts") is wrapped_async:
                namespace["_async_tool_dicts"] = async_
        except Exception:
            self._report("tool loop end")

    def _sync_tool(self, traj: Any, name: str, tool: Callable[..., Any]) -> Callable[..., Any]:
        done = self._tool_done

        def call(*args: Any, **kwargs: Any) -> Any:
            with traj.tool(name, arguments=kwargs or None) as span:  # an exception: ERROR, and on to TRL
                result = tool(*args, **kwargs)
                done(span, result)
            return result

        return call

    def _async_tool(self, traj: Any, name: str, tool: Callable[..., Any]) -> Callable[..., Any]:
        done = self._tool_done

        async def call(*args: Any, **kwargs: Any) -> Any:
            with traj.tool(name, arguments=kwargs or None) as span:
                result = await tool(*args, **kwargs)
                done(span, result)
            return result

        return call

    def _tool_done(self, span: Any, result: Any) -> None:
        try:
            span.done(result=result, error=TOOL_ERROR if isinstance(result, Mapping) and "error" in result else None)
        except Exception:
            self._report("tool result")

    def _finish_reasons(self, batch: _Batch, result: Any) -> None:
        try:
            completions, completion_ids = result[1], result[2]
            stops = self._stop_ids()
            for turns, messages, ids in zip(batch.turns, completions, completion_ids):
                if not turns:
                    continue
                for turn in turns[:-1]:
                    turn.done(finish_reason=_TOOL_CALLS)
                replies = [m for m in messages if _role(m) == "assistant"]
                if stops is not None and (not ids or ids[-1] not in stops):
                    reason = _LENGTH
                elif replies and replies[-1].get("tool_calls"):
                    reason = _TOOL_CALLS
                else:
                    reason = _STOP
                turns[-1].done(finish_reason=reason)
                if self._text:
                    for turn, reply in zip(turns, replies):
                        turn.done(response=_reply_text(reply))
        except Exception:
            self._report("finish reasons")

    def _stop_ids(self) -> set[Any] | None:
        """The ids TRL ends a completion with (its ``eos_token_ids`` and the pad id), as TRL tests truncation."""
        trainer = self.trainer
        eos = getattr(trainer, "eos_token_ids", None)
        if eos is None:
            return None
        tokenizer = getattr(trainer, "_tokenizer", None) or getattr(trainer, "processing_class", None)
        return {*eos, getattr(tokenizer, "pad_token_id", None)}
