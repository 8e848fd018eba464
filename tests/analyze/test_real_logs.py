"""Replay and analyze held to what a careful engineer sees in each real public log.

The logs and what is known about them (source, format, steps, known events, traps) are in
../shared/logs/README.md. Each test states what the log shows and checks the reader (format,
steps, settings), the verdict, the events at their steps and the advice that the values support.
"""

from __future__ import annotations

import time

import pytest
from shared_files import (
    AAIPL,
    BLOWUP,
    COLLAPSE,
    CONSOLE_PINNED,
    DEAD_REWARD,
    HEALTHY,
    KAGGLE_DROP,
    KAGGLE_PINNED,
    KL_SPIKE,
    LENGTH_COLLAPSE,
    LLAMA,
    LOGS,
    QWEN3,
    REWARD_COLLAPSE,
    SPARSE,
    STATE_PINNED,
    TELELOGS,
    UITARS,
    needs_shared_logs,
)

from otel_rl.analyze import analyze
from otel_rl.replay import parse_file

pytestmark = needs_shared_logs


# file -> (format, first step, last step, logged steps, step interval or None)
READING = {
    COLLAPSE: ("verl-console", 0, 261, 262, 1),
    HEALTHY: ("verl-console", 0, 179, 180, 1),
    BLOWUP: ("verl-console", 1, 238, 238, 1),
    LENGTH_COLLAPSE: ("verl-console", 0, 59, 60, 1),
    UITARS: ("verl-console", 1, 10, 10, 1),
    KL_SPIKE: ("hf-console", 1, 200, 200, 1),
    REWARD_COLLAPSE: ("hf-console", 5, 200, 40, 5),
    DEAD_REWARD: ("hf-console", 5, 345, 69, 5),
    LLAMA: ("trl-state", 1, 250, 250, 1),
    QWEN3: ("trl-state", 5, 1130, 226, 5),
    TELELOGS: ("trl-state", 1, 200, 200, 1),
    AAIPL: ("trl-state", 10, 500, 50, 10),
    KAGGLE_PINNED: ("hf-console", 5, 500, 100, 5),
    KAGGLE_DROP: ("hf-console", 10, 300, 30, 10),
    STATE_PINNED: ("trl-state", 5, 250, 50, 5),
    CONSOLE_PINNED: ("hf-console", 5, 250, 50, 5),
    SPARSE: ("trl-state", 1, 100, 100, 1),
}

_RUNS: dict[str, object] = {}


def run_of(name: str):
    if name not in _RUNS:
        (_RUNS[name],) = analyze([LOGS / name], plots=False)
    return _RUNS[name]


def findings(run, series: str, kinds: tuple[str, ...] = ("spike", "explosion", "threshold", "level shift", "collapse", "drift")):
    return [f for f in run.findings if f.series == series and f.kind in kinds]


def found_near(run, series: str, step: int, *, within: int = 0, **kw) -> bool:
    return any(f.first_step - within <= step <= max(f.last_step, f.peak_step) + within for f in findings(run, series, **kw))


@pytest.mark.parametrize("name", sorted(READING))
def test_every_real_log_is_read_with_its_true_format_and_steps(name):
    fmt, first, last, count, interval = READING[name]
    parsed = parse_file(LOGS / name)
    steps = [r.step for r in parsed.records]
    assert parsed.format == fmt
    assert (steps[0], steps[-1], len(steps)) == (first, last, count)
    assert steps == sorted(set(steps))
    if interval:
        assert all(b - a == interval for a, b in zip(steps[1:], steps[2:]))  # step 0 may be validation only
    assert not parsed.doubts, parsed.doubts
    assert parsed.check is not None and parsed.check.max_records_per_step <= 2 and parsed.check.lines_read > 0


@pytest.mark.parametrize("name", sorted(READING))
def test_analyze_runs_under_five_seconds_on_each_real_log(name):
    t0 = time.perf_counter()
    analyze([LOGS / name], plots=False)
    assert time.perf_counter() - t0 < 5.0


