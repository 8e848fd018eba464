"""The boards built with grafana-foundation-sdk mean what the hand-written model's boards meant:
panel by panel the same titles, types, queries, data sources, units, thresholds, ranges, links and
display options as the snapshot taken of the old boards (boards_before_sdk.json)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from board_essentials import REPO_ROOT, SNAPSHOT, essentials

import otel_rl.ops.dashboards as D


@pytest.fixture(scope="module")
def before() -> dict[str, Any]:
    """The snapshot, less what the SDK writes differently with the same meaning (each says why)."""
    boards = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    for board in boards.values():
        for variable in board["variables"]:
            if variable["type"] == "datasource":
                # The SDK's data source variable has no refresh: Grafana lists data sources on every load anyway.
                variable.pop("refresh")
                # Single-valued: the old model left Grafana's default out, the SDK writes it.
                variable.update(multi=False, includeAll=False)
        for panel in board["panels"]:
            panel.setdefault("links", [])  # the snapshot lists data links only where a panel has some
    return boards


@pytest.fixture(scope="module")
def now() -> dict[str, Any]:
    """What the generator writes today (not the committed files: those are checked against it elsewhere)."""
    return essentials({path.stem: json.loads(text) for path, text in D.generate(REPO_ROOT).items()})


def _diff(where: str, old: Any, new: Any) -> list[str]:
    """Where two values differ, down to the innermost list item or key."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for key in sorted(set(old) | set(new)) for line in _diff(f"{where}.{key}", old.get(key), new.get(key))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [line for i, (a, b) in enumerate(zip(old, new)) for line in _diff(f"{where}[{i}]", a, b)]
    return [] if old == new else [f"{where}: {old!r} != {new!r}"]


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Every board / panel / field whose meaning changed, named."""
    out: list[str] = []
    if set(before) != set(now):
        out.append(f"boards: {sorted(before)} != {sorted(now)}")
    for slug in sorted(set(before) & set(now)):
        old, new = before[slug], now[slug]
        for field in sorted(set(old) | set(new)):
            if field != "panels":
                out += _diff(f"{slug}: {field}", old.get(field), new.get(field))
        old_titles = [p["title"] for p in old["panels"]]
        new_titles = [p["title"] for p in new["panels"]]
        if old_titles != new_titles:
            out.append(f"{slug}: panels: {old_titles} != {new_titles}")
        new_by_title = {p["title"]: p for p in new["panels"]}
        for panel in old["panels"]:
            other = new_by_title.get(panel["title"])
            if other is None:
                continue
            for field in sorted(set(panel) | set(other)):
                out += _diff(f"{slug} / {panel['title']}: {field}", panel.get(field), other.get(field))
    return out


def test_every_panel_means_what_it_meant_before_the_sdk(before: dict[str, Any], now: dict[str, Any]) -> None:
    problems = differences(before, now)
    assert not problems, "\n".join(problems[:20])


def test_the_comparison_names_the_board_panel_and_field_that_differ(before: dict[str, Any]) -> None:
    changed = json.loads(json.dumps(before))
    panel = changed["system"]["panels"][0]
    panel["targets"][0]["expr"] += " > 0"
    panel["unit"] = "bytes"
    changed["rollout"]["variables"][1]["query"] = "label_values(up, job)"
    problems = differences(before, changed)
    assert len(problems) == 3, problems
    assert problems[0].startswith("rollout: variables[1].query: 'label_values(")
    assert problems[1].startswith(f"system / {panel['title']}: targets[0].expr: ")
    assert problems[2].startswith(f"system / {panel['title']}: unit: ")
