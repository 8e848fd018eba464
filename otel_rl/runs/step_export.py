"""A run folder's steps as a table file: one row per step (and rank), ``step``, ``time`` (the step's
first ``rl.log`` event, UTC), ``rank`` when the run has several ranks, then one column per key the
steps logged, in the order they first appear, values as logged (``otel-rl export``).

CSV needs only the standard library; Parquet needs pyarrow (``pip install pyarrow``).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Sequence
from typing import IO, Any

from otel_rl.runs.steps import StepRow

__all__ = ["PARQUET_HINT", "step_columns", "write_csv", "write_parquet"]

_FIXED = frozenset({"step", "time", "rank"})
PARQUET_HINT = "pip install pyarrow (or pip install 'otel-rl[parquet]')"


def step_columns(rows: Sequence[StepRow]) -> list[str]:
    """``step``, ``time``, ``rank`` (several ranks only), then every logged key in first-seen order."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row.values))
    fixed = ["step", "time"] + (["rank"] if {row.rank for row in rows} - {0} else [])
    # a logged key named like a fixed column keeps its own column, renamed so both survive
    return fixed + [f"{key} (logged)" if key in _FIXED else key for key in keys]


def _iso(time_ns: int) -> str:
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    stamp = dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{nanos:09d}Z"


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return value  # str, bool, int; a float as repr(), which reads back to the same number


def _logged_keys(columns: Sequence[str]) -> list[str]:
    """The logged key behind each key column (those after ``step``, ``time`` and ``rank``)."""
    first = 3 if "rank" in columns else 2
    return [column.removesuffix(" (logged)") for column in columns[first:]]


def write_csv(rows: Sequence[StepRow], out: IO[str]) -> int:
    """Write the rows as CSV to ``out`` (opened with ``newline=""``); returns the number of rows."""
    columns = step_columns(rows)
    has_rank = "rank" in columns
    keys = _logged_keys(columns)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        fixed: list[Any] = [row.step, _iso(row.time_ns)] + ([row.rank] if has_rank else [])
        writer.writerow(fixed + [_csv_value(row.values.get(key)) for key in keys])
    return len(rows)


def _arrow_column(values: list[Any], pa: Any) -> Any:
    """One column with one type: numbers as int64 or float64, text as string, anything mixed as its JSON text."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.bool_())
    if present and all(isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 for v in present):
        return pa.array(values, type=pa.int64())
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    if all(isinstance(v, str) for v in present):
        return pa.array(values, type=pa.string())

    def text(v: Any) -> str | None:
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, float) and not math.isfinite(v):
            return repr(v)
        return json.dumps(v, separators=(",", ":"), default=str)

    return pa.array([text(v) for v in values], type=pa.string())


def write_parquet(rows: Sequence[StepRow], path: str) -> int:
    """Write the rows as a Parquet file (``time`` a UTC timestamp in ns); ImportError naming pyarrow without it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(f"writing Parquet needs pyarrow: {PARQUET_HINT}") from exc
    columns = step_columns(rows)
    has_rank = "rank" in columns
    keys = _logged_keys(columns)
    arrays = [
        pa.array([row.step for row in rows], type=pa.int64()),
        pa.array([row.time_ns for row in rows], type=pa.timestamp("ns", tz="UTC")),
    ]
    if has_rank:
        arrays.append(pa.array([row.rank for row in rows], type=pa.int64()))
    arrays += [_arrow_column([row.values.get(key) for row in rows], pa) for key in keys]
    pq.write_table(pa.table(arrays, names=columns), path)
    return len(rows)
