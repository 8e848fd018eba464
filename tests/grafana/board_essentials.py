"""What a board means, read out of its Grafana JSON: per board its uid, title, links and template
variables; per panel its title, type, queries, data sources, units, thresholds, range, links, series
overrides and the display options that change what a panel shows (stacking, bars, heatmap buckets).

Key order, defaults Grafana fills in anyway and the JSON's exact shape are left out, so two
generators that write the same boards differently compare equal.

``python tests/grafana/board_essentials.py`` wrote ``boards_before_sdk.json`` once, from the boards
the hand-written model generated, before the boards were built with grafana-foundation-sdk.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO_ROOT / "grafana" / "dashboards"
SNAPSHOT = Path(__file__).with_name("boards_before_sdk.json")

_VARIABLE_KEYS = ("name", "type", "label", "query", "datasource", "multi", "includeAll", "allValue", "sort", "refresh", "description")
_TARGET_KEYS = ("refId", "expr", "legendFormat", "datasource", "instant", "range", "format", "exemplar")
_DEFAULT_KEYS = ("unit", "min", "max")
# What Grafana reads of a data link; grafana-foundation-sdk 11.6 writes data links as dashboard links
# (with type, icon, tags, ... that Grafana ignores on a data link).
_DATA_LINK_KEYS = ("title", "url", "targetBlank")


def _pick(source: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: source[key] for key in keys if key in source}


def _display(panel: dict[str, Any]) -> dict[str, Any]:
    """The options that change what a panel draws, per panel type."""
    options = panel.get("options", {})
    custom = panel["fieldConfig"]["defaults"].get("custom", {})
    out: dict[str, Any] = {"color": panel["fieldConfig"]["defaults"].get("color", {}).get("mode")}
    if panel["type"] == "timeseries":
        out |= {
            "drawStyle": custom.get("drawStyle"),
            "stacking": custom.get("stacking", {}).get("mode"),
            "thresholdsStyle": custom.get("thresholdsStyle", {}).get("mode"),
            "spanNulls": custom.get("spanNulls"),
            "legend": _pick(options.get("legend", {}), ("calcs", "displayMode", "placement", "showLegend")),
            "tooltip": _pick(options.get("tooltip", {}), ("mode", "sort")),
        }
    elif panel["type"] in ("stat", "bargauge"):
        out |= {"reduce": options.get("reduceOptions", {}).get("calcs"), "orientation": options.get("orientation")}
        if panel["type"] == "bargauge":
            out["displayMode"] = options.get("displayMode")
    elif panel["type"] == "heatmap":
        out |= {
            "calculate": options.get("calculate"),
            "rows": options.get("rowsFrame", {}).get("layout"),
            "cells": options.get("cellValues", {}).get("unit"),
            "yUnit": options.get("yAxis", {}).get("unit"),
            "scheme": options.get("color", {}).get("scheme"),
            "hideBelow": options.get("filterValues", {}).get("le"),
        }
    return out


def panel_essentials(panel: dict[str, Any]) -> dict[str, Any]:
    defaults = panel["fieldConfig"]["defaults"]
    return {
        "title": panel["title"],
        "type": panel["type"],
        "description": panel.get("description", ""),
        "datasource": panel.get("datasource"),
        "gridPos": panel["gridPos"],
        **_pick(defaults, _DEFAULT_KEYS),
        "links": [_pick(link, _DATA_LINK_KEYS) for link in defaults.get("links", [])],
        "thresholds": defaults.get("thresholds", {}).get("steps", []),
        "overrides": panel["fieldConfig"].get("overrides", []),
        "display": _display(panel),
        "targets": [_pick(t, _TARGET_KEYS) for t in panel.get("targets", [])],
    }


def board_essentials(board: dict[str, Any]) -> dict[str, Any]:
    return {
        "uid": board["uid"],
        "title": board["title"],
        "description": board.get("description", ""),
        "tags": board.get("tags", []),
        "graphTooltip": board.get("graphTooltip", 0),
        "refresh": board.get("refresh"),
        "time": board.get("time"),
        "links": [_pick(link, ("title", "type", "tags", "asDropdown", "includeVars", "keepTime")) for link in board.get("links", [])],
        "variables": [_pick(v, _VARIABLE_KEYS) | {"current": v.get("current", {}).get("value")} for v in board["templating"]["list"]],
        "rows": [{"title": p["title"], "gridPos": p["gridPos"]} for p in board["panels"] if p["type"] == "row"],
        "panels": [panel_essentials(p) for p in board["panels"] if p["type"] != "row"],
    }


def essentials(boards: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {slug: board_essentials(board) for slug, board in sorted(boards.items())}


if __name__ == "__main__":
    committed = {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(DASHBOARDS.glob("*.json"))}
    SNAPSHOT.write_text(json.dumps(essentials(committed), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    sys.stdout.write(f"wrote {SNAPSHOT.relative_to(REPO_ROOT)}\n")
