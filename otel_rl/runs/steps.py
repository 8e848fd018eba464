"""A run folder as one row per step: the keys each step logged (its ``rl.log`` events, values as
logged) and the headline values the console summary prints, for ``otel-rl show`` and ``otel-rl export``.

    rows = read_step_rows("otel-rl-runs/x")      # .problems: skipped lines; .without_step: events with no step
    columns, table = headline_table(rows, read_step_seconds("otel-rl-runs/x"))
    print(format_step_table(columns, table, limit=20))

A step that logged several times is one row (its keys merged, a later value wins; the time is its
first event's). Each rank's file gives its own rows (``rank`` tells them apart).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl._sdk.pipeline.summary import HEADLINE_LABELS, HEADLINE_ORDER
from otel_rl.reporting import LOGGER_NAME
from otel_rl.runs.folder import iter_spans, read_log_records
from otel_rl.runs.records import ReadResult, SpanRecord
from otel_rl.runs.run_selection import RunSelection, choose_run
from otel_rl.runs.waterfall import whole_number
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

__all__ = [
    "SECONDS_COLUMN",
    "TABLE_ORDER",
    "StepRow",
    "StepRows",
    "format_step_table",
    "headline_table",
    "headline_values",
    "quiet_resolver",
    "read_step_rows",
    "read_step_seconds",
    "step_seconds",
]

# The console summary's headline labels, with the policy loss beside the total loss: most
# frameworks log only the policy-gradient loss, which the console line leaves out.
TABLE_ORDER: tuple[str, ...] = tuple(label for name in HEADLINE_ORDER for label in ((name, "loss_policy") if name == "loss" else (name,)))
SECONDS_COLUMN = "seconds"


@dataclass
class StepRow:
    """One step of one rank: the first event's time and every key the step logged."""

    step: int
    rank: int
    time_ns: int
    values: dict[str, Any] = field(default_factory=dict)
    framework: str | None = None


class StepRows(ReadResult[StepRow]):
    """Rows sorted by step then rank; ``problems``: skipped lines; ``without_step``: ``rl.log`` events with no step;
    ``run``: the run read, where the folder holds several (see run_selection)."""

    without_step: int = 0
    run: RunSelection = RunSelection()

    @property
    def ranks(self) -> list[int]:
        return sorted({row.rank for row in self})


def read_step_rows(run_dir: str | os.PathLike[str], run_id: str | None = None) -> StepRows:
    """The steps' ``rl.log`` events of every rank's logs file, one row per (step, rank), of one run:
    ``run_id``, else the folder's latest (``.run`` names the others). Raises LookupError for a
    ``run_id`` the folder does not hold."""
    records = read_log_records(run_dir)
    result = StepRows(problems=records.problems)
    result.run = choose_run((record.get("resource") for record in records), run_id)
    rows: dict[tuple[int, int], StepRow] = {}
    for record in records:
        if record.get("event_name") != N.RL_LOG_EVENT or not result.run.keeps(record.get("resource")):
            continue
        step = whole_number((record.get("attributes") or {}).get(A.RL_STEP))
        body = record.get("body")
        if step is None or not isinstance(body, Mapping):
            result.without_step += 1
            continue
        resource = record.get("resource") or {}
        rank = whole_number(resource.get(A.RL_RANK)) or 0
        row = rows.get((step, rank))
        if row is None:
            framework = resource.get(A.RL_FRAMEWORK)
            time_ns = whole_number(record.get("timestamp")) or 0
            row = rows[(step, rank)] = StepRow(step, rank, time_ns, framework=framework if isinstance(framework, str) else None)
        row.values.update(body)
    result.extend(rows[key] for key in sorted(rows))
    return result


def step_seconds(span: SpanRecord, run: RunSelection | None = None) -> tuple[tuple[int, int], float] | None:
    """``((step, rank), seconds)`` of an ``rl.step`` root span of ``run`` (of any run when None); None
    for every other span."""
    if span.name != N.RL_STEP_SPAN or span.parent_span_id is not None or (run is not None and not run.keeps(span.resource)):
        return None
    step = whole_number(span.attributes.get(A.RL_STEP))
    if step is None:
        return None
    rank = whole_number(span.attributes.get(A.RL_RANK, span.resource.get(A.RL_RANK))) or 0
    return (step, rank), span.duration_ns / 1e9


