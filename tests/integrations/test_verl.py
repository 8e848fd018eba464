"""verl adapter: ``trainer.logger=['console','otel']`` through verl's own ``Tracking``.

Runs against the installed verl (``pip install verl --no-deps`` plus tensordict, omegaconf,
orjson, codetiming, ray) when it imports; otherwise against a stand-in of its Tracking class.
The step's key set is copied from verl 0.9.1's trainer and checked against verl's own metric
functions when verl is importable.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from expected_metrics import expected_series

import otel_rl
from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl.runs.folder import read_log_records, read_metrics
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

REPO = Path(__file__).resolve().parents[2]
GIB = float(2**30)

try:
    import verl.utils.tracking as _real_tracking  # noqa: F401

    REAL_VERL = True
except Exception:  # verl absent, or present without its import-time dependencies
    REAL_VERL = False
needs_verl = pytest.mark.skipif(not REAL_VERL, reason="verl is not importable here")

# stand-in: mirrors verl/utils/tracking.py Tracking from verl 0.9.1 (supported_backend, the
# assert on unknown names, the console branch, log(data, step, backend), finish(exit_code) once,
# __del__ -> finish); the tracker libraries' branches are left out.
STAND_IN_TRACKING = """
class Tracking:
    supported_backend = ["wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "console", "clearml",
                         "trackio", "file", "rl_insight"]

    def __init__(self, project_name, experiment_name, default_backend="console", config=None):
        if isinstance(default_backend, str):
            default_backend = [default_backend]
        for backend in default_backend:
            if backend == "tracking":
                import warnings
                warnings.warn("`tracking` logger is deprecated. use `wandb` instead.", DeprecationWarning, stacklevel=2)
            else:
                assert backend in self.supported_backend, f"{backend} is not supported"
        self.logger = {}
        self._finished = False
        if "console" in default_backend:
            from verl.utils.logger import LocalLogger
            self.console_logger = LocalLogger(print_to_console=True)
            self.logger["console"] = self.console_logger

    def log(self, data, step, backend=None):
        for default_backend, logger_instance in self.logger.items():
            if backend is None or default_backend in backend:
                logger_instance.log(data=data, step=step)

    def finish(self, exit_code: int = 0):
        if getattr(self, "_finished", False):
            return
        self._finished = True

    def __del__(self):
        self.finish()
"""
STAND_IN_LOGGER = """
class LocalLogger:
    def __init__(self, print_to_console=True):
        self.print_to_console = print_to_console

    def log(self, data, step):
        if self.print_to_console:
            print(f"step:{step} - " + " - ".join(f"{k}:{v}" for k, v in data.items()), flush=True)
