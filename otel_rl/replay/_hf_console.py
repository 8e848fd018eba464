"""A Hugging Face Trainer's console output (TRL, unsloth, ms-swift's HF mode).

``ProgressCallback.on_log`` writes ``str(logs)`` through ``tqdm.write`` between refreshes of the
training bar (``\\r``). The dicts carry no step, and their place in the text says little: under
``nohup`` stdout is block-buffered while tqdm's stderr is not, so dicts come in bursts, or all
after "Training completed". Steps therefore come from the records and the header, never from the
neighbouring bar:

1. a ``step`` / ``global_step`` key when the dicts have one;
2. else the dict's position x the logging interval, which comes from the run's end (a
   ``train_runtime`` summary or the training bar at its total: n dicts over T steps), from the
   ``epoch`` field x steps per epoch (header), or from the bar's last position;
3. else the dict's position, with a doubt stated at the top of every report.

Only the training bar counts (no description, the header's total): ``Loading checkpoint shards``,
``Map``, eval and other bars are ignored. Eval dicts (``eval_*`` keys) join the step of the train
dict before them; ``train_runtime`` summaries end a run and become settings. A file with several
runs (an SFT run, then a GRPO run) is split; the RL run is read unless another is asked for.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rl.replay._log import ANSI_RE, CLOCK_ELAPSED, ParsedLog, Segment, StepRecord, number_text, short
from otel_rl.replay._settings import apply_settings, header_settings
from otel_rl.runs.folder import Problem

# tqdm's default bar: "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
TQDM_RE = re.compile(r"(?<!\d)(\d+)%\|[^|\r\n]*\|\s*(\d+)/(\d+)\s*\[(?:(\d+):)?(\d+):(\d+)(?:[^\]\r\n]*\])?")
# Where a printed dict starts; it ends at the segment's last "}". (A regex "{\s*['\"].*}" found the
# same span but retried ".*" from every "{'", quadratic on a line of "{'a" repeated.)
_DICT_OPEN_RE = re.compile(r"\{\s*['\"]")


def find_dict(segment: str) -> tuple[int, int] | None:
    """``(start, end)`` of the first ``{'...`` through the last ``}`` of ``segment``, or None (linear time)."""
    m = _DICT_OPEN_RE.search(segment)
    if m is None:
        return None
    end = segment.rfind("}")
    return (m.start(), end + 1) if end >= m.end() else None


_DICT_START_RE = re.compile(r"\{\s*'[^']*':")
# Values str(dict) writes that literal_eval does not read: nan/inf, torch tensors (older
# Trainers logged grad_norm as a tensor), numpy 2 scalars' repr.
_BARE_NONFINITE_RE = re.compile(r"(?<=: )(-?inf|nan)(?=, |\})")
_TENSOR_RE = re.compile(r"tensor\(\s*([-+0-9.eE]+|-?nan|-?inf)\s*(?:,[^()]*)?\)")
_NUMPY_RE = re.compile(r"np\.(?:float|int|uint|bool_)\w*\(\s*([^()]*?)\s*\)")
_RUN_START_RE = re.compile(r"\*{5} Running training \*{5}|Total steps = [\d,]+")
# Trainer._inner_training_loop when resuming from a checkpoint (5.x, then 4.x wording).
_RESUME_RE = re.compile(r"(?:Resuming training from checkpoint with epoch \d+ and|Continuing training from) global step (\d+)")
# Keys that make a dict a Trainer log record rather than any other dict a program printed.
_TRAINER_KEYS = ("loss", "grad_norm", "learning_rate", "epoch", "reward", "kl", "train_runtime")
_SUMMARY_KEY = "train_runtime"
# A dict that cannot be read counts as a lost record only with a key every trainer log line has:
# other printed dicts (an environment's {'step': 0, ..., 'reward': ...} in a validation message)
# share 'reward' or 'epoch' with it, not these.
_RECORD_MARKERS = ("loss", "grad_norm", "learning_rate", "train_runtime")
_RL_KEY_RE = re.compile(r"^(reward|rewards/|kl$|completions?/|completion_length|frac_reward_zero_std|clip_ratio|entropy)")


def literal_dict(text: str) -> dict[str, Any]:
    """``str(dict)`` text as a dict; number strings (newer Trainers write f"{v:.4g}") as numbers."""
    # str(dict) of plain keys and numbers / number strings is JSON once quotes are swapped; that is
    # ~10x cheaper than literal_eval, which stays the reader for everything else.
    if '"' not in text and "\\" not in text:
        try:
            value = json.loads(text.replace("'", '"'))
        except ValueError:
            value = None
        if isinstance(value, dict):
            return {str(k): number_text(v) if isinstance(v, str) else v for k, v in value.items()}
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        cleaned = _NUMPY_RE.sub(r"\1", _TENSOR_RE.sub(r"\1", text))
        cleaned = _BARE_NONFINITE_RE.sub(lambda m: repr(m.group(0)), cleaned)
        value = ast.literal_eval(cleaned)  # raises for the caller to report
    if not isinstance(value, dict):
        raise ValueError("not a dict")
    return {str(k): number_text(v) if isinstance(v, str) else v for k, v in value.items()}


@dataclass
class _Run:
    """What one training run of the file printed."""

    index: int
    header: dict[str, int | float] = field(default_factory=dict)
    header_line: int | None = None
    bars: list[tuple[int, int, float]] = field(default_factory=list)  # (n, total, elapsed s) of description-less bars
    train: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (line, values)
    evals: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)  # (line, train dicts before it, values)
    summary: dict[str, Any] | None = None
    first_line: int = 0
    last_line: int = 0
    resumed_at: int | None = None  # the global step a resumed run restarts from (its header says)

    @property
    def rl(self) -> bool:
        return any(_RL_KEY_RE.match(k) for _, values in self.train[:3] for k in values)

    def total(self) -> int | None:
        """Planned steps: the header's, else the most refreshed description-less bar's total."""
        planned = self.header.get("max_steps")
        if isinstance(planned, int) and planned > 0:
            return planned
        counts: dict[int, int] = {}
        for _, total, _ in self.bars:
            counts[total] = counts.get(total, 0) + 1
        return max(counts, key=lambda t: counts[t]) if counts else None

    def train_bar(self) -> dict[int, float]:
        """Training-bar position -> elapsed seconds, first time the bar showed it."""
        total = self.total()
        out: dict[int, float] = {}
        for n, t, elapsed in self.bars:
            if t == total and n not in out:
                out[n] = elapsed
        return out


