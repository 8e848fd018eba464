"""AReaL's console: what its ``StatsLogger.commit`` logs after each step (areal/utils/stats_logger.py,
1.0.4), behind AReaL's ``(AReaL) <time> StatsLogger INFO:`` prefix and colour codes::

    ... StatsLogger INFO: Epoch 1/1 Step 3/50 Train step 3/50 done.
    ... StatsLogger INFO: Stats (1/1):
    ... StatsLogger INFO:
    ╒══════════════════╤════════════╤═══ ...
    │ timeperf/rollout │ 1.1712e+01 │ ppo_actor/task_reward/avg │ 5.0000e-01 │ ...
    ├──────────────────┼────────────┼─── ...

``tabulate_stats`` draws each committed dict as key-value pairs, four to a row, values printed
``.4e``: five significant digits, which is all a replay of the console has. The step is the one
the console names ("Train step 3" is step 3, of the planned total after the slash; AReaL's own
trackers log the same dict at the zero-based ``global_step``, 2); a commit of several dicts,
``Stats (i/n)``, holds consecutive steps.
"""

from __future__ import annotations

import re
from pathlib import Path

from otel_rl.replay._log import ANSI_RE, ParsedLog, StepRecord, number_text, short
from otel_rl.replay._settings import apply_settings
from otel_rl.runs.folder import Problem

STEP_RE = re.compile(r"\bTrain step (\d+)/(\d+) done\.")
STATS_RE = re.compile(r"\bStats \((\d+)/(\d+)\):")
CELL_SEPARATOR = "│"  # tabulate's fancy_grid: U+2502 between cells, box-drawing lines between rows
TABLE_END = "╘"  # the table's last line


def is_areal_step_line(line: str) -> bool:
    return "Train step" in line and STEP_RE.search(line) is not None


def read_areal_console(path: Path, text: str, out: ParsedLog) -> None:
    step: int | None = None  # the step of the table being read
    first_step: int | None = None  # the step "Train step N" names: a commit's i-th dict is step N + i - 1
    planned: int | None = None
    records: dict[int, StepRecord] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = ANSI_RE.sub("", raw) if "\x1b" in raw else raw
        if "Train step" in line:
            found = STEP_RE.search(line)
            if found:
                first_step, planned, step = int(found.group(1)), int(found.group(2)), None
                continue
        if "Stats (" in line:
            found = STATS_RE.search(line)
            if found and first_step is not None:
                step = first_step + int(found.group(1)) - 1
                continue
        if step is None:
            continue
        if TABLE_END in line:  # what follows is not this dict's, until the next "Stats (i/n):"
            step = None
            continue
        if CELL_SEPARATOR not in line:
            continue
        cells = [cell.strip() for cell in line.strip().strip(CELL_SEPARATOR).split(CELL_SEPARATOR)]
        if len(cells) % 2:
            out.problems.append(
                Problem(path.name, number, f"a stats row with an odd number of cells (a key without its value?): {short(line)}")
            )
            continue
        record = records.get(step)
        if record is None:
            record = records[step] = StepRecord(step, {}, number)
            out.records.append(record)
        for key, value in zip(cells[::2], cells[1::2], strict=True):
            if not key:  # the last row's empty cells
                continue
            parsed = number_text(value)
            if isinstance(parsed, (int, float)):
                record.values[key] = parsed
            else:
                out.problems.append(Problem(path.name, number, f"{key}: a value that is not a number: {short(value)}"))
    if planned is not None:
        apply_settings(out, {"max_steps": planned}, "AReaL's 'Train step N/total' lines")
