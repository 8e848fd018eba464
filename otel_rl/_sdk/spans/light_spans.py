"""Spans at the cost of an event: the step, stage and phase spans, recorded on the caller's thread
and built by the telemetry worker.

An SDK span (``opentelemetry.sdk.trace``) does its work on the thread that starts and ends it: a
sampler call, a lock per call, bounded attribute maps cleaned value by value, every processor's
``on_start`` and ``on_end``. That cost ~100 us of process CPU per span here, against ~53 us for a
whole 250-key ``log()`` (``benchmarks/bench_spans.py``). A :class:`LightSpan` records what the
span is made of and nothing more: ids drawn as the SDK's ``RandomIdGenerator`` draws them, the
parent's ``SpanContext``, ``time_ns`` start and end, its attributes, events, links and status.
While its block runs it is the current span of an OTel context like any other (``use_span``,
``set_span_in_context``), so SDK spans a program or a framework starts inside a stage nest under
it, and W3C propagation carries its context. After each drain of its queue the telemetry worker
builds the SDK's ``ReadableSpan`` from each ended one, with the tracer provider's span limits,
resource and instrumentation scope, and hands them to every otel-rl span processor
(``Providers.end_spans``): the run folder, OTLP and the spool get the bytes the SDK's spans make
(``tests/test_light_spans.py`` holds the encodings equal).

Where this cannot stand in for the SDK, :func:`light_tracer` returns None and the SDK's tracer
serves as before:

- a tracer provider handed in (``init(tracer_provider=...)``): the program's own processors (its
  exporters) must see otel-rl's spans too, and only the SDK's span reaches them;
- a sampler other than the SDK's default (parent-based always-on) or always-on, as
  ``OTEL_TRACES_SAMPLER`` may choose: it decides each span on the caller's thread;
- an id generator other than the random one, or ``OTEL_SDK_DISABLED=true`` (no spans at all).
"""

from __future__ import annotations

import logging
import os
import random
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from time import time_ns
from types import TracebackType
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import OTEL_SDK_DISABLED
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, DEFAULT_ON
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv.attributes.exception_attributes import EXCEPTION_ESCAPED, EXCEPTION_MESSAGE, EXCEPTION_STACKTRACE, EXCEPTION_TYPE
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util import types

from otel_rl._sdk.otlp.attribute_warnings import held_warnings, say_once
from otel_rl.reporting import ReportOnce

logger = logging.getLogger("otel_rl")

_getrandbits = random.getrandbits  # what RandomIdGenerator draws from
_UNSET = Status(StatusCode.UNSET)
_SAMPLED, _RANDOM = TraceFlags.SAMPLED, TraceFlags.RANDOM_TRACE_ID
# The four trace flags a span can get (sampled, random trace id), made once.
_FLAGS = {bits: TraceFlags(bits) for bits in (0, _SAMPLED, _RANDOM, _SAMPLED | _RANDOM)}
_ROOT_FLAGS = _FLAGS[_SAMPLED | _RANDOM]  # a new trace: sampled, its id random
_report = ReportOnce(logger)


def _plain(attributes: Mapping[str, Any] | None, max_count: int | None, max_length: int | None) -> bool:
    """Whether the SDK's bounded attributes would hold exactly ``attributes`` (nothing cut, cleaned
    or dropped): then the plain dict stands for them, at a fraction of the cost."""
    if not attributes:
        return True
    if max_count is not None and len(attributes) > max_count:
        return False
    for key, value in attributes.items():
        kind = type(value)
        if kind is str:
            if max_length is not None and len(value) > max_length:
                return False
        elif kind is not int and kind is not float and kind is not bool:
            return False
        if type(key) is not str or not key:
            return False
    return True


def _said(key: str, reason: str, message: str) -> None:
    _report((key, reason), "%s", message)


def _bounded(
    maxlen: int | None,
    attributes: Mapping[str, Any] | None,
    later: Sequence[tuple[str, Any]] | None,
    max_value_len: int | None,
    what: str,
    immutable: bool = False,
    variable: str = "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
) -> BoundedAttributes:
    """The SDK's bounded attributes, with the specification's rule past the count limit: the first
    attributes stay, the later ones are dropped and counted, and it is said once per ``what`` (the
    SDK's own drops the oldest: otel-rl's ``rl.stage`` and ``rl.step`` of a stage's span go first,
    and it logs a warning for every attribute it drops)."""
    fits = maxlen is None or (len(attributes) if attributes else 0) + (len(later) if later else 0) <= maxlen
    with held_warnings() as held:  # the SDK's cleaning: said once per key here, not at every span
        every = BoundedAttributes(
            maxlen if fits else None, attributes, immutable=immutable and fits and not later, max_value_len=max_value_len
        )
        for key, value in later or ():
            every[key] = value
    say_once(held, what, attributes, later, max_value_len, _said)
    if fits or maxlen is None:
        return every
    items = list(every.items())
    kept = BoundedAttributes(maxlen, dict(items[:maxlen]), immutable=immutable, max_value_len=max_value_len)
    kept.dropped = every.dropped + max(len(items) - maxlen, 0)  # the invalid keys' and those past the limit
    if len(items) <= maxlen:  # invalid keys left no more than the limit
        return kept
    _report(
        f"attribute count {what}",
        "otel-rl: %s has %d attributes, past the limit of %d (%s, or OTEL_ATTRIBUTE_COUNT_LIMIT, raises it): the first "
        "%d are kept, and the %d from %r on are dropped and counted in droppedAttributesCount (said once for it)",
        what,
        len(items),
        maxlen,
        variable,
        maxlen,
        len(items) - maxlen,
        items[maxlen][0],
    )
    return kept


