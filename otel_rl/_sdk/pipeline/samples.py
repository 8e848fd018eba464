"""Rollout samples: ``Telemetry.log_samples`` keeps a few prompts, responses and rewards per step as
``rl.sample`` events (opt-in: ``init(log_samples=K)`` / ``OTEL_RL_LOG_SAMPLES``).

Which samples are kept is deterministic: sample ``i`` of a step (counted over the step's calls)
gets the key ``splitmix64(blake2b(run id, step) XOR i)`` and a call keeps the samples with the
smallest keys, up to what is left of the step's ``K``. A rerun with the same run id and the same
batches keeps the same samples; a different run id draws others. The choice happens on the
caller's thread (one vectorised hash over the batch's indices, then a copy of the kept mappings
only); checking values, cutting text and emitting the events happen on the telemetry worker, as
for ``log()``.

Text is cut at ``sample_text_limit`` bytes of UTF-8 (never inside a character), with a marker
that says how long it was, so the result is at most that many bytes.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from otel_rl._sdk.pipeline.refusals import REFUSED
from otel_rl._sdk.pipeline.worker import CALL
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N
from otel_rl.trackers import samples as S

__all__ = ["SampleLogging", "cap_text", "choose"]

_TEXT_KEYS = (S.PROMPT, S.RESPONSE)
_NUMBER_KEYS = (S.REWARD, S.ADVANTAGE)
_KNOWN_KEYS = frozenset({*_TEXT_KEYS, *_NUMBER_KEYS, S.REWARDS, S.RESPONSE_LENGTH, S.TRUNCATED, S.GROUP_ID})
_STEPS_KEPT = 8  # per-step budgets remembered (samples of a step may arrive in several calls)
_MASK64 = (1 << 64) - 1


def cap_text(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` bytes of UTF-8: cut on a character boundary and ended by a
    marker with the original size (0: no cap)."""
    if not limit or len(text) * 4 <= limit:  # a character is at most 4 bytes: nothing to measure
        return text
    data = text.encode("utf-8", "replace")  # lone surrogates (never valid UTF-8) become "?"
    if len(data) <= limit:
        return data.decode("utf-8")
    marker = f"…[cut: {len(data)} bytes]"
    keep = max(0, limit - len(marker.encode("utf-8")))
    # Bytes past the last whole character are dropped by the "ignore" decode of the cut bytes.
    return data[:keep].decode("utf-8", "ignore") + marker


def _splitmix64(x: np.ndarray) -> np.ndarray:
    # uint64 arithmetic wraps modulo 2**64 in numpy arrays, as the algorithm needs.
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def choose(run_id: str, step: int | None, start: int, n: int, k: int) -> list[int]:
    """The positions (0..n-1, ascending) of the ``k`` samples kept from a call whose first sample is
    sample ``start`` of ``step``: the smallest keys, each a hash of (run id, step, start + position)."""
    if k <= 0 or n <= 0:
        return []
    if k >= n:
        return list(range(n))
    seed = int.from_bytes(hashlib.blake2b(f"{run_id}\0{step}".encode(), digest_size=8).digest(), "little")
    keys = _splitmix64(np.arange(start, start + n, dtype=np.uint64) ^ np.uint64(seed & _MASK64))
    return sorted(int(i) for i in np.argpartition(keys, k - 1)[:k])


class _Budget:
    """Per step: samples seen (the next one's index) and kept so far."""

    __slots__ = ("seen", "kept")

    def __init__(self) -> None:
        self.seen = 0
        self.kept = 0


def real_number(value: Any) -> float:
    """A float from a Python / numpy number, a bool or a one-element array or tensor; TypeError
    (naming the type) for anything else."""
    if value.__class__ is float or value.__class__ is int:
        return float(value)
    if isinstance(value, numbers.Real):  # bool and numpy's scalars among them
        return float(value)
    item = getattr(value, "item", None)  # numpy scalars, one-element arrays and tensors
    if callable(item):
        got = item()
        if isinstance(got, numbers.Real):
            return float(got)
    raise TypeError(type(value).__name__)


def _copy(raw: Any) -> Any:
    """A sample mapping copied one level down (its ``rewards`` too); anything else as it is."""
    if not isinstance(raw, Mapping):
        return raw
    copy = dict(raw)
    if isinstance(copy.get(S.REWARDS), Mapping):
        copy[S.REWARDS] = dict(copy[S.REWARDS])
    return copy


class _Reporter:
    """Says once per (key, problem) what was left out of the samples, naming the key."""

    def __init__(self, pipeline: Any) -> None:
        self._pipeline = pipeline

    def __call__(self, key: str, problem: str) -> None:
        self._pipeline.report_once(
            f"<log_samples {key}>", problem, f"otel-rl: log_samples(): {key!r} {problem}; left out of the sample (reported once)"
        )


