"""otel_rl._sdk.keys.resolver: framework key -> registry metric resolution, its inverse, transforms and fallback."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from otel_rl._sdk.keys.resolver import TRANSFORMS, KeyResolver, Resolution, load_mapping_files, load_registry_tables, validate_mappings

REPO = Path(__file__).resolve().parents[1]
SEMCONV = REPO / "semconv"
GIB = 2**30


@pytest.fixture(scope="module")
def resolver() -> KeyResolver:
    return KeyResolver.from_directory(SEMCONV)


@pytest.fixture(scope="module")
def registry():
    return load_registry_tables(SEMCONV / "registry")


# framework, key, raw value, metric, attributes, value after the transform
CASES = [
    # ROLL (seeds 000/001)
    ("roll", "val/score/mean", 0.5, "rl.validation.score", {"rl.statistic": "mean"}, 0.5),
    ("roll", "critic/value", 1.5, "rl.critic.prediction", {"rl.policy": "old"}, 1.5),
    ("roll", "critic/vpred", 1.5, "rl.critic.prediction", {"rl.policy": "current"}, 1.5),
    ("roll", "critic/loss", 0.2, "rl.loss", {"rl.model.role": "critic", "rl.loss.type": "value"}, 0.2),
    ("roll", "critic/reward_clip_frac", 0.1, "rl.clip.fraction", {"rl.clip.kind": "reward"}, 0.1),
    ("roll", "actor/ppo_ratio_high_clipfrac", 0.1, "rl.clip.fraction", {"rl.clip.kind": "ratio_high"}, 0.1),
    ("roll", "actor/ratio_max", 1.3, "rl.policy.ratio", {"rl.statistic": "max"}, 1.3),
    ("roll", "actor/sample_weights_min", 0.3, "rl.sample.weight", {"rl.statistic": "min"}, 0.3),
    ("roll", "actor/approxkl", 0.01, "rl.policy.kl", {"rl.policy": "old", "rl.kl.estimator": "k2"}, 0.01),
    ("roll", "actor/policykl", 0.01, "rl.policy.kl", {"rl.policy": "old", "rl.kl.estimator": "k1"}, 0.01),
    ("roll", "actor/negative_sft_loss", 2.0, "rl.loss", {"rl.model.role": "actor", "rl.loss.type": "sft_negative"}, 2.0),
    ("roll", "critic/ref_log_prob/mean", -1.2, "rl.logprob", {"rl.policy": "reference", "rl.statistic": "mean"}, -1.2),
    ("roll", "system/tps", 1e4, "rl.throughput.tokens", {}, 1e4),
    ("roll", "time/adv", 0.7, "rl.stage.duration", {"rl.stage": "advantage", "rl.stage.phase": "total"}, 0.7),
    ("roll", "time/rollout", 9.0, "rl.stage.duration", {"rl.stage": "rollout", "rl.stage.phase": "total"}, 9.0),
    (
        "roll",
        "time/actor_train/compute_log_probs/onload",
        0.3,
        "rl.stage.duration",
        {"rl.cluster": "actor_train", "rl.stage": "compute_log_probs", "rl.stage.phase": "onload"},
        0.3,
    ),
    (
        "roll",
        "memory/actor_train/train_step/end/onload/max_reserved/1",
        3.0,
        "rl.gpu.memory.usage",
        {
            "rl.cluster": "actor_train",
            "rl.stage": "train_step",
            "rl.memory.when": "end",
            "rl.memory.state": "onload",
            "rl.memory.kind": "max_reserved",
            "hw.id": "1",
        },
        3.0 * GIB,
    ),
    (
        "roll",
        "memory/cpu/critic/compute_values/start/vms",
        2.0,
        "process.memory.virtual",
        {"rl.cluster": "critic", "rl.stage": "compute_values", "rl.memory.when": "start"},
        2.0 * GIB,
    ),
    # keys of the otel-rl stage handle without a cluster
    ("roll", "time/generate/execute", 1.0, "rl.stage.duration", {"rl.stage": "generate", "rl.stage.phase": "execute"}, 1.0),
    ("roll", "time/generate", 1.0, "rl.stage.duration", {"rl.stage": "generate", "rl.stage.phase": "total"}, 1.0),
    ("roll", "memory/cpu/generate/end/rss", 1.0, "process.memory.usage", {"rl.stage": "generate", "rl.memory.when": "end"}, GIB),
    (
        "roll",
        "memory/generate/start/offload/allocated/0",
        0.5,
        "rl.gpu.memory.usage",
        {"rl.stage": "generate", "rl.memory.when": "start", "rl.memory.state": "offload", "rl.memory.kind": "allocated", "hw.id": "0"},
        0.5 * GIB,
    ),
    # ROLL reducer tags: stripped; a statistic only where the metric has one and the rule set none
    ("roll", "actor/pg_loss@sum", 0.1, "rl.loss", {"rl.model.role": "actor", "rl.loss.type": "policy"}, 0.1),
    ("roll", "actor/ratio_min@min", 0.8, "rl.policy.ratio", {"rl.statistic": "min"}, 0.8),
    ("roll", "actor/ratio_mean@sum", 1.0, "rl.policy.ratio", {"rl.statistic": "mean"}, 1.0),
    # verl
    ("verl", "timing_s/gen", 12.0, "rl.stage.duration", {"rl.stage": "generate", "rl.stage.phase": "total"}, 12.0),
    ("verl", "timing_s/ref", 2.0, "rl.stage.duration", {"rl.stage": "compute_ref_log_probs", "rl.stage.phase": "total"}, 2.0),
    ("verl", "timing_s/testing", 2.0, "rl.stage.duration", {"rl.stage": "validation", "rl.stage.phase": "total"}, 2.0),
    (
        "verl",
        "timing_s/update_critic",
        4.0,
        "rl.stage.duration",
        {"rl.stage": "train_step", "rl.cluster": "critic", "rl.stage.phase": "total"},
        4.0,
    ),
    ("verl", "timing_s/step", 30.0, "rl.step.duration", {}, 30.0),
    ("verl", "timing_per_token_ms/gen", 0.5, "rl.stage.time_per_token", {"rl.stage": "generate"}, 0.0005),
    ("verl", "perf/mfu/actor", 0.4, "rl.mfu", {"rl.model.role": "actor"}, 0.4),
    ("verl", "perf/max_memory_reserved_gb", 70.0, "rl.gpu.memory.usage", {"rl.memory.kind": "max_reserved"}, 70.0 * GIB),
    ("verl", "perf/cpu_memory_used_gb", 10.0, "process.memory.usage", {}, 10.0 * GIB),
    ("verl", "actor/pg_clipfrac_lower", 0.01, "rl.clip.fraction", {"rl.clip.kind": "dual"}, 0.01),
    ("verl", "actor/ppo_kl", 0.002, "rl.policy.kl", {"rl.policy": "old", "rl.kl.estimator": "k1"}, 0.002),
    ("verl", "critic/vpred_mean", 0.3, "rl.critic.prediction", {"rl.policy": "current"}, 0.3),
    ("verl", "response_length/clip_ratio", 0.2, "rl.response.clipped_ratio", {}, 0.2),
    ("verl", "response_length/mean", 300.0, "rl.response.length", {"rl.statistic": "mean"}, 300.0),
    ("verl", "global_seqlen/balanced_max", 9000, "rl.rank.tokens", {"rl.statistic": "balanced_max"}, 9000.0),
    ("verl", "training/global_step", 7, "rl.progress.step", {}, 7.0),
    # the training-inference mismatch, as verl 0.9.1 logs it (rollout_corr_helper.py, debug/metrics.py)
    ("verl", "rollout_corr/kl", 0.001, "rl.train_infer.kl", {"rl.model.role": "actor", "rl.kl.estimator": "k1"}, 0.001),
    ("verl", "rollout_corr/k3_kl", 0.002, "rl.train_infer.kl", {"rl.model.role": "actor", "rl.kl.estimator": "k3"}, 0.002),
    ("verl", "rollout_corr/rollout_is_max", 3.5, "rl.train_infer.importance_ratio", {"rl.model.role": "actor", "rl.statistic": "max"}, 3.5),
    (
        "verl",
        "rollout_corr/log_ppl_abs_diff",
        0.01,
        "rl.train_infer.logprob.abs_diff",
        {"rl.model.role": "actor", "rl.statistic": "mean"},
        0.01,
    ),
    (
        "verl",
        "training/rollout_probs_diff_std",
        0.02,
        "rl.train_infer.prob.abs_diff",
        {"rl.model.role": "actor", "rl.statistic": "std"},
        0.02,
    ),
    (
        "areal",
        "ppo_actor/update/compute_logp/kl_div_dual/avg",
        0.003,
        "rl.train_infer.kl",
        {"rl.model.role": "actor", "rl.kl.estimator": "k3"},
        0.003,
    ),
    (
        "areal",
        "ppo_actor/update/behave_imp_weight/avg",
        1.01,
        "rl.train_infer.importance_ratio",
        {"rl.model.role": "actor", "rl.statistic": "mean"},
        1.01,
    ),
    ("nemo_rl", "train/generation_kl_error", 0.001, "rl.train_infer.kl", {"rl.model.role": "actor", "rl.kl.estimator": "k1"}, 0.001),
    # TRL
    ("trl", "loss", 0.01, "rl.loss", {"rl.model.role": "actor", "rl.loss.type": "total"}, 0.01),
    ("trl", "kl", 0.05, "rl.policy.kl", {"rl.policy": "reference", "rl.kl.estimator": "k3"}, 0.05),
    ("trl", "reward_std", 0.3, "rl.reward", {"rl.statistic": "std"}, 0.3),
    ("trl", "rewards/format_reward/mean", 0.9, "rl.reward.component", {"rl.reward.function": "format_reward", "rl.statistic": "mean"}, 0.9),
    ("trl", "completions/max_terminated_length", 400, "rl.response.terminated_length", {"rl.statistic": "max"}, 400.0),
    ("trl", "completions/min_length", 12, "rl.response.length", {"rl.statistic": "min"}, 12.0),
    ("trl", "clip_ratio/high_max", 0.02, "rl.clip.fraction", {"rl.clip.kind": "ratio_high", "rl.statistic": "max"}, 0.02),
    ("trl", "clip_ratio/low_min", 0.0, "rl.clip.fraction", {"rl.clip.kind": "ratio_low", "rl.statistic": "min"}, 0.0),
    ("trl", "num_tokens", 12345, "rl.progress.tokens", {}, 12345.0),
    ("trl", "step", 10, "rl.progress.step", {}, 10.0),
    # ms-swift
    ("swift", "entropy/max", 1.1, "rl.policy.entropy", {"rl.statistic": "max"}, 1.1),
    ("swift", "global_step/max_steps", "1/10000", "rl.progress.step", {}, 1.0),
    ("swift", "percentage", "0.18%", "rl.progress.ratio", {}, 0.0018),
    ("swift", "elapsed_time", "5m 18s", "rl.run.elapsed_time", {}, 318.0),
    ("swift", "remaining_time", "4d 3h 37m 48s", "rl.run.remaining_time", {}, 4 * 86400 + 3 * 3600 + 37 * 60 + 48.0),
    ("swift", "memory(GiB)", 55.33, "rl.gpu.memory.usage", {"rl.memory.kind": "max_reserved"}, 55.33 * GIB),
    ("swift", "train_speed(iter/s)", 0.004878, "rl.throughput.steps", {}, 0.004878),
    ("swift", "train_speed(s/it)", 35.870414, "rl.throughput.steps", {}, 1 / 35.870414),
    ("swift", "step_time", 17.67, "rl.step.duration", {}, 17.67),
    # registry metric names are keys too
    (None, "rl.sample.reward", 1.0, "rl.sample.reward", {}, 1.0),
    (None, "rl.reward@p99", 1.0, "rl.reward", {"rl.statistic": "p99"}, 1.0),
]


@pytest.mark.parametrize(("framework", "key", "raw", "metric", "attributes", "value"), CASES, ids=[c[1] for c in CASES])
def test_resolves_to_metric_attributes_and_value(resolver, framework, key, raw, metric, attributes, value):
    res = resolver.resolve(key, framework)
    assert res.fallback is False
    assert res.metric == metric
    assert res.attributes == tuple(sorted(attributes.items()))
    assert res.key == key
    got = res.transform(raw) if res.transform else float(raw)
    assert math.isclose(got, value, rel_tol=1e-12, abs_tol=1e-15)
    if framework is not None:
        assert res.framework == framework
    else:
        assert res.framework is None  # generic rule


def test_expected_metrics_exist_in_registry(registry):
    metrics = registry[0]
    assert {c[3] for c in CASES} <= set(metrics)


def test_own_framework_first_then_others(resolver):
    # A verl key resolves when the caller names another framework (or none) ...
    assert resolver.resolve("timing_s/gen", "trl").metric == "rl.stage.duration"
    assert resolver.resolve("timing_s/gen", "trl").framework == "verl"
    assert resolver.resolve("timing_s/gen").framework == "verl"
    # ... and the caller's framework wins where two frameworks know a key.
    assert resolver.resolve("loss", "swift").framework == "swift"
    assert resolver.resolve("loss", "trl").framework == "trl"
    assert resolver.resolve("actor/lr", "verl").framework == "verl"
    assert resolver.resolve("actor/lr").framework == "roll"


def test_enum_placeholder_matches_only_members(resolver):
    frac = resolver.resolve("memory/actor_train/generate/end/onload/max_allocated_frac/0", "roll")
    assert frac.metric == "rl.gpu.memory.utilization"
    assert dict(frac.attributes)["rl.memory.kind"] == "max_allocated"
    assert frac.transform is None  # a fraction of total memory, unit 1: no GiB scaling
    reserved = resolver.resolve("memory/actor_train/generate/end/onload/max_reserved_frac/0", "roll")
    assert reserved.metric == "rl.gpu.memory.utilization"
    assert dict(reserved.attributes)["rl.memory.kind"] == "max_reserved"
    usage = resolver.resolve("memory/actor_train/generate/end/onload/max_allocated/0", "roll")
    assert usage.metric == "rl.gpu.memory.usage"
    # Not a phase of the offload manager: falls back instead of inventing a phase.
    assert resolver.resolve("time/actor_train/train_step/reload_nccl", "roll").fallback
    # Not a statistic: the {rl.statistic} placeholder does not take it.
    assert resolver.resolve("val/score/median", "roll").fallback
    # verl rename sources match an enum placeholder; the open-enum catch-all keeps other names.
    assert dict(resolver.resolve("perf/mfu/critic", "verl").attributes) == {"rl.model.role": "critic"}
    assert resolver.resolve("perf/mfu/actor_infer", "verl").fallback


def test_excepted_keys_do_not_match_the_template(resolver):
    # TRL < 0.16 GRPO logged each reward function's mean as rewards/{fn}; DPO's rewards/chosen is
    # not a reward function and stays unmapped.
    old = resolver.resolve("rewards/correctness_reward_func", "trl")
    assert old.metric == "rl.reward.component"
    assert dict(old.attributes) == {"rl.reward.function": "correctness_reward_func", "rl.statistic": "mean"}
    assert resolver.resolve("rewards/chosen", "trl").fallback
    assert resolver.resolve("rewards/accuracies", "trl").fallback
    # the per-statistic shape is still preferred when writing a key back
    assert resolver.to_key("trl", "rl.reward.component", {"rl.reward.function": "fmt", "rl.statistic": "mean"}) == "rewards/fmt/mean"


def test_resolution_is_cached_and_immutable(resolver):
    first = resolver.resolve("actor/kl_loss", "roll")
    assert resolver.resolve("actor/kl_loss", "roll") is first
    assert resolver.resolve("memory(GiB)", "swift") is resolver.resolve("memory(GiB)", "swift")
    assert isinstance(first, Resolution)
    with pytest.raises(AttributeError):
        first.metric = "x"  # type: ignore[misc]
    assert first.attributes == tuple(sorted(first.attributes))


def test_fallback_cap_and_warn_once(caplog):
    r = KeyResolver.from_directory(SEMCONV, unmapped_key_limit=2)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        a = r.resolve("my/custom_metric")
        assert r.resolve("my/custom_metric") is a
        r.resolve("my/custom_metric", "roll")  # another framework: same key, still one series
        b = r.resolve("other/thing", "trl")
        over = r.resolve("third/key")
        over2 = r.resolve("fourth/key")
    assert (a.metric, a.attributes, a.fallback, a.framework) == ("rl.unmapped", (("rl.key", "my/custom_metric"),), True, None)
    assert b.metric == "rl.unmapped" and b.attributes == (("rl.key", "other/thing"),)
    for o, key in ((over, "third/key"), (over2, "fourth/key")):
        assert o.metric == "rl.telemetry.rejected"
        assert o.attributes == (("rl.telemetry.reason", "unmapped_overflow"),)
        assert o.fallback is True and o.key == key
    assert r.unmapped_keys == {"my/custom_metric", "other/thing"}
    messages = [rec.getMessage() for rec in caplog.records if rec.name == "otel_rl"]
    per_key = [m for m in messages if "my/custom_metric" in m]
    assert len(per_key) == 1, messages  # reported once, whatever the framework
    assert "rl.unmapped" in per_key[0] and "semconv/mappings" in per_key[0]
    assert sum("other/thing" in m for m in messages) == 1
    overflow = [m for m in messages if "unmapped_overflow" in m]
    assert len(overflow) == 1  # the cap is reported once, not per key


def test_default_limit_and_bad_keys():
    r = KeyResolver.from_directory(SEMCONV)
    assert r.unmapped_key_limit == 256
    for bad in ("", None, 3, ("a",), ["unhashable"]):
        res = r.resolve(bad)  # type: ignore[arg-type]
        assert res.metric == "rl.telemetry.rejected"
        assert res.attributes == (("rl.telemetry.reason", "bad_key"),)
    assert not r.unmapped_keys


def test_default_builds_a_working_resolver():
    r = KeyResolver.default()
    assert r.resolve("actor/pg_loss", "roll").metric == "rl.loss"
    assert set(r.frameworks) >= {"roll", "verl", "trl", "swift"}


ROUND_TRIPS = [
    ("roll", "time/adv"),
    ("roll", "time/rollout"),
    ("roll", "time/actor_train/generate/offload"),
    ("roll", "memory/actor_infer/generate/start/onload/reserved/3"),
    ("roll", "memory/actor_infer/generate/end/onload/max_reserved_frac/3"),
    ("roll", "memory/cpu/reward/compute_rewards/end/rss"),
    ("roll", "actor/ratio_mean"),
    ("roll", "critic/old_log_prob/mean"),
    ("roll", "val/score/max"),
    ("verl", "timing_s/gen"),
    ("verl", "timing_s/update_actor"),
    ("verl", "timing_s/save_checkpoint"),
    ("verl", "timing_per_token_ms/update_actor"),
    ("verl", "global_seqlen/minmax_diff"),
    ("verl", "perf/max_memory_allocated_gb"),
    ("trl", "rewards/answer_reward/std"),
    ("trl", "completions/mean_terminated_length"),
    ("trl", "clip_ratio/region_mean"),
    ("swift", "train_speed(iter/s)"),
    ("swift", "entropy/min"),
    ("swift", "memory(GiB)"),
]


@pytest.mark.parametrize(("framework", "key"), ROUND_TRIPS, ids=[k for _, k in ROUND_TRIPS])
def test_to_key_round_trip(resolver, framework, key):
    res = resolver.resolve(key, framework)
    assert not res.fallback
    assert resolver.to_key(framework, res.metric, dict(res.attributes)) == key
    assert resolver.to_key(framework, res.metric, res.attributes) == key  # pairs work too


def test_to_key_inverse_renames_and_no_match(resolver):
    assert resolver.to_key("verl", "rl.stage.duration", {"rl.stage": "compute_rewards", "rl.stage.phase": "total"}) == "timing_s/reward"
    assert resolver.to_key("verl", "rl.step.duration", {}) == "timing_s/step"
    assert resolver.to_key("roll", "rl.stage.duration", {"rl.stage": "advantage", "rl.stage.phase": "total"}) == "time/adv"
    assert (
        resolver.to_key("roll", "rl.stage.duration", {"rl.cluster": "critic", "rl.stage": "train_step", "rl.stage.phase": "total"})
        == "time/critic/train_step/total"
    )
    assert resolver.to_key("trl", "rl.response.length", {"rl.statistic": "max"}) == "completions/max_length"
    # a placeholder the caller did not give, an attribute no rule carries, an unknown framework
    assert resolver.to_key("roll", "rl.validation.score", {}) is None
    assert resolver.to_key("roll", "rl.validation.score", {"rl.statistic": "mean", "hw.id": "0"}) is None
    assert resolver.to_key("trl", "rl.response.length", {"rl.statistic": "median"}) is None  # not a member
    assert resolver.to_key("nope", "rl.loss", {}) is None


def test_rules_for(resolver):
    rules = resolver.rules_for("swift")
    assert rules[0] == {"key": "loss", "metric": "rl.loss", "attributes": {"rl.model.role": "actor", "rl.loss.type": "total"}}
    assert {"key": "percentage", "metric": "rl.progress.ratio", "transform": "percent"} in rules
    assert resolver.rules_for("unknown") == []


# --- transforms ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("gib", 1, GIB),
        ("gib", "2.5", 2.5 * GIB),
        ("gb", 0.5, 0.5 * GIB),
        ("ms", 250, 0.25),
        ("percent", "0.18%", 0.0018),
        ("percent", " 50 % ", 0.5),
        ("percent", 0.18, 0.0018),
        ("inverse", 4, 0.25),
        ("duration_text", "36s", 36.0),
        ("duration_text", "5m 18s", 318.0),
        ("duration_text", "2d 0h 18m 21s", 2 * 86400 + 18 * 60 + 21.0),
        ("duration_text", "1:02:03", 3723.0),
        ("duration_text", 12.5, 12.5),
        ("fraction_numerator", "1/10000", 1.0),
        ("fraction_numerator", "2/4389", 2.0),
        ("fraction_denominator", "1/10000", 10000.0),
        ("fraction_numerator", 7, 7.0),
    ],
)
def test_transforms(name, raw, value):
    assert math.isclose(TRANSFORMS[name](raw), value, rel_tol=1e-12)


@pytest.mark.parametrize(
    ("framework", "key", "bad"),
    [
        ("swift", "train_speed(s/it)", 0.0),
        ("swift", "elapsed_time", "soon"),
        ("swift", "percentage", "n/a%"),
        ("swift", "global_step/max_steps", "1/2/3"),
        ("swift", "memory(GiB)", "lots"),
        ("verl", "timing_per_token_ms/gen", object()),
    ],
)
def test_transform_failure_names_key_and_value(resolver, framework, key, bad):
    res = resolver.resolve(key, framework)
    with pytest.raises(ValueError) as info:
        res.transform(bad)
    assert repr(key) in str(info.value)
    assert repr(bad) in str(info.value)


def test_fraction_denominator_needs_a_fraction():
    with pytest.raises(ValueError):
        TRANSFORMS["fraction_denominator"](5)


# --- validation ------------------------------------------------------------------------------------


def test_real_mappings_validate_clean(registry):
    metrics, attributes, enums = registry
    assert validate_mappings(load_mapping_files(SEMCONV / "mappings"), metrics, attributes, enums) == []


def test_validate_reports_file_index_line_and_problem(tmp_path, registry):
    metrics, attributes, enums = registry
    (tmp_path / "bad.yaml").write_text(
        "framework: bad\n"
        "brief: broken on purpose\n"
        "keys:\n"
        "  - key: a\n"
        "    metric: rl.no_such_metric\n"
        "  - key: b/{rl.nope}\n"
        "    metric: rl.loss\n"
        "  - key: c\n"
        "    metric: rl.loss\n"
        "    transform: kib\n"
        "  - key: d/{hw.id}\n"
        "    metric: rl.loss\n"
        "  - key: e\n"
        "    metric: rl.loss\n"
        "    attributes: {rl.loss.type: nonsense, rl.step: 1}\n"
        "  - key: f/{rl.statistic\n"
        "    metric: rl.reward\n"
        "  - key: a\n"
        "    metric: rl.loss\n"
        "  - key: g/{rl.statistic}\n"
        "    metric: rl.reward\n"
        "    except: g/mean\n",
        encoding="utf-8",
    )
    problems = validate_mappings(load_mapping_files(tmp_path), metrics, attributes, enums)
    text = "\n".join(problems)
    assert "bad.yaml:4: keys[0] ('a'): unknown metric 'rl.no_such_metric'" in text
    assert "bad.yaml:6: keys[1]" in text and "'rl.nope' is not in the registry" in text
    assert "bad.yaml:8: keys[2]" in text and "unknown transform 'kib'" in text
    assert "bad.yaml:11: keys[3]" in text and "'hw.id' is not an attribute of metric 'rl.loss'" in text
    assert "'nonsense' is not a member" in text and "'rl.step' must not be set" in text
    assert "keys[5]" in text and "unbalanced braces" in text
    assert "keys[6]" in text and "same key as keys[0]" in text
    assert "keys[7]" in text and "`except` must be a list of keys" in text
    # the resolver refuses rules it cannot compile, naming them
    with pytest.raises(ValueError, match="keys\\[2\\].*unknown transform"):
        KeyResolver(load_mapping_files(tmp_path), metrics, enums)
