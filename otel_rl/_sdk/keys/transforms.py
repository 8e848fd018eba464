"""The value transforms a mapping rule may name (``transform: gib``): unit and text conversions.

A transform turns one logged value into the registry metric's unit; :class:`_BoundTransform` ties
one to the key it converts, so a value it cannot convert is reported with that key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any


def _number(value: Any) -> float:
    if isinstance(value, str):
        return float(value.strip())
    return float(value)


def _gib(value: Any) -> float:
    return _number(value) * 1073741824.0


def _ms(value: Any) -> float:
    return _number(value) * 0.001


def _percent(value: Any) -> float:
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("%"):
            text = text[:-1].strip()
        return float(text) * 0.01
    return float(value) * 0.01


def _inverse(value: Any) -> float:
    number = _number(value)
    if number == 0.0:
        raise ValueError("cannot invert 0")
    return 1.0 / number


_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])(?![a-z])")
_DURATION_TEXT_RE = re.compile(r"^(?:\d+(?:\.\d+)?\s*[dhms](?![a-z])\s*)+$")
_CLOCK_RE = re.compile(r"^(?:(\d+)\s+days?,\s*)?(\d+):(\d{1,2}):(\d{1,2}(?:\.\d+)?)$")
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def _duration_text(value: Any) -> float:
    """ms-swift's format_time ("4d 3h 37m 48s", "5m 18s", "36s"), "H:MM:SS" or plain seconds."""
    if not isinstance(value, str):
        return float(value)
    text = value.strip()
    if _DURATION_TEXT_RE.match(text):
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART_RE.findall(text))
    clock = _CLOCK_RE.match(text)
    if clock:
        days, hours, minutes, seconds = clock.groups()
        return int(days or 0) * 86400.0 + int(hours) * 3600.0 + int(minutes) * 60.0 + float(seconds)
    return float(text)  # plain seconds as text; anything else raises ValueError


def _fraction(value: Any) -> tuple[float, float | None]:
    if isinstance(value, str):
        parts = value.strip().split("/")
        if len(parts) == 2:
            return float(parts[0]), float(parts[1])
        if len(parts) == 1:
            return float(parts[0]), None
        raise ValueError("not a fraction 'a/b'")
    return float(value), None


def _fraction_numerator(value: Any) -> float:
    return _fraction(value)[0]


def _fraction_denominator(value: Any) -> float:
    denominator = _fraction(value)[1]
    if denominator is None:
        raise ValueError("no denominator (expected 'a/b')")
    return denominator


#: Value transforms a rule may name (spec: "Mapping files").
TRANSFORMS: Mapping[str, Callable[[Any], float]] = {
    "gib": _gib,
    "gb": _gib,  # verl's *_gb values are bytes / 1024**3
    "ms": _ms,
    "percent": _percent,
    "inverse": _inverse,
    "duration_text": _duration_text,
    "fraction_numerator": _fraction_numerator,
    "fraction_denominator": _fraction_denominator,
}


#: The transforms that are ``float(value) * factor``: a float value's result is ``value * factor``
#: exactly, which lets a whole step's values be converted without a call per key.
LINEAR_TRANSFORMS: Mapping[str, float] = {"gib": 1073741824.0, "gb": 1073741824.0, "ms": 0.001, "percent": 0.01}


class _BoundTransform:
    """A transform bound to the key it converts, so a failure names both the key and the value."""

    __slots__ = ("_fn", "__name__", "key", "factor")

    def __init__(self, fn: Callable[[Any], float], name: str, key: str) -> None:
        self._fn = fn
        self.__name__ = name
        self.key = key
        self.factor: float | None = LINEAR_TRANSFORMS.get(name)  # None: not linear

    def __call__(self, value: Any) -> float:
        try:
            return self._fn(value)
        except Exception as exc:  # float() of odd objects raises TypeError, RuntimeError (tensors), ...
            raise ValueError(f"transform {self.__name__!r} of key {self.key!r} cannot convert value {value!r}: {exc}") from None

    def __repr__(self) -> str:
        return f"<transform {self.__name__} of {self.key!r}>"
