"""The run's settings a log shows, under one set of names whatever the framework.

A verl log starts with its Hydra config (a pretty-printed dict); a Hugging Face console log with
the ``***** Running training *****`` header (or unsloth's banner); a ``trainer_state.json`` has
its own top-level fields. The analyzer's advice needs the same few facts from all of them:
the length limit, the KL coefficient and whether a KL term is used at all, the learning rate and
its schedule, the gradient clip, batch and group size, the logging interval, the planned steps.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from typing import Any

from otel_rl.replay._log import ANSI_RE, ParsedLog

#: Canonical setting -> what it is, for reports.
CANONICAL: dict[str, str] = {
    "max_steps": "planned optimizer steps",
    "num_epochs": "planned epochs",
    "steps_per_epoch": "optimizer steps per epoch",
    "logging_steps": "steps between logged records",
    "max_response_length": "generation length limit (tokens)",
    "max_prompt_length": "prompt length limit (tokens)",
    "kl_coef": "KL coefficient in effect (0: no KL term)",
    "use_kl_loss": "KL to the reference as a loss term",
    "use_kl_in_reward": "KL to the reference as a reward penalty",
    "learning_rate": "actor learning rate",
    "lr_schedule": "learning-rate schedule",
    "warmup_ratio": "warm-up share of the steps",
    "grad_clip": "gradient-norm clip",
    "train_batch_size": "prompts (or samples) per step",
    "ppo_mini_batch_size": "prompts per optimizer update",
    "group_size": "responses per prompt",
    "clip_ratio": "PPO clip range",
    "save_steps": "steps between checkpoints",
    "eval_steps": "steps between validations",
}

# verl's config paths (verl/trainer/config/ppo_trainer.yaml), first match wins.
_VERL_PATHS: dict[str, tuple[str, ...]] = {
    "max_response_length": ("data.max_response_length", "actor_rollout_ref.rollout.response_length"),
    "max_prompt_length": ("data.max_prompt_length", "actor_rollout_ref.rollout.prompt_length"),
    "train_batch_size": ("data.train_batch_size",),
    "ppo_mini_batch_size": ("actor_rollout_ref.actor.ppo_mini_batch_size",),
    "group_size": ("actor_rollout_ref.rollout.n",),
    "learning_rate": ("actor_rollout_ref.actor.optim.lr",),
    "lr_schedule": ("actor_rollout_ref.actor.optim.lr_scheduler_type", "actor_rollout_ref.actor.optim.warmup_style"),
    "warmup_ratio": ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",),
    "grad_clip": ("actor_rollout_ref.actor.grad_clip",),
    "use_kl_loss": ("actor_rollout_ref.actor.use_kl_loss",),
    "use_kl_in_reward": ("algorithm.use_kl_in_reward",),
    "clip_ratio": ("actor_rollout_ref.actor.clip_ratio",),
    "max_steps": ("trainer.total_training_steps",),
    "num_epochs": ("trainer.total_epochs",),
    "save_steps": ("trainer.save_freq",),
    "eval_steps": ("trainer.test_freq",),
}
_VERL_KL_LOSS_COEF = "actor_rollout_ref.actor.kl_loss_coef"
_VERL_KL_REWARD_COEF = "algorithm.kl_ctrl.kl_coef"

# Hugging Face TrainingArguments / TRL GRPOConfig names, as trainer_state.json or a config dump shows them.
_HF_NAMES: dict[str, tuple[str, ...]] = {
    "max_steps": ("max_steps",),
    "num_epochs": ("num_train_epochs",),
    "logging_steps": ("logging_steps",),
    "save_steps": ("save_steps",),
    "eval_steps": ("eval_steps",),
    "train_batch_size": ("train_batch_size", "per_device_train_batch_size"),
    "max_response_length": ("max_completion_length", "max_new_tokens"),
    "max_prompt_length": ("max_prompt_length",),
    "kl_coef": ("beta",),
    "learning_rate": ("learning_rate",),
    "lr_schedule": ("lr_scheduler_type",),
    "warmup_ratio": ("warmup_ratio",),
    "grad_clip": ("max_grad_norm",),
    "group_size": ("num_generations",),
}

# "  Total optimization steps = 200" (transformers Trainer), "Num Epochs = 3 | Total steps = 1,404" and
# "Total batch size (2 x 4 x 1) = 8" (unsloth's banner).
_HEADER_RE = re.compile(
    r"(Num examples|Num Epochs|Num update steps per epoch|Total optimization steps|Total steps|"
    r"Total (?:train )?batch size[^=|\n]{0,80}|Gradient Accumulation steps|Instantaneous batch size per device|"
    r"Batch size per device|Logging steps)\s*=\s*([\d,]+(?:\.\d+)?)"
)
HEADER_NAMES: dict[str, str] = {
    "Num examples": "num_examples",
    "Num Epochs": "num_epochs",
    "Num update steps per epoch": "steps_per_epoch",
    "Total optimization steps": "max_steps",
    "Total steps": "max_steps",
    "Total train batch size": "train_batch_size",
    "Gradient Accumulation steps": "gradient_accumulation_steps",
    "Instantaneous batch size per device": "per_device_batch_size",
    "Batch size per device": "per_device_batch_size",
    "Logging steps": "logging_steps",
}


def header_settings(segment: str) -> list[tuple[str, int | float]]:
    """``(canonical name, value)`` of the Trainer / unsloth header fields in one line."""
    found = []
    for m in _HEADER_RE.finditer(segment):
        label = m.group(1)
        name = HEADER_NAMES.get(label) or ("train_batch_size" if label.startswith(("Total train batch size", "Total batch size")) else None)
        if name is None:
            continue
        text = m.group(2).replace(",", "")
        found.append((name, float(text) if "." in text else int(text)))
    return found


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'a': {'b': 1}}`` -> ``{'a.b': 1}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _usable(value: Any) -> bool:
    return value is not None and value != -1 and not (isinstance(value, str) and value in ("", "None", "null"))


def apply_settings(out: ParsedLog, values: Mapping[str, Any], source: str) -> None:
    """Record canonical settings; the first source that gives a setting wins."""
    for name, value in values.items():
        if name in out.settings or not _usable(value):
            continue
        out.settings[name] = value
        out.setting_sources[name] = source


def verl_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical settings from verl's resolved config (nested dict)."""
    flat = flatten(config)
    found: dict[str, Any] = {}
    for name, paths in _VERL_PATHS.items():
        for path in paths:
            if _usable(flat.get(path)):
                found[name] = flat[path]
                break
    use_loss, use_reward = bool(found.get("use_kl_loss")), bool(found.get("use_kl_in_reward"))
    # The coefficient in effect: verl reads kl_loss_coef only with use_kl_loss, kl_ctrl.kl_coef only
    # with use_kl_in_reward; with neither, nothing holds the policy near the reference.
    if use_loss and _usable(flat.get(_VERL_KL_LOSS_COEF)):
        found["kl_coef"] = flat[_VERL_KL_LOSS_COEF]
    elif use_reward and _usable(flat.get(_VERL_KL_REWARD_COEF)):
        found["kl_coef"] = flat[_VERL_KL_REWARD_COEF]
    elif "use_kl_loss" in found and "use_kl_in_reward" in found:
        found["kl_coef"] = 0.0
    return found


