"""The context managers a training loop opens: a step (``StepScope``, the root span of the step's
trace), a stage of it (``Stage``, a child span that may snapshot memory) and the stage's phases
(``Phase``), and a worker's part of a step another process started (``JoinScope``).

Each scope works on the ``Telemetry`` that opened it (passed in as ``tel``; not imported here,
since ``telemetry`` imports this module) and hands what it measured to that telemetry's worker.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode

from otel_rl._sdk.pipeline.aggregation import Attrs
from otel_rl._sdk.pipeline.refusals import attribute_text, fits_int64
from otel_rl._sdk.pipeline.worker import STAGE, STEP_END
from otel_rl._sdk.sources.probes import GpuMemorySnapshot
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

NEW_TRACE_CONTEXT = Context()  # an empty context: each step starts a new trace
_WHEN_START, _WHEN_END = A.RlMemoryWhenValues.START.value, A.RlMemoryWhenValues.END.value
_STATE_OFFLOAD, _STATE_ONLOAD = A.RlMemoryStateValues.OFFLOAD.value, A.RlMemoryStateValues.ONLOAD.value
_PHASE_TOTAL = A.RlStagePhaseValues.TOTAL.value
_PHASE_EXECUTE = A.RlStagePhaseValues.EXECUTE.value
_PHASES = tuple(m.value for m in A.RlStagePhaseValues if m is not A.RlStagePhaseValues.TOTAL)
_FRACTION_KINDS = (A.RlMemoryKindValues.MAX_ALLOCATED.value, A.RlMemoryKindValues.MAX_RESERVED.value)
_GIB = float(2**30)  # ROLL logs memory in GiB


def _end_span(span: Any, token: Any, exc: BaseException | None) -> None:
    """Leave the span's context and end it, marking it failed when the block raised."""
    context_api.detach(token)
    if exc is not None:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.end()


def stage_span_name(stage: str) -> str:
    """The span name of a stage (``rl.<stage>`` of the conventions): ``rl.generate``."""
    return N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", stage)


def sorted_attrs(pairs: Mapping[str, Any]) -> Attrs:
    """Attributes as the worker keys series by: (name, value) pairs in name order."""
    return tuple(sorted(pairs.items()))


# A stage's rl.stage.duration attributes (phase "total") by (stage, cluster): the same few every step.
_TOTAL_ATTRS: dict[tuple[str, str | None], Attrs] = {}
_TOTAL_ATTRS_LIMIT = 1024  # past it (stage names made per call), each is built anew


def _total_attrs(key: tuple[str, str | None]) -> Attrs:
    name, cluster = key
    pairs = {A.RL_STAGE: name, A.RL_STAGE_PHASE: _PHASE_TOTAL}
    if cluster is not None:
        pairs[A.RL_CLUSTER] = cluster
    attrs = sorted_attrs(pairs)
    if len(_TOTAL_ATTRS) < _TOTAL_ATTRS_LIMIT:
        _TOTAL_ATTRS[key] = attrs
    return attrs


class Phase:
    """One of a stage's onload / execute / offload phases, as a child span."""

    __slots__ = ("_stage", "_name", "_span", "_token", "_t0")

    def __init__(self, stage: Stage, name: str) -> None:
        self._stage = stage
        self._name = name

    def __enter__(self) -> Phase:
        stage = self._stage
        attributes = dict(stage._attributes)
        attributes[A.RL_STAGE_PHASE] = self._name
        self._span = stage._tel._tracer.start_span(stage._tel._span_name(self._name), attributes=attributes)
        self._token = context_api.attach(trace_api.set_span_in_context(self._span))
        if self._name == _PHASE_EXECUTE and stage._memory:
            stage._snapshot(_WHEN_START, _STATE_ONLOAD)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        elapsed = time.perf_counter() - self._t0
        stage = self._stage
        if self._name == _PHASE_EXECUTE and stage._memory:
            stage._snapshot(_WHEN_END, _STATE_ONLOAD)
        _end_span(self._span, self._token, exc)
        stage._phases.append((self._name, elapsed, self._t0))  # the start: for goodput on the worker


