"""Agent trajectories read back from a run's spans, for ``otel-rl trace --slowest`` and the Chrome
export.

A kept trajectory is a trace of its own: an ``rl.trajectory`` root with ``rl.turn`` and ``rl.tool``
children, linked to the step's ``rl.generate`` span (or its ``rl.step`` span). Step N's
trajectories are those whose root carries ``rl.step == N`` or links to a span of step N's trace.
How many the run recorded and kept (all steps together) is in ``metrics.jsonl``, the cumulative
``rl.trajectory.count`` by ``rl.trajectory.kept`` and ``rl.trajectory.reason``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID

from otel_rl.runs.folder import read_metrics
from otel_rl.runs.records import SpanRecord
from otel_rl.runs.run_selection import RunSelection
from otel_rl.runs.waterfall import format_duration, render_waterfall, whole_number
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

__all__ = ["TrajectoryCounts", "TrajectoryTrace", "read_trajectory_counts", "render_trajectories", "slowest", "step_trajectories"]

TRAJECTORY_SPAN_NAMES = frozenset({N.RL_TRAJECTORY_SPAN, N.RL_TURN_SPAN, N.RL_TOOL_SPAN})
_R = A.RlTrajectoryReasonValues
# the order the tail rule applies them, then the head ratio, then why the others were not kept
REASON_ORDER = tuple(
    r.value for r in (_R.FAILED, _R.SLOWEST, _R.HIGHEST_REWARD, _R.LOWEST_REWARD, _R.HEAD_SAMPLED, _R.SAMPLED_OUT, _R.OVER_LIMIT)
)


@dataclass
class TrajectoryTrace:
    """One kept trajectory: its root span and every span of its trace (root first, then by start)."""

    root: SpanRecord
    spans: list[SpanRecord]

    @property
    def duration_ns(self) -> int:
        return self.root.duration_ns

    @property
    def sample_id(self) -> str:
        return str(self.root.attributes.get(A.RL_SAMPLE_ID, "?"))

    @property
    def step(self) -> int | None:
        return whole_number(self.root.attributes.get(A.RL_STEP))

    @property
    def reason(self) -> str:
        return str(self.root.attributes.get(A.RL_TRAJECTORY_REASON, "?"))

    @property
    def reward(self) -> float | None:
        value = self.root.attributes.get(A.RL_TRAJECTORY_REWARD)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def summary(self) -> str:
        """``q3.5 (group 3)  412 ms  reward 0.9  kept: slowest  2 turns, 1 tool call (1 failed)``."""
        attributes = self.root.attributes
        group = attributes.get(A.RL_SAMPLE_GROUP_ID)
        parts = [
            f"trajectory {self.sample_id}" + (f" (group {group})" if group not in (None, "") else ""),
            format_duration(self.duration_ns),
        ]
        if self.reward is not None:
            parts.append(f"reward {self.reward:.4g}")
        parts.append(f"kept: {self.reason}")
        turns = [s for s in self.spans if s.name == N.RL_TURN_SPAN]
        tools = [s for s in self.spans if s.name == N.RL_TOOL_SPAN]
        n_turns = whole_number(attributes.get(A.RL_TRAJECTORY_TURN_COUNT))
        n_tools = whole_number(attributes.get(A.RL_TRAJECTORY_TOOL_CALL_COUNT))
        n_turns = len(turns) if n_turns is None else n_turns
        n_tools = len(tools) if n_tools is None else n_tools
        failed = sum(1 for s in tools if s.status == "error")
        counts = f"{n_turns} turn{'s' * (n_turns != 1)}, {n_tools} tool call{'s' * (n_tools != 1)}"
        parts.append(counts + (f" ({failed} failed)" if failed else ""))
        if attributes.get(A.RL_TRAJECTORY_TRUNCATED) is True:
            parts.append("truncated")
        if self.root.status == "error":
            parts.append("ERROR" + (f": {attributes[A.ERROR_TYPE]}" if attributes.get(A.ERROR_TYPE) else ""))
        return "  ".join(parts)


def _traces(spans: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    by_trace: dict[str, list[SpanRecord]] = {}
    for span in spans:
        if span.name in TRAJECTORY_SPAN_NAMES:
            by_trace.setdefault(span.trace_id, []).append(span)
    return by_trace


def step_trajectories(spans: Sequence[SpanRecord], step: int, step_trace: Sequence[SpanRecord] = ()) -> list[TrajectoryTrace]:
    """The kept trajectories of ``step``: roots with ``rl.step == step``, or linked to a span of
    ``step_trace`` (the step's trace, when found); in start order."""
    linked = {(span.trace_id, span.span_id) for span in step_trace}
    found: list[TrajectoryTrace] = []
    for members in _traces(spans).values():
        roots = [s for s in members if s.name == N.RL_TRAJECTORY_SPAN and s.parent_span_id is None]
        if len(roots) != 1:
            continue  # a trace whose root was not written (a crash mid-export): no trajectory to show
        root = roots[0]
        if whole_number(root.attributes.get(A.RL_STEP)) != step and not any(link in linked for link in root.links):
            continue
        members.sort(key=lambda s: (s is not root, s.start_ns, s.end_ns))
        found.append(TrajectoryTrace(root, members))
    found.sort(key=lambda t: (t.root.start_ns, t.sample_id))
    return found


def slowest(trajectories: Iterable[TrajectoryTrace], k: int | None) -> list[TrajectoryTrace]:
    """The ``k`` longest (all when ``k`` is None), longest first."""
    ordered = sorted(trajectories, key=lambda t: (-t.duration_ns, t.root.start_ns, t.sample_id))
    return ordered if k is None else ordered[:k]


@dataclass
class TrajectoryCounts:
    """The run's trajectories by whether they were kept and why (all steps, every rank)."""

    kept: dict[str, int] = field(default_factory=dict)
    not_kept: dict[str, int] = field(default_factory=dict)

    @property
    def recorded(self) -> int:
        return sum(self.kept.values()) + sum(self.not_kept.values())

    def describe(self) -> str:
        """``2560 recorded, 271 kept as traces (failed 194, slowest 23, ...), 2289 only counted (sampled_out 2289)``,
        the reasons in the order the rule applies them."""

        def parts(counts: dict[str, int]) -> str:
            def order(reason: str) -> tuple[int, str]:
                return (REASON_ORDER.index(reason) if reason in REASON_ORDER else len(REASON_ORDER), reason)

            return ", ".join(f"{reason} {counts[reason]}" for reason in sorted(counts, key=order))

        text = f"{self.recorded} recorded, {sum(self.kept.values())} kept as traces"
        if self.kept:
            text += f" ({parts(self.kept)})"
        if self.not_kept:
            text += f", {sum(self.not_kept.values())} only counted ({parts(self.not_kept)})"
        return text


def read_trajectory_counts(run_dir: str | os.PathLike[str], run: RunSelection | None = None) -> TrajectoryCounts | None:
    """The run's ``rl.trajectory.count`` (its last value per rank and series; deltas summed), of
    ``run``'s resources; None when ``metrics.jsonl`` has none."""
    last: dict[tuple[Any, ...], tuple[int, float]] = {}
    deltas: dict[tuple[Any, ...], float] = {}
    for point in read_metrics(run_dir):
        if point.name != M.RL_TRAJECTORY_COUNT or point.value is None or (run is not None and not run.keeps(point.resource)):
            continue
        kept = point.attributes.get(A.RL_TRAJECTORY_KEPT)
        reason = point.attributes.get(A.RL_TRAJECTORY_REASON)
        # by the SDK's per-process id too: a restarted rank counts from 0 again
        key = (point.resource.get(SERVICE_INSTANCE_ID), point.resource.get(A.RL_RANK), kept is True, str(reason))
        if point.temporality == 1:  # delta
            deltas[key] = deltas.get(key, 0.0) + float(point.value)
        elif key not in last or point.time_ns >= last[key][0]:
            last[key] = (point.time_ns, float(point.value))
    if not last and not deltas:
        return None
    counts = TrajectoryCounts()
    for key, value in [*((k, v) for k, (_, v) in last.items()), *deltas.items()]:
        into = counts.kept if key[2] else counts.not_kept
        into[key[3]] = into.get(key[3], 0) + int(value)
    return counts


def render_trajectories(trajectories: Sequence[TrajectoryTrace], width: int = 50) -> str:
    """Each trajectory's summary line and its span tree, numbered in the given order."""
    blocks = []
    for index, trajectory in enumerate(trajectories, 1):
        blocks.append(f"#{index}  {trajectory.summary()}\n{render_waterfall(trajectory.spans, width=width)}")
    return "\n\n".join(blocks)
