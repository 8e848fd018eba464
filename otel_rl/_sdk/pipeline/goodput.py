"""Goodput: each step's wall time split into productive, overhead and idle seconds.

When a step ends, the pipeline worker (never the training thread) takes the stage intervals that
fell inside it and splits the step into three buckets (``rl.goodput.bucket``):

- productive: covered by a stage that does the model's work (generate, rewards, log-probs, train);
- overhead: covered only by moving or saving the model: onload / offload phases (always), weight
  sync (``model_update``), checkpoint, validation;
- idle: the rest of the step: no stage running, or an explicit wait / barrier stage.

Stages may overlap (async rollout next to training, a ``rollout`` stage around ``generate``):
each bucket is the union of its intervals, productive first, so a second counts once and the
three buckets add up to the step's duration exactly.

The bucket names follow NeMo-RL's efficiency summary (``print_efficiency_summary`` in
``nemo_rl/algorithms/utils.py``): there, ``productive`` is the wall time minus the waste and
``efficiency_pct`` is productive over wall time, which is ``rl.step.goodput.ratio`` here; its
waste categories are ``idle/*`` (``idle/buffer_starvation``, ``idle/refit_bubble``,
``idle/validation``). We keep the refit / weight sync, checkpoint and validation time apart from
idle as ``overhead`` (NeMo-RL times them as ``weight_sync``, ``checkpointing`` and
``prepare_for_generation`` in ``grpo.py``), since it is work the run chose, not waiting; and, as
there, the model's work (``exposed_generation``, ``policy_training``, logprobs) is productive.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

PRODUCTIVE = A.RlGoodputBucketValues.PRODUCTIVE.value
OVERHEAD = A.RlGoodputBucketValues.OVERHEAD.value
IDLE = A.RlGoodputBucketValues.IDLE.value
_MOVING_PHASES = frozenset({A.RlStagePhaseValues.ONLOAD.value, A.RlStagePhaseValues.OFFLOAD.value})

_S = A.RlStageValues
# rl.stage -> bucket. Every stage of the registry's enum is here (tests/test_goodput.py checks it).
STAGE_BUCKETS: Mapping[str, str] = {
    **{
        s.value: PRODUCTIVE
        for s in (
            _S.ROLLOUT,
            _S.GENERATE,
            _S.COMPUTE_REWARDS,
            _S.TOOL_CALLS,
            _S.COMPUTE_LOG_PROBS,
            _S.COMPUTE_REF_LOG_PROBS,
            _S.COMPUTE_VALUES,
            _S.REF_LOG_PROBS_VALUES_REWARD,
            _S.OLD_LOG_PROBS_VALUES,
            _S.MAKE_EXPERIENCE,
            _S.ADVANTAGE,
            _S.TRAIN_STEP,
        )
    },
    # NeMo-RL counts validation as waste (idle/validation); it is not waiting, so overhead here.
    **{s.value: OVERHEAD for s in (_S.MODEL_UPDATE, _S.DO_CHECKPOINT, _S.VALIDATION)},
    # rl.stage is an open enum: the names a loop gives its waits, and verl's timers the verl
    # mapping leaves under their own name (verl_timers.STEP_TIMERS).
    **dict.fromkeys(("wait", "barrier", "idle", "sync_wait", "wait_for_rollout", "wait_for_generation"), IDLE),
    **dict.fromkeys(("update_critic", "gen_max"), PRODUCTIVE),
    **dict.fromkeys(("update_weights", "save_checkpoint", "dump_rollout_generations", "start_profile", "stop_profile"), OVERHEAD),
}
# Any other stage name: by the first of these words it contains; else productive (a stage a loop
# times is most likely its work).
_NAME_WORDS: tuple[tuple[str, str], ...] = (
    ("wait", IDLE),
    ("barrier", IDLE),
    ("idle", IDLE),
    ("checkpoint", OVERHEAD),
    ("offload", OVERHEAD),
    ("onload", OVERHEAD),
    ("weight", OVERHEAD),
    ("refit", OVERHEAD),
    ("profile", OVERHEAD),
)
_BUCKET_ATTRS = {bucket: ((A.RL_GOODPUT_BUCKET, bucket),) for bucket in (PRODUCTIVE, OVERHEAD, IDLE)}
_KEPT_INTERVALS = 4096  # stages kept for steps still open (more only without steps, or with thousands per step)

# One stage as it ran: (rl.stage, start, end, [(phase, seconds, start), ...]) in one clock's seconds.
StageInterval = tuple[str, float, float, Sequence[tuple[str, float, float]]]


def bucket_of(stage: str) -> str:
    """The goodput bucket of a stage name (the table, then the words of an unknown name)."""
    bucket = STAGE_BUCKETS.get(stage)
    if bucket is not None:
        return bucket
    lowered = stage.lower()
    for word, bucket in _NAME_WORDS:
        if word in lowered:
            return bucket
    return PRODUCTIVE


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -float("inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _minus(start: float, end: float, holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``[start, end)`` without the holes (a stage without its onload / offload phases)."""
    pieces, at = [], start
    for hole_start, hole_end in sorted(holes):
        if hole_start > at:
            pieces.append((at, min(hole_start, end)))
        at = max(at, hole_end)
        if at >= end:
            break
    if at < end:
        pieces.append((at, end))
    return [(a, b) for a, b in pieces if b > a]


