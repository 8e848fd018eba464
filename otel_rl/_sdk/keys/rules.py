"""One mapping rule compiled: its key template parsed into literals and placeholders, the regular
expression that matches keys, and the inverse that writes a key back from attributes.

The rules come from ``semconv/mappings/<framework>.yaml`` (:mod:`otel_rl._sdk.keys.mappings` loads
and validates them); :class:`otel_rl._sdk.keys.resolver.KeyResolver` tries them in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_rl._sdk.keys.transforms import TRANSFORMS

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")


class _RuleError(ValueError):
    """A rule that cannot be compiled; the message says why (the caller adds where)."""


@dataclass(frozen=True, slots=True)
class _Part:
    literal: str | None = None  # a literal piece of the key, or
    attribute: str | None = None  # a placeholder capturing this attribute
    allowed: frozenset[str] | None = None  # values an enum placeholder accepts (None: any segment)


class _Rule:
    __slots__ = (
        "framework",
        "index",
        "line",
        "key",
        "metric",
        "fixed",
        "values",
        "inverse_values",
        "transform_name",
        "transform",
        "parts",
        "placeholders",
        "pattern",
        "groups",
        "excepted",
        "screen",
    )

    def __init__(self, framework: str, index: int, raw: Mapping[str, Any], enum_members: Mapping[str, Iterable[str]]):
        self.framework = framework
        self.index = index
        self.line = raw.get("__line__")
        key = raw.get("key")
        metric = raw.get("metric")
        if not isinstance(key, str) or not key:
            raise _RuleError("`key` must be a non-empty string")
        if not isinstance(metric, str) or not metric:
            raise _RuleError("`metric` must be a non-empty string")
        self.key = key
        self.metric = metric
        self.fixed = {str(k): _scalar(v) for k, v in _mapping(raw.get("attributes"), "attributes").items()}
        self.values: dict[str, dict[str, str]] = {}
        for attr, renames in _mapping(raw.get("values"), "values").items():
            self.values[str(attr)] = {_scalar(s): _scalar(t) for s, t in _mapping(renames, f"values.{attr}").items()}
        self.inverse_values: dict[str, dict[str, str]] = {}
        for attr, renames in self.values.items():
            inverse: dict[str, str] = {}
            for source, target in renames.items():
                inverse.setdefault(target, source)
            self.inverse_values[attr] = inverse
        name = raw.get("transform")
        if name is not None and (not isinstance(name, str) or name not in TRANSFORMS):
            raise _RuleError(f"unknown transform {name!r} (known: {', '.join(sorted(TRANSFORMS))})")
        self.transform_name: str | None = name
        self.transform = TRANSFORMS[name] if name is not None else None
        # Keys the template would match that mean something else (TRL's DPO rewards/chosen under
        # the old GRPO rewards/{function} shape).
        excepted = raw.get("except") or ()
        if isinstance(excepted, str) or not all(isinstance(k, str) for k in excepted):
            raise _RuleError("`except` must be a list of keys")
        self.excepted = frozenset(excepted)
        self.parts = _parse_template(key, self.values, enum_members)
        self.placeholders = tuple(p.attribute for p in self.parts if p.attribute is not None)
        for attr in self.placeholders:
            if attr in self.fixed:
                raise _RuleError(f"attribute {attr!r} is both a placeholder and a fixed attribute")
        regex = []
        plain = []  # the same without named groups: one alternative of the resolver's screen
        self.groups: list[tuple[str, str]] = []
        for part in self.parts:
            if part.literal is not None:
                regex.append(re.escape(part.literal))
                plain.append(regex[-1])
                continue
            group = f"p{len(self.groups)}"
            self.groups.append((group, part.attribute or ""))
            if part.allowed is None:
                body = "[^/]+"
            else:
                body = "|".join(re.escape(v) for v in sorted(part.allowed, key=lambda v: (-len(v), v)))
            regex.append(f"(?P<{group}>{body})")
            plain.append(f"(?:{body})")
        self.pattern = re.compile("".join(regex))
        self.screen = "".join(plain)  # matches exactly the keys ``pattern`` matches

    def match(self, key: str) -> dict[str, str] | None:
        m = self.pattern.fullmatch(key)
        if m is None or key in self.excepted:
            return None
        attributes = dict(self.fixed)
        for group, attr in self.groups:
            captured = m.group(group)
            attributes[attr] = self.values.get(attr, {}).get(captured, captured)
        return attributes

    def format(self, attributes: Mapping[str, str]) -> str | None:
        """The key this rule writes for ``attributes`` (exactly its attributes), or None."""
        if set(attributes) != set(self.fixed) | set(self.placeholders):
            return None
        if any(attributes[k] != v for k, v in self.fixed.items()):
            return None
        out = []
        for part in self.parts:
            if part.literal is not None:
                out.append(part.literal)
                continue
            value = attributes[part.attribute or ""]
            value = self.inverse_values.get(part.attribute or "", {}).get(value, value)
            if not value or "/" in value or (part.allowed is not None and value not in part.allowed):
                return None
            out.append(value)
        key = "".join(out)
        # An adjacent literal can make the written key read back differently: check it does not.
        return key if self.match(key) == dict(attributes) else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "metric": self.metric}
        if self.fixed:
            out["attributes"] = dict(self.fixed)
        if self.values:
            out["values"] = {a: dict(r) for a, r in self.values.items()}
        if self.transform_name:
            out["transform"] = self.transform_name
        if self.excepted:
            out["except"] = sorted(self.excepted)
        return out


def _mapping(value: Any, what: str) -> Mapping[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _RuleError(f"`{what}` must be a mapping")
    return value


def _scalar(value: Any) -> str:
    if isinstance(value, bool):  # YAML `true` -> "true", as OTel writes booleans
        return "true" if value else "false"
    return str(value)


def _parse_template(key: str, values: Mapping[str, Mapping[str, str]], enum_members: Mapping[str, Iterable[str]]) -> list[_Part]:
    parts: list[_Part] = []
    seen: set[str] = set()
    pos = 0
    for m in _PLACEHOLDER_RE.finditer(key):
        literal = key[pos : m.start()]
        if "{" in literal or "}" in literal:
            raise _RuleError("unbalanced braces in key")
        if literal:
            parts.append(_Part(literal=literal))
        body = m.group(1)
        attr, _, modifier = body.partition(":")
        if not _NAME_RE.match(attr):
            raise _RuleError(f"placeholder {{{body}}} does not name an attribute")
        if modifier not in ("", "*"):
            raise _RuleError(f"placeholder {{{body}}}: the only modifier is ':*'")
        if attr in seen:
            raise _RuleError(f"placeholder {{{attr}}} appears twice")
        seen.add(attr)
        allowed = None
        members = enum_members.get(attr)
        if modifier != "*" and members:
            allowed = frozenset(str(v) for v in members) | frozenset(values.get(attr, {}))
        parts.append(_Part(attribute=attr, allowed=allowed))
        pos = m.end()
    tail = key[pos:]
    if "{" in tail or "}" in tail:
        raise _RuleError("unbalanced braces in key")
    if tail:
        parts.append(_Part(literal=tail))
    return parts


def _rule_where(mapping: Mapping[str, Any], index: int, raw: Any) -> str:
    framework = mapping.get("framework")
    file = mapping.get("__file__") or f"semconv/mappings/{framework}.yaml"
    line = raw.get("__line__") if isinstance(raw, Mapping) else None
    key = raw.get("key") if isinstance(raw, Mapping) else None
    where = f"{file}:{line}" if line else str(file)
    return f"{where}: keys[{index}]" + (f" ({key!r})" if isinstance(key, str) else "")
