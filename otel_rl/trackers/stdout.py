"""``track_with: stdout``: one line per step in ROLL's StdoutTracker format.

ROLL logs ``metrics_tag: {json.dumps({'step': step, 'metrics': values})}``; this writes exactly
that text (without the logging prefix ROLL's logger adds) to ``sys.stdout`` and flushes, so
existing log scrapers keep working. The JSON is Python's ``json.dumps`` with its defaults, as in
ROLL: NaN and infinities are written as ``NaN`` / ``Infinity`` (which ``json.loads`` reads back),
non-ASCII is escaped. Numbers and bools are written as they are (bools stay ``true``/``false``,
as ROLL writes them), strings as strings, ``None`` and other objects are left out.

:func:`parse_stdout_line` reads such a line back (from this tracker or from ROLL's own logs).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from otel_rl.trackers.base import Tracker, to_scalar

__all__ = ["METRICS_TAG", "StdoutTracker", "parse_stdout_line"]

METRICS_TAG = "metrics_tag: "


class StdoutTracker(Tracker):
    name = "stdout"
    extra = None
    options = {}  # no settings: ROLL's stdout tracker takes none

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        metrics: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, (bool, str)):
                metrics[key] = value
            elif (number := to_scalar(value)) is not None:
                metrics[key] = number  # numpy scalars as plain int/float, which json can write
            elif value is not None:
                self.report_once(key, f"is left out: {type(value).__name__} is not a number or text")
        # sys.stdout is looked up per call so redirection (and pytest's capture) is honoured.
        out = sys.stdout
        out.write(f"{METRICS_TAG}{json.dumps({'step': step, 'metrics': metrics})}\n")
        out.flush()

    def flush(self) -> None:
        sys.stdout.flush()

    def finish(self) -> None:
        sys.stdout.flush()


def parse_stdout_line(line: str) -> tuple[int | None, dict[str, Any]] | None:
    """``(step, values)`` from a ``metrics_tag:`` line; ``None`` for any other line.

    The tag may follow a logging prefix (ROLL's logger adds one). A tagged line whose JSON is
    broken raises ``ValueError``.
    """
    at = line.find(METRICS_TAG)
    if at < 0:
        return None
    try:
        record = json.loads(line[at + len(METRICS_TAG) :])
        step, metrics = record["step"], record["metrics"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a metrics_tag line: {line[:200]!r} ({exc})") from None
    if not isinstance(metrics, dict) or not (step is None or isinstance(step, int)):
        raise ValueError(f"not a metrics_tag line: {line[:200]!r}")
    return step, metrics
