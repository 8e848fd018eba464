"""A kept trajectory's spans, built on the telemetry worker from what its caller recorded.

``settle`` checks a finished trajectory's values (reward, token counts, ids) once, on the worker:
a bad one is left out, counted in ``rl.telemetry.rejected`` and said once, naming it. ``SpanBuilder``
turns a kept trajectory into SDK ``ReadableSpan`` objects, as the SDK's own spans would be when
they end: the tracer's resource and id generator, the ``otel_rl`` instrumentation scope, string
values cut at ``attribute_value_limit``, the sampled trace flag. ``Providers.end_spans`` then hands
them to every destination, so they are encoded as any other span is.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_rl._sdk.export.providers import SCOPE_NAME
from otel_rl._sdk.pipeline.refusals import INT64_MAX
from otel_rl._sdk.pipeline.samples import cap_text, real_number
from otel_rl._version import __version__
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

__all__ = ["MAX_COMPONENTS", "SpanBuilder", "settle", "text_of"]

_OPS = A.GenAiOperationNameValues
_INVOKE_AGENT, _CHAT, _EXECUTE_TOOL = _OPS.INVOKE_AGENT.value, _OPS.CHAT.value, _OPS.EXECUTE_TOOL.value
_REASONS = A.RlTelemetryReasonValues
TRUNCATED_FINISH_REASON = "length"  # the finish reason of a generation cut at the length limit (OpenAI, vLLM, SGLang)
_REWARDS_PREFIX = A.RL_TRAJECTORY_REWARDS + "."
MAX_COMPONENTS = 32  # reward components per trajectory kept as attributes
_COMPONENT_NAME_LIMIT = 64
_ENGINES_KEPT = 256  # parsed engine addresses remembered
_UNSET = Status(StatusCode.UNSET)

Reject = Callable[[str, str, str], None]  # (what, reason, detail): counted and said once


def _checked_reward(value: Any, what: str, reject: Reject) -> float | None:
    try:
        number = real_number(value)
    except Exception:  # noqa: BLE001 - a foreign type: named, never raised
        reject(what, _REASONS.NON_NUMERIC.value, f"a {type(value).__name__}, not a number")
        return None
    if number - number == 0.0:
        return number
    reject(what, _REASONS.NAN.value if number != number else _REASONS.INF.value, repr(number))
    return None


def _checked_count(value: Any, what: str, reject: Reject) -> int | None:
    if value is None:
        return None
    if value.__class__ is not int:
        try:
            value = operator.index(value)
        except TypeError:
            try:
                number = real_number(value)
            except Exception:  # noqa: BLE001
                reject(what, _REASONS.NON_NUMERIC.value, f"a {type(value).__name__}, not a token count")
                return None
            if not (math.isfinite(number) and number == int(number)):
                reject(what, _REASONS.NON_NUMERIC.value, f"{number!r}, not a whole number of tokens")
                return None
            value = int(number)
    if value < 0:
        reject(what, _REASONS.NEGATIVE.value, str(value))
        return None
    if value > INT64_MAX:
        reject(what, _REASONS.OUT_OF_RANGE.value, f"{value}, past the signed 64-bit range OTLP carries")
        return None
    return value


def settle(traj: Any, reject: Reject, report: Reject) -> None:
    """Check a finished trajectory's values in place and derive ``failed`` and ``truncated``.
    ``reject`` leaves a value out (counted); ``report`` says how one was taken (ids as text)."""
    traj.sample_id = _id(traj.sample_id, "trajectory(sample_id)", report)
    if traj.group is not None:
        traj.group = _id(traj.group, "trajectory(group)", report)
    if traj.reward_value is not None:
        traj.reward_value = _checked_reward(traj.reward_value, "trajectory.reward()", reject)
    components = traj.components
    if components is not None:
        if not isinstance(components, Mapping):
            reject("trajectory.reward(components=...)", _REASONS.NON_NUMERIC.value, f"a {type(components).__name__}, not a mapping")
            components = None
        else:
            checked: dict[str, float] = {}
            for name, value in components.items():
                if len(checked) == MAX_COMPONENTS:
                    reject("trajectory.reward(components=...)", _REASONS.UNMAPPED_OVERFLOW.value, f"more than {MAX_COMPONENTS} components")
                    break
                number = _checked_reward(value, f"trajectory.reward(components[{str(name)[:_COMPONENT_NAME_LIMIT]!r}])", reject)
                if number is not None:
                    checked[str(name)[:_COMPONENT_NAME_LIMIT]] = number
            components = checked or None
        traj.components = components
    failed = traj.error is not None
    truncated = False
    for child in traj.children:
        if child.error is not None:
            failed = True
        if child.is_turn:
            child.tokens_in = _checked_count(child.tokens_in, "turn(tokens_in)", reject)
            child.tokens_out = _checked_count(child.tokens_out, "turn.done(tokens_out)", reject)
            if child.finish_reason is not None:
                child.finish_reason = str(child.finish_reason)
                truncated = truncated or child.finish_reason == TRUNCATED_FINISH_REASON
    traj.truncated = truncated
    traj.failed = failed or truncated


def text_of(value: Any) -> str:
    """Text to export: a string as it is, a mapping or a list as JSON, anything else as ``str()``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (Mapping, list, tuple)):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            pass
    return str(value)


