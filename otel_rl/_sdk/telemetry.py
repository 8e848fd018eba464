"""The public facade's mechanics: steps as traces, stages as spans, log() as metrics and events.

The scopes a loop opens (step, stage, phase, join) live in ``scopes``; the worker that turns
queued calls into metrics and events lives in ``pipeline``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_rl._sdk.export.providers import SCOPE_NAME, bind_series_guard, build_providers, series_guard
from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl._sdk.lifecycle.distributed import with_placement
from otel_rl._sdk.lifecycle.hooks import exit_hook
from otel_rl._sdk.lifecycle.hooks import track as track_process_events
from otel_rl._sdk.lifecycle.run_lock import RUN_INFO_FILE, claim_run_dir, recover_unclean_end
from otel_rl._sdk.pipeline.aggregation import BulkHistograms, LatestValues, StampedPoints
from otel_rl._sdk.pipeline.direct_metrics import DirectMetrics
from otel_rl._sdk.pipeline.goodput import lay_out, parse_finished_step
from otel_rl._sdk.pipeline.refusals import INT64_MAX, INT64_MIN, REFUSED, Refusals
from otel_rl._sdk.pipeline.samples import SampleLogging  # Telemetry.log_samples
from otel_rl._sdk.pipeline.step_plan import packed_step
from otel_rl._sdk.pipeline.summary import print_summary
from otel_rl._sdk.pipeline.values import TextPolicy, check_strict, event_value
from otel_rl._sdk.pipeline.worker import ADD, CALL, LOG, LOG_PACKED, RECORD, Pipeline
from otel_rl._sdk.settings.config import TelemetryConfig, redact_url
from otel_rl._sdk.sources.probes import CudaMemoryProbe, NvmlProbe, ProcessProbe
from otel_rl._sdk.sources.profiling import Profiler
from otel_rl._sdk.spans.light_spans import light_tracer
from otel_rl._sdk.spans.propagation import extract_context, inject_context
from otel_rl._sdk.spans.scopes import NEW_TRACE_CONTEXT, JoinScope, Stage, StepScope, sorted_attrs, stage_span_name
from otel_rl._sdk.spans.trajectories import Trajectories, Trajectory
from otel_rl._version import __version__
from otel_rl.detect.detectors import build_alert_engine
from otel_rl.exporters.files import rank_file_name
from otel_rl.semconv import BUCKETS, METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N
from otel_rl.trackers.fanout import TrackerLogExporter, build_fanout

logger = logging.getLogger("otel_rl")

_SIGNAL_LOGS, _SIGNAL_METRICS = A.RlTelemetrySignalValues.LOGS.value, A.RlTelemetrySignalValues.METRICS.value
_SIGNAL_TRACES = A.RlTelemetrySignalValues.TRACES.value
# shutdown(): the share of its timeout the worker may spend on what is queued; the providers get the rest
_WORKER_SHARE = 0.7
_SPAN_NAMES_LIMIT = 1024  # stage span names cached
_GRACE_SHARE = 0.15  # a worker inside one item when its share ends: time to finish and write it
_EVENT_NAMES = frozenset(value for key, value in vars(N).items() if key.endswith("_EVENT"))


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


class Telemetry(SampleLogging):
    """A training run's telemetry: create with ``otel_rl.init()``; see the package docstring."""

    def __init__(self, config: TelemetryConfig, *, tracer_provider: Any = None) -> None:
        # One live process per run folder and rank: a busy folder moves this one to a sibling (run_lock).
        config, self._run_lock = claim_run_dir(with_placement(config))
        # the metric points a killed predecessor never exported, rebuilt beside this process
        self.recovery = recover_unclean_end(config, self._run_lock)
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
        self._direct = DirectMetrics(self._latest)  # the registry's gauges and counters, read by each export
        self._histograms = BulkHistograms(guard)
        bind_series_guard(guard, self._latest)
        for mdef in METRICS.values():
            if mdef.instrument == "histogram":
                self._histograms.declare(mdef.name, mdef.brief, mdef.unit, BUCKETS[mdef.buckets or "duration"])
        self._stamped = (
            StampedPoints(
                {
                    m.name: (m.instrument, m.brief, m.unit, BUCKETS[m.buckets or "duration"] if m.instrument == "histogram" else ())
                    for m in METRICS.values()
                },
                guard,
            )
            if config.metrics_at_log_time
            else None
        )
        self._resolver = KeyResolver.default(unmapped_key_limit=config.unmapped_key_limit)
        # Trackers first: an unknown name or a missing library fails here, before anything starts.
        self._trackers = build_fanout(
            config,
            str(config.experiment or config.run_id),
            Path(str(config.run_dir)),
            lambda key: self._resolver.resolve(key, config.framework),
        )
        tracker_exporters = [TrackerLogExporter(self._trackers)] if self._trackers is not None else []
        self._providers = build_providers(
            config,
            self.resource,
            self._histograms,
            tracker_exporters,
            tracer_provider=tracer_provider,
            latest=self._latest,
            stamped=self._stamped,
            direct=self._direct,
        )
        sdk_tracer = self._providers.tracer_provider.get_tracer(SCOPE_NAME, __version__)
        # Spans at the cost of an event: recorded on the caller's thread, built by the worker (light_spans);
        # the SDK's tracer where that cannot serve (a tracer provider handed in, a sampler of the environment's).
        self._light_spans = light_tracer(
            self._providers.tracer_provider,
            self._providers.span_limits,
            self.resource,
            InstrumentationScope(SCOPE_NAME, __version__),
            self._providers.end_spans,
        )
        self._tracer: Any = sdk_tracer if self._light_spans is None else self._light_spans
        self._meter = self._providers.meter_provider.get_meter(SCOPE_NAME, __version__)

        self._cuda_probe = CudaMemoryProbe()
        self._process_probe = ProcessProbe()
        self._nvml_probe = NvmlProbe()
        self._nvml_probe.start()
        extra = {**self._process_probe.callbacks(), **self._nvml_probe.callbacks()}
        self._register_instruments(extra)

        console = config.console and self.rank == 0
        self._pipeline = Pipeline(
            resolver=self._resolver,
            framework=config.framework,
            latest=self._latest,
            histograms=self._histograms,
            event_logger=self._providers.logger_provider.get_logger(SCOPE_NAME, __version__),
            on_step_end=print_summary if console else None,
            gather_s=config.file_flush_interval_s,
        )
        self._pipeline.text_policy = TextPolicy(config.export_text, config.attribute_value_limit)
        self._pipeline.step_events = self._providers.step_events
        # After each drain the worker builds the ended spans, then writes the run folder's spans and events.
        light = [self._light_spans] if self._light_spans is not None else []
        if self._light_spans is not None:  # exporters="none" and no tracker: spans are timed, never built
            self._light_spans.consumed = lambda: bool(self._providers.span_processors)
        self._pipeline.file_exports = [*light, *self._providers.file_exports]
        self._pipeline.events_exported = self._providers.events_exported
        self._providers.on_bad_text = self._pipeline.bad_text  # a text UTF-8 cannot encode in a span: said once, counted
        for queued in self._pipeline.file_exports:
            queued.wake = self._pipeline.wake_soon
        # The run folder's events are queued for the worker; its direct lines follow them in order.
        # Over OTLP the order of requests does not matter, and a flush there could wait on the network.
        file_logs = self._providers.run_folder_events
        self._pipeline.flush_sdk_events = file_logs.write if file_logs is not None else None
        self._pipeline.stamped = self._stamped
        self._refusals = Refusals(self._pipeline.report_once, self._submit, self._latest)
        self._trajectories = Trajectories(self)  # agent rollouts as traces of their own (trajectories.py)
        # Bound once: log() is two attribute loads away from the queue.
        self._append = self._pipeline.queue.append
        self._queue = self._pipeline.queue
        self._max_queue = config.max_queue or sys.maxsize
        self._wake_soon = self._pipeline.wake_soon
        # Online alert rules: evaluated by the pipeline's worker after it resolves each log().
        self._alerts = build_alert_engine(config.alert_rules, self._pipeline, self._latest) if config.alert_rules else None
        if self._alerts is not None:
            self._pipeline.observer = self._alerts.observe
        self._profiler = Profiler.start(self)  # profile windows, memory snapshots on alerts; None: off
        self._write_run_info()
        # A hook of this instance's own: atexit.unregister() removes every registration equal to the
        # function it is given, so one function shared by all instances would lose the others' hooks.
        # Registered after the SDK providers' own exit hooks, so it runs before them (exit hooks run
        # last-in first-out) and the worker's queue reaches the providers before they stop.
        self._exit_hook = exit_hook(self)
        atexit.register(self._exit_hook)
        track_process_events(self)  # fork: off in the child; SIGTERM: flush, then exit as before

    # -- setup ----------------------------------------------------------------------------------
    def _register_instruments(self, extra: dict[str, Any]) -> None:
        """The registry's gauges and counters: read from the latest values by each export, those a
        probe observes (process, GPU) after its callback stored its reading. The process's CPU stays
        an SDK instrument: the SDK's reader calls the exporter only when its own collection has a
        point, and this one (always read, one series) keeps it from being empty."""
        for mdef in METRICS.values():
            if mdef.instrument == "histogram":
                continue
            if mdef.name == M.PROCESS_CPU_UTILIZATION:
                callbacks = [self._latest.callback(mdef.name), extra[mdef.name]]
                self._meter.create_observable_gauge(mdef.name, callbacks=callbacks, unit=mdef.unit, description=mdef.brief)
            else:
                self._direct.declare(mdef.name, mdef.instrument, mdef.brief, mdef.unit, extra.get(mdef.name))

    def _write_run_info(self) -> None:
        if not self.config.file_enabled:
            return
        info = {
            "run_id": self.config.run_id,
            "service_name": self.config.service_name,
            "experiment": self.config.experiment,
            "framework": self.config.framework,
            "rank": self.rank,
            "world_size": self.config.world_size or 1,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "otel_rl_version": __version__,
            "destinations": self._providers.destinations,
            "endpoint": redact_url(self.config.endpoint),
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
            name = stage_span_name(stage)
            if len(self._span_names) < _SPAN_NAMES_LIMIT:  # stage names made per call are not all kept
                self._span_names[stage] = name
        return name

    def _submit(self, item: tuple) -> None:
        if not self._closed:
            self._append(item)
            if self._pipeline.idle:
                self._wake_soon()

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
        return sum(self._pipeline.queue_drops.counts.values())

    @property
    def dropped_calls(self) -> int:
        """Calls ignored after ``shutdown()`` or in a forked child: ``log()``, ``record()``, ``add()``,
        ``event()``, ``log_hparams()`` and ``trace_finished_step()``."""
        return self._dropped_calls

    def _drop_call(self, call: str = "log()", signal: str = _SIGNAL_LOGS) -> None:
        self._dropped_calls += 1
        if self._forked_from is None:
            self._refusals.after_shutdown(call, signal, f"run folder {self.run_dir}" if self.run_dir else f"run {self.config.run_id}")
        elif self._dropped_calls == 1:
            logger.warning(
                "otel-rl: process %d was forked from %d after otel_rl.init(); the inherited telemetry is off "
                "here: log() calls are dropped and counted in Telemetry.dropped_calls (reported once). Call "
                "otel_rl.init() in the child to export from it.",
                os.getpid(),
                self._forked_from,
            )

    def _disable_in_forked_child(self, parent_pid: int) -> None:
        """In a forked child: stop at once, touching no lock or thread the parent owned."""
        if not self._closed:
            self._forked_from = parent_pid
        self._closed = True
        if self._light_spans is not None:  # no worker here: spans ended in the child are not kept
            self._light_spans.accepting = False
        self._dropped_calls = 0

    @property
    def current_step(self) -> int | None:
        return self._current_step

    def step(self, step: int) -> StepScope:
        """Context manager: the root span ``rl.step`` of a new trace; ``log()`` defaults to this step.
        A step outside int64 is reported once; its span carries no rl.step, and log() calls at it are dropped."""
        step = int(step)
        if not INT64_MIN <= step <= INT64_MAX:
            self._refusals.step("Telemetry.step()", step)
        return StepScope(self, step)

    def stage(self, name: str, *, cluster: str | None = None, offload: bool = False, memory: bool | None = None) -> Stage:
        """Context manager: a child span ``rl.<name>`` of the current step.

        ``offload=True`` marks a stage that loads and offloads model state (ROLL's
        state_offload_manager): use ``stage.phase("onload"|"execute"|"offload")`` inside it, and
        memory is snapshotted at start/offload, start/onload, end/onload and end/offload.
        ``memory`` forces snapshots on or off for any stage.
        """
        return Stage(self, name, cluster, offload if memory is None else memory)

    def trace_finished_step(
        self,
        step: int,
        stages: Sequence[tuple[str, float] | tuple[str, float, str | None]],
        *,
        step_seconds: float | None = None,
        end_time_ns: int | None = None,
    ) -> None:
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
            return self._drop_call("trace_finished_step()", _SIGNAL_TRACES)
        if (step := self._refusals.step("trace_finished_step()", step)) is REFUSED:
            return
        end_ns = time.time_ns() if end_time_ns is None else int(end_time_ns)
        parsed, step_ns = parse_finished_step(stages, step_seconds, self._pipeline.report_once)
        tracer, rank, span_name, goodput = self._tracer, self.rank, self._span_name, self._pipeline.goodput
        step = int(step)

        def build() -> None:
            start_ns = end_ns - step_ns
            base = {A.RL_STEP: step, A.RL_RANK: rank, A.RL_RUN_ID: str(self.config.run_id), A.RL_SPAN_RECONSTRUCTED: True}
            root = tracer.start_span(N.RL_STEP_SPAN, context=NEW_TRACE_CONTEXT, attributes=base, start_time=start_ns)
            parent = trace_api.set_span_in_context(root)
            laid = lay_out(parsed, start_ns, end_ns)  # (name, begin, end, cluster): back to back
            for name, begin, stage_end, cluster in laid:
                attributes = {**base, A.RL_STAGE: name}
                if cluster is not None:
                    attributes[A.RL_CLUSTER] = cluster
                span = tracer.start_span(span_name(name), context=parent, attributes=attributes, start_time=begin)
                span.end(end_time=stage_end)
            root.end(end_time=end_ns)
            goodput.finished_step(start_ns, end_ns, laid)  # the step's goodput buckets, from the laid-out stages

        self._submit((CALL, build))
        self._trajectories.step_ended(step)

    def trajectory(self, sample_id: str | int, group: str | int | None = None, step: int | None = None) -> Trajectory:
        """Context manager (``with`` / ``async with``): one agent rollout as a trace of its own, with
        ``traj.turn(...)`` per generation, ``traj.tool(...)`` per tool call and ``traj.reward(...)``.
        ``step`` defaults to the current step. Recorded as plain data on the caller's thread (safe
        from many threads and coroutines at once, never raising); kept as spans by the head ratio
        and the step's tail rule, counted in the metrics either way (see ``_sdk/spans/trajectories.py``)."""
        return self._trajectories.open(sample_id, group, step)

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
            self._pipeline.report_once(
                "<join>",
                "no-context",
                "otel-rl: join() got a carrier without a trace context "
                "(expected the dict from Telemetry.inject()); spans start their own traces",
            )
        return scope

    def log(self, values: Mapping[str, Any], step: int | None = None, *, time_ns: int | None = None) -> None:
        """Log one step's values: framework keys (``actor/pg_loss``) or registry metric names.

        The caller pays one dict copy (or, for a step of a key set seen before whose values are
        all floats, one pass that packs them); resolution, metrics and the step event happen
        off-thread.
        Bad values (NaN, inf, None, strings, multi-element tensors, non-string keys) are counted
        and reported once with the key named; with ``strict=True`` they raise ValueError here.
        ``time_ns``: when the values were logged (Unix epoch ns), for replaying an old log; the
        step's ``rl.log`` event carries it. Default: now.
        """
        if self._closed:
            return self._drop_call()
        if len(self._queue) >= self._max_queue:
            return self._pipeline.drop_queued(_SIGNAL_LOGS)
        if step is None:
            step = self._current_step
        # An int step within int64 (the range OTLP carries) costs two comparisons with constants.
        if step is not None and (step.__class__ is not int or not -9223372036854775808 <= step <= 9223372036854775807):
            if (step := self._refusals.step("log()", step, values)) is REFUSED:
                return
        if self.config.strict:
            check_strict(values, self._pipeline.plan)
        if type(values) is dict and (found := packed_step(self._pipeline.step_plans, values)) is not None:
            self._append((LOG_PACKED, step, time.time_ns() if time_ns is None else time_ns, self._step_span_context, *found))
            if self._pipeline.idle:
                self._wake_soon()
            return
        try:
            snapshot = dict(values)
        except Exception as exc:  # not a mapping, or one whose iteration raises: never into the loop
            if self.config.strict:
                raise ValueError(f"otel-rl: log() takes a mapping of key -> value, got {type(values).__name__}") from exc
            self._pipeline.report_once(
                "<log>", type(values).__name__, f"otel-rl: log() takes a mapping of key -> value, got {type(values).__name__}; ignored"
            )
            return
        self._append((LOG, step, time.time_ns() if time_ns is None else time_ns, self._step_span_context, snapshot))
        if self._pipeline.idle:
            self._wake_soon()

    def record(self, metric: str, values: Any, attributes: Mapping[str, Any] | None = None, *, step: int | None = None) -> None:
        """Record a registry metric: a whole array into a histogram, or a value into a gauge/counter."""
        if self._closed:
            return self._drop_call("record()", _SIGNAL_METRICS)
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
        attrs = sorted_attrs(attributes) if attributes else ()
        if attrs and (attrs := self._refusals.attributes(f"record({metric!r})", attrs)) is REFUSED:
            return
        self._submit((RECORD, metric, values, attrs, self._current_step if step is None else step))

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record the run's hyperparameters once (an ``rl.hparams`` event; trackers keep them as config)."""
        if self._closed:
            return self._drop_call("log_hparams()")
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

    def event(self, name: str, body: Mapping[str, Any], attributes: Mapping[str, Any] | None = None, *, step: int | None = None) -> None:
        """Emit a registry event (``otel_rl.semconv.names.*_EVENT``) as a log record in the current
        step's trace; ``rl.step`` is added from ``step`` or the current step."""
        if self._closed:
            return self._drop_call(f"event({name!r})")
        if name not in _EVENT_NAMES:
            self._pipeline.report_once(
                str(name), "unknown-event", f"otel-rl: event({name!r}) is not a registry event (one of {sorted(_EVENT_NAMES)}); ignored"
            )
            return
        attrs = dict(attributes or {})
        step = self._current_step if step is None else step
        if step is not None and (step := self._refusals.step(f"event({name!r})", step, body, count=1)) is REFUSED:
            return
        if (attrs := self._refusals.attributes(f"event({name!r})", attrs)) is REFUSED:
            return
        limit = self._providers.event_attribute_limit
        if limit is not None and len(attrs) + (step is not None) > limit:
            attrs = self._refusals.first_attributes(f"event({name!r})", attrs, limit - (step is not None))
        if step is not None:
            attrs[A.RL_STEP] = step
        flat = {str(k): event_value(v) for k, v in body.items()}
        emit, span_context = self._pipeline.emit_event, self._step_span_context
        when = time.time_ns()
        self._submit((CALL, lambda: emit(name, flat, attrs, when, span_context)))

    def add(self, metric: str, amount: float = 1.0, attributes: Mapping[str, Any] | None = None) -> None:
        """Add to a registry counter (e.g. ``rl.tensor.nonfinite``). A name outside the registry is
        reported once and ignored, as in ``record()``; with ``strict=True`` it raises ValueError."""
        if self._closed:
            return self._drop_call("add()", _SIGNAL_METRICS)
        if metric not in METRICS:
            if self.config.strict:
                raise ValueError(f"otel-rl: add() needs a registry metric name (from otel_rl.semconv.metrics), got {metric!r}")
            self._pipeline.report_once(str(metric), "unknown-metric", f"otel-rl: add({metric!r}) is not a registry metric; ignored")
            return
        attrs = sorted_attrs(attributes) if attributes else ()
        if attrs and (attrs := self._refusals.attributes(f"add({metric!r})", attrs)) is REFUSED:
            return
        self._submit((ADD, metric, attrs, float(amount)))

    def on_alert(self, callback: Callable[[Any], Any]) -> None:
        """Call ``callback(alert)`` for every alert the online rules fire (``otel_rl.detect.detectors.Alert``:
        name, severity, step, message, conditions, actions). It runs on the telemetry worker thread,
        so keep it short; exceptions are reported once and never reach training. For work that must
        happen on the training thread (save a snapshot, roll back), poll :meth:`take_alerts` or
        :attr:`should_stop` in the loop instead. With no rules configured, turns the default rules on."""
        if self._alerts is None:
            if self.config.alert_rules is not None:  # "off" was asked for explicitly
                self._pipeline.report_once(
                    "<alerts>", "off", f"otel-rl: on_alert() ignored: alert_rules={self.config.alert_rules!r} turns the rules off"
                )
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
        return self._latest.get(metric, sorted_attrs(attributes) if attributes else ())

    def resolve(self, key: str) -> Any:
        """Where a framework key goes: its registry metric and attributes."""
        return self._resolver.resolve(key, self.config.framework)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Process everything logged so far and export it now."""
        if self._forked_from is not None:  # the parent's locks and threads are not ours to wait on
            return False
        deadline = time.monotonic() + timeout_s  # one clock for the whole call, not one per signal
        self._trajectories.flush()
        self._pipeline.drain()
        return self._providers.force_flush(deadline - time.monotonic())

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Flush and stop exporting, within ``timeout_s``. Safe to call twice; ``atexit`` calls it too.

        What the worker has not processed by 70% of ``timeout_s`` (a backlog of new keys) is dropped,
        counted in ``rl.telemetry.dropped{drop_reason=shutdown_timeout}`` and said in one line; the
        exporters get the rest of the time. Later calls are dropped, said once and counted."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._exit_hook)  # this instance's hook only (see __init__)
        Profiler.stop(self._profiler)  # a window the loop ended inside is written now
        # One clock for the whole shutdown: an unreachable collector cannot hold exit past timeout_s.
        deadline = time.monotonic() + timeout_s
        self._providers.begin_shutdown(timeout_s)
        self._trajectories.close()  # the trajectories held are decided before the worker stops
        # What the worker has not processed in its share is dropped, counted and said in one line.
        self._pipeline.stop(_WORKER_SHARE * timeout_s, _GRACE_SHARE * timeout_s).report(timeout_s)
        if self._light_spans is not None:  # nothing builds spans any more: later ones are not kept
            self._light_spans.accepting = False
        # The providers get the time left (a tenth of it at least, to write what the worker drained).
        self._providers.shutdown(max(deadline - time.monotonic(), 0.1 * timeout_s))
        self._nvml_probe.stop()
        if self._run_lock is not None:  # the next process of this rank may take the run folder
            self._run_lock.release()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<otel_rl.Telemetry service={self.config.service_name!r} run={self.config.run_id!r} rank={self.rank} -> {', '.join(self._providers.destinations) or 'nowhere'}>"
