"""Check the registry manifest (``semconv/registry/manifest.yaml``) the way weaver reads it.

weaver (open-telemetry/weaver, ``crates/weaver_semconv/src/manifest.rs``) finds a registry by its
``manifest.yaml``: a *definition* manifest names the registry and its version with ``schema_url``
(``http[s]://host/path/<version>``), may carry ``description`` and ``stability``, and lists the
registries it builds on under ``dependencies`` (each a ``schema_url`` plus the ``registry_path`` to
load it from). weaver ignores keys it does not know, so a misspelt key would be lost without a word:
this check names it. A manifest is optional for otel-rl's own tools; when present it must be one
weaver accepts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from otel_rl.codegen.registry import LINE_KEY, MANIFEST_FILES, Problem, load_yaml_with_lines

# What weaver's definition manifest reads; `name` is in weaver's documented example (it derives the
# name from schema_url and ignores the key, but keeps it readable for people).
MANIFEST_FIELDS = ("name", "description", "schema_url", "stability", "dependencies")
DEPENDENCY_FIELDS = ("name", "schema_url", "registry_path")
# weaver's Stability enum for a registry (no "experimental": that is the old name of "development").
MANIFEST_STABILITIES = ("stable", "development", "alpha", "beta", "release_candidate", "deprecated")
# Fields weaver still reads but warns about, with what replaces them.
_DEPRECATED = {
    "semconv_version": "the version is the last path segment of `schema_url`",
    "schema_base_url": "`schema_url` (base URL + version)",
}


def manifest_path(semconv_dir: Path | str) -> Path | None:
    """The manifest of ``<semconv_dir>/registry``, or None when it has none."""
    for name in MANIFEST_FILES:
        path = Path(semconv_dir) / "registry" / name
        if path.is_file():
            return path
    return None


def schema_url_problem(url: Any) -> str | None:
    """Why ``url`` is not an OTel schema URL (``http[s]://host/path/<version>``), or None."""
    if not isinstance(url, str) or not url.strip():
        return f"is not a URL: `{url}`"
    parts = urlsplit(url.rstrip("/"))
    segments = [s for s in parts.path.split("/") if s]
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"`{url}` is not an http(s) URL"
    if len(segments) < 2:
        return f"`{url}` needs a path and a version segment: http[s]://host/path/<version>"
    return None


def schema_url_version(url: str) -> str:
    """The version weaver reads from a schema URL: its last path segment."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def check_manifest(semconv_dir: Path | str) -> list[Problem]:
    """Problems with the registry manifest, as ``file:line: [rule] message``; [] when fine or absent."""
    path = manifest_path(semconv_dir)
    if path is None:
        return []
    root = Path(semconv_dir)
    rel = path.relative_to(root.parent).as_posix() if root.parent in path.parents else str(path)
    try:
        doc = load_yaml_with_lines(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return [Problem(rel, (mark.line + 1) if mark else 0, "yaml-syntax", str(exc).splitlines()[0])]
    if not isinstance(doc, dict):
        return [Problem(rel, 1, "manifest", "the manifest is a mapping (schema_url, description, stability, dependencies)")]
    problems: list[Problem] = []

    def add(line: int, rule: str, message: str) -> None:
        problems.append(Problem(rel, line, rule, message))

    top = doc.get(LINE_KEY, 1)
    for key in doc:
        if key == LINE_KEY or key in MANIFEST_FIELDS:
            continue
        if key in _DEPRECATED:
            add(top, "manifest-deprecated", f"`{key}` is deprecated in weaver: use {_DEPRECATED[key]}")
        else:
            add(top, "unknown-field", f"manifest has unknown field `{key}` (weaver reads {list(MANIFEST_FIELDS)})")
    if "schema_url" not in doc:
        add(top, "schema-url", "the manifest needs `schema_url` (http[s]://host/path/<version>), weaver's id of the registry")
    else:
        problem = schema_url_problem(doc["schema_url"])
        if problem:
            add(top, "schema-url", f"schema_url {problem}")
    if "description" in doc and not isinstance(doc["description"], str):
        add(top, "manifest", "description is text (Markdown)")
    if "stability" in doc and doc["stability"] not in MANIFEST_STABILITIES:
        add(top, "stability", f"manifest stability `{doc['stability']}` is not one of {list(MANIFEST_STABILITIES)}")
    dependencies = doc.get("dependencies", [])
    if not isinstance(dependencies, list):
        add(top, "dependencies", "dependencies is a list of {schema_url, registry_path}")
        dependencies = []
    for dep in dependencies:
        if not isinstance(dep, dict):
            add(top, "dependencies", f"a dependency is a mapping {{schema_url, registry_path}}, got `{dep}`")
            continue
        line = dep.get(LINE_KEY, top)
        label = f"dependency `{dep.get('name') or dep.get('schema_url') or '?'}`"
        for key in dep:
            if key != LINE_KEY and key not in DEPENDENCY_FIELDS:
                add(line, "unknown-field", f"{label} has unknown field `{key}` (weaver reads {list(DEPENDENCY_FIELDS)})")
        # weaver accepts a name-only dependency only in a legacy manifest (schema_base_url +
        # semconv_version); beside a schema_url it is an error.
        if "schema_url" not in dep:
            add(
                line,
                "schema-url",
                f"{label} needs `schema_url` (the dependency's id and version, e.g. https://opentelemetry.io/schemas/1.44.0)",
            )
        else:
            problem = schema_url_problem(dep["schema_url"])
            if problem:
                add(line, "schema-url", f"{label}: schema_url {problem}")
        if "registry_path" in dep and not (isinstance(dep["registry_path"], str) and dep["registry_path"].strip()):
            add(line, "dependencies", f"{label}: registry_path is a folder, archive or git URL, optionally with [sub_folder]")
    return problems