def hf_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical settings from Hugging Face / TRL argument names (trainer_state.json, a config dump)."""
    found: dict[str, Any] = {}
    for name, keys in _HF_NAMES.items():
        for key in keys:
            if _usable(values.get(key)):
                found[name] = values[key]
                break
    return found


_DICT_START_RE = re.compile(r"\{'[A-Za-z_]\w*': \{")
_RAY_PREFIX_RE = re.compile(r"^\s*\([\w.:-]+(?: pid=\d+)?(?:, ip=[\d.]+)?\)\s?")


def config_dump(lines: Iterable[str], first: int = 1, limit: int = 20_000) -> tuple[dict[str, Any], int, int] | None:
    """The first pretty-printed nested dict in ``lines`` (``pprint`` of verl's Hydra config, behind
    Ray prefixes): ``(dict, first line, last line)``, or None."""
    start: int | None = None
    parts: list[str] = []
    depth = 0
    for number, raw in enumerate(lines, start=first):
        line = _RAY_PREFIX_RE.sub("", ANSI_RE.sub("", raw).rstrip())
        if start is None:
            m = _DICT_START_RE.search(line)
            if m is None or m.start() > 0 and not line[: m.start()].isspace():
                continue
            start = number
            line = line[m.start() :]
        parts.append(line)
        depth += _depth(line)
        if depth <= 0:
            try:
                value = ast.literal_eval("\n".join(parts))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
            return (value, start, number) if isinstance(value, dict) else None
        if number - start > limit:
            return None
    return None


def _depth(line: str) -> int:
    """Net open brackets of a line, outside quoted strings."""
    depth = 0
    quote = ""
    escaped = False
    for ch in line:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
    return depth