"""


@pytest.fixture(scope="module")
def tracking_module(tmp_path_factory: pytest.TempPathFactory):
    """verl.utils.tracking (the real one when importable), with the otel backend installed."""
    if not REAL_VERL:
        root = tmp_path_factory.mktemp("verl_stand_in")
        (root / "verl" / "utils" / "logger").mkdir(parents=True)
        (root / "verl" / "__init__.py").write_text("")
        (root / "verl" / "utils" / "__init__.py").write_text("")
        (root / "verl" / "utils" / "tracking.py").write_text(STAND_IN_TRACKING)
        (root / "verl" / "utils" / "logger" / "__init__.py").write_text(STAND_IN_LOGGER)
        sys.path.insert(0, str(root))
    from otel_rl.integrations import verl as otel_verl

    assert otel_verl.install() is True
    assert otel_verl.install() is True  # idempotent
    module = importlib.import_module("verl.utils.tracking")
    yield module
    if not REAL_VERL:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
            del sys.modules[name]


# --------------------------------------------------------------------------------------------------
# One RayPPOTrainer.fit step of verl 0.9.1 (verl/trainer/ppo/ray_trainer.py), PPO with a critic,
# KL loss, validation at this step, data source "openai/gsm8k" with 4 responses per prompt.

# marked_timer names in fit(), in order, and the AgentLoopManager timing merged into timing_raw
# (verl/experimental/agent_loop/agent_loop.py _performance_metrics).
TIMERS = (
    "start_profile",
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "save_checkpoint",
    "update_weights",
    "testing",
    "stop_profile",
    "step",
)
AGENT_LOOP_TIMING = tuple(
    [f"agent_loop/{m}/{s}" for m in ("num_preempted", "generate_sequences", "tool_calls", "compute_score") for s in ("min", "max", "mean")]
    + [
        f"agent_loop/slowest/{m}"
        for m in ("generate_sequences", "tool_calls", "compute_score", "num_preempted", "prompt_length", "response_length")
    ]
)
PER_TOKEN = ("gen", "ref", "values", "adv", "update_critic", "update_actor")  # compute_timing_metrics
DATA_KEYS = tuple(  # compute_data_metrics(batch, use_critic=True)
    [f"critic/{q}/{s}" for q in ("score", "rewards", "advantages", "returns", "values") for s in ("mean", "max", "min")]
    + ["critic/vf_explained_var"]
    + [f"response_length/{s}" for s in ("mean", "max", "min", "clip_ratio")]
    + [f"response_length_non_aborted/{s}" for s in ("mean", "max", "min", "clip_ratio")]
    + ["response/aborted_ratio"]
    + [f"prompt_length/{s}" for s in ("mean", "max", "min", "clip_ratio")]
)
THROUGHPUT_KEYS = ("perf/total_num_tokens", "perf/time_per_step", "perf/throughput")  # compute_throughout_metrics
SEQLEN_KEYS = tuple(f"global_seqlen/{s}" for s in ("min", "max", "minmax_diff", "balanced_min", "balanced_max", "mean"))
OLD_LOG_PROB_KEYS = ("actor/entropy", "perf/mfu/actor_infer")
# Engine worker metrics (verl/workers/engine_workers.py _postprocess_output, workers/utils/losses.py
# ppo_loss / value_loss) after the trainer's rename_dict(..., "actor/" | "critic/") and mfu rename.
ACTOR_KEYS = (
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/pg_clipfrac_lower",
    "actor/pg_loss",
    "actor/entropy_loss",
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/loss",
    "actor/grad_norm",
    "actor/lr",
    "actor/perf/max_memory_allocated_gb",
    "actor/perf/max_memory_reserved_gb",
    "actor/perf/cpu_memory_used_gb",
    "perf/mfu/actor",
)
CRITIC_KEYS = (
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/loss",
    "critic/grad_norm",
    "critic/lr",
    "critic/perf/max_memory_allocated_gb",
    "critic/perf/max_memory_reserved_gb",
    "critic/perf/cpu_memory_used_gb",
    "perf/mfu/critic",
)
PROGRESS_KEYS = ("training/global_step", "training/epoch")
# RayPPOTrainer._val_metrics_update over process_validation_metrics: 4 responses per prompt, "acc"
# is the core variable; N = 2, 4 for the bootstrap statistics.
VAL_KEYS = tuple(
    [f"val-core/openai/gsm8k/acc/{m}" for m in ("mean@4", "best@4/mean", "best@4/std", "maj@4/mean", "maj@4/std")]
    + [
        f"val-aux/openai/gsm8k/acc/{m}"
        for m in (
            "std@4",
            "worst@4/mean",
            "worst@4/std",
            "best@2/mean",
            "best@2/std",
            "worst@2/mean",
            "worst@2/std",
            "maj@2/mean",
            "maj@2/std",
        )
    ]
    + [
        f"val-aux/openai/gsm8k/reward/{m}"
        for m in (
            "mean@4",
            "std@4",
            "best@4/mean",
            "best@4/std",
            "worst@4/mean",
            "worst@4/std",
            "maj@4/mean",
            "maj@4/std",
            "best@2/mean",
            "best@2/std",
            "worst@2/mean",
            "worst@2/std",
            "maj@2/mean",
            "maj@2/std",
        )
    ]
)
STEP_KEYS = (
    tuple(f"timing_s/{t}" for t in TIMERS + AGENT_LOOP_TIMING)
    + tuple(f"timing_per_token_ms/{t}" for t in PER_TOKEN)
    + DATA_KEYS
    + THROUGHPUT_KEYS
    + SEQLEN_KEYS
    + OLD_LOG_PROB_KEYS
    + ACTOR_KEYS
    + CRITIC_KEYS
    + PROGRESS_KEYS
    + VAL_KEYS
)
# tests/test_keys.py keeps verl's MFU of the old-log-prob forward (not a model role) on the fallback.
KNOWN_FALLBACK = {"perf/mfu/actor_infer"}


def step_metrics(step: int) -> dict[str, float]:
    """A step's metrics as verl logs them: every key of STEP_KEYS with a value distinct per key and step."""
    return {key: round(step + (index + 1) / 1000.0, 6) for index, key in enumerate(STEP_KEYS)}


