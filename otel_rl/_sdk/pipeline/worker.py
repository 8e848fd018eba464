"""The off-thread half of the hot path.

``Telemetry.log`` copies the caller's dict (one C-level copy) and appends it to a deque; this
worker resolves keys, coerces values, updates the latest-value table and the histograms, and
emits the step's ``rl.log`` event. A step of a key set the worker has planned (``step_plan``),
every value a float, is packed by ``log()`` instead (``LOG_PACKED``): a pass of C code over
objects the caller's thread just made costs it less than the worker's reading them later, and the
worker then reads one buffer. Nothing here can raise into the training loop: problems are
counted in ``rl.telemetry.rejected`` and reported once per key.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from opentelemetry import trace
from opentelemetry._logs import Logger, SeverityNumber
from opentelemetry.context import Context

from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl._sdk.otlp.attribute_warnings import held_warnings, say_once
from otel_rl._sdk.pipeline.aggregation import Attrs, BulkHistograms, LatestValues, StampedPoints
from otel_rl._sdk.pipeline.backlog import ADD, CALL, LOG, LOG_PACKED, RECORD, STAGE, STEP_END, OutOfTime, QueueDrops, Unwritten
from otel_rl._sdk.pipeline.goodput import StageInterval, StepGoodput
from otel_rl._sdk.pipeline.step_plan import PLAN_TRIES, STEP_PLANS, UNPLANNED, KeyPlans, KeySets, Plan, StepPlan, surely_finite
from otel_rl._sdk.pipeline.summary import HEADLINE_LABELS
from otel_rl._sdk.pipeline.utf8 import bad_text_message, clean_mapping, clean_pairs, clean_text, encodes

# Rejected and to_number are imported from here too (the analyzers coerce values as the worker does).
from otel_rl._sdk.pipeline.values import MAX_NESTING, Rejected, event_value, key_text, resolved_number, step_numbers, to_array, to_number
from otel_rl.exporters.otlp_json import FloatBody
from otel_rl.exporters.step_events import DirectStepWriter
from otel_rl.reporting import ReportOnce, Tally
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

logger = logging.getLogger("otel_rl")

__all__ = ["ADD", "CALL", "LOG", "LOG_PACKED", "RECORD", "STAGE", "STEP_END", "Pipeline", "Rejected", "now_ns", "to_number"]
_REASONS = A.RlTelemetryReasonValues
_UNMAPPED_OVERFLOW = ((A.RL_TELEMETRY_REASON, _REASONS.UNMAPPED_OVERFLOW.value),)
_NOT_UTF8 = ((A.RL_TELEMETRY_REASON, _REASONS.NOT_UTF8.value),)
REPORTED_KEYS = 1000  # distinct (key, problem) pairs named one by one; past them, one summary line a minute
_DEADLINE_CHECK = 255  # a long log() checks the shutdown deadline once per this many keys (plus one)
_STEADY_GATHERS = 3  # a drain with items within this many gathers of the last one: steps keep coming


class Pipeline:
    """Drains the hot path's queue on a daemon thread; ``flush`` drains it on the caller's thread."""

    # What happens to strings in an event body before export (values.TextPolicy); set from the config.
    text_policy: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Where float-only step events go past the SDK's log pipeline (the run folder and the OTLP spool,
    # when every destination of events has a direct writer), written after each drain; from Telemetry.
    step_events: DirectStepWriter | None = None
    # Exports the events that went through the SDK, so no direct line lands ahead of one; from Telemetry.
    flush_sdk_events: Callable[[], Any] | None = None
    _sdk_events = False  # an event went through the SDK since the last direct line
    # Written after each drain, in order: the spans the scopes ended (light_spans.LightTracer builds them
    # for every span processor), then the run folder's spans and events the SDK queued (file_exports.QueuedExport).
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
        poll_interval_s: float = 5.0,
        gather_s: float = 0.02,
    ) -> None:
        self.queue: deque[tuple] = deque()
        self._resolver = resolver
        self._framework = framework
        self._latest = latest
        self._histograms = histograms
        self._event_logger = event_logger
        self._on_step_end = on_step_end
        # How each key's values are applied, bounded in keys (step_plan.KeyPlans).
        key_plans = KeyPlans(resolver, framework)
        self.plan: Callable[[str], Plan] = key_plans.plan
        self._plans = key_plans.by_key
        # None: that key set goes per key. Read by log() on the caller's thread too: a step of a
        # planned key set is packed there. Both bounded in key sets and in keys (step_plan.KeySets).
        self.step_plans: KeySets[StepPlan | None] = KeySets()
        self._plan_tries: KeySets[int] = KeySets(limit=8 * STEP_PLANS)
        self._reported = ReportOnce(logger, limit=REPORTED_KEYS)
        self.unmapped_overflow = Tally(
            f"otel-rl: {{count}} more values of unmapped keys were not exported in the last {{seconds}} s "
            f"(past unmapped_key_limit={resolver.unmapped_key_limit:,} distinct unmapped keys; counted in "
            f"rl.telemetry.rejected{{{{rl.telemetry.reason=unmapped_overflow}}}})",
            logger,
        )
        # shutdown(): past this time.monotonic() what is still queued is dropped and counted here
        self.deadline: float | None = None
        self.unwritten = Unwritten()
        self._span_measured: dict[int | None, set[tuple[str, Attrs]]] = {}
        self._headline: dict[int | None, dict[str, float]] = {}
        self.goodput = StepGoodput(histograms, latest)  # each step's productive / overhead / idle seconds
        self._drain_lock = threading.Lock()
        self.wake = threading.Event()
        self.idle = True  # the worker waits for wake_soon(); False while it drains every gather_s
        self._stopping = False
        self._poll = poll_interval_s
        self._gather = gather_s
        self._last_worked = 0.0  # time.monotonic() of the last drain that had something
        self.processed = 0
        # log() (a step's event: logs) and record() (metric points) calls the caller dropped with the
        # queue full; the worker publishes the counts.
        self.queue_drops = QueueDrops()
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
        """Wake an idle worker (an item, a span or an event was queued); a busy one drains on its own."""
        if self.idle:
            self.idle = False
            self.wake.set()

    def _run(self) -> None:
        # Busy (items in two drains running): a sleep and a drain per gather_s; callers wake nothing.
        # Idle: wait for a caller's wake_soon() (the 5 s poll is a safety net), gather, drain, and go
        # idle at once. A wake-up costs the process ~100 us of CPU on a VM (per thread, 2-core VM), so
        # there are as few as the bound allows: a second gather to find nothing was one more a step.
        while not self._stopping:
            idle = self.idle
            if idle:
                self.wake.wait(self._poll)
            else:
                time.sleep(self._gather)  # nothing wakes a busy worker: ~60 us less CPU than a timed wait
            self.wake.clear()
            if idle and not self.idle:
                continue  # woken by a caller: let the step's items gather first
            worked, now = self.drain(), time.monotonic()
            steady = worked and now - self._last_worked <= _STEADY_GATHERS * self._gather
            if worked:
                self._last_worked = now
            if not steady and not self._stopping:
                self.idle = True  # set before the last look: a caller that queues after it wakes us
                if self.queue or any(queued.pending for queued in self.file_exports):
                    self.idle = False

    def drop_queued(self, signal: str) -> None:
        """On the caller's thread: a log() ("logs") or record() ("metrics") call dropped, the queue full (counted, said once)."""
        counts = self.queue_drops.counts
        counts[signal] += 1
        if counts[signal] == 1:
            self.wake.set()

    def drain(self) -> bool:
        """Process what is queued and write what the run folder (or the spool) is owed; whether
        there was anything. Past :attr:`deadline`, what is left is dropped and counted instead."""
        with self._drain_lock:
            return self._drain_locked()

    def _drain_locked(self) -> bool:
        if self.queue_drops.pending:
            self.queue_drops.publish(self._latest, self.report_once)
        queue = self.queue
        worked = bool(queue)
        while queue:
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.drop_backlog()
                break
            item = queue.popleft()
            try:
                self._process(item)
            except OutOfTime:  # shutdown's deadline passed inside a long item
                self.unwritten.count(item)
            except Exception as exc:  # a bug here must never stop telemetry or reach training
                self.report_once("pipeline", type(exc).__name__, f"otel-rl: dropped one telemetry item after an internal error: {exc!r}")
            self.processed += 1
        if self.step_events is not None:
            worked = self.write_step_events() or worked
        for queued in self.file_exports:
            worked = queued.write() or worked
        return worked

    def drop_backlog(self) -> None:
        """Drop what is queued, counted in :attr:`unwritten` (shutdown's deadline has passed)."""
        queue = self.queue
        while True:
            try:
                item = queue.popleft()
            except IndexError:  # empty (a drain on another thread may take the last one)
                return
            self.unwritten.count(item)

    def write_step_events(self) -> bool:
        """Write the directly written step events of this drain, after the SDK's events emitted
        before them (the run folder's lines stay in the order the events were emitted); whether
        there were any."""
        assert self.step_events is not None
        if not self.step_events.pending:
            return False
        if self._sdk_events and self.flush_sdk_events is not None:
            self._sdk_events = False
            self.flush_sdk_events()
        self.step_events.write()
        return True

    def stop(self, timeout_s: float, grace_s: float = 0.0) -> Unwritten:
        """Stop the worker and process what is left within ``timeout_s``; what was not processed by
        then is dropped, counted in rl.telemetry.dropped (drop_reason shutdown_timeout) and returned.
        ``grace_s`` more is given to a worker still inside one item to finish it and write what it
        processed, once the rest is dropped."""
        self.deadline = time.monotonic() + timeout_s
        self._stopping = True
        self.wake.set()
        self._thread.join(timeout_s)
        lock = self._drain_lock
        # A worker still busy (a slow on_alert hook, a large new key set's event) keeps the lock: drop
        # the rest without it, then give its item the grace to end, so that what it processed is
        # written before the files close instead of being lost uncounted.
        acquired = lock.acquire(timeout=max(0.0, self.deadline - time.monotonic()) + 0.05)
        if not acquired:
            self.drop_backlog()
            acquired = lock.acquire(timeout=grace_s)
        if acquired:
            try:
                self._drain_locked()
            finally:
                lock.release()
        self.unwritten.publish(self._latest)
        self._reported.flush()
        self.unmapped_overflow.flush()
        return self.unwritten

    # -- reporting ----------------------------------------------------------------------------
    def report_once(self, key: str, reason: str, message: str) -> None:
        """Log ``message`` the first time ``(key, reason)`` comes; past REPORTED_KEYS of them, one summary a minute."""
        self._reported((key, reason), "%s", message)

    def reject(self, key: str, reason: str, detail: str = "") -> None:
        self._latest.add(M.RL_TELEMETRY_REJECTED, ((A.RL_TELEMETRY_REASON, reason),), 1)
        what = f" ({detail})" if detail else ""
        self.report_once(
            key,
            reason,
            f"otel-rl: value of {key!r} is {reason}{what}; it stays in the step's event but is not exported as a metric (reported once per key)",
        )

    def bad_text(self, where: str, text: str) -> None:
        """A text UTF-8 cannot encode (``text``: already escaped), written escaped: said once, counted."""
        self._latest.add(M.RL_TELEMETRY_REJECTED, _NOT_UTF8, 1)
        self.report_once(text, _REASONS.NOT_UTF8.value, bad_text_message(where, text))

    # -- processing ---------------------------------------------------------------------------
    def _process(self, item: tuple) -> None:
        kind = item[0]
        if kind == LOG_PACKED:
            self._process_log_packed(*item[1:])
        elif kind == LOG:
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
            if plan.attrs == _UNMAPPED_OVERFLOW:  # the resolver named the first such key; the rest are tallied
                self.unmapped_overflow.add()
            else:
                self.report_once(key, "bad_key", f"otel-rl: the key {key!r} names no metric; counted in rl.telemetry.rejected")
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
        plans = self.step_plans
        plan = plans.get(keys, UNPLANNED)
        if plan is not None and plan is not UNPLANNED and self._process_log_fast(plan, step, time_ns, span_context, values):
            return
        self._process_log_slow(step, time_ns, span_context, values)
        if plan is UNPLANNED:  # built once per key set (a run logs a few: train steps, validation steps)
            built = StepPlan.build(self._plans, self._latest, self._histograms, values)
            if built is UNPLANNED:  # a series has no value yet: try again after the next steps, a few times
                tries = self._plan_tries.get(keys, 0) + 1
                if tries < PLAN_TRIES:
                    self._plan_tries.keep(keys, tries)  # key sets that change every step are forgotten
                    return
                built = None
            plans.keep(keys, built)
            self._plan_tries.pop(keys, None)

    def _process_log_fast(self, plan: StepPlan, step: int | None, time_ns: int, span_context: Any, values: Mapping[Any, Any]) -> bool:
        """A key set with a plan, every value a finite float or an int64: store the step's values
        in bulk and emit its event. False (nothing done) for anything else: the per-key path decides."""
        raw = list(values.values())
        read = step_numbers(raw)
        if read is None or read[2]:  # other types, or ints: log() need not try to pack these keys' steps
            plan.packable = False
        if read is None:
            return False
        floats, numbers, ints = read
        total = sum(floats)
        if total - total != 0.0:  # a NaN or an infinity (or a sum past the float range): per key
            return False
        # the mapping itself where its values are the numbers as they are (no conversion)
        self._apply_step(plan, step, time_ns, span_context, None, floats, numbers, ints, values if numbers is raw else None)
        return True

    def _process_log_packed(self, step: int | None, time_ns: int, span_context: Any, plan: StepPlan, packed: bytes) -> None:
        """A step that ``log()`` found to be of a planned key set, every value a float, and packed
        (``plan.packer``) on the caller's thread."""
        if type(time_ns) is not int:
            time_ns = self._event_time(time_ns)
        if not surely_finite(packed):  # a NaN or an infinity (or a value past ~5e303): per key, named
            self._process_log_slow(step, time_ns, span_context, dict(zip(plan.keys, plan.packer.unpack(packed))))
            return
        self._apply_step(plan, step, time_ns, span_context, packed)

    def _apply_step(
        self,
        plan: StepPlan,
        step: int | None,
        time_ns: int,
        span_context: Any,
        packed: bytes | None,
        floats: list[float] | None = None,
        numbers: list[Any] | None = None,
        ints: tuple[int, ...] = (),
        source: Mapping[Any, Any] | None = None,
    ) -> None:
        """The bulk path's work on one step: ``packed`` (float-only: the doubles in key order, read back
        only where needed), or ``floats`` (what metrics take), ``numbers`` (what the event carries, ints
        at the positions ``ints``) and the logged mapping when its values are those numbers (``source``)."""
        writer = self.step_events
        direct = writer is not None and (step is None or type(step) is int) and bool(plan.keys)
        observer = self.observer
        event = not direct and self.events_exported  # through the SDK's log pipeline, when anything takes events
        if packed is not None and (event or observer is not None or (plan.headline and self._on_step_end is not None)):
            floats = numbers = list(plan.packer.unpack(packed))
        given: Sequence[float] | bytes | None = packed if floats is None else floats
        assert given is not None  # the packed doubles or the floats: one of the two
        # The slots take the step's values (converted) when next read: a metric reader never sees a raw value.
        self._latest.defer(plan.row, given)
        skipped: set[int] = set()
        if plan.histograms:
            assert plan.histogram_values is not None  # set whenever there are histograms
            # as logged: the rows convert them when binned
            row = plan.histogram_picker.unpack_from(given) if isinstance(given, bytes) else plan.histogram_values(given)
            measured = self._span_measured.get(step)
            if measured:  # a stage span of this step already measured these series: NaN leaves them out
                skipped = {i for i, _ in plan.histograms if plan.series[i] in measured}
                row = [math.nan if i in skipped else value for (i, _), value in zip(plan.histograms, row)]
            plan.histogram_rows.add(row)
        if plan.headline and self._on_step_end is not None:  # only the console summary reads it
            assert floats is not None
            head = self._headline.setdefault(step, {})
            for index, label, factor in plan.headline:
                head[label] = floats[index] * factor
        if direct:
            assert writer is not None
            template = plan.template if not ints else plan.int_templates.get(ints)
            if template is None:
                template = writer.template(plan.keys, ints)
                if ints:
                    if len(plan.int_templates) >= STEP_PLANS:  # values that flip between int and float: keep a few
                        plan.int_templates.clear()
                    plan.int_templates[ints] = template
                else:
                    plan.template = template
            event_values = numbers if packed is None else packed
            assert event_values is not None
            writer.add(template, event_values, step, time_ns, span_context)
        elif event:
            assert floats is not None and numbers is not None
            pairs = source if source is not None else zip(plan.keys, numbers)
            # the body is checked here, so the file encoder need not check it again
            body = dict(pairs) if ints else FloatBody(pairs, plan.keys, floats)
            self.emit_event(N.RL_LOG_EVENT, body, {A.RL_STEP: step} if step is not None else {}, time_ns, span_context, plain=True)
        if observer is not None:
            assert floats is not None
            converted = plan.row.converted(floats)
            resolved = [
                (metric, attrs, value) for i, ((metric, attrs), value) in enumerate(zip(plan.series, converted)) if i not in skipped
            ]
            try:
                observer(step, time_ns, resolved, span_context)
            except Exception as exc:  # detectors must never stop telemetry
                self.report_once("<alerts>", type(exc).__name__, f"otel-rl: the alert detectors failed on step {step}: {exc!r}")

    def _process_log_slow(self, step: int | None, time_ns: int, span_context: Any, values: Mapping[Any, Any]) -> None:
        observer, stamped = self.observer, self.stamped
        resolved: list[tuple[str, Attrs, float]] | None = [] if observer is not None or stamped is not None else None
        body: dict[str, Any] = {}
        stack: list[tuple[str, Any]] = list(values.items())[::-1]
        seen = 0
        while stack:
            key, raw = stack.pop()
            seen += 1
            if not seen & _DEADLINE_CHECK and self.deadline is not None and time.monotonic() > self.deadline:
                raise OutOfTime
            if type(key) is not str:
                text = key_text(key)
                body[text] = event_value(raw)
                self.reject(text, _REASONS.BAD_KEY.value, f"a {type(key).__name__} key")
                continue
            if not key.isascii() and not encodes(key):  # a file name read with surrogateescape: its value still counts
                key = clean_text(key, "the key", self.bad_text)
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
        if not plain:
            body = clean_mapping(body, f"the {name} event's", self.bad_text) or body
            if self.text_policy is not None:
                body = self.text_policy(body)
        if attributes:
            attributes = clean_mapping(attributes, f"the {name} event's attribute", self.bad_text) or attributes
        time_ns = time_ns or now_ns()
        ctx = trace.set_span_in_context(trace.NonRecordingSpan(span_context)) if span_context is not None else Context()
        with held_warnings() as held:  # the SDK's cleaning of the attributes: said once per key, not per event
            self._event_logger.emit(
                timestamp=time_ns,
                observed_timestamp=time_ns,
                context=ctx,
                severity_number=SeverityNumber.INFO,
                body=body,
                attributes=attributes,
                event_name=name,
            )
        say_once(held, f"the {name} event", attributes, None, getattr(self.text_policy, "value_limit", None) or None, self.report_once)

    def _process_record(self, metric: str, raw: Any, attrs: Attrs, step: int | None) -> None:
        mdef = METRICS.get(metric)
        if mdef is None:
            self.reject(metric, _REASONS.BAD_KEY.value, "not a registry metric name")
            return
        attrs = clean_pairs(attrs, f"{metric}'s attribute", self.bad_text)
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
            attrs = clean_pairs(attrs, "a stage's attribute", self.bad_text)
            self._histograms.record(M.RL_STAGE_DURATION, seconds, attrs)
            measured.add((M.RL_STAGE_DURATION, attrs))
        for metric, attrs, value in gauges:
            self._latest.set(metric, clean_pairs(attrs, f"{metric}'s attribute", self.bad_text), value)

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