def read_step_seconds(run_dir: str | os.PathLike[str], run: RunSelection | None = None) -> dict[tuple[int, int], float]:
    """Each step's wall time in seconds, from its ``rl.step`` root span, by (step, rank), of ``run``'s
    spans (default: every span); the latest span wins. Read one span at a time."""
    found = (step_seconds(span, run) for span in iter_spans(run_dir, []))
    return dict(item for item in found if item is not None)


@contextmanager
def quiet_resolver() -> Iterator[None]:
    # The resolver's "no mapping knows the key" advice is for a program that logs; reading a finished
    # run it would only repeat what the run printed when it logged the key.
    logger = logging.getLogger(LOGGER_NAME)
    drop = logging.Filter("otel_rl.__never__")  # a filter matching no logger name drops every record
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def headline_values(values: Mapping[str, Any], framework: str | None, resolver: KeyResolver) -> dict[str, float]:
    """The headline labels (TABLE_ORDER) of one step's logged ``values``, as the console summary names them."""
    out: dict[str, float] = {}
    for key, raw in values.items():
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            continue
        res = resolver.resolve(key, framework)
        label_of = HEADLINE_LABELS.get(res.metric)
        if res.fallback or label_of is None:
            continue
        label = label_of(res.attributes)
        if label not in TABLE_ORDER:
            continue
        try:
            out[label] = float(res.transform(raw)) if res.transform is not None else float(raw)
        except (ValueError, TypeError, OverflowError):
            continue
    return out


def headline_table(
    rows: Sequence[StepRow], seconds: Mapping[tuple[int, int], float] | None = None
) -> tuple[list[str], list[dict[str, float | int]]]:
    """The columns (``step``, ``rank`` when there are several ranks, ``seconds``, then the headline
    labels in :data:`TABLE_ORDER` that some step has) and one dict per (step, rank) of ``rows``
    or ``seconds``, sorted."""
    seconds = seconds or {}
    resolver = KeyResolver.default()
    by_key = {(row.step, row.rank): row for row in rows}
    table: list[dict[str, float | int]] = []
    with quiet_resolver():
        for step, rank in sorted({*by_key, *seconds}):  # a step that logged nothing still has its wall time
            entry: dict[str, float | int] = {"step": step, "rank": rank}
            if (step, rank) in seconds:
                entry[SECONDS_COLUMN] = seconds[(step, rank)]
            if (step, rank) in by_key:
                row = by_key[(step, rank)]
                entry.update(headline_values(row.values, row.framework, resolver))
            table.append(entry)
    present = {name for entry in table for name in entry}
    columns = ["step"]
    if {entry["rank"] for entry in table} - {0}:
        columns.append("rank")
    columns += [name for name in (SECONDS_COLUMN, *TABLE_ORDER) if name in present]
    return columns, table


def _cell(value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def format_step_table(
    columns: Sequence[str], table: Sequence[Mapping[str, float | int]], limit: int | None = 20, total: int | None = None
) -> str:
    """The table as aligned text; past ``limit`` rows, the first and last rows around a ``... N steps ...`` line.
    ``total``: the number of rows the table stands for, where ``table`` holds only its ends (step_table)."""
    total = len(table) if total is None else total
    shown: list[Mapping[str, float | int] | None] = list(table)
    if limit is not None and total > max(limit, 2):
        head = limit // 2
        tail = limit - head
        shown = [*table[:head], None, *table[len(table) - tail :]]
    cells = [[_cell(entry.get(name)) for name in columns] if entry is not None else None for entry in shown]
    widths = [max([len(name)] + [len(row[i]) for row in cells if row is not None]) for i, name in enumerate(columns)]
    lines = ["  ".join(name.rjust(width) for name, width in zip(columns, widths))]
    for row in cells:
        if row is None:
            hidden = total - (len(shown) - 1)
            lines.append(f"... {hidden} {'rows' if 'rank' in columns else 'steps'} ...")
        else:
            lines.append("  ".join(cell.rjust(width) for cell, width in zip(row, widths)))
    return "\n".join(lines)
