"""Load the semantic-convention registry (semconv/registry/*.yaml) and check it.

The registry is written in OpenTelemetry's semantic-convention registry format; this module
reads it with line numbers so every problem can be reported as ``file:line: [rule] message``,
the way OTel's own tooling reports them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LINE_KEY = "__line__"

GROUP_TYPES = {"attribute_group", "metric", "span", "event", "entity"}
INSTRUMENTS = {"counter", "updowncounter", "gauge", "histogram"}
STABILITIES = {"stable", "development", "experimental", "deprecated", "release_candidate", "alpha", "beta"}
REQUIREMENT_LEVELS = {"required", "recommended", "opt_in", "conditionally_required"}
PRIMITIVE_TYPES = {"string", "int", "double", "boolean", "any", "string[]", "int[]", "double[]", "boolean[]"}
GROUP_FIELDS = {
    "id",
    "type",
    "brief",
    "note",
    "stability",
    "attributes",
    "metric_name",
    "instrument",
    "unit",
    "display_name",
    "span_kind",
    "name",
    "annotations",
    "extends",
    "deprecated",
    "body",
    "entity_associations",
    "events",
    "prefix",
}
ATTRIBUTE_FIELDS = {
    "id",
    "ref",
    "type",
    "brief",
    "note",
    "stability",
    "examples",
    "requirement_level",
    "deprecated",
    "sampling_relevant",
    "annotations",
    "tag",
}
# Namespaces otel-rl may declare: its own, plus upstream names it reuses (documented as such).
NAMESPACES = ("rl.", "hw.", "process.", "gen_ai.", "host.", "server.", "service.", "telemetry.", "error.")
HISTOGRAM_BUCKET_SETS = ("duration", "tokens", "signed", "ratio", "count")
DIRECTIONS = ("higher", "lower", "range")
# Which ranks of a multi-rank job export a metric (see docs/overhead.md, "The series budget"):
# copy (the default) - the same job-level value on every rank: the lead rank's only;
# own - each rank's own state (its GPU, its process, its stage time): every rank;
# share - each rank's part of the job's observations (samples, trajectories, engines): every rank.
RANK_SCOPES = ("copy", "own", "share")
DANGER_FIELDS = ("above", "below", "why")
SCALE_FIELDS = ("notable", "relative_to", "why")
# Settings a scale may be stated in units of (the analyzer reads them from the log, with a default).
SCALE_SETTINGS = ("grad_clip",)
# weaver's registry manifest (and its legacy name) sit beside the convention files; they describe
# the registry (schema_url, dependencies), hold no groups, and weaver skips them when loading groups.
MANIFEST_FILES = ("manifest.yaml", "registry_manifest.yaml")

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
MEMBER_ID_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# Words that put a unit into a metric name; the unit belongs in `unit:` (Prometheus adds the suffix).
UNIT_WORDS = {
    "seconds",
    "second",
    "secs",
    "sec",
    "ms",
    "millis",
    "milliseconds",
    "us",
    "ns",
    "minutes",
    "bytes",
    "byte",
    "kb",
    "mb",
    "gb",
    "gib",
    "mib",
    "kib",
    "percent",
    "pct",
    "total",
}

# UCUM: atoms otel-rl accepts, with metric prefixes; annotations in braces.
_UCUM_ATOMS = {"s", "min", "h", "d", "By", "bit", "W", "J", "Cel", "K", "Hz", "1", "%", "B", "V", "A"}
_UCUM_PREFIXES = ("", "k", "M", "G", "T", "m", "u", "n", "Ki", "Mi", "Gi", "Ti")
_UCUM_TERM_RE = re.compile(r"^(?:\{[^{}\s]+\}|[A-Za-z%]+|1)(?:\^?-?\d+)?$")


def is_ucum(unit: str) -> bool:
    """True when ``unit`` is a UCUM expression of known atoms and ``{annotations}``."""
    if not unit or unit.strip() != unit:
        return False
    for term in re.split(r"[./]", unit):
        if not _UCUM_TERM_RE.match(term):
            return False
        if term.startswith("{"):
            continue
        atom = re.sub(r"\^?-?\d+$", "", term) or term
        if atom == "1":
            continue
        if not any(atom.startswith(p) and atom[len(p) :] in _UCUM_ATOMS for p in _UCUM_PREFIXES):
            return False
    return True


class _LineLoader(yaml.SafeLoader):
    """A safe loader that records the 1-based line of every mapping under ``__line__``."""


def _construct_mapping_with_line(loader: _LineLoader, node: yaml.MappingNode) -> dict:
    mapping = loader.construct_mapping(node, deep=True)
    mapping[LINE_KEY] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_with_line)


def load_yaml_with_lines(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass


def strip_lines(value: Any) -> Any:
    """Remove the ``__line__`` bookkeeping from a loaded document."""
    if isinstance(value, dict):
        return {k: strip_lines(v) for k, v in value.items() if k != LINE_KEY}
    if isinstance(value, list):
        return [strip_lines(v) for v in value]
    return value


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: [{self.rule}] {self.message}"


@dataclass
class Member:
    id: str
    value: str
    brief: str


@dataclass
class Attribute:
    id: str
    type: str  # a primitive type name, or "enum"
    brief: str
    note: str
    stability: str
    members: list[Member]
    examples: list[Any]
    file: str
    line: int


@dataclass
class AttributeRef:
    id: str
    requirement_level: str


@dataclass
class Group:
    id: str
    type: str
    brief: str
    note: str
    stability: str
    file: str
    line: int
    attributes: list[AttributeRef] = field(default_factory=list)
    metric_name: str | None = None
    instrument: str | None = None
    unit: str | None = None
    name: str | None = None  # event name / span name
    display_name: str | None = None
    annotations: dict[str, Any] = field(default_factory=dict)

    @property
    def otel_rl(self) -> dict[str, Any]:
        return self.annotations.get("otel_rl", {}) or {}


@dataclass
class Registry:
    root: Path
    groups: list[Group]
    attributes: dict[str, Attribute]
    problems: list[Problem]

    @property
    def metrics(self) -> dict[str, Group]:
        return {g.metric_name: g for g in self.groups if g.type == "metric" and g.metric_name}

    def groups_in(self, file: str) -> list[Group]:
        return [g for g in self.groups if g.file == file]

    @property
    def files(self) -> list[str]:
        return sorted({g.file for g in self.groups} | {a.file for a in self.attributes.values()})

    def enum_members(self) -> dict[str, tuple[str, ...]]:
        return {a.id: tuple(m.value for m in a.members) for a in self.attributes.values() if a.type == "enum"}


def _requirement(raw: Any) -> str:
    if isinstance(raw, dict):
        return next((k for k in raw if k != LINE_KEY), "")
    return str(raw or "recommended")


def registry_files(registry_dir: Path) -> list[Path]:
    """The convention files of ``registry_dir`` (``*.yaml``), sorted, without the registry manifest."""
    return sorted(p for p in Path(registry_dir).glob("*.yaml") if p.name not in MANIFEST_FILES)


def load_registry(semconv_dir: Path | str) -> Registry:
    """Parse ``<semconv_dir>/registry/*.yaml``, run every check, and return the model plus problems."""
    root = Path(semconv_dir)
    registry_dir = root / "registry"
    problems: list[Problem] = []
    groups: list[Group] = []
    attributes: dict[str, Attribute] = {}
    files = registry_files(registry_dir)
    if not files:
        problems.append(Problem(str(registry_dir), 0, "no-files", "no *.yaml registry files found"))
    for path in files:
        rel = path.relative_to(root.parent).as_posix() if root.parent in path.parents else str(path)
        try:
            doc = load_yaml_with_lines(path)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problems.append(Problem(rel, (mark.line + 1) if mark else 0, "yaml-syntax", str(exc).splitlines()[0]))
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
            problems.append(Problem(rel, 1, "schema", "a registry file is a mapping with a `groups:` list"))
            continue
        for raw in doc["groups"]:
            group = _parse_group(raw, rel, problems, attributes)
            if group is not None:
                groups.append(group)
    registry = Registry(root=root, groups=groups, attributes=attributes, problems=problems)
    problems.extend(_cross_checks(registry))
    return registry


def _parse_group(raw: Any, file: str, problems: list[Problem], attributes: dict[str, Attribute]) -> Group | None:
    if not isinstance(raw, dict):
        problems.append(Problem(file, 0, "schema", f"group must be a mapping, got {type(raw).__name__}"))
        return None
    line = raw.get(LINE_KEY, 0)
    gid = str(raw.get("id", ""))
    where = f"group `{gid}`" if gid else "group"
    for key in raw:
        if key != LINE_KEY and key not in GROUP_FIELDS:
            problems.append(Problem(file, line, "unknown-field", f"{where} has unknown field `{key}`"))
    if not gid:
        problems.append(Problem(file, line, "id-required", "group has no `id`"))
    gtype = str(raw.get("type", ""))
    if gtype not in GROUP_TYPES:
        problems.append(Problem(file, line, "group-type", f"{where}: type `{gtype}` is not one of {sorted(GROUP_TYPES)}"))
    group = Group(
        id=gid,
        type=gtype,
        brief=str(raw.get("brief") or "").strip(),
        note=str(raw.get("note") or "").strip(),
        stability=str(raw.get("stability") or ""),
        file=file,
        line=line,
        metric_name=raw.get("metric_name"),
        instrument=raw.get("instrument"),
        unit=raw.get("unit"),
        name=raw.get("name"),
        display_name=raw.get("display_name"),
        annotations=strip_lines(raw.get("annotations") or {}),
    )
    if not group.brief:
        problems.append(Problem(file, line, "brief-required", f"{where} has no brief"))
    if group.stability not in STABILITIES:
        problems.append(Problem(file, line, "stability", f"{where}: stability `{group.stability}` is not one of {sorted(STABILITIES)}"))
    for raw_attr in raw.get("attributes") or []:
        if not isinstance(raw_attr, dict):
            problems.append(Problem(file, line, "schema", f"{where}: attribute entries are mappings"))
            continue
        aline = raw_attr.get(LINE_KEY, line)
        for key in raw_attr:
            if key != LINE_KEY and key not in ATTRIBUTE_FIELDS:
                problems.append(Problem(file, aline, "unknown-field", f"attribute in {where} has unknown field `{key}`"))
        level = _requirement(raw_attr.get("requirement_level"))
        if level not in REQUIREMENT_LEVELS:
            problems.append(
                Problem(file, aline, "requirement-level", f"requirement_level `{level}` is not one of {sorted(REQUIREMENT_LEVELS)}")
            )
        if "ref" in raw_attr:
            group.attributes.append(AttributeRef(str(raw_attr["ref"]), level))
            continue
        attribute = _parse_attribute(raw_attr, file, aline, problems)
        if attribute is None:
            continue
        if attribute.id in attributes:
            first = attributes[attribute.id]
            problems.append(
                Problem(file, aline, "unique-id", f"attribute `{attribute.id}` is already defined at {first.file}:{first.line}")
            )
        else:
            attributes[attribute.id] = attribute
        group.attributes.append(AttributeRef(attribute.id, level))
    return group


def _parse_attribute(raw: dict, file: str, line: int, problems: list[Problem]) -> Attribute | None:
    aid = str(raw.get("id", ""))
    if not aid:
        problems.append(Problem(file, line, "id-required", "attribute has neither `id` nor `ref`"))
        return None
    if not NAME_RE.match(aid):
        problems.append(Problem(file, line, "name-format", f"attribute `{aid}` is not lowercase dotted (a-z, 0-9, _ between dots)"))
    brief = str(raw.get("brief") or "").strip()
    if not brief:
        problems.append(Problem(file, line, "brief-required", f"attribute `{aid}` has no brief"))
    stability = str(raw.get("stability") or "")
    if stability not in STABILITIES:
        problems.append(Problem(file, line, "stability", f"attribute `{aid}`: stability `{stability}` is not one of {sorted(STABILITIES)}"))
    rtype = raw.get("type")
    members: list[Member] = []
    if isinstance(rtype, dict):
        type_name = "enum"
        seen: set[str] = set()
        raw_members = rtype.get("members")
        if not isinstance(raw_members, list) or not raw_members:
            problems.append(Problem(file, line, "enum-members", f"enum attribute `{aid}` needs a non-empty `members` list"))
            raw_members = []
        for m in raw_members:
            mline = m.get(LINE_KEY, line) if isinstance(m, dict) else line
            if not isinstance(m, dict) or "id" not in m or "value" not in m:
                problems.append(Problem(file, mline, "enum-members", f"member of `{aid}` needs `id` and `value`"))
                continue
            mid = str(m["id"])
            if not MEMBER_ID_RE.match(mid):
                problems.append(Problem(file, mline, "name-format", f"member id `{mid}` of `{aid}` is not lowercase snake_case"))
            if mid in seen:
                problems.append(Problem(file, mline, "unique-id", f"member `{mid}` of `{aid}` is defined twice"))
            seen.add(mid)
            members.append(Member(mid, str(m["value"]), str(m.get("brief") or "").strip()))
    else:
        type_name = str(rtype or "")
        if type_name not in PRIMITIVE_TYPES and not type_name.startswith("template["):
            problems.append(
                Problem(
                    file,
                    line,
                    "attribute-type",
                    f"attribute `{aid}`: type `{type_name}` is not one of {sorted(PRIMITIVE_TYPES)} or an enum",
                )
            )
    return Attribute(
        id=aid,
        type=type_name,
        brief=brief,
        note=str(raw.get("note") or "").strip(),
        stability=stability,
        members=members,
        examples=list(raw.get("examples") or [])
        if isinstance(raw.get("examples"), list)
        else ([raw["examples"]] if "examples" in raw else []),
        file=file,
        line=line,
    )


def _cross_checks(registry: Registry) -> Iterable[Problem]:
    seen_groups: dict[str, Group] = {}
    seen_metrics: dict[str, Group] = {}
    for g in registry.groups:
        if g.id in seen_groups:
            first = seen_groups[g.id]
            yield Problem(g.file, g.line, "unique-id", f"group id `{g.id}` is already used at {first.file}:{first.line}")
        seen_groups.setdefault(g.id, g)
        for ref in g.attributes:
            if ref.id not in registry.attributes:
                yield Problem(g.file, g.line, "attribute-ref", f"group `{g.id}` references unknown attribute `{ref.id}`")
        if g.type == "metric":
            yield from _check_metric(g, seen_metrics)
        elif g.type == "event" and not g.name:
            yield Problem(g.file, g.line, "event-name", f"event group `{g.id}` needs `name`")
    for attr in registry.attributes.values():
        if not attr.id.startswith(NAMESPACES):
            yield Problem(
                attr.file,
                attr.line,
                "namespace",
                f"attribute `{attr.id}` is outside the rl. namespace and the reused upstream ones {NAMESPACES}",
            )


def _check_metric(g: Group, seen: dict[str, Group]) -> Iterable[Problem]:
    name = g.metric_name or ""
    if not name:
        yield Problem(g.file, g.line, "metric-name", f"metric group `{g.id}` has no metric_name")
        return
    if name in seen:
        first = seen[name]
        yield Problem(g.file, g.line, "unique-id", f"metric `{name}` is already defined at {first.file}:{first.line}")
    seen.setdefault(name, g)
    if not NAME_RE.match(name):
        yield Problem(g.file, g.line, "name-format", f"metric `{name}` is not lowercase dotted")
    if not name.startswith(NAMESPACES):
        yield Problem(g.file, g.line, "namespace", f"metric `{name}` is outside the rl. namespace and the reused upstream ones")
    if g.id != f"metric.{name}":
        yield Problem(g.file, g.line, "metric-group-id", f"metric group id `{g.id}` should be `metric.{name}`")
    words = set(re.split(r"[._]", name))
    carried = sorted(words & UNIT_WORDS)
    if carried:
        yield Problem(g.file, g.line, "unit-in-name", f"metric `{name}` carries a unit word {carried} in its name; put it in `unit:`")
    if g.instrument not in INSTRUMENTS:
        yield Problem(g.file, g.line, "instrument", f"metric `{name}`: instrument `{g.instrument}` is not one of {sorted(INSTRUMENTS)}")
    if g.unit is None or not is_ucum(str(g.unit)):
        yield Problem(
            g.file, g.line, "unit-ucum", f"metric `{name}`: unit `{g.unit}` is not a UCUM unit (e.g. s, By, 1, {{token}}, {{token}}/s)"
        )
    if any(ref.id == "rl.step" for ref in g.attributes):
        yield Problem(
            g.file,
            g.line,
            "high-cardinality",
            f"metric `{name}` must not carry rl.step as an attribute (one series per step); steps belong on spans and events",
        )
    if g.instrument == "histogram" and g.otel_rl.get("buckets") not in HISTOGRAM_BUCKET_SETS:
        yield Problem(
            g.file, g.line, "histogram-buckets", f"histogram `{name}` needs annotations.otel_rl.buckets, one of {HISTOGRAM_BUCKET_SETS}"
        )
    direction = g.otel_rl.get("direction")
    if direction is not None and direction not in DIRECTIONS:
        yield Problem(g.file, g.line, "direction", f"metric `{name}`: direction `{direction}` is not one of {DIRECTIONS}")
    ranks = g.otel_rl.get("ranks", "copy")
    if ranks not in RANK_SCOPES:
        yield Problem(g.file, g.line, "ranks", f"metric `{name}`: ranks `{ranks}` is not one of {RANK_SCOPES}")
    floor = g.otel_rl.get("floor")
    if floor is not None and not (_is_number(floor) and floor > 0):
        yield Problem(
            g.file,
            g.line,
            "floor",
            f"metric `{name}`: floor `{floor}` is not a positive number (the smallest "
            "change of the metric that can matter; write 0.001, not 1e-3, which YAML reads as text)",
        )
    danger = g.otel_rl.get("danger")
    if danger is not None:
        problem = _danger_problem(danger)
        if problem:
            yield Problem(g.file, g.line, "danger", f"metric `{name}`: danger {problem}")
    scale = g.otel_rl.get("scale")
    if scale is not None:
        problem = _scale_problem(scale)
        if problem:
            yield Problem(g.file, g.line, "scale", f"metric `{name}`: scale {problem}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scale_problem(scale: Any) -> str | None:
    """Why ``scale`` is not ``{notable: X, [relative_to: SETTING,] why: ...}``, or None."""
    if not isinstance(scale, dict):
        return f"is a mapping {{notable: X, why: ...}}, got `{scale}`"
    unknown = sorted(set(scale) - set(SCALE_FIELDS))
    if unknown:
        return f"has unknown field(s) {unknown}; known: {list(SCALE_FIELDS)}"
    if not (_is_number(scale.get("notable")) and scale["notable"] > 0):
        return f"`notable` is not a positive number: `{scale.get('notable')}`"
    if "relative_to" in scale and scale["relative_to"] not in SCALE_SETTINGS:
        return f"`relative_to` is `{scale['relative_to']}`; known: {list(SCALE_SETTINGS)}"
    why = scale.get("why")
    if not isinstance(why, str) or not why.strip():
        return "needs `why`: one sentence saying why a move below that level is information, not an alarm"
    return None


def _danger_problem(danger: Any) -> str | None:
    """Why ``danger`` is not ``{above: X, why: ...}`` or ``{below: X, why: ...}``, or None."""
    if not isinstance(danger, dict):
        return f"is a mapping {{above: X, why: ...}} or {{below: X, why: ...}}, got `{danger}`"
    unknown = sorted(set(danger) - set(DANGER_FIELDS))
    if unknown:
        return f"has unknown field(s) {unknown}; known: {list(DANGER_FIELDS)}"
    bounds = [k for k in ("above", "below") if k in danger]
    if len(bounds) != 1:
        return "needs exactly one of `above` or `below`"
    if not _is_number(danger[bounds[0]]):
        return f"`{bounds[0]}` is not a number: `{danger[bounds[0]]}`"
    why = danger.get("why")
    if not isinstance(why, str) or not why.strip():
        return "needs `why`: one sentence saying what the threshold means and where it comes from"
    return None
