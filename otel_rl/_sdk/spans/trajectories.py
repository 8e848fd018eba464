"""Agent trajectories: ``Telemetry.trajectory()`` records one multi-turn rollout (its generations
and tool calls) as plain data on the caller's thread; the telemetry worker decides, when the step
ends, which are exported as traces of their own (``trajectory_sampling``) and builds those spans
(``trajectory_spans``).

The caller pays for a few attribute stores and two ``perf_counter_ns()`` per turn or tool call:
no SDK span, no lock, no I/O. Hundreds of coroutines and threads record at once; each
trajectory's children are appended to its own list (an atomic append), and finished
trajectories go to one deque the worker drains. Nothing here raises into the caller: values are
checked on the worker, which reports bad ones once, naming them.

How many trajectories a process holds (open, or finished and waiting for their step's decision)
is capped by ``trajectory_limit``; past it a new trajectory records nothing and is counted.
"""

from __future__ import annotations

import functools
import itertools
import operator
import time
from collections import deque
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import trace as trace_api

from otel_rl._sdk.pipeline.backlog import CALL
from otel_rl._sdk.pipeline.refusals import INT64_MAX, INT64_MIN
from otel_rl._sdk.spans.scopes import stage_span_name
from otel_rl._sdk.spans.trajectory_sampling import STEP_ENDED, TrajectorySampler
from otel_rl.semconv import attributes as A

__all__ = ["ToolCall", "Trajectories", "Trajectory", "Turn"]

_perf_ns = time.perf_counter_ns
_SIGNAL_TRACES = A.RlTelemetrySignalValues.TRACES.value
MAX_CHILDREN = 1000  # turns and tool calls one trajectory keeps as spans; the rest are counted
_GENERATE_SPAN = stage_span_name(A.RlStageValues.GENERATE.value)
_C = TypeVar("_C", bound="_Child")


def _error(exc: BaseException, text: bool) -> tuple[str, str | None]:
    """(error.type, the message when text may be exported): an exception's message may quote a prompt."""
    message: str | None = None
    if text:
        try:
            message = str(exc)
        except Exception:  # noqa: BLE001 - a __str__ that raises: the type alone
            message = None
    return type(exc).__qualname__, message


class _Child:
    """A turn or a tool call: a context manager (``with`` / ``async with``) that times its block
    and keeps the exception that left it."""

    is_turn = False
    __slots__ = ("_traj", "start", "end", "error")

    _traj: Trajectory
    start: int
    end: int
    error: tuple[str, str | None] | None

    def __enter__(self: _C) -> _C:
        self._traj._add(self)
        self.start = _perf_ns()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.end = _perf_ns()
        if exc is not None:
            self.error = _error(exc, self._traj._text)

    async def __aenter__(self: _C) -> _C:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


class Turn(_Child):
    """One generation of a trajectory (span ``rl.turn``); ``done()`` gives what it produced."""

    is_turn = True
    __slots__ = ("tokens_in", "engine", "prompt", "tokens_out", "finish_reason", "response")

    def __init__(self, traj: Trajectory, tokens_in: Any, engine: Any, prompt: Any) -> None:
        self._traj = traj
        self.tokens_in = tokens_in
        self.engine = engine
        self.prompt = prompt if traj._text else None
        self.tokens_out: Any = None
        self.finish_reason: Any = None
        self.response: Any = None
        self.start = 0
        self.end = 0
        self.error = None

    def done(self, tokens_out: int | None = None, finish_reason: str | None = None, response: str | None = None) -> None:
        """What the generation produced: its tokens, why it stopped (``"length"``: truncated) and,
        when samples are on, its text. Inside the block or after it, before the trajectory ends."""
        if tokens_out is not None:
            self.tokens_out = tokens_out
        if finish_reason is not None:
            self.finish_reason = finish_reason
        if response is not None and self._traj._text:
            self.response = response