def split_step(start: float, end: float, stages: Iterable[StageInterval]) -> tuple[float, float, float]:
    """``(productive, overhead, idle)`` seconds of the step ``[start, end)``; they sum to ``end - start``."""
    productive: list[tuple[float, float]] = []
    busy: list[tuple[float, float]] = []  # productive or overhead
    for name, s0, s1, phases in stages:
        s0, s1 = max(s0, start), min(s1, end)
        if s1 <= s0:
            continue
        moving = [(max(p0, s0), min(p0 + seconds, s1)) for phase, seconds, p0 in phases if phase in _MOVING_PHASES]
        moving = [(a, b) for a, b in moving if b > a]
        busy.extend(moving)  # loading or offloading weights is overhead, whatever the stage
        bucket = bucket_of(name)
        if bucket == IDLE:
            continue
        rest = _minus(s0, s1, moving) if moving else [(s0, s1)]  # (s1 > s0 here)
        busy.extend(rest)
        if bucket == PRODUCTIVE:
            productive.extend(rest)
    step = max(end - start, 0.0)
    work = _union_length(productive)
    covered = min(_union_length(busy), step)
    return work, covered - work, step - covered


class StepGoodput:
    """The worker's goodput state: recent stage intervals, and each ended step's buckets recorded
    into ``rl.step.goodput.duration`` and ``rl.step.goodput.ratio``."""

    def __init__(self, histograms: Any, latest: Any) -> None:
        self._histograms = histograms
        self._latest = latest
        # Stages from any thread, matched to steps by time, not by the step they were opened in:
        # an async rollout stage opened during step N that runs on into step N+1 counts in both.
        self._stages: deque[StageInterval] = deque(maxlen=_KEPT_INTERVALS)

    def add_stage(self, stage: StageInterval) -> None:
        self._stages.append(stage)

    def step_end(self, start: float, seconds: float) -> None:
        """A step that ran ``[start, start + seconds)`` (``time.perf_counter`` seconds) ended."""
        end = start + seconds
        inside = [s for s in self._stages if s[1] < end and s[2] > start]
        # Stages that ended before this step started can matter to no later step (steps follow
        # each other); those still reaching into it may overlap the next one.
        while self._stages and self._stages[0][2] <= start:
            self._stages.popleft()
        if inside:  # a loop that times no stages gets no goodput (it would read as all idle)
            self._record(split_step(start, end, inside), seconds)

    def finished_step(self, start_ns: int, end_ns: int, laid: Iterable[tuple[str, int, int, Any]]) -> None:
        """A step rebuilt after the fact (``Telemetry.trace_finished_step``): its stages as laid out
        there, ``(rl.stage, start_ns, end_ns, cluster)``; times relative to the step, in seconds."""
        stages = [(name, (s0 - start_ns) / 1e9, (s1 - start_ns) / 1e9, ()) for name, s0, s1, _ in laid]
        if stages:
            seconds = (end_ns - start_ns) / 1e9
            self._record(split_step(0.0, seconds, stages), seconds)

    def _record(self, buckets: tuple[float, float, float], seconds: float) -> None:
        record = self._histograms.record
        for bucket, value in zip((PRODUCTIVE, OVERHEAD, IDLE), buckets):
            record(M.RL_STEP_GOODPUT_DURATION, value, _BUCKET_ATTRS[bucket])
        if seconds > 0:
            self._latest.set(M.RL_STEP_GOODPUT_RATIO, (), buckets[0] / seconds)


def lay_out(parsed: Sequence[tuple[str, int, str | None]], start_ns: int, end_ns: int) -> list[tuple[str, int, int, str | None]]:
    """``Telemetry.trace_finished_step``'s stages ``(rl.stage, duration_ns, cluster)`` laid back to
    back from ``start_ns``, as ``(rl.stage, begin_ns, end_ns, cluster)``: a stage that would run past
    the step's end is moved to end with it, so it overlaps the one before."""
    laid, at = [], start_ns
    for name, duration_ns, cluster in parsed:
        begin = max(start_ns, min(at, end_ns - duration_ns))
        at = begin + duration_ns
        laid.append((name, begin, at, cluster))
    return laid


def parse_finished_step(
    stages: Sequence[Any], step_seconds: Any, report: Callable[[str, str, str], None]
) -> tuple[list[tuple[str, int, str | None]], int]:
    """``Telemetry.trace_finished_step``'s input read: the ``(stage, ns, cluster)`` entries and the
    step's nanoseconds (default the stages' sum). Bad entries are reported once and skipped."""
    parsed: list[tuple[str, int, str | None]] = []
    for entry in stages:
        try:
            name, seconds = str(entry[0]), float(entry[1])
            cluster = entry[2] if len(entry) > 2 else None
        except (TypeError, ValueError, IndexError):
            seconds = math.nan
        if not (seconds >= 0 and math.isfinite(seconds)):
            report(
                f"<trace_finished_step {entry!r:.60}>",
                "bad-stage",
                f"otel-rl: trace_finished_step() needs (stage, seconds >= 0[, cluster]) entries, got {entry!r:.80}; skipped",
            )
            continue
        parsed.append((name, int(seconds * 1e9), None if cluster is None else str(cluster)))
    total_ns = sum(d for _, d, _ in parsed)
    try:
        step_ns = total_ns if step_seconds is None else int(float(step_seconds) * 1e9)
    except (TypeError, ValueError):
        step_ns = -1
    if step_ns < 0:
        report(
            "<trace_finished_step step_seconds>",
            "bad-step-seconds",
            f"otel-rl: trace_finished_step(step_seconds={step_seconds!r}) must be seconds >= 0; used the stages' sum",
        )
        step_ns = total_ns
    return parsed, step_ns
