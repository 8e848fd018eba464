"""ROLL adapter: ``track_with: otel`` through ROLL's own tracker registry and create_tracker.

ROLL (alibaba/ROLL) is not on PyPI, so the tests put a stand-in ``roll`` package on sys.path
whose ``roll/utils/tracking.py`` copies ROLL's registry, tag stripping and ``create_tracker``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from expected_metrics import expected_series

import otel_rl
from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl.runs.folder import read_log_records, read_metrics, read_spans
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

REPO = Path(__file__).resolve().parents[2]
SEED_KEYS = REPO / "tests" / "semconv" / "test_seed_keys.py"
GIB = float(2**30)
ROLL_COMMIT = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"

# stand-in: mirrors roll/utils/tracking.py from alibaba/ROLL 8eb27cc2dc34c4d1310b169d9b86d339004d811a
# (tracker_registry, _strip_metric_tag, strip_at_tag_in_log, BaseTracker, StdoutTracker and
# create_tracker verbatim; the TensorBoard / W&B / SwanLab / Trackio trackers and the module's
# `import torch` are left out).
ROLL_TRACKING = """
from concurrent import futures
import json
from functools import wraps
from typing import Optional, Dict, Any

from roll.utils.logging import get_logger

logger = get_logger()

tracker_registry: Dict[str, Any] = {}


def _strip_metric_tag(values: Dict[str, Any]) -> Dict[str, Any]:
    def strip_key(k: str) -> str:
        return k.rsplit("@", 1)[0] if isinstance(k, str) and "@" in k else k

    out: Dict[str, Any] = {}
    for k, v in values.items():
        nk = strip_key(k)
        if isinstance(v, dict):
            v = _strip_metric_tag(v)
        out[nk] = v
    return out


def strip_at_tag_in_log(func):
    @wraps(func)
    def wrapper(self, values: dict, step: Optional[int] = None, **kwargs):
        if isinstance(values, dict):
            values = _strip_metric_tag(values)
        return func(self, values, step, **kwargs)
    return wrapper


class BaseTracker:

    def log(self, values: dict, step: Optional[int], **kwargs):
        pass

    def finish(self):
        pass


class StdoutTracker(BaseTracker):

    def __init__(self, config: dict, **kwargs):
        self.config = config

    @strip_at_tag_in_log
    def log(self, values: dict, step: Optional[int], **kwargs):
        logger.info(f"metrics_tag: {json.dumps({'step': step, 'metrics': values})}")

    def finish(self):
        pass


def create_tracker(tracker_name: str, config: dict, **kwargs) -> BaseTracker:
    if not tracker_name:
        return BaseTracker()
    logger.info(f"create tracker {tracker_name}, kwargs: {kwargs}")

    if tracker_name not in tracker_registry:
        raise ValueError(f"Unknown tracker name: {tracker_name}, total registered trackers: {tracker_registry.keys()}")
    tracker_cls = tracker_registry[tracker_name]
    return tracker_cls(config, **kwargs)

tracker_registry["stdout"] = StdoutTracker
"""
ROLL_LOGGING = """
import logging


def get_logger():
    return logging.getLogger("roll")