def sample_body(raw: Any, step: int | None, index: int, text_limit: int, report: _Reporter) -> dict[str, Any] | None:
    """The ``rl.sample`` body of one caller's mapping; None (reported) when it is not a mapping."""
    if not isinstance(raw, Mapping):
        report("<sample>", f"is a {type(raw).__name__}, not a mapping of prompt, response, reward, ...")
        return None
    body: dict[str, Any] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if key in _TEXT_KEYS:
            if isinstance(value, str):
                body[key] = cap_text(value, text_limit)
            else:
                report(key, f"is a {type(value).__name__}, not a string (turn chat messages into text first)")
        elif key in _NUMBER_KEYS:
            try:
                body[key] = real_number(value)
            except Exception:
                report(key, f"is a {type(value).__name__}, not a number")
        elif key == S.REWARDS:
            if not isinstance(value, Mapping):
                report(key, f"is a {type(value).__name__}, not a mapping of reward component -> value")
                continue
            for name, part in value.items():
                try:
                    body[S.REWARDS_PREFIX + str(name)] = real_number(part)
                except Exception:
                    report(f"{key}/{name}", f"is a {type(part).__name__}, not a number")
        elif key == S.RESPONSE_LENGTH:
            try:
                length = real_number(value)
                if not (length >= 0 and math.isfinite(length)):
                    raise ValueError(length)
                body[key] = int(length)
            except Exception:
                report(key, f"is {value!r:.40}, not a token count")
        elif key == S.TRUNCATED:
            try:
                body[key] = bool(real_number(value))
            except Exception:
                report(key, f"is a {type(value).__name__}, not a bool")
        elif key == S.GROUP_ID:
            if isinstance(value, (str, numbers.Integral)):
                body[key] = str(value)
            else:
                report(key, f"is a {type(value).__name__}, not a string or integer id")
        else:
            report(str(key), f"is not a sample field (one of {', '.join(sorted(_KNOWN_KEYS))})")
    if step is not None:
        body[S.STEP] = step
    body[S.INDEX] = index
    return body


class SampleLogging:
    """``Telemetry.log_samples``, mixed into :class:`otel_rl._sdk.telemetry.Telemetry`."""

    # Provided by Telemetry.
    config: Any
    _closed: bool
    _current_step: int | None
    _step_span_context: Any
    _pipeline: Any

    _refusals: Any

    def _drop_call(self, call: str = ..., signal: str = ...) -> None: ...
    def _submit(self, item: tuple) -> None: ...

    def log_samples(self, samples: Sequence[Mapping[str, Any]] | Iterable[Mapping[str, Any]], step: int | None = None) -> None:
        """Keep up to ``log_samples`` rollout samples of ``step`` (default: the current step) as
        ``rl.sample`` events, which trackers show as a table (W&B Table, TensorBoard text, ...).

        ``samples``: mappings with the keys ``prompt`` and ``response`` (strings), ``reward`` (a
        number), ``rewards`` (component -> number), ``advantage``, ``response_length`` (tokens),
        ``truncated`` (bool), ``group_id``; any may be missing. Several calls for one step share
        its budget. Which samples are kept is deterministic (a hash of run id, step and index: see
        :mod:`otel_rl._sdk.pipeline.samples`); prompts and responses are cut at ``sample_text_limit`` bytes.

        Off unless ``init(log_samples=K)`` / ``OTEL_RL_LOG_SAMPLES=K``: samples carry text, and this
        opt-in is why they bypass the ``export_text`` policy that keeps text out of other events.
        The caller pays for the choice and a copy of the kept mappings; the rest happens on the
        telemetry worker. Never raises: a bad sample or value is reported once, naming the key.
        """
        if self._closed:
            return self._drop_call("log_samples()")
        keep = self.config.log_samples
        if not keep:
            return
        step = self._current_step if step is None else step
        if step is not None and (step := self._refusals.step("log_samples()", step, count=1)) is REFUSED:
            return
        try:
            if isinstance(samples, (Mapping, str, bytes)):  # one sample, or text: not a batch of samples
                raise TypeError(type(samples).__name__)
            batch = samples if isinstance(samples, Sequence) else list(samples)
            budgets: dict[Any, _Budget] = self.__dict__.setdefault("_sample_budgets", {})
            budget = budgets.get(step)
            if budget is None:
                budget = budgets[step] = _Budget()
                while len(budgets) > _STEPS_KEPT:
                    budgets.pop(next(iter(budgets)))
            start, n = budget.seen, len(batch)
            budget.seen += n
            chosen = choose(str(self.config.run_id), step, start, n, keep - budget.kept)
            budget.kept += len(chosen)
            # Copies of the kept mappings only: the caller may reuse its objects after the call.
            kept = [(start + i, _copy(batch[i])) for i in chosen]
        except Exception as exc:  # not a sequence, or one whose items raise: never into the loop
            self._pipeline.report_once(
                "<log_samples>",
                type(samples).__name__,
                f"otel-rl: log_samples() takes a sequence of mappings (prompt, response, reward, ...); "
                f"got {type(samples).__name__} ({type(exc).__name__}); ignored",
            )
            return
        if not kept:
            return
        emit, span_context, when = self._pipeline.emit_event, self._step_span_context, time.time_ns()
        text_limit, report = self.config.sample_text_limit, _Reporter(self._pipeline)

        def emit_samples() -> None:
            for index, raw in kept:
                body = sample_body(raw, step, index, text_limit, report)
                if body is None:
                    continue
                attrs: dict[str, Any] = {A.RL_SAMPLE_INDEX: index}
                if step is not None:
                    attrs[A.RL_STEP] = step
                if S.GROUP_ID in body:
                    attrs[A.RL_SAMPLE_GROUP_ID] = body[S.GROUP_ID]
                # plain: the text policy is skipped, log_samples being the opt-in (see the docstring)
                emit(N.RL_SAMPLE_EVENT, body, attrs, when, span_context, plain=True)

        self._submit((CALL, emit_samples))
