"""Checks of Grafana dashboards with real tools: Grafana's own TypeScript schema (npm
``@grafana/schema`` with ``tsc``) and Prometheus' own PromQL parser (``promtool``).

The npm packages are installed once into a git-ignored folder (``.stack/npm/...``) and reused;
promtool comes from the Debian package ``otel-rl stack`` installs (found in ``.stack`` or installed
there through the stack's installer).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
# The Grafana that deploy/docker-compose.yml runs (tests/grafana checks they agree).
GRAFANA_SCHEMA_VERSION = "11.6.0"
# The newest Grafana 12 release: the boards (built for 11.6) must type-check against its schema too.
GRAFANA_12_SCHEMA_VERSION = "12.4.11"
TYPESCRIPT_VERSION = "5.8.3"

_COMPOSABLE = "@grafana/schema/dist/esm/raw/composable"
# Panel kinds the boards use -> the module with that panel plugin's Options / FieldConfig types.
PANEL_TYPES = {
    "timeseries": f"{_COMPOSABLE}/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen",
    "stat": f"{_COMPOSABLE}/stat/panelcfg/x/StatPanelCfg_types.gen",
    "bargauge": f"{_COMPOSABLE}/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen",
    "heatmap": f"{_COMPOSABLE}/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen",
}
PANELS_WITHOUT_CUSTOM = {"stat", "bargauge"}  # these plugins define no custom field config

# Dashboard JSON writes enums as their values ("palette-classic"); Grafana's types declare TypeScript
# enums. Json<T> maps every string enum to the union of its values and leaves everything else as
# declared, so a wrong enum value, a wrong type, a missing required field or an unknown key fails.
TS_PREAMBLE = """\
import type { Dashboard, DataQuery, FieldConfig, FieldConfigSource, Panel, RowPanel } from '@grafana/schema';
{imports}

type Json<T> = T extends string ? `${T}`
  : T extends ReadonlyArray<infer U> ? Json<U>[]
  : T extends object ? { [K in keyof T]: Json<T[K]> }
  : T;

// The Prometheus query model (Grafana's Prometheus data source: dataquery.gen.ts), which
// @grafana/schema does not ship. A type literal, not an interface: a panel's targets are
// Record<string, unknown> in the schema, which only type literals satisfy.
type PrometheusQuery = Json<DataQuery> & {
  expr: string;
  legendFormat?: string;
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  format?: 'time_series' | 'table' | 'heatmap';
  editorMode?: 'code' | 'builder';
  interval?: string;
  intervalFactor?: number;
};

type Typed<K extends string, O, F> = Omit<Json<Panel>, 'type' | 'options' | 'fieldConfig' | 'targets'> & {
  type: K;
  options: Json<O>;
  fieldConfig: { defaults: Omit<Json<FieldConfig>, 'custom'> & { custom?: Json<F> }; overrides: Json<FieldConfigSource['overrides']> };
  targets: PrometheusQuery[];
};
"""


# --------------------------------------------------------------------------------------------
# TypeScript: Grafana's schema


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def schema_toolchain(root: Path | None = None, schema_version: str = GRAFANA_SCHEMA_VERSION) -> Path:
    """A folder with @grafana/schema (of ``schema_version``) and typescript installed (npm, once; then reused)."""
    given = os.environ.get("OTEL_RL_GRAFANA_SCHEMA_DIR") if schema_version == GRAFANA_SCHEMA_VERSION else None
    folder = root or Path(given or REPO_ROOT / ".stack" / "npm" / f"grafana-schema-{schema_version}_typescript-{TYPESCRIPT_VERSION}")
    packages = (f"@grafana/schema@{schema_version}", f"typescript@{TYPESCRIPT_VERSION}")
    if _installed(folder, schema_version):
        return folder
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed: the Grafana schema check needs Node.js and npm")
    with _locked(folder.parent / f".{folder.name}.lock"):
        if not _installed(folder, schema_version):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "package.json").write_text('{"private": true}\n', encoding="utf-8")
            done = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", *packages], cwd=folder, capture_output=True, text=True, timeout=600
            )
            if done.returncode != 0 or not _installed(folder, schema_version):
                raise RuntimeError(f"npm install {' '.join(packages)} failed in {folder}:\n{done.stdout}\n{done.stderr}")
    return folder


def _installed(folder: Path, schema_version: str) -> bool:
    def version(package: str) -> str | None:
        manifest = folder / "node_modules" / package / "package.json"
        return json.loads(manifest.read_text(encoding="utf-8")).get("version") if manifest.is_file() else None

    return version("@grafana/schema") == schema_version and version("typescript") == TYPESCRIPT_VERSION


def _alias(kind: str) -> str:
    return re.sub(r"\W", "_", kind)


def dashboard_ts(board: Mapping[str, Any]) -> str:
    """A TypeScript module declaring the dashboard with Grafana's types: one typed const per panel."""
    kinds = sorted({p["type"] for p in board.get("panels", []) if p["type"] != "row"})
    unknown = [k for k in kinds if k not in PANEL_TYPES]
    if unknown:
        raise ValueError(f"no Grafana schema module known for panel type(s) {unknown}; add them to PANEL_TYPES")
    imports = "\n".join(f"import type * as {_alias(k)} from '{PANEL_TYPES[k]}';" for k in kinds)
    lines = [TS_PREAMBLE.replace("{imports}", imports)]
    names = []
    for i, panel in enumerate(board.get("panels", [])):
        name = f"panel{i + 1}"
        names.append(name)
        kind = panel["type"]
        if kind == "row":
            declared = "Json<RowPanel>"
        else:
            custom = "never" if kind in PANELS_WITHOUT_CUSTOM else f"{_alias(kind)}.FieldConfig"
            declared = f"Typed<'{kind}', {_alias(kind)}.Options, {custom}>"
        lines.append(f"// {kind}: {panel.get('title', '')!r}\nconst {name}: {declared} = {json.dumps(panel, indent=2)};\n")
    rest = {k: v for k, v in board.items() if k != "panels"}
    body = json.dumps(rest, indent=2)
    lines.append(f'export const dashboard: Json<Dashboard> = {{\n  "panels": [{", ".join(names)}],\n{body[2:]};\n')
    return "\n".join(lines)