"""


def write_stand_in(root: Path) -> Path:
    (root / "roll" / "utils").mkdir(parents=True, exist_ok=True)
    (root / "roll" / "__init__.py").write_text("")
    (root / "roll" / "utils" / "__init__.py").write_text("")
    (root / "roll" / "utils" / "logging.py").write_text(ROLL_LOGGING)
    (root / "roll" / "utils" / "tracking.py").write_text(ROLL_TRACKING)
    return root


def _forget_roll() -> None:
    for name in [n for n in sys.modules if n == "roll" or n.startswith("roll.")]:
        del sys.modules[name]


@pytest.fixture
def roll_tracking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """The stand-in roll.utils.tracking, with otel_rl.integrations.roll imported afresh (as a
    ROLL entry script would) so that its import-time registration runs against it."""
    _forget_roll()
    monkeypatch.syspath_prepend(str(write_stand_in(tmp_path / "site")))
    import otel_rl.integrations as integrations

    monkeypatch.delitem(sys.modules, "otel_rl.integrations.roll", raising=False)
    if hasattr(integrations, "roll"):
        monkeypatch.setattr(integrations, "roll", integrations.roll)  # restored afterwards
    importlib.import_module("otel_rl.integrations.roll")
    yield importlib.import_module("roll.utils.tracking")
    _forget_roll()


@pytest.fixture
def run_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (
        "OTEL_SERVICE_NAME",
        "OTEL_RL_EXPERIMENT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_RL_RUN_ID",
        "OTEL_RL_FRAMEWORK",
        "OTEL_RL_RUN_DIR",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "ROLL_OTEL_ENABLED",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(otel_rl, "_current", None)  # no telemetry of an earlier test to reuse
    return tmp_path / "run"


def pipeline_config(run_dir: Path) -> dict:
    """What BasePipeline passes: pipeline_config.to_dict(), track_with and tracker_kwargs from YAML."""
    return {
        "exp_name": "qwen2.5-7B-rlvr",
        "seed": 42,
        "max_steps": 500,
        "save_steps": 100,
        "logging_steps": 1,
        "track_with": "otel",
        "tracker_kwargs": {"run_dir": str(run_dir), "console": False, "service_name": "rlvr"},
        "actor_train": {"name": "actor_train", "training_args": {"learning_rate": 1e-6, "per_device_train_batch_size": 1}},
        "rollout_batch_size": 64,
        "num_return_sequences_in_group": 8,
        "adv_estimator": "grpo",
        "init_kl_coef": 0.0,
        "rewards": {"math_rule": {"worker_cls": "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker"}},
    }


def create_like_base_pipeline(tracking, config: dict):
    # roll/pipeline/base_pipeline.py BasePipeline.__init__
    return tracking.create_tracker(tracker_name=config["track_with"], config=config, **config["tracker_kwargs"])


# --------------------------------------------------------------------------------------------------
# ROLL's real key set

# As ROLL logs them (reducer tags included), from the commit above:
ROLL_SOURCE_KEYS = (
    # roll/pipeline/rlvr/rlvr_pipeline.py RLVRPipeline.run: the driver's timers
    "time/step_total",
    "time/step_stop_server",
    "time/step_model_update",
    "time/val_step",
    "time/step_generate",
    "time/ref_log_probs_values",
    "time/old_log_probs",
    "time/step_train",
    # roll/pipeline/rlvr/actor_worker.py ActorWorker.loss_func, roll/pipeline/base_worker.py train_step
    "actor/ppo_ratio_high_clipfrac@sum",
    "actor/ppo_ratio_low_clipfrac@sum",
    "actor/ppo_ratio_clipfrac@sum",
    "actor/ratio_mean@sum",
    "actor/ratio_max@max",
    "actor/ratio_min@min",
    "actor/clipfrac@sum",
    "actor/pg_loss@sum",
    "actor/weighted_pg_loss@sum",
    "actor/kl_loss@sum",
    "actor/total_loss@sum",
    "actor/approxkl@sum",
    "actor/policykl@sum",
    "actor/valid_samples@sum",
    "actor/total_samples@sum",
    "actor/valid_sample_ratio@sum",
    "actor/sample_weights_mean@mean",
    "actor/sample_weights_min@min",
    "actor/sample_weights_max@max",
    "actor/lr",
    # roll/utils/context_managers.py state_offload_manger (metric_infix f"{cluster_name}/train_step")
    "time/actor_train/train_step/total",
    "time/actor_train/train_step/execute",
    "time/actor_train/train_step/onload",
    "time/actor_train/train_step/offload",
    "memory/actor_train/train_step/start/offload/allocated/0",
    "memory/actor_train/train_step/end/onload/max_allocated/0",
    "memory/actor_train/train_step/end/onload/max_allocated_frac/0",
    "memory/cpu/actor_train/train_step/start/rss",
    "memory/cpu/actor_train/train_step/end/vms",
    # roll/utils/metrics/metrics_manager.py add_system_metrics, add_token_metrics, add_values_metrics
    "system/global_step",
    "system/samples",
    "system/tps/tps",
    "token/prompt_length/mean",
    "token/prompt_length/max",
    "token/prompt_length/min",
    "token/response_length/mean",
    "token/response_length/max",
    "token/response_length/min",
    "token/response_length/diff",
    "critic/entropy/mean",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "critic/rewards/max",
    "critic/rewards/min",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "critic/returns/mean",
    "critic/returns/max",
    "critic/returns/min",
)
# Keys the same sources log that no mapping knows yet: they reach the rl.unmapped fallback.
ROLL_UNMAPPED = (
    "system/batch_size",
    "system/tps_gpu",
    "system/actor_infer/tps",
    "system/actor_infer/tps_gpu",
    "system/time/tps_mean",
    "token/total_length/mean",
    "token/total_response_length/clip",
    "critic/correct/mean",
    "critic/raw_advantages/mean",
    "critic/token_level_rewards_mean/mean",
    "critic/score_distribution/max_value",
    "group/correct_ratio/mean",
    "mask/final_mask_sum_eq_0",
    "actor/backward_steps",
    "actor_train/loss@sum",
    "math_rule/critic/score/mean",  # MetricsManager.get_metrics: domain metrics as "{domain}/{key}"
)


def _seed_roll_keys() -> list[str]:
    """ROLL's documented keys (seeds 000/001), enumerated by tests/semconv/test_seed_keys.py."""
    spec = importlib.util.spec_from_file_location("_seed_keys_for_roll", SEED_KEYS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    if not module.SEEDS.is_dir():
        pytest.skip(f"the seed documents are not here ({module.SEEDS})")
    plain, filled = module.seed_roll_keys()
    return sorted(plain) + [key for key, _ in filled]


@pytest.fixture(scope="module")
def resolver() -> KeyResolver:
    return KeyResolver.default()


def test_strip_is_rolls_own(roll_tracking):
    from otel_rl.integrations.roll import strip_metric_tags

    cases = [
        {"actor/pg_loss@sum": 1.0, "actor/ratio_max@max": 2.0, "plain": 3.0},
        {"a@b@p99": 1.0, "scalars@mean": {"x@sum": 1.0, "y": {"z@max": 2.0}}, 7: "non-string key"},
        {"time/step_total": 1.0, "@": 0.0, "trailing@": 1.0},
    ]
    for values in cases:
        assert strip_metric_tags(values) == roll_tracking._strip_metric_tag(values)


def test_track_with_otel_is_created_by_rolls_create_tracker(roll_tracking, run_env):
    from otel_rl.integrations.roll import OtelTracker

    assert roll_tracking.tracker_registry["otel"] is OtelTracker  # registered by the import alone
    tracker = create_like_base_pipeline(roll_tracking, pipeline_config(run_env))
    assert isinstance(tracker, OtelTracker)
    assert otel_rl.get_telemetry() is None  # nothing starts before the first log()
    with pytest.raises(ValueError, match="Unknown tracker name"):
        roll_tracking.create_tracker(tracker_name="otle", config={})
    with pytest.raises(TypeError, match="unknown tracker_kwargs.*log_dir"):
        roll_tracking.create_tracker(tracker_name="otel", config={}, log_dir="/tmp/tb")
    tracker.finish()


def test_real_roll_keys_resolve_to_registry_metrics(resolver):
    from otel_rl.integrations.roll import strip_metric_tags

    keys = list(strip_metric_tags(dict.fromkeys(ROLL_SOURCE_KEYS, 0.0))) + _seed_roll_keys()
    problems = []
    for key in keys:
        res = resolver.resolve(key, "roll")
        if res.fallback or res.framework != "roll" or res.metric not in METRICS:
            problems.append(f"{key} -> {res.metric} {dict(res.attributes)} via {res.framework}")
    assert not problems, "\n".join(problems)
    for key in strip_metric_tags(dict.fromkeys(ROLL_UNMAPPED, 0.0)):
        assert resolver.resolve(key, "roll").fallback, f"{key} is mapped now: move it to ROLL_SOURCE_KEYS"


@pytest.mark.parametrize(
    ("key", "metric", "attributes"),
    [
        ("time/step_generate", M.RL_STAGE_DURATION, {A.RL_STAGE: "generate", A.RL_STAGE_PHASE: "total"}),
        ("time/step_train", M.RL_STAGE_DURATION, {A.RL_STAGE: "train_step", A.RL_STAGE_PHASE: "total"}),
        ("time/old_log_probs", M.RL_STAGE_DURATION, {A.RL_STAGE: "old_log_probs_values", A.RL_STAGE_PHASE: "total"}),
        ("time/step_total", M.RL_STEP_DURATION, {}),
        ("token/response_length/diff", M.RL_RESPONSE_LENGTH, {A.RL_STATISTIC: "minmax_diff"}),
    ],
)
def test_pipeline_timer_shapes(resolver, key, metric, attributes):
    res = resolver.resolve(key, "roll")
    assert (res.metric, dict(res.attributes)) == (metric, attributes)


def step_values(step: int) -> dict[str, float]:
    return {key: round(step + (index + 1) / 1000.0, 6) for index, key in enumerate(ROLL_SOURCE_KEYS)}


def test_tagged_keys_arrive_stripped_under_registry_names(roll_tracking, run_env, resolver):
    config = pipeline_config(run_env)
    tracker = create_like_base_pipeline(roll_tracking, config)
    logged = {step: step_values(step) for step in (0, 1, 2)}
    for step, values in logged.items():
        tracker.log(values=values, step=step)
    tracker.finish()
    tracker.finish()

    records = read_log_records(run_env)
    events = [r for r in records if r["event_name"] == N.RL_LOG_EVENT]
    assert [e["attributes"][A.RL_STEP] for e in events] == [0, 1, 2]
    for event in events:
        sent = logged[event["attributes"][A.RL_STEP]]
        assert not [k for k in event["body"] if "@" in k]
        assert event["body"] == pytest.approx(roll_tracking._strip_metric_tag(sent))
    (hparams,) = [r for r in records if r["event_name"] == N.RL_HPARAMS_EVENT]
    assert hparams["body"]["actor_train/training_args/learning_rate"] == 1e-6
    resource = events[0]["resource"]
    assert (resource[A.RL_FRAMEWORK], resource[A.RL_EXPERIMENT_NAME], resource[A.SERVICE_NAME]) == ("roll", "qwen2.5-7B-rlvr", "rlvr")

    points = read_metrics(run_env)
    last = {(p.name, tuple(sorted(p.attributes.items()))): p for p in points}
    gauges, hists = expected_series((roll_tracking._strip_metric_tag(logged[step]) for step in logged), resolver, "roll")
    for series, value in gauges.items():
        assert math.isclose(last[series].value, value, rel_tol=1e-9), series
    for series, values in hists.items():
        assert (last[series].count, last[series].sum) == (len(values), pytest.approx(sum(values))), series
    assert not [s for s in last if s[0] in (M.RL_UNMAPPED, M.RL_TELEMETRY_REJECTED)]
    loss = last[(M.RL_LOSS, ((A.RL_LOSS_TYPE, "policy"), (A.RL_MODEL_ROLE, "actor")))]
    assert loss.value == logged[2]["actor/pg_loss@sum"]
    memory = last[(M.RL_GPU_MEMORY_USAGE, resolver.resolve("memory/actor_train/train_step/end/onload/max_allocated/0", "roll").attributes)]
    assert memory.value == pytest.approx(logged[2]["memory/actor_train/train_step/end/onload/max_allocated/0"] * GIB)


def test_reuses_the_process_telemetry(roll_tracking, run_env, make_telemetry, tmp_path):
    tel = make_telemetry(framework="roll", run_dir=str(tmp_path / "own"))
    tracker = create_like_base_pipeline(roll_tracking, pipeline_config(run_env))
    tracker.log({"actor/kl_loss@sum": 0.02}, step=5)
    assert tracker.telemetry is tel
    tracker.finish()
    tel.log({"actor/kl_loss": 0.03}, step=6)  # still running: the tracker only flushed it
    tel.flush()
    assert tel.latest(M.RL_LOSS, {A.RL_MODEL_ROLE: "actor", A.RL_LOSS_TYPE: "kl"}) == 0.03


def test_errors_are_reported_once_and_never_raised(roll_tracking, run_env, caplog):
    tracker = create_like_base_pipeline(roll_tracking, pipeline_config(run_env))
    tracker.log("not a dict", step=1)  # type: ignore[arg-type]
    tracker.log(["still", "not"], step=2)  # type: ignore[arg-type]
    tracker.log({"actor/pg_loss@sum": 0.1}, step=3)
    tracker.finish()
    reports = [r for r in caplog.records if "ROLL 'otel' tracker failed in log" in r.getMessage()]
    assert len(reports) == 1


def test_without_roll_nothing_registers(monkeypatch):
    _forget_roll()
    from otel_rl.integrations import roll as otel_roll

    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p) / "roll" / "utils" / "tracking.py").exists()])
    assert otel_roll.register() is False


