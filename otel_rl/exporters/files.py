"""The names of a run folder's files: what the embedded exporters write and the readers read."""

from __future__ import annotations

import re

TRACES_FILE = "traces.jsonl"
METRICS_FILE = "metrics.jsonl"
LOGS_FILE = "logs.jsonl"


def rank_file_name(file_name: str, rank: int | None) -> str:
    """The file a rank writes in a shared run folder: ``traces.jsonl`` for rank 0 (and a
    single process), ``traces.rank3.jsonl`` for rank 3, so processes never share a file."""
    if not rank:
        return file_name
    stem, dot, ext = file_name.rpartition(".")
    return f"{stem}.rank{rank}{dot}{ext}"


_RUN_FILE = re.compile(r"^(?:(?:traces|metrics|logs)(?:\.rank\d+)?\.jsonl|run\.json|\.lock\.rank\d+)$")


def is_run_file(name: str) -> bool:
    """Whether a file of this name in a run folder is the run's own (what its writers write, its readers read)."""
    return _RUN_FILE.match(name) is not None
