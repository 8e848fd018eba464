"""The protobuf wire format, for the OTLP requests otel-rl writes without building messages (the
spool's step events, spans and metric exports): varints, length-delimited fields, and OTLP's
``AnyValue`` / ``KeyValue`` as the SDK's encoders fill them in (``_encode_value``: bool before int,
tuples and lists as arrays)."""

from __future__ import annotations

import struct
from typing import Any

pack_double = struct.Struct("<d").pack
pack_fixed64 = struct.Struct("<Q").pack
pack_sfixed64 = struct.Struct("<q").pack
pack_fixed32 = struct.Struct("<I").pack
_KEYS_KEPT = 4096
_UINT64 = (1 << 64) - 1


class Unsupported(Exception):
    """A value the direct writers leave to the SDK's encoders."""


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of an unsigned (or two's-complement int64) ``value``."""
    if 0 <= value < 0x80:
        return bytes((value,))
    value &= _UINT64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2) of field ``number``."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def any_value(value: Any) -> bytes:
    """The AnyValue message's bytes, as the SDK's _encode_value builds it."""
    kind = type(value)
    if kind is str:
        return field(1, value.encode("utf-8"))
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        if not -(1 << 63) <= value < (1 << 63):
            raise Unsupported("int64 range")
        return b"\x18" + varint(value)  # int64: two's complement, 10 bytes when negative
    if kind is float:
        return b"\x21" + pack_double(value)
    if kind is tuple or kind is list:
        return field(5, b"".join(field(1, any_value(item)) for item in value))  # ArrayValue.values
    raise Unsupported(kind.__name__)


_KEY_PREFIX: dict[str, bytes] = {}  # a key's bytes: KeyValue.key


def key_value(key: str, value: Any) -> bytes:
    """A KeyValue message's bytes."""
    prefix = _KEY_PREFIX.get(key)
    if prefix is None:
        if type(key) is not str:
            raise Unsupported("key")
        prefix = field(1, key.encode("utf-8"))
        if len(_KEY_PREFIX) < _KEYS_KEPT:
            _KEY_PREFIX[key] = prefix
    if value is None:
        raise Unsupported("None")  # the SDK logs and skips it
    return prefix + field(2, any_value(value))
