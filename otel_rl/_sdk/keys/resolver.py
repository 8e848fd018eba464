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

The parts live beside this module: ``keys_transforms`` (value transforms), ``keys_rules`` (one
compiled rule) and ``keys_mappings`` (loading and validating the YAML); their public names are
importable from here.
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

from otel_rl._sdk.keys.mappings import _attributes_of, load_mapping_files, load_registry_tables, validate_mappings
from otel_rl._sdk.keys.rules import _Rule, _rule_where, _RuleError, _scalar
from otel_rl._sdk.keys.transforms import LINEAR_TRANSFORMS, TRANSFORMS, _BoundTransform  # noqa: F401 - re-exported

__all__ = [
    "DEFAULT_UNMAPPED_KEY_LIMIT",
    "FRAMEWORK_ORDER",
    "RESOLUTION_CACHE_LIMIT",
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

_SEMCONV_DIR = Path(__file__).resolve().parent.parent / "semconv"
# Resolutions kept per resolver: far above any real run's key count, low enough that a stream of
# unique keys (a step or a sample id inside every key) cannot grow memory without bound: past it,
# resolution still works, uncached (the screen below makes that cheap for keys no rule knows).
RESOLUTION_CACHE_LIMIT = 1 << 14

_STAT_SUFFIX_RE = re.compile(r"^(.+)@([A-Za-z0-9_.]+)$")
_PERCENTILE_RE = re.compile(r"^p\d{1,2}(\.\d+)?$")
_BASE_STATISTICS = frozenset({"mean", "max", "min", "std", "sum"})


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

    @property
    def counted_only(self) -> bool:
        """Past the unmapped-key limit: the value only counts in rl.telemetry.rejected."""
        return self.fallback and self.metric == _REJECTED_METRIC


# --------------------------------------------------------------------------------------------------
# The resolver


# How many keys no mapping knows are named one by one (see KeyResolver._say_unmapped).
NAMED_UNMAPPED = 5


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
        # Every rule's pattern in one expression: a key none of them matches (most unknown keys) is
        # ruled out by one C-level match instead of one Python call per rule (~0.5 us against ~25-90).
        every = self._search[None]
        self._screen = re.compile("|".join(f"(?:{rule.screen})" for rule in every)) if every else None

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
        if len(self._cache) < RESOLUTION_CACHE_LIMIT:
            self._cache[(key, framework)] = result
        return result

    def _match(self, rules: tuple[_Rule, ...], candidate: str, key: str, stat: str | None) -> Resolution | None:
        if self._screen is None or self._screen.fullmatch(candidate) is None:
            return None  # no rule matches it (each search order holds every rule)
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

    def _say_unmapped(self, key: str, count: int) -> None:
        """The first NAMED_UNMAPPED unknown keys are named, one line each; then one line says the rest
        are not (a run of 200,000 made-up keys printed a line for each of the first 256)."""
        if count <= NAMED_UNMAPPED:
            _LOGGER.warning(
                "otel-rl: no mapping knows the metric key %r; it is exported as %s{%s=%r}. "
                "To map it, add a rule to semconv/mappings/<framework>.yaml or log it under "
                "its registry metric name.",
                key,
                _UNMAPPED_METRIC,
                _KEY_ATTRIBUTE,
                key,
            )
        elif count == NAMED_UNMAPPED + 1:
            _LOGGER.warning(
                "otel-rl: more metric keys no mapping knows (%r, ...): each is exported as %s{%s=KEY} too, up to "
                "unmapped_key_limit=%d keys, and not named here; every key is in its step's rl.log event "
                "(otel-rl export RUN lists them as columns).",
                key,
                _UNMAPPED_METRIC,
                _KEY_ATTRIBUTE,
                self.unmapped_key_limit,
            )

    def _fallback(self, key: str) -> Resolution:
        with self._lock:
            if key in self._unmapped or len(self._unmapped) < self.unmapped_key_limit:
                if key not in self._unmapped:
                    self._unmapped.add(key)
                    self._say_unmapped(key, len(self._unmapped))
                return Resolution(_UNMAPPED_METRIC, ((_KEY_ATTRIBUTE, key),), None, None, True, key)
            if not self._overflow_warned:
                self._overflow_warned = True
                _LOGGER.warning(
                    "otel-rl: more than %d distinct unmapped metric keys; %r and further unmapped keys are "
                    "not exported, only counted in %s{%s=%s}. Add mappings for them.",
                    self.unmapped_key_limit,
                    key,
                    _REJECTED_METRIC,
                    _REASON_ATTRIBUTE,
                    _OVERFLOW_REASON,
                )
        return Resolution(_REJECTED_METRIC, ((_REASON_ATTRIBUTE, _OVERFLOW_REASON),), None, None, True, key)


def _generated_tables() -> tuple[list[Mapping[str, Any]], Mapping[str, Any], Mapping[str, Iterable[str]]] | None:
    try:
        module = importlib.import_module("otel_rl.semconv")
    except ImportError:
        return None
    mappings, metrics, enums = (getattr(module, name, None) for name in ("MAPPINGS", "METRICS", "ENUM_MEMBERS"))
    if mappings is None or metrics is None or enums is None:
        return None
    return mappings, metrics, enums
