"""Grafana dashboards generated from the semantic-convention registry (``otel-rl dashboards``).

Every panel query names registry metrics through ``otel_rl.semconv`` constants and their
Prometheus names (``prometheus_name``); units and descriptions come from the registry too, so a
renamed metric or a changed unit changes the boards, and ``otel-rl dashboards generate --check``
fails until they are regenerated. The boards are written to ``grafana/dashboards/*.json``, which
Grafana's file provider loads (``grafana/provisioning/dashboards``).

Queries are scoped by template variables: ``$service`` (``service_name``), ``$run``
(``rl_run_id``), ``$cluster`` (``rl_cluster``), ``$rank`` (``rl_rank``, or ``rl_measured_rank`` on
per-rank balance metrics) and ``$device`` (``hw_id``), on the Prometheus data source picked by
``$datasource`` (default uid ``prometheus``). Step panels link to the step's traces in Jaeger and
Tempo (data source uids ``jaeger`` and ``tempo``), the trajectory-duration panel to the kept
agent trajectories.

This module writes and checks the files. The parts live beside it: ``promql`` (building and
reading PromQL), ``dashboard_model`` (boards, panels, registry metrics as PromQL, units),
``dashboard_boards`` (the eight boards) and ``grafana_boards`` (the Grafana dashboards, built with
grafana-foundation-sdk, the optional ``dashboards`` extra). Their main names are importable from
here too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from otel_rl.codegen.generate import differences, write_changed
from otel_rl.codegen.registry import load_registry
from otel_rl.ops.dashboard_boards import BOARDS, NOT_ON_A_BOARD, STAGE_GROUPS, boards
from otel_rl.ops.dashboard_model import (
    AGENT_LOOP_METRICS,
    ALL_VALUE,
    DASHBOARDS_DIR,
    FRACTIONS,
    GPU_ONLY_METRICS,
    HISTOGRAM_SUFFIXES,
    TAG,
    VARIABLES,
    Board,
    Metrics,
    Panel,
    Row,
    Target,
    TraceLink,
    grafana_unit,
    template_values,
    trace_links,
    uses_agent_loop_metric,
    uses_gpu_only_metric,
)
from otel_rl.ops.grafana_boards import SDK_MISSING, GrafanaSDKMissing, board_json, dashboard_targets, layout, sdk
from otel_rl.ops.promql import eq, label, match, ne, promql_metric_names, substitute

__all__ = [
    "AGENT_LOOP_METRICS",
    "ALL_VALUE",
    "BOARDS",
    "DASHBOARDS_DIR",
    "FRACTIONS",
    "GPU_ONLY_METRICS",
    "HISTOGRAM_SUFFIXES",
    "NOT_ON_A_BOARD",
    "SDK_MISSING",
    "STAGE_GROUPS",
    "STALE_BOARD",
    "TAG",
    "VARIABLES",
    "Board",
    "GrafanaSDKMissing",
    "Metrics",
    "Panel",
    "Row",
    "Target",
    "TraceLink",
    "board_json",
    "boards",
    "check",
    "dashboard_targets",
    "eq",
    "generate",
    "grafana_unit",
    "label",
    "layout",
    "match",
    "ne",
    "promql_metric_names",
    "sdk",
    "stale_boards",
    "substitute",
    "template_values",
    "trace_links",
    "uses_agent_loop_metric",
    "uses_gpu_only_metric",
    "write",
]

STALE_BOARD = "stale: no board produces it"


def generate(repo_root: Path | str) -> dict[Path, str]:
    """Every dashboard file (path relative to the repository) and its content."""
    registry = load_registry(Path(repo_root) / "semconv")
    m = Metrics(registry)
    return {board.path: json.dumps(board_json(board, m), indent=2, ensure_ascii=False) + "\n" for board in boards(registry)}


def stale_boards(repo_root: Path, files: Mapping[Path, str]) -> list[Path]:
    """Dashboard files in the checkout that no board produces any more (relative paths)."""
    folder = repo_root / DASHBOARDS_DIR
    return [p.relative_to(repo_root) for p in sorted(folder.glob("*.json")) if p.relative_to(repo_root) not in files]


def write(repo_root: Path | str) -> list[Path]:
    """Write the dashboards whose content changed and remove stale ones; return the paths touched."""
    root = Path(repo_root)
    files = generate(root)
    return write_changed(root, files, stale_boards(root, files))


def check(repo_root: Path | str) -> list[str]:
    """What differs between the committed dashboards and the registry's (empty: up to date)."""
    root = Path(repo_root)
    files = generate(root)
    return differences(root, files, stale_boards(root, files), STALE_BOARD)
