"""``Telemetry.log_samples``: opt-in, up to K per step chosen deterministically, text cut on a UTF-8
boundary, one ``rl.sample`` event per kept sample (read back from the run folder and a tracker), bad
input reported once with the key named and never raised."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._sdk.pipeline.samples import cap_text, choose
from otel_rl.runs.folder import read_log_records
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N
from otel_rl.trackers.jsonl import read_jsonl_samples


def batch(step: int, n: int = 16) -> list[dict[str, Any]]:
    return [
        {
            "prompt": f"step {step} prompt {i}",
            "response": f"answer {i}",
            "reward": i / n,
            "rewards": {"accuracy": i / n, "format": 1.0},
            "response_length": i + 1,
            "truncated": i % 2 == 1,
            "group_id": i // 4,
        }
        for i in range(n)
    ]


def samples_of(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_log_records(run_dir) if r["event_name"] == N.RL_SAMPLE_EVENT]


def run(tmp_path: Path, name: str, steps: int = 2, **options: Any) -> list[dict[str, Any]]:
    run_dir = tmp_path / name
    tel = otel_rl.Telemetry(otel_rl.TelemetryConfig(run_dir=str(run_dir), console=False, **{"run_id": "run-a", **options}))
    try:
        for step in range(1, steps + 1):
            tel.log_samples(batch(step), step=step)
    finally:
        tel.shutdown()
    return samples_of(run_dir)


def test_off_by_default(tmp_path: Path) -> None:
    assert run(tmp_path, "off") == []


def test_keeps_k_per_step_chosen_by_run_step_and_index(tmp_path: Path) -> None:
    first = run(tmp_path, "a", log_samples=3)
    again = run(tmp_path, "b", log_samples=3)
    other = run(tmp_path, "c", log_samples=3, run_id="run-b")
    indices = lambda records: [(r["attributes"][A.RL_STEP], r["attributes"][A.RL_SAMPLE_INDEX]) for r in records]  # noqa: E731
    assert len(first) == 6
    assert indices(first) == indices(again)  # a rerun with the same run id keeps the same samples
    assert indices(first) != indices(other)
    assert indices(first) == [(s, i) for s in (1, 2) for i in choose("run-a", s, 0, 16, 3)]
    record = first[0]
    step, index = record["attributes"][A.RL_STEP], record["attributes"][A.RL_SAMPLE_INDEX]
    assert record["attributes"][A.RL_SAMPLE_GROUP_ID] == str(index // 4)
    assert record["body"] == {
        "prompt": f"step {step} prompt {index}",
        "response": f"answer {index}",
        "reward": index / 16,
        "rewards/accuracy": index / 16,
        "rewards/format": 1.0,
        "response_length": index + 1,
        "truncated": index % 2 == 1,
        "group_id": str(index // 4),
        "step": step,
        "index": index,
    }


def test_calls_of_one_step_share_its_budget_and_count_indices_on(tmp_path: Path) -> None:
    tel = otel_rl.Telemetry(otel_rl.TelemetryConfig(run_dir=str(tmp_path), console=False, log_samples=5))
    with tel.step(7):
        tel.log_samples(batch(7, 3))  # all 3 kept, indices 0..2
        rows = batch(7, 10)
        tel.log_samples(rows)  # 2 left, from indices 3..12
        rows[0]["prompt"] = "changed after the call"  # the kept copies are not the caller's objects
        tel.log_samples(batch(7, 10))  # the budget is spent
    tel.shutdown()
    got = sorted(r["attributes"][A.RL_SAMPLE_INDEX] for r in samples_of(tmp_path))
    assert got[:3] == [0, 1, 2] and len(got) == 5 and all(3 <= i < 13 for i in got[3:])
    assert all(r["body"]["step"] == 7 for r in samples_of(tmp_path))
    assert all(r["body"]["prompt"] != "changed after the call" for r in samples_of(tmp_path))


def test_text_is_cut_on_a_utf8_boundary_and_bypasses_the_text_policy(tmp_path: Path) -> None:
    text = "é" * 5 + "✓" * 3000  # 2- and 3-byte characters
    cut = cap_text(text, 100)
    assert len(cut.encode()) <= 100 and cut.endswith(f"…[cut: {len(text.encode())} bytes]")
    assert text.startswith(cut[: cut.index("…")])
    for limit in range(40, 60):  # whatever the limit, never half a character
        assert len(cap_text(text, limit).encode()) <= limit
    assert cap_text(text, 0) == text and cap_text("short", 100) == "short"

    tel = otel_rl.Telemetry(otel_rl.TelemetryConfig(run_dir=str(tmp_path), console=False, log_samples=1, sample_text_limit=64))
    assert not tel.config.export_text
    tel.log_samples([{"prompt": "What is 2 + 2? Answer with one number.", "response": text}], step=1)
    tel.shutdown()
    (record,) = samples_of(tmp_path)
    assert record["body"]["prompt"] == "What is 2 + 2? Answer with one number."  # not withheld
    assert len(record["body"]["response"].encode()) <= 64 and "…[cut:" in record["body"]["response"]


def test_bad_input_is_reported_once_naming_the_key_and_never_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tel = otel_rl.Telemetry(otel_rl.TelemetryConfig(run_dir=str(tmp_path), console=False, log_samples=8))
    bad = [
        {"prompt": [{"role": "user", "content": "hi"}], "response": "ok", "reward": "high"},
        {"prompt": ["again"], "rewards": {"acc": object()}, "response_length": -1, "extra": 1},
        "not a mapping",
    ]
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.log_samples(bad, step=1)
        tel.log_samples(42, step=2)  # type: ignore[arg-type]
        tel.log_samples({"prompt": "a mapping, not a list"}, step=3)  # type: ignore[arg-type]
        tel.flush()
    tel.shutdown()
    text = caplog.text
    assert text.count("'prompt' is a list, not a string") == 1
    assert "'reward' is a str, not a number" in text
    assert "'rewards/acc' is a object, not a number" in text
    assert "'response_length' is -1, not a token count" in text
    assert "'extra' is not a sample field" in text
    assert "'<sample>' is a str, not a mapping" in text
    assert "log_samples() takes a sequence of mappings" in text and "got int" in text and "got dict" in text
    bodies = [r["body"] for r in samples_of(tmp_path)]
    assert {"response": "ok", "step": 1, "index": 0} in bodies  # the good parts of a sample still go out
    assert len(bodies) == 2


def test_environment_variable_and_tracker_receive_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RL_LOG_SAMPLES", "2")
    monkeypatch.setenv("OTEL_RL_SAMPLE_TEXT_LIMIT", "4096")
    tel = otel_rl.init(run_dir=str(tmp_path), console=False, track_with="jsonl")
    try:
        assert tel.config.log_samples == 2 and tel.config.sample_text_limit == 4096
        for step in (1, 2):
            tel.log_samples(batch(step), step=step)
            tel.log({"reward": 0.5}, step=step)
    finally:
        tel.shutdown()
    got = read_jsonl_samples(tmp_path / "jsonl" / "metrics.jsonl")
    assert [(step, len(rows)) for step, rows in got] == [(1, 2), (2, 2)]
    assert all(row["prompt"].startswith(f"step {step} ") for step, rows in got for row in rows)
