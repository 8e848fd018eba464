"""The public facade's mechanics: steps as traces, stages as spans, log() as metrics and events."""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import math
import os
import socket
import sys
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Status, StatusCode

from otel_rl._sdk.aggregation import Attrs, BulkHistograms, LatestValues, StampedPoints
from otel_rl._sdk.config import TelemetryConfig, redact_url
from otel_rl.detect.detectors import build_alert_engine
from otel_rl._sdk.distributed import detect_placement
from otel_rl._sdk.lifecycle import track as track_process_events
from otel_rl._sdk.keys import KeyResolver
from otel_rl._sdk.pipeline import (
    ADD, CALL, LOG, RECORD, STAGE, STEP_END, Pipeline, Rejected, TextPolicy, _key_text, event_value, print_summary, to_number,
)
from otel_rl._sdk.probes import CudaMemoryProbe, GpuMemorySnapshot, NvmlProbe, ProcessProbe
from otel_rl._sdk.propagation import extract_context, inject_context
from otel_rl._sdk.providers import SCOPE_NAME, bind_series_guard, build_providers, series_guard
from otel_rl.exporters.files import rank_file_name
from otel_rl._version import __version__
from otel_rl.trackers.fanout import TrackerLogExporter, build_fanout
from otel_rl.semconv import BUCKETS, METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

logger = logging.getLogger("otel_rl")

_ROOT = Context()  # an empty context: each step starts a new trace
_WHEN_START, _WHEN_END = A.RlMemoryWhenValues.START.value, A.RlMemoryWhenValues.END.value
_STATE_OFFLOAD, _STATE_ONLOAD = A.RlMemoryStateValues.OFFLOAD.value, A.RlMemoryStateValues.ONLOAD.value
_PHASE_TOTAL = A.RlStagePhaseValues.TOTAL.value
_SIGNAL_LOGS, _SIGNAL_METRICS = A.RlTelemetrySignalValues.LOGS.value, A.RlTelemetrySignalValues.METRICS.value
_PHASE_EXECUTE = A.RlStagePhaseValues.EXECUTE.value
_PHASES = tuple(m.value for m in A.RlStagePhaseValues if m is not A.RlStagePhaseValues.TOTAL)
_FRACTION_KINDS = (A.RlMemoryKindValues.MAX_ALLOCATED.value, A.RlMemoryKindValues.MAX_RESERVED.value)
RUN_INFO_FILE = "run.json"
_EVENT_NAMES = frozenset(value for key, value in vars(N).items() if key.endswith("_EVENT"))
_GIB = float(2**30)  # ROLL logs memory in GiB


def build_resource(config: TelemetryConfig) -> Resource:
    attributes: dict[str, Any] = {
        A.SERVICE_NAME: config.service_name,
        A.RL_RUN_ID: str(config.run_id),
        A.RL_RANK: config.rank or 0,
        A.RL_LOCAL_RANK: config.local_rank or 0,
        A.RL_WORLD_SIZE: config.world_size or 1,
        A.HOST_NAME: socket.gethostname(),
        A.TELEMETRY_DISTRO_NAME: "otel-rl",
        A.TELEMETRY_DISTRO_VERSION: __version__,
    }
    if config.node_rank is not None:
        attributes[A.RL_NODE_RANK] = config.node_rank
    if config.experiment:
        attributes[A.RL_EXPERIMENT_NAME] = config.experiment
    if config.framework:
        attributes[A.RL_FRAMEWORK] = config.framework
    return Resource.create(attributes)


def with_placement(config: TelemetryConfig) -> TelemetryConfig:
    """Fill rank, local rank, world size and node rank the caller left open from the job itself."""
    if None not in (config.rank, config.local_rank, config.world_size, config.node_rank):
        return config
    found = detect_placement()
    fill = {name: getattr(found, name) for name in ("rank", "local_rank", "world_size", "node_rank")
            if getattr(config, name) is None and getattr(found, name) is not None}
    return dataclasses.replace(config, **fill) if fill else config


def _end_span(span: Any, token: object, exc: BaseException | None) -> None:
    """Leave the span's context and end it, marking it failed when the block raised."""
    context_api.detach(token)
    if exc is not None:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.end()


def _sorted_attrs(pairs: Mapping[str, Any]) -> Attrs:
    return tuple(sorted(pairs.items()))


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
        self._span = stage._tel._tracer.start_span(f"rl.{self._name}", attributes=attributes)
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
        stage._phases.append((self._name, elapsed))