class ToolCall(_Child):
    """One tool call of a trajectory (span ``rl.tool``). An exception leaving the block marks it
    failed (status ERROR, ``error.type``) and goes on to the caller; ``done(error=...)`` marks a
    failure the tool returned instead of raising."""

    __slots__ = ("name", "call_id", "arguments", "result")

    def __init__(self, traj: Trajectory, name: Any, call_id: Any, arguments: Any) -> None:
        self._traj = traj
        self.name = name
        self.call_id = call_id
        self.arguments = arguments if traj._text else None
        self.result: Any = None
        self.start = 0
        self.end = 0
        self.error = None

    def done(self, result: Any = None, error: str | None = None) -> None:
        """The call's result (exported only when samples are on) and, for a failure the tool
        reported without raising, its error type (``"timeout"``, ``"tool_error"``)."""
        if result is not None and self._traj._text:
            self.result = result
        if error is not None:
            self.error = (str(error), None)


class Trajectory:
    """One agent rollout: ``turn()`` per generation, ``tool()`` per tool call, ``reward()`` once.

    A context manager (``with`` or ``async with``); it is a trace of its own, exported when the
    head ratio or its step's tail rule keeps it (see :class:`Trajectories`).
    """

    __slots__ = (
        "_rec",
        "_text",
        "sample_id",
        "group",
        "step",
        "children",
        "dropped_turns",
        "dropped_tools",
        "reward_value",
        "components",
        "start",
        "start_epoch_ns",
        "end",
        "error",
        "link",
        "over_limit",
        "failed",  # set by the worker (trajectory_spans.settle), as is the checked reward_value
        "truncated",
    )

    def __init__(self, rec: Trajectories, sample_id: Any, group: Any, step: int | None) -> None:
        self._rec = rec
        self._text = rec.text
        self.sample_id = sample_id
        self.group = group
        self.step = step
        self.children: list[_Child] = []  # its Turns and ToolCalls
        self.dropped_turns = 0  # past MAX_CHILDREN (or over the limit): counted, not kept
        self.dropped_tools = 0
        self.reward_value: Any = None
        self.components: Any = None
        self.start = 0
        self.start_epoch_ns = 0
        self.end = 0
        self.error: tuple[str, str | None] | None = None
        self.link: Any = None  # the span context of the step's generate stage (or of the step)
        self.over_limit = False
        self.failed = False
        self.truncated = False

    def turn(self, tokens_in: int | None = None, engine: str | None = None, prompt: str | None = None) -> Turn:
        """A generation (``gen_ai.operation.name="chat"``): ``tokens_in`` prompt tokens sent to
        ``engine`` (``host:port``); ``prompt`` is exported only when samples are on."""
        return Turn(self, tokens_in, engine, prompt)

    def tool(self, name: str, call_id: str | None = None, arguments: Any = None) -> ToolCall:
        """A tool call (``gen_ai.operation.name="execute_tool"``); ``arguments`` (text or a
        mapping, written as JSON) are exported only when samples are on."""
        return ToolCall(self, name, call_id, arguments)

    def reward(self, value: float, components: Mapping[str, float] | None = None) -> None:
        """The trajectory's scalar reward and, optionally, its parts by name."""
        self.reward_value = value
        if components is not None:
            try:
                self.components = dict(components)
            except Exception:  # noqa: BLE001 - not a mapping: the worker names it
                self.components = components

    def _add(self, child: _Child) -> None:
        children = self.children
        if len(children) < MAX_CHILDREN and not self.over_limit:
            children.append(child)
        elif child.is_turn:
            self.dropped_turns += 1
        else:
            self.dropped_tools += 1

    def __enter__(self) -> Trajectory:
        rec = self._rec
        tel = rec._tel
        if self.step is None:  # the step current when the trajectory starts
            step = tel._current_step
            if step is not None and (step.__class__ is not int or not INT64_MIN <= step <= INT64_MAX):
                step = rec._step(step)
            self.step = step
        started = rec.started = next(rec._starts)
        # Held: open (started, not ended) plus finished and not yet decided (queued or in a step group).
        if started - rec._ended + len(rec.queue) + rec.sampler.held > rec.limit or tel._closed:
            self.over_limit = True
        else:
            span = trace_api.get_current_span()
            context = span.get_span_context()
            step_context = tel._step_span_context
            if context.is_valid and getattr(span, "name", None) == _GENERATE_SPAN:
                self.link = context
                rec._generate = (step_context, context)  # for trajectories run where the context is not current
            else:
                seen = rec._generate
                self.link = seen[1] if seen is not None and step_context is not None and seen[0] is step_context else step_context
        self.start_epoch_ns = time.time_ns()
        self.start = _perf_ns()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.end = _perf_ns()
        rec = self._rec
        if exc is not None:
            self.error = _error(exc, self._text)
        rec.finished(self)

    async def __aenter__(self) -> Trajectory:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


