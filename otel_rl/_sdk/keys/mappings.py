"""The mapping files (``semconv/mappings/*.yaml``) and registry tables (``semconv/registry/*.yaml``):
loading them with line numbers for messages, and validating the rules against the registry
(``otel-rl semconv check``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from otel_rl._sdk.keys.rules import _parse_template, _rule_where, _RuleError, _scalar
from otel_rl._sdk.keys.transforms import TRANSFORMS

# Attributes a mapping rule must never set: rl.step is for spans/events only, rl.key is the fallback's.
_FORBIDDEN_RULE_ATTRIBUTES = ("rl.step", "rl.key")
_RULE_FIELDS = frozenset({"key", "metric", "attributes", "values", "transform", "except"})
_FRAMEWORK_RE = re.compile(r"^[a-z][a-z0-9_]*$")


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


def _attributes_of(registry_metrics: Iterable[str] | Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Metric name -> its attribute ids, from registry definitions in any of the shapes callers pass."""
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
    if excepted is not None and (
        isinstance(excepted, str) or not isinstance(excepted, (list, tuple)) or not all(isinstance(k, str) for k in excepted)
    ):
        out.append("`except` must be a list of keys")
    transform = raw.get("transform")
    if transform is not None and (not isinstance(transform, str) or transform not in TRANSFORMS):
        out.append(f"unknown transform {transform!r} (known: {', '.join(sorted(TRANSFORMS))})")
    return out