class Stage:
    """A training stage as a child span of the step; ``metrics`` gives ROLL-style keys afterwards."""

    __slots__ = ("_tel", "name", "cluster", "_memory", "_attributes", "_span", "_token", "_t0", "_phases",
                 "_gpu", "_cpu", "elapsed", "_step")

    def __init__(self, tel: Telemetry, name: str, cluster: str | None, memory: bool) -> None:
        self._tel = tel
        self.name = name
        self.cluster = cluster
        self._memory = memory
        self._phases: list[tuple[str, float]] = []
        self._gpu: list[tuple[str, str, GpuMemorySnapshot]] = []
        self._cpu: list[tuple[str, int, int]] = []
        self.elapsed: float | None = None

    def phase(self, name: str) -> Phase:
        """A child span for the ``onload``, ``execute`` or ``offload`` phase of this stage."""
        if name not in _PHASES:
            raise ValueError(f"stage phase {name!r} is not one of {_PHASES}")
        return Phase(self, name)

    def __enter__(self) -> Stage:
        tel = self._tel
        self._step = tel._current_step
        attributes: dict[str, Any] = {A.RL_STAGE: self.name, A.RL_RANK: tel.rank}
        if self._step is not None:
            attributes[A.RL_STEP] = self._step
        if self.cluster is not None:
            attributes[A.RL_CLUSTER] = self.cluster
        self._attributes = attributes
        self._span = tel._tracer.start_span(tel._span_name(self.name), attributes=attributes)
        self._token = context_api.attach(trace_api.set_span_in_context(self._span))
        if self._memory:
            self._snapshot(_WHEN_START, _STATE_OFFLOAD)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.elapsed = elapsed = time.perf_counter() - self._t0
        if self._memory:
            self._snapshot(_WHEN_END, _STATE_OFFLOAD)
        _end_span(self._span, self._token, exc)
        base = {A.RL_STAGE: self.name}
        if self.cluster is not None:
            base[A.RL_CLUSTER] = self.cluster
        durations = [(_sorted_attrs({**base, A.RL_STAGE_PHASE: _PHASE_TOTAL}), elapsed)]
        durations.extend((_sorted_attrs({**base, A.RL_STAGE_PHASE: p}), s) for p, s in self._phases)
        self._tel._submit((STAGE, self._step, durations, self._memory_gauges(base) if self._memory else ()))

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
            event.update({
                A.HW_ID: snap.device, A.RL_MEMORY_ALLOCATED: snap.allocated, A.RL_MEMORY_RESERVED: snap.reserved,
                A.RL_MEMORY_MAX_ALLOCATED: snap.max_allocated, A.RL_MEMORY_MAX_RESERVED: snap.max_reserved,
            })
        self._span.add_event(N.RL_MEMORY_SNAPSHOT_EVENT, event)

    def _memory_gauges(self, base: dict[str, Any]) -> list[tuple[str, Attrs, float]]:
        gauges: list[tuple[str, Attrs, float]] = []
        for when, rss, vms in self._cpu:
            attrs = _sorted_attrs({**base, A.RL_MEMORY_WHEN: when})
            gauges.append((M.PROCESS_MEMORY_USAGE, attrs, float(rss)))
            gauges.append((M.PROCESS_MEMORY_VIRTUAL, attrs, float(vms)))
        for when, state, snap in self._gpu:
            for kind, value in snap.by_kind().items():
                attrs = _sorted_attrs({**base, A.RL_MEMORY_WHEN: when, A.RL_MEMORY_STATE: state, A.RL_MEMORY_KIND: kind, A.HW_ID: snap.device})
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
        for phase, seconds in self._phases:
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

    def __init__(self, tel: Telemetry, step: int) -> None:
        self._tel = tel
        self.step = step

    def __enter__(self) -> StepScope:
        tel = self._tel
        self._previous = (tel._current_step, tel._step_span_context)
        self._span = tel._tracer.start_span(N.RL_STEP_SPAN, context=_ROOT, attributes={A.RL_STEP: self.step, A.RL_RANK: tel.rank})
        self._token = context_api.attach(trace_api.set_span_in_context(self._span))
        tel._current_step = self.step
        tel._step_span_context = self._span.get_span_context()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        elapsed = time.perf_counter() - self._t0
        tel = self._tel
        _end_span(self._span, self._token, exc)
        tel._current_step, tel._step_span_context = self._previous
        tel._submit((STEP_END, self.step, elapsed))

    @property
    def trace_id(self) -> str:
        return format(self._span.get_span_context().trace_id, "032x")