class Stage:
    """A training stage as a child span of the step; ``metrics`` gives ROLL-style keys afterwards."""

    __slots__ = (
        "_tel",
        "name",
        "cluster",
        "_memory",
        "_attributes",
        "_span",
        "_token",
        "_t0",
        "_phases",
        "_gpu",
        "_cpu",
        "elapsed",
        "_step",
        "_range",  # the profiler's ranges of this stage (set only when Telemetry._profiler exists)
    )

    def __init__(self, tel: Any, name: str, cluster: str | None, memory: bool) -> None:
        self._tel = tel
        self.name = name
        if cluster is not None and cluster.__class__ is not str:  # an attribute of every stage metric: text
            tel._pipeline.report_once(
                f"<cluster of {name}>",
                "type",
                f"otel-rl: stage({name!r}, cluster=...) got a {type(cluster).__name__}, not a str: its str() is used "
                "(reported once per stage)",
            )
            cluster = attribute_text(cluster)
        self.cluster = cluster
        self._memory = memory
        self._phases: list[tuple[str, float, float]] = []  # (phase, seconds, perf_counter start)
        self._gpu: list[tuple[str, str, GpuMemorySnapshot]] = []
        self._cpu: list[tuple[str, int, int]] = []
        self.elapsed: float | None = None

    @property
    def started(self) -> float | None:
        """``time.perf_counter()`` when the stage's timer began (None before it is entered)."""
        return getattr(self, "_t0", None)

    def phase(self, name: str) -> Phase:
        """A child span for the ``onload``, ``execute`` or ``offload`` phase of this stage."""
        if name not in _PHASES:
            raise ValueError(f"stage phase {name!r} is not one of {_PHASES}")
        return Phase(self, name)

    def __enter__(self) -> Stage:
        tel = self._tel
        self._step = tel._current_step
        attributes: dict[str, Any] = {A.RL_STAGE: self.name, A.RL_RANK: tel.rank}
        if self._step is not None and fits_int64(self._step):  # (a step past int64 was reported by step())
            attributes[A.RL_STEP] = self._step
        if self.cluster is not None:
            attributes[A.RL_CLUSTER] = self.cluster
        self._attributes = attributes
        span_name = tel._span_name(self.name)
        self._span = tel._tracer.start_span(span_name, attributes=attributes)
        self._token = context_api.attach(trace_api.set_span_in_context(self._span))
        if self._memory:
            self._snapshot(_WHEN_START, _STATE_OFFLOAD)
        if tel._profiler is not None:  # profile_steps unset: this one check is the whole cost
            self._range = tel._profiler.stage_enter(span_name) if tel._profiler.active else None
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.elapsed = elapsed = time.perf_counter() - self._t0
        if self._tel._profiler is not None:
            self._tel._profiler.stage_exit(self._range)
        if self._memory:
            self._snapshot(_WHEN_END, _STATE_OFFLOAD)
        _end_span(self._span, self._token, exc)
        key = (self.name, self.cluster)
        total = _TOTAL_ATTRS.get(key)
        if total is None:
            total = _total_attrs(key)
        durations = [(total, elapsed)]
        if self._phases or self._memory:
            base = {A.RL_STAGE: self.name}
            if self.cluster is not None:
                base[A.RL_CLUSTER] = self.cluster
            durations.extend((sorted_attrs({**base, A.RL_STAGE_PHASE: p}), s) for p, s, _ in self._phases)
            gauges = self._memory_gauges(base) if self._memory else ()
        else:
            gauges = ()
        interval = (self.name, self._t0, self._t0 + elapsed, tuple(self._phases))  # for the step's goodput buckets
        self._tel._submit((STAGE, self._step, durations, gauges, interval))

    def _snapshot(self, when: str, state: str) -> None:
        tel = self._tel
        event: dict[str, Any] = {A.RL_MEMORY_WHEN: when, A.RL_MEMORY_STATE: state}
        if state == _STATE_OFFLOAD:
            rss, vms = tel._process_probe.memory()
            self._cpu.append((when, rss, vms))
            event[A.RL_MEMORY_RSS] = rss
            event[A.RL_MEMORY_VMS] = vms
        snap = tel._cuda_probe.snapshot()
        if snap is not None:
            self._gpu.append((when, state, snap))
            event.update(
                {
                    A.HW_ID: snap.device,
                    A.RL_MEMORY_ALLOCATED: snap.allocated,
                    A.RL_MEMORY_RESERVED: snap.reserved,
                    A.RL_MEMORY_MAX_ALLOCATED: snap.max_allocated,
                    A.RL_MEMORY_MAX_RESERVED: snap.max_reserved,
                }
            )
        self._span.add_event(N.RL_MEMORY_SNAPSHOT_EVENT, event)

    def _memory_gauges(self, base: dict[str, Any]) -> list[tuple[str, Attrs, float]]:
        gauges: list[tuple[str, Attrs, float]] = []
        for when, rss, vms in self._cpu:
            attrs = sorted_attrs({**base, A.RL_MEMORY_WHEN: when})
            gauges.append((M.PROCESS_MEMORY_USAGE, attrs, float(rss)))
            gauges.append((M.PROCESS_MEMORY_VIRTUAL, attrs, float(vms)))
        for when, state, snap in self._gpu:
            for kind, value in snap.by_kind().items():
                attrs = sorted_attrs(
                    {**base, A.RL_MEMORY_WHEN: when, A.RL_MEMORY_STATE: state, A.RL_MEMORY_KIND: kind, A.HW_ID: snap.device}
                )
                gauges.append((M.RL_GPU_MEMORY_USAGE, attrs, float(value)))
                if kind in _FRACTION_KINDS and snap.total:
                    gauges.append((M.RL_GPU_MEMORY_UTILIZATION, attrs, value / snap.total))
        return gauges

    @property
    def metrics(self) -> dict[str, float]:
        """This stage's timings (s) and memory snapshots (GiB) under the keys and units ROLL logs."""
        infix = f"{self.cluster}/{self.name}" if self.cluster is not None else self.name
        out: dict[str, float] = {}
        if self.elapsed is not None:
            out[f"time/{infix}/total"] = self.elapsed
        for phase, seconds, _ in self._phases:
            out[f"time/{infix}/{phase}"] = seconds
        for when, state, snap in self._gpu:
            for kind, value in snap.by_kind().items():
                out[f"memory/{infix}/{when}/{state}/{kind}/{snap.device}"] = value / _GIB
            if (when, state) == (_WHEN_END, _STATE_ONLOAD) and snap.total:
                out[f"memory/{infix}/{when}/{state}/max_allocated_frac/{snap.device}"] = snap.max_allocated / snap.total
                out[f"memory/{infix}/{when}/{state}/max_reserved_frac/{snap.device}"] = snap.max_reserved / snap.total
        for when, rss, vms in self._cpu:
            out[f"memory/cpu/{infix}/{when}/rss"] = rss / _GIB
            out[f"memory/cpu/{infix}/{when}/vms"] = vms / _GIB
        return out


