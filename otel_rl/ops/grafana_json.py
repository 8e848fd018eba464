"""Grafana's dashboard JSON for the board model: template variables, one JSON object per panel kind
(time series, stat, bar gauge, heatmap), the grid layout, and reading the queries back out of a board.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from otel_rl.ops.dashboard_model import ALL_VALUE, DATASOURCE, PROMETHEUS_UID, RUN, SCHEMA_VERSION, TAG, Board, Metrics, Panel, Row, Target
from otel_rl.ops.promql import eq, label, ne
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

# --------------------------------------------------------------------------------------------
# Template variables


def _datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {"text": "Prometheus", "value": PROMETHEUS_UID},
        "hide": 0,
        "regex": "",
        "refresh": 1,
        "description": "The Prometheus-compatible store (Prometheus, Mimir, VictoriaMetrics) holding the run's metrics.",
    }


def _query_variable(name: str, title: str, query: str, description: str, *, multi: bool, sort: int) -> dict[str, Any]:
    variable: dict[str, Any] = {
        "name": name,
        "label": title,
        "type": "query",
        "datasource": dict(DATASOURCE),
        "query": query,
        "refresh": 2,
        "sort": sort,
        "multi": multi,
        "includeAll": multi,
        "hide": 0,
        "regex": "",
        "description": description,
    }
    if multi:  # "All" selected from the start (else Grafana would pick the first value alone)
        variable["allValue"] = ALL_VALUE
        variable["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return variable


def variables(m: Metrics) -> list[dict[str, Any]]:
    """The boards' template variables: datasource, service, run, cluster, rank, device."""
    run = ", ".join(RUN)
    any_run = ne(A.RL_RUN_ID, "")
    stage_count = m.prom(M.RL_STAGE_DURATION, "_count")
    return [
        _datasource_variable(),
        _query_variable(
            "service",
            "Service",
            f"label_values({{{any_run}}}, {label(A.SERVICE_NAME)})",
            "service.name of the training job (every otel-rl series carries rl.run.id).",
            multi=False,
            sort=1,
        ),
        _query_variable(
            "run",
            "Run",
            f"label_values({{{eq(A.SERVICE_NAME, '$service')}, {any_run}}}, {label(A.RL_RUN_ID)})",
            "rl.run.id; newest first when run ids start with their start time (otel-rl's default).",
            multi=False,
            sort=2,
        ),
        _query_variable(
            "cluster",
            "Cluster",
            f"label_values({stage_count}{{{run}}}, {label(A.RL_CLUSTER)})",
            f"{A.RL_CLUSTER}: the worker group that ran a stage (actor_train, actor_infer, reference, ...).",
            multi=True,
            sort=1,
        ),
        _query_variable(
            "rank",
            "Rank",
            f"label_values({{{run}}}, {label(A.RL_RANK)})",
            f"Global rank: {A.RL_RANK} of the reporting process; on per-rank balance panels, {A.RL_MEASURED_RANK}.",
            multi=True,
            sort=3,
        ),
        _query_variable(
            "device",
            "Device",
            f"label_values({{{run}, {ne(A.HW_ID, '')}}}, {label(A.HW_ID)})",
            f"{A.HW_ID}: the GPU index (none on a CPU-only run).",
            multi=True,
            sort=3,
        ),
    ]


# --------------------------------------------------------------------------------------------
# Panels


def _target_json(target: Target, ref: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "refId": ref,
        "datasource": dict(DATASOURCE),
        "editorMode": "code",
        "expr": target.expr,
        "legendFormat": target.legend or "__auto",
        "range": not target.instant,
        "instant": target.instant,
    }
    if target.heatmap:
        out["format"] = "heatmap"
    if target.exemplar:
        out["exemplar"] = True
    return out


def _hide_from() -> dict[str, bool]:
    return {"legend": False, "tooltip": False, "viz": False}


def _thresholds(values: Sequence[float]) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": "red", "value": v} for v in values]
    return {"mode": "absolute", "steps": steps}


