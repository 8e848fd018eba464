"""Which agent trajectories become traces, decided on the telemetry worker, and the metrics of all.

Finished trajectories wait in a group per step. When the step ends (its ``StepScope`` exits, or
``trace_finished_step`` traces it) the group is decided by the tail rule: every failed trajectory
(an exception, a tool error, a truncated turn), the ``trajectory_keep_slowest`` slowest, and the
highest- and lowest-rewarded are kept; each of the rest is kept with probability
``trajectory_sample_ratio`` (the head ratio). A trajectory with no step, or one that ends after
its step ended, is decided on its own: kept when it failed, else by the head ratio. A loop that
never ends its steps through otel-rl has a group decided once trajectories of two later steps
have arrived, and ``flush()`` / ``shutdown()`` decide what is held.

Every decided trajectory counts in ``rl.trajectory.count`` (kept or not, and why) and in the
duration histograms; only the kept ones are built into spans (``trajectory_spans``).
"""

from __future__ import annotations

import heapq
import random
from typing import Any

import numpy as np

from otel_rl._sdk.spans.trajectory_spans import SpanBuilder, settle
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

__all__ = ["STEP_ENDED", "TrajectorySampler"]

STEP_ENDED = "step_ended"  # a mark in the queue of finished trajectories: (STEP_ENDED, step)
_R = A.RlTrajectoryReasonValues
FAILED, SLOWEST, HIGHEST, LOWEST = _R.FAILED.value, _R.SLOWEST.value, _R.HIGHEST_REWARD.value, _R.LOWEST_REWARD.value
HEAD_SAMPLED, SAMPLED_OUT, OVER_LIMIT = _R.HEAD_SAMPLED.value, _R.SAMPLED_OUT.value, _R.OVER_LIMIT.value
KEPT_REASONS = frozenset({FAILED, SLOWEST, HIGHEST, LOWEST, HEAD_SAMPLED})
_OPEN_STEPS = 2  # step groups held at once when steps do not end through otel-rl
TOOL_NAMES = 64  # distinct gen_ai.tool.name series of rl.tool.duration per process
OTHER_TOOL = "_OTHER"
_UNFINISHED = (
    (A.RL_TELEMETRY_DROP_REASON, A.RlTelemetryDropReasonValues.UNFINISHED.value),
    (A.RL_TELEMETRY_SIGNAL, A.RlTelemetrySignalValues.TRACES.value),
)
_TRAJECTORY_LIMIT = (
    (A.RL_TELEMETRY_DROP_REASON, A.RlTelemetryDropReasonValues.TRAJECTORY_LIMIT.value),
    (A.RL_TELEMETRY_SIGNAL, A.RlTelemetrySignalValues.TRACES.value),
)
_FLUSH, _FINAL = "flush", "final"


def _duration(traj: Any) -> int:
    return traj.end - traj.start


def _reward(traj: Any) -> float:
    return traj.reward_value


