"""Hand-written training loops' progress lines: a step marker and ``Name: number`` pairs.

    Epoch:[1/1](12/9751), Reward: -1.72, KL_ref: 0.0002, Actor Loss: 0.0, Avg Response Len: 297.0
    Step: 12 | Loss: -0.0011 | KL: -0.0002
    step:12 | reward=0.41 | kl=0.02 | grad_norm=0.9

A line is a record when it carries a step marker (``(N/M)``, ``Step: N``, ``step=N``, ``step N/M``)
and at least MIN_PAIRS ``name: number`` or ``name=number`` pairs. Names are free-form, so the common
ones are read by their meaning into the names TRL logs (``Reward`` and ``Avg Reward`` -> ``reward``,
``KL_ref`` -> ``kl``, ``Avg Response Len`` -> ``completion_length``) and go through TRL's mapping;
the others keep their name and are listed as unmapped. ``M`` of ``(N/M)`` is the planned total.
"""

from __future__ import annotations

import re
from pathlib import Path

from otel_rl.replay._log import ANSI_RE, ParsedLog, StepRecord, number_text
from otel_rl.replay._settings import apply_settings

MIN_PAIRS = 2
_COUNTER_RE = re.compile(r"\((\d+)\s*/\s*(\d+)\)")  # "(12/9751)" after an epoch marker
_STEP_RE = re.compile(r"\bstep\b\s*[:=]?\s*(\d+)(?:\s*/\s*(\d+))?", re.IGNORECASE)
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
_PAIR_RE = re.compile(r"([A-Za-z][A-Za-z0-9_ ./()-]{0,40}?)\s*[:=]\s*(" + _NUMBER + r")(?=\s*(?:[,|;]|\s-\s|$)|\s+[A-Za-z|,])")
# Free-form names -> the names TRL logs (one meaning each); compared after normalize().
_MEANINGS = {
    "reward": (
        "reward",
        "rewards",
        "avg_reward",
        "mean_reward",
        "reward_mean",
        "avg_rewards",
        "total_reward_mean",
        "rollout_reward",
        "rollout_reward_mean",
        "train_reward",
        "train_reward_mean",
        "batch_reward",
    ),
    "reward_std": ("reward_std", "std_reward", "reward_stdev", "rollout_reward_std", "train_reward_std"),
    # a held-out evaluation's accuracy: the validation score (TRL's eval_reward)
    "eval_reward": ("eval_reward", "val_reward", "val_accuracy", "eval_accuracy", "test_accuracy", "val_acc", "eval_acc"),
    "kl": ("kl", "kl_ref", "kl_div", "kl_loss", "kl_divergence", "ref_kl", "mean_kl", "avg_kl"),
    "loss": ("loss", "actor_loss", "total_loss", "rl_loss", "train_loss"),
    "policy_loss": ("policy_loss", "pg_loss"),
    "completion_length": (
        "avg_response_len",
        "avg_len",
        "response_len",
        "response_length",
        "avg_response_length",
        "completion_length",
        "mean_length",
        "avg_length",
        "gen_len",
        "mean_response_length",
        "avg_response_token_length",
        "response_token_length",
    ),
    "learning_rate": ("lr", "learning_rate"),
    "grad_norm": ("grad_norm", "gradnorm", "grad_norm_total", "l2_norm", "gradient_norm", "total_grad_norm", "grad_l2_norm"),
    "entropy": ("entropy", "token_entropy", "policy_entropy", "avg_entropy"),
}
_MEANING_OF = {alias: name for name, aliases in _MEANINGS.items() for alias in aliases}
_NOT_VALUES = {"step", "epoch", "iter", "iteration"}


def normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")


def by_meaning(name: str) -> str:
    """The name TRL logs for a free-form metric name of the same meaning; else the name itself."""
    return _MEANING_OF.get(normalize(name), name)


def progress_record(line: str) -> tuple[int, int | None, dict[str, object]] | None:
    """(step, planned total or None, {name: value}) of a progress line, or None."""
    counter = _COUNTER_RE.search(line)
    marker = counter or _STEP_RE.search(line)
    if marker is None:
        return None
    step = int(marker.group(1))
    planned = int(marker.group(2)) if marker.group(2) else None
    values: dict[str, object] = {}
    for m in _PAIR_RE.finditer(line, marker.end()):
        key = normalize(m.group(1))
        if not key or key in _NOT_VALUES:
            continue
        values[_MEANING_OF.get(key, key)] = number_text(m.group(2))
    return (step, planned, values) if len(values) >= MIN_PAIRS else None


def is_progress_line(line: str) -> bool:
    return progress_record(line) is not None


def read_key_value_console(path: Path, text: str, out: ParsedLog) -> None:
    planned: tuple[int, int] | None = None
    named = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = ANSI_RE.sub("", raw) if "\x1b" in raw else raw
        found = progress_record(line)
        if found is None:
            continue
        step, total, values = found
        if total is not None and total >= step:
            planned = (total, number)
        named.update(k for k in values if k in _MEANINGS)
        out.records.append(StepRecord(step, values, number))
    if planned is not None:
        apply_settings(out, {"max_steps": planned[0]}, f"the progress counter (N/{planned[0]}, line {planned[1]})")
    if out.records:
        out.notes.append(
            "free-form progress lines: names read by their meaning"
            + (f" ({', '.join(sorted(named))})" if named else " (none of them a known name)")
        )
