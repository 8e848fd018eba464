"""``otel-rl show``'s step table read in one streaming pass (otel_rl.runs.step_table): the same
table as reading every row, while holding only the rows it prints."""

from __future__ import annotations

import random
from pathlib import Path

from otel_rl.runs.step_table import TableEnds, read_step_table
from otel_rl.runs.steps import format_step_table, headline_table, read_step_rows, read_step_seconds
from otel_rl.testing import capture


def _write(folder: Path, steps: int) -> None:
    with capture(folder, framework="verl") as cap:
        for step in range(1, steps + 1):
            with cap.telemetry.step(step):
                cap.telemetry.log({"critic/score/mean": step / 100, "actor/entropy": 2.0 - step / 100}, step=step)
                cap.telemetry.log({"response_length/mean": 100 + step}, step=step)  # a second record of the step


def test_the_streamed_table_is_the_full_tables_ends(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _write(folder, 40)
    rows = read_step_rows(folder)
    columns, full = headline_table(rows, read_step_seconds(folder, rows.run))
    for limit in (4, 11, None):
        table = read_step_table(folder, limit=limit)
        assert table.columns == columns and table.total == len(full) == 40 and table.steps == 40
        assert (table.first_step, table.last_step, table.last_traced) == (1, 40, 40)
        wanted = full if limit is None else [*full[: limit // 2], *full[len(full) - (limit - limit // 2) :]]
        assert table.rows == wanted
        assert format_step_table(table.columns, table.rows, limit=limit, total=table.total) == format_step_table(columns, full, limit=limit)


def test_the_ends_hold_no_more_rows_than_are_printed_whatever_the_order() -> None:
    keys = [(step, rank) for step in range(3000) for rank in range(3)]
    random.Random(7).shuffle(keys)
    ends = TableEnds(5, 5)
    for i, key in enumerate(keys):
        ends.add(key, {"reward": float(i)})
        if i % 2 == 0:
            ends.add(key, {"kl": 1.0})  # a later record of a kept key merges into its row
        assert len(ends.rows) <= 10
    ordered = sorted(keys)
    assert sorted(ends.rows) == [*ordered[:5], *ordered[-5:]]
    assert len(ends.keys) == len(keys)