def test_a_kaggle_notebook_log_is_read_through_its_json_wrapper():
    for name, kl_at in ((KAGGLE_DROP, (250, 1.089)), (KAGGLE_PINNED, (305, 0.429))):
        parsed = parse_file(LOGS / name)  # a JSON array of stream records: its stdout joined, then the TRL dicts
        assert any("notebook log" in n for n in parsed.notes), parsed.notes
        assert {r.step: r.values["kl"] for r in parsed.records}[kl_at[0]] == pytest.approx(kl_at[1], rel=1e-3)


def test_one_run_in_two_formats_reads_as_the_same_series():
    console, state = parse_file(LOGS / CONSOLE_PINNED), parse_file(LOGS / STATE_PINNED)
    assert not console.problems  # the validation messages' dicts are not lost records
    a, b = ({r.step: r.values for r in p.records} for p in (console, state))
    assert sorted(a) == sorted(b) == list(range(5, 251, 5))
    for step in a:  # the console prints 4 significant digits
        for key in ("reward", "kl", "grad_norm", "loss"):
            assert float(a[step][key]) == pytest.approx(float(b[step][key]), rel=5e-4, abs=1e-9), (step, key)


def test_verl_config_dump_is_settings_not_records():
    parsed = parse_file(LOGS / UITARS)
    s = parsed.settings
    assert (s["max_response_length"], s["grad_clip"], s["group_size"], s["train_batch_size"]) == (10240, 1.0, 8, 32)
    assert s["use_kl_loss"] is False and s["use_kl_in_reward"] is False and s["kl_coef"] == 0.0
    assert "config" in parsed.setting_sources["grad_clip"]
    assert not any("actor_rollout_ref" in k for r in parsed.records for k in r.values)


def test_wandb_cut_lines_lose_their_fragment_not_their_step():
    parsed = parse_file(LOGS / COLLAPSE)
    assert parsed.truncated_steps == list(range(0, 261, 10))
    at10 = next(r for r in parsed.records if r.step == 10).values
    assert "critic/score/mean" not in at10 and "actor/grad_norm" in at10  # missing after the cut, not zero
    assert any("4096" in n for n in parsed.notes)


def test_buffered_hf_console_takes_steps_from_the_records_not_the_bars():
    kl = parse_file(LOGS / KL_SPIKE)  # every dict printed after "Training completed", values as strings
    by_step = {r.step: r.values for r in kl.records}
    assert by_step[71]["kl"] == pytest.approx(17.76) and by_step[72]["kl"] == pytest.approx(0.13, abs=0.01)
    assert kl.settings["max_steps"] == 200 and kl.clock == "elapsed"
    collapse = parse_file(LOGS / REWARD_COLLAPSE)  # dicts in bursts after bar positions 40, 75, ...
    rewards = {r.step: r.values["reward"] for r in collapse.records}
    assert [rewards[s] for s in (5, 10, 15, 20, 25, 30)] == pytest.approx([0.825, 0.95, 1.0, 0.775, 0.525, 0.0])


def test_two_runs_in_one_file_are_split_and_the_rl_run_is_read():
    parsed = parse_file(LOGS / DEAD_REWARD)
    assert len(parsed.segments) == 2 and [s.rl for s in parsed.segments] == [False, True]
    assert {r.step: r.values["kl"] for r in parsed.records}[15] == pytest.approx(2.159, abs=1e-3)
    sft = parse_file(LOGS / DEAD_REWARD, segment=1)
    assert len(sft.records) == 40 and "reward" not in sft.records[0].values
    assert parsed.settings["max_steps"] == 1404 and sft.settings["max_steps"] == 200


@pytest.mark.parametrize(
    "name, learned",
    [
        (LLAMA, "yes"),
        (HEALTHY, "yes"),
        (BLOWUP, "yes"),
        (REWARD_COLLAPSE, "worse"),
        (COLLAPSE, "worse"),
        (LENGTH_COLLAPSE, "worse"),
        (DEAD_REWARD, "no clear change"),
        (QWEN3, "no clear change"),
    ],
)
def test_the_verdict_says_whether_the_run_learned(name, learned):
    v = run_of(name).verdict
    assert v.learned == learned, v.learned_text
    assert "2 s.e." in v.learned_text