def typecheck(
    boards: Mapping[str, Mapping[str, Any]], toolchain: Path | None = None, schema_version: str = GRAFANA_SCHEMA_VERSION
) -> dict[str, list[str]]:
    """Run ``tsc --noEmit --strict`` over one .ts file per dashboard; return the errors per dashboard name."""
    folder = toolchain or schema_toolchain(schema_version=schema_version)
    with tempfile.TemporaryDirectory(dir=folder, prefix="check-") as tmp:  # inside: node_modules resolves
        files = {}
        for name, board in boards.items():
            path = Path(tmp) / f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)}.ts"
            path.write_text(dashboard_ts(board), encoding="utf-8")
            files[path.name] = name
        done = subprocess.run(
            [
                "node",
                str(folder / "node_modules" / "typescript" / "bin" / "tsc"),
                "--noEmit",
                "--strict",
                "--skipLibCheck",
                "--target",
                "es2022",
                "--module",
                "commonjs",
                "--moduleResolution",
                "node",
                "--pretty",
                "false",
                *sorted(files),
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=300,
        )
        errors: dict[str, list[str]] = {name: [] for name in boards}
        for line in (done.stdout + done.stderr).splitlines():
            found = re.match(r"^(\S+?\.ts)\(\d+,\d+\): error", line)
            if found and found.group(1) in files:
                errors[files[found.group(1)]].append(line)
            elif line.strip() and not line.startswith(" "):
                errors.setdefault("(tsc)", []).append(line)
        if done.returncode != 0 and not any(errors.values()):
            errors["(tsc)"] = [f"tsc exited {done.returncode}: {done.stdout}{done.stderr}"]
        return errors


# --------------------------------------------------------------------------------------------
# promtool: Prometheus' PromQL parser


def find_promtool() -> Path:
    """promtool on PATH, in a stack data folder, or installed into .stack from Debian's package."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    from otel_rl.stack import default_cache_dir
    from otel_rl.stack._install import Installer

    folders = [Path(os.environ["OTEL_RL_STACK_DIR"])] if os.environ.get("OTEL_RL_STACK_DIR") else []
    folders.append(REPO_ROOT / ".stack")
    for folder in folders:
        installer = Installer(folder.resolve(), default_cache_dir(), lambda: None)
        if installer.is_installed("prometheus") and installer.binary("prometheus", "promtool").is_file():
            return installer.binary("prometheus", "promtool")
    folder = folders[-1].resolve()
    with _locked(folder / ".promtool.lock"):
        installer = Installer(folder, default_cache_dir(), lambda: None)
        if not installer.is_installed("prometheus"):
            installer.install(["prometheus"])
    return installer.binary("prometheus", "promtool")


def promtool_parse(expressions: Mapping[str, str], promtool: Path | None = None) -> dict[str, str]:
    """Parse each expression with promtool (as recording rules); return {name: error} for those it rejects."""
    tool = promtool or find_promtool()
    names = list(expressions)
    rules = {
        "groups": [{"name": "panels", "rules": [{"record": f"panel_query_{i}", "expr": expressions[name]} for i, name in enumerate(names)]}]
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "panels.yml"
        path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
        done = subprocess.run([str(tool), "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    failed: dict[str, str] = {}
    for found in re.finditer(r"rule (\d+)[^\n]*?:\s*(.*)", output):
        index = int(found.group(1))
        # promtool numbers rules from 0 in some versions and from 1 in others: take its "record" name.
        record = re.search(r'"panel_query_(\d+)"', found.group(0))
        position = int(record.group(1)) if record else index
        if 0 <= position < len(names):
            failed[names[position]] = found.group(0).strip()
    if done.returncode != 0 and not failed:
        failed["(promtool)"] = output.strip() or f"exit {done.returncode}"
    return failed
