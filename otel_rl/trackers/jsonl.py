"""``track_with: jsonl``: verl's file logger format, one line per step.

verl's ``FileLogger`` (``trainer.logger=[file]``, verl/utils/tracking.py) writes
``{"step": N, "data": {...}}`` per ``log()`` call with ``orjson.dumps``: compact separators,
UTF-8 text, and NaN / infinities written as ``null`` (orjson's rule; verl used ``json.dumps``,
which writes a non-standard ``NaN``, until it switched to orjson). This writes the same bytes
with the standard library: finite numbers as they are, bools as ``true``/``false``, strings as
text, non-finite floats as ``null``; ``None`` values and other objects are left out, so a
``null`` in the file always means a non-finite number.

Rollout samples (``log_samples``): one line per step, ``{"step": N, "samples": [row, ...]}``, each row
an ``rl.sample`` body (text, numbers, bools); readers of verl's format skip lines without
``data`` (:func:`read_jsonl` does), :func:`read_jsonl_samples` reads them.

Settings: ``path`` (the file), or ``log_dir`` (then ``log_dir/metrics.jsonl``); default
``run_dir/jsonl/metrics.jsonl`` (``run_dir/metrics.jsonl`` is the OTLP metrics file). verl's
``VERL_FILE_LOGGER_PATH`` environment variable is not read: the caller decides paths. Lines are
appended (verl truncates), each in one unbuffered write, so a crash never loses a finished step
and a resumed run never erases an earlier one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from otel_rl.trackers.base import Tracker, to_scalar

__all__ = ["JsonlTracker", "read_jsonl", "read_jsonl_samples"]

FILE_NAME = "metrics.jsonl"
OTLP_METRICS_FILE = "metrics.jsonl"  # the run folder's OTLP metrics file, which must not be shared


class JsonlTracker(Tracker):
    name = "jsonl"
    extra = None
    options = {"path": None, "log_dir": None}

    def __init__(self, *, run_name: str, run_dir: Path | None, **tracker_kwargs: Any) -> None:
        super().__init__(run_name=run_name, run_dir=run_dir, **tracker_kwargs)
        if self.settings["path"]:
            self.path = Path(self.settings["path"])
        else:
            self.path = self.default_dir("log_dir", "jsonl") / FILE_NAME
        if self.run_dir is not None and self.path.resolve() == (self.run_dir / OTLP_METRICS_FILE).resolve():
            raise ValueError(f"jsonl tracker: {self.path} is the run folder's OTLP metrics file; choose another path")
        self._file: IO[bytes] | None = None

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held open until finish()

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        if self._file is None:
            raise RuntimeError("jsonl tracker: log() before start()")
        data: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, (bool, str)):
                data[key] = value
            elif (number := to_scalar(value)) is not None:
                data[key] = number if isinstance(number, int) or math.isfinite(number) else None
            elif value is not None:
                self.report_once(key, f"is left out: {type(value).__name__} is not a number or text")
        self._write({"step": step, "data": data})

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int | None) -> None:
        if self._file is None:
            raise RuntimeError("jsonl tracker: log_samples() before start()")
        clean = [{k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in row.items()} for row in rows]
        self._write({"step": step, "samples": clean})

    def _write(self, record: Mapping[str, Any]) -> None:
        assert self._file is not None
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
        self._file.write(line.encode() + b"\n")

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_jsonl(path: str | Path) -> list[tuple[int | None, dict[str, Any]]]:
    """``(step, data)`` per line of a verl-format file (ours or verl's); sample lines are skipped."""
    with open(path, encoding="utf-8") as f:
        return [(record["step"], record["data"]) for record in map(json.loads, filter(str.strip, f)) if "data" in record]


def read_jsonl_samples(path: str | Path) -> list[tuple[int | None, list[dict[str, Any]]]]:
    """``(step, rows)`` per sample line of a file the jsonl tracker wrote."""
    with open(path, encoding="utf-8") as f:
        return [(record["step"], record["samples"]) for record in map(json.loads, filter(str.strip, f)) if "samples" in record]