class JoinScope:
    """A worker's part of a step that started in another process (see ``Telemetry.join``)."""

    __slots__ = ("_tel", "_context", "step", "_token", "_previous")

    def __init__(self, tel: Telemetry, context: Context, step: int | None) -> None:
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


class Telemetry:
    """A training run's telemetry: create with ``otel_rl.init()``; see the package docstring."""

    def __init__(self, config: TelemetryConfig, *, tracer_provider: Any = None) -> None:
        config = with_placement(config)
        self.config = config
        self.rank = config.rank or 0
        self._closed = False
        self._forked_from: int | None = None  # the parent's pid, in a forked child (see _lifecycle)
        self._dropped_calls = 0
        self._current_step: int | None = None
        self._step_span_context: Any = None
        self._span_names: dict[str, str] = {}
        self.resource = build_resource(config)

        guard = series_guard(config)  # cardinality and attribute-length caps
        self._latest = LatestValues(guard)
        self._histograms = BulkHistograms(guard)
        bind_series_guard(guard, self._latest)
        for mdef in METRICS.values():
            if mdef.instrument == "histogram":
                self._histograms.declare(mdef.name, mdef.brief, mdef.unit, BUCKETS[mdef.buckets or "duration"])
        self._stamped = StampedPoints({m.name: (m.instrument, m.brief, m.unit, BUCKETS[m.buckets or "duration"]
                                                if m.instrument == "histogram" else ()) for m in METRICS.values()},
                                      guard) if config.metrics_at_log_time else None
        self._resolver = KeyResolver.default(unmapped_key_limit=config.unmapped_key_limit)
        # Trackers first: an unknown name or a missing library fails here, before anything starts.
        self._trackers = build_fanout(config, str(config.experiment or config.run_id), Path(str(config.run_dir)),
                                      lambda key: self._resolver.resolve(key, config.framework))
        tracker_exporters = [TrackerLogExporter(self._trackers)] if self._trackers is not None else []
        self._providers = build_providers(config, self.resource, self._histograms, tracker_exporters,
                                          tracer_provider=tracer_provider, latest=self._latest, stamped=self._stamped)
        self._tracer = self._providers.tracer_provider.get_tracer(SCOPE_NAME, __version__)
        self._meter = self._providers.meter_provider.get_meter(SCOPE_NAME, __version__)

        self._cuda_probe = CudaMemoryProbe()
        self._process_probe = ProcessProbe()
        self._nvml_probe = NvmlProbe()
        self._nvml_probe.start()
        extra = {**self._process_probe.callbacks(), **self._nvml_probe.callbacks()}
        self._register_instruments(extra)

        console = config.console and self.rank == 0
        self._pipeline = Pipeline(
            resolver=self._resolver, framework=config.framework, latest=self._latest, histograms=self._histograms,
            event_logger=self._providers.logger_provider.get_logger(SCOPE_NAME, __version__),
            on_step_end=print_summary if console else None,
        )
        self._pipeline.text_policy = TextPolicy(config.export_text, config.attribute_value_limit)
        self._pipeline.stamped = self._stamped
        # Bound once: log() is two attribute loads away from the queue.
        self._append = self._pipeline.queue.append
        self._queue = self._pipeline.queue
        self._max_queue = config.max_queue or sys.maxsize
        self._wake = self._pipeline.wake
        # Online alert rules: evaluated by the pipeline's worker after it resolves each log().
        self._alerts = build_alert_engine(config.alert_rules, self._pipeline, self._latest) if config.alert_rules else None
        if self._alerts is not None:
            self._pipeline.observer = self._alerts.observe
        self._write_run_info()
        self._atexit_ref = weakref.WeakMethod(self.shutdown)
        atexit.register(_shutdown_at_exit, self._atexit_ref)
        track_process_events(self)  # fork: off in the child; SIGTERM: flush, then exit as before

    # -- setup ----------------------------------------------------------------------------------
    def _register_instruments(self, extra: dict[str, Any]) -> None:
        meter = self._meter
        create = {
            "gauge": meter.create_observable_gauge,
            "counter": meter.create_observable_counter,
            "updowncounter": meter.create_observable_up_down_counter,
        }
        for mdef in METRICS.values():
            if mdef.instrument == "histogram":
                continue
            callbacks = [self._latest.callback(mdef.name)]
            if mdef.name in extra:
                callbacks.append(extra[mdef.name])
            create[mdef.instrument](mdef.name, callbacks=callbacks, unit=mdef.unit, description=mdef.brief)

    def _write_run_info(self) -> None:
        if not self.config.file_enabled:
            return
        info = {
            "run_id": self.config.run_id, "service_name": self.config.service_name, "experiment": self.config.experiment,
            "framework": self.config.framework, "rank": self.rank, "world_size": self.config.world_size or 1,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "otel_rl_version": __version__,
            "destinations": self._providers.destinations, "endpoint": redact_url(self.config.endpoint),
            "probes": {"torch.cuda": self._cuda_probe.status, "nvml": self._nvml_probe.status},
        }
        path = Path(str(self.config.run_dir)) / rank_file_name(RUN_INFO_FILE, self.rank)
        try:
            path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            logger.warning("otel-rl: could not write %s: %s", path, exc)

    def _span_name(self, stage: str) -> str:
        name = self._span_names.get(stage)
        if name is None:
            name = self._span_names[stage] = f"rl.{stage}"
        return name

    def _submit(self, item: tuple) -> None:
        if not self._closed:
            self._append(item)
            if not self._wake.is_set():
                self._wake.set()

    # -- public API -----------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path | None:
        return Path(str(self.config.run_dir)) if self.config.file_enabled else None

    @property
    def closed(self) -> bool:
        """Whether ``shutdown()`` ran: nothing is recorded any more."""
        return self._closed

    @property
    def queue_dropped_calls(self) -> int:
        """``log()`` / ``record()`` calls dropped because the worker was ``max_queue`` items behind."""
        return sum(self._pipeline.dropped_queued.values())

    @property
    def dropped_calls(self) -> int:
        """``log()`` / ``record()`` calls ignored: after ``shutdown()``, or in a forked child."""
        return self._dropped_calls

    def _drop_call(self) -> None:
        self._dropped_calls += 1
        if self._forked_from is not None and self._dropped_calls == 1:
            logger.warning("otel-rl: process %d was forked from %d after otel_rl.init(); the inherited telemetry is off "
                           "here: log() calls are dropped and counted in Telemetry.dropped_calls (reported once). Call "
                           "otel_rl.init() in the child to export from it.", os.getpid(), self._forked_from)

    def _disable_in_forked_child(self, parent_pid: int) -> None:
        """In a forked child: stop at once, touching no lock or thread the parent owned."""
        if not self._closed:
            self._forked_from = parent_pid
        self._closed = True
        self._dropped_calls = 0

    @property
    def current_step(self) -> int | None:
        return self._current_step

    def step(self, step: int) -> StepScope:
        """Context manager: the root span ``rl.step`` of a new trace; ``log()`` defaults to this step."""
        return StepScope(self, int(step))

    def stage(self, name: str, *, cluster: str | None = None, offload: bool = False, memory: bool | None = None) -> Stage:
        """Context manager: a child span ``rl.<name>`` of the current step.

        ``offload=True`` marks a stage that loads and offloads model state (ROLL's
        state_offload_manager): use ``stage.phase("onload"|"execute"|"offload")`` inside it, and
        memory is snapshotted at start/offload, start/onload, end/onload and end/offload.
        ``memory`` forces snapshots on or off for any stage.
        """
        return Stage(self, name, cluster, offload if memory is None else memory)

    def trace_finished_step(self, step: int, stages: Sequence[tuple[str, float] | tuple[str, float, str | None]], *,
                            step_seconds: float | None = None, end_time_ns: int | None = None) -> None:
        """Trace a step that is already over from the durations a framework logged for it.

        For frameworks that time their stages themselves and report the seconds afterwards (verl's
        ``timing_s/*``): an ``rl.step`` span ending at ``end_time_ns`` (default now) and lasting
        ``step_seconds`` (default the stages' sum), with one ``rl.<stage>`` child per
        ``(stage, seconds[, cluster])`` laid back to back in the given order. A stage that would
        run past the step's end is moved to end with it, so it overlaps the one before (as
        overlapping stages did). Every span carries ``rl.span.reconstructed=true``. Spans only:
        log the durations with ``log()`` for the metrics. Bad entries are reported once and skipped;
        the spans are built on the telemetry worker.
        """
        if self._closed:
            return self._drop_call()
        end_ns = time.time_ns() if end_time_ns is None else int(end_time_ns)
        parsed: list[tuple[str, int, str | None]] = []
        for entry in stages:
            try:
                name, seconds = str(entry[0]), float(entry[1])
                cluster = entry[2] if len(entry) > 2 else None
            except (TypeError, ValueError, IndexError):
                seconds = math.nan
            if not (seconds >= 0 and math.isfinite(seconds)):
                self._pipeline.report_once(f"<trace_finished_step {entry!r:.60}>", "bad-stage",
                                           f"otel-rl: trace_finished_step() needs (stage, seconds >= 0[, cluster]) entries, "
                                           f"got {entry!r:.80}; skipped")
                continue
            parsed.append((name, int(seconds * 1e9), None if cluster is None else str(cluster)))
        total_ns = sum(d for _, d, _ in parsed)
        try:
            step_ns = total_ns if step_seconds is None else int(float(step_seconds) * 1e9)
        except (TypeError, ValueError):
            step_ns = -1
        if step_ns < 0:
            self._pipeline.report_once("<trace_finished_step step_seconds>", "bad-step-seconds",
                                       f"otel-rl: trace_finished_step(step_seconds={step_seconds!r}) must be seconds >= 0; "
                                       "used the stages' sum")
            step_ns = total_ns
        tracer, rank, span_name = self._tracer, self.rank, self._span_name
        step = int(step)

        def build() -> None:
            start_ns = end_ns - step_ns
            base = {A.RL_STEP: step, A.RL_RANK: rank, A.RL_SPAN_RECONSTRUCTED: True}
            root = tracer.start_span(N.RL_STEP_SPAN, context=_ROOT, attributes=base, start_time=start_ns)
            parent = trace_api.set_span_in_context(root)
            at = start_ns
            for name, duration_ns, cluster in parsed:
                begin = max(start_ns, min(at, end_ns - duration_ns))
                attributes = {**base, A.RL_STAGE: name}
                if cluster is not None:
                    attributes[A.RL_CLUSTER] = cluster
                span = tracer.start_span(span_name(name), context=parent, attributes=attributes, start_time=begin)
                span.end(end_time=begin + duration_ns)
                at = begin + duration_ns
            root.end(end_time=end_ns)

        self._submit((CALL, build))

    def inject(self, carrier: dict[str, Any] | None = None) -> dict[str, Any]:
        """Put the current span's trace context and step into ``carrier`` (a new dict if None).

        Send it with the work (ROLL's / verl's ``DataProto.meta_info``, a Ray call's arguments,
        a request header) and call ``join(carrier)`` on the other side.
        """
        return inject_context(carrier, step=self._current_step)  # type: ignore[return-value]

    def join(self, carrier: Any) -> JoinScope:
        """Context manager for a worker: stages opened inside are children of the span that
        called ``inject`` in another process, and ``log()`` defaults to that step. A carrier
        without a valid context is reported once; stages then start traces of their own."""
        context, step = extract_context(carrier)
        scope = JoinScope(self, context, step)
        if not scope.joined:
            self._pipeline.report_once("<join>", "no-context", "otel-rl: join() got a carrier without a trace context "
                                       "(expected the dict from Telemetry.inject()); spans start their own traces")
        return scope

    def log(self, values: Mapping[str, Any], step: int | None = None, *, time_ns: int | None = None) -> None:
        """Log one step's values: framework keys (``actor/pg_loss``) or registry metric names.

        The caller pays one dict copy; resolution, metrics and the step event happen off-thread.
        Bad values (NaN, inf, None, strings, multi-element tensors, non-string keys) are counted
        and reported once with the key named; with ``strict=True`` they raise ValueError here.
        ``time_ns``: when the values were logged (Unix epoch ns), for replaying an old log; the
        step's ``rl.log`` event carries it. Default: now.
        """
        if self._closed:
            return self._drop_call()
        if len(self._queue) >= self._max_queue:
            return self._pipeline.drop_queued(_SIGNAL_LOGS)
        if self.config.strict:
            self._check_strict(values)
        try:
            snapshot = dict(values)
        except Exception as exc:  # not a mapping, or one whose iteration raises: never into the loop
            if self.config.strict:
                raise ValueError(f"otel-rl: log() takes a mapping of key -> value, got {type(values).__name__}") from exc
            self._pipeline.report_once("<log>", type(values).__name__, f"otel-rl: log() takes a mapping of key -> value, got {type(values).__name__}; ignored")
            return
        self._append((LOG, self._current_step if step is None else step, time.time_ns() if time_ns is None else time_ns,
                      self._step_span_context, snapshot))
        if not self._wake.is_set():
            self._wake.set()

    def record(self, metric: str, values: Any, attributes: Mapping[str, Any] | None = None, *, step: int | None = None) -> None:
        """Record a registry metric: a whole array into a histogram, or a value into a gauge/counter."""
        if self._closed:
            return self._drop_call()
        if len(self._queue) >= self._max_queue:
            return self._pipeline.drop_queued(_SIGNAL_METRICS)
        if metric not in METRICS:
            if self.config.strict:
                raise ValueError(f"otel-rl: record() needs a registry metric name (from otel_rl.semconv.metrics), got {metric!r}")
            self._pipeline.report_once(str(metric), "unknown-metric", f"otel-rl: record({metric!r}) is not a registry metric; ignored")
            return
        if hasattr(values, "detach"):
            values = values.detach()
            if getattr(values, "is_cuda", False):
                values = values.clone()  # an async device copy: the worker reads it, the caller never waits
        elif isinstance(values, np.ndarray):
            values = values.copy()
        elif isinstance(values, list):
            values = list(values)
        attrs = _sorted_attrs(attributes) if attributes else ()
        self._submit((RECORD, metric, values, attrs, self._current_step if step is None else step))

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record the run's hyperparameters once (an ``rl.hparams`` event; trackers keep them as config)."""
        if self._closed:
            return
        flat: dict[str, Any] = {}
        stack = [("", hparams)]
        while stack:
            prefix, mapping = stack.pop()
            for key, value in mapping.items():
                name = f"{prefix}{key}"
                if isinstance(value, Mapping):
                    stack.append((f"{name}/", value))
                else:
                    flat[name] = event_value(value)
        emit = self._pipeline.emit_event
        self._submit((CALL, lambda: emit(N.RL_HPARAMS_EVENT, flat, {})))

    def event(self, name: str, body: Mapping[str, Any], attributes: Mapping[str, Any] | None = None,
              *, step: int | None = None) -> None:
        """Emit a registry event (``otel_rl.semconv.names.*_EVENT``) as a log record in the current
        step's trace; ``rl.step`` is added from ``step`` or the current step."""
        if self._closed:
            return
        if name not in _EVENT_NAMES:
            self._pipeline.report_once(str(name), "unknown-event", f"otel-rl: event({name!r}) is not a registry event "
                                       f"(one of {sorted(_EVENT_NAMES)}); ignored")
            return
        attrs = dict(attributes or {})
        step = self._current_step if step is None else step
        if step is not None:
            attrs[A.RL_STEP] = step
        flat = {str(k): event_value(v) for k, v in body.items()}
        emit, span_context = self._pipeline.emit_event, self._step_span_context
        when = time.time_ns()
        self._submit((CALL, lambda: emit(name, flat, attrs, when, span_context)))

    def add(self, metric: str, amount: float = 1.0, attributes: Mapping[str, Any] | None = None) -> None:
        """Add to a registry counter (e.g. ``rl.tensor.nonfinite``)."""
        self._submit((ADD, metric, _sorted_attrs(attributes) if attributes else (), float(amount)))

    def on_alert(self, callback: Callable[[Any], Any]) -> None:
        """Call ``callback(alert)`` for every alert the online rules fire (``otel_rl.detect.detectors.Alert``:
        name, severity, step, message, conditions, actions). It runs on the telemetry worker thread,
        so keep it short; exceptions are reported once and never reach training. For work that must
        happen on the training thread (save a snapshot, roll back), poll :meth:`take_alerts` or
        :attr:`should_stop` in the loop instead. With no rules configured, turns the default rules on."""
        if self._alerts is None:
            if self.config.alert_rules is not None:  # "off" was asked for explicitly
                self._pipeline.report_once("<alerts>", "off", f"otel-rl: on_alert() ignored: alert_rules={self.config.alert_rules!r} "
                                           "turns the rules off")
                return
            self._alerts = build_alert_engine("default", self._pipeline, self._latest)
            self._pipeline.observer = self._alerts.observe  # type: ignore[union-attr]
        self._alerts.add_hook(callback)  # type: ignore[union-attr]

    @property
    def should_stop(self) -> bool:
        """True once a rule with the ``stop`` action fired: poll it in the training loop and stop there."""
        return self._alerts is not None and self._alerts.should_stop

    def take_alerts(self) -> list[Any]:
        """Alerts fired since the last call, for a training loop that acts on them on its own thread."""
        return self._alerts.take_alerts() if self._alerts is not None else []

    def latest(self, metric: str, attributes: Mapping[str, Any] | None = None) -> float | None:
        """The latest value of a gauge or counter series (after ``flush()``), for tests and tools."""
        return self._latest.get(metric, _sorted_attrs(attributes) if attributes else ())

    def resolve(self, key: str) -> Any:
        """Where a framework key goes: its registry metric and attributes."""
        return self._resolver.resolve(key, self.config.framework)

    def _check_strict(self, values: Mapping[str, Any], depth: int = 0) -> None:
        if not isinstance(values, Mapping):
            raise ValueError(f"otel-rl: log() takes a mapping of key -> value, got {type(values).__name__}")
        if depth > 64:
            raise ValueError("otel-rl strict mode: values nested more than 64 levels deep (or a mapping that contains itself)")
        try:
            items = list(values.items())
        except Exception as exc:
            raise ValueError(f"otel-rl strict mode: the items of a {type(values).__name__} cannot be read: {exc!r}") from None
        for key, raw in items:
            if type(key) is not str:
                raise ValueError(f"otel-rl strict mode: key {_key_text(key)} is a {type(key).__name__}, not a string")
            if isinstance(raw, Mapping):
                try:
                    nested = {f"{key}/{k}": v for k, v in raw.items()}
                except Exception as exc:
                    raise ValueError(f"otel-rl strict mode: the items of {key!r} cannot be read: {exc!r}") from None
                self._check_strict(nested, depth + 1)
                continue
            plan = self._pipeline.plan(key)
            try:
                to_number(plan.transform(raw) if plan.transform else raw)
            except Rejected as rej:
                raise ValueError(f"otel-rl strict mode: value of {key!r} is {rej.reason}" + (f" ({rej.detail})" if rej.detail else "")) from None
            except Exception as exc:  # whatever a foreign object's conversion raises, as a ValueError
                raise ValueError(f"otel-rl strict mode: value of {key!r} cannot be read: {type(exc).__name__}") from None

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Process everything logged so far and export it now."""
        if self._forked_from is not None:  # the parent's locks and threads are not ours to wait on
            return False
        self._pipeline.drain()
        ms = int(timeout_s * 1000)
        ok = self._providers.tracer_provider.force_flush(ms)
        ok = self._providers.logger_provider.force_flush(ms) and ok
        ok = self._providers.meter_provider.force_flush(ms) and ok
        return bool(ok)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Flush and stop exporting. Safe to call twice; ``atexit`` calls it too."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(_shutdown_at_exit)
        # One clock for the whole shutdown: an unreachable collector cannot hold exit past timeout_s.
        self._providers.begin_shutdown(timeout_s)
        self._pipeline.stop(timeout_s)
        ms = int(timeout_s * 1000)
        # a tracer provider that was handed in belongs to the caller: stop only our processors
        owned = self._providers.span_processors if self._providers.shared_tracer_provider else [self._providers.tracer_provider]
        for provider in (*owned, self._providers.logger_provider):
            try:
                provider.shutdown()
            except Exception as exc:
                logger.warning("otel-rl: shutting down %s failed: %s", type(provider).__name__, exc)
        try:
            self._providers.meter_provider.shutdown(timeout_millis=ms)
        except Exception as exc:
            logger.warning("otel-rl: shutting down the meter provider failed: %s", exc)
        self._nvml_probe.stop()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<otel_rl.Telemetry service={self.config.service_name!r} run={self.config.run_id!r} rank={self.rank} -> {', '.join(self._providers.destinations) or 'nowhere'}>"


def _shutdown_at_exit(ref: weakref.WeakMethod) -> None:
    method = ref()
    if method is not None:
        method()
