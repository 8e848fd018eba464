"""Changepoints, spikes and incidents on series of known shape (the real logs are in test_incidents_real_logs.py).

What the incident layer promises: a change at the second logged point is found there; a slow climb
where it starts; spikes that come back are spikes, not shifts; noise gives nothing; changes of several
series at one step are one incident, named from what moved; a limit the report names is the stated
one or a confirmed one. Precision and recall over injected events are printed with ``-s``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from otel_rl.analyze._changes import series_changes
from otel_rl.analyze._incidents import find_incidents
from otel_rl.analyze._run import _settings
from otel_rl.analyze._series import Series
from otel_rl.detect.detectors import detect_series
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

MEAN = {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}


def series(label: str, metric: str, values, attributes=None, first: int = 1) -> Series:
    s = Series(metric=metric, attributes=dict(attributes or {}), label=label, keys=[label])
    s.by_step = {first + i: float(v) for i, v in enumerate(values)}
    return s


def noisy(rng: np.random.Generator, level: float, n: int, rel: float = 0.03) -> np.ndarray:
    return level * (1.0 + rel * rng.standard_normal(n))


def incidents_of(*all_series: Series, settings=None, sources=None):
    findings = []
    for s in all_series:
        steps, x = s.arrays()
        findings += detect_series(steps, x, series=s.label, metric=s.metric, attributes=s.attributes)
    table = {s.key: s for s in all_series}
    return find_incidents(table, findings, interval=1, settings=settings or {}, sources=sources or {})


def test_a_change_at_the_second_logged_point_is_found_there() -> None:
    rng = np.random.default_rng(1)
    values = np.concatenate([[53.0], noisy(rng, 2.6, 59)])
    (change,) = [c for c in series_changes(series("response_length/mean", M.RL_RESPONSE_LENGTH, values, MEAN), 1) if c.kind != "spike"]
    assert (change.kind, change.direction, change.first_step) == ("shift", "down", 2)
    assert change.size > 1.0  # 53 -> 2.6: more than a decade


def test_a_slow_climb_is_found_where_it_starts() -> None:
    rng = np.random.default_rng(2)
    kl = np.concatenate([noisy(rng, 0.002, 10), np.geomspace(0.002, 0.8, 90) * (1 + 0.05 * rng.standard_normal(90)), noisy(rng, 0.8, 200)])
    (change,) = [c for c in series_changes(series("kl", M.RL_POLICY_KL, kl), 1) if c.kind != "spike"]
    assert change.direction == "up" and change.first_step <= 20, change  # where it starts, not hundreds of steps on
    assert change.after == pytest.approx(0.8, rel=0.3) and change.before == pytest.approx(0.002, rel=0.5)


def test_noise_and_a_trendless_series_give_nothing() -> None:
    rng = np.random.default_rng(3)
    for level in (0.5, 120.0, 3e-4):
        assert series_changes(series("x", M.RL_GRAD_NORM, noisy(rng, level, 300)), 1) == []


def test_a_spike_that_comes_back_is_a_spike_not_a_shift() -> None:
    rng = np.random.default_rng(4)
    grad = noisy(rng, 0.2, 200)
    grad[70] = 154.6
    changes = series_changes(series("grad_norm", M.RL_GRAD_NORM, grad), 1)
    assert [(c.kind, c.first_step) for c in changes] == [("spike", 71)]


def test_changes_at_one_step_are_one_incident_named_from_what_moved() -> None:
    rng = np.random.default_rng(5)
    n, at = 120, 40
    length = np.concatenate([noisy(rng, 1700, at), noisy(rng, 1.2, n - at)])
    entropy = np.concatenate([noisy(rng, 0.22, at + 2), noisy(rng, 2e-4, n - at - 2)])
    reward = noisy(rng, 0.5, n, 0.05)
    found = incidents_of(
        series("response_length/mean", M.RL_RESPONSE_LENGTH, length, MEAN),
        series("actor/entropy", M.RL_POLICY_ENTROPY, entropy, MEAN),
        series("reward", M.RL_REWARD, reward, MEAN),
    )
    top = found[0]
    assert top.name == "policy collapse" and top.severity == "critical", top.text
    assert {M.RL_RESPONSE_LENGTH, M.RL_POLICY_ENTROPY} <= top.metrics
    assert top.reaches(at, at + 3)
    assert not [i for i in found[1:] if i.severity != "info"]  # the steady reward adds nothing


def test_a_kl_and_gradient_spike_at_one_step_is_one_incident() -> None:
    rng = np.random.default_rng(6)
    kl, grad = noisy(rng, 0.09, 200, 0.2), noisy(rng, 0.13, 200, 0.2)
    kl[70], grad[70] = 17.76, 154.6
    (top, *rest) = incidents_of(series("kl", M.RL_POLICY_KL, kl), series("grad_norm", M.RL_GRAD_NORM, grad))
    assert top.name == "KL and gradient-norm spike" and top.severity == "critical" and top.marked_steps == [71]
    assert not [i for i in rest if i.severity != "info"]


def test_a_length_pinned_below_the_stated_limit_is_not_called_the_limit() -> None:
    length = np.concatenate([[5.0, 8.0, 12.0, 16.0], np.full(96, 20.0)])
    clipped = np.zeros(100)
    found = incidents_of(
        series("response_length/mean", M.RL_RESPONSE_LENGTH, length, MEAN),
        series("response_length/clip_ratio", M.RL_RESPONSE_CLIPPED_RATIO, clipped),
        settings={"max_response_length": 128},
        sources={"max_response_length": "config dump"},
    )
    notes = [i.note for i in found if i.note]
    assert notes and all("not at the stated limit 128 (config dump): why is not known" in n for n in notes), notes
    assert not any("is the limit" in i.text or "is the stated limit" in i.text for i in found)
    # Nor does the settings table infer a limit from the data where the log states one.
    parsed = SimpleNamespace(settings={"max_response_length": 128})
    assert not any("from the log" in k for k in _settings(parsed, {}, []))  # type: ignore[arg-type]


def test_a_length_at_a_limit_that_a_truncation_ratio_confirms_says_so() -> None:
    length = np.concatenate([np.linspace(300, 500, 10), np.full(90, 512.0)])
    clipped = np.concatenate([np.linspace(0.1, 0.9, 10), np.ones(90)])
    found = incidents_of(
        series("completions/mean_length", M.RL_RESPONSE_LENGTH, length, MEAN),
        series("completions/clipped_ratio", M.RL_RESPONSE_CLIPPED_RATIO, clipped),
    )
    pinned = [i for i in found if i.name.startswith("responses pinned at the length limit")]
    assert pinned and pinned[0].severity == "critical", [i.text for i in found]
    assert "512 tokens is the limit: completions/clipped_ratio is 1 there" in pinned[0].note


def test_responses_that_stop_hitting_the_cap_early_are_no_alarm_and_are_back() -> None:
    # Seen on a PPO run and an SFT-primed GRPO run: the clip ratio starts high and falls for good
    rng = np.random.default_rng(3)
    clipped = np.concatenate([np.linspace(0.8, 0.35, 18), np.abs(0.06 + 0.02 * rng.standard_normal(182))])
    clipped[150] = 0.4  # one late batch past the threshold: still left for good
    length = np.concatenate([np.linspace(490, 300, 18), noisy(rng, 270.0, 182)])
    found = incidents_of(
        series("response_length/mean", M.RL_RESPONSE_LENGTH, length, MEAN),
        series("response_length/clip_ratio", M.RL_RESPONSE_CLIPPED_RATIO, clipped),
    )
    held = [i for i in found if any(p.kind == "sustained" for p in i.parts)]
    assert held, [i.text for i in found]
    for i in held:
        assert i.severity == "info" and i.recovered, i.text
        assert "not back by the end of the log" not in i.text, i.text
        assert i.name == "responses at the length limit, then under it", i.name  # not "length rises": it fell
    # The same start held to the end is still an alarm.
    stuck = incidents_of(
        series("response_length/clip_ratio", M.RL_RESPONSE_CLIPPED_RATIO, np.concatenate([clipped[:18], np.full(182, 0.5)]))
    )
    assert any(i.severity in ("warning", "critical") and not i.recovered for i in stuck), [i.text for i in stuck]


def test_a_reward_without_spread_on_most_steps_is_no_learning_signal() -> None:
    # An older TRL logs reward_std but not frac_reward_zero_std: 0 on 242 of 250 steps is a dead run
    rng = np.random.default_rng(4)
    std = np.zeros(250)
    std[rng.choice(250, 8, replace=False)] = 0.05
    reward = np.where(std > 0, 0.01, 0.0)
    found = incidents_of(
        series("reward", M.RL_REWARD, reward, MEAN), series("reward_std", M.RL_REWARD, std, {A.RL_STATISTIC: A.RlStatisticValues.STD.value})
    )
    dead = [i for i in found if "no learning signal" in i.name]
    assert dead and dead[0].severity in ("warning", "critical"), [i.text for i in found]
    # No spread at any step (a constant 0) is the same run, only deader.
    flat = incidents_of(series("reward_std", M.RL_REWARD, np.zeros(250), {A.RL_STATISTIC: A.RlStatisticValues.STD.value}))
    assert [i for i in flat if "no learning signal" in i.name and i.severity != "info"], [i.text for i in flat]
    # A healthy run's occasional batch without spread is not one.
    lively = noisy(rng, 0.4, 250, rel=0.3)
    lively[rng.choice(250, 40, replace=False)] = 0.0
    assert not [
        i for i in incidents_of(series("reward_std", M.RL_REWARD, lively, {A.RL_STATISTIC: "std"})) if "no learning signal" in i.name
    ]


def test_a_reward_function_at_0_on_every_step_never_fires_but_a_penalty_at_0_was_never_incurred() -> None:
    # A GRPO notebook: the correctness and format rewards pay 0 on all 68 steps; only xmlcount moves.
    rng = np.random.default_rng(5)
    component = {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}
    xml = noisy(rng, -0.05, 68, rel=0.8)
    found = incidents_of(
        series("reward", M.RL_REWARD, xml, MEAN),
        series("rewards/xmlcount", M.RL_REWARD_COMPONENT, xml, {**component, A.RL_REWARD_FUNCTION: "xmlcount"}),
        series("rewards/correctness", M.RL_REWARD_COMPONENT, np.zeros(68), {**component, A.RL_REWARD_FUNCTION: "correctness"}),
        series("rewards/strict_format", M.RL_REWARD_COMPONENT, np.zeros(68), {**component, A.RL_REWARD_FUNCTION: "strict_format"}),
    )
    silent = [i for i in found if "never fire" in i.name]
    assert len(silent) == 1 and silent[0].severity == "warning", [i.text for i in found]
    assert "rewards/correctness" in silent[0].text and "rewards/strict_format" in silent[0].text
    assert "not back by the end" not in silent[0].text  # it never fired: there is no "back"
    # A length penalty that stays 0 is a penalty no answer incurred; a component that pays now and then fires.
    healthy = incidents_of(
        series("reward", M.RL_REWARD, noisy(rng, 0.5, 68), MEAN),
        series("rewards/overlong_penalty", M.RL_REWARD_COMPONENT, np.zeros(68), {**component, A.RL_REWARD_FUNCTION: "overlong_penalty"}),
        series(
            "rewards/bonus", M.RL_REWARD_COMPONENT, np.where(rng.random(68) < 0.1, 1.0, 0.0), {**component, A.RL_REWARD_FUNCTION: "bonus"}
        ),
    )
    assert not [i for i in healthy if "never fire" in i.name], [i.text for i in healthy]


def test_a_penalty_never_incurred_does_not_count_as_silent_and_a_success_rate_at_0_is_the_rewards_floor() -> None:
    rng = np.random.default_rng(8)
    component = {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}

    def function(name: str, values) -> Series:
        return series(f"rewards/{name}", M.RL_REWARD_COMPONENT, values, {**component, A.RL_REWARD_FUNCTION: name})

    # One silent format reward among three that pay, beside a length penalty never incurred: 1 of 3
    # reward functions is silent (information), not 2 of 4 (a warning).
    found = incidents_of(
        series("reward", M.RL_REWARD, noisy(rng, 0.5, 60), MEAN),
        function("strict_format", np.zeros(60)),
        function("correctness", noisy(rng, 0.4, 60, rel=0.5)),
        function("soft_format", noisy(rng, 0.2, 60, rel=0.5)),
        function("overlong_penalty", np.zeros(60)),
    )
    silent = [i for i in found if "never fire" in i.name]
    assert silent and all(i.severity == "info" for i in silent), [i.text for i in found]
    # An agent's success rate at 0 all run is the reward held at its floor, told as not back.
    floor = incidents_of(function("success", np.zeros(60)))
    assert not [i for i in floor if "never fire" in i.name], [i.text for i in floor]
    assert [i for i in floor if i.severity != "info" and "not back by the end" in i.text], [i.text for i in floor]


def test_groups_losing_their_spread_late_are_no_signal_unless_every_completion_succeeded() -> None:
    # A DAPO run: the total reward climbs to its format-only ceiling of 0 while the answer check sits
    # at its worst (-4.5); groups without spread take over the last third (44% of all steps).
    rng = np.random.default_rng(6)
    n = 300
    reward = np.minimum(0.0, np.linspace(-6.0, 6.0, n))  # at its ceiling of 0 from mid-run
    std = noisy(rng, 1.0, n, rel=0.2)
    late = np.arange(n) >= 2 * n // 3
    std[late & (rng.random(n) < 0.8)] = 0.0
    std[~late & (rng.random(n) < 0.25)] = 0.0
    answer = np.concatenate([np.linspace(-2.0, -4.5, n // 2), np.full(n - n // 2, -4.5)])
    component = {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}

    def runs(*extra: Series):
        return incidents_of(
            series("reward", M.RL_REWARD, reward, MEAN),
            series("reward_std", M.RL_REWARD, std, {A.RL_STATISTIC: A.RlStatisticValues.STD.value}),
            *extra,
        )

    failed = runs(series("rewards/check_answer", M.RL_REWARD_COMPONENT, answer, {**component, A.RL_REWARD_FUNCTION: "check_answer"}))
    assert [i for i in failed if "no learning signal" in i.name and i.severity != "info"], [i.text for i in failed]
    # The same spread lost with every completion at the best reward, no function at its worst: success.
    solved = runs(series("rewards/check_answer", M.RL_REWARD_COMPONENT, -answer, {**component, A.RL_REWARD_FUNCTION: "check_answer"}))
    assert not [i for i in solved if "no learning signal" in i.name and i.severity != "info"], [i.text for i in solved]


def test_the_kl_to_the_sampling_policy_alarms_only_far_outside_the_trust_region() -> None:
    rng = np.random.default_rng(7)
    old = {A.RL_POLICY: A.RlPolicyValues.OLD.value}
    # Many epochs on one batch: the update's KL to the sampling policy goes 0.05 -> 8 (CS336, AReaL).
    drift = np.concatenate([noisy(rng, 0.05, 30, rel=0.2), np.geomspace(0.1, 8.0, 10)])
    found = incidents_of(series("approx_kl", M.RL_POLICY_KL, drift, old))
    assert [i for i in found if i.severity == "warning" and "approx_kl" in i.text], [i.text for i in found]
    # A PPO KL of 1e-4 that rises 20x with a reward collapse is still tiny: the collapse alarms, not the KL.
    tiny = np.concatenate([noisy(rng, 1e-4, 30, rel=0.2), noisy(rng, 2e-3, 10, rel=0.2)])
    reward = np.concatenate([noisy(rng, 0.6, 30), noisy(rng, 0.05, 10)])
    mixed = incidents_of(series("actor/ppo_kl", M.RL_POLICY_KL, tiny, old), series("reward", M.RL_REWARD, reward, MEAN))
    assert [i for i in mixed if i.severity != "info" and "reward" in i.name], [i.text for i in mixed]
    assert not [i for i in mixed if i.severity != "info" and "KL" in i.name], [i.text for i in mixed]


N = 300


def _injected(seed: int, count: int = 60) -> tuple[list[np.ndarray], list[tuple[int, int, str]]]:
    """Positive series (a gradient norm's kind, 5% noise) with one event each at a known index: a
    one-point spike (x10-x1000) or a level change (x0.05-x0.3 or x5-x20) that stays."""
    rng = np.random.default_rng(seed)
    out, truth = [], []
    for k in range(count):
        x = noisy(rng, float(rng.uniform(0.05, 50)), N, 0.05)
        at = int(rng.integers(30, 270))
        if k % 2 == 0:
            x[at] *= float(rng.uniform(10, 1000))
            truth.append((k, at + 1, "spike"))
        else:
            x[at:] *= float(rng.choice([rng.uniform(0.05, 0.3), rng.uniform(5, 20)]))
            truth.append((k, at + 1, "shift"))
        out.append(x)
    return out, truth


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_precision_and_recall_on_injected_events(seed: int, capsys: pytest.CaptureFixture[str]) -> None:
    values, truth = _injected(seed)
    found: list[tuple[int, int, str]] = []
    for k, x in enumerate(values):
        found += [(k, c.first_step, c.kind) for c in series_changes(series("grad_norm", M.RL_GRAD_NORM, x), 1)]
    hit = [t for t in truth if any(f[0] == t[0] and abs(f[1] - t[1]) <= 1 and f[2] == t[2] for f in found)]
    true = [f for f in found if any(f[0] == t[0] and abs(f[1] - t[1]) <= 1 for t in truth)]
    recall, precision = len(hit) / len(truth), len(true) / max(len(found), 1)
    with capsys.disabled():
        print(f"\nseed {seed}: recall {recall:.2f} ({len(hit)}/{len(truth)}), precision {precision:.2f} ({len(true)}/{len(found)})")
    assert recall >= 0.9 and precision >= 0.9


# Incidents a run can have, each as (the series it moves, how, the range of its factor): a spike
# multiplies one point, a shift every point from the event on. Sizes go down to where a careful
# reader still calls it an event on the registry's scale (semconv `scale`): a gradient norm (level
# 0.3) past 10x the default clip of 1.0, a KL (level 0.01) settling past 1 nat; the outcome and policy
# events down to a reward falling by a fifth and lengths and entropy falling tenfold.
_EVENTS = (
    ("KL and gradient-norm spike", {"kl": ("spike", 6.0, 100.0), "grad_norm": ("spike", 40.0, 300.0)}),
    ("gradient-norm spike", {"grad_norm": ("spike", 40.0, 300.0)}),
    ("policy collapse", {"response_length": ("shift", 0.005, 0.1), "entropy": ("shift", 0.001, 0.1)}),
    ("reward falls", {"reward": ("shift", 0.05, 0.33)}),
    ("KL rises", {"kl": ("shift", 120.0, 1000.0)}),
)
# The same moves below the scale, with no outcome change near them: information, never an alarm.
_BELOW_SCALE = (
    ("gradient-norm spike under 10x the clip", {"grad_norm": ("spike", 6.0, 25.0)}),
    ("KL rise that stays under 1", {"kl": ("shift", 3.0, 60.0)}),
)
# Each series' level and noise; the reward climbs slowly (a run that learns), which is no incident.
_RUN_SERIES = {
    "reward": (M.RL_REWARD, 0.5, 0.05),
    "kl": (M.RL_POLICY_KL, 0.01, 0.15),
    "grad_norm": (M.RL_GRAD_NORM, 0.3, 0.15),
    "entropy": (M.RL_POLICY_ENTROPY, 0.6, 0.05),
    "response_length": (M.RL_RESPONSE_LENGTH, 400.0, 0.05),
}


def _injected_run(
    rng: np.random.Generator, n: int = 300, events: tuple[tuple[str, dict[str, tuple[str, float, float]]], ...] = _EVENTS
) -> tuple[list[Series], list[tuple[int, set[str]]]]:
    """One run of five series with three injected incidents at known steps (at least 60 apart)."""
    values = {name: noisy(rng, level, n, rel) for name, (_, level, rel) in _RUN_SERIES.items()}
    values["reward"] *= np.linspace(1.0, 1.6, n)
    starts = sorted(rng.choice(np.arange(30, n - 30, 60), size=3, replace=False))
    if events is _EVENTS:
        picks = rng.choice([0, 1, 3, 4], size=3, replace=False).tolist()
        if rng.random() < 0.3:  # a collapse ends the run's story: at most one, last
            picks[-1] = 2
    else:  # two spikes and one KL rise: two rises would compound past the scale
        picks = rng.permutation([0, 0, 1]).tolist()
    truth = []
    for at, pick in zip(starts, picks, strict=True):
        at = int(at + rng.integers(0, 20))
        moved = events[pick][1]
        for k, (name, (how, low, high)) in enumerate(moved.items()):
            factor = float(np.exp(rng.uniform(np.log(low), np.log(high))))
            if how == "spike":
                values[name][at] *= factor
            else:  # the second series of a collapse follows within three steps, as in real logs
                values[name][at + (int(rng.integers(0, 4)) if k else 0) :] *= factor
        truth.append((at + 1, {_RUN_SERIES[name][0] for name in moved}))
    runs = [series(name, metric, values[name], MEAN) for name, (metric, _, _) in _RUN_SERIES.items()]
    return runs, truth


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_precision_and_recall_per_incident_on_injected_runs(seed: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Each injected incident must be one warning or critical incident at its step holding the series
    it moved (not split in two); every warning or critical incident must be an injected one."""
    rng = np.random.default_rng(seed)
    hits = events = true = flagged = 0
    for _ in range(20):
        runs, truth = _injected_run(rng)
        serious = [i for i in incidents_of(*runs) if i.severity != "info"]
        flagged += len(serious)
        for step, metrics in truth:
            events += 1
            at = [i for i in serious if i.reaches(step, step) and i.metrics & metrics]
            hits += len(at) == 1 and metrics <= at[0].metrics
        true += sum(1 for i in serious if any(i.reaches(step, step) and i.metrics & m for step, m in truth))
    recall, precision = hits / events, true / max(flagged, 1)
    with capsys.disabled():
        print(f"\nseed {seed}: per incident: recall {recall:.2f} ({hits}/{events}), precision {precision:.2f} ({true}/{flagged})")
    assert recall >= 0.95 and precision >= 0.95


@pytest.mark.parametrize("seed", [31, 32])
def test_moves_below_the_registry_scale_are_information_and_still_told(seed: int) -> None:
    """A gradient-norm spike under 10x the clip and a KL that stays under 1, with no reward or policy
    change near them: no warning or critical incident, yet each is still an incident (information)
    at its step, so the report loses nothing by not alarming."""
    rng = np.random.default_rng(seed)
    told = events = 0
    for _ in range(10):
        runs, truth = _injected_run(rng, events=_BELOW_SCALE)
        found = incidents_of(*runs)
        assert not [i.text for i in found if i.severity != "info"]
        for step, metrics in truth:
            events += 1
            told += any(i.reaches(step, step) and i.metrics & metrics for i in found)
    assert told >= 0.9 * events, f"{told} of {events} below-scale moves told"


def _validation_log(tmp_path, values: dict[int, float], steps: int = 250):
    rng = np.random.default_rng(5)
    lines = []
    for step in range(1, steps + 1):
        parts = [f"critic/score/mean:{0.5 + 0.02 * rng.standard_normal():.4f}", f"actor/entropy:{0.3 + 0.01 * rng.standard_normal():.4f}"]
        if step in values:
            parts.append(f"val-core/math/acc/mean@1:{values[step]:.4f}")
        lines.append(f"step:{step} - " + " - ".join(parts))
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_validation_score_that_falls_back_to_its_start_is_in_the_headline(tmp_path) -> None:
    # Seen on an AReaL run: eval 0.357 -> 0.632 (s100) ... 0.619 (s200) -> 0.378 at its last evaluation;
    # first against last alone says "no clear change"
    from otel_rl.analyze import analyze

    fell = {1: 0.357, 50: 0.55, 100: 0.632, 150: 0.618, 200: 0.619, 250: 0.378}
    (run,) = analyze([_validation_log(tmp_path, fell)], plots=False)
    top = [i for i in run.headline if i.severity != "info"]
    assert top and top[0].name == "validation score falls from its best", [i.text for i in run.incidents]
    assert (top[0].first_step, top[0].last_step) == (200, 250)
    assert "0.6319" not in top[0].text and "0.632 (step 100)" in top[0].text and "0.378 at the last evaluation (step 250)" in top[0].text
    # A late dip that keeps much of the gain is noise of a small evaluation, not the gain lost.
    dip = {1: 0.3047, 50: 0.3438, 100: 0.4258, 150: 0.3906, 200: 0.3359, 250: 0.36}
    (calm,) = analyze([_validation_log(tmp_path, dip)], plots=False)
    assert not [i for i in calm.incidents if "validation" in i.name], [i.text for i in calm.incidents]


def test_a_kl_spike_hundreds_of_times_its_level_past_the_notable_level_is_a_warning() -> None:
    # Seen in a notebook run: kl ~0.015, one step at 4.84, the next highest 0.19; below the danger level 10
    rng = np.random.default_rng(6)
    kl = np.abs(noisy(rng, 0.015, 136, rel=0.3))
    kl[83] = 4.843
    found = incidents_of(series("kl", M.RL_POLICY_KL, kl, {A.RL_POLICY: "reference"}))
    spikes = [i for i in found if i.severity != "info"]
    assert spikes and spikes[0].severity == "warning" and "4.843 at 84" in spikes[0].text, [i.text for i in found]
    # A blip to ~1 from a level of 0.05 (20x) that comes back stays information, as healthy runs do.
    kl[83] = 1.0
    kl *= 0.05 / 0.015
    kl[83] = 1.0
    assert not [i.text for i in incidents_of(series("kl", M.RL_POLICY_KL, kl, {A.RL_POLICY: "reference"})) if i.severity != "info"]


def test_a_training_inference_mismatch_that_moves_with_a_reward_collapse_is_named_in_it() -> None:
    rng = np.random.default_rng(11)
    n, at = 120, 60
    reward = np.concatenate([noisy(rng, 0.6, at, 0.05), noisy(rng, 0.05, n - at, 0.05)])
    mismatch = np.concatenate([noisy(rng, 0.001, at - 2, 0.1), noisy(rng, 0.05, n - at + 2, 0.1)])  # grows two steps before
    found = incidents_of(
        series("critic/score/mean", M.RL_REWARD, reward, MEAN),
        series("rollout_corr/k3_kl", M.RL_TRAIN_INFER_KL, mismatch, {A.RL_MODEL_ROLE: "actor", A.RL_KL_ESTIMATOR: "k3"}),
    )
    top = found[0]
    assert top.severity == "critical" and top.name.startswith("reward collapse"), top.text
    assert M.RL_TRAIN_INFER_KL in top.metrics, top.text
    assert "training-inference mismatch" in top.text, top.text


def test_a_small_mismatch_rise_on_a_healthy_run_is_no_alarm() -> None:
    rng = np.random.default_rng(12)
    n, at = 120, 60
    mismatch = np.concatenate([noisy(rng, 0.0005, at, 0.1), noisy(rng, 0.003, n - at, 0.1)])  # 6x, but under 0.01
    found = incidents_of(
        series("reward", M.RL_REWARD, noisy(rng, 0.5, n, 0.05), MEAN),
        series("rollout_corr/kl", M.RL_TRAIN_INFER_KL, mismatch, {A.RL_MODEL_ROLE: "actor", A.RL_KL_ESTIMATOR: "k1"}),
    )
    assert found and all(i.severity == "info" for i in found), [i.text for i in found]
