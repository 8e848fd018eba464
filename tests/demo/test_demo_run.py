"""`otel-rl demo` with the real SDK: the run folder it writes holds every stage of every step."""

from __future__ import annotations

import json
from collections import Counter

import pytest

pytest.importorskip("torch")

from otel_rl import cli  # noqa: E402
from otel_rl.runs.folder import find_step_trace, read_log_records, read_metrics, read_spans  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

GRPO_STAGES = ["generate", "compute_rewards", "compute_log_probs", "compute_ref_log_probs", "advantage", "train_step", "model_update"]
OFFLOADED = {"compute_log_probs", "compute_ref_log_probs", "train_step", "compute_values", "do_checkpoint"}


@pytest.mark.parametrize(("algo", "extra"), [("grpo", []), ("ppo", ["compute_values"])])
def test_demo_run_folder_holds_every_stage_with_correct_parents(tmp_path, capsys, algo, extra):
    steps = 5  # step 5 also runs validation and no checkpoint; the final step checkpoints
    assert cli.main(["demo", "--steps", str(steps), "--algo", algo, "--out", str(tmp_path), "--quiet"]) == 0
    assert f"otel-rl show {tmp_path} --step {steps}" in capsys.readouterr().out

    spans = read_spans(tmp_path)
    assert not spans.problems
    for step in range(1, steps + 1):
        trace = find_step_trace(spans, step)
        root = trace[0]
        assert root.name == N.RL_STEP_SPAN and root.parent_span_id is None
        children = [s for s in trace if s.parent_span_id == root.span_id]
        names = [s.attributes[A.RL_STAGE] for s in sorted(children, key=lambda s: s.start_ns)]
        for stage in GRPO_STAGES + extra:
            assert stage in names, (step, stage, names)
        for stage in children:
            assert root.start_ns <= stage.start_ns <= stage.end_ns <= root.end_ns
            assert stage.attributes[A.RL_STEP] == step
            phases = [s for s in trace if s.parent_span_id == stage.span_id]
            if stage.attributes[A.RL_STAGE] in OFFLOADED:
                assert sorted(p.name for p in phases) == ["rl.execute", "rl.offload", "rl.onload"]
                assert len([e for e in stage.events if e.name == N.RL_MEMORY_SNAPSHOT_EVENT]) == 4
                for phase in phases:
                    assert stage.start_ns <= phase.start_ns <= phase.end_ns <= stage.end_ns
        # Every span of the trace hangs off the root, through stages and phases.
        ids = {s.span_id for s in trace}
        assert all(s.parent_span_id in ids for s in trace[1:])
    assert "do_checkpoint" in [s.attributes.get(A.RL_STAGE) for s in find_step_trace(spans, steps)]
    assert "validation" in [s.attributes.get(A.RL_STAGE) for s in find_step_trace(spans, 5)]

    events = [r for r in read_log_records(tmp_path) if r["event_name"] == N.RL_LOG_EVENT]
    assert [r["attributes"][A.RL_STEP] for r in events] == list(range(1, steps + 1))
    assert {
        "actor/pg_loss",
        "critic/score/mean",
        "tokens/response_length/mean",
        "system/tps",
        "time/actor_train/train_step/total",
        "memory/cpu/actor_train/train_step/end/rss",
    } <= set(events[-1]["body"])

    names = Counter(p.name for p in read_metrics(tmp_path))
    for metric in (
        M.RL_LOSS,
        M.RL_SCORE,
        M.RL_POLICY_KL,
        M.RL_STAGE_DURATION,
        M.RL_STEP_DURATION,
        M.RL_SAMPLE_REWARD,
        M.RL_RESPONSE_LENGTH,
        M.RL_THROUGHPUT_TOKENS,
        M.PROCESS_MEMORY_USAGE,
        M.RL_VALIDATION_SCORE,
    ):
        assert names[metric], metric
    assert not names[M.RL_UNMAPPED] and not names[M.RL_TELEMETRY_REJECTED]  # every demo key maps, none is bad


def test_demo_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--steps", "--algo", "--out", "--seed", "--inject-spike-at", "--quiet"):
        assert option in out


def test_the_demo_takes_its_service_name_from_otel_service_name(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-rl-service")
    assert cli.main(["demo", "--steps", "2", "--out", str(tmp_path / "named"), "--quiet"]) == 0
    assert json.loads((tmp_path / "named" / "run.json").read_text())["service_name"] == "my-rl-service"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    assert cli.main(["demo", "--steps", "2", "--out", str(tmp_path / "default"), "--quiet"]) == 0
    assert json.loads((tmp_path / "default" / "run.json").read_text())["service_name"] == "otel-rl-demo-grpo"
