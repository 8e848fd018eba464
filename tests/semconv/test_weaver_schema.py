"""The registry as upstream tools read it.

- every convention file of semconv/registry validates against weaver's published JSON schema
  (../shared/reference/weaver-semconv.schema.json, open-telemetry/weaver schemas/semconv.schema.json);
- semconv/registry/manifest.yaml is the definition manifest weaver looks for (its fields checked
  the way weaver's manifest.rs reads them: weaver's own definition-manifest JSON schema describes
  `schema_url` as an object while weaver reads it as a string, so it cannot validate a real one);
- otel-rl's loader, `otel-rl semconv check` and `generate` skip or check the manifest;
- every otel-rl name in docs/semconv/rl-proposal-mapping.md is a registry name, and the generator
  leaves that hand-written page alone.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from shared_files import REFERENCE, needs_shared_reference

import otel_rl.codegen.generate as codegen
from otel_rl import cli
from otel_rl._sdk.keys.resolver import load_registry_tables
from otel_rl._version import __version__
from otel_rl.codegen.manifest import check_manifest, schema_url_version
from otel_rl.codegen.registry import MANIFEST_FILES, Registry, load_registry, registry_files

REPO = Path(__file__).resolve().parents[2]
SEMCONV = REPO / "semconv"
MANIFEST = SEMCONV / "registry" / "manifest.yaml"
MAPPING_DOC = REPO / "docs" / "semconv" / "rl-proposal-mapping.md"
SCHEMA = REFERENCE / "weaver-semconv.schema.json"

OTEL_CORE_SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
OTEL_CORE_ARCHIVE = "https://github.com/open-telemetry/semantic-conventions/archive/refs/tags/v1.44.0.zip[model]"


def _load(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _errors(validator: Draft202012Validator, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}" for e in validator.iter_errors(doc)]


# ---------------------------------------------------------------------------- weaver's JSON schema


@needs_shared_reference
@pytest.mark.parametrize("path", registry_files(SEMCONV / "registry"), ids=lambda p: p.name)
def test_registry_file_validates_against_weavers_schema(validator, path: Path) -> None:
    assert _errors(validator, _load(path)) == [], f"{path.name} does not validate against {SCHEMA.name}"


def _first_group(file: str, group_type: str) -> dict[str, Any]:
    doc = _load(SEMCONV / "registry" / file)
    return copy.deepcopy(next(g for g in doc["groups"] if g["type"] == group_type))


@needs_shared_reference
@pytest.mark.parametrize(
    ("file", "group_type", "breakage"),
    [
        ("spans.yaml", "span", lambda g: g.pop("span_kind")),
        # otel-rl's own check still accepts "experimental"; weaver's schema does not.
        ("performance.yaml", "metric", lambda g: g.update(stability="experimental")),
        ("performance.yaml", "metric", lambda g: g.pop("stability")),
        ("events.yaml", "event", lambda g: g.pop("name")),
        ("attributes.yaml", "attribute_group", lambda g: g["attributes"][0].update(type="float")),
        ("attributes.yaml", "attribute_group", lambda g: g["attributes"][0].update(requirement_level="mandatory")),
    ],
    ids=["span-without-kind", "experimental-stability", "metric-without-stability", "event-without-name", "float-type", "requirement"],
)
def test_the_schema_rejects_a_broken_copy_of_a_real_group(validator, file: str, group_type: str, breakage) -> None:
    # (The schema lets a metric group through without `unit` or with an unknown instrument: it
    # also matches the schema's generic group. otel-rl's own check covers those.)
    group = _first_group(file, group_type)
    assert _errors(validator, {"groups": [group]}) == []
    breakage(group)
    assert _errors(validator, {"groups": [group]}) != []


@needs_shared_reference
def test_the_manifest_is_not_a_convention_file(validator) -> None:
    # Why every loader must skip it: as a convention file it is invalid (no `groups:`, other keys).
    assert _errors(validator, _load(MANIFEST)) != []


# ---------------------------------------------------------------------------- the manifest


def test_manifest_is_the_definition_manifest_weaver_reads() -> None:
    doc = _load(MANIFEST)
    assert doc["schema_url"] == f"https://github.com/otel-rl/otel-rl/schemas/{__version__}"
    assert schema_url_version(doc["schema_url"]) == __version__  # bump the manifest with the package
    assert doc["stability"] == "development"
    assert isinstance(doc["description"], str) and doc["description"].strip()
    # A definition manifest has no file_format (that marks weaver's publication manifest) and no
    # deprecated semconv_version / schema_base_url (weaver warns about them).
    assert not {"file_format", "semconv_version", "schema_base_url"} & set(doc)
    assert doc["dependencies"] == [{"name": "otel", "schema_url": OTEL_CORE_SCHEMA_URL, "registry_path": OTEL_CORE_ARCHIVE}]
    assert check_manifest(SEMCONV) == []


def _semconv_copy(tmp_path: Path) -> Path:
    shutil.copytree(SEMCONV, tmp_path / "semconv", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "semconv"


MANIFEST_BREAKAGES = {
    # The form weaver accepts only in a legacy (schema_base_url + semconv_version) manifest.
    "name-only-dependency": (
        lambda d: d.update(dependencies=[{"name": "otel", "registry_path": OTEL_CORE_ARCHIVE}]),
        "[schema-url] dependency `otel` needs `schema_url`",
    ),
    "no-schema-url": (lambda d: d.pop("schema_url"), "[schema-url] the manifest needs `schema_url`"),
    "no-version-segment": (
        lambda d: d.update(schema_url="https://github.com"),
        "[schema-url] schema_url `https://github.com` needs a path",
    ),
    "not-http": (lambda d: d.update(schema_url="otel-rl/0.1.0"), "[schema-url] schema_url `otel-rl/0.1.0` is not an http(s) URL"),
    "deprecated-field": (lambda d: d.update(semconv_version="0.1.0"), "[manifest-deprecated] `semconv_version` is deprecated"),
    "misspelt-field": (lambda d: d.update(dependancies=d.pop("dependencies")), "[unknown-field] manifest has unknown field `dependancies`"),
    "stability": (lambda d: d.update(stability="experimental"), "[stability] manifest stability `experimental`"),
    "dependency-field": (lambda d: d["dependencies"][0].update(version="1.44.0"), "[unknown-field] dependency `otel` has unknown field"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_BREAKAGES))
def test_semconv_check_reports_a_manifest_weaver_would_reject(tmp_path: Path, capsys, case: str) -> None:
    semconv = _semconv_copy(tmp_path)
    doc = _load(semconv / "registry" / "manifest.yaml")
    breakage, expected = MANIFEST_BREAKAGES[case]
    breakage(doc)
    (semconv / "registry" / "manifest.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    rc = cli.main(["semconv", "check", "--registry", str(semconv)])
    _, err = capsys.readouterr()
    assert rc == 1
    assert "semconv/registry/manifest.yaml:" in err and expected in err, err


@pytest.mark.parametrize("name", MANIFEST_FILES)
def test_loader_check_and_generate_skip_the_manifest(tmp_path: Path, capsys, name: str) -> None:
    semconv = _semconv_copy(tmp_path)
    if name != "manifest.yaml":  # weaver's legacy file name is skipped the same way
        (semconv / "registry" / "manifest.yaml").rename(semconv / "registry" / name)
    registry = load_registry(semconv)
    assert [str(p) for p in registry.problems] == []
    assert not any(Path(g.file).name in MANIFEST_FILES for g in registry.groups)
    assert name not in {p.name for p in registry_files(semconv / "registry")}
    # The runtime's registry tables read the same folder: the manifest adds nothing to them.
    assert load_registry_tables(semconv / "registry") == load_registry_tables(SEMCONV / "registry")
    assert cli.main(["semconv", "check", "--registry", str(semconv)]) == 0
    _, files = codegen.generate(tmp_path, semconv)
    assert not any("manifest" in f.path.as_posix() for f in files)
    capsys.readouterr()


# ---------------------------------------------------------------------------- the proposal mapping

# `rl.stage=generate`: an attribute and one of its values.
_ATTR_VALUE_RE = re.compile(r"^([a-z0-9_.]+)=([a-z0-9_]+)$")


def _span_names(registry: Registry) -> set[str]:
    """Span names, with each `rl.<x>` template expanded over the values of its enum attribute."""
    names: set[str] = set()
    for g in registry.groups:
        if g.type != "span":
            continue
        template = str(g.otel_rl.get("span_name") or g.id.removeprefix("span."))
        match = re.fullmatch(r"(.*)<([a-z_]+)>", template)
        if not match:
            names.add(template)
            continue
        prefix, slot = match.groups()
        for ref in g.attributes:
            attribute = registry.attributes.get(ref.id)
            if attribute and attribute.members and ref.id.split(".")[-1] == slot:
                names.update(prefix + m.value for m in attribute.members)
    return names


def unknown_names(tokens: list[str], registry: Registry) -> list[str]:
    """The tokens that are not a metric, attribute, attribute=value, span or event of ``registry``."""
    events = {g.name for g in registry.groups if g.type == "event" and g.name}
    known = set(registry.metrics) | set(registry.attributes) | _span_names(registry) | events
    enums = registry.enum_members()
    out = []
    for token in tokens:
        match = _ATTR_VALUE_RE.match(token)
        if match:
            if match.group(2) not in enums.get(match.group(1), ()):
                out.append(token)
        elif token not in known:
            out.append(token)
    return out


def mapping_rows(text: str) -> list[tuple[str, list[str]]]:
    """(proposal name cell, otel-rl names) of each row of the mapping table."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[2])))
    return rows


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry(SEMCONV)


