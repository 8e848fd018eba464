"""The real public training logs and design documents beside the project (``../shared``).

A user's clone has no ``../shared``: tests that read it skip there, saying why. CI sets
``OTEL_RL_REQUIRE_SHARED=1`` so that they run (and fail loudly if the folder is missing).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
LOGS = SHARED / "logs"
REQUIRED = os.environ.get("OTEL_RL_REQUIRE_SHARED", "") not in ("", "0")

needs_shared_logs = pytest.mark.skipif(
    not LOGS.is_dir() and not REQUIRED, reason=f"the real training logs are not here ({LOGS} is absent: it sits beside the project in CI)"
)

needs_shared = pytest.mark.skipif(
    not SHARED.is_dir() and not REQUIRED,
    reason=f"the design documents and real training logs are not here ({SHARED} is absent: it sits beside the project in CI)",
)

REFERENCE = SHARED / "reference"

needs_shared_reference = pytest.mark.skipif(
    not REFERENCE.is_dir() and not REQUIRED,
    reason=f"the upstream reference files (weaver's JSON schema) are not here ({REFERENCE} is absent: it sits beside the project in CI)",
)


# The real logs by what they show (../shared/logs/README.md).
COLLAPSE = "verl_opd_qwen3-4b_wandb-outputlog_collapse.log"
HEALTHY = "verl_opd_qwen2-3b_wandb-outputlog_healthy.log"
BLOWUP = "verl_opd_qwen2-3b_wandb-outputlog_length-blowup.log"
LENGTH_COLLAPSE = "verl_opd_qwen2-3b_wandb-outputlog_length-collapse-gradnorm.log"
UITARS = "verl_grpo_uitars-7b_console_ray-ansi-10steps.log"
KL_SPIKE = "trl_grpo_qwen3.5-9b_console_kl-spike.log"
REWARD_COLLAPSE = "trl_grpo_qwen2.5-7b_console_reward-collapse-entropy-blowup.log"
DEAD_REWARD = "unsloth_grpo_qwen2.5-0.5b_console_dead-task-reward.log"
LLAMA = "trl_grpo_llama3.1-8b_checkpoint-250_trainer_state.json"
QWEN3 = "trl_grpo_qwen3-4b_checkpoint-1134_trainer_state.json"
TELELOGS = "trl_grpo_telelogs_checkpoint-200_trainer_state.json"
AAIPL = "trl_grpo_aaipl_checkpoint-500_trainer_state.json"
SWIFT = "swift_grpo_logging_lines_from_issues.jsonl"
KAGGLE_PINNED = "trl_grpo_llama3.2-3b_kaggle-json-stream_length-pinned-zero-std.log"
KAGGLE_DROP = "trl_grpo_llama3.2-3b_kaggle-json-stream_length-drop-kl-spike.log"
STATE_PINNED = "trl_grpo_llama3.2-3b_trainer-state_length-pinned-kl-creep.json"
CONSOLE_PINNED = "trl_grpo_llama3.2-3b_console_same-run-as-trainer-state.log"
SPARSE = "trl_grpo_qwen2.5-3b_trainer_state_dead-sparse-reward.json"
