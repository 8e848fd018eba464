"""The off-thread half of the hot path.

``Telemetry.log`` copies the caller's dict (one C-level copy) and appends it to a deque; this
worker resolves keys, coerces values, updates the latest-value table and the histograms, and
emits the step's ``rl.log`` event. Nothing here can raise into the training loop: problems are
counted in ``rl.telemetry.rejected`` and reported once per key.
"""

from __future__ import annotations

import logging
import math
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from opentelemetry import trace
from opentelemetry._logs import Logger, SeverityNumber
from opentelemetry.context import Context

from otel_rl._sdk.aggregation import Attrs, BulkHistograms, LatestValues, SlotRow, StampedPoints
from otel_rl._sdk.goodput import StageInterval, StepGoodput
from otel_rl._sdk.keys import KeyResolver
from otel_rl._sdk.summary import HEADLINE_LABELS

# Rejected and to_number are imported from here too (the analyzers coerce values as the worker does).
from otel_rl._sdk.values import MAX_NESTING, Rejected, event_value, key_text, resolved_number, step_numbers, to_array, to_number
from otel_rl.exporters.otlp_json import FloatBody
from otel_rl.exporters.step_events import DirectStepWriter
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

logger = logging.getLogger("otel_rl")

LOG, RECORD, STAGE, STEP_END, ADD, CALL = range(6)
_REASONS = A.RlTelemetryReasonValues
_SIGNALS = A.RlTelemetrySignalValues
_QUEUE_FULL = (A.RL_TELEMETRY_DROP_REASON, A.RlTelemetryDropReasonValues.QUEUE_FULL.value)


class Plan:
    """How a key's values are applied, computed once per key."""

    __slots__ = ("metric", "attrs", "transform", "histogram", "counter_overflow")

    def __init__(
        self, metric: str, attrs: Attrs, transform: Callable[[Any], float] | None, histogram: bool, counter_overflow: bool
    ) -> None:
        self.metric = metric
        self.attrs = attrs
        self.transform = transform
        self.histogram = histogram
        self.counter_overflow = counter_overflow


_UNPLANNED: Any = object()  # sentinel in StepPlan | None lookups; Any so an identity check can rule it out
_STEP_PLANS = 8  # key sets whose plans are kept
_PLAN_TRIES = 3  # steps of a key set with a series that has no value yet, before it goes per key for good


class StepPlan:
    """What a step whose keys are exactly ``keys`` does, built once from the per-key plans after the
    first step with those keys took the per-key path: the latest-value slots its values go to and
    the linear transforms (``row``: a SlotRow), the timers' histograms, and the console summary's
    values (``headline``: index, label, factor).
    Only steps whose every key is a plain gauge or a linearly transformed one get a plan."""

    __slots__ = ("keys", "row", "series", "headline", "histograms", "histogram_rows", "histogram_values", "template", "int_templates")

    def __init__(
        self,
        keys: list[str],
        slots: list[list[Any]],
        series: list[tuple[str, Attrs]],
        scaled: list[tuple[int, float]],
        headline: list[tuple[int, str]],
        histograms: list[tuple[int, Any]],
        histogram_rows: Any = None,
    ) -> None:
        self.keys, self.series = keys, series
        self.row = SlotRow(slots, scaled, frozenset(series))
        factors = dict(scaled)
        self.headline = [(index, label, factors.get(index, 1.0)) for index, label in headline]
        self.histograms = histograms  # (index, histogram state) of the keys recorded into histograms (timers)
        self.histogram_rows = histogram_rows  # where a step's row of those values goes (binned in bulk later)
        self.template: Any = None  # the step event's bytes around its numbers (the direct writers' templates)
        self.int_templates: dict[tuple[int, ...], Any] = {}  # the same, per set of positions holding ints
        indices = [i for i, _ in histograms]
        # the row of a step's histogram values in one C call (itemgetter of one index is no tuple)
        self.histogram_values = (
            operator.itemgetter(*indices) if len(indices) > 1 else (lambda floats: (floats[indices[0]],)) if indices else None
        )

    @classmethod
    def build(cls, pipeline: Pipeline, values: Mapping[Any, Any]) -> Any:
        """The plan; None when these keys always go per key; ``_UNPLANNED`` to try again later."""
        keys = list(values)
        slots: list[list[Any]] = []
        series, scaled, headline, histograms = [], [], [], []
        for index, key in enumerate(keys):
            if type(key) is not str:
                return None
            plan = pipeline._plans.get(key)
            if plan is None or plan.counter_overflow:
                return None
            if plan.transform is not None:
                factor = getattr(plan.transform, "factor", None)
                if factor is None:
                    return None
                scaled.append((index, factor))
            # A series with no value yet (the first one was NaN, or a stage span measured it) or
            # refused by the series cap: no plan now; the per-key path stores or counts it.
            if plan.histogram:
                state = pipeline._histograms.series_state(plan.metric, plan.attrs)
                if state is None:
                    return _UNPLANNED
                histograms.append((index, state))
                slots.append([0.0])  # the converted value, recorded from here
            else:
                slot = pipeline._latest.series(plan.metric).get(plan.attrs)
                if slot is None:
                    return _UNPLANNED
                slots.append(slot)
            series.append((plan.metric, plan.attrs))
            label = HEADLINE_LABELS.get(plan.metric)
            if label is not None:
                headline.append((index, label(plan.attrs)))
        factors = dict(scaled)
        rows = (
            pipeline._histograms.rows([state for _, state in histograms], [factors.get(i, 1.0) for i, _ in histograms])
            if histograms
            else None
        )
        return cls(keys, slots, series, scaled, headline, histograms, rows)


