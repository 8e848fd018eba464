"""How a run ended, from the log's own lines: finished, stopped before its planned total, or crashed.

An engineer reads the end of a log before its curves: a traceback while saving a checkpoint, a CUDA
out-of-memory error, an NCCL watchdog timeout or a full disk after the last logged step is the
run's outcome, whatever its metrics did. An error the run survived (records go on after it) is
not its end: it is counted, not called a crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from otel_rl.replay._checks import iter_blocks
from otel_rl.replay._log import ANSI_RE, ParsedLog

FINISHED = "finished"
STOPPED = "stopped"  # fewer steps than planned, with nothing that says why
CRASHED = "crashed"
UNKNOWN = "unknown"

# A fatal line names its cause; the first that matches a line names it. Checked on lines that
# carry one of _CUES only, so a 10^6-line log costs one substring test per line.
_CAUSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("disk full", re.compile(r"No space left on device|Disk quota exceeded", re.I)),
    ("GPU out of memory", re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|HIP out of memory")),
    ("NCCL timeout", re.compile(r"NCCL.*(?:timeout|timed out|Watchdog caught)|Watchdog caught collective operation timeout", re.I)),
    ("NCCL error", re.compile(r"NCCL (?:error|WARN.*failed)|ncclUnhandledCudaError|ncclSystemError|ncclInternalError")),
    ("process killed", re.compile(r"(?:^|\s)Killed\s*$|SIGKILL|oom-kill|exit code -9|exitcode\s*:\s*-9|signal 9\b")),
    ("segmentation fault", re.compile(r"Segmentation fault|SIGSEGV|core dumped")),
    ("write failed", re.compile(r"failed writing file|file write failed|Input/output error")),
    ("Ray actor died", re.compile(r"ActorDiedError|The actor died unexpectedly|Worker.*died unexpectedly")),
)
# Exceptions that only carry another one (Ray's task error, Hydra's job error, torchrun's child
# failure): the one they carry names the cause.
_WRAPPERS = ("RayTaskError", "RaySystemError", "ChildFailedError", "HydraException", "InstantiationException")
_CUES: tuple[str, ...] = (
    "space left",
    "quota",
    "out of memory",
    "OutOfMemory",
    "NCCL",
    "nccl",
    "Watchdog",
    "Killed",
    "SIGKILL",
    "oom-kill",
    "write failed",
    "writing file",
    "Input/output error",
    "exit code",
    "exitcode",
    "signal 9",
    "Segmentation",
    "SIGSEGV",
    "core dumped",
    "ActorDied",
    "RayTaskError",
    "died unexpectedly",
)
_ALL_CUES = ("Traceback", *_CUES)
_CUE_RE = re.compile("|".join(re.escape(cue) for cue in _ALL_CUES))  # one search a line, not one test per cue
_TRACEBACK = "Traceback (most recent call last)"
# The exception line closing a traceback: "KeyError: 'x'", "torch.OutOfMemoryError: ...", with an
# optional Ray prefix "(TaskRunner pid=1) ".
_EXCEPTION_RE = re.compile(r"^(?:\([^)]*\)\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Timeout|Failure)\b:?.*)$")
_FINISH_MARKERS = (
    "'train_runtime'",
    '"train_runtime"',
    "Training completed",
    "Training finished",
    "training finished",
    "Final validation metrics",
)
# A progress bar at its total ("700/700"), not tqdm's rounded "100%" at 697/700.
_BAR_DONE_RE = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")
# transformers' notebook display: "[250/250 15:26, Epoch 0/1]" (the text beside its HTML bar).
_NOTEBOOK_BAR_RE = re.compile(r"^\[\s*(\d+)/(\d+)\s")


@dataclass
class RunEnding:
    """How the run read ended. ``step`` is the last step logged before the end; ``line`` the
    1-based line of the evidence (the exception's or the fatal message's)."""

    status: str  # finished | stopped | crashed | unknown
    step: int | None = None
    planned: int | None = None  # the planned total, where the log states it
    cause: str = ""  # "disk full", "GPU out of memory", "KeyError", ...
    evidence: str = ""  # the log's own line, shortened
    line: int | None = None
    survived: list[tuple[int, str]] = field(default_factory=list)  # (line, error) of errors records went on after

    @property
    def text(self) -> str:
        """One sentence, as the report says it."""
        where = f"after step {self.step}" if self.step is not None else "before any step"
        if self.status == CRASHED:
            line = f" (line {self.line})" if self.line else ""
            planned = f" of a planned {self.planned}" if self.planned else ""
            return f"the run crashed {where}{planned}: {self.cause}{line}: {self.evidence}"
        if self.status == STOPPED:
            return f"the log ends at step {self.step} of a planned {self.planned}, with no error and no end of training in it"
        if self.status == FINISHED:
            return f"the run finished at step {self.step}" + (f" of {self.planned}" if self.planned else "")
        return "how the run ended is not in the log"

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v not in (None, "", [])}
        out["text"] = self.text
        return out


def _short(text: str, limit: int = 160) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _better(name: str, than: str) -> bool:
    """Whether cause ``name`` says more than ``than``: a named cause (disk full, OOM) beats an
    exception, and an exception beats the wrapper that carried it."""
    causes = dict(_CAUSES)
    if than in causes:
        return False
    if name in causes:
        return True
    return than.startswith(_WRAPPERS) and not name.startswith(_WRAPPERS)


def _bar_done(line: str) -> bool:
    m = (_BAR_DONE_RE.search(line) or _NOTEBOOK_BAR_RE.match(line)) if "/" in line and "[" in line else None
    return m is not None and m.group(1) == m.group(2) and int(m.group(2)) > 1


def read_ending(text: str, out: ParsedLog) -> RunEnding:
    """The run's ending from the whole text of a log (after its records were read into ``out``)."""
    last_record_line = max((r.line for r in out.records), default=0)
    last_step = max((r.step for r in out.records), default=None)
    planned = out.settings.get("max_steps")
    planned = planned if isinstance(planned, int) and not isinstance(planned, bool) and planned > 0 else None
    fatal: tuple[int, str, str] | None = None  # (line, cause, evidence) of the first error after the last record
    survived: list[tuple[int, str]] = []
    survived_names: set[str] = set()
    finished_at = 0  # line of the first end-of-training marker after the last record
    bar_done = False  # a progress bar at its total after the last record
    in_traceback = False
    number = 0
    for piece in iter_blocks(text):
        lines = piece.splitlines()
        if not in_traceback and number + len(lines) <= last_record_line and not any(cue in piece for cue in _ALL_CUES):
            # a megabyte of records with no cue in it: a substring test per cue (faster than the
            # regex's alternation), not one search a line
            number += len(lines)
            continue
        for raw in lines:
            number += 1
            if in_traceback or _CUE_RE.search(raw):
                line = ANSI_RE.sub("", raw) if "\x1b" in raw else raw
                if _TRACEBACK in line:
                    in_traceback = True
                    continue
                cause = next((name for name, pattern in _CAUSES if pattern.search(line)), None)
                exception = None
                if in_traceback and not line[:1].isspace():
                    m = _EXCEPTION_RE.match(line.strip())
                    if m is not None:
                        exception = m.group(1)
                        in_traceback = False
                if cause is None and exception is None:
                    continue
                name = cause if cause is not None else str(exception).split(":", 1)[0].rsplit(".", 1)[-1]
                if number <= last_record_line:
                    survived_names.add(name)
                    if len(survived) < 20:
                        survived.append((number, _short(exception or line, 120)))
                elif name in survived_names:
                    continue  # the run lived through this error before (a worker's caught exception): not its end
                elif fatal is None or _better(name, fatal[1]):
                    fatal = (number, str(name), _short(exception or line))
            elif number > last_record_line and not finished_at and any(marker in raw for marker in _FINISH_MARKERS):
                finished_at = number
            elif number > last_record_line and not bar_done and _bar_done(raw):
                bar_done = True
    finished = bool(finished_at) or bar_done or out.settings.get("train_runtime") is not None
    # An error after the trainer said it was done is its shutdown; a progress bar at its total is no
    # such word (the final checkpoint and validation come after it).
    if fatal is not None and finished_at and finished_at < fatal[0]:
        survived.append((fatal[0], f"after the end of training: {fatal[2]}"))  # a shutdown error, not the run's end
        fatal = None
    if fatal is not None:
        line, cause, evidence = fatal
        return RunEnding(CRASHED, last_step, planned, cause, evidence, line, survived)
    if finished:
        return RunEnding(FINISHED, last_step, planned, survived=survived)
    if planned is not None and last_step is not None and last_step < 0.9 * planned:
        return RunEnding(STOPPED, last_step, planned, survived=survived)
    return RunEnding(UNKNOWN, last_step, planned, survived=survived)
