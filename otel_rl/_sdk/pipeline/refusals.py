"""Calls that telemetry refuses, each kind said once and counted, never raised into the loop.

- A step, or an integer attribute value, outside the signed 64-bit range. OTLP carries integers as
  int64: the SDK's encoder fails on such a value (a traceback per export in the training console)
  and a backend that reads it wraps it (2**64 becomes step 0). The call is dropped at the call,
  not written at a wrong step: ``rl.telemetry.rejected{reason=out_of_range}`` counts its values.
- A call after ``shutdown()`` (or while it runs): dropped, counted in ``Telemetry.dropped_calls``
  and ``rl.telemetry.dropped{drop_reason=after_shutdown}``.
- An event with more attributes than its log record keeps: the first are kept, the rest dropped.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Mapping
from typing import Any

from otel_rl._sdk.pipeline.aggregation import LatestValues
from otel_rl._sdk.pipeline.backlog import ADD
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

# The series messages name, spelt from the generated conventions.
_REJECTED_OUT_OF_RANGE = f"{M.RL_TELEMETRY_REJECTED}{{{A.RL_TELEMETRY_REASON}={A.RlTelemetryReasonValues.OUT_OF_RANGE.value}}}"
_DROPPED_AFTER_SHUTDOWN = f"{M.RL_TELEMETRY_DROPPED}{{{A.RL_TELEMETRY_DROP_REASON}={A.RlTelemetryDropReasonValues.AFTER_SHUTDOWN.value}}}"

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_OTLP_TYPES = frozenset((str, bool, int, float, bytes))  # an attribute value's class as it is (fast)
_OTLP_KINDS = (str, int, float, bytes, list, tuple, Mapping)  # and subclasses: numpy's float64 is a float
REFUSED: Any = object()  # what :meth:`Refusals.step` returns for a step that is refused
_OUT_OF_RANGE = ((A.RL_TELEMETRY_REASON, A.RlTelemetryReasonValues.OUT_OF_RANGE.value),)
_AFTER_SHUTDOWN = (A.RL_TELEMETRY_DROP_REASON, A.RlTelemetryDropReasonValues.AFTER_SHUTDOWN.value)


def fits_int64(value: Any) -> bool:
    """Whether ``value`` is not an integer outside int64 (anything else is not this check's business)."""
    return type(value) is not int or INT64_MIN <= value <= INT64_MAX


def attribute_text(value: Any) -> str:
    """An attribute value of no OTLP type as the SDK keeps one: its ``str()``; never raising into the loop."""
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a __str__ that raises
        return f"<unrepresentable {type(value).__name__}>"


def _named(values: Any, most: int = 3) -> str:
    """The first keys of a logged mapping, for a message (nothing for what cannot be read)."""
    names: list[str] = []
    try:
        for key in values if values is not None else ():
            if len(names) == most:
                names.append("...")
                break
            names.append(repr(key) if isinstance(key, str) else f"<{type(key).__name__} key>")
    except Exception:  # noqa: BLE001 - a mapping whose iteration raises: never into the loop
        pass
    return ", ".join(names)


def _length(values: Any) -> int:
    try:
        return len(values) if values is not None else 0
    except Exception:  # noqa: BLE001
        return 1


class Refusals:
    """One telemetry's refusals: ``report(key, reason, message)`` says a message once per key and
    reason; ``submit`` queues an item for the worker (the counts go through it); ``latest`` takes the
    counts once the worker has stopped."""

    def __init__(self, report: Callable[[str, str, str], None], submit: Callable[[tuple], None], latest: LatestValues) -> None:
        self._report = report
        self._submit = submit
        self._latest = latest

    def step(self, call: str, step: Any, values: Any = None, count: int | None = None) -> Any:
        """The step a call uses: a Python int for an integer of another type (numpy's), the step
        itself when it is no integer; :data:`REFUSED` for an integer outside int64 (said once for
        every call, naming the first keys of ``values``, the call's mapping, and counting its
        values, or ``count``)."""
        if type(step) is not int:
            try:
                step = operator.index(step)
            except TypeError:
                return step  # a float or another type: as before, not this check's business
        if INT64_MIN <= step <= INT64_MAX:
            return step
        named = _named(values)
        self._report(
            "<step>",
            "out_of_range",
            f"otel-rl: {call} got step={step}{f' for {named}' if named else ''}: outside the signed 64-bit range "
            f"OTLP and trackers carry ({INT64_MIN} to {INT64_MAX}), where it would arrive as another step. Calls at "
            f"such a step are dropped, not written at a wrong step (their values counted in {_REJECTED_OUT_OF_RANGE}), "
            f"and step spans carry no {A.RL_STEP} (reported once)",
        )
        count = _length(values) if count is None else count
        if count:
            self.count_out_of_range(count)
        return REFUSED

    def attributes(self, call: str, attrs: Any) -> Any:
        """The attributes a call goes on with: :data:`REFUSED` when a value is an integer outside
        int64 (said once per attribute name, and counted); else ``attrs``, or a copy in which a value
        of no OTLP type is its ``str()``, as the SDK makes it of a span's (said once per call and name;
        left as it was, it failed every later metric export of the run)."""
        pairs = attrs.items() if isinstance(attrs, dict) else attrs
        unfit: list[str] = []
        for name, value in pairs:
            if not fits_int64(value):
                self._report(
                    f"<attribute {name}>",
                    "out_of_range",
                    f"otel-rl: {call} got attribute {name!r} = {value}: outside the signed 64-bit range OTLP carries "
                    f"({INT64_MIN} to {INT64_MAX}); the call is dropped (counted in {_REJECTED_OUT_OF_RANGE}; "
                    "reported once per attribute). Pass it as a string to keep it exact",
                )
                self.count_out_of_range(1)
                return REFUSED
            if value is not None and value.__class__ not in _OTLP_TYPES and not isinstance(value, _OTLP_KINDS):
                unfit.append(name)
        if not unfit:
            return attrs
        converted = [(name, self._otlp_value(call, name, value) if name in unfit else value) for name, value in pairs]
        return dict(converted) if isinstance(attrs, dict) else tuple(converted)

    def _otlp_value(self, call: str, name: str, value: Any) -> Any:
        """A number of another type (numpy's) as a Python one; anything else as its ``str()``, said once."""
        try:
            if isinstance(value, numbers.Integral) and INT64_MIN <= int(value) <= INT64_MAX:  # past it (a uint64): text
                return int(value)
            if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
                return float(value)
        except Exception:  # noqa: BLE001 - a number type whose conversion raises: as text, below
            pass
        self._report(
            f"{call} <attribute {name}>",
            "type",
            f"otel-rl: {call} got attribute {name!r} of type {type(value).__name__}, which OTLP does not carry: its "
            "str() is used (reported once per call and attribute). Pass a str, bool, int or float",
        )
        return attribute_text(value)

    def first_attributes(self, call: str, attrs: dict[str, Any], room: int) -> dict[str, Any]:
        """A call's first attributes, as many as its record keeps (``room``), the rest dropped and
        said once per call: past its count limit the SDK would drop the oldest instead, and log a
        warning for each one (``rl.step``, added after them, among the kept)."""
        room = max(room, 0)
        keys = list(attrs)
        self._report(
            call,
            "attribute_count",
            f"otel-rl: {call} got {len(keys)} attributes, more than its log record keeps (its limit, with a place for "
            f"{A.RL_STEP}, is set by OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT, or OTEL_ATTRIBUTE_COUNT_LIMIT): the first "
            f"{room} are kept and the {len(keys) - room} from {keys[room]!r} on are dropped (said once per call)",
        )
        return {key: attrs[key] for key in keys[:room]}

    def count_out_of_range(self, values: int) -> None:
        self._submit((ADD, M.RL_TELEMETRY_REJECTED, _OUT_OF_RANGE, float(values)))

    def after_shutdown(self, call: str, signal: str, where: str) -> None:
        """A call after shutdown(): counted, and said once."""
        self._latest.add(M.RL_TELEMETRY_DROPPED, (_AFTER_SHUTDOWN, (A.RL_TELEMETRY_SIGNAL, signal)), 1)
        self._report(
            "<closed>",
            "after_shutdown",
            f"otel-rl: {call} was called after shutdown() of this telemetry ({where}): its data and that of every "
            f"later call are dropped (counted in Telemetry.dropped_calls and {_DROPPED_AFTER_SHUTDOWN}; reported "
            "once). Call otel_rl.init() to record more",
        )
