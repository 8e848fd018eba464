"""Jupyter notebooks (``.ipynb``) as a run's log.

A notebook keeps what its code cells printed (stream outputs, results) and, for a Trainer run
inside it, the table transformers' notebook progress display draws (HTML: ``Step | Training Loss |
reward | rewards / <func> | ...``, one row per logged step, under a ``<progress value=N max=M>``
bar and its ``[ N/M time < left, ...]`` text). :func:`notebook_console` turns a notebook into the
console text a terminal run would have shown, in cell order, with each such table written as
tab-separated lines under a ``Step`` header; :func:`read_notebook_table` reads those lines
(format ``hf-notebook``), and the rest of the text says how the run ended (a traceback, a
``TrainOutput`` with its ``train_runtime``). Markdown cells are left out: a notebook's prose often
holds an example table of another run.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from otel_rl.replay._log import ParsedLog, StepRecord
from otel_rl.replay._settings import apply_settings
from otel_rl.runs.folder import Problem

TABLE_HEADER = "Step\t"  # the first cell of a table's header line, as notebook_console writes it
# transformers' display names for the Trainer's keys; every other column is the key with " / " for "/".
_COLUMN_KEYS = {"Training Loss": "loss", "Validation Loss": "eval_loss", "Epoch": "epoch"}
_PROGRESS_RE = re.compile(r"^\[\s*(\d+)/(\d+)\s")


def is_notebook(path: Path, head: str) -> bool:
    """Whether the file is a Jupyter notebook (by its name, or a JSON document that opens with cells)."""
    start = head.lstrip()[:4096]
    return path.suffix == ".ipynb" or (start.startswith("{") and '"cells"' in start and '"cell_type"' in head[:65536])


class _TableParser(HTMLParser):
    """The rows of every ``<table>`` (header cells included) and the text outside tables."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.text: list[str] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._depth += 1
            self.tables.append([])
        elif tag == "tr" and self._depth:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._depth = max(0, self._depth - 1)
        elif tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[-1].append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        elif not self._depth and data.strip():
            self.text.append(data.strip())


def _joined(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else value if isinstance(value, str) else ""


def _html_lines(html: str) -> list[str] | None:
    """A progress display's lines (its ``[N/M ...]`` text, then each training table under its header),
    or None when the HTML holds no table whose first column is ``Step``."""
    parser = _TableParser()
    try:
        parser.feed(html)
    except Exception:  # noqa: BLE001 - malformed HTML: the output is read as no table
        return None
    tables = [t for t in parser.tables if t and t[0] and t[0][0] == "Step"]
    if not tables:
        return None
    lines = list(parser.text)
    for table in tables:
        lines.extend("\t".join(cell.replace("\t", " ") for cell in row) for row in table)
    return lines


def notebook_console(text: str) -> tuple[str, str, bool] | None:
    """The console text of a notebook's code cells (see the module doc), a note saying what was read,
    and whether a training table was among it; None when ``text`` is not a notebook's JSON."""
    try:
        notebook = json.loads(text)
    except (ValueError, RecursionError):
        return None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        return None
    lines: list[str] = []
    code = tables = 0
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        code += 1
        for output in cell.get("outputs") or ():
            if not isinstance(output, dict):
                continue
            if output.get("output_type") == "stream":
                lines.append(_joined(output.get("text")).rstrip("\n"))
                continue
            if output.get("output_type") == "error":
                lines.append("Traceback (most recent call last):")
                lines.append(f"{output.get('ename', 'Error')}: {output.get('evalue', '')}")
                continue
            data = output.get("data")
            if not isinstance(data, dict):
                continue
            table = _html_lines(_joined(data.get("text/html"))) if "text/html" in data else None
            if table is not None:
                tables += 1
                lines.extend(table)
            elif "text/plain" in data:
                lines.append(_joined(data["text/plain"]).rstrip("\n"))
    note = f"a Jupyter notebook: the outputs of its {code:,} code cells are read, in order"
    if tables:
        note += f"; its {tables:,} training table(s) of transformers' notebook display give the steps"
    return "\n".join(lines) + "\n", note, bool(tables)


def read_notebook_table(path: Path, text: str, out: ParsedLog) -> None:
    """The rows of each ``Step`` table in ``text`` (see :func:`notebook_console`) as step records,
    and the planned total from the progress text above it."""
    name = path.name
    columns: list[str] | None = None
    table = 0  # each table is a run of its own (an SFT warm-up, then the GRPO run): one segment each
    progress_of: dict[int, tuple[int, int]] = {}  # table -> (planned total, line) from the progress above it
    progress: tuple[int, int] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        bar = _PROGRESS_RE.match(line)
        if bar:
            progress = (int(bar.group(2)), number)
            continue
        if line.startswith(TABLE_HEADER):
            columns = [_COLUMN_KEYS.get(c, c.replace(" / ", "/")) for c in line.split("\t")]
            table += 1
            if progress is not None:
                progress_of[table], progress = progress, None
            continue
        if "\t" not in line:
            if line.strip():
                columns = None  # text after a table ends it
            continue
        if columns is None:
            continue
        cells = line.split("\t")
        if len(cells) != len(columns) or not cells[0].strip().isdigit():
            out.problems.append(Problem(name, number, f"a table row with {len(cells)} cells under {len(columns)} columns: skipped"))
            continue
        values: dict[str, Any] = {}
        for key, cell in zip(columns[1:], cells[1:]):
            cell = cell.strip()
            if not cell or cell == "No log":  # transformers' placeholder for a value not logged at that step
                continue
            try:
                values[key] = float(cell)
            except ValueError:
                values[key] = cell
        out.records.append(StepRecord(int(cells[0]), values, number, segment=table))
    # The planned total of the run that is read: the last table's (the one read unless --segment says)
    last = max((r.segment for r in out.records), default=0)
    if last in progress_of:
        planned, line = progress_of[last]
        apply_settings(out, {"max_steps": planned}, f"the notebook's progress display (line {line})")
