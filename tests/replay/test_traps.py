"""Each trap real training logs hold, in a framework's exact output shape (written by trap_hf /
trap_verl from their own truth): replay reads the true format, steps, values and settings, or
says at the top that it cannot be sure."""

from __future__ import annotations

import io
import json
import math

import pytest
import trap_hf
import trap_verl

from otel_rl.replay import parse_file, replay_file

WRITERS = {
    "hf_checkpoint_shards": trap_hf.write_hf_checkpoint_shards,
    "hf_buffered": trap_hf.write_hf_buffered,
    "hf_buffered_at_exit": lambda p: trap_hf.write_hf_buffered(p, burst_bytes=None),
    "hf_buffered_strings": lambda p: trap_hf.write_hf_buffered(p, strings=True),
    "hf_resumed": trap_hf.write_hf_resumed,
    "hf_eval": trap_hf.write_hf_eval,
    "hf_numpy": trap_hf.write_hf_numpy,
    "two_runs": trap_hf.write_two_runs,
    "verl_config_dump": trap_verl.write_verl_config_dump,
    "verl_config_dump_plain": lambda p: trap_verl.write_verl_config_dump(p, ansi=False, use_kl_loss=True),
    "verl_resumed": trap_verl.write_verl_resumed,
    "verl_numpy": trap_verl.write_verl_numpy,
    "verl_truncated": trap_verl.write_verl_truncated,
    "verl_truncated_numpy1": lambda p: trap_verl.write_verl_truncated(p, numpy2=False),
}


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)
    return a == b


@pytest.fixture(params=sorted(WRITERS), ids=sorted(WRITERS))
def trap(request, tmp_path):
    return WRITERS[request.param](tmp_path / f"{request.param}.log")


def test_format_steps_and_values_are_the_truth(trap):
    parsed = parse_file(trap.path)
    assert parsed.format == trap.format
    by_step = {r.step: r.values for r in parsed.records}
    assert sorted(by_step) == trap.steps
    assert not parsed.doubts, parsed.doubts
    wrong = {
        (step, key): (want, by_step[step].get(key))
        for step, values in trap.values.items()
        for key, want in values.items()
        if not _same(by_step[step].get(key), want)
    }
    assert not wrong
    present = {(step, key) for step, keys in trap.absent.items() for key in keys if key in by_step.get(step, {})}
    assert not present, f"keys cut off by the line limit were read: {sorted(present)[:5]}"
    assert sorted(parsed.truncated_steps) == sorted(trap.truncated_steps)


def test_settings_come_from_the_header_or_config_dump(trap):
    parsed = parse_file(trap.path)
    wrong = {k: (v, parsed.settings.get(k)) for k, v in trap.settings.items() if not _same(parsed.settings.get(k), v)}
    assert not wrong


def test_runs_in_one_file_are_told_apart(tmp_path):
    truth = trap_hf.write_two_runs(tmp_path / "two.log")
    parsed = parse_file(truth.path)
    assert len(parsed.segments) == truth.segments == 2
    assert [s.rl for s in parsed.segments] == [False, True]
    assert any("2 training runs" in n for n in parsed.notes)
    first = parse_file(truth.path, segment=1)
    assert first.records and not any("reward" in r.values for r in first.records)
    with pytest.raises(ValueError, match="segment 3 does not exist"):
        parse_file(truth.path, segment=3)


def test_a_resumed_run_keeps_the_later_record_of_each_repeated_step(tmp_path):
    truth = trap_hf.write_hf_resumed(tmp_path / "resumed.log", max_steps=40, crash_after=30, resume_from=20)
    parsed = parse_file(truth.path)
    assert len(parsed.segments) == 1
    assert any("resumed from global step 20" in n for n in parsed.notes)
    assert any("steps 21-30" in n and "later record" in n for n in parsed.notes)


def test_a_file_that_cannot_tell_its_steps_says_so(tmp_path):
    truth = trap_hf.write_hf_ambiguous(tmp_path / "ambiguous.log")
    assert truth.ambiguous and truth.steps is None
    parsed = parse_file(truth.path)
    assert len(parsed.records) == truth.records
    assert any("carry no step" in d for d in parsed.doubts)


def test_replay_prints_the_doubt_first_and_writes_format_and_steps(tmp_path):
    truth = trap_hf.write_hf_ambiguous(tmp_path / "ambiguous.log")
    run_dir = tmp_path / "run"
    printed = io.StringIO()
    replay_file(truth.path, run_dir=run_dir, exporters="none", progress=False, out=printed)
    lines = printed.getvalue().strip().splitlines()
    assert lines[0].startswith("otel-rl replay: WARNING:") and "carry no step" in lines[0], lines[:3]
    data = json.loads((run_dir / "replay.json").read_text())
    assert data["format"] == "hf-console" and data["doubts"]
    assert data["steps"] == {"first": 1, "last": truth.records, "count": truth.records}
