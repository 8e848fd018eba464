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
from otel_rl.runs.steps import SECONDS_COLUMN, TABLE_ORDER, headline_values, quiet_resolver, step_seconds
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

    def add(self, key: Key, values: Mapping[str, float | int]) -> None:
        self.keys.add(key)
        self.present.update(values)
        row = self.rows.get(key)
        if row is None and (self.head_n is None or self._takes(key)):
            row = self.rows[key] = {"step": key[0], "rank": key[1]}
        if row is not None:
            row.update(values)

    def _takes(self, key: Key) -> bool:
        """Whether a new key is among the ends now; an end it pushes out is forgotten."""
        assert self.head_n is not None
        head = self.head_n > 0 and (len(self.head) < self.head_n or key < self.head[-1])
        tail = self.tail_n > 0 and (len(self.tail) < self.tail_n or key > self.tail[0])
        if head:
            bisect.insort(self.head, key)
            if len(self.head) > self.head_n:
                self._forget(self.head.pop())
        if tail:
            bisect.insort(self.tail, key)
            if len(self.tail) > self.tail_n:
                self._forget(self.tail.pop(0))
        return head or tail

    def _forget(self, key: Key) -> None:
        if not (_holds(self.head, key) or _holds(self.tail, key)):
            del self.rows[key]

    def merge(self, other: TableEnds) -> None:
        """Add another run's rows: the ends of the union are among the ends of each."""
        self.keys |= other.keys
        for key, row in other.rows.items():
            self.add(key, {k: v for k, v in row.items() if k not in ("step", "rank")})
        self.present |= other.present


def _holds(ordered: list[Key], key: Key) -> bool:
    i = bisect.bisect_left(ordered, key)
    return i < len(ordered) and ordered[i] == key


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
            resource = record.get("resource") or {}
            run = run_id_of(resource)
            rank = whole_number(resource.get(A.RL_RANK)) or 0
            firsts.setdefault((run, rank), resource)  # every record names its run, as read_step_rows counts them
            if record.get("event_name") != N.RL_LOG_EVENT:
                continue
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
        found = step_seconds(span, choice)
        if found is not None:
            key, seconds = found
            ends.add(key, {SECONDS_COLUMN: seconds})
            last_traced = key[0] if last_traced is None else max(last_traced, key[0])
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
