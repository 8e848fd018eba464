"""Text that UTF-8 cannot encode, made safe where it enters a signal.

A Python string can hold lone surrogates (a file name or argv decoded with ``surrogateescape``,
half of an emoji cut by hand): the SDK's protobuf encoder and a UTF-8 file writer fail on them, and
they fail the whole batch the text sits in. One such metric key logged once made every later metric
export fail (the key's series is in each), and one such sample id cost every span of its batch. So
each text is checked where the worker builds what it exports (keys, attribute names and values,
event bodies, span names): a bad one is written with those characters escaped (``\\udcff``), said
once with the escaped text named, and counted in ``rl.telemetry.rejected{reason=not_utf8}``; every
other value goes out as it came. ASCII text, nearly all of it, costs one ``str.isascii()`` call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# (where, escaped text): said once per text and counted by the caller.
OnBadText = Callable[[str, str], None]


def bad_text_message(where: str, text: str) -> str:
    """What is said, once, of a text written escaped (``text``: as written)."""
    return (
        f"otel-rl: {where} {text!r} holds characters UTF-8 cannot encode (text decoded with surrogateescape?); "
        "it is written with them escaped, as shown here, and everything else as logged (reported once per text)"
    )


def encodes(text: str) -> bool:
    """Whether UTF-8 can encode ``text``."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escaped(text: str) -> str:
    """``text`` with each character UTF-8 cannot encode written as its escape (``\\udcff``)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clean_text(text: str, where: str, on_bad: OnBadText) -> str:
    if encodes(text):
        return text
    fixed = escaped(text)
    on_bad(where, fixed)
    return fixed


def clean_value(value: Any, where: str, on_bad: OnBadText) -> Any:
    """An attribute or event value with its texts cleaned (strings, and strings in lists, tuples
    and mappings); the value itself when nothing needed it."""
    kind = value.__class__
    if kind is str:
        return value if value.isascii() else clean_text(value, where, on_bad)
    if kind is int or kind is float or kind is bool or value is None:
        return value
    if isinstance(value, Mapping):
        cleaned = clean_mapping(value, where, on_bad)
        return value if cleaned is None else cleaned
    if isinstance(value, (list, tuple)):
        items = [clean_value(item, where, on_bad) for item in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return tuple(items) if isinstance(value, tuple) else items
    return value


def clean_mapping(mapping: Mapping[Any, Any], where: str, on_bad: OnBadText) -> dict[Any, Any] | None:
    """A copy of ``mapping`` with its keys and values cleaned; None when nothing needed it (the
    common case, found without a copy)."""
    if plain_ascii(mapping):
        return None
    changed = False
    out: dict[Any, Any] = {}
    for key, value in mapping.items():
        name = clean_text(key, where, on_bad) if key.__class__ is str else key
        fixed = clean_value(value, f"{where} {name!r}", on_bad)
        changed = changed or name is not key or fixed is not value
        out[name] = fixed
    return out if changed else None


def clean_pairs(pairs: tuple[tuple[str, Any], ...], where: str, on_bad: OnBadText) -> tuple[tuple[str, Any], ...]:
    """Attribute pairs (name, value) as the worker keys series by, cleaned; ``pairs`` itself when clean."""
    for name, value in pairs:
        if not name.isascii() or (value.__class__ is str and not value.isascii()) or value.__class__ in (list, tuple):
            break
    else:
        return pairs
    cleaned = tuple((clean_text(name, where, on_bad), clean_value(value, f"{where} {name!r}", on_bad)) for name, value in pairs)
    return pairs if all(a[0] is b[0] and a[1] is b[1] for a, b in zip(cleaned, pairs)) else cleaned


def plain_ascii(mapping: Mapping[Any, Any] | None) -> bool:
    """Whether every key and value of ``mapping`` is ASCII text or a number (nothing to look into)."""
    if not mapping:
        return True
    for key, value in mapping.items():
        if key.__class__ is str and not key.isascii():
            return False
        kind = value.__class__
        if kind is str:
            if not value.isascii():
                return False
        elif kind is not float and kind is not int and kind is not bool and value is not None:
            return False
    return True