def test_every_otel_rl_name_in_the_proposal_mapping_is_a_registry_name(registry: Registry) -> None:
    rows = mapping_rows(MAPPING_DOC.read_text(encoding="utf-8"))
    proposal = " ".join(cell for cell, _ in rows)
    # The proposal's spans, durations and loss (seed: ../shared/reference/README.md) are all mapped.
    for name in ("rl.loop", "rl.sample", "rl.reward", "rl.train", "rl.sync", "rl.sync.duration", "rl.train.loss", "rl.loss.type"):
        assert f"`{name}`" in proposal, f"{name} has no row in {MAPPING_DOC.name}"
    names = [token for _, tokens in rows for token in tokens]
    assert len(names) >= 15
    assert unknown_names(names, registry) == []


def test_the_mapping_check_catches_a_name_the_registry_lacks(registry: Registry) -> None:
    text = "| `rl.loop` | span | `rl.iteration`, `rl.stage=sampling`, `rl.step.duration` | renamed |"
    assert unknown_names(mapping_rows(text)[0][1], registry) == ["rl.iteration", "rl.stage=sampling"]


def test_generate_leaves_the_hand_written_mapping_page_alone(tmp_path: Path, capsys) -> None:
    _semconv_copy(tmp_path)
    shutil.copytree(REPO / "otel_rl" / "semconv", tmp_path / "otel_rl" / "semconv", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "docs" / "semconv", tmp_path / "docs" / "semconv")
    page = tmp_path / "docs" / "semconv" / MAPPING_DOC.name
    before = page.read_bytes()
    _, files = codegen.generate(tmp_path)
    assert codegen.stale_files(tmp_path, files) == []
    assert cli.main(["semconv", "generate", "--registry", str(tmp_path / "semconv")]) == 0
    assert cli.main(["semconv", "generate", "--check", "--registry", str(tmp_path / "semconv")]) == 0
    out, _ = capsys.readouterr()
    assert MAPPING_DOC.name not in out
    assert page.read_bytes() == before
