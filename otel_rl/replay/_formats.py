"""Readers of the training logs RL frameworks write, into one shape: per-step key -> value records.

Formats (``FORMATS``), each read exactly as its framework writes it:

- ``swift``: ms-swift's ``logging.jsonl`` (one JSON object per line; ``global_step/max_steps``
  "12/500", ``elapsed_time`` "5m 18s", ``train_speed(iter/s)`` or ``train_speed(s/it)``,
  optional ``percentage`` and ``memory(GiB)``).
- ``trl-state``: a Hugging Face / TRL ``trainer_state.json`` (its ``log_history`` list).
- ``hf-console``: a Hugging Face Trainer's console output: ``str(dict)`` lines written by
  ``ProgressCallback.on_log`` through ``tqdm.write`` between progress-bar refreshes (``\\r``),
  values either numbers or, in newer versions, ``f"{v:.4g}"`` strings.
- ``verl-jsonl``: verl's ``FileLogger`` (``{"step": N, "data": {...}}``; NaN written as null).
- ``verl-console``: verl's ``LocalLogger`` (``step:N - key:value - ...``), possibly behind Ray's
  ``(TaskRunner pid=...)`` prefix and ANSI colour codes; values ``0.123`` (``{:.3f}`` in older
  verl) or ``pprint.pformat`` text such as ``np.float64(0.123)``.
- ``roll-stdout``: ROLL's stdout tracker (``metrics_tag: {"step": N, "metrics": {...}}`` after the
  logger's prefix, which may hold a timestamp).
- ``otel-rl``: an otel-rl run folder (or its ``logs.jsonl``): the ``rl.log`` events.

Every reader skips a malformed line, records it as a :class:`Problem` (file, 1-based line,
reason) and goes on: one bad line never aborts a file.
"""

from __future__ import annotations

import ast
import bisect
import calendar
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._keys import TRANSFORMS
from .._runfolder import LOGS_FILE, Problem, read_log_records
from ..semconv import attributes as A
from ..semconv import names as N

__all__ = [
    "FORMATS",
    "FRAMEWORK_OF",
    "ParsedLog",
    "StepRecord",
    "detect_format",
    "parse_file",
]

#: Format name -> the framework whose key mapping its keys go through.
FRAMEWORK_OF: dict[str, str | None] = {
    "swift": "swift",
    "trl-state": "trl",
    "hf-console": "trl",
    "verl-jsonl": "verl",
    "verl-console": "verl",
    "roll-stdout": "roll",
    "otel-rl": None,  # the run's own rl.framework resource attribute says
}
FORMATS: tuple[str, ...] = tuple(FRAMEWORK_OF)

# Clock kinds: where a record's time comes from.
CLOCK_TIMESTAMP = "timestamp"  # absolute wall time in the log
CLOCK_ELAPSED = "elapsed"  # seconds since the run started (ms-swift elapsed_time, tqdm elapsed)
CLOCK_DURATIONS = "durations"  # cumulated per-step durations (verl timing_s/step)
CLOCK_NONE = "none"

_DETECT_BYTES = 256 * 1024
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


@dataclass(slots=True)
class StepRecord:
    """One logged step: ``values`` exactly as the framework logged them (strings stay strings).

    ``time_ns`` is absolute wall time when the log holds it; ``elapsed_s`` seconds since the run's
    start when the log holds that instead. ``line`` is the 1-based line the record starts on.
    """

    step: int
    values: dict[str, Any]
    line: int
    time_ns: int | None = None
    elapsed_s: float | None = None


@dataclass
class ParsedLog:
    """Everything read from one log file."""

    path: Path
    format: str
    framework: str | None
    records: list[StepRecord]
    problems: list[Problem] = field(default_factory=list)
    lines: int = 0
    clock: str = CLOCK_NONE
    settings: dict[str, Any] = field(default_factory=dict)  # run settings the log shows (max_steps, ...)
    notes: list[str] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)  # otel-rl run folders only

    @property
    def points(self) -> int:
        """Key -> value pairs in all records."""
        return sum(len(r.values) for r in self.records)


class FormatError(ValueError):
    """The file's format cannot be told, or it is not the format asked for."""


# --------------------------------------------------------------------------------------------------
# Small helpers


