"""A regex reader of the metric names in a PromQL expression, for tests: independent of
otel_rl.ops.dashboards' tokenizer, so the two can check each other."""

from __future__ import annotations

import re

_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (label matchers, groupings, strings and functions removed;
    docker compose's ``$$`` read as ``$``)."""
    text = expr.replace("$$", "$")
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", text):
        if match.group(2) is None and match.group(1).lower() not in _PROMQL_KEYWORDS:
            names.add(match.group(1))
    return names