@pytest.fixture(scope="module")
def resolver() -> KeyResolver:
    return KeyResolver.default()


def test_step_keys_resolve_to_registry_metrics(resolver):
    problems = []
    for key in STEP_KEYS:
        res = resolver.resolve(key, "verl")
        if key in KNOWN_FALLBACK:
            assert res.fallback, f"{key} is mapped now: drop it from KNOWN_FALLBACK"
            continue
        if res.fallback or res.framework != "verl" or res.metric not in METRICS:
            problems.append(f"{key} -> {res.metric} {dict(res.attributes)} via {res.framework}")
    assert not problems, "\n".join(problems)


def test_every_key_of_a_step_is_its_own_series(resolver):
    series = defaultdict(set)
    for key in STEP_KEYS:
        res = resolver.resolve(key, "verl")
        series[(res.metric, res.attributes)].add(key)
    shared = [sorted(keys) for keys in series.values() if len(keys) > 1]
    assert shared == [["perf/time_per_step", "timing_s/step"]]  # both are timing_raw["step"]


@pytest.mark.parametrize(
    ("key", "metric", "attributes"),
    [
        (
            "val-core/openai/gsm8k/acc/mean@4",
            M.RL_VALIDATION_SCORE,
            {
                A.RL_DATA_SOURCE_NAMESPACE: "openai",
                A.RL_DATA_SOURCE: "gsm8k",
                A.RL_VALIDATION_VARIABLE: "acc",
                A.RL_STATISTIC: "mean",
                A.RL_VALIDATION_N: "4",
            },
        ),
        (
            "val-aux/openai/gsm8k/reward/worst@2/std",
            M.RL_VALIDATION_SCORE,
            {
                A.RL_DATA_SOURCE_NAMESPACE: "openai",
                A.RL_DATA_SOURCE: "gsm8k",
                A.RL_VALIDATION_VARIABLE: "reward",
                A.RL_STATISTIC: "worst_std",
                A.RL_VALIDATION_N: "2",
            },
        ),
        (
            "val-core/gsm8k/reward/best@8/mean",
            M.RL_VALIDATION_SCORE,
            {A.RL_DATA_SOURCE: "gsm8k", A.RL_VALIDATION_VARIABLE: "reward", A.RL_STATISTIC: "best", A.RL_VALIDATION_N: "8"},
        ),
        (
            "timing_s/agent_loop/slowest/compute_score",
            M.RL_ROLLOUT_SAMPLE_DURATION,
            {A.RL_STAGE: "compute_rewards", A.RL_STATISTIC: "slowest"},
        ),
        ("timing_s/agent_loop/generate_sequences/max", M.RL_ROLLOUT_SAMPLE_DURATION, {A.RL_STAGE: "generate", A.RL_STATISTIC: "max"}),
        (
            "actor/perf/max_memory_allocated_gb",
            M.RL_GPU_MEMORY_USAGE,
            {A.RL_MEMORY_KIND: "max_allocated", A.RL_CLUSTER: "actor_train", A.RL_STAGE: "train_step"},
        ),
        ("critic/perf/cpu_memory_used_gb", M.PROCESS_MEMORY_USAGE, {A.RL_CLUSTER: "critic", A.RL_STAGE: "train_step"}),
        ("timing_s/update_actor", M.RL_STAGE_DURATION, {A.RL_STAGE: "train_step", A.RL_CLUSTER: "actor_train", A.RL_STAGE_PHASE: "total"}),
        ("actor/kl_coef", M.RL_KL_COEFFICIENT, {A.RL_KL_PLACEMENT: "loss"}),
    ],
)
def test_key_shapes(resolver, key, metric, attributes):
    res = resolver.resolve(key, "verl")
    assert (res.metric, dict(res.attributes)) == (metric, attributes)