def _line_starts(text: str) -> list[int]:
    starts = [0]
    find = text.find
    pos = find("\n")
    while pos >= 0:
        starts.append(pos + 1)
        pos = find("\n", pos + 1)
    return starts


def _line_of(starts: list[int], offset: int) -> int:
    return bisect.bisect_right(starts, offset)


def _short(text: str, limit: int = 60) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


_TIMESTAMP_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?"
)


def parse_timestamp(text: str) -> int | None:
    """Nanoseconds of the first ``YYYY-MM-DD HH:MM:SS[.fff][zone]`` in ``text``; a time without
    a zone is read as UTC (loggers print local time: pass the run's offset through --start-time
    when that matters)."""
    m = _TIMESTAMP_RE.search(text)
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, zone = m.groups()
    try:
        seconds = calendar.timegm((int(year), int(month), int(day), int(hour), int(minute), int(second), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    nanos = int((frac or "0").ljust(9, "0")[:9])
    return seconds * 1_000_000_000 + nanos


def _number_text(value: str) -> Any:
    """A numeric string as a number (HF writes f"{v:.4g}" strings); anything else unchanged."""
    text = value.strip()
    if not text or text[0] not in "+-.0123456789ni":
        return value
    try:
        number = float(text)
    except ValueError:
        return value
    if number.is_integer() and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return number


# --------------------------------------------------------------------------------------------------
# ms-swift logging.jsonl


_SWIFT_MARKERS = ("global_step/max_steps", "train_speed(", "elapsed_time", "remaining_time", "memory(GiB)")
_duration_text = TRANSFORMS["duration_text"]


def _json_lines(name: str, text: str, out: ParsedLog) -> Iterator[tuple[int, str, Any]]:
    """(line number, line, parsed JSON) of each non-blank line; a line that is not JSON is
    reported with its number and skipped."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            out.problems.append(Problem(name, number, f"not JSON ({exc.msg}): {_short(line)}"))
            continue
        yield number, line, obj


def _read_swift(path: Path, text: str, out: ParsedLog) -> None:
    ordinal = 0
    previous_step: int | None = None
    max_steps: set[int] = set()
    name = path.name
    for number, line, obj in _json_lines(name, text, out):
        if not isinstance(obj, dict):
            out.problems.append(Problem(name, number, f"not a JSON object: {_short(line)}"))
            continue
        ordinal += 1
        step: int | None = None
        progress = obj.get("global_step/max_steps")
        if isinstance(progress, str) and "/" in progress:
            head, _, tail = progress.partition("/")
            try:
                step, total = int(head), int(tail)
                max_steps.add(total)
            except ValueError:
                out.problems.append(Problem(name, number, f"global_step/max_steps {progress!r} is not 'N/M'; step taken from the line order"))
        elif isinstance(obj.get("step"), int):
            step = obj["step"]
        if step is None:
            step = ordinal if previous_step is None else previous_step + 1
        elapsed = obj.get("elapsed_time")
        elapsed_s: float | None = None
        if elapsed is not None:
            try:
                elapsed_s = float(_duration_text(elapsed))
            except (TypeError, ValueError):
                out.problems.append(Problem(name, number, f"elapsed_time {elapsed!r} is not a duration; the step keeps no time"))
        if previous_step is not None and step <= previous_step:
            out.notes.append(f"line {number}: step went back from {previous_step} to {step} "
                             "(a resumed or another run appended to the same file)")
        previous_step = step
        out.records.append(StepRecord(step, obj, number, elapsed_s=elapsed_s))
    if max_steps:
        out.settings["max_steps"] = max(max_steps) if len(max_steps) == 1 else sorted(max_steps)
        if len(max_steps) > 1:
            out.notes.append(f"rows of {len(max_steps)} runs (max_steps {sorted(max_steps)}) are in this file")
    if out.records and all(r.elapsed_s is not None for r in out.records):
        out.clock = CLOCK_ELAPSED


# --------------------------------------------------------------------------------------------------
# trainer_state.json


_STATE_SETTINGS = ("max_steps", "logging_steps", "eval_steps", "save_steps", "train_batch_size", "num_train_epochs")


def _read_trl_state(path: Path, text: str, out: ParsedLog) -> None:
    name = path.name
    starts = _line_starts(text)
    decoder = json.JSONDecoder()
    key_at = text.find('"log_history"')
    if key_at < 0:
        raise FormatError(f"{path}: no \"log_history\" in this JSON file; it is not a trainer_state.json")
    # Settings: the whole document when it parses (a truncated file keeps its log entries below).
    try:
        whole = json.loads(text)
        if isinstance(whole, dict):
            out.settings.update({k: whole[k] for k in _STATE_SETTINGS if whole.get(k) is not None})
    except ValueError as exc:
        out.problems.append(Problem(name, _line_of(starts, exc.pos) if hasattr(exc, "pos") else 1,
                                    "the file is not complete JSON (truncated?); log entries before the break are read"))
    pos = text.find("[", key_at)
    if pos < 0:
        raise FormatError(f"{path}: \"log_history\" is not a list")
    pos += 1
    length = len(text)
    previous: int | None = None
    ws = " \t\r\n,"
    while pos < length:
        while pos < length and text[pos] in ws:
            pos += 1
        if pos >= length or text[pos] == "]":
            break
        try:
            entry, end = decoder.raw_decode(text, pos)
        except ValueError as exc:
            line = _line_of(starts, pos)
            # Resynchronise on the next entry that starts at this one's indentation.
            indent = pos - starts[line - 1]
            nxt = re.compile(r"\n" + r"[ \t]" * indent + r"\{").search(text, pos + 1)
            out.problems.append(Problem(name, line, f"log_history entry is not valid JSON ({exc.msg})"))
            if nxt is None:
                break
            pos = nxt.start() + 1
            continue
        line = _line_of(starts, pos)
        pos = end
        if not isinstance(entry, dict):
            out.problems.append(Problem(name, line, "log_history entry is not an object"))
            continue
        step = entry.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            out.problems.append(Problem(name, line, f"log_history entry without an integer \"step\" ({step!r})"))
            continue
        if previous is not None and step < previous:
            out.notes.append(f"line {line}: step went back from {previous} to {step}")
        previous = step
        values = {k: v for k, v in entry.items() if k != "step"}
        out.records.append(StepRecord(step, values, line))


# --------------------------------------------------------------------------------------------------
# Hugging Face Trainer console


# tqdm's default bar: "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_TQDM_RE = re.compile(r"\|\s*(\d+)/(\d+)\s*\[(?:(\d+):)?(\d+):(\d+)(?:<|\])")
_HF_DICT_RE = re.compile(r"\{\s*['\"].*\}")
_HF_DICT_START_RE = re.compile(r"\{\s*'[^']*':")
# Values str(dict) writes that literal_eval does not read: nan/inf, torch tensors (older
# Trainers logged grad_norm as a tensor), numpy 2 scalars' repr.
_BARE_NONFINITE_RE = re.compile(r"(?<=: )(-?inf|nan)(?=, |\})")
_TENSOR_RE = re.compile(r"tensor\(\s*([-+0-9.eE]+|-?nan|-?inf)\s*(?:,[^()]*)?\)")
_NUMPY_RE = re.compile(r"np\.(?:float|int|uint|bool_)\w*\(\s*([^()]*?)\s*\)")


def _literal_dict(text: str) -> dict[str, Any]:
    # str(dict) of plain keys and numbers / number strings is JSON once quotes are swapped; that is
    # ~10x cheaper than literal_eval, which stays the reader for everything else.
    if '"' not in text and "\\" not in text:
        try:
            value = json.loads(text.replace("'", '"'))
        except ValueError:
            value = None
        if isinstance(value, dict):
            return {str(k): _number_text(v) if isinstance(v, str) else v for k, v in value.items()}
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        cleaned = _NUMPY_RE.sub(r"\1", _TENSOR_RE.sub(r"\1", text))
        cleaned = _BARE_NONFINITE_RE.sub(lambda m: repr(m.group(0)), cleaned)
        value = ast.literal_eval(cleaned)  # raises for the caller to report
    if not isinstance(value, dict):
        raise ValueError("not a dict")
    out: dict[str, Any] = {}
    for key, item in value.items():
        out[str(key)] = _number_text(item) if isinstance(item, str) else item
    return out


def _read_hf_console(path: Path, text: str, out: ParsedLog) -> None:
    name = path.name
    train_total: int | None = None
    last_bar: tuple[int, float | None] | None = None
    # (line, values, bar seen before it) for each dict; the bar refresh tqdm.write prints right
    # after a dict shows the step it was logged at, so steps are assigned once the next bar is seen.
    pending: list[tuple[int, dict[str, Any], tuple[int, float | None] | None]] = []
    ordinal = 0

    def settle(bar: tuple[int, float | None] | None) -> None:
        nonlocal ordinal
        for line, values, before in pending:
            ordinal += 1
            chosen = bar or before
            explicit = values.get("step")
            if isinstance(explicit, int) and not isinstance(explicit, bool):
                step = explicit
                values = {k: v for k, v in values.items() if k != "step"}
            elif chosen is not None:
                step = chosen[0]
            else:
                step = ordinal
            out.records.append(StepRecord(step, values, line, elapsed_s=chosen[1] if chosen else None))
        pending.clear()

    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        for segment in raw.split("\r"):
            segment = _ANSI_RE.sub("", segment)
            if not segment.strip():
                continue
            dict_match = _HF_DICT_RE.search(segment)
            # A bar drawn before a dict on the same segment (print() without tqdm.write) counts first.
            for bar in _TQDM_RE.finditer(segment, 0, dict_match.start() if dict_match else len(segment)):
                n, total = int(bar.group(1)), int(bar.group(2))
                if train_total is None:
                    train_total = total  # the first bar is the training bar; eval bars come later
                if total == train_total:
                    hours, minutes, seconds = bar.group(3), bar.group(4), bar.group(5)
                    elapsed = int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)
                    last_bar = (n, float(elapsed))
                    if pending:
                        settle(last_bar)
            if dict_match is None:
                start = _HF_DICT_START_RE.search(segment)
                if start is not None:
                    out.problems.append(Problem(name, number, f"a dict line cut off (no closing brace): {_short(segment[start.start():])}"))
                continue
            body = dict_match.group(0)
            try:
                values = _literal_dict(body)
            except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
                out.problems.append(Problem(name, number, f"a dict line that Python cannot read ({type(exc).__name__}): {_short(body)}"))
                continue
            if pending:
                settle(last_bar)
            pending.append((number, values, last_bar))
    settle(None)
    if train_total is not None:
        out.settings["max_steps"] = train_total
    if out.records and all(r.elapsed_s is not None for r in out.records):
        out.clock = CLOCK_ELAPSED


# --------------------------------------------------------------------------------------------------
# verl


def _read_verl_jsonl(path: Path, text: str, out: ParsedLog) -> None:
    name = path.name
    nulls = 0
    previous: int | None = None
    for number, _, obj in _json_lines(name, text, out):
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), dict):
            out.problems.append(Problem(name, number, "not a verl file-logger line ({\"step\": N, \"data\": {...}})"))
            continue
        step = obj.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = (previous or 0) + 1
            out.problems.append(Problem(name, number, f"step {obj.get('step')!r} is not an integer; taken as {step}"))
        data = obj["data"]
        values = {k: v for k, v in data.items() if v is not None}
        nulls += len(data) - len(values)
        previous = step
        out.records.append(StepRecord(step, values, number))
    if nulls:
        out.notes.append(f"{nulls} null value(s) skipped (verl's orjson writes NaN and infinities as null)")
    _clock_from_step_durations(out)


_VERL_STEP_RE = re.compile(r"(?:^|\s|\))step:(-?\d+)((?: - [^\s].*)?)$")
_RAY_REPEATED_RE = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_PFORMAT_RE = re.compile(r"^(?:np|numpy|torch)\.\w+\((.*)\)$")


def _verl_value(text: str) -> Any:
    text = text.strip()
    wrapped = _PFORMAT_RE.match(text)
    if wrapped:
        text = wrapped.group(1).split(",")[0].strip()
    if text in ("True", "False"):
        return text == "True"
    number = _number_text(text)
    if isinstance(number, str):
        raise ValueError(f"value {text!r} is not a number")
    return number


def _read_verl_console(path: Path, text: str, out: ParsedLog) -> None:
    name = path.name
    for number, raw in enumerate(text.splitlines(), start=1):
        if "step:" not in raw:
            continue
        line = _RAY_REPEATED_RE.sub("", _ANSI_RE.sub("", raw)).rstrip()
        m = _VERL_STEP_RE.search(line)
        if m is None:
            continue
        step = int(m.group(1))
        values: dict[str, Any] = {}
        bad: list[str] = []
        for part in m.group(2).split(" - ")[1:]:
            key, sep, value = part.rpartition(":")
            if not sep or not key:
                bad.append(part)
                continue
            try:
                values[key.strip()] = _verl_value(value)
            except ValueError:
                bad.append(part)
        if bad:
            out.problems.append(Problem(name, number, f"{len(bad)} part(s) not 'key:number' skipped: {_short(bad[0])}"))
        if not values and bad:
            continue
        stamp = parse_timestamp(line[: m.start()]) if m.start() else None
        out.records.append(StepRecord(step, values, number, time_ns=stamp))
    if not _timestamp_clock(out):
        _clock_from_step_durations(out)


def _timestamp_clock(out: ParsedLog) -> bool:
    """Use the lines' timestamps when every step has one; else none of them (a partial clock would
    put steps out of order). Returns whether the timestamps are the clock."""
    if out.records and all(r.time_ns is not None for r in out.records):
        out.clock = CLOCK_TIMESTAMP
        return True
    for r in out.records:
        r.time_ns = None
    return False


_STEP_DURATION_KEYS = ("timing_s/step",)


def _clock_from_step_durations(out: ParsedLog) -> None:
    """verl logs every step's wall time (timing_s/step): their running sum is the elapsed time."""
    if not out.records or out.clock != CLOCK_NONE:
        return
    elapsed = 0.0
    times: list[float] = []
    for record in out.records:
        duration = next((record.values[k] for k in _STEP_DURATION_KEYS if k in record.values), None)
        if not isinstance(duration, (int, float)) or isinstance(duration, bool) or not math.isfinite(duration) or duration < 0:
            return
        elapsed += float(duration)
        times.append(elapsed)
    for record, at in zip(out.records, times):
        record.elapsed_s = at
    out.clock = CLOCK_DURATIONS


# --------------------------------------------------------------------------------------------------
# ROLL stdout tracker


_METRICS_TAG = "metrics_tag: "


def _read_roll_stdout(path: Path, text: str, out: ParsedLog) -> None:
    from ..exporters.stdout import parse_stdout_line

    name = path.name
    previous: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        if _METRICS_TAG not in raw:
            continue
        line = _ANSI_RE.sub("", raw)
        try:
            parsed = parse_stdout_line(line)
        except ValueError as exc:
            out.problems.append(Problem(name, number, str(exc).split(" (")[0] if len(str(exc)) > 200 else str(exc)))
            continue
        if parsed is None:
            continue
        step, metrics = parsed
        if step is None:
            step = (previous or 0) + 1
        previous = step
        stamp = parse_timestamp(line[: line.find(_METRICS_TAG)])
        out.records.append(StepRecord(step, metrics, number, time_ns=stamp))
    _timestamp_clock(out)


# --------------------------------------------------------------------------------------------------
# otel-rl run folder


def _read_run_folder(path: Path, out: ParsedLog) -> None:
    records = read_log_records(path)
    for problem in records.problems:
        out.problems.append(problem)
    for index, rec in enumerate(records, start=1):
        event = rec.get("event_name")
        if event == N.RL_HPARAMS_EVENT and isinstance(rec.get("body"), dict):
            out.settings.update(rec["body"])
            continue
        if event != N.RL_LOG_EVENT:
            continue
        body = rec.get("body")
        step = (rec.get("attributes") or {}).get(A.RL_STEP)
        if not isinstance(body, dict) or not isinstance(step, int):
            out.problems.append(Problem(LOGS_FILE, index, "rl.log record without a body map or an rl.step"))
            continue
        if not out.resource:
            out.resource = dict(rec.get("resource") or {})
        out.records.append(StepRecord(step, body, index, time_ns=rec.get("timestamp") or None))
    out.framework = str(out.resource.get(A.RL_FRAMEWORK)) if out.resource.get(A.RL_FRAMEWORK) else None
    out.lines = len(records) + len(records.problems)
    if out.records and all(r.time_ns for r in out.records):
        out.clock = CLOCK_TIMESTAMP


# --------------------------------------------------------------------------------------------------
# Detection


_READERS: dict[str, Callable[[Path, str, ParsedLog], None]] = {
    "swift": _read_swift,
    "trl-state": _read_trl_state,
    "hf-console": _read_hf_console,
    "verl-jsonl": _read_verl_jsonl,
    "verl-console": _read_verl_console,
    "roll-stdout": _read_roll_stdout,
}


def _is_run_folder(path: Path) -> bool:
    if path.is_dir():
        return (path / LOGS_FILE).is_file()
    return path.name.startswith("logs") and path.suffix == ".jsonl" and _head(path).lstrip().startswith('{"resourceLogs"')


def _head(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(_DETECT_BYTES).decode("utf-8", "replace")


def detect_format(path: str | os.PathLike[str], head: str | None = None) -> str:
    """The format of ``path`` from its first lines; raises :class:`FormatError` naming what it saw."""
    p = Path(path)
    if _is_run_folder(p):
        return "otel-rl"
    if p.is_dir():
        raise FormatError(f"{p} is a folder without {LOGS_FILE}: pass a log file or an otel-rl run folder")
    text = _head(p) if head is None else head
    stripped = text.lstrip()
    if stripped.startswith("{") and '"log_history"' in text[:_DETECT_BYTES]:
        return "trl-state"
    if stripped.startswith('{"resourceLogs"'):
        return "otel-rl"
    scores = dict.fromkeys(_READERS, 0)
    seen = 0
    for raw in text.splitlines()[:400]:
        line = raw.strip()
        if not line:
            continue
        seen += 1
        if _METRICS_TAG in line:
            scores["roll-stdout"] += 3
            continue
        clean = _ANSI_RE.sub("", line)
        if _VERL_STEP_RE.search(clean) and " - " in clean:
            scores["verl-console"] += 3
            continue
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                if isinstance(obj.get("data"), dict) and "step" in obj:
                    scores["verl-jsonl"] += 3
                elif any(marker in key for key in obj for marker in _SWIFT_MARKERS):
                    scores["swift"] += 3
                elif obj and all(isinstance(v, (int, float, str, type(None))) for v in obj.values()):
                    scores["swift"] += 1  # a flat JSON metrics row: ms-swift's shape without its progress keys
                continue
        if _HF_DICT_RE.search(clean) and ("'" in clean):
            scores["hf-console"] += 3
        elif _TQDM_RE.search(clean):
            scores["hf-console"] += 1
    best = max(scores, key=lambda k: scores[k])
    if scores[best] == 0:
        first = next((l for l in text.splitlines() if l.strip()), "")
        raise FormatError(
            f"cannot tell the format of {p}: none of its first {seen} non-empty lines looks like a known "
            f"training log (first line: {_short(first, 80)}); pass --format with one of {', '.join(FORMATS)}"
        )
    return best


def parse_file(path: str | os.PathLike[str], format: str = "auto") -> ParsedLog:
    """Read one log file (or otel-rl run folder) into a :class:`ParsedLog`.

    ``format``: one of ``FORMATS`` or ``"auto"`` (detected from the content). Raises
    ``FileNotFoundError`` and :class:`FormatError` with the file named; malformed lines never
    raise, they are listed in ``problems``.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    fmt = detect_format(p) if format == "auto" else format
    if fmt not in FRAMEWORK_OF:
        raise FormatError(f"unknown format {format!r}; use auto or one of {', '.join(FORMATS)}")
    out = ParsedLog(path=p, format=fmt, framework=FRAMEWORK_OF[fmt], records=[])
    if fmt == "otel-rl":
        _read_run_folder(p if p.is_dir() else p, out)
        return out
    if p.is_dir():
        raise FormatError(f"{p} is a folder; format {fmt} reads a file")
    raw = p.read_bytes()
    text = raw.decode("utf-8", "replace")
    if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
        out.notes.append("bytes that are not UTF-8 were replaced")
    out.lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    _READERS[fmt](p, text, out)
    if not out.records and fmt != "otel-rl":
        hint = "" if format == "auto" else f" (read as {fmt}: is that the right --format?)"
        out.notes.append(f"no step records found{hint}")
    return out


def iter_points(parsed: ParsedLog) -> Iterator[tuple[int, str, Any]]:
    """``(step, key, value)`` of every record, in file order."""
    for record in parsed.records:
        for key, value in record.values.items():
            yield record.step, key, value