def _valid_link(link: Link) -> bool:
    """The SDK keeps a link with a valid context, or one that carries attributes or a trace state."""
    context = link.context
    return bool(context and (context.is_valid or (link.attributes or context.trace_state)))


class LightSpan(trace_api.Span):
    """A recording span that only records (see the module docstring); the worker builds it."""

    __slots__ = (
        "_tracer",
        "name",
        "context",
        "parent",
        "kind",
        "attributes",
        "later",
        "events",
        "links",
        "status",
        "start_time",
        "end_time",
        "_on_exit",
    )

    def __init__(
        self,
        tracer: LightTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: types.Attributes,
        links: Sequence[Link] | None,
        start_time: int,
        on_exit: tuple[bool, bool],
    ) -> None:
        self._tracer = tracer
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.attributes: dict[str, Any] = dict(attributes) if attributes else {}
        self.later: list[tuple[str, Any]] | None = None  # set_attribute() calls after the start, in order
        self.events: list[tuple[str, Any, int]] = []  # (name, attributes, time_ns)
        self.links: list[Link] | None = list(links) if links else None
        self.status = _UNSET
        self.start_time = start_time
        self.end_time: int | None = None
        self._on_exit = on_exit  # (record_exception, set_status_on_exception), as the SDK's __exit__

    def _ended(self, call: str) -> bool:
        if self.end_time is None:
            return False
        _report(call, "otel-rl: %s() on a span that has ended (%s) is ignored", call, self.name)
        return True

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        if self._ended("set_attribute"):
            return
        if type(value) is list:  # the SDK keeps a copy: a list changed afterwards must not change the span
            value = tuple(value)
        if self.later is None:
            self.later = []
        self.later.append((key, value))  # cleaned by the worker, in this order, as the SDK does at once

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        if self._ended("add_event"):
            return
        self.events.append((name, dict(attributes) if attributes else None, time_ns() if timestamp is None else timestamp))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if self._ended("add_link"):
            return
        if self.links is None:
            self.links = []
        self.links.append(Link(context, dict(attributes) if attributes else None))

    def update_name(self, name: str) -> None:
        if not self._ended("update_name"):
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # The SDK's rules: a status set to OK stays; UNSET is ignored.
        if self._ended("set_status") or self.status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is not StatusCode.UNSET:
                self.status = status
        elif status is not StatusCode.UNSET:
            self.status = Status(status, description)

    def record_exception(
        self, exception: BaseException, attributes: types.Attributes = None, timestamp: int | None = None, escaped: bool = False
    ) -> None:
        """The SDK's ``exception`` event, its stack trace formatted here (the frames are not kept)."""
        module, qualname = type(exception).__module__, type(exception).__qualname__
        recorded: dict[str, Any] = {
            EXCEPTION_TYPE: f"{module}.{qualname}" if module and module != "builtins" else qualname,
            EXCEPTION_MESSAGE: str(exception),
            EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exception)),
            EXCEPTION_ESCAPED: str(escaped),
        }
        if attributes:
            recorded.update(attributes)
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._ended("end"):
            return
        self.end_time = time_ns() if end_time is None else end_time
        self._tracer.finish(self)

    def __exit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None) -> None:
        if exc_val is not None and self.end_time is None:
            record, set_status = self._on_exit
            if record:
                self.record_exception(exc_val, escaped=True)
            if set_status:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        self.end()