def _is_trainer_dict(values: dict[str, Any]) -> bool:
    return any(k in values for k in _TRAINER_KEYS) or any(k.startswith(("eval_", "rewards/")) for k in values)


def _scan(path: Path, text: str, out: ParsedLog) -> list[_Run]:
    name = path.name
    runs = [_Run(1)]
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        for segment in raw.split("\r"):
            if "\x1b" in segment:
                segment = ANSI_RE.sub("", segment)
            if not segment.strip():
                continue
            run = runs[-1]
            if _RUN_START_RE.search(segment) and (run.train or run.summary is not None):
                run = _Run(len(runs) + 1)
                runs.append(run)
            fields = header_settings(segment) if "=" in segment else []
            if fields and not run.train:  # an eval header ("Num examples = 500") mid-run is not this run's
                run.header.update(fields)
                run.header_line = run.header_line or number
            resume = _RESUME_RE.search(segment) if "global step" in segment and not run.train else None
            if resume is not None:
                run.resumed_at = int(resume.group(1))
            dict_span = find_dict(segment) if "{" in segment else None
            if "%|" in segment:
                end = dict_span[0] if dict_span else len(segment)
                previous = 0
                for bar in TQDM_RE.finditer(segment, 0, end):
                    desc = segment[previous : bar.start()].strip(" \t:]")
                    previous = bar.end()
                    if desc and any(ch.isalpha() for ch in desc):
                        continue  # a named bar: checkpoint loading, Map, a tokenizer, an eval loop with a desc
                    hours, minutes, seconds = bar.group(4), bar.group(5), bar.group(6)
                    run.bars.append(
                        (int(bar.group(2)), int(bar.group(3)), float(int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)))
                    )
            if dict_span is None:
                start = _DICT_START_RE.search(segment) if "{" in segment else None
                if start is not None and any(f"'{k}'" in segment for k in _RECORD_MARKERS):
                    out.problems.append(Problem(name, number, f"a dict line cut off (no closing brace): {short(segment[start.start() :])}"))
                continue
            body = segment[dict_span[0] : dict_span[1]]
            try:
                values = literal_dict(body)
            except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
                if any(f"'{k}'" in body for k in _RECORD_MARKERS):
                    out.problems.append(Problem(name, number, f"a dict line that Python cannot read ({type(exc).__name__}): {short(body)}"))
                continue
            if not _is_trainer_dict(values):
                continue
            if _SUMMARY_KEY in values:
                run.summary = values
                run.last_line = number
                continue
            if all(k.startswith("eval_") or k in ("epoch", "step") for k in values):
                run.evals.append((number, len(run.train), values))
                continue
            epoch = values.get("epoch")
            if run.summary is not None or (run.train and _epoch_went_back(run.train[-1][1].get("epoch"), epoch)):
                run = _Run(len(runs) + 1)
                runs.append(run)
            if not run.train:
                run.first_line = number
            run.train.append((number, values))
            run.last_line = number
    return [r for r in runs if r.train]


