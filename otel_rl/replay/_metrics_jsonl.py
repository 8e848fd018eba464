"""Hand-written training loops' JSON-lines metrics: one flat JSON object per line, with no
framework's marker keys.

    {"type": "rollout", "grpo_step": 3, "reward": 0.41, "std_reward": 0.47, "avg_response_token_length": 305}
    {"type": "train", "grpo_step": 3, "optimizer_step": 17, "grad_norm": 0.26, "token_entropy": 0.92}
    {"type": "eval", "grpo_step": 3, "reward": 0.37}

The step is the step-like integer key (``step``, ``global_step``, ``iteration``, ``*_step``) that the
most lines carry; of two carried equally, the coarser one (fewer distinct values: a GRPO step over
the optimizer steps inside it). The lines of one step make one record, later lines' values over
earlier ones. A line tagged as evaluation (``type``/``split``/``phase``/``mode``: eval, val, test)
has its keys read as ``eval_<key>``, so that its reward is the validation score, not the training
reward. Names are read by their meaning into TRL's (:func:`otel_rl.replay._key_value.by_meaning`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from otel_rl.replay._key_value import by_meaning
from otel_rl.replay._log import ParsedLog, StepRecord, json_lines, short
from otel_rl.runs.folder import Problem

_STEP_NAMES = ("step", "global_step", "iteration", "iter")
_TAG_NAMES = ("type", "split", "phase", "mode", "kind")
_EVAL_TAGS = frozenset({"eval", "evaluation", "val", "valid", "validation", "test"})


def _step_like(key: str, value: Any) -> bool:
    return type(value) is int and value >= 0 and (key in _STEP_NAMES or key.endswith("_step"))


def step_key(rows: list[dict[str, Any]]) -> str | None:
    """The key that numbers the steps (see the module's doc), or None."""
    carried: Counter[str] = Counter()
    distinct: dict[str, set[int]] = {}
    for row in rows:
        for key, value in row.items():
            if _step_like(key, value):
                carried[key] += 1
                distinct.setdefault(key, set()).add(value)
    if not carried:
        return None
    return min(carried, key=lambda k: (-carried[k], len(distinct[k]), k))


def _tag(row: dict[str, Any]) -> str | None:
    for name in _TAG_NAMES:
        value = row.get(name)
        if isinstance(value, str):
            return value.strip().lower()
    return None


def _eval_name(name: str) -> str:
    return name if name.startswith("eval_") else "eval_" + name  # val_accuracy already reads as eval_reward


def read_metrics_jsonl(path: Path, text: str, out: ParsedLog) -> None:
    name = path.name
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, line, obj in json_lines(name, text, out):
        if isinstance(obj, dict):
            rows.append((number, obj))
        else:
            out.problems.append(Problem(name, number, f"not a JSON object: {short(line)}"))
    key = step_key([row for _, row in rows])
    tagged = evaluation = 0
    for ordinal, (number, row) in enumerate(rows, start=1):
        found = row.get(key) if key is not None else None
        # a line without the key joins the step before
        step: int = found if type(found) is int and _step_like(str(key), found) else (out.records[-1].step if out.records else ordinal)
        tag = _tag(row)
        tagged += tag is not None
        evaluating = tag in _EVAL_TAGS
        evaluation += evaluating
        values = {
            _eval_name(by_meaning(k)) if evaluating else by_meaning(k): v
            for k, v in row.items()
            if k != key and k not in _TAG_NAMES and type(v) in (int, float)
        }
        if out.records and out.records[-1].step == step:
            out.records[-1].values.update(values)
        else:
            out.records.append(StepRecord(step, values, number))
    if rows:
        how = f"the step is {key!r}" if key is not None else "no step key: the step is the line's order"
        tags = f"; {evaluation} of {tagged} tagged lines read as evaluation (eval_ keys)" if tagged else ""
        out.notes.append(f"JSON lines of metrics: {how}; the lines of one step make one record{tags}; names read by their meaning")
