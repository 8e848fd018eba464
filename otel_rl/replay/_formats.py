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
- ``easyr1-jsonl``: EasyR1's ``experiment_log.jsonl`` (``{"step": N, "reward": {"overall": ..},
  "actor": {..}, "response_length": {..}, "val": {..}}``: verl's keys, unflattened at each "/").
- ``verl-console``: verl's ``LocalLogger`` (``step:N - key:value - ...``), possibly behind Ray's
  ``(TaskRunner pid=...)`` prefix and ANSI colour codes; values ``0.123`` (``{:.3f}`` in older
  verl) or ``pprint.pformat`` text such as ``np.float64(0.123)``.
- ``roll-stdout``: ROLL's stdout tracker (``metrics_tag: {"step": N, "metrics": {...}}`` after the
  logger's prefix, which may hold a timestamp).
- ``hf-notebook``: a Jupyter notebook (``.ipynb``) of a Trainer run: the Step table transformers'
  notebook display draws, its progress text for the planned total, and its code cells' outputs for
  how the run ended (``_notebook``). A notebook without that table is read as its console.
- ``openrlhf-console`` (``_openrlhf``), ``nemo-rl-console`` (``_nemo_rl``), ``areal-console``
  (``_areal``: AReaL's ``StatsLogger`` tables): those frameworks' consoles.
- ``otel-rl``: an otel-rl run folder (or its ``logs.jsonl``): the ``rl.log`` events.

Every reader skips a malformed line, records it as a :class:`Problem` (file, 1-based line,
reason) and goes on: one bad line never aborts a file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from otel_rl._sdk.keys.resolver import TRANSFORMS
from otel_rl.replay._areal import is_areal_step_line, read_areal_console
from otel_rl.replay._checks import check_fields_kept, check_parse, settle_steps
from otel_rl.replay._ending import read_ending
from otel_rl.replay._hf_console import TQDM_RE, find_dict, read_hf_console
from otel_rl.replay._key_value import is_progress_line, read_key_value_console
from otel_rl.replay._log import (
    ANSI_RE,
    CLOCK_ELAPSED,
    CLOCK_TIMESTAMP,
    FormatError,
    ParsedLog,
    Segment,
    StepRecord,
    json_lines,
    line_of,
    line_starts,
    parse_timestamp,
    short,
    timestamp_clock,
)
from otel_rl.replay._metric_table import header_of, read_metric_table
from otel_rl.replay._metrics_jsonl import read_metrics_jsonl
from otel_rl.replay._nemo_rl import is_nemo_rl_header, read_nemo_rl_console
from otel_rl.replay._notebook import is_notebook, notebook_console, read_notebook_table
from otel_rl.replay._openrlhf import is_openrlhf_line, read_openrlhf_console
from otel_rl.replay._settings import apply_settings, hf_settings
from otel_rl.replay._verl import is_easyr1_row, is_step_line, read_easyr1_jsonl, read_verl_console, read_verl_jsonl
from otel_rl.runs.folder import LOGS_FILE, Problem, read_log_records
from otel_rl.runs.textfile import MAX_LINE_BYTES, NotRegularFileError, read_bounded, require_regular_file
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

__all__ = ["FORMATS", "FRAMEWORK_OF", "FormatError", "ParsedLog", "StepRecord", "detect_format", "parse_file", "parse_timestamp"]

#: Format name -> the framework whose key mapping its keys go through.
FRAMEWORK_OF: dict[str, str | None] = {
    "swift": "swift",
    "trl-state": "trl",
    "hf-console": "trl",
    "verl-jsonl": "verl",
    "easyr1-jsonl": "verl",  # a verl fork: verl's metric keys, nested
    "hf-notebook": "trl",  # a Jupyter notebook's Trainer table (transformers' notebook display)
    "verl-console": "verl",
    "roll-stdout": "roll",
    "nemo-rl-console": A.RlFrameworkValues.NEMO_RL.value,
    "openrlhf-console": A.RlFrameworkValues.OPENRLHF.value,
    "areal-console": A.RlFrameworkValues.AREAL.value,
    "metric-table": None,  # a CSV of metrics by step: the reader tells the framework from the keys
    "key-value": "trl",  # a hand-written loop's progress lines: names read by meaning into TRL's
    "metrics-jsonl": "trl",  # a hand-written loop's JSON lines of metrics: names read by meaning into TRL's
    "otel-rl": None,  # the run's own rl.framework resource attribute says
}
FORMATS: tuple[str, ...] = tuple(FRAMEWORK_OF)

_HEAD_BYTES = 256 * 1024
# A trainer_state.json is read whole (its log_history may sit on one line, as json.dump writes it).
MAX_JSON_BYTES = 2 * 1024 * 1024 * 1024
# Detection reads the whole file up to this size (a verl log's first metric line can come after
# thousands of lines of config and worker start-up), then its head and tail beyond it.
_DETECT_BYTES = 64 * 1024 * 1024


# --------------------------------------------------------------------------------------------------
# ms-swift logging.jsonl


_SWIFT_MARKERS = ("global_step/max_steps", "train_speed(", "elapsed_time", "remaining_time", "memory(GiB)")
_duration_text = TRANSFORMS["duration_text"]


def _swift_total(values: dict[str, Any]) -> int | None:
    head, _, tail = str(values.get("global_step/max_steps", "")).partition("/")
    return int(tail) if tail.isdigit() else None


def _read_swift(path: Path, text: str, out: ParsedLog) -> None:
    ordinal = 0
    previous_step: int | None = None
    max_steps: set[int] = set()
    run, run_total = 1, None
    name = path.name
    for number, line, obj in json_lines(name, text, out):
        if not isinstance(obj, dict):
            out.problems.append(Problem(name, number, f"not a JSON object: {short(line)}"))
            continue
        ordinal += 1
        step: int | None = None
        progress_total: int | None = None
        progress = obj.get("global_step/max_steps")
        if isinstance(progress, str) and "/" in progress:
            head, _, tail = progress.partition("/")
            try:
                step, total = int(head), int(tail)
                max_steps.add(total)
                progress_total = total
            except ValueError:
                out.problems.append(
                    Problem(name, number, f"global_step/max_steps {progress!r} is not 'N/M'; step taken from the line order")
                )
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
        if progress_total is not None and progress_total != run_total:
            # rows of another run (its own max_steps) appended to the same file
            run += run_total is not None
            run_total = progress_total
        previous_step = step
        out.records.append(StepRecord(step, obj, number, elapsed_s=elapsed_s, segment=run))
    if max_steps:
        last = [r for r in out.records if r.segment == run]
        total = _swift_total(last[-1].values) if last else None
        apply_settings(out, {"max_steps": total}, "global_step/max_steps")
    if out.records and all(r.elapsed_s is not None for r in out.records):
        out.clock = CLOCK_ELAPSED


# --------------------------------------------------------------------------------------------------
# trainer_state.json


_STATE_SETTINGS = ("max_steps", "logging_steps", "eval_steps", "save_steps", "train_batch_size", "num_train_epochs")


_STATE_SETTINGS = ("max_steps", "logging_steps", "eval_steps", "save_steps", "train_batch_size", "num_train_epochs")


def _read_trl_state(path: Path, text: str, out: ParsedLog) -> None:
    name = path.name
    starts = line_starts(text)
    decoder = json.JSONDecoder()
    key_at = text.find('"log_history"')
    if key_at < 0:
        raise FormatError(f'{path}: no "log_history" in this JSON file; it is not a trainer_state.json')
    # Settings: the whole document when it parses (a truncated file keeps its log entries below).
    try:
        whole = json.loads(text)
        if isinstance(whole, dict):
            apply_settings(out, hf_settings(whole), "trainer_state.json")
            out.settings.update({k: whole[k] for k in _STATE_SETTINGS if whole.get(k) is not None and k not in out.settings})
    except (RecursionError, MemoryError) as exc:
        out.problems.append(
            Problem(name, 1, f"the file nests too deeply to read whole ({type(exc).__name__}); log entries are read one by one")
        )
    except ValueError as exc:
        out.problems.append(
            Problem(
                name,
                line_of(starts, exc.pos) if isinstance(exc, json.JSONDecodeError) else 1,
                "the file is not complete JSON (truncated?); log entries before the break are read",
            )
        )
    pos = text.find("[", key_at)
    if pos < 0:
        raise FormatError(f'{path}: "log_history" is not a list')
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
        except (ValueError, RecursionError, MemoryError) as exc:
            line = line_of(starts, pos)
            # Resynchronise on the next entry that starts at this one's indentation.
            indent = pos - starts[line - 1]
            nxt = re.compile(r"\n" + r"[ \t]" * indent + r"\{").search(text, pos + 1)
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else f"nested too deeply to read: {type(exc).__name__}"
            out.problems.append(Problem(name, line, f"log_history entry is not valid JSON ({why})"))
            if nxt is None:
                break
            pos = nxt.start() + 1
            continue
        line = line_of(starts, pos)
        pos = end
        if not isinstance(entry, dict):
            out.problems.append(Problem(name, line, "log_history entry is not an object"))
            continue
        step = entry.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            out.problems.append(Problem(name, line, f'log_history entry without an integer "step" ({step!r})'))
            continue
        if previous is not None and step < previous:
            out.notes.append(f"line {line}: step went back from {previous} to {step}")
        previous = step
        values = {k: v for k, v in entry.items() if k != "step"}
        out.records.append(StepRecord(step, values, line))


# --------------------------------------------------------------------------------------------------
# ROLL stdout tracker


_METRICS_TAG = "metrics_tag: "


_METRICS_TAG = "metrics_tag: "


def _read_roll_stdout(path: Path, text: str, out: ParsedLog) -> None:
    from otel_rl.trackers.stdout import parse_stdout_line

    name = path.name
    previous: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        if _METRICS_TAG not in raw:
            continue
        line = ANSI_RE.sub("", raw)
        try:
            parsed = parse_stdout_line(line)
        except (RecursionError, MemoryError) as exc:
            out.problems.append(Problem(name, number, f"metrics_tag JSON nested too deeply to read ({type(exc).__name__})"))
            continue
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
    timestamp_clock(out)


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
    "hf-console": read_hf_console,
    "verl-jsonl": read_verl_jsonl,
    "easyr1-jsonl": read_easyr1_jsonl,
    "verl-console": read_verl_console,
    "roll-stdout": _read_roll_stdout,
    "hf-notebook": read_notebook_table,
    "nemo-rl-console": read_nemo_rl_console,
    "openrlhf-console": read_openrlhf_console,
    "areal-console": read_areal_console,
    "metric-table": read_metric_table,
    "key-value": read_key_value_console,
    "metrics-jsonl": read_metrics_jsonl,
}
# What one line is worth as evidence of a format. A verl `step:N - key:value` line, a ROLL
# metrics_tag line or a framework's JSON row is unmistakable; a `{'key': value}` line may be a
# Trainer record or any dict a program printed (verl prints its whole config that way), so it
# counts only when it carries Trainer keys, and far less.
_STRONG = 100
_WEAK = 1
_HF_RECORD_KEYS = ("'loss'", "'grad_norm'", "'learning_rate'", "'epoch'", "'reward'", "'train_runtime'")


