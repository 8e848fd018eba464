"""Resolve framework metric keys (``actor/pg_loss``, ``timing_s/gen``, ``memory(GiB)``) to registry metrics.

The rules live in ``semconv/mappings/<framework>.yaml`` (format in the project spec): each rule maps a key
template to a registry metric, fixed attributes, renames of captured values and an optional value
transform. :class:`KeyResolver` compiles every template to a regular expression once and caches each
resolution per ``(key, framework)``, so the hot path (every key of every logged step) costs one dict
lookup.

This module depends on the standard library and PyYAML only. It reads the generated tables of
``otel_rl.semconv`` lazily (they are generated from the same YAML) and otherwise parses the YAML
files itself; the metric and attribute names it must know before any table exists (the fallback
metrics) are defined here once.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEFAULT_UNMAPPED_KEY_LIMIT",
    "FRAMEWORK_ORDER",
    "KeyResolver",
    "Resolution",
    "TRANSFORMS",
    "load_mapping_files",
    "load_registry_tables",
    "validate_mappings",
]

_LOGGER = logging.getLogger("otel_rl")

#: Built-in frameworks, in the order their rules are tried after the caller's own framework.
FRAMEWORK_ORDER: tuple[str, ...] = ("roll", "verl", "trl", "swift")
DEFAULT_UNMAPPED_KEY_LIMIT = 256

# Names the resolver itself produces; they are registry names (see semconv/registry/), but the
# resolver must work before otel_rl.semconv is generated, so they are spelled here once.
_UNMAPPED_METRIC = "rl.unmapped"
_REJECTED_METRIC = "rl.telemetry.rejected"
_KEY_ATTRIBUTE = "rl.key"
_REASON_ATTRIBUTE = "rl.telemetry.reason"
_STATISTIC_ATTRIBUTE = "rl.statistic"
_OVERFLOW_REASON = "unmapped_overflow"
_BAD_KEY_REASON = "bad_key"
# Attributes a mapping rule must never set: rl.step is for spans/events only, rl.key is the fallback's.
_FORBIDDEN_RULE_ATTRIBUTES = ("rl.step", "rl.key")

_SEMCONV_DIR = Path(__file__).resolve().parent.parent / "semconv"
# Resolutions kept per resolver: far above any real run's key count, low enough that a stream of
# unique garbage keys cannot grow memory without bound (past it, resolution still works, uncached).
_CACHE_LIMIT = 1 << 16

_RULE_FIELDS = frozenset({"key", "metric", "attributes", "values", "transform", "except"})
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_FRAMEWORK_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
_STAT_SUFFIX_RE = re.compile(r"^(.+)@([A-Za-z0-9_.]+)$")
_PERCENTILE_RE = re.compile(r"^p\d{1,2}(\.\d+)?$")
_BASE_STATISTICS = frozenset({"mean", "max", "min", "std", "sum"})


# --------------------------------------------------------------------------------------------------
# Transforms


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


# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True)
class Resolution:
    """Where one framework key goes: a registry metric, its attributes and how to convert the value."""

    metric: str
    attributes: tuple[tuple[str, str], ...]  # sorted by attribute name
    transform: Callable[[Any], float] | None  # raises ValueError naming the key and value
    framework: str | None  # framework whose rule matched; None for generic rules and fallbacks
    fallback: bool  # True for rl.unmapped / rl.telemetry.rejected
    key: str


# --------------------------------------------------------------------------------------------------
# Rules


class _RuleError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class _Part:
    literal: str | None = None  # a literal piece of the key, or
    attribute: str | None = None  # a placeholder capturing this attribute
    allowed: frozenset[str] | None = None  # values an enum placeholder accepts (None: any segment)


class _Rule:
    __slots__ = (
        "framework", "index", "line", "key", "metric", "fixed", "values", "inverse_values",
        "transform_name", "transform", "parts", "placeholders", "pattern", "groups", "excepted",
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
        self.groups: list[tuple[str, str]] = []
        for part in self.parts:
            if part.literal is not None:
                regex.append(re.escape(part.literal))
                continue
            group = f"p{len(self.groups)}"
            self.groups.append((group, part.attribute or ""))
            if part.allowed is None:
                regex.append(f"(?P<{group}>[^/]+)")
            else:
                choices = "|".join(re.escape(v) for v in sorted(part.allowed, key=lambda v: (-len(v), v)))
                regex.append(f"(?P<{group}>{choices})")
        self.pattern = re.compile("".join(regex))

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
        literal = key[pos:m.start()]
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


# --------------------------------------------------------------------------------------------------
# The resolver


class KeyResolver:
    """Maps framework keys to registry metrics by the rules of ``semconv/mappings/*.yaml``.

    ``mappings``: the parsed mapping files. ``registry_metrics``: the registry's metric names, or a
    mapping name -> definition whose ``.attributes`` (or ``["attributes"]``) lists attribute ids.
    ``enum_members``: attribute id -> member values; an enum placeholder only matches those (and its
    rule's ``values:`` rename sources).
    """

    def __init__(
        self,
        mappings: Iterable[Mapping[str, Any]],
        registry_metrics: Iterable[str] | Mapping[str, Any],
        enum_members: Mapping[str, Iterable[str]],
        *,
        metric_attributes: Mapping[str, Iterable[str]] | None = None,
        unmapped_key_limit: int = DEFAULT_UNMAPPED_KEY_LIMIT,
    ) -> None:
        self.unmapped_key_limit = int(unmapped_key_limit)
        self._metrics = frozenset(registry_metrics)
        attrs = dict(metric_attributes) if metric_attributes is not None else _attributes_of(registry_metrics)
        self._metric_attributes = {m: frozenset(a) for m, a in attrs.items()}
        self._enum_members = {k: tuple(str(v) for v in vs) for k, vs in enum_members.items()}
        self._statistics = frozenset(self._enum_members.get(_STATISTIC_ATTRIBUTE, ())) | _BASE_STATISTICS

        self._rules: dict[str, tuple[_Rule, ...]] = {}
        problems = []
        for mapping in mappings:
            framework = str(mapping.get("framework", ""))
            rules = []
            for index, raw in enumerate(mapping.get("keys") or ()):
                try:
                    rules.append(_Rule(framework, index, raw, self._enum_members))
                except (_RuleError, AttributeError, TypeError) as exc:
                    problems.append(f"{_rule_where(mapping, index, raw)}: {exc}")
            self._rules[framework] = self._rules.get(framework, ()) + tuple(rules)
        if problems:
            raise ValueError("invalid mapping rules:\n  " + "\n  ".join(problems))
        known = [f for f in FRAMEWORK_ORDER if f in self._rules] + sorted(f for f in self._rules if f not in FRAMEWORK_ORDER)
        self._frameworks = tuple(known)
        self._search: dict[str | None, tuple[_Rule, ...]] = {None: tuple(r for f in known for r in self._rules[f])}
        for first in known:
            self._search[first] = self._rules[first] + tuple(r for f in known if f != first for r in self._rules[f])

        self._cache: dict[tuple[Any, str | None], Resolution] = {}
        self._lock = threading.Lock()
        self._unmapped: set[str] = set()
        self._overflow_warned = False

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def from_directory(cls, path: str | Path, **kwargs: Any) -> KeyResolver:
        """Build from a ``semconv/`` folder: ``mappings/*.yaml`` and ``registry/*.yaml``."""
        path = Path(path)
        metrics, _attributes, enums = load_registry_tables(path / "registry")
        return cls(load_mapping_files(path / "mappings"), metrics, enums, **kwargs)

    @classmethod
    def default(cls, **kwargs: Any) -> KeyResolver:
        """Build from the generated ``otel_rl.semconv`` tables, else from the repository's YAML."""
        tables = _generated_tables()
        if tables is not None:
            mappings, metrics, enums = tables
            return cls(mappings, metrics, enums, **kwargs)
        return cls.from_directory(_SEMCONV_DIR, **kwargs)

    # -- queries -----------------------------------------------------------------------------------

    @property
    def frameworks(self) -> tuple[str, ...]:
        return self._frameworks

    @property
    def unmapped_keys(self) -> frozenset[str]:
        """Keys exported under rl.unmapped so far."""
        return frozenset(self._unmapped)

    def rules_for(self, framework: str) -> list[dict[str, Any]]:
        """The rules of ``framework`` in match order, as mapping-file dicts (for docs)."""
        return [r.as_dict() for r in self._rules.get(framework, ())]

    def resolve(self, key: str, framework: str | None = None) -> Resolution:
        """Where ``key`` goes. Never raises; unknown keys resolve to the (capped) fallback."""
        try:
            return self._cache[(key, framework)]
        except (KeyError, TypeError):
            return self._resolve_slow(key, framework)

    def to_key(self, framework: str, metric: str, attributes: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> str | None:
        """The key ``framework`` would log for ``metric`` with exactly ``attributes`` (inverse of resolve)."""
        attrs = dict(attributes.items() if isinstance(attributes, Mapping) else attributes)
        attrs = {str(k): _scalar(v) for k, v in attrs.items()}
        for rule in self._rules.get(framework, ()):
            if rule.metric == metric:
                key = rule.format(attrs)
                if key is not None:
                    return key
        return None

    # -- internals ---------------------------------------------------------------------------------

    def _resolve_slow(self, key: Any, framework: str | None) -> Resolution:
        if not isinstance(key, str) or not key:
            # Not cached: such keys may be unhashable, and a bad key is the caller's bug to count.
            return Resolution(_REJECTED_METRIC, ((_REASON_ATTRIBUTE, _BAD_KEY_REASON),), None, None, True, repr(key))
        rules = self._search.get(framework, self._search[None])
        result = self._match(rules, key, key, None)
        if result is None and key in self._metrics:
            result = Resolution(key, (), None, None, False, key)
        if result is None:
            tagged = _STAT_SUFFIX_RE.match(key)
            if tagged:
                base, stat = tagged.groups()
                result = self._match(rules, base, key, stat)
                if result is None and base in self._metrics:
                    attrs = self._with_statistic(base, {}, stat)
                    result = Resolution(base, tuple(sorted(attrs.items())), None, None, False, key)
        if result is None:
            result = self._fallback(key)
        if len(self._cache) < _CACHE_LIMIT:
            self._cache[(key, framework)] = result
        return result

    def _match(self, rules: tuple[_Rule, ...], candidate: str, key: str, stat: str | None) -> Resolution | None:
        for rule in rules:
            attrs = rule.match(candidate)
            if attrs is None:
                continue
            if stat is not None:
                attrs = self._with_statistic(rule.metric, attrs, stat)
            transform = None
            if rule.transform is not None:
                transform = _BoundTransform(rule.transform, rule.transform_name or "", key)
            return Resolution(rule.metric, tuple(sorted(attrs.items())), transform, rule.framework, False, key)
        return None

    def _with_statistic(self, metric: str, attrs: dict[str, str], stat: str) -> dict[str, str]:
        # A ROLL reducer tag (`@sum`, `@p99`) becomes rl.statistic only where the metric has that
        # attribute and the rule did not already say which statistic the key carries.
        if _STATISTIC_ATTRIBUTE in attrs or _STATISTIC_ATTRIBUTE not in self._metric_attributes.get(metric, ()):
            return attrs
        if stat in self._statistics or _PERCENTILE_RE.match(stat):
            attrs = dict(attrs)
            attrs[_STATISTIC_ATTRIBUTE] = stat
        return attrs

    def _fallback(self, key: str) -> Resolution:
        with self._lock:
            if key in self._unmapped or len(self._unmapped) < self.unmapped_key_limit:
                if key not in self._unmapped:
                    self._unmapped.add(key)
                    _LOGGER.warning(
                        "otel-rl: no mapping knows the metric key %r; it is exported as %s{%s=%r}. "
                        "To map it, add a rule to semconv/mappings/<framework>.yaml or log it under "
                        "its registry metric name.",
                        key, _UNMAPPED_METRIC, _KEY_ATTRIBUTE, key,
                    )
                return Resolution(_UNMAPPED_METRIC, ((_KEY_ATTRIBUTE, key),), None, None, True, key)
            if not self._overflow_warned:
                self._overflow_warned = True
                _LOGGER.warning(
                    "otel-rl: more than %d distinct unmapped metric keys; %r and further unmapped keys are "
                    "not exported, only counted in %s{%s=%s}. Add mappings for them.",
                    self.unmapped_key_limit, key, _REJECTED_METRIC, _REASON_ATTRIBUTE, _OVERFLOW_REASON,
                )
        return Resolution(_REJECTED_METRIC, ((_REASON_ATTRIBUTE, _OVERFLOW_REASON),), None, None, True, key)


def _attributes_of(registry_metrics: Iterable[str] | Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    if isinstance(registry_metrics, Mapping):
        for name, definition in registry_metrics.items():
            attrs = getattr(definition, "attributes", None)
            if attrs is None and isinstance(definition, Mapping):
                attrs = definition.get("attributes")
            if attrs is None and isinstance(definition, (list, tuple, set, frozenset)):
                attrs = definition
            if attrs is not None:
                out[name] = tuple(str(getattr(a, "id", a)) for a in attrs)  # ids, or refs with an .id
    return out


def _generated_tables() -> tuple[list[Mapping[str, Any]], Mapping[str, Any], Mapping[str, Iterable[str]]] | None:
    try:
        module = importlib.import_module("otel_rl.semconv")
    except ImportError:
        return None
    tables = [getattr(module, name, None) for name in ("MAPPINGS", "METRICS", "ENUM_MEMBERS")]
    if any(t is None for t in tables):
        return None
    return tables[0], tables[1], tables[2]


# --------------------------------------------------------------------------------------------------
# Loading YAML (with rule line numbers for messages)


_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML was built with it


class _LineLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    pass


def _construct_rule_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict:
    mapping = loader.construct_mapping(node, deep=True)
    if "key" in mapping and "metric" in mapping:  # a mapping rule: remember where it is
        mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_rule_mapping)


def load_mapping_files(directory: str | Path) -> list[dict[str, Any]]:
    """Parse ``<directory>/*.yaml``; rules carry ``__line__`` and each file ``__file__``.

    Raises ValueError naming the file (and line) when one is not UTF-8 YAML."""
    out = []
    for path in sorted(Path(directory).glob("*.yaml")):
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.load(fh, Loader=_LineLoader)  # noqa: S506 - a safe loader
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            raise ValueError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
        if isinstance(data, dict):
            data["__file__"] = str(path)
        out.append(data)
    return out


def load_registry_tables(directory: str | Path) -> tuple[dict[str, tuple[str, ...]], set[str], dict[str, tuple[str, ...]]]:
    """From ``registry/*.yaml``: metric name -> attribute ids, attribute ids, enum id -> member values."""
    metrics: dict[str, tuple[str, ...]] = {}
    attributes: set[str] = set()
    enums: dict[str, tuple[str, ...]] = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_SafeLoader) or {}  # noqa: S506 - a safe loader
        for group in data.get("groups") or ():
            if not isinstance(group, dict):
                continue
            refs = []
            for attr in group.get("attributes") or ():
                if not isinstance(attr, dict):
                    continue
                if "id" in attr:
                    attributes.add(str(attr["id"]))
                    kind = attr.get("type")
                    if isinstance(kind, dict) and kind.get("members"):
                        enums[str(attr["id"])] = tuple(str(m.get("value", m.get("id"))) for m in kind["members"])
                if "ref" in attr or "id" in attr:
                    refs.append(str(attr.get("ref", attr.get("id"))))
            if group.get("type") == "metric" and group.get("metric_name"):
                metrics[str(group["metric_name"])] = tuple(refs)
    return metrics, attributes, enums


# --------------------------------------------------------------------------------------------------
# Validation (used by `otel-rl semconv check`)


def validate_mappings(
    mappings: Iterable[Any],
    registry_metrics: Iterable[str] | Mapping[str, Any],
    registry_attributes: Iterable[str],
    enum_members: Mapping[str, Iterable[str]],
) -> list[str]:
    """Human-readable problems of mapping files, each naming the file, rule index and line."""
    problems: list[str] = []
    metric_names = frozenset(registry_metrics)
    metric_attrs = _attributes_of(registry_metrics)
    known_attrs = frozenset(registry_attributes)
    enums = {k: frozenset(str(v) for v in vs) for k, vs in enum_members.items()}
    frameworks: dict[str, str] = {}

    for n, mapping in enumerate(mappings):
        if not isinstance(mapping, Mapping):
            problems.append(f"mappings[{n}]: a mapping file must be a YAML mapping with `framework` and `keys`")
            continue
        framework = mapping.get("framework")
        file = mapping.get("__file__") or f"semconv/mappings/{framework}.yaml"
        if not isinstance(framework, str) or not _FRAMEWORK_RE.match(framework):
            problems.append(f"{file}: `framework` must be a lowercase name, got {framework!r}")
        elif framework in frameworks:
            problems.append(f"{file}: framework {framework!r} is also defined in {frameworks[framework]}")
        else:
            frameworks[framework] = str(file)
        if not isinstance(mapping.get("brief"), str) or not mapping.get("brief"):
            problems.append(f"{file}: `brief` (one line saying where the keys come from) is missing")
        extra = sorted(k for k in mapping if not str(k).startswith("__") and k not in ("framework", "brief", "keys"))
        if extra:
            problems.append(f"{file}: unknown top-level fields {extra}")
        rules = mapping.get("keys")
        if not isinstance(rules, list) or not rules:
            problems.append(f"{file}: `keys` must be a non-empty list of rules")
            continue
        seen_keys: dict[str, int] = {}
        for index, raw in enumerate(rules):
            where = _rule_where(mapping, index, raw)
            if not isinstance(raw, Mapping):
                problems.append(f"{where}: a rule must be a mapping with `key` and `metric`")
                continue
            problems.extend(f"{where}: {p}" for p in _rule_problems(raw, metric_names, metric_attrs, known_attrs, enums))
            key = raw.get("key")
            if isinstance(key, str):
                if key in seen_keys:
                    problems.append(f"{where}: same key as keys[{seen_keys[key]}], which always wins")
                else:
                    seen_keys[key] = index
    return problems


def _rule_problems(
    raw: Mapping[str, Any],
    metric_names: frozenset[str],
    metric_attrs: Mapping[str, tuple[str, ...]],
    known_attrs: frozenset[str],
    enums: Mapping[str, frozenset[str]],
) -> list[str]:
    out: list[str] = []
    unknown = sorted(str(k) for k in raw if not str(k).startswith("__") and k not in _RULE_FIELDS)
    if unknown:
        out.append(f"unknown fields {unknown} (allowed: {', '.join(sorted(_RULE_FIELDS))})")
    key, metric = raw.get("key"), raw.get("metric")
    if not isinstance(key, str) or not key:
        out.append("`key` must be a non-empty string")
    if not isinstance(metric, str) or not metric:
        out.append("`metric` must be a non-empty string")
    elif metric not in metric_names:
        out.append(f"unknown metric {metric!r} (not in the registry)")
    declared = metric_attrs.get(metric) if isinstance(metric, str) else None

    def check_attribute(attr: str, how: str) -> None:
        if attr in _FORBIDDEN_RULE_ATTRIBUTES:
            out.append(f"{how} attribute {attr!r} must not be set by a mapping rule")
        elif attr not in known_attrs:
            out.append(f"{how} attribute {attr!r} is not in the registry")
        elif declared is not None and attr not in declared:
            out.append(f"{how} attribute {attr!r} is not an attribute of metric {metric!r}")

    fixed = raw.get("attributes")
    if fixed is not None and not isinstance(fixed, Mapping):
        out.append("`attributes` must be a mapping attribute -> value")
        fixed = None
    for attr, value in (fixed or {}).items():
        check_attribute(str(attr), "fixed")
        if str(attr) in enums and _scalar(value) not in enums[str(attr)]:
            out.append(f"fixed attribute {attr!r}: {value!r} is not a member ({', '.join(sorted(enums[str(attr)]))})")

    values = raw.get("values")
    if values is not None and not (isinstance(values, Mapping) and all(isinstance(v, Mapping) for v in values.values())):
        out.append("`values` must map attribute -> {captured: renamed}")
        values = None

    placeholders: list[str] = []
    if isinstance(key, str) and key:
        try:
            parts = _parse_template(key, {str(a): {str(s): str(t) for s, t in r.items()} for a, r in (values or {}).items()}, {})
        except _RuleError as exc:
            out.append(str(exc))
            parts = []
        placeholders = [p.attribute for p in parts if p.attribute]
        for attr in placeholders:
            check_attribute(attr, "placeholder")
            if attr in (fixed or {}):
                out.append(f"attribute {attr!r} is both a placeholder and a fixed attribute")
        if "//" in key or key.startswith("/") or key.endswith("/"):
            out.append("key has an empty segment")

    for attr, renames in (values or {}).items():
        if str(attr) not in placeholders:
            out.append(f"`values` renames {attr!r}, which is not a placeholder of the key")
            continue
        for source, target in renames.items():
            if "/" in str(source) or not str(source):
                out.append(f"`values` source {source!r} of {attr!r} cannot be one key segment")
            if str(attr) in enums and _scalar(target) not in enums[str(attr)]:
                out.append(f"`values` target {target!r} of {attr!r} is not a member")

    excepted = raw.get("except")
    if excepted is not None and (isinstance(excepted, str) or not isinstance(excepted, (list, tuple))
                                 or not all(isinstance(k, str) for k in excepted)):
        out.append("`except` must be a list of keys")
    transform = raw.get("transform")
    if transform is not None and (not isinstance(transform, str) or transform not in TRANSFORMS):
        out.append(f"unknown transform {transform!r} (known: {', '.join(sorted(TRANSFORMS))})")
    return out
