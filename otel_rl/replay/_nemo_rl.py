"""NeMo-RL's console: the per-step summary ``grpo_train`` prints (nemo_rl/algorithms/grpo.py).

    ========================= Step 3/50 =========================
    📊 Training Results:
      • Loss: 0.0368
      • Avg Reward: 0.2832
    ⏱️  Timing:
      • Total step time: 44.74s
      • generation: 32.82s (73.4%)
    📊 Validation Results:
        • Accuracy: 0.3047

Each ``• Name: value`` line under a section becomes the key ``section/name`` (``train/avg_reward``,
``validation/accuracy``, ``timing/total_step_time``; see semconv/mappings/nemo_rl.yaml), at the
step of the header above it (a validation before the first step is step 0). The header's total is
the planned number of steps.
"""

from __future__ import annotations

import re
from pathlib import Path

from otel_rl.replay._log import ANSI_RE, ParsedLog, StepRecord, number_text
from otel_rl.replay._settings import apply_settings

STEP_HEADER_RE = re.compile(r"^=+ Step (\d+)/(\d+) =+\s*$")
_SECTION_RE = re.compile(r"^\W*([A-Za-z][A-Za-z ]*?)\s*(?:Results|Metrics)?:\s*$")
_ITEM_RE = re.compile(r"^\s+[•\-]\s*([^:]+?):\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))\s*(s|GB|tokens)?\b")
_SECTIONS = {"training": "train", "validation": "validation", "timing": "timing", "performance": "perf"}


def is_nemo_rl_header(line: str) -> bool:
    return STEP_HEADER_RE.match(line.strip()) is not None


def read_nemo_rl_console(path: Path, text: str, out: ParsedLog) -> None:
    step = 0
    section: str | None = None
    current: dict[int, StepRecord] = {}
    planned = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = ANSI_RE.sub("", raw) if "\x1b" in raw else raw
        header = STEP_HEADER_RE.match(line.strip())
        if header:
            step, planned, section = int(header.group(1)), int(header.group(2)), None
            continue
        stripped = line.strip()
        if stripped.endswith(":") and not stripped.startswith(("•", "-")):  # "📊 Training Results:", "⏱️  Validation Timing:"
            m = _SECTION_RE.match(stripped)
            words = m.group(1).lower().split() if m else []
            section = "validation_timing" if words[:2] == ["validation", "timing"] else _SECTIONS.get(words[0] if words else "")
            continue
        if section is None:
            continue
        item = _ITEM_RE.match(line)
        if not item:
            continue
        key = f"{section}/" + re.sub(r"[^a-z0-9]+", "_", item.group(1).strip().lower()).strip("_")
        record = current.get(step)
        if record is None:
            record = current[step] = StepRecord(step, {}, number)
            out.records.append(record)
        record.values[key] = number_text(item.group(2))
    if planned is not None:
        apply_settings(out, {"max_steps": planned}, "the step headers (Step N/total)")
