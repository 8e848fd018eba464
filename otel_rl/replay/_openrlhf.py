"""OpenRLHF's console: the line its PPO trainer logs after each step, and its evaluation summary
(openrlhf/trainer/ppo_trainer.py, ppo_trainer_async.py, 0.11.2)::

    (PPOTrainer pid=4711) INFO 11-30 04:15:59 ppo_trainer.py:551] ✨ Global step 12: {'policy_loss': 0.1, ...}
    (TrainingActor pid=4712) INFO 11-30 04:16:03 ppo_trainer_async.py:244] Global step 13: {...}
    ... ✨ Evaluation completed in 0:01:02, global_step 12, eval_metrics: {'eval_gsm8k_pass1': 0.45, ...}

The dict is Python's repr of the step's values (``nan`` and ``inf`` bare). Evaluation keys get the
``eval/`` prefix OpenRLHF's W&B and TensorBoard loggers give them, and join the record of their
step. The log's time stamps carry no year, so steps are placed by order, not by time.
"""

from __future__ import annotations

import re
from pathlib import Path

from otel_rl.replay._hf_console import literal_dict
from otel_rl.replay._log import ANSI_RE, ParsedLog, StepRecord, short
from otel_rl.runs.folder import Problem

# The dict runs to the end of the line; one cut short (a killed run) is reported, not skipped.
STEP_RE = re.compile(r"\bGlobal step (\d+): (\{.*?)\s*$")
EVAL_RE = re.compile(r"\bEvaluation completed in [\d:.]+, global_step (\d+), eval_metrics: (\{.*?)\s*$")
EVAL_PREFIX = "eval/"


def is_openrlhf_line(line: str) -> bool:
    return "lobal step" in line and STEP_RE.search(line) is not None


def read_openrlhf_console(path: Path, text: str, out: ParsedLog) -> None:
    records: dict[int, StepRecord] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if "lobal step" not in raw and "eval_metrics" not in raw:
            continue
        line = ANSI_RE.sub("", raw) if "\x1b" in raw else raw
        found, prefix = STEP_RE.search(line), ""
        if found is None:
            found, prefix = EVAL_RE.search(line), EVAL_PREFIX
        if found is None:
            continue
        try:
            values = literal_dict(found.group(2))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            out.problems.append(Problem(path.name, number, f"a step's values that are not a Python dict: {short(found.group(2))}"))
            continue
        step = int(found.group(1))
        record = records.get(step)
        if record is None:
            record = records[step] = StepRecord(step, {}, number)
            out.records.append(record)
        record.values.update({prefix + k: v for k, v in values.items()})
