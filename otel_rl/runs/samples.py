"""Rollout samples read back from a run folder: the ``rl.sample`` events of a step (``logs.jsonl`` of
every rank), and their text for ``otel-rl show RUN --step N --samples``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from otel_rl.runs.folder import read_log_records
from otel_rl.runs.records import ReadResult
from otel_rl.runs.run_selection import choose_run
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N
from otel_rl.trackers import samples as S

__all__ = ["format_samples", "read_samples", "sample_steps"]


def read_samples(run_dir: str | os.PathLike[str], step: int | None = None, run_id: str | None = None) -> ReadResult[dict[str, Any]]:
    """The ``rl.sample`` bodies of ``step`` (all steps when None), by step, then rank, then index, of
    one run: ``run_id``, else the folder's latest (LookupError for a run the folder does not hold)."""
    records = read_log_records(run_dir)
    run = choose_run((record.get("resource") for record in records), run_id)
    found = []
    for record in records:
        if record.get("event_name") != N.RL_SAMPLE_EVENT or not isinstance(record.get("body"), Mapping):
            continue
        if not run.keeps(record.get("resource")):
            continue
        attributes = record.get("attributes") or {}
        if step is not None and attributes.get(A.RL_STEP) != step:
            continue
        rank = (record.get("resource") or {}).get(A.RL_RANK, 0)
        found.append((attributes.get(A.RL_STEP, -1), rank, attributes.get(A.RL_SAMPLE_INDEX, 0), dict(record["body"])))
    found.sort(key=lambda item: item[:3])
    return ReadResult([body for *_, body in found], records.problems)


def sample_steps(run_dir: str | os.PathLike[str], run_id: str | None = None) -> list[int]:
    """The steps that have samples, ascending."""
    return sorted({row[S.STEP] for row in read_samples(run_dir, run_id=run_id) if isinstance(row.get(S.STEP), int)})


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _indent(label: str, text: str) -> list[str]:
    lines = str(text).splitlines() or [""]
    pad = " " * (len(label) + 4)
    return [f"  {label}: {lines[0]}"] + [pad + line for line in lines[1:]]


def format_samples(rows: Sequence[Mapping[str, Any]]) -> str:
    """One block per sample: a header line (index, group, reward and its parts, length, truncation),
    then the prompt and the response, indented."""
    blocks = []
    for row in rows:
        head = [f"#{row.get(S.INDEX, '?')}"]
        if S.GROUP_ID in row:
            head.append(f"group {row[S.GROUP_ID]}")
        if S.REWARD in row:
            head.append(f"reward {_number(row[S.REWARD])}")
        parts = [f"{k[len(S.REWARDS_PREFIX) :]} {_number(v)}" for k, v in row.items() if k.startswith(S.REWARDS_PREFIX)]
        if parts:
            head.append(f"({', '.join(parts)})")
        if S.ADVANTAGE in row:
            head.append(f"advantage {_number(row[S.ADVANTAGE])}")
        if S.RESPONSE_LENGTH in row:
            head.append(f"{row[S.RESPONSE_LENGTH]} token{'' if row[S.RESPONSE_LENGTH] == 1 else 's'}")
        if row.get(S.TRUNCATED):
            head.append("truncated")
        lines = ["  ".join(head)]
        for key in (S.PROMPT, S.RESPONSE):
            if key in row:
                lines += _indent(key, row[key])
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
