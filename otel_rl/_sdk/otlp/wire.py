"""The protobuf wire format, for the OTLP requests otel-rl writes without building messages:
varints, length-delimited fields, and OTLP's ``AnyValue`` / ``KeyValue`` as the SDK's encoders
fill them in (``_encode_value``: bool before int, tuples and lists as arrays)."""

from __future__ import annotations

import struct
from typing import Any

pack_double = struct.Struct("<d").pack
pack_fixed64 = struct.Struct("<Q").pack
pack_sfixed64 = struct.Struct("<q").pack
pack_fixed32 = struct.Struct("<I").pack
_KEYS_KEPT = 4096


class Unsupported(Exception):
    """A value the direct writers leave to the SDK's encoders."""


def varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (tag: its first byte, field number << 3 | 2)."""
    return bytes((tag,)) + varint(len(payload)) + payload


def any_value(value: Any) -> bytes:
    """The AnyValue message's bytes, as the SDK's _encode_value builds it."""
    kind = type(value)
    if kind is str:
        return field(0x0A, value.encode("utf-8"))
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        if not -(1 << 63) <= value < (1 << 63):
            raise Unsupported("int64 range")
        return b"\x18" + varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement, 10 bytes when negative
    if kind is float:
        return b"\x21" + pack_double(value)
    if kind is tuple or kind is list:
        return field(0x2A, b"".join(field(0x0A, any_value(item)) for item in value))  # ArrayValue.values
    raise Unsupported(kind.__name__)


_KEY_PREFIX: dict[str, bytes] = {}  # a key's bytes: KeyValue.key


def key_value(key: str, value: Any) -> bytes:
    """A KeyValue message's bytes."""
    prefix = _KEY_PREFIX.get(key)
    if prefix is None:
        if type(key) is not str:
            raise Unsupported("key")
        prefix = field(0x0A, key.encode("utf-8"))
        if len(_KEY_PREFIX) < _KEYS_KEPT:
            _KEY_PREFIX[key] = prefix
    if value is None:
        raise Unsupported("None")  # the SDK logs and skips it
    return prefix + field(0x12, any_value(value))
