"""How the worker reads a logged value: as a metric measurement (``to_number``, ``to_array``, or
``Rejected`` with the reason), as the step event carries it (``event_value``), a whole step's
numbers on the bulk path (``step_numbers``), and what of its text an exported event may hold
(``TextPolicy``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from otel_rl.semconv import attributes as A

_REASONS = A.RlTelemetryReasonValues
MAX_NESTING = 64  # levels of nested dicts / lists a logged value may have


class Rejected(Exception):
    """A value that cannot become a metric measurement; ``reason`` is an rl.telemetry.reason value."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail


def event_value(raw: Any, _depth: int = 0) -> Any:
    """The value as the step event carries it: a plain Python scalar, the exact number logged."""
    kind = type(raw)
    if kind is float or kind is str or kind is bool or raw is None:
        return raw
    if kind is int:
        return raw if _INT64_MIN <= raw <= _INT64_MAX else _wide_int(raw)
    try:
        value = _event_value(raw, kind, _depth)
    except Exception:  # an object whose attributes or repr raise: the event still goes out
        return f"<unrepresentable {kind.__name__}>"
    # What item() returned must still be something OTLP can carry (one bad value would fail the
    # whole batch of events in the encoder).
    if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
        return _wide_int(value)
    if type(value) is complex:
        return repr(value)
    return value


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _wide_int(value: int) -> Any:
    """An integer beyond OTLP's int64: a float when it is one, else its decimal text."""
    try:
        return float(value)
    except OverflowError:
        return str(value)


def _event_value(raw: Any, kind: type, depth: int) -> Any:
    item = getattr(raw, "item", None)
    if item is not None and (getattr(raw, "ndim", None) == 0 or _numel(raw) == 1):
        try:
            return item()
        except Exception:
            return repr(raw)
    if isinstance(raw, (bytes, bytearray)):
        return raw.decode("utf-8", "replace")
    shape = getattr(raw, "shape", None)
    if shape is not None:
        return _array_summary(raw, kind, tuple(shape))
    if isinstance(raw, (list, tuple)):
        if depth >= MAX_NESTING:  # a list that contains itself, or absurdly deep
            return "<nested too deep>"
        return [event_value(v, depth + 1) for v in raw]
    return repr(raw)


MAX_EVENT_VALUES = 16  # a multi-element value up to this many elements keeps every value in the event


def _array_summary(raw: Any, kind: type, shape: tuple[Any, ...]) -> Any:
    """A multi-element tensor / array as the event keeps it: shape, element count, mean / min / max
    and, for small ones, the values themselves (a metric cannot carry it; the event should say what it was)."""
    try:
        # torch: copy to host as float64 (bf16 / fp16 have no numpy type); this runs on the worker thread
        host: Any = raw.detach().double().cpu().numpy() if callable(getattr(raw, "detach", None)) else raw
        arr = np.asarray(host).reshape(-1)
    except Exception:
        return f"<{kind.__name__} shape={shape}>"
    summary: dict[str, Any] = {"shape": [int(d) for d in shape], "len": int(arr.size)}
    if arr.size and arr.dtype.kind in "biuf":
        values = arr.astype(np.float64)
        summary.update(mean=float(values.mean()), min=float(values.min()), max=float(values.max()))
        if arr.size <= MAX_EVENT_VALUES:
            summary["values"] = [event_value(v) for v in arr.tolist()]
    return summary


def key_text(key: Any) -> str:
    try:
        return repr(key)
    except Exception:  # a key object whose repr raises
        return f"<{type(key).__name__} key>"


def _numel(raw: Any) -> int:
    numel = getattr(raw, "numel", None)
    if callable(numel):
        try:
            count: Any = numel()  # torch / numpy: an int
            return int(count)
        except Exception:
            return -1
    try:
        size = getattr(raw, "size", None)
    except Exception:
        return -1
    return size if isinstance(size, int) else -1


def to_number(raw: Any) -> float:
    """Coerce a logged value to a float measurement or raise Rejected with the reason."""
    kind = type(raw)
    if kind is float:
        value = raw
    elif kind is int or kind is bool:
        try:
            return float(raw)
        except OverflowError:
            raise Rejected(_REASONS.INF.value, "an integer beyond the float range") from None
    elif raw is None:
        raise Rejected(_REASONS.NONE.value)
    elif kind is str:
        raise Rejected(_REASONS.NON_NUMERIC.value, "a string")
    else:
        numel = _numel(raw)
        if numel > 1 or numel == 0:
            raise Rejected(_REASONS.MULTI_ELEMENT.value, f"{numel} elements")
        try:
            value = float(raw.item() if hasattr(raw, "item") else raw)
        except OverflowError:
            raise Rejected(_REASONS.INF.value, f"a {kind.__name__} beyond the float range") from None
        except Exception:  # whatever a foreign object's __float__ / item() raises
            raise Rejected(_REASONS.NON_NUMERIC.value, f"a {kind.__name__}") from None
    if value != value:
        raise Rejected(_REASONS.NAN.value)
    if value in (math.inf, -math.inf):
        raise Rejected(_REASONS.INF.value)
    return value