class TrajectorySampler:
    """The worker's side of one telemetry's trajectories: ``run`` after each step end (and when
    trajectories decided on their own arrive), ``run_flush`` on flush, ``run_final`` on shutdown."""

    def __init__(self, tel: Any, rec: Any) -> None:
        self._tel = tel
        self._rec = rec
        config = tel.config
        self.ratio = config.trajectory_sample_ratio
        self.keep_slowest = config.trajectory_keep_slowest
        self.held = 0  # finished trajectories waiting in step groups
        self._groups: dict[int, list[Any]] = {}
        self._last_ended: int | None = None  # trajectories of this step or an earlier one are late
        self._random = random.Random()
        self._builder: SpanBuilder | None = None
        self._tool_names: set[str] = set()

    # -- decisions ------------------------------------------------------------------------------
    def run(self) -> None:
        self._run(None)

    def run_flush(self) -> None:
        self._run(_FLUSH)

    def run_final(self) -> None:
        self._run(_FINAL)

    def _run(self, mode: str | None) -> None:
        rec = self._rec
        rec.run_queued = False  # before reading the queue: what arrives from now on asks again
        queue = rec.queue
        decided: list[tuple[Any, str]] = []
        over_limit = 0
        while True:
            try:
                item = queue.popleft()
            except IndexError:
                break
            if item.__class__ is tuple:
                self._end_step(item[1], decided)
                continue
            if item.over_limit:
                over_limit += 1
                continue
            settle(item, self._reject, self._tel._pipeline.report_once)
            step, last = item.step, self._last_ended
            if step is None or (last is not None and step <= last):
                decided.append((item, self._alone(item)))
                continue
            group = self._groups.get(step)
            if group is None:
                group = self._groups[step] = []
            group.append(item)
            self.held += 1
        if mode is not None:
            current = self._tel._current_step
            for step in [s for s in self._groups if mode is _FINAL or s != current]:
                decided.extend(self._tail(self._take(step)))
        while len(self._groups) > _OPEN_STEPS:
            self._end_step(min(self._groups), decided)
        if decided or over_limit:
            self._write(decided, over_limit)

    def _take(self, step: int) -> list[Any]:
        group = self._groups.pop(step)
        self.held -= len(group)
        return group

    def _end_step(self, step: int, decided: list[tuple[Any, str]]) -> None:
        if self._last_ended is None or step > self._last_ended:
            self._last_ended = step
        for held in [s for s in self._groups if s <= step]:
            decided.extend(self._tail(self._take(held)))

    def _alone(self, traj: Any) -> str:
        if traj.failed:
            return FAILED
        return HEAD_SAMPLED if self._random.random() < self.ratio else SAMPLED_OUT

    def _tail(self, group: list[Any]) -> list[tuple[Any, str]]:
        """The step's tail rule: failed, then the slowest, the highest and the lowest reward."""
        reasons: dict[int, str] = {id(t): FAILED for t in group if t.failed}
        if self.keep_slowest:
            for traj in heapq.nlargest(self.keep_slowest, group, key=_duration):
                reasons.setdefault(id(traj), SLOWEST)
        rewarded = [t for t in group if t.reward_value is not None]
        if rewarded:
            reasons.setdefault(id(max(rewarded, key=_reward)), HIGHEST)
            reasons.setdefault(id(min(rewarded, key=_reward)), LOWEST)
        draw, ratio = self._random.random, self.ratio
        return [(t, reasons.get(id(t)) or (HEAD_SAMPLED if draw() < ratio else SAMPLED_OUT)) for t in group]

    # -- output ---------------------------------------------------------------------------------
    def _write(self, decided: list[tuple[Any, str]], over_limit: int) -> None:
        """Count every decided trajectory, record its durations, and end the kept ones' spans."""
        tel = self._tel
        counts: dict[tuple[bool, str], int] = {}
        trajectory_s: list[float] = []
        turn_s: list[float] = []
        tool_s: dict[str, list[float]] = {}
        turns_per: list[int] = []
        tools_per: list[int] = []
        spans: list[Any] = []
        dropped = 0
        for traj, reason in decided:
            kept = reason in KEPT_REASONS
            counts[(kept, reason)] = counts.get((kept, reason), 0) + 1
            end = traj.end
            trajectory_s.append((end - traj.start) / 1e9)
            turns, tools = traj.dropped_turns, traj.dropped_tools
            dropped += turns + tools
            for child in traj.children:
                if not child.start:
                    continue
                seconds = ((child.end or end) - child.start) / 1e9
                if child.is_turn:
                    turns += 1
                    turn_s.append(seconds)
                else:
                    tools += 1
                    tool_s.setdefault(self._tool_series(child.name), []).append(seconds)
            turns_per.append(turns)
            tools_per.append(tools)
            if kept:
                try:
                    spans.extend(self._spans(traj, reason))
                except Exception as exc:  # a bug here must never stop the worker: this trajectory's spans only
                    tel._pipeline.report_once(
                        "<trajectory spans>", type(exc).__name__, f"otel-rl: a trajectory's spans were not built: {exc!r}"
                    )
        if spans:
            tel._providers.end_spans(spans)
        histograms = tel._histograms
        for metric, values in ((M.RL_TRAJECTORY_DURATION, trajectory_s), (M.RL_TURN_DURATION, turn_s)):
            if values:
                histograms.record_many(metric, np.asarray(values, dtype=np.float64))
        for name, values in tool_s.items():
            histograms.record_many(M.RL_TOOL_DURATION, np.asarray(values, dtype=np.float64), ((A.GEN_AI_TOOL_NAME, name),))
        if turns_per:
            histograms.record_many(M.RL_TRAJECTORY_TURNS, np.asarray(turns_per, dtype=np.float64))
            histograms.record_many(M.RL_TRAJECTORY_TOOL_CALLS, np.asarray(tools_per, dtype=np.float64))
        latest = tel._latest
        for (kept, reason), count in counts.items():
            latest.add(M.RL_TRAJECTORY_COUNT, ((A.RL_TRAJECTORY_KEPT, kept), (A.RL_TRAJECTORY_REASON, reason)), count)
        if over_limit:
            latest.add(M.RL_TRAJECTORY_COUNT, ((A.RL_TRAJECTORY_KEPT, False), (A.RL_TRAJECTORY_REASON, OVER_LIMIT)), over_limit)
            latest.add(M.RL_TELEMETRY_DROPPED, _TRAJECTORY_LIMIT, over_limit)
            tel._pipeline.report_once(
                "<trajectory_limit>",
                "over_limit",
                f"otel-rl: trajectory_limit={self._rec.limit} agent trajectories were already held (open, or finished "
                "and waiting for their step to end); later ones are not recorded, only counted in rl.trajectory.count"
                "{rl.trajectory.reason=over_limit} and rl.telemetry.dropped{rl.telemetry.drop_reason=trajectory_limit}. "
                "End steps with Telemetry.step() so that their trajectories are decided, or raise OTEL_RL_TRAJECTORY_LIMIT "
                "(reported once)",
            )
        if dropped:
            latest.add(M.RL_TELEMETRY_DROPPED, _TRAJECTORY_LIMIT, dropped)
            tel._pipeline.report_once(
                "<trajectory children>",
                "over_limit",
                "otel-rl: a trajectory made more turns and tool calls than one trajectory keeps; the rest count in "
                "rl.trajectory.turns / rl.trajectory.tool_calls but have no span or duration (counted in "
                "rl.telemetry.dropped{rl.telemetry.drop_reason=trajectory_limit}; reported once)",
            )

    def count_unfinished(self, count: int) -> None:
        """At shutdown: ``count`` trajectories were started and never ended (worker thread)."""
        tel = self._tel
        tel._latest.add(M.RL_TELEMETRY_DROPPED, _UNFINISHED, count)
        tel._pipeline.report_once(
            "<trajectory unfinished>",
            "unfinished",
            f"otel-rl: {count:,} agent trajectories were started and never ended by shutdown() (their `with` block never "
            "exited, or __exit__ was not called); they are not recorded, only counted in "
            "rl.telemetry.dropped{rl.telemetry.drop_reason=unfinished}",
        )

    def _spans(self, traj: Any, reason: str) -> list[Any]:
        builder = self._builder
        if builder is None:
            builder = self._builder = SpanBuilder(self._tel)
        return builder.build(traj, reason)

    def _tool_series(self, name: Any) -> str:
        """The tool's name as a series of rl.tool.duration: the first TOOL_NAMES names, then _OTHER."""
        if not isinstance(name, str):
            name = str(name)
        if name in self._tool_names:
            return name
        if len(self._tool_names) < TOOL_NAMES:
            self._tool_names.add(name)
            return name
        return OTHER_TOOL

    def _reject(self, what: str, reason: str, detail: str) -> None:
        """A bad value: left out, counted in rl.telemetry.rejected, said once naming it."""
        self._tel._latest.add(M.RL_TELEMETRY_REJECTED, ((A.RL_TELEMETRY_REASON, reason),), 1)
        self._tel._pipeline.report_once(
            what,
            reason,
            f"otel-rl: {what} got {detail}; left out of the trajectory (counted in rl.telemetry.rejected"
            f"{{rl.telemetry.reason={reason}}}; reported once)",
        )