def _epoch_went_back(before: Any, now: Any) -> bool:
    return isinstance(before, (int, float)) and isinstance(now, (int, float)) and now < before - 1e-9


def _explicit_step(values: dict[str, Any]) -> int | None:
    for key in ("step", "global_step"):
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _interval(run: _Run) -> tuple[int | None, str, list[str]]:
    """The logging interval, how it was found, and disagreements between the ways of finding it."""
    n = len(run.train)
    total = run.total()
    start = run.resumed_at or 0
    candidates: list[tuple[int, str]] = []
    bar = run.train_bar()
    finished = run.summary is not None or (total is not None and total in bar)
    if finished and total and total > start:
        # n dicts over the T - start steps this run made: the interval L satisfies n = floor((T - start) / L)
        span = total - start
        fits = [L for L in range(max(1, span // (n + 1)), span // n + 1) if span // L == n]
        if len(fits) == 1:
            why = "a train_runtime summary" if run.summary is not None else "the training bar at its total"
            candidates.append((fits[0], f"{n} records over {span} steps (the run finished: {why})"))
    per_epoch = run.header.get("steps_per_epoch")
    # Without "Num update steps per epoch", total / epochs is a guess: right when the epochs set the
    # total, too small when max_steps cut the first epoch short. A guess only counts where nothing
    # firmer (a finished run) tells the interval, and never makes a disagreement.
    guessed = False
    if not per_epoch and run.header.get("num_epochs") and total and "max_steps" in run.header:
        per_epoch, guessed = total / float(run.header["num_epochs"]), True
    epochs: list[Any] = [v.get("epoch") for _, v in run.train]  # numbers once checked below
    if per_epoch and all(isinstance(e, (int, float)) for e in epochs) and epochs[-1] > 0 and not (guessed and candidates):
        estimate = (float(epochs[-1]) * float(per_epoch) - start) / n
        whole = round(estimate)
        if whole >= 1 and abs(estimate - whole) <= 0.15 * whole:
            source = "total steps / epochs (header)" if guessed else "steps per epoch (header)"
            candidates.append((whole, f"the epoch field x {float(per_epoch):g} {source}"))
    if not finished and bar and total:
        reached = max(bar) - start
        estimate = reached / n
        if estimate >= 1 and reached // math.floor(estimate) == n:
            candidates.append((math.floor(estimate), f"the training bar's last position ({reached}) over {n} records"))
    if not candidates:
        return None, "", []
    chosen, why = candidates[0]
    disagree = [f"the logging interval is {chosen} from {why}, but {other} from {how}" for other, how in candidates[1:] if other != chosen]
    return chosen, why, disagree


def _no_interval_doubt(run: _Run) -> str:
    """Why the logging interval is unknown, from what the log does and does not hold."""
    epochs = [e for _, v in run.train if isinstance(e := v.get("epoch"), (int, float))]
    has_epochs = bool(epochs) and len(epochs) == len(run.train)
    parts = []
    if run.total() is None and not run.header.get("steps_per_epoch"):
        parts.append("no trainer header gives the total steps or the steps per epoch")
    if run.summary is None:
        parts.append("the run has no train_runtime summary (it did not finish, or its end is not in this file)")
    missing = ", and ".join(parts) or "what the header and the training bar say does not fit the number of records"
    if has_epochs:
        what = (
            f"the records carry no step; their epoch field ({float(epochs[0]):g} .. {float(epochs[-1]):g}) counts "
            f"epochs, but {missing}, so it cannot say how many steps an epoch has"
        )
    else:
        what = f"the records carry no step and no epoch field, and {missing}"
    return f"{what}: step N below is the N-th logged record (true steps may be a multiple of it)"


def _assign_steps(run: _Run, out: ParsedLog) -> list[StepRecord]:
    records: list[StepRecord] = []
    explicit = [_explicit_step(v) for _, v in run.train]
    if all(s is not None for s in explicit):
        steps = [int(s) for s in explicit if s is not None]
        out.step_source = "the records' own step field"
    else:
        interval, why, disagree = _interval(run)
        if interval is None:
            interval = 1
            out.doubts.append(_no_interval_doubt(run))
            out.step_source = "the record's position (logging interval unknown)"
        else:
            out.step_source = f"the record's position x {interval} (logging interval from {why})"
            apply_settings(out, {"logging_steps": interval}, why)
        out.doubts.extend(disagree)
        start = run.resumed_at or 0
        steps = [start + (i + 1) * interval for i in range(len(run.train))]
    bar = run.train_bar()
    for (line, values), step in zip(run.train, steps):
        clean = {k: v for k, v in values.items() if k not in ("step", "global_step")}
        records.append(StepRecord(step, clean, line, elapsed_s=bar.get(step), segment=run.index))
    # eval dicts belong to the step of the train dict logged before them
    for line, before, values in run.evals:
        at = records[before - 1] if before > 0 else records[0]
        at.values.update({k: v for k, v in values.items() if k != "epoch"})
    return records


def read_hf_console(path: Path, text: str, out: ParsedLog, segment: int | None = None) -> None:
    scanned = _scan(path, text, out)
    if not scanned:
        return
    # A run that resumes from a checkpoint continues the run before it: one segment, read together
    # (the steps it repeats keep its records, see settle_steps).
    groups: list[list[_Run]] = []
    for run in scanned:
        if run.resumed_at is not None and groups:
            groups[-1].append(run)
            out.notes.append(f"line {run.header_line}: the run resumed from global step {run.resumed_at} of a checkpoint")
        else:
            groups.append([run])
    out.segments = [
        Segment(
            index=i,
            first_line=g[0].first_line,
            last_line=g[-1].last_line,
            records=sum(len(r.train) for r in g),
            label="RL (reward / KL keys)" if g[0].rl else "no RL keys (SFT or pre-training)",
            rl=g[0].rl,
        )
        for i, g in enumerate(groups, start=1)
    ]
    for seg, group in zip(out.segments, groups):
        for run in group:
            run.index = seg.index
    if segment is not None:
        if not 1 <= segment <= len(groups):
            raise ValueError(f"segment {segment} does not exist: this file holds {len(groups)} run(s)")
        group = groups[segment - 1]
    else:
        rl_groups = [g for g in groups if g[0].rl]
        group = (rl_groups or groups)[-1]
    chosen = group[-1]
    if len(groups) > 1:
        parts = "; ".join(f"run {s.index}: lines {s.first_line}-{s.last_line}, {s.records} records, {s.label}" for s in out.segments[:5])
        parts += f"; and {len(out.segments) - 5} more" if len(out.segments) > 5 else ""
        out.notes.append(f"this file holds {len(groups)} training runs ({parts}); reading run {chosen.index} (--segment N reads another)")
    header = {k: v for k, v in chosen.header.items()}
    planned_steps = chosen.total()
    if planned_steps and "max_steps" not in header:
        header["max_steps"] = planned_steps
    apply_settings(out, header, f"the training header at line {chosen.header_line}" if chosen.header_line else "the training bar")
    if chosen.summary is not None:
        out.settings["train_runtime"] = chosen.summary.get(_SUMMARY_KEY)
    for run in group:
        out.records.extend(_assign_steps(run, out))
    # a resumed run's bar restarts its clock: elapsed seconds of two processes are no one timeline
    if out.records and len(group) == 1 and all(r.elapsed_s is not None for r in out.records):
        out.clock = CLOCK_ELAPSED
    else:
        for r in out.records:
            r.elapsed_s = None