def _timeseries(panel: Panel) -> tuple[dict[str, Any], dict[str, Any]]:
    custom: dict[str, Any] = {
        "drawStyle": "bars" if panel.bars else "line",
        "lineWidth": 1,
        "fillOpacity": 70 if panel.bars else 10,
        "gradientMode": "none",
        "showPoints": "auto",
        "pointSize": 4,
        "lineInterpolation": "linear",
        "spanNulls": True,
        "insertNulls": False,
        "barAlignment": 0,
        "axisPlacement": "auto",
        "axisLabel": "",
        "axisBorderShow": False,
        "axisCenteredZero": False,
        "axisColorMode": "text",
        "scaleDistribution": {"type": "linear"},
        "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        "thresholdsStyle": {"mode": "line" if panel.thresholds else "off"},
        "hideFrom": _hide_from(),
    }
    options = {
        "legend": {"calcs": ["lastNotNull", "max"], "displayMode": "table", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return options, custom


def _stat(panel: Panel) -> tuple[dict[str, Any], dict[str, Any] | None]:
    options = {
        "colorMode": "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "percentChangeColorMode": "standard",
        "showPercentChange": False,
        "textMode": "auto",
        "wideLayout": True,
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    }
    return options, None


def _bargauge(panel: Panel) -> tuple[dict[str, Any], dict[str, Any] | None]:
    options = {
        "displayMode": "gradient",
        "orientation": "horizontal",
        "namePlacement": "auto",
        "showUnfilled": True,
        "sizing": "auto",
        "valueMode": "color",
        "minVizHeight": 16,
        "minVizWidth": 8,
        "maxVizHeight": 300,
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": False},
    }
    return options, None


def _heatmap(panel: Panel) -> tuple[dict[str, Any], dict[str, Any]]:
    rows = "le" if any(t.heatmap for t in panel.targets) else "auto"  # histogram buckets are upper bounds
    options = {
        "calculate": False,
        "cellGap": 1,
        "cellValues": {"unit": panel.unit},
        "color": {
            "exponent": 0.5,
            "fill": "dark-orange",
            "mode": "scheme",
            "reverse": False,
            "scale": "exponential",
            "scheme": "Oranges",
            "steps": 64,
        },
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "filterValues": {"le": 1e-9},
        "legend": {"show": True},
        "rowsFrame": {"layout": rows},
        "selectionMode": "x",
        "showValue": "never",
        "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": False},
        "yAxis": {"axisPlacement": "left", "reverse": False, "unit": panel.y_unit or "none"},
    }
    custom = {"hideFrom": _hide_from(), "scaleDistribution": {"type": "linear"}}
    return options, custom


_KINDS = {"timeseries": _timeseries, "stat": _stat, "bargauge": _bargauge, "heatmap": _heatmap}


def panel_json(panel: Panel, panel_id: int, grid: dict[str, int], m: Metrics) -> dict[str, Any]:
    """One Grafana panel: queries, unit, the registry briefs as its description, links, overrides."""
    if panel.kind not in _KINDS:
        raise ValueError(f"{panel.title}: unknown panel kind {panel.kind}")
    used: list[str] = []
    for target in panel.targets:
        used += [name for name in m.used_in(target.expr) if name not in used]
    description = " ".join([m.brief(name) for name in used] + ([panel.note] if panel.note else []))
    options, custom = _KINDS[panel.kind](panel)
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "color": {"mode": "palette-classic"},
        "mappings": [],
        "thresholds": _thresholds(panel.thresholds),
    }
    if panel.kind in ("stat", "bargauge"):
        defaults["color"] = {"mode": "thresholds"}
    if custom is not None:
        defaults["custom"] = custom
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.links:
        defaults["links"] = [dict(link) for link in panel.links]
    refs = [chr(ord("A") + i) for i in range(len(panel.targets))]
    overrides = []
    for ref, target in zip(refs, panel.targets):
        if target.unit and target.unit != panel.unit:
            properties: list[dict[str, Any]] = [{"id": "unit", "value": target.unit}]
            if panel.kind == "timeseries":
                properties.append({"id": "custom.axisPlacement", "value": "right"})
            if panel.min is not None or panel.max is not None:  # the panel's 0..1 range is not this series'
                properties += [{"id": "min"}, {"id": "max"}]
            overrides.append({"matcher": {"id": "byFrameRefID", "options": ref}, "properties": properties})
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": description,
        "datasource": dict(DATASOURCE),
        "gridPos": grid,
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": options,
        "targets": [_target_json(t, ref) for ref, t in zip(refs, panel.targets)],
    }


# --------------------------------------------------------------------------------------------
# Boards


def _layout(items: Sequence[Panel | Row]) -> list[tuple[Panel | Row, dict[str, int]]]:
    """Grafana grid positions: rows span the width; panels flow left to right, 24 columns wide."""
    placed: list[tuple[Panel | Row, dict[str, int]]] = []
    x = y = line_h = 0
    for item in items:
        if isinstance(item, Row):
            if x:
                y, x, line_h = y + line_h, 0, 0
            placed.append((item, {"h": 1, "w": 24, "x": 0, "y": y}))
            y += 1
            continue
        if x + item.w > 24:
            y, x, line_h = y + line_h, 0, 0
        placed.append((item, {"h": item.h, "w": item.w, "x": x, "y": y}))
        x += item.w
        line_h = max(line_h, item.h)
    return placed


def board_json(board: Board, m: Metrics) -> dict[str, Any]:
    """The dashboard JSON Grafana imports."""
    panels: list[dict[str, Any]] = []
    for number, (item, grid) in enumerate(_layout(board.items), start=1):
        if isinstance(item, Row):
            panels.append({"id": number, "type": "row", "title": item.title, "collapsed": False, "gridPos": grid, "panels": []})
        else:
            panels.append(panel_json(item, number, grid, m))
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": f"{board.description} Generated from semconv/registry by `otel-rl dashboards generate` "
        "(otel_rl/ops/dashboard_boards.py); edit that, not this file.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": board.cursor_sync,
        "id": None,
        "links": [
            {
                "title": "otel-rl boards",
                "type": "dashboards",
                "tags": [TAG],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": [TAG, *board.tags],
        "templating": {"list": variables(m)},
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": board.title,
        "uid": board.uid,
        "version": 1,
        "weekStart": "",
    }


def dashboard_targets(board: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of a dashboard JSON, rows' nested panels included."""
    out = []
    for panel in board.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []) or []:
                out.append((inner, target))
    return out
