"""The step table ``otel-rl show`` prints, read in one streaming pass: memory holds the rows it
prints (the first and last ``limit / 2`` of the (step, rank) keys), a set of the keys seen (to
count them) and one line's records, never every step's values. A 455,000-step folder is read in
the memory of a 100-step one, plus its key set.

    table = read_step_table("otel-rl-runs/x", limit=20)
    print(format_step_table(table.columns, table.rows, limit=20, total=table.total))
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl.runs.folder import Problem, iter_log_records, iter_spans
from otel_rl.runs.run_selection import RunSelection, choose_run, run_id_of
from otel_rl.runs.steps import SECONDS_COLUMN, TABLE_ORDER, headline_values, quiet_resolver
from otel_rl.runs.waterfall import whole_number
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

__all__ = ["StepTable", "read_step_table"]

Key = tuple[int, int]  # (step, rank)


class TableEnds:
    """The rows of the ``head`` smallest and ``tail`` largest keys seen so far (all rows when
    ``head`` is None). A key left out once never comes back among the ends: keys only get added."""

    def __init__(self, head: int | None, tail: int) -> None:
        self.head_n, self.tail_n = head, tail
        self.head: list[Key] = []
        self.tail: list[Key] = []
        self.rows: dict[Key, dict[str, float | int]] = {}
        self.keys: set[Key] = set()
        self.present: set[str] = set()

    def row(self, key: Key) -> dict[str, float | int] | None:
        self.keys.add(key)
        found = self.rows.get(key)
        if found is not None or self.head_n is None:
            return found if found is not None else self.rows.setdefault(key, {"step": key[0], "rank": key[1]})
        taken = False
        if len(self.head) < self.head_n or key < self.head[-1]:
            bisect.insort(self.head, key)
            taken = True
            if len(self.head) > self.head_n:
                self._forget(self.head.pop(), self.tail)
        if len(self.tail) < self.tail_n or key > self.tail[0]:
            bisect.insort(self.tail, key)
            taken = True
            if len(self.tail) > self.tail_n:
                self._forget(self.tail.pop(0), self.head)
        return self.rows.setdefault(key, {"step": key[0], "rank": key[1]}) if taken and key in self._kept() else None

    def _kept(self) -> set[Key]:
        return {*self.head, *self.tail}

    def _forget(self, key: Key, other: list[Key]) -> None:
        i = bisect.bisect_left(other, key)
        if not (i < len(other) and other[i] == key):
            self.rows.pop(key, None)

    def add(self, key: Key, values: Mapping[str, float | int]) -> None:
        self.present.update(values)
        row = self.row(key)
        if row is not None:
            row.update(values)

    def merge(self, other: TableEnds) -> None:
        for key in sorted(other.keys - set(other.rows)):
            self.keys.add(key)  # counted; never among the ends of the union (it was not among other's)
        for key, row in sorted(other.rows.items()):
            values = {k: v for k, v in row.items() if k not in ("step", "rank")}
            self.add(key, values)
        self.present |= other.present


@dataclass
class StepTable:
    """What ``show`` prints: ``columns``, the ``rows`` kept (sorted), ``total`` (every (step, rank)
    key), the distinct ``steps`` count with the first and last, and what was read along the way."""

    columns: list[str]
    rows: list[dict[str, float | int]]
    total: int
    steps: int
    first_step: int | None
    last_step: int | None
    last_traced: int | None
    run: RunSelection
    problems: list[Problem] = field(default_factory=list)


def read_step_table(run_dir: str | os.PathLike[str], run_id: str | None = None, limit: int | None = 20) -> StepTable:
    """The step table of one run of ``run_dir`` (see :func:`otel_rl.runs.steps.read_step_rows` for
    which run), keeping only the rows ``limit`` shows (every row when ``limit`` is None)."""
    head = None if limit is None else limit // 2
    tail = 0 if limit is None else limit - limit // 2
    problems: list[Problem] = []
    by_run: dict[str | None, TableEnds] = {}
    firsts: dict[tuple[str | None, int], Mapping[str, Any] | None] = {}  # the first resource of each (run, rank)
    resolver = KeyResolver.default()
    with quiet_resolver():
        for record in iter_log_records(run_dir, problems):
            if record.get("event_name") != N.RL_LOG_EVENT:
                continue
            resource = record.get("resource") or {}
            run = run_id_of(resource)
            rank = whole_number(resource.get(A.RL_RANK)) or 0
            firsts.setdefault((run, rank), resource)
            step = whole_number((record.get("attributes") or {}).get(A.RL_STEP))
            body = record.get("body")
            if step is None or not isinstance(body, Mapping):
                continue
            framework = resource.get(A.RL_FRAMEWORK)
            values = headline_values(body, framework if isinstance(framework, str) else None, resolver)
            by_run.setdefault(run, TableEnds(head, tail)).add((step, rank), values)
    choice = choose_run(firsts.values(), run_id)
    ends = TableEnds(head, tail)
    for (run, _rank), resource in firsts.items():
        group = by_run.pop(run, None)
        if group is not None and choice.keeps(resource):
            ends.merge(group)
    last_traced = None
    for span in iter_spans(run_dir, problems):
        if span.name != N.RL_STEP_SPAN or span.parent_span_id is not None or not choice.keeps(span.resource):
            continue
        step = whole_number(span.attributes.get(A.RL_STEP))
        if step is not None:
            rank = whole_number(span.attributes.get(A.RL_RANK, span.resource.get(A.RL_RANK))) or 0
            ends.add((step, rank), {SECONDS_COLUMN: span.duration_ns / 1e9})
            last_traced = step if last_traced is None else max(last_traced, step)
    steps = {step for step, _rank in ends.keys}
    columns = ["step"]
    if any(rank for _step, rank in ends.keys):
        columns.append("rank")
    columns += [name for name in (SECONDS_COLUMN, *TABLE_ORDER) if name in ends.present]
    return StepTable(
        columns=columns,
        rows=[ends.rows[key] for key in sorted(ends.rows)],
        total=len(ends.keys),
        steps=len(steps),
        first_step=min(steps) if steps else None,
        last_step=max(steps) if steps else None,
        last_traced=last_traced,
        run=choice,
        problems=problems,
    )