class Trajectories:
    """One telemetry's agent trajectories: the caller's side (``open``, ``step_ended``) and the
    worker's :class:`TrajectorySampler` it feeds."""

    def __init__(self, tel: Any) -> None:
        self._tel = tel
        config = tel.config
        self.text = config.log_samples > 0
        self.limit = config.trajectory_limit
        # Finished trajectories and step-end marks, in order: what the worker decides next.
        self.queue: deque[Any] = deque()
        self._starts = itertools.count(1)
        self._ends = itertools.count(1)
        self._ended = 0  # trajectories finished so far (a store of next(): never torn by threads)
        self.started = 0  # trajectories started so far (likewise)
        self._last_ended_step: int | None = None
        self._newest_step: int | None = None  # the worker runs when a newer step's first trajectory ends
        self._generate: tuple[Any, Any] | None = None  # (step span context, its generate stage's)
        self.used = False
        self.run_queued = False  # a worker run is queued: later arrivals need not queue another
        self.sampler = TrajectorySampler(tel, self)

    def open(self, sample_id: str | int, group: str | int | None, step: int | None) -> Trajectory:
        """``Telemetry.trajectory()``: a trajectory of ``step`` (default: the step current when it starts)."""
        self.used = True
        if step is not None and (step.__class__ is not int or not INT64_MIN <= step <= INT64_MAX):
            step = self._step(step)
        return Trajectory(self, sample_id, group, step)

    def _step(self, step: Any) -> int | None:
        """A step that is no plain int64: numpy's ints become ints; anything else is said once and left out."""
        try:
            step = operator.index(step)
        except TypeError:
            self._tel._pipeline.report_once(
                "<trajectory step>",
                type(step).__name__,
                f"otel-rl: trajectory(step={step!r:.40}) is not an integer step; the trajectory carries no step "
                "and is sampled on its own (reported once)",
            )
            return None
        if INT64_MIN <= step <= INT64_MAX:
            return step
        self._tel._refusals.step("trajectory()", step, count=0)  # said once; the trajectory carries no step
        return None

    def finished(self, traj: Trajectory) -> None:
        """A trajectory's block ended (any thread): queue it for the worker's decision."""
        tel = self._tel
        if tel._closed:
            return tel._drop_call("trajectory()", _SIGNAL_TRACES)
        self.queue.append(traj)
        self._ended = next(self._ends)
        step = traj.step
        # The worker is asked to run soon for a trajectory decided on its own (no step, or one that
        # already ended), one past the limit (to count it), and the first of a newer step (a loop
        # that never ends its steps through otel-rl has its older steps decided then).
        if not self.run_queued:
            last, newest = self._last_ended_step, self._newest_step
            if step is not None and (newest is None or step > newest):
                self._newest_step = step
            elif not (step is None or traj.over_limit or (last is not None and step <= last) or len(self.queue) > self.limit // 4):
                return
            self.run_queued = True
            tel._submit((CALL, self.sampler.run))

    def step_ended(self, step: int) -> None:
        """The step is over (``StepScope`` exit, ``trace_finished_step``): the worker decides its
        trajectories by the tail rule; those still open are decided on their own when they end."""
        if not self.used or self._tel._closed or not INT64_MIN <= step <= INT64_MAX:  # (a refused step was said)
            return
        self.queue.append((STEP_ENDED, step))
        if self._last_ended_step is None or step > self._last_ended_step:
            self._last_ended_step = step
        self.run_queued = True
        self._tel._submit((CALL, self.sampler.run))

    def flush(self) -> None:
        """``Telemetry.flush()``: decide every trajectory but those of the step still running."""
        if self.used:
            self._tel._submit((CALL, self.sampler.run_flush))

    def close(self) -> None:
        """``Telemetry.shutdown()``: decide everything held (queued past the closed check), and count
        the trajectories started and never ended: they would otherwise vanish without a trace."""
        if self.used:
            self._tel._pipeline.queue.append((CALL, self.sampler.run_final))
            unfinished = self.started - self._ended
            if unfinished > 0:
                self._tel._pipeline.queue.append((CALL, functools.partial(self.sampler.count_unfinished, unfinished)))