_NOTEBOOK_STREAM = '[{"stream_name"'


def _notebook_stdout(text: str) -> tuple[str, str] | None:
    """A notebook's downloaded log (Kaggle: one JSON array of ``{"stream_name", "time", "data"}``
    records): its stdout records' text joined in order, and a note saying so; None when it is not one
    (or is damaged: then it is read as text)."""
    try:
        records = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(records, list):
        return None
    stdout = [r["data"] for r in records if isinstance(r, dict) and r.get("stream_name") == "stdout" and isinstance(r.get("data"), str)]
    note = f"a notebook log (a JSON array of {len(records):,} stream records): its {len(stdout):,} stdout records are read, joined"
    return "".join(stdout), note


def _is_run_folder(path: Path) -> bool:
    if path.is_dir():
        return (path / LOGS_FILE).is_file()
    return path.name.startswith("logs") and path.suffix == ".jsonl" and _head(path, _HEAD_BYTES).lstrip().startswith('{"resourceLogs"')


def _require_regular(path: Path) -> None:
    try:
        require_regular_file(path)
    except NotRegularFileError as exc:
        raise FormatError(str(exc)) from None


def _head(path: Path, size: int) -> str:
    with open(path, "rb") as f:
        return f.read(size).decode("utf-8", "replace")