@needs_verl
def test_copied_key_set_is_what_verl_computes():
    """The copied key set against verl's own metric functions on a small batch."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo.metric_utils import (
        compute_data_metrics,
        compute_throughout_metrics,
        compute_timing_metrics,
        process_validation_metrics,
    )
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict
    from verl.utils.seqlen_balancing import log_seqlen_unbalance

    bs, prompt_len, response_len = 8, 6, 10
    attention_mask = torch.ones(bs, prompt_len + response_len, dtype=torch.long)
    attention_mask[:, :2] = 0  # left padding of the prompts
    attention_mask[1, prompt_len + 3 :] = 0  # a short response
    attention_mask[2, prompt_len:] = 0  # an aborted (empty) response
    response_mask = attention_mask[:, prompt_len:].clone()
    batch = DataProto.from_single_dict(
        {
            "prompts": torch.zeros(bs, prompt_len, dtype=torch.long),
            "responses": torch.zeros(bs, response_len, dtype=torch.long),
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "token_level_scores": torch.rand(bs, response_len),
            "token_level_rewards": torch.rand(bs, response_len),
            "advantages": torch.randn(bs, response_len),
            "returns": torch.randn(bs, response_len),
            "values": torch.randn(bs, response_len),
        }
    )
    batch.meta_info["global_token_num"] = attention_mask.sum(-1).tolist()
    timing_raw = {name: 1.0 for name in TIMERS} | {name: 0.5 for name in AGENT_LOOP_TIMING}
    metrics = dict(compute_data_metrics(batch=batch, use_critic=True))
    metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
    metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=8))
    metrics.update(log_seqlen_unbalance(seqlen_list=[10, 20, 30, 40], partitions=[[0, 3], [1, 2]], prefix="global_seqlen"))
    metrics.update({"actor/entropy": 0.5, "perf/mfu/actor_infer": 0.1})  # the old_log_prob block of fit()

    def trained(worker_metrics: dict, role: str) -> dict:  # RayPPOTrainer._update_actor / _update_critic
        out = rename_dict(worker_metrics, f"{role}/")
        out[f"perf/mfu/{role}"] = out.pop(f"{role}/mfu")
        return reduce_metrics(out)

    engine_common = {
        "loss": 0.1,
        "grad_norm": 1.0,
        "lr": 1e-6,
        "perf/max_memory_allocated_gb": 1.0,
        "perf/max_memory_reserved_gb": 2.0,
        "perf/cpu_memory_used_gb": 3.0,
        "mfu": 0.3,
    }
    metrics.update(
        trained(
            {
                "actor/pg_clipfrac": [0.1],
                "actor/ppo_kl": [0.0],
                "actor/pg_clipfrac_lower": [0.0],
                "actor/pg_loss": [0.1],
                "actor/entropy_loss": [0.2],
                "kl_loss": [0.01],
                "kl_coef": 0.001,
                **engine_common,
            },
            "actor",
        )
    )
    metrics.update(trained({"critic/vf_loss": [0.1], "critic/vf_clipfrac": [0.0], "critic/vpred_mean": [0.2], **engine_common}, "critic"))
    metrics.update({"training/global_step": 1, "training/epoch": 0})

    # _val_metrics_update (ray_trainer.py), copied: verl.trainer.ppo.ray_trainer needs torchdata and hydra.
    uids = [f"u{i // 4}" for i in range(8)]
    infos = {"reward": list(np.linspace(0, 1, 8)), "acc": [1.0, 0.0] * 4, "pred": ["a", "b"] * 4}
    per_source = process_validation_metrics(["openai/gsm8k"] * 8, uids, infos)
    for data_source, var2metric2val in per_source.items():
        core_var = "acc" if "acc" in var2metric2val else "reward"
        for var_name, metric2val in var2metric2val.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metric2val)
            for metric_name, metric_val in metric2val.items():
                core = (
                    var_name == core_var and any(metric_name.startswith(p) for p in ("mean", "maj", "best")) and f"@{n_max}" in metric_name
                )
                metrics[f"{'val-core' if core else 'val-aux'}/{data_source}/{var_name}/{metric_name}"] = metric_val

    assert sorted(metrics) == sorted(STEP_KEYS)


# --------------------------------------------------------------------------------------------------
# End to end: verl's Tracking with default_backend=['console','otel']

PROJECT, EXPERIMENT = "verl-grpo", "qwen2.5-0.5b-gsm8k"
CONFIG = {
    "trainer": {"project_name": PROJECT, "experiment_name": EXPERIMENT, "logger": ["console", "otel"], "total_epochs": 1},
    "actor_rollout_ref": {
        "actor": {"ppo_mini_batch_size": 8, "use_kl_loss": True, "kl_loss_coef": 0.001},
        "rollout": {"n": 4, "name": "vllm"},
    },
    "algorithm": {"adv_estimator": "grpo", "gamma": 1.0},
    "data": {"train_files": "~/data/gsm8k/train.parquet", "val_files": None},
}
STEPS = (1, 2, 3)


@pytest.fixture
def verl_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment the backend's own telemetry reads: a run folder under tmp_path, no OTLP."""
    run_dir = tmp_path / "run"
    for name in (
        "OTEL_SERVICE_NAME",
        "OTEL_RL_EXPERIMENT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_RL_RUN_ID",
        "OTEL_RL_FRAMEWORK",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_RL_RUN_DIR", str(run_dir))
    monkeypatch.setenv("OTEL_RL_EXPORTERS", "file")
    monkeypatch.setenv("OTEL_RL_CONSOLE", "false")
    monkeypatch.setattr(otel_rl, "_current", None)  # no telemetry of an earlier test to reuse
    return run_dir


def _last_points(run_dir: Path) -> dict:
    points = read_metrics(run_dir)
    assert not points.problems
    last = {}
    for p in points:
        last[(p.name, tuple(sorted(p.attributes.items())))] = p
    return last


def test_trainer_logger_otel_through_verls_tracking(tracking_module, verl_env, resolver, capsys):
    from otel_rl.integrations.verl import OtelBackend

    tracking = tracking_module.Tracking(
        project_name=PROJECT, experiment_name=EXPERIMENT, default_backend=["console", "otel"], config=CONFIG
    )
    assert set(tracking.logger) == {"console", "otel"}
    backend = tracking.logger["otel"]
    assert isinstance(backend, OtelBackend)
    logged = {step: step_metrics(step) for step in STEPS}
    for step in STEPS:
        tracking.log(data=logged[step], step=step)
    tracking.finish(exit_code=0)
    tracking.finish()  # verl calls it again from __del__
    assert f"step:{STEPS[-1]}" in capsys.readouterr().out  # verl's console backend still ran

    # The rl.log events carry each step's exact map; rl.hparams the flattened config.
    records = read_log_records(verl_env)
    assert not records.problems
    events = [r for r in records if r["event_name"] == N.RL_LOG_EVENT]
    assert [e["attributes"][A.RL_STEP] for e in events] == list(STEPS)
    for event in events:
        assert event["body"] == pytest.approx(logged[event["attributes"][A.RL_STEP]])
    (hparams,) = [r for r in records if r["event_name"] == N.RL_HPARAMS_EVENT]
    assert hparams["body"]["actor_rollout_ref/rollout/n"] == 4
    assert hparams["body"]["trainer/logger"] == ["console", "otel"]
    resource = events[0]["resource"]
    assert (resource[A.RL_FRAMEWORK], resource[A.RL_EXPERIMENT_NAME], resource[A.SERVICE_NAME]) == ("verl", EXPERIMENT, PROJECT)

    # Metrics: every key under its registry name and attributes, with the value logged (converted).
    last = _last_points(verl_env)
    expected_gauges, expected_hist = expected_series((logged[step] for step in STEPS), resolver, "verl")
    for series, value in expected_gauges.items():
        assert series in last, f"{series} was not exported"
        assert math.isclose(last[series].value, value, rel_tol=1e-9), series
    for series, values in expected_hist.items():
        point = last[series]
        assert point.count == len(values) and math.isclose(point.sum, sum(values), rel_tol=1e-9), series
    unmapped = {dict(series[1]).get(A.RL_KEY) for series in last if series[0] in (M.RL_UNMAPPED, M.RL_TELEMETRY_REJECTED)}
    assert unmapped == KNOWN_FALLBACK
    # A few spot checks of units: GiB -> bytes, ms per token -> s per token.
    key = "actor/perf/max_memory_reserved_gb"
    assert last[(M.RL_GPU_MEMORY_USAGE, resolver.resolve(key, "verl").attributes)].value == pytest.approx(logged[3][key] * GIB)
    key = "timing_per_token_ms/gen"
    assert last[(M.RL_STAGE_TIME_PER_TOKEN, ((A.RL_STAGE, "generate"),))].value == pytest.approx(logged[3][key] / 1000)


def test_each_logged_step_becomes_a_trace_of_verls_timers(tracking_module, verl_env):
    """timing_s/* of a step (seconds, as verl's marked_timer measures them) -> the step's trace, in fit()'s order."""
    from otel_rl.integrations.verl_timers import STEP_TIMERS
    from otel_rl.runs.folder import read_spans

    timing = {
        "start_profile": 0.05,
        "gen": 6.0,
        "generate_sequences": 5.5,
        "agent_loop/generate_sequences/mean": 2.0,
        "reward": 1.0,
        "old_log_prob": 0.8,
        "ref": 0.7,
        "adv": 0.1,
        "update_actor": 4.0,
        "save_checkpoint": 0.9,
        "update_weights": 0.6,
        "testing": 1.5,
        "stop_profile": 0.05,
        "step": 16.0,
    }
    tracking = tracking_module.Tracking(project_name=PROJECT, experiment_name=EXPERIMENT, default_backend=["otel"])
    for step in STEPS:
        tracking.log(data={**{f"timing_s/{k}": v for k, v in timing.items()}, "actor/pg_loss": 0.1}, step=step)
    tracking.log(data={"actor/pg_loss": 0.1}, step=9)  # no timers: no trace
    tracking.finish()

    spans = read_spans(verl_env)
    assert not spans.problems
    roots = {s.attributes[A.RL_STEP]: s for s in spans if s.name == N.RL_STEP_SPAN}
    assert sorted(roots) == list(STEPS)
    expected = [
        (f"rl.{stage}", cluster, timing[timer])
        for timer in STEP_TIMERS
        if timer in timing
        for stage, cluster in [
            dict(
                gen=("generate", None),
                reward=("compute_rewards", None),
                old_log_prob=("compute_log_probs", None),
                ref=("compute_ref_log_probs", None),
                adv=("advantage", None),
                update_actor=("train_step", "actor_train"),
                save_checkpoint=("do_checkpoint", None),
                update_weights=("model_update", None),
                testing=("validation", None),
            )[timer]
        ]
    ]
    for step, root in roots.items():
        assert root.duration_ns == 16 * 10**9 and root.attributes[A.RL_SPAN_RECONSTRUCTED] is True
        children = sorted((s for s in spans if s.parent_span_id == root.span_id), key=lambda s: s.start_ns)
        assert [(s.name, s.attributes.get(A.RL_CLUSTER), s.duration_ns / 1e9) for s in children] == expected
        assert all(s.trace_id == root.trace_id and s.attributes[A.RL_STEP] == step for s in children)
        assert children[0].start_ns == root.start_ns and children[-1].end_ns <= root.end_ns
        assert all(a.end_ns == b.start_ns for a, b in zip(children, children[1:]))  # back to back: 15.6 s of 16
    # the timers are still metrics, once each (from the log, not from the spans)
    gen = [p for p in read_metrics(verl_env) if p.name == M.RL_STAGE_DURATION and p.attributes.get(A.RL_STAGE) == "generate"]
    assert gen and gen[-1].count == len(STEPS)


def test_reuses_the_process_telemetry_and_leaves_it_running(tracking_module, make_telemetry, tmp_path):
    tel = make_telemetry(framework="verl", run_dir=str(tmp_path / "own"))
    tracking = tracking_module.Tracking(project_name=PROJECT, experiment_name=EXPERIMENT, default_backend="otel")
    assert tracking.logger["otel"].telemetry is tel
    tracking.log({"actor/pg_loss": 0.25, "training/global_step": 7}, step=7)
    tracking.finish()
    tel.log({"actor/pg_loss": 0.5}, step=8)  # still running: the backend only flushed it
    tel.flush()
    assert tel.latest(M.RL_LOSS, {A.RL_MODEL_ROLE: "actor", A.RL_LOSS_TYPE: "policy"}) == 0.5
    assert tel.latest(M.RL_PROGRESS_STEP) == 7


def test_other_backends_untouched_and_unknown_names_still_rejected(tracking_module, verl_env):
    tracking = tracking_module.Tracking(project_name=PROJECT, experiment_name=EXPERIMENT, default_backend=["console"])
    assert set(tracking.logger) == {"console"}
    tracking.finish()
    assert otel_rl.get_telemetry() is None  # no otel backend asked for: nothing started
    with pytest.raises(AssertionError, match="not supported"):
        tracking_module.Tracking(project_name=PROJECT, experiment_name=EXPERIMENT, default_backend=["otle"])


def test_logging_errors_are_reported_once_and_never_raised(tracking_module, verl_env, caplog):
    tracking = tracking_module.Tracking(project_name=PROJECT, experiment_name=EXPERIMENT, default_backend=["otel"])
    backend = tracking.logger["otel"]

    def broken(*args, **kwargs):
        raise RuntimeError("exporter exploded")

    backend.telemetry.log = broken  # an instance attribute: only this telemetry breaks
    tracking.log({"actor/pg_loss": 0.1}, step=1)
    tracking.log({"actor/pg_loss": 0.2}, step=2)
    tracking.finish()
    reports = [r for r in caplog.records if "verl 'otel' backend failed in log" in r.getMessage()]
    assert len(reports) == 1


# --------------------------------------------------------------------------------------------------
# The ways verl loads the module in every process (the TaskRunner actor builds Tracking, not the driver)

PROBE = textwrap.dedent("""
    import json
    from verl.utils.tracking import Tracking
    print(json.dumps({"otel": "otel" in Tracking.supported_backend}))
""")


@needs_verl
@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["entry_point", "env"])
def test_verl_loads_the_backend_on_import(mechanism, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if mechanism == "entry_point":
        # What otel-rl's [project.entry-points."verl.plugins"] installs: verl >= 0.9 loads it on `import verl`.
        dist = tmp_path / "otel_rl_verl_plugin-0.0.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: otel-rl-verl-plugin\nVersion: 0.0.0\n")
        (dist / "entry_points.txt").write_text("[verl.plugins]\notel = otel_rl.integrations.verl\n")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    else:
        env["VERL_USE_EXTERNAL_MODULES"] = "otel_rl.integrations.verl"
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"otel": True}


def _plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value.startswith("otel_rl") for ep in entry_points(group="verl.plugins"))


@needs_verl
@pytest.mark.slow
@pytest.mark.skipif(REAL_VERL and _plugin_installed(), reason="otel-rl's verl.plugins entry point is installed")
def test_without_a_loader_verl_rejects_otel(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES",)}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"otel": False}