# --------------------------------------------------------------------------------------------------
# ROLL's own tracing on: one global SDK TracerProvider, shared

SHARED_PROVIDER_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    run_dir = sys.argv[1]
    import otel_rl
    import otel_rl.integrations.roll  # the one line in the entry script
    from roll.utils.tracking import create_tracker

    # BaseConfig.__post_init__ with system_envs ROLL_OTEL_ENABLED=1 points the OTLP endpoint at
    # ROLL's private traces-only collector.
    os.environ["ROLL_OTEL_ENABLED"] = "1"
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    config = {"exp_name": "rlvr", "track_with": "otel", "tracker_kwargs": {"run_dir": run_dir, "console": False}}
    tracker = create_tracker(tracker_name=config["track_with"], config=config, **config["tracker_kwargs"])

    # BasePipeline.__init__ then runs roll.utils.telemetry.init_telemetry: a global SDK provider.
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)

    with trace.get_tracer("driver").start_as_current_span("pipeline_step", attributes={"global_step": 1}):
        tracker.log({"actor/pg_loss@sum": 0.5, "time/step_generate": 1.5}, step=1)
    tel = otel_rl.get_telemetry()
    with tel.step(1):
        with tel.stage("generate", cluster="actor_infer"):
            pass
    tracker.finish()
    with trace.get_tracer("driver").start_as_current_span("after_finish"):
        pass
    provider.force_flush()
    print(json.dumps({
        "same_global_provider": trace.get_tracer_provider() is provider,
        "provider_spans": [s.name for s in memory.get_finished_spans()],
        "otlp_enabled": tel.config.otlp_enabled,
    }))
""")


@pytest.mark.slow
def test_otel_rl_spans_go_through_rolls_tracer_provider(tmp_path):
    site = write_stand_in(tmp_path / "site")
    run_dir = tmp_path / "run"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{site}:{REPO}", "OTEL_RL_CONSOLE": "false"}
    done = subprocess.run(
        [sys.executable, "-c", SHARED_PROVIDER_SCRIPT, str(run_dir)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["same_global_provider"]
    # otel-rl's step and stage spans were made by ROLL's provider (its own processor saw them),
    # and finishing the tracker left that provider running ("after_finish" still exported).
    assert {"pipeline_step", "rl.step", "rl.generate", "after_finish"} <= set(result["provider_spans"])
    assert result["otlp_enabled"] is False  # ROLL's private collector is not otel-rl's destination
    # otel-rl's processors on that provider wrote ROLL's span and its own into the run folder.
    names = {s.name for s in read_spans(run_dir)}
    assert {"pipeline_step", "rl.step", "rl.generate"} <= names
    assert "after_finish" not in names  # otel-rl's processors stopped with the tracker
    loss = [p for p in read_metrics(run_dir) if p.name == M.RL_LOSS]
    assert loss and loss[-1].value == 0.5