def resolved_number(transform: Any, raw: Any) -> float:
    """A logged value as its metric takes it: through the key's ``transform`` (None: as logged),
    then :func:`to_number`; raises Rejected with the reason."""
    if transform is None:
        return to_number(raw)
    try:
        value = transform(raw)
    except (TypeError, ValueError) as exc:
        raise Rejected(_REASONS.NON_NUMERIC.value, str(exc)) from None
    return to_number(value)


def to_array(raw: Any) -> np.ndarray:
    """A 1-D float64 array of a list / numpy array / torch tensor (moved to host by the worker)."""
    if hasattr(raw, "detach"):  # torch.Tensor: leave the device copy to this worker thread
        raw = raw.detach().float().cpu().numpy()
    return np.asarray(raw, dtype=np.float64).ravel()


# Keys under which a string is text (a prompt, a completion, a message), whatever its length.
_TEXT_KEY = re.compile(
    r"(?:^|[/._\-(])(prompts?|completions?|responses?_?texts?|generations?|texts?|messages?|contents?|"
    r"chats?|conversations?|questions?|answers?|outputs?_?texts?|inputs?_?texts?)(?:$|[/._\-)])",
    re.I,
)


class TextPolicy:
    """Keeps text out of exported events unless ``export_text``: a string longer than
    ``max_chars`` (64: labels, ids and statuses pass) or under a key that names text (prompt,
    completion, message, ...) is replaced by a marker saying how long it was. With
    ``export_text``, strings are cut at ``value_limit`` characters instead (0: no cut)."""

    def __init__(self, export_text: bool = False, value_limit: int = 1024, max_chars: int = 64) -> None:
        self.export_text = export_text
        self.value_limit = value_limit
        self.max_chars = max_chars

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] | None = None
        for key, value in body.items():
            kind = type(value)
            if kind is str:
                new = self._text(key, value)
            elif kind is list and any(type(v) is str for v in value):
                new = [self._text(key, v) if type(v) is str else v for v in value]
                if new == value:
                    continue
            else:
                continue
            if new is not value:
                if out is None:
                    out = dict(body)
                out[key] = new
        return body if out is None else out

    def _text(self, key: str, value: str) -> str:
        if self.export_text:
            limit = self.value_limit
            return value[:limit] if limit and len(value) > limit else value
        if len(value) > self.max_chars or _TEXT_KEY.search(key):
            return f"<text withheld: {len(value)} chars; export_text=true / OTEL_RL_EXPORT_TEXT=true exports it>"
        return value


_FLOAT_ONLY = {float}
# Float types a step may hold and still be packed as doubles (struct reads each as float(value) would).
FLOAT_TYPES = frozenset({float, np.float64, np.float32, np.float16})
# Integer types whose every value fits an int64: on the bulk path, the event keeps them as ints.
_INT_TYPES = frozenset({int, np.int64, np.int32, np.int16, np.int8, np.uint32, np.uint16, np.uint8})
_NUMBER_TYPES = FLOAT_TYPES | _INT_TYPES
_PLAIN_NUMBERS = frozenset({float, int})


def step_numbers(raw: list[Any]) -> tuple[list[float], list[Any], tuple[int, ...]] | None:
    """A step's values (in key order) for the bulk path: the floats its metrics take, the numbers
    its event carries (Python floats and ints, as ``event_value`` makes them) and the positions of
    the ints; None for anything else (text, a bool, an int past int64, a tensor): the per-key path
    decides. NaN and infinities are left to the caller."""
    kinds = set(map(type, raw))
    if kinds == _FLOAT_ONLY:
        return raw, raw, ()
    if kinds <= FLOAT_TYPES:  # numpy float scalars: the event carries the Python float (as item() gives)
        floats = list(map(float, raw))
        return floats, floats, ()
    if not kinds <= _NUMBER_TYPES:
        return None
    # ints among them (verl logs a dozen a step): metrics take floats, the event the ints
    numbers = raw if kinds <= _PLAIN_NUMBERS else [int(v) if type(v) in _INT_TYPES else float(v) for v in raw]
    ints = tuple(i for i, v in enumerate(numbers) if type(v) is int)
    if not all(_INT64_MIN <= numbers[i] <= _INT64_MAX for i in ints):
        return None
    return list(map(float, numbers)), numbers, ints


def check_strict(values: Mapping[str, Any], plan_of: Callable[[str], Any], depth: int = 0) -> None:
    """``log(strict=True)``: raise ValueError naming the first key whose value the pipeline would
    reject (``plan_of(key).transform``: the key's conversion)."""
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
            raise ValueError(f"otel-rl strict mode: key {key_text(key)} is a {type(key).__name__}, not a string")
        if isinstance(raw, Mapping):
            try:
                nested = {f"{key}/{k}": v for k, v in raw.items()}
            except Exception as exc:
                raise ValueError(f"otel-rl strict mode: the items of {key!r} cannot be read: {exc!r}") from None
            check_strict(nested, plan_of, depth + 1)
            continue
        plan = plan_of(key)
        try:
            to_number(plan.transform(raw) if plan.transform else raw)
        except Rejected as rej:
            raise ValueError(
                f"otel-rl strict mode: value of {key!r} is {rej.reason}" + (f" ({rej.detail})" if rej.detail else "")
            ) from None
        except Exception as exc:  # whatever a foreign object's conversion raises, as a ValueError
            raise ValueError(f"otel-rl strict mode: value of {key!r} cannot be read: {type(exc).__name__}") from None
