"""Where a command's ``--out`` may write: never over a run folder's own files, and every path it
cannot use said in one line, exit status 2, before any work (or, for a write that fails on the way,
right after it) instead of a traceback, a silent overwrite or "wrote 5 rows"."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from otel_rl.exporters.files import is_run_file


def _run_file_of(target: Path, inputs: Iterable[str | os.PathLike[str]]) -> Path | None:
    """The run folder among ``inputs`` whose own file ``target`` is (a run folder, or one of its files given directly)."""
    resolved = target.resolve()
    for given in inputs:
        source = Path(given).resolve()
        if source == resolved and source.is_file():
            return source.parent  # the input file itself (a logs.jsonl given directly, a log to analyze)
        if source.is_dir() and resolved.parent == source and is_run_file(resolved.name):
            return source
    return None


def out_file_problem(out: str, inputs: Iterable[str | os.PathLike[str]] = ()) -> str | None:
    """Why ``out`` cannot be the file a command writes, in words naming the fix; None when it can."""
    target = Path(out)
    if target.is_dir():
        return f"--out {out} is a folder: give a file name (e.g. {target / 'out.csv'})"
    parent = target.parent
    if not parent.is_dir():
        return f"--out {out}: the folder {parent} does not exist (create it first: mkdir -p {parent})"
    owner = _run_file_of(target, inputs)
    if owner is not None:
        return f"--out {out} is a file the command reads (of {owner}): writing it would destroy the run's data; write elsewhere"
    if target.exists() and not target.is_file() and not target.is_char_device():
        return f"--out {out} is not a regular file"
    return None


def out_dir_problem(out: str, inputs: Iterable[str | os.PathLike[str]] = ()) -> str | None:
    """Why ``out`` cannot be the folder a command writes its files into; None when it can."""
    target = Path(out)
    if target.exists() and not target.is_dir():
        return f"--out {out} is a file, not a folder: give a folder (it is created if missing)"
    if _run_file_of(target, inputs) is not None:
        return f"--out {out} is a file the command reads"
    ancestor = target
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        return f"--out {out}: cannot create a folder under {ancestor} (not a writable folder)"
    return None


def write_error(out: str, exc: OSError) -> str:
    """One line for a write to ``out`` that failed (a full disk, /dev/full, a folder that vanished)."""
    return f"cannot write {out}: {exc.strerror or exc}"