class StepScope:
    """The root span ``rl.step`` of one step's trace; makes ``step`` the default for log()."""

    __slots__ = ("_tel", "step", "_span", "_token", "_t0", "_previous")

    def __init__(self, tel: Any, step: int) -> None:
        self._tel = tel
        self.step = step

    def __enter__(self) -> StepScope:
        tel = self._tel
        self._previous = (tel._current_step, tel._step_span_context)
        attributes = {A.RL_STEP: self.step, A.RL_RANK: tel.rank, A.RL_RUN_ID: str(tel.config.run_id)}
        if not fits_int64(self.step):  # reported by Telemetry.step(); log() calls at it are dropped
            del attributes[A.RL_STEP]
        self._span = tel._tracer.start_span(N.RL_STEP_SPAN, context=NEW_TRACE_CONTEXT, attributes=attributes)
        self._token = context_api.attach(trace_api.set_span_in_context(self._span))
        tel._current_step = self.step
        tel._step_span_context = self._span.get_span_context()
        if tel._profiler is not None:  # opens a profile window at its first step
            tel._profiler.step_enter(self.step, self._span)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        elapsed = time.perf_counter() - self._t0
        tel = self._tel
        _end_span(self._span, self._token, exc)
        tel._current_step, tel._step_span_context = self._previous
        tel._submit((STEP_END, self.step, elapsed, self._t0))
        tel._trajectories.step_ended(self.step)  # the step's agent trajectories get their tail decision
        if tel._profiler is not None:  # closes the window after its last step
            tel._profiler.step_exit(self.step)

    @property
    def trace_id(self) -> str:
        return format(self._span.get_span_context().trace_id, "032x")


class JoinScope:
    """A worker's part of a step that started in another process (see ``Telemetry.join``)."""

    __slots__ = ("_tel", "_context", "step", "_token", "_previous")

    def __init__(self, tel: Any, context: Context, step: int | None) -> None:
        self._tel = tel
        self._context = context
        self.step = step

    @property
    def joined(self) -> bool:
        """Whether the carrier held a valid trace context (else spans start traces of their own)."""
        return trace_api.get_current_span(self._context).get_span_context().is_valid

    def __enter__(self) -> JoinScope:
        tel = self._tel
        self._previous = (tel._current_step, tel._step_span_context)
        self._token = context_api.attach(self._context)
        if self.step is not None:
            tel._current_step = self.step
        if self.joined:
            tel._step_span_context = trace_api.get_current_span(self._context).get_span_context()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        context_api.detach(self._token)
        self._tel._current_step, self._tel._step_span_context = self._previous