def test_a_rise_then_a_slow_decline_is_said():
    v = run_of(KL_SPIKE).verdict
    assert "peaked at" in v.learned_text


@pytest.mark.parametrize("name", [HEALTHY, TELELOGS])
def test_healthy_controls_have_no_critical_finding(name):
    run = run_of(name)
    assert not [f.detail for f in run.findings if f.severity == "critical"]
    assert run.verdict.stable != "unstable"


def test_healthy_verl_run_gets_no_length_or_clipping_advice():
    topics = {r.topic for r in run_of(HEALTHY).recommendations}
    # clip_ratio <= 0.011 and grad_norm <= 0.73 with a clip of 1.0: nothing supports either
    assert "max completion length" not in topics and "gradient clipping" not in topics


def test_kl_advice_never_reads_the_kl_to_the_previous_policy():
    run = run_of(UITARS)  # actor/ppo_kl = 0 by construction (one update per batch); no KL term configured
    assert not any("ppo_kl" in " ".join(r.evidence) or "KL is 0" in r.action for r in run.recommendations)


def test_length_advice_cites_the_limit_it_rests_on():
    rec = next(r for r in run_of(BLOWUP).recommendations if r.topic == "max completion length")
    assert "8096" in " ".join(rec.evidence) and "clip_ratio" in " ".join(rec.evidence)
    rec = next(r for r in run_of(AAIPL).recommendations if r.topic == "max completion length")
    assert "128" in rec.action


def test_zero_gradients_that_are_a_reporting_artifact_get_no_clipping_advice():
    topics = {r.topic for r in run_of(REWARD_COLLAPSE).recommendations}
    assert "gradient clipping" not in topics and "no learning signal" in topics


# ----------------------------------------------------------------------------- known events


def test_isolated_kl_and_grad_norm_spike_at_step_71():
    run = run_of(KL_SPIKE)
    assert found_near(run, "kl", 71) and found_near(run, "grad_norm", 71)
    assert any(f.severity == "critical" and f.first_step <= 71 <= f.last_step for f in findings(run, "kl"))


def test_llama_kl_spike_at_206_and_grad_norm_spikes_at_51_and_84():
    run = run_of(LLAMA)
    assert found_near(run, "kl", 206)
    assert found_near(run, "grad_norm", 84) and found_near(run, "grad_norm", 51)


def test_qwen3_repeated_kl_spikes_from_the_first_logged_step():
    run = run_of(QWEN3)
    for step in (5, 15, 20, 130, 205, 1025):
        assert found_near(run, "kl", step), step
    assert found_near(run, "grad_norm", 205)


def test_dead_reward_run_kl_and_grad_norm_spike_at_15():
    run = run_of(DEAD_REWARD)
    assert found_near(run, "kl", 15) and found_near(run, "grad_norm", 15)


def test_verl_collapse_length_entropy_kl_and_grad_norm():
    run = run_of(COLLAPSE)
    assert any(
        f.kind in ("collapse", "level shift", "threshold") and 6 <= f.first_step <= 12 for f in findings(run, "response_length/mean")
    )
    assert any(10 <= f.first_step <= 13 for f in findings(run, "actor/entropy"))
    assert any(f.first_step <= 9 for f in findings(run, "actor/reward_kl_penalty"))
    assert found_near(run, "actor/grad_norm", 10) and found_near(run, "actor/grad_norm", 15)


def test_verl_length_collapse_with_grad_norm_blow_up():
    run = run_of(LENGTH_COLLAPSE)
    assert any(31 <= f.first_step <= 38 and f.direction == "down" for f in findings(run, "response_length/mean"))
    assert any(35 <= f.first_step <= 43 and f.direction == "up" for f in findings(run, "actor/grad_norm"))


def test_verl_length_blow_up_is_a_drift_up():
    run = run_of(BLOWUP)
    assert any(f.direction == "up" for f in findings(run, "response_length/mean"))