def _id(value: Any, what: str, report: Reject) -> str:
    """A sample or group id as text: a string as it is, an integer in decimal, anything else as its
    ``str()`` (said once)."""
    if value.__class__ is str:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, str):
        return str(value)
    report(
        what, type(value).__name__, f"otel-rl: {what} is a {type(value).__name__}, not a str or int; written as its str() (reported once)"
    )
    return str(value)


class SpanBuilder:
    """Builds a kept trajectory's spans: a root ``rl.trajectory`` and a child per turn and tool call."""

    def __init__(self, tel: Any) -> None:
        config = tel.config
        provider = tel._providers.tracer_provider  # the resource and ids of the telemetry's own spans
        self.resource = getattr(provider, "resource", None) or tel.resource
        self.scope = InstrumentationScope(SCOPE_NAME, __version__)
        self.ids = getattr(provider, "id_generator", None) or RandomIdGenerator()
        flags = TraceFlags.SAMPLED
        is_random = getattr(self.ids, "is_trace_id_random", None)
        if callable(is_random) and is_random():  # as the SDK marks the traces of a random id generator
            flags |= getattr(TraceFlags, "RANDOM_TRACE_ID", 0)
        self.flags = TraceFlags(flags)
        self.limit = config.attribute_value_limit or None
        limits = [n for n in (config.sample_text_limit, config.attribute_value_limit) if n]
        # A string of at most N bytes has at most N characters: the attribute limit never cuts it again.
        self.text_limit = min(limits) if limits else 0
        self.text = config.log_samples > 0
        self.base = {A.RL_RUN_ID: str(config.run_id), A.RL_RANK: tel.rank}
        self._engines: dict[Any, tuple[str | None, int | None]] = {}

    def _clip(self, value: str) -> str:
        limit = self.limit
        return value if limit is None or len(value) <= limit else value[:limit]

    def _text(self, value: Any) -> str:
        return cap_text(text_of(value), self.text_limit)

    def _status(self, error: tuple[str, str | None] | None) -> Status:
        if error is None:
            return _UNSET
        message = error[1]
        return Status(StatusCode.ERROR, cap_text(f"{error[0]}: {message}", self.text_limit) if message is not None else None)

    def engine(self, engine: Any) -> tuple[str | None, int | None]:
        """``host:port``, ``[v6]:port``, ``host`` or a URL as (server.address, server.port)."""
        found = self._engines.get(engine)
        if found is None:
            found = _parse_engine(engine)
            if len(self._engines) >= _ENGINES_KEPT:
                self._engines.clear()
            self._engines[engine] = found
        return found

    def build(self, traj: Any, reason: str) -> list[ReadableSpan]:
        """The spans of a settled trajectory (see :func:`settle`), its root first."""
        ids, flags, clip = self.ids, self.flags, self._clip
        root = SpanContext(ids.generate_trace_id(), ids.generate_span_id(), False, flags)
        trace_id = root.trace_id
        epoch, origin = traj.start_epoch_ns, traj.start
        end = traj.end
        spans: list[ReadableSpan] = []
        turns = tools = 0
        tokens_in = tokens_out = None
        for child in sorted(traj.children, key=_start):
            if not child.start:  # made, never entered
                continue
            error = child.error
            if child.is_turn:
                attributes: dict[str, Any] = {A.GEN_AI_OPERATION_NAME: _CHAT, A.RL_TURN_INDEX: turns}
                turns += 1
                if child.tokens_in is not None:
                    attributes[A.GEN_AI_USAGE_INPUT_TOKENS] = child.tokens_in
                    tokens_in = (tokens_in or 0) + child.tokens_in
                if child.tokens_out is not None:
                    attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] = child.tokens_out
                    tokens_out = (tokens_out or 0) + child.tokens_out
                if child.finish_reason is not None:
                    attributes[A.GEN_AI_RESPONSE_FINISH_REASONS] = (clip(child.finish_reason),)
                if child.engine is not None:
                    address, port = self.engine(child.engine)
                    if address:
                        attributes[A.SERVER_ADDRESS] = clip(address)
                    if port is not None:
                        attributes[A.SERVER_PORT] = port
                texts = ((A.RL_TURN_PROMPT, child.prompt), (A.RL_TURN_RESPONSE, child.response))
                name, kind = N.RL_TURN_SPAN, SpanKind.CLIENT
            else:
                tools += 1
                attributes = {A.GEN_AI_OPERATION_NAME: _EXECUTE_TOOL, A.GEN_AI_TOOL_NAME: clip(_name_text(child.name))}
                if child.call_id is not None:
                    attributes[A.GEN_AI_TOOL_CALL_ID] = clip(_name_text(child.call_id))
                texts = ((A.GEN_AI_TOOL_CALL_ARGUMENTS, child.arguments), (A.GEN_AI_TOOL_CALL_RESULT, child.result))
                name, kind = N.RL_TOOL_SPAN, SpanKind.INTERNAL
            if error is not None:
                attributes[A.ERROR_TYPE] = clip(error[0])
            if self.text:
                for key, text in texts:
                    if text is not None:
                        attributes[key] = self._text(text)
            spans.append(
                ReadableSpan(
                    name,
                    SpanContext(trace_id, ids.generate_span_id(), False, flags),
                    root,
                    self.resource,
                    attributes,
                    kind=kind,
                    status=self._status(error),
                    start_time=epoch + (child.start - origin),
                    end_time=epoch + ((child.end or end) - origin),
                    instrumentation_scope=self.scope,
                )
            )
        attributes = {A.GEN_AI_OPERATION_NAME: _INVOKE_AGENT, A.RL_SAMPLE_ID: clip(traj.sample_id)}
        if traj.step is not None:
            attributes[A.RL_STEP] = traj.step
        attributes.update(self.base)
        if traj.group is not None:
            attributes[A.RL_SAMPLE_GROUP_ID] = clip(traj.group)
        if traj.reward_value is not None:
            attributes[A.RL_TRAJECTORY_REWARD] = traj.reward_value
        if traj.components:
            for component, value in traj.components.items():
                attributes[_REWARDS_PREFIX + component] = value
        # past MAX_CHILDREN a trajectory keeps no more spans, but they still count
        attributes[A.RL_TRAJECTORY_TURN_COUNT] = turns + traj.dropped_turns
        attributes[A.RL_TRAJECTORY_TOOL_CALL_COUNT] = tools + traj.dropped_tools
        attributes[A.RL_TRAJECTORY_TRUNCATED] = traj.truncated
        attributes[A.RL_TRAJECTORY_FAILED] = traj.failed
        attributes[A.RL_TRAJECTORY_REASON] = reason
        if tokens_in is not None:
            attributes[A.GEN_AI_USAGE_INPUT_TOKENS] = tokens_in
        if tokens_out is not None:
            attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] = tokens_out
        if traj.error is not None:
            attributes[A.ERROR_TYPE] = clip(traj.error[0])
        spans.insert(
            0,
            ReadableSpan(
                N.RL_TRAJECTORY_SPAN,
                root,
                None,
                self.resource,
                attributes,
                links=(Link(traj.link),) if traj.link is not None and traj.link.is_valid else (),
                kind=SpanKind.INTERNAL,
                status=self._status(traj.error),
                start_time=epoch,
                end_time=epoch + (end - origin),
                instrumentation_scope=self.scope,
            ),
        )
        return spans


def _start(child: Any) -> int:
    return child.start


def _name_text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _parse_engine(engine: Any) -> tuple[str | None, int | None]:
    text = str(engine).strip()
    if "://" in text:
        try:
            parts = urlsplit(text)
            return parts.hostname, parts.port
        except ValueError:
            return text, None
    if text.startswith("["):  # [v6]:port
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        return host, int(port) if port.isdigit() and int(port) <= 65535 else None
    host, colon, port = text.rpartition(":")
    if colon and port.isdigit() and ":" not in host and int(port) <= 65535:
        return host, int(port)
    return text, None
