"""Carry a step's trace context to other processes in a plain dict of strings.

The carrier holds W3C ``traceparent`` (and ``tracestate``) plus a W3C ``baggage`` entry with
the step number, so a worker that extracts it opens spans as children of the driver's stage
and logs under the driver's step. The propagators are fixed rather than taken from
``OTEL_PROPAGATORS``: the carrier is otel-rl's own format, read back by otel-rl.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, cast

from opentelemetry import baggage
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_rl.semconv import attributes as A

_PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
STEP_BAGGAGE_KEY = A.RL_STEP


def inject_context(
    carrier: MutableMapping[str, Any] | None = None, *, step: int | None = None, context: Context | None = None
) -> MutableMapping[str, Any]:
    """Write the trace context (and ``step`` as baggage) into ``carrier`` (a new dict if None)."""
    carrier = {} if carrier is None else carrier
    if step is not None:
        context = baggage.set_baggage(STEP_BAGGAGE_KEY, str(step), context)
    _PROPAGATOR.inject(carrier, context=context)
    return carrier


def extract_context(carrier: Any) -> tuple[Context, int | None]:
    """The context and step a carrier holds; an empty context and None for anything unreadable."""
    if not hasattr(carrier, "get"):
        return Context(), None
    try:
        context = _PROPAGATOR.extract({k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)})
    except Exception:  # a garbled header is reported by the caller as "no context"
        return Context(), None
    raw = baggage.get_baggage(STEP_BAGGAGE_KEY, context)
    try:
        step = int(cast(Any, raw)) if raw is not None else None  # baggage values are str; anything else fails here
    except (TypeError, ValueError):
        step = None
    return context, step