class Pipeline:
    """Drains the hot path's queue on a daemon thread; ``flush`` drains it on the caller's thread."""

    # What happens to strings in an event body before export (see values.TextPolicy); Telemetry sets it
    # from its config.
    text_policy: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Where float-only step events go past the SDK's log pipeline (the run folder and the OTLP spool,
    # when every destination of events has a direct writer); Telemetry sets it. Written after each
    # drain of the queue.
    step_events: DirectStepWriter | None = None
    # Exports the events that went through the SDK (Telemetry sets it), so that a direct line never
    # lands ahead of an event emitted before it.
    flush_sdk_events: Callable[[], Any] | None = None
    _sdk_events = False  # an event went through the SDK since the last direct line
    # The run folder's spans and events the SDK queued (file_exports.QueuedExport): written after each drain.
    file_exports: Sequence[Any] = ()
    # False when nothing takes events (exporters="none", no tracker): none is built.
    events_exported = True

    def __init__(
        self,
        *,
        resolver: KeyResolver,
        framework: str | None,
        latest: LatestValues,
        histograms: BulkHistograms,
        event_logger: Logger,
        on_step_end: Callable[[int, float, dict[str, float]], None] | None = None,
        poll_interval_s: float = 0.5,
        gather_s: float = 0.02,
    ) -> None:
        self.queue: deque[tuple] = deque()
        self._resolver = resolver
        self._framework = framework
        self._latest = latest
        self._histograms = histograms
        self._event_logger = event_logger
        self._on_step_end = on_step_end
        self._plans: dict[str, Plan] = {}
        self._step_plans: dict[tuple[Any, ...], StepPlan | None] = {}  # None: that key set goes per key
        self._plan_tries: dict[tuple[Any, ...], int] = {}
        self._reported: set[tuple[str, str]] = set()
        self._span_measured: dict[int | None, set[tuple[str, Attrs]]] = {}
        self._headline: dict[int | None, dict[str, float]] = {}
        self.goodput = StepGoodput(histograms, latest)  # each step's productive / overhead / idle seconds
        self._drain_lock = threading.Lock()
        self.wake = threading.Event()
        self._stopping = False
        self._poll = poll_interval_s
        self._gather = gather_s
        self.processed = 0
        # log() (a step's event: logs) and record() (metric points) calls the caller dropped with the
        # queue full; the worker publishes the counts.
        self.dropped_queued = {_SIGNALS.LOGS.value: 0, _SIGNALS.METRICS.value: 0}
        self._dropped_published = dict(self.dropped_queued)
        # Called with (step, time_ns, [(metric, attrs, value), ...], span_context) after each log()'s
        # values are resolved: the online alert detectors, on this worker thread.
        self.observer: Callable[[int | None, int, list[tuple[str, Attrs, float]], Any], Any] | None = None
        self.stamped: StampedPoints | None = None  # metrics_at_log_time: log() values as stamped points
        self._thread = threading.Thread(target=self._run, name="otel-rl-pipeline", daemon=True)
        self._thread.start()

    # -- queue side ---------------------------------------------------------------------------
    def submit(self, item: tuple) -> None:
        self.queue.append(item)
        self.wake_soon()

    def wake_soon(self) -> None:
        """Wake the worker (an item was queued, or a span or an event for the run folder)."""
        if not self.wake.is_set():
            self.wake.set()

    def _run(self) -> None:
        while not self._stopping:
            if self.wake.wait(self._poll) and self._gather and not self._stopping:
                # Let the next steps gather: one wake-up and one GIL hand-off per batch instead of
                # one per log() call (the wake stays set meanwhile, so callers skip Event.set()).
                # What a killed process loses grows by at most this (file_flush_interval_s). A timed
                # wait costs tens of microseconds of CPU on a virtual machine: fewer is cheaper.
                time.sleep(self._gather)
            self.wake.clear()
            self.drain()

    def drop_queued(self, signal: str) -> None:
        """On the caller's thread: one log() (signal "logs") or record() ("metrics") call dropped
        because the queue is full (counted, said once)."""
        self.dropped_queued[signal] += 1
        if self.dropped_queued[signal] == 1:
            self.wake.set()

    def _publish_dropped(self) -> None:
        for signal, dropped in self.dropped_queued.items():
            published = self._dropped_published[signal]
            if dropped == published:
                continue
            # attribute pairs in key order, as every other series of the metric
            self._latest.add(M.RL_TELEMETRY_DROPPED, (_QUEUE_FULL, (A.RL_TELEMETRY_SIGNAL, signal)), dropped - published)
            self._dropped_published[signal] = dropped
            self.report_once(
                "<queue>",
                "queue_full",
                "otel-rl: the telemetry worker fell max_queue items behind the training "
                "loop; log() / record() calls past that are dropped (never blocking training) and counted in "
                "rl.telemetry.dropped{rl.telemetry.drop_reason=queue_full}. Log less often, or raise "
                "max_queue / OTEL_RL_MAX_QUEUE (reported once)",
            )

    def drain(self) -> None:
        with self._drain_lock:
            if self.dropped_queued != self._dropped_published:
                self._publish_dropped()
            queue = self.queue
            while queue:
                item = queue.popleft()
                try:
                    self._process(item)
                except Exception as exc:  # a bug here must never stop telemetry or reach training
                    self.report_once(
                        "pipeline", type(exc).__name__, f"otel-rl: dropped one telemetry item after an internal error: {exc!r}"
                    )
                self.processed += 1
            if self.step_events is not None:
                self.write_step_events()
            for queued in self.file_exports:
                queued.write()

    def write_step_events(self) -> None:
        """Write the directly written step events of this drain, after the SDK's events emitted
        before them (the run folder's lines stay in the order the events were emitted)."""
        assert self.step_events is not None
        if not self.step_events.pending:
            return
        if self._sdk_events and self.flush_sdk_events is not None:
            self._sdk_events = False
            self.flush_sdk_events()
        self.step_events.write()

    def stop(self, timeout_s: float) -> None:
        self._stopping = True
        self.wake.set()
        self._thread.join(timeout_s)
        self.drain()

    # -- reporting ----------------------------------------------------------------------------
    def report_once(self, key: str, reason: str, message: str) -> None:
        if (key, reason) not in self._reported:
            self._reported.add((key, reason))
            logger.warning(message)

    def reject(self, key: str, reason: str, detail: str = "") -> None:
        self._latest.add(M.RL_TELEMETRY_REJECTED, ((A.RL_TELEMETRY_REASON, reason),), 1)
        what = f" ({detail})" if detail else ""
        self.report_once(
            key,
            reason,
            f"otel-rl: value of {key!r} is {reason}{what}; it stays in the step's event but is not exported as a metric (reported once per key)",
        )

    # -- processing ---------------------------------------------------------------------------
    def plan(self, key: str) -> Plan:
        plan = self._plans.get(key)
        if plan is None:
            res = self._resolver.resolve(key, self._framework)
            mdef = METRICS.get(res.metric)
            plan = Plan(
                res.metric,
                tuple(res.attributes),
                res.transform,
                histogram=mdef is not None and mdef.instrument == "histogram",
                counter_overflow=res.counted_only,
            )
            self._plans[key] = plan
        return plan

    def _process(self, item: tuple) -> None:
        kind = item[0]
        if kind == LOG:
            self._process_log(*item[1:])
        elif kind == RECORD:
            self._process_record(*item[1:])
        elif kind == STAGE:
            self._process_stage(*item[1:])
        elif kind == STEP_END:
            self._process_step_end(*item[1:])
        elif kind == ADD:
            _, metric, attrs, amount = item
            self._latest.add(metric, attrs, amount)
        elif kind == CALL:
            item[1]()

    def apply_value(self, key: str, raw: Any, step: int | None) -> tuple[str, Attrs, float] | None:
        """Resolve, coerce and store one value; raises Rejected (used directly in strict mode).
        Returns the resolved ``(metric, attributes, value)``."""
        plan = self.plan(key)
        if plan.counter_overflow:
            self._latest.add(plan.metric, plan.attrs, 1)
            self.report_once(
                key, "overflow", f"otel-rl: {key!r} is not mapped and the unmapped-key limit is reached; counted in rl.telemetry.rejected"
            )
            return
        value = resolved_number(plan.transform, raw)
        # With metrics_at_log_time, _process_log keeps the value as a point at the log's time instead.
        if plan.histogram:
            measured = self._span_measured.get(step)
            if measured is not None and (plan.metric, plan.attrs) in measured:
                return  # a stage span of this step already measured this series
            if self.stamped is None:
                self._histograms.record(plan.metric, value, plan.attrs)
        elif self.stamped is None:
            self._latest.set(plan.metric, plan.attrs, value)
        if plan.metric in HEADLINE_LABELS:
            self._headline.setdefault(step, {})[HEADLINE_LABELS[plan.metric](plan.attrs)] = value
        return plan.metric, plan.attrs, value

    def _process_log(self, step: int | None, time_ns: int, span_context: Any, values: Mapping[Any, Any]) -> None:
        if type(time_ns) is not int:  # log(time_ns=...) is checked here, off the caller's thread
            time_ns = self._event_time(time_ns)
        if self.stamped is not None:  # metrics_at_log_time keeps every value as a point: per key
            return self._process_log_slow(step, time_ns, span_context, values)
        keys = tuple(values)
        plans = self._step_plans
        plan = plans.get(keys, _UNPLANNED)
        if plan is not None and plan is not _UNPLANNED and self._process_log_fast(plan, step, time_ns, span_context, values):
            return
        self._process_log_slow(step, time_ns, span_context, values)
        if plan is _UNPLANNED:  # built once per key set (a run logs a few: train steps, validation steps)
            built = StepPlan.build(self, values)
            if built is _UNPLANNED:  # a series has no value yet: try again after the next steps, a few times
                if len(self._plan_tries) >= 8 * _STEP_PLANS:  # key sets that change every step: forget them
                    self._plan_tries.clear()
                tries = self._plan_tries[keys] = self._plan_tries.get(keys, 0) + 1
                if tries < _PLAN_TRIES:
                    return
                built = None
            if len(plans) >= _STEP_PLANS:
                plans.pop(next(iter(plans)))
            plans[keys] = built
            self._plan_tries.pop(keys, None)

    def _process_log_fast(self, plan: StepPlan, step: int | None, time_ns: int, span_context: Any, values: Mapping[Any, Any]) -> bool:
        """A key set with a plan, every value a finite float or an int64: store the step's values
        in bulk and emit its event. False (nothing done) for anything else: the per-key path decides."""
        raw = list(values.values())
        read = step_numbers(raw)
        if read is None:
            return False
        floats, numbers, ints = read
        total = sum(floats)
        if total - total != 0.0:  # a NaN or an infinity (or a sum past the float range): per key
            return False
        # The slots take the step's values (converted) when next read: a metric reader never sees a raw value.
        self._latest.defer(plan.row, floats)
        skipped: set[int] = set()
        if plan.histograms:
            assert plan.histogram_values is not None  # set whenever there are histograms
            row = plan.histogram_values(floats)  # as logged: the rows convert them when binned
            measured = self._span_measured.get(step)
            if measured:  # a stage span of this step already measured these series: NaN leaves them out
                skipped = {i for i, _ in plan.histograms if plan.series[i] in measured}
                row = [math.nan if i in skipped else value for (i, _), value in zip(plan.histograms, row)]
            plan.histogram_rows.add(row)
        if plan.headline and self._on_step_end is not None:  # only the console summary reads it
            head = self._headline.setdefault(step, {})
            for index, label, factor in plan.headline:
                head[label] = floats[index] * factor
        writer = self.step_events
        if writer is not None and (step is None or type(step) is int) and plan.keys:
            template = plan.template if not ints else plan.int_templates.get(ints)
            if template is None:
                template = writer.template(plan.keys, ints)
                if ints:
                    if len(plan.int_templates) >= _STEP_PLANS:  # values that flip between int and float: keep a few
                        plan.int_templates.clear()
                    plan.int_templates[ints] = template
                else:
                    plan.template = template
            writer.add(template, numbers, step, time_ns, span_context)
        elif ints:
            body = dict(values if numbers is raw else zip(plan.keys, numbers))
            self.emit_event(N.RL_LOG_EVENT, body, {A.RL_STEP: step} if step is not None else {}, time_ns, span_context, plain=True)
        else:  # the body is checked here, so the file encoder need not check it again
            body = FloatBody(values if floats is raw else zip(plan.keys, floats), plan.keys, floats)
            self.emit_event(N.RL_LOG_EVENT, body, {A.RL_STEP: step} if step is not None else {}, time_ns, span_context, plain=True)
        observer = self.observer
        if observer is not None:
            converted = plan.row.converted(floats)
            resolved = [
                (metric, attrs, value) for i, ((metric, attrs), value) in enumerate(zip(plan.series, converted)) if i not in skipped
            ]
            try:
                observer(step, time_ns, resolved, span_context)
            except Exception as exc:  # detectors must never stop telemetry
                self.report_once("<alerts>", type(exc).__name__, f"otel-rl: the alert detectors failed on step {step}: {exc!r}")
        return True

    def _process_log_slow(self, step: int | None, time_ns: int, span_context: Any, values: Mapping[Any, Any]) -> None:
        observer, stamped = self.observer, self.stamped
        resolved: list[tuple[str, Attrs, float]] | None = [] if observer is not None or stamped is not None else None
        body: dict[str, Any] = {}
        stack: list[tuple[str, Any]] = list(values.items())[::-1]
        while stack:
            key, raw = stack.pop()
            if type(key) is not str:
                text = key_text(key)
                body[text] = event_value(raw)
                self.reject(text, _REASONS.BAD_KEY.value, f"a {type(key).__name__} key")
                continue
            if isinstance(raw, Mapping):  # nested dicts flatten into framework-style "a/b" keys
                try:
                    if key.count("/") > MAX_NESTING:
                        raise Rejected(
                            _REASONS.BAD_KEY.value, f"nested more than {MAX_NESTING} levels deep (or a mapping that contains itself)"
                        )
                    stack.extend((f"{key}/{k}" if isinstance(k, str) else key + "/" + repr(k), v) for k, v in reversed(list(raw.items())))
                except Rejected as rej:
                    body[key] = "<nested too deep>"
                    self.reject(key, rej.reason, rej.detail)
                except Exception as exc:  # a mapping whose items() raises
                    body[key] = event_value(raw)
                    self.reject(key, _REASONS.NON_NUMERIC.value, f"its items could not be read: {type(exc).__name__}")
                continue
            body[key] = event_value(raw)
            try:
                got = self.apply_value(key, raw, step)
                if resolved is not None and got is not None:
                    resolved.append(got)
            except Rejected as rej:
                self.reject(key, rej.reason, rej.detail)
            except Exception as exc:  # a transform or a foreign type failed: this value only
                self.reject(key, _REASONS.NON_NUMERIC.value, f"{type(exc).__name__} while reading it")
        if self.step_events is not None:  # the direct lines of earlier steps go first
            self.write_step_events()
        self.emit_event(N.RL_LOG_EVENT, body, {A.RL_STEP: step} if step is not None else {}, time_ns, span_context)
        if resolved and stamped is not None:
            stamped.add(time_ns, resolved)
        if resolved and observer is not None:
            try:
                observer(step, time_ns, resolved, span_context)  # type: ignore[misc]
            except Exception as exc:  # detectors must never stop telemetry
                self.report_once("<alerts>", type(exc).__name__, f"otel-rl: the alert detectors failed on step {step}: {exc!r}")

    def _event_time(self, raw: Any) -> int:
        try:
            value = int(raw)
            if value > 0:
                return value
        except (TypeError, ValueError, OverflowError):
            pass
        self.report_once(
            "<log>",
            "time_ns",
            f"otel-rl: log(time_ns={raw!r}) is not a positive integer of Unix-epoch nanoseconds; the current time is used",
        )
        return now_ns()

    def emit_event(
        self,
        name: str,
        body: dict[str, Any],
        attributes: dict[str, Any],
        time_ns: int | None = None,
        span_context: Any = None,
        plain: bool = False,
    ) -> None:
        """One otel-rl event as a log record, linked to a step's trace when given its span context.
        ``plain``: the body holds numbers only (no text to withhold)."""
        if not self.events_exported:
            return
        self._sdk_events = True
        if self.text_policy is not None and not plain:
            body = self.text_policy(body)
        time_ns = time_ns or now_ns()
        ctx = trace.set_span_in_context(trace.NonRecordingSpan(span_context)) if span_context is not None else Context()
        self._event_logger.emit(
            timestamp=time_ns,
            observed_timestamp=time_ns,
            context=ctx,
            severity_number=SeverityNumber.INFO,
            body=body,
            attributes=attributes,
            event_name=name,
        )

    def _process_record(self, metric: str, raw: Any, attrs: Attrs, step: int | None) -> None:
        mdef = METRICS.get(metric)
        if mdef is None:
            self.reject(metric, _REASONS.BAD_KEY.value, "not a registry metric name")
            return
        if mdef.instrument != "histogram":
            try:
                value = to_number(raw)
            except Rejected as rej:
                self.reject(metric, rej.reason, rej.detail)
                return
            if mdef.instrument == "counter":
                self._latest.add(metric, attrs, value)
            else:
                self._latest.set(metric, attrs, value)
            return
        try:
            values = to_array(raw)
        except (TypeError, ValueError) as exc:
            self.reject(metric, _REASONS.NON_NUMERIC.value, str(exc))
            return
        finite = np.isfinite(values)
        if not finite.all():
            nan_count = int(np.isnan(values).sum())
            if nan_count:
                self.reject(metric, _REASONS.NAN.value, f"{nan_count} NaN value(s) skipped")
            if int((~finite).sum()) > nan_count:
                self.reject(metric, _REASONS.INF.value, "infinite value(s) skipped")
            values = values[finite]
        self._histograms.record_many(metric, values, attrs)

    def _process_stage(
        self,
        step: int | None,
        durations: list[tuple[Attrs, float]],
        gauges: list[tuple[str, Attrs, float]],
        interval: StageInterval | None = None,
    ) -> None:
        if interval is not None:
            self.goodput.add_stage(interval)
        measured = self._span_measured.setdefault(step, set())
        for attrs, seconds in durations:
            self._histograms.record(M.RL_STAGE_DURATION, seconds, attrs)
            measured.add((M.RL_STAGE_DURATION, attrs))
        for metric, attrs, value in gauges:
            self._latest.set(metric, attrs, value)

    def _process_step_end(self, step: int, seconds: float, start: float | None = None) -> None:
        self._histograms.record(M.RL_STEP_DURATION, seconds, ())
        if start is not None:
            self.goodput.step_end(start, seconds)
        self._span_measured.setdefault(step, set()).add((M.RL_STEP_DURATION, ()))
        headline = self._headline.pop(step, {})
        if self._on_step_end is not None:
            self._on_step_end(step, seconds, headline)
        # Keep the de-duplication memory of the few latest steps only (logs may trail a step).
        while len(self._span_measured) > 8:
            self._span_measured.pop(next(iter(self._span_measured)))
        while len(self._headline) > 8:
            self._headline.pop(next(iter(self._headline)))


def now_ns() -> int:
    return time.time_ns()