def format_scores(text: str) -> dict[str, int]:
    """Evidence for each format, summed over every line of ``text``."""
    scores = dict.fromkeys(_READERS, 0)
    if header_of(text) is not None:
        scores["metric-table"] += _STRONG
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if _METRICS_TAG in line:
            scores["roll-stdout"] += _STRONG
            continue
        if line[0] == "=" and is_nemo_rl_header(line):
            scores["nemo-rl-console"] += _STRONG
            continue
        if "lobal step" in line and is_openrlhf_line(line):
            scores["openrlhf-console"] += _STRONG
            continue
        if "Train step" in line and is_areal_step_line(line):
            scores["areal-console"] += _STRONG
            continue
        if "step:" in line:
            clean = ANSI_RE.sub("", line) if "\x1b" in line else line
            if is_step_line(clean):
                scores["verl-console"] += _STRONG
                continue
        if line[0] == "{" and line[-1] == "}" and line[1:2] == '"':
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError, MemoryError):
                obj = None
            if isinstance(obj, dict):
                if isinstance(obj.get("data"), dict) and "step" in obj:
                    scores["verl-jsonl"] += _STRONG
                elif is_easyr1_row(obj):
                    scores["easyr1-jsonl"] += _STRONG
                elif any(marker in key for key in obj for marker in _SWIFT_MARKERS):
                    scores["swift"] += _STRONG
                elif obj and all(isinstance(v, (int, float, str, type(None))) for v in obj.values()):
                    scores["metrics-jsonl"] += _WEAK  # a flat JSON metrics row without any framework's marker keys
                continue
        if "{'" in line and any(k in line for k in _HF_RECORD_KEYS) and find_dict(line):
            scores["hf-console"] += 10 * _WEAK
        elif "%|" in line and TQDM_RE.search(line):
            scores["hf-console"] += _WEAK
        elif ("tep" in line or "/" in line) and is_progress_line(line):
            scores["key-value"] += 5 * _WEAK  # below a Trainer dict's 10: a loop's own print is the last guess
    return scores


