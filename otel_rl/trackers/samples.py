"""Rollout samples as trackers show them: the fields of an ``rl.sample`` event's body, and one step's
samples as table columns and rows, a Markdown table, or JSON-ready records.

A row is the body of one ``rl.sample`` event (``Telemetry.log_samples``): ``step``, ``index``,
``group_id``, ``prompt``, ``response``, ``reward``, ``rewards/<component>``, ``advantage``,
``response_length``, ``truncated``; keys the caller did not give are absent. The column order is
fixed (the fields above, components sorted, anything else last), so every tracker shows the same
table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ADVANTAGE",
    "GROUP_ID",
    "INDEX",
    "PROMPT",
    "RESPONSE",
    "RESPONSE_LENGTH",
    "REWARD",
    "REWARDS",
    "REWARDS_PREFIX",
    "STEP",
    "TRUNCATED",
    "columns",
    "markdown_table",
    "table_rows",
]

# The fields of an rl.sample body (semconv/registry/samples.yaml) and of log_samples()'s mappings.
PROMPT = "prompt"
RESPONSE = "response"
REWARD = "reward"
REWARDS = "rewards"  # log_samples(): component -> value; the event body: rewards/<component>
REWARDS_PREFIX = REWARDS + "/"
ADVANTAGE = "advantage"
RESPONSE_LENGTH = "response_length"
TRUNCATED = "truncated"
GROUP_ID = "group_id"
STEP = "step"
INDEX = "index"

_LEADING = (STEP, INDEX, GROUP_ID, PROMPT, RESPONSE, REWARD)
_TRAILING = (ADVANTAGE, RESPONSE_LENGTH, TRUNCATED)


def columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The columns of a table of ``rows``: the known fields in a fixed order, reward components
    sorted after ``reward``, unknown keys last (sorted); only columns some row has."""
    present: set[str] = set()
    for row in rows:
        present.update(row)
    components = sorted(k for k in present if k.startswith(REWARDS_PREFIX))
    known = {*_LEADING, *_TRAILING, *components}
    ordered = [k for k in _LEADING if k in present] + components + [k for k in _TRAILING if k in present]
    return ordered + sorted(present - known)


def table_rows(rows: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> tuple[list[str], list[list[Any]]]:
    """``(columns, data)``: one list per row in the columns' order, ``None`` where a row lacks one."""
    names = list(names) if names is not None else columns(rows)
    return names, [[row.get(name) for name in names] for row in rows]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    # A table cell is one line; a "|" would end it.
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """``rows`` as a GitHub-flavoured Markdown table (what TensorBoard's text plugin renders)."""
    names, data = table_rows(rows)
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join("---" for _ in names) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in data]
    return "\n".join(lines)
