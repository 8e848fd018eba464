"""Metric tables as a run's log: a CSV file with a step column and one column per metric.

The shape people export and commit: a W&B run's "Export CSV" (``Step``, ``<run> - <key>``, and
``<run> - <key>__MIN`` / ``__MAX`` columns for the bands of a sampled chart), a pandas frame of a
tracker's history, or a table a framework's own logger wrote (AReaL's ``ppo_actor/...`` keys).
One row is one logged step; an empty cell is a key not logged at that step (missing, not zero).
The framework is told from the keys where they are a framework's own (AReaL).
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from otel_rl.replay._log import ParsedLog, StepRecord, number_text
from otel_rl.runs.folder import Problem
from otel_rl.semconv import attributes as A

STEP_COLUMNS = ("step", "Step", "global_step", "_step", "trainer/global_step", "train/global_step")
_WANDB_PREFIX_RE = re.compile(r"^.+? - (.+)$")  # "<run name> - <key>"
_BAND_SUFFIXES = ("__MIN", "__MAX")  # W&B's chart bands: not values of the run
# Keys only a framework's own logger writes: the table is that framework's.
_AREAL = A.RlFrameworkValues.AREAL.value
_FRAMEWORK_PREFIXES = (("ppo_actor/", _AREAL), ("timeperf/", _AREAL))


def header_of(text: str) -> list[str] | None:
    """The header of a metric table (a step column and at least two others), else None."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.count(",") < 2:
        return None
    try:
        cells = next(csv.reader([first]))
    except (csv.Error, StopIteration):
        return None
    return cells if any(c.strip() in STEP_COLUMNS for c in cells) else None


def _key(column: str) -> str | None:
    column = column.strip()
    if column.endswith(_BAND_SUFFIXES):
        return None
    m = _WANDB_PREFIX_RE.match(column)
    return m.group(1).strip() if m and "/" not in column.split(" - ", 1)[0] else column


def read_metric_table(path: Path, text: str, out: ParsedLog) -> None:
    name = path.name
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header is None:
        return
    step_at = next(i for i, c in enumerate(header) if c.strip() in STEP_COLUMNS)
    keys = [None if i == step_at else _key(c) for i, c in enumerate(header)]
    dropped = sum(1 for i, c in enumerate(header) if i != step_at and keys[i] is None)
    if dropped:
        out.notes.append(f"{dropped} band column(s) (__MIN / __MAX of a sampled chart) left out: they are not the run's values")
    for prefix, framework in _FRAMEWORK_PREFIXES:
        if any(k and k.startswith(prefix) for k in keys):
            out.framework = framework
            out.notes.append(f"read as {framework}'s metric keys (columns named {prefix}...)")
            break
    for number, row in enumerate(rows, start=2):
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            out.problems.append(Problem(name, number, f"{len(row)} cells where the header has {len(header)}: row skipped"))
            continue
        step_text = row[step_at].strip()
        step = number_text(step_text)
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if not isinstance(step, int) or isinstance(step, bool):
            out.problems.append(Problem(name, number, f"step {step_text!r} is not an integer: row skipped"))
            continue
        values = {}
        for key, cell in zip(keys, row):
            cell = cell.strip()
            if key is None or not cell:
                continue
            values[key] = number_text(cell)
        out.records.append(StepRecord(step, values, number))