class LightTracer(trace_api.Tracer):
    """Starts :class:`LightSpan`\\ s; a queued export for the worker: after each drain of its queue,
    :meth:`write` builds the ended spans and hands them to ``end_spans``."""

    def __init__(
        self,
        resource: Resource,
        scope: InstrumentationScope,
        limits: SpanLimits,
        end_spans: Callable[[Sequence[ReadableSpan]], Any],
        *,
        parent_based: bool = True,
    ) -> None:
        self._resource = resource
        self._scope = scope
        self._limits = limits
        self._end_spans = end_spans
        self._parent_based = parent_based  # sampled only under a sampled parent (the SDK's default sampler)
        # False once nothing drains any more (shutdown done, a forked child): later spans are not kept.
        self.accepting = True
        self._finished: deque[LightSpan] = deque()
        self.wake: Callable[[], None] | None = None  # wakes the worker; Telemetry binds it
        # Whether any span processor takes the built spans (Telemetry binds it to its providers').
        self.consumed: Callable[[], bool] = lambda: True

    # -- the caller's thread --------------------------------------------------------------------
    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        parent: SpanContext | None = trace_api.get_current_span(context).get_span_context()
        # The ids as the SDK's tracer draws them: the trace's (for a new trace) first, then the span's.
        if parent is not None and parent.is_valid:
            trace_id = parent.trace_id
            parent_flags = parent.trace_flags
            sampled = parent_flags.sampled or not self._parent_based
            flags = _FLAGS[(_SAMPLED if sampled else 0) | (_RANDOM if parent_flags.random_trace_id else 0)]
            state = parent.trace_state
        else:
            parent, sampled, flags, state = None, True, _ROOT_FLAGS, None
            trace_id = _getrandbits(128)
            while not trace_id:
                trace_id = _getrandbits(128)
        span_id = _getrandbits(64)
        while not span_id:
            span_id = _getrandbits(64)
        span_context = SpanContext(trace_id, span_id, False, flags, state)
        if not sampled:  # what the SDK's sampler makes of it: a span that records nothing
            return NonRecordingSpan(span_context)
        return LightSpan(
            self,
            name,
            span_context,
            parent,
            kind,
            attributes,
            links,
            time_ns() if start_time is None else start_time,
            (record_exception, set_status_on_exception),
        )

    @contextmanager
    def start_as_current_span(  # type: ignore[override]  # the API's own context manager decorator is private
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace_api.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception)
        with trace_api.use_span(
            span, end_on_exit=end_on_exit, record_exception=record_exception, set_status_on_exception=set_status_on_exception
        ) as current:
            yield current

    def finish(self, span: LightSpan) -> None:
        """An ended span, queued for the worker."""
        if not self.accepting:
            return
        self._finished.append(span)
        wake = self.wake
        if wake is not None:
            wake()

    # -- the worker -----------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether ended spans wait to be built."""
        return bool(self._finished)

    def write(self) -> bool:
        """Build the ended spans and hand them to every span processor; whether there were any.
        With no processor (``exporters="none"``, no tracker), none is built."""
        finished = self._finished
        if not finished:
            return False
        if not self.consumed():
            finished.clear()
            return True
        built: list[ReadableSpan] = []
        while True:
            try:
                span = finished.popleft()
            except IndexError:
                break
            try:
                built.append(self.readable(span))
            except Exception as exc:  # a bug here must never stop the worker
                _report("build", "otel-rl: dropped a span after an internal error: %r", exc)
        if built:
            self._end_spans(built)
        return True

    def readable(self, span: LightSpan) -> ReadableSpan:
        """The ``ReadableSpan`` the SDK would have made of ``span``, its limits applied as the SDK applies them."""
        limits = self._limits
        attributes: Any = span.attributes
        if span.later is not None or not _plain(attributes, limits.max_span_attributes, limits.max_span_attribute_length):
            attributes = _bounded(
                limits.max_span_attributes, attributes, span.later, limits.max_span_attribute_length, f"span {span.name!r}"
            )
        events: Sequence[Event] = ()
        if span.events:
            max_attributes, max_length = limits.max_event_attributes, limits.max_attribute_length
            events = [
                Event(
                    name,
                    given
                    if _plain(given, max_attributes, max_length)
                    else _bounded(
                        max_attributes,
                        given,
                        None,
                        max_length,
                        f"event {name!r} of span {span.name!r}",
                        True,
                        "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
                    ),
                    timestamp,
                )
                for name, given, timestamp in span.events
            ]
            if limits.max_events is not None and len(events) > limits.max_events:
                events = BoundedList.from_seq(limits.max_events, events)
        links: Sequence[Link] = ()
        if span.links:
            links = BoundedList.from_seq(
                limits.max_links,
                [
                    Link(
                        link.context,
                        _bounded(
                            limits.max_link_attributes,
                            link.attributes,
                            None,
                            limits.max_attribute_length,
                            f"a link of span {span.name!r}",
                            True,
                            "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
                        ),
                    )
                    for link in span.links
                    if _valid_link(link)
                ],
            )
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=self._resource,
            attributes=attributes,
            events=events,
            links=links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=self._scope,
        )


def light_tracer(
    tracer_provider: Any,
    span_limits: SpanLimits | None,
    resource: Resource,
    scope: InstrumentationScope,
    end_spans: Callable[[Sequence[ReadableSpan]], Any],
) -> LightTracer | None:
    """A light tracer standing for ``tracer_provider``'s, or None where the SDK's must serve (see
    the module docstring). ``span_limits``: those the provider was built with; None for a provider
    handed in by the program."""
    if span_limits is None or os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return None
    sampler = getattr(tracer_provider, "sampler", None)
    if (sampler is not DEFAULT_ON and sampler is not ALWAYS_ON) or type(
        getattr(tracer_provider, "id_generator", None)
    ) is not RandomIdGenerator:
        return None
    return LightTracer(resource, scope, span_limits, end_spans, parent_based=sampler is DEFAULT_ON)
