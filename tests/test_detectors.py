"""Online alert rules: parsing, the engine's semantics, and the rules running inside telemetry."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml

from otel_rl.detect.detectors import Alert, AlertEngine, default_rules, default_rules_yaml, load_rules, parse_rules
from otel_rl.runs.folder import read_log_records, read_metrics
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

KL_REF = ((A.RL_KL_ESTIMATOR, "k3"), (A.RL_POLICY, A.RlPolicyValues.REFERENCE.value))
GRAD = ((A.RL_MODEL_ROLE, A.RlModelRoleValues.ACTOR.value),)
ENTROPY = ((A.RL_STATISTIC, A.RlStatisticValues.MEAN.value),)


def healthy(step: int) -> list[tuple[str, tuple, float]]:
    return [
        (M.RL_POLICY_KL, KL_REF, 0.02 + 0.001 * (step % 3)),
        (M.RL_GRAD_NORM, GRAD, 0.8 + 0.02 * (step % 4)),
        (M.RL_POLICY_ENTROPY, ENTROPY, 2.0 - 0.01 * (step % 5)),
        (M.RL_RESPONSE_CLIPPED_RATIO, (), 0.02),
    ]


def feed(engine: AlertEngine, steps: range, overrides: dict[int, dict[str, float]] | None = None) -> list[Alert]:
    fired = []
    for step in steps:
        values = healthy(step)
        for metric, value in (overrides or {}).get(step, {}).items():
            values = [(m, a, value if m == metric else v) for m, a, v in values]
        fired += engine.observe(step, step * 10**9, values)
    return fired


# ------------------------------------------------------------------------------------------ rules


def test_default_rules_are_seed_002_and_003():
    names = {r.name for r in default_rules()}
    assert names == {
        "divergence",
        "kl_above_threshold",
        "clipped_ratio_above_threshold",
        "memory_risk",
        "dynamic_batch_runaway",
        "rank_imbalance",
        "inference_anomaly",
    }
    # the printed YAML is a rules file that loads back to the same rules
    assert parse_rules(yaml.safe_load(default_rules_yaml()), "printed") == default_rules()


@pytest.mark.parametrize(
    "rule, message",
    [
        ({"name": "x", "any": [{"metric": "rl.nope", "above": 1}]}, "'rl.nope' is not a registry metric"),
        ({"name": "x", "any": [{"metric": M.RL_GRAD_NORM}]}, "needs above, below or anomaly"),
        ({"name": "x", "all": [{"metric": M.RL_GRAD_NORM, "above": 1}], "any": []}, "exactly one of"),
        ({"name": "x", "any": [{"metric": M.RL_GRAD_NORM, "above": 1, "attributes": {"rl.color": "red"}}]}, "unknown attribute"),
        ({"name": "x", "severity": "fatal", "any": [{"metric": M.RL_GRAD_NORM, "above": 1}]}, "severity 'fatal'"),
        ({"name": "x", "any": [{"metric": M.RL_GRAD_NORM, "anomaly": "sideways"}]}, "up, down or any"),
        ({"name": "x", "any": [{"metric": M.RL_GRAD_NORM, "above": 1, "treshold": 2}]}, "unknown field"),
    ],
)
def test_bad_rules_name_the_file_the_rule_and_the_fix(tmp_path, rule, message):
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"rules": [rule]}))
    with pytest.raises(ValueError) as info:
        load_rules(path)
    assert str(path) in str(info.value) and "'x'" in str(info.value) and message in str(info.value)


def test_rules_file_missing_and_off(tmp_path):
    with pytest.raises(FileNotFoundError, match="OTEL_RL_ALERT_RULES"):
        load_rules(tmp_path / "nope.yaml")
    assert load_rules("off") == [] and len(load_rules("default")) == 7


# ----------------------------------------------------------------------------------------- engine


def test_divergence_needs_kl_grad_norm_and_entropy_together():
    engine = AlertEngine(default_rules())
    assert feed(engine, range(1, 40)) == []  # healthy: nothing
    # KL and grad norm blow up at step 40, entropy collapses one step later: within 2 steps
    fired = feed(engine, range(40, 45), {40: {M.RL_POLICY_KL: 50.0, M.RL_GRAD_NORM: 5e6}, 41: {M.RL_POLICY_ENTROPY: 0.5}})
    names = [(a.name, a.step) for a in fired]
    assert ("kl_above_threshold", 40) in names and ("divergence", 41) in names
    div = next(a for a in fired if a.name == "divergence")
    assert {c["metric"] for c in div.conditions} == {M.RL_POLICY_KL, M.RL_GRAD_NORM, M.RL_POLICY_ENTROPY}
    assert all("baseline" in c and "z" in c for c in div.conditions)


def test_kl_and_grad_norm_without_entropy_is_not_divergence():
    engine = AlertEngine([r for r in default_rules() if r.name == "divergence"])
    fired = feed(engine, range(1, 50), {40: {M.RL_POLICY_KL: 50.0, M.RL_GRAD_NORM: 5e6}})
    assert fired == []


def test_thresholds_wait_for_the_warm_up_and_respect_the_cooldown():
    engine = AlertEngine([r for r in default_rules() if r.name == "clipped_ratio_above_threshold"])
    over = {s: {M.RL_RESPONSE_CLIPPED_RATIO: 0.6} for s in range(1, 60)}  # high from the first step
    fired = feed(engine, range(1, 60), over)
    assert [a.step for a in fired] == [6, 26, 46]  # after 5 warm-up values, then every 20 steps


def test_derived_series_memory_gap_and_rank_token_ratio():
    rules = parse_rules(yaml.safe_load(default_rules_yaml()), "defaults")
    engine = AlertEngine([r for r in rules if r.name in ("memory_risk", "rank_imbalance")])
    kind = A.RL_MEMORY_KIND
    fired = []
    for step in range(1, 30):
        gap = 2e9 if step < 25 else 9e9  # reserved - allocated widens at step 25
        util = 0.8 if step < 25 else 0.95
        busiest = 1200.0 if step != 27 else 4000.0
        values = [
            (M.RL_GPU_MEMORY_USAGE, ((kind, "allocated"),), 60e9),
            (M.RL_GPU_MEMORY_USAGE, ((kind, "reserved"),), 60e9 + gap),
            (M.RL_GPU_MEMORY_UTILIZATION, ((kind, "max_reserved"),), util),
            (M.RL_RANK_TOKENS, ((A.RL_STATISTIC, "max"),), busiest),
            (M.RL_RANK_TOKENS, ((A.RL_STATISTIC, "mean"),), 1000.0),
        ]
        fired += engine.observe(step, 0, values)
    assert [(a.name, a.step) for a in fired] == [("memory_risk", 25), ("rank_imbalance", 27)]


def test_stop_action_hooks_and_take_alerts():
    rules = parse_rules(
        {
            "rules": [
                {
                    "name": "kl_stop",
                    "severity": "critical",
                    "actions": ["stop", "snapshot"],
                    "any": [{"metric": M.RL_POLICY_KL, "above": 10}],
                }
            ]
        },
        "test",
    )
    seen: list[Alert] = []
    reports: list[str] = []
    engine = AlertEngine(rules, report=lambda key, reason, message: reports.append(message))

    def broken(alert: Alert) -> None:
        raise RuntimeError("disk full")

    engine.add_hook(broken)
    engine.add_hook(seen.append)
    feed(engine, range(1, 20), {15: {M.RL_POLICY_KL: 12.0}})
    assert engine.should_stop and [a.step for a in seen] == [15] and seen[0].actions == ("stop", "snapshot")
    assert len(reports) == 1 and "disk full" in reports[0]  # the broken hook never stopped the others
    assert [a.name for a in engine.take_alerts()] == ["kl_stop"] and engine.take_alerts() == []
    with pytest.raises(TypeError):
        engine.add_hook("not callable")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ inside telemetry


def test_alerts_run_on_the_worker_and_are_events_and_a_counter(make_telemetry, tmp_path):
    threads: list[str] = []
    tel = make_telemetry(framework="trl", alert_rules="default")
    tel.on_alert(lambda alert: threads.append(threading.current_thread().name))
    for step in range(1, 21):
        tel.log({"kl": 25.0 if step == 15 else 0.02, "completions/clipped_ratio": 0.05}, step=step)
    deadline = time.monotonic() + 10
    while not threads and time.monotonic() < deadline:  # the worker drains the queue on its own
        time.sleep(0.01)
    tel.flush()
    assert threads == ["otel-rl-pipeline"]  # the hook ran on the telemetry worker, not here
    alerts = [r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_ALERT_EVENT]
    assert len(alerts) == 1
    assert alerts[0]["attributes"][A.RL_ALERT_NAME] == "kl_above_threshold"
    assert alerts[0]["attributes"][A.RL_STEP] == 15 and alerts[0]["body"]["conditions/0/value"] == 25.0
    step_event = next(r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT and r["attributes"][A.RL_STEP] == 15)
    assert alerts[0]["timestamp"] == step_event["timestamp"]  # the alert carries its step's time
    counts = [p for p in read_metrics(tel.run_dir) if p.name == M.RL_ALERT]
    assert counts and counts[-1].value == 1 and counts[-1].attributes[A.RL_ALERT_NAME] == "kl_above_threshold"
    assert not tel.should_stop and [a.step for a in tel.take_alerts()] == [15]


def test_rules_file_with_stop_sets_should_stop(make_telemetry, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump(
            {
                "rules": [
                    {"name": "runaway_kl", "severity": "critical", "actions": ["stop"], "any": [{"metric": M.RL_POLICY_KL, "above": 10}]}
                ]
            }
        )
    )
    tel = make_telemetry(framework="trl", alert_rules=str(rules))
    for step in range(1, 12):
        tel.log({"kl": 50.0 if step == 9 else 0.1}, step=step)
    tel.flush()
    assert tel.should_stop


def test_rules_off_by_default_and_off_means_off(make_telemetry, monkeypatch):
    monkeypatch.delenv("OTEL_RL_ALERT_RULES", raising=False)
    tel = make_telemetry()
    assert tel._pipeline.observer is None and not tel.should_stop and tel.take_alerts() == []
    off = make_telemetry(alert_rules="off")
    off.on_alert(lambda alert: None)
    assert off._pipeline.observer is None


def test_bad_rules_file_fails_at_init_not_in_the_loop(make_telemetry, tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("rules: [{name: x, any: [{metric: rl.nope, above: 1}]}]")
    with pytest.raises(ValueError, match="rl.nope"):
        make_telemetry(alert_rules=str(bad))


# ----------------------------------------------------------------------------------- the demo run


@pytest.fixture(scope="module")
def demo_alerts(tmp_path_factory) -> dict[str, list[Alert]]:
    pytest.importorskip("torch")
    import otel_rl
    from otel_rl.demo import run_demo

    out: dict[str, list[Alert]] = {}
    for name, spike in (("healthy", None), ("spiked", 6)):
        root: Path = tmp_path_factory.mktemp(name)
        tel = otel_rl.init(run_dir=str(root / "run"), framework="roll", console=False, alert_rules="default", service_name="otel-rl-test")
        try:
            run_demo(steps=9, telemetry=tel, out=root / "out", inject_spike_at=spike, progress=False)
            tel.flush()
            out[name] = tel.take_alerts()
        finally:
            tel.shutdown()
    return out


@pytest.mark.slow
def test_demo_with_injected_spike_fires_divergence_at_or_after_it(demo_alerts):
    spiked = demo_alerts["spiked"]
    divergence = [a for a in spiked if a.name == "divergence"]
    assert divergence and all(a.step >= 6 for a in spiked)
    assert divergence[0].step in (6, 7, 8)


@pytest.mark.slow
def test_healthy_demo_fires_no_alert(demo_alerts):
    assert demo_alerts["healthy"] == []


def test_init_on_alert_turns_the_default_rules_on(tmp_path, monkeypatch):
    import otel_rl

    monkeypatch.delenv("OTEL_RL_ALERT_RULES", raising=False)
    seen: list[Alert] = []
    tel = otel_rl.init(run_dir=str(tmp_path / "run"), console=False, framework="trl", on_alert=seen.append, service_name="otel-rl-test")
    try:
        for step in range(1, 10):
            tel.log({"kl": 40.0 if step == 8 else 0.05}, step=step)
        tel.flush()
    finally:
        tel.shutdown()
    assert [(a.name, a.step) for a in seen] == [("kl_above_threshold", 8)]


def test_the_baseline_is_the_median_and_the_larger_of_its_spread_estimates_exactly() -> None:
    # baseline() runs once per watched value in training: its fast form must give the same numbers
    # as the definition, to the last bit, on windows of every length the engine holds
    import random
    import statistics

    from otel_rl.detect.baseline import MAD_TO_SIGMA, MEAN_AD_TO_SIGMA, DetectorConfig, baseline

    cfg = DetectorConfig()
    rng = random.Random(11)
    for _ in range(2000):
        window = [rng.choice([rng.random(), rng.gauss(0, 1e-3), 0.0, 1.0]) for _ in range(rng.randint(1, 30))]
        med = statistics.median(window)
        devs = sorted(abs(v - med) for v in window)
        kept = devs[: len(devs) - (max(1, len(devs) // 10) if len(devs) >= 10 else 0)]
        scale = max(
            MAD_TO_SIGMA * statistics.median(devs), MEAN_AD_TO_SIGMA * (sum(kept) / len(kept)), cfg.rel_floor * abs(med), cfg.abs_floor
        )
        assert baseline(window) == (med, scale), window


def _anomaly_as_stated(cond, window: list[float], value: float) -> dict | None:
    """Condition's anomaly test as its docstring states it: baseline(), then is_anomalous(), factor, floor."""
    from otel_rl.detect.detectors import baseline, is_anomalous

    if cond.anomaly == "up" and cond.floor is not None and value < cond.floor:
        return None
    med, scale = baseline(window)
    up = value >= med
    if cond.anomaly == "up" and not up or cond.anomaly == "down" and up:
        return None
    if not is_anomalous(value, med, scale, z=cond.z, min_rel_change=cond.min_rel_change, min_change=cond.min_change):
        return None
    if cond.factor is not None and up and not (med > 0 and value >= cond.factor * med or med <= 0 and value > 0):
        return None
    if cond.factor is not None and not up and not (med > 0 and value <= med / cond.factor):
        return None
    if cond.floor is not None and (value < cond.floor if up else value > cond.floor):
        return None
    return {"value": value, "baseline": med, "scale": scale, "z": (value - med) / scale}