def detect_format(path: str | os.PathLike[str], head: str | None = None) -> str:
    """The format of ``path`` from its whole content; raises :class:`FormatError` naming what it saw."""
    p = Path(path)
    _require_regular(p)
    if _is_run_folder(p):
        return "otel-rl"
    if p.is_dir():
        raise FormatError(f"{p} is a folder without {LOGS_FILE}: pass a log file or an otel-rl run folder")
    text = _head(p, _DETECT_BYTES) if head is None else head
    stripped = text.lstrip()
    if stripped.startswith("{") and '"log_history"' in text[:_HEAD_BYTES]:
        return "trl-state"
    if stripped.startswith('{"resourceLogs"'):
        return "otel-rl"
    scores = format_scores(text)
    best = max(scores, key=lambda k: scores[k])
    if scores[best] == 0:
        first = next((l for l in text.splitlines() if l.strip()), "")
        seen = sum(1 for l in text.splitlines() if l.strip())
        raise FormatError(
            f"cannot tell the format of {p}: none of its {seen:,} non-empty lines looks like a known "
            f"training log (first line: {short(first, 80)}); pass --format with one of {', '.join(FORMATS)}"
        )
    return best


def parse_file(path: str | os.PathLike[str], format: str = "auto", *, segment: int | None = None) -> ParsedLog:
    """Read one log file (or otel-rl run folder) into a :class:`ParsedLog`.

    ``format``: one of ``FORMATS`` or ``"auto"`` (detected from the content). ``segment``: which
    run of a file that holds several (1-based; default: the last RL run). Raises
    ``FileNotFoundError`` and :class:`FormatError` with the file named; malformed lines never
    raise, they are listed in ``problems``. ``parsed.check`` and ``parsed.doubts`` say how sure
    the steps are.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    _require_regular(p)  # before any read: a FIFO would block for ever, /dev/zero never end
    # A notebook's log wraps the console in JSON: the format is that of its stdout, so it is read first.
    notebook = None
    table = False  # a Jupyter notebook's Trainer table: its own format
    head = _head(p, _HEAD_BYTES) if p.is_file() else ""
    if head.lstrip().startswith(_NOTEBOOK_STREAM):
        raw, long_lines = read_bounded(p)
        notebook = _notebook_stdout(raw.decode("utf-8", "replace"))
    elif head and is_notebook(p, head):
        raw, long_lines = read_bounded(p)
        found = notebook_console(raw.decode("utf-8", "replace"))
        if found is not None:
            notebook, table = found[:2], found[2]
    if format != "auto":
        fmt = format
    elif table:
        fmt = "hf-notebook"
    else:
        fmt = detect_format(p, head=notebook[0][:_DETECT_BYTES]) if notebook is not None else detect_format(p)
    if fmt not in FRAMEWORK_OF:
        raise FormatError(f"unknown format {format!r}; use auto or one of {', '.join(FORMATS)}")
    out = ParsedLog(path=p, format=fmt, framework=FRAMEWORK_OF[fmt], records=[])
    if fmt == "otel-rl":
        _read_run_folder(p, out)
    elif p.is_dir():
        raise FormatError(f"{p} is a folder; format {fmt} reads a file")
    else:
        if notebook is None and fmt == "trl-state":
            raw, long_lines = _read_json_whole(p), []  # JSON is not line-structured: a one-line file is normal
        elif notebook is None:
            raw, long_lines = read_bounded(p)
        for number, size in long_lines:
            out.problems.append(Problem(p.name, number, f"a line of {size:,} bytes, over the {MAX_LINE_BYTES:,}-byte limit: skipped"))
        text = raw.decode("utf-8", "replace")
        if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
            out.notes.append("bytes that are not UTF-8 were replaced")
        del raw  # the text is all that is read from here on: not the file twice in memory
        if notebook is not None:
            text = notebook[0]
            out.notes.append(notebook[1])
        out.lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if fmt == "hf-console":
            read_hf_console(p, text, out, segment)
        else:
            _READERS[fmt](p, text, out)
            _choose_segment(out, segment)
        if not out.records:
            hint = "" if format == "auto" else f" (read as {fmt}: is that the right --format?)"
            out.notes.append(f"no step records found{hint}")
        out.ending = read_ending(text, out)
        fields_text = text
    out.records_read = len(out.records)
    settle_steps(out)
    check_parse(out)
    if fmt != "otel-rl":
        check_fields_kept(fields_text, out)
    return out


def _read_json_whole(path: Path) -> bytes:
    """A JSON document whole, up to :data:`MAX_JSON_BYTES` (past it, the error says so)."""
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise FormatError(f"{path} is {size:,} bytes, over the {MAX_JSON_BYTES:,}-byte limit for a JSON document")
    return path.read_bytes()


def _choose_segment(out: ParsedLog, segment: int | None) -> None:
    """Readers that tag records with their run (ms-swift rows of several runs): keep one run."""
    tags = sorted({r.segment for r in out.records})
    if len(tags) <= 1 and segment in (None, 1):
        return
    if segment is not None and segment not in tags:
        raise ValueError(f"segment {segment} does not exist: this file holds {len(tags)} run(s)")
    chosen = segment if segment is not None else tags[-1]
    for tag in tags:
        mine = [r for r in out.records if r.segment == tag]
        out.segments.append(
            Segment(index=tag, first_line=mine[0].line, last_line=mine[-1].line, records=len(mine), label="rows of one run", rl=True)
        )
    parts = "; ".join(f"run {s.index}: lines {s.first_line}-{s.last_line}, {s.records} records" for s in out.segments)
    out.notes.append(f"this file holds {len(tags)} runs ({parts}); reading run {chosen} (--segment N reads another)")
    out.records = [r for r in out.records if r.segment == chosen]


def iter_points(parsed: ParsedLog) -> Iterator[tuple[int, str, Any]]:
    """``(step, key, value)`` of every record, in file order."""
    for record in parsed.records:
        for key, value in record.values.items():
            yield record.step, key, value
