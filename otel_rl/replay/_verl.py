"""verl's loggers: the file logger (JSON lines) and the console logger (``step:N - key:value``), and
EasyR1's (a verl fork) ``experiment_log.jsonl`` (one nested JSON object per step).

The console log is what people keep (``tee``, ``nohup``, W&B's ``output.log``): Ray prefixes and
ANSI colours before each line, the Hydra config pretty-printed before training (read here as the
run's settings, never as records), ``np.float64(x)`` values (newer verl formats with
``pprint.pformat``), and W&B's 4096-character line limit, which cuts validation lines mid-token.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from otel_rl.replay._checks import iter_lines
from otel_rl.replay._log import (
    ANSI_RE,
    ParsedLog,
    StepRecord,
    clock_from_step_durations,
    json_lines,
    number_text,
    parse_timestamp,
    short,
    timestamp_clock,
)
from otel_rl.replay._settings import apply_settings, config_dump, verl_settings
from otel_rl.runs.folder import Problem


def read_verl_jsonl(path: Path, text: str, out: ParsedLog) -> None:
    name = path.name
    nulls = 0
    previous: int | None = None
    for number, _, obj in json_lines(name, text, out):
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), dict):
            out.problems.append(Problem(name, number, 'not a verl file-logger line ({"step": N, "data": {...}})'))
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
    clock_from_step_durations(out)


def is_easyr1_row(obj: Any) -> bool:
    """An EasyR1 ``experiment_log.jsonl`` row: ``{"step": N, "reward": {...}, "actor": {...}, ...}``
    (the metric dict unflattened at its "/"), not verl's ``{"step": N, "data": {...}}``."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("step"), int)
        and "data" not in obj
        and any(isinstance(v, dict) for k, v in obj.items() if k != "step")
    )


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}/{key}" if prefix else str(key), inner, out)
    elif value is not None:
        out[prefix] = value


def read_easyr1_jsonl(path: Path, text: str, out: ParsedLog) -> None:
    """EasyR1's FileLogger: each row's nested dict is flattened back to verl's keys (``reward/overall``,
    ``actor/pg_loss``, ``response_length/mean``), so they map as verl's do."""
    name = path.name
    for number, line, obj in json_lines(name, text, out):
        if not is_easyr1_row(obj):
            out.problems.append(Problem(name, number, f'not an EasyR1 row ({{"step": N, "actor": {{...}}, ...}}): {short(line)}'))
            continue
        values: dict[str, Any] = {}
        for key, value in obj.items():
            if key != "step":
                _flatten(str(key), value, values)
        out.records.append(StepRecord(obj["step"], values, number))
    clock_from_step_durations(out)


STEP_RE = re.compile(r"(?:^|\s|\))step:(-?\d+)((?: - [^\s].*)?)$")
_RAY_REPEATED_RE = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_PFORMAT_RE = re.compile(r"^(?:np|numpy|torch)\.\w+\((.*)\)$")
# W&B's output.log keeps at most this many characters of a line; the rest is lost.
WANDB_LINE_LIMIT = 4096


def _verl_value(text: str) -> Any:
    try:  # the common case: a bare number (pprint of a float or an int)
        return int(text) if text.isdigit() else float(text)
    except ValueError:
        pass
    text = text.strip()
    wrapped = _PFORMAT_RE.match(text)
    if wrapped:
        text = wrapped.group(1).split(",")[0].strip()
    if text in ("True", "False"):
        return text == "True"
    number = number_text(text)
    if isinstance(number, str):
        raise ValueError(f"value {text!r} is not a number")
    return number


def is_step_line(line: str) -> bool:
    """A verl console metric line (after ANSI codes are removed)."""
    m = STEP_RE.search(line)
    return m is not None and ":" in m.group(2)


def read_verl_console(path: Path, text: str, out: ParsedLog) -> None:
    name = path.name
    dump = config_dump(list(itertools.islice(iter_lines(text), 20_000)))
    if dump is not None:
        config, first, last = dump
        apply_settings(out, verl_settings(config), f"the config printed at lines {first}-{last}")
        out.notes.append(f"lines {first}-{last}: the run's config (read as settings, not records)")
    bar: tuple[int, int] | None = None  # the training progress bar's last (position, total)
    names: dict[str, str] = {}  # each key string once, not once per line
    for number, raw in enumerate(iter_lines(text), start=1):
        if "step:" not in raw:
            if "Training Progress" in raw:
                m = _BAR_RE.search(raw)
                bar = (int(m.group(1)), int(m.group(2))) if m else bar
            continue
        line = ANSI_RE.sub("", raw) if "\x1b" in raw else raw
        if "repeated" in line:
            line = _RAY_REPEATED_RE.sub("", line)
        line = line.rstrip()
        m = STEP_RE.search(line)
        if m is None:
            continue
        step = int(m.group(1))
        parts = m.group(2).split(" - ")[1:]
        cut = len(raw) == WANDB_LINE_LIMIT  # W&B keeps exactly this many; a longer line was not cut
        if cut and parts:
            parts.pop()  # cut mid-token: the last "key:value" is a fragment, whatever it parses as
            out.truncated_steps.append(step)
        values: dict[str, Any] = {}
        bad: list[str] = []
        for part in parts:
            key, sep, value = part.rpartition(":")
            if not sep or not key:
                bad.append(part)
                continue
            try:
                key = key.strip()
                values[names.setdefault(key, key)] = _verl_value(value)
            except ValueError:
                bad.append(part)
        if bad:
            out.problems.append(Problem(name, number, f"{len(bad)} part(s) not 'key:number' skipped: {short(bad[0])}"))
        if not values and bad:
            continue
        stamp = parse_timestamp(line[: m.start()]) if m.start() else None
        out.records.append(StepRecord(step, values, number, time_ns=stamp))
    if out.truncated_steps:
        out.notes.append(
            f"{len(out.truncated_steps)} line(s) cut at {WANDB_LINE_LIMIT} characters (W&B's output.log limit), at steps "
            f"{_steps_text(out.truncated_steps)}: their last key was dropped, and the keys after the cut are missing there "
            "(missing, not zero)"
        )
    if not timestamp_clock(out):
        clock_from_step_durations(out)
    _planned_from_bar(out, bar)


# verl's tqdm bar: "Training Progress:  16%|█▌  | 24/150 [1:02:03<5:25:48, 155.14s/it]"
_BAR_RE = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")


def _planned_from_bar(out: ParsedLog, bar: tuple[int, int] | None) -> None:
    """The planned total from the training bar, where the config states none and the bar tracks the
    steps logged (its position within a step or two of the last step: a bar left behind at 19/27995
    while steps went on to 179 counts something else)."""
    if bar is None or out.settings.get("max_steps") is not None or not out.records:
        return
    position, total = bar
    last = max(r.step for r in out.records)
    if total >= last and abs(position - last) <= 2:
        apply_settings(out, {"max_steps": total}, f"the training progress bar ({position}/{total} at its last print)")


def _steps_text(steps: list[int], limit: int = 6) -> str:
    head = ", ".join(str(s) for s in steps[:limit])
    return head + (f" and {len(steps) - limit} more" if len(steps) > limit else "")