def test_the_online_anomaly_test_refusing_on_the_median_first_decides_as_the_stated_test() -> None:
    import random

    from otel_rl.detect.rules import Condition, Selector

    rng = random.Random(11)
    decided = {True: 0, False: 0}
    for _ in range(20_000):
        cond = Condition(
            series=(Selector(M.RL_GRAD_NORM),),
            anomaly=rng.choice(["up", "down", "any"]),
            z=rng.choice([2.0, 4.0, 6.0]),
            factor=rng.choice([None, 1.5, 3.0]),
            min_change=rng.choice([0.0, 0.05]),
            min_rel_change=rng.choice([0.0, 0.1, 0.5]),
            floor=rng.choice([None, 0.0, 0.5]),
        )
        level, noise = rng.choice([0.0, 1.0, -2.0]), rng.choice([0.0, 0.01, 0.3])
        window = [round(level + rng.gauss(0, noise), rng.choice([2, 6])) for _ in range(rng.randint(5, 30))]
        value = level + rng.choice([0.0, 0.05, 0.5, 3.0, -3.0]) * rng.random()
        got = AlertEngine._test(cond, window, value)
        assert got == _anomaly_as_stated(cond, window, value), (cond, window, value)
        decided[got is not None] += 1
    assert min(decided.values()) > 1_000, decided  # both outcomes well exercised
