"""Values out of decoded OTLP protobuf messages: ``AnyValue`` and attribute lists as Python values,
a metric point's tracker key, a resource's rank."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["as_rank", "decode_any_value", "decode_attributes", "metric_key"]


def decode_any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` message as the Python value it carries (None when empty)."""
    kind = value.WhichOneof("value")
    if kind == "double_value":
        return value.double_value
    if kind == "int_value":
        return value.int_value
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "kvlist_value":
        return {kv.key: decode_any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "array_value":
        return [decode_any_value(v) for v in value.array_value.values]
    if kind == "bytes_value":
        return value.bytes_value
    return None


def decode_attributes(kvs: Any) -> dict[str, Any]:
    """A repeated ``KeyValue`` field as a dict."""
    return {kv.key: decode_any_value(kv.value) for kv in kvs}


def _attr_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def metric_key(name: str, attributes: Mapping[str, Any]) -> str:
    """``name{k="v",...}``: the format of ``registry_key_namer`` (attributes sorted by name)."""
    if not attributes:
        return name
    return name + "{" + ",".join(f'{k}="{_attr_text(attributes[k])}"' for k in sorted(attributes)) + "}"


def as_rank(raw: Any) -> int:
    """An ``rl.rank`` attribute value as an int (0 when missing or not a number)."""
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0
