"""TRL adapter: a real GRPOTrainer run on CPU with ``callbacks=[OtelRLCallback()]``.

The policy is a tiny randomly initialised Qwen2 with a character tokenizer (conftest.py), the
dataset a handful of prompts, the reward two rule functions. What the run folder must hold is
read back with otel_rl.runs.folder and compared with what TRL itself recorded
(``trainer.state.log_history``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

import trl.extras.profiling as trl_profiling  # noqa: E402
import trl.trainer.grpo_trainer as trl_grpo  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl._sdk.keys.resolver import KeyResolver  # noqa: E402
from otel_rl.integrations._hf_trainer import hparams_from_args  # noqa: E402
from otel_rl.integrations.trl import OtelRLCallback  # noqa: E402
from otel_rl.runs.folder import read_log_records, read_metrics, read_spans  # noqa: E402
from otel_rl.semconv import METRICS  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

S = A.RlStageValues
TRL, SWIFT = A.RlFrameworkValues.TRL.value, A.RlFrameworkValues.SWIFT.value
SECRET = "hf_do_not_leak_5b1e"
PROMPTS = ["1+1=", "2+2=", "3+3=", "4+4=", "5+5=", "6+6=", "7+7=", "8+8="]
# Stage spans of a step in the order they run, with the worker group each is attributed to.
STAGE_ORDER = [
    (S.GENERATE.value, "actor_infer"),
    (S.COMPUTE_LOG_PROBS.value, "actor_train"),
    (S.COMPUTE_REF_LOG_PROBS.value, "reference"),
    (S.COMPUTE_REWARDS.value, "reward"),
    (S.TRAIN_STEP.value, "actor_train"),
    (S.VALIDATION.value, "actor_infer"),
    (S.DO_CHECKPOINT.value, "actor_train"),
]


def count_a(completions, **kwargs):
    return [float(text.count("a")) for text in completions]


def brevity(completions, **kwargs):
    return [-len(text) / 10 for text in completions]


def grpo_config(output_dir: Path, **overrides) -> trl.GRPOConfig:
    options = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        # beta > 0: a reference model; num_iterations = 2: old-policy log-probs, generation every other step.
        beta=0.1,
        num_iterations=2,
        save_strategy="steps",
        save_steps=2,
        eval_strategy="steps",
        eval_steps=3,
        hub_token=SECRET,
    )
    options.update(overrides)
    return trl.GRPOConfig(**options)


def expected_stages(config: trl.GRPOConfig, step: int) -> list[tuple[str, str]]:
    """The stages TRL runs in ``step`` for this configuration (transformers' and TRL's own rules)."""
    names = set()
    if (step - 1) % (config.steps_per_generation * config.num_iterations) == 0:
        names |= {S.GENERATE.value, S.COMPUTE_REWARDS.value}
        if config.num_iterations > 1:
            names.add(S.COMPUTE_LOG_PROBS.value)
        if config.beta != 0:
            names.add(S.COMPUTE_REF_LOG_PROBS.value)
    names.add(S.TRAIN_STEP.value)
    if step % config.eval_steps == 0:
        names.add(S.VALIDATION.value)
    if step % config.save_steps == 0 or step == config.max_steps:
        names.add(S.DO_CHECKPOINT.value)
    return [(name, cluster) for name, cluster in STAGE_ORDER if name in names]


def latest_points(run_dir: Path) -> dict[tuple[str, frozenset], object]:
    latest: dict[tuple[str, frozenset], object] = {}
    for point in sorted(read_metrics(run_dir), key=lambda p: p.time_ns):
        latest[(point.name, frozenset(point.attributes.items()))] = point
    return latest


@pytest.mark.slow
def test_grpo_run_is_traced_step_by_step_and_every_logged_value_arrives(tmp_path, hf_tiny_lm):
    model_dir, tokenizer = hf_tiny_lm
    run_dir = tmp_path / "otel"
    config = grpo_config(tmp_path / "out")
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS})
    callback = OtelRLCallback(run_dir=str(run_dir), console=False, service_name="trl-test")
    trainer = trl.GRPOTrainer(
        model=model_dir,
        reward_funcs=[count_a, brevity],
        args=config,
        train_dataset=dataset,
        eval_dataset=dataset.select(range(2)),
        processing_class=tokenizer,
        callbacks=[callback],
    )
    original_profiling = trl_profiling.profiling_context
    trainer.train()

    # -- the callback cleaned up after itself --------------------------------------------------
    assert callback.telemetry is None
    started = otel_rl._current  # the latest init(): the callback's
    assert started is not None and started.config.run_dir == str(run_dir)
    assert started.closed and otel_rl.get_telemetry() is None, "the callback started this telemetry, so it shuts it down"
    assert trl_profiling.profiling_context is original_profiling
    assert trl_grpo.profiling_context is original_profiling
    assert "_get_per_token_logps_and_entropies" not in vars(trainer)
    assert callback.trainer is trainer, "found among the callers at on_train_begin"

    # -- one trace per optimizer step, stages as children of the step span --------------------
    spans = read_spans(run_dir)
    assert not spans.problems
    steps = {s.attributes[A.RL_STEP]: s for s in spans if s.name == N.RL_STEP_SPAN}
    assert sorted(steps) == list(range(1, config.max_steps + 1))
    assert len({s.trace_id for s in steps.values()}) == config.max_steps
    for number, step_span in steps.items():
        assert step_span.parent_span_id is None
        trace = [s for s in spans if s.trace_id == step_span.trace_id and s is not step_span]
        assert all(s.parent_span_id == step_span.span_id for s in trace), [(s.name, s.parent_span_id) for s in trace]
        trace.sort(key=lambda s: s.start_ns)
        got = [(s.attributes[A.RL_STAGE], s.attributes.get(A.RL_CLUSTER)) for s in trace]
        assert got == expected_stages(config, number), f"step {number}"
        for stage in trace:
            assert stage.name == f"rl.{stage.attributes[A.RL_STAGE]}"
            assert stage.attributes[A.RL_STEP] == number
            assert step_span.start_ns <= stage.start_ns <= stage.end_ns <= step_span.end_ns
        for earlier, later in zip(trace, trace[1:]):
            assert earlier.end_ns <= later.start_ns, "stages of a step do not overlap"

    # -- every log TRL made arrives as an rl.log event, exactly --------------------------------
    history = trainer.state.log_history
    records = read_log_records(run_dir)
    events = [r for r in records if r["event_name"] == N.RL_LOG_EVENT]
    assert [(e["attributes"][A.RL_STEP], e["body"]) for e in events] == [
        (h["step"], {k: v for k, v in h.items() if k != "step"}) for h in history
    ]
    train_logs = [e for e in events if "grad_norm" in e["body"]]
    assert len(train_logs) == config.max_steps
    for event in train_logs:  # linked to the step's trace
        assert event["trace_id"] == steps[event["attributes"][A.RL_STEP]].trace_id
    assert any(k.startswith("eval_") for e in events for k in e["body"]), "the step-3 evaluation logged"

    # -- every key resolves through the registry: trl.yaml, or the documented eval fallback -----
    resolver = KeyResolver.default()
    logged = [(k, v) for h in history for k, v in h.items() if k != "step"]
    keys = {k for k, _ in logged}
    assert {
        "loss",
        "grad_norm",
        "kl",
        "entropy",
        "reward",
        "rewards/count_a/mean",
        "rewards/brevity/std",
        "completions/mean_length",
        "clip_ratio/region_mean",
        "num_tokens",
        "train_loss",
        "total_flos",
    } <= keys
    for key in keys:
        res = resolver.resolve(key, TRL)
        if key.startswith("eval_") and key not in ("eval_reward", "eval_reward_std"):
            assert res.fallback and res.metric == M.RL_UNMAPPED, key
        else:
            assert not res.fallback and res.framework == TRL and res.metric in METRICS, (key, res)
    assert resolver.resolve("eval_reward", TRL).metric == M.RL_VALIDATION_SCORE

    # -- and each series' exported value is the last value TRL logged for it --------------------
    expected: dict[tuple[str, frozenset], float] = {}
    for key, value in logged:
        res = resolver.resolve(key, TRL)
        if METRICS[res.metric].instrument == "histogram" or value is None:
            continue
        attrs = dict(res.attributes)
        if res.fallback:
            attrs[A.RL_KEY] = key
        expected[(res.metric, frozenset(attrs.items()))] = res.transform(value) if res.transform else float(value)
    points = latest_points(run_dir)
    assert len(expected) > 25
    for series, value in expected.items():
        assert series in points, series
        assert points[series].value == pytest.approx(value, rel=1e-12, abs=1e-12), series

    # -- hyperparameters once, without secrets --------------------------------------------------
    (hparams,) = [r["body"] for r in records if r["event_name"] == N.RL_HPARAMS_EVENT]
    assert hparams["learning_rate"] == config.learning_rate
    assert hparams["num_generations"] == config.num_generations
    assert hparams["beta"] == config.beta
    assert not [k for k in hparams if "token" in k.lower()]
    for path in run_dir.iterdir():
        assert SECRET not in path.read_text(encoding="utf-8"), path.name


def test_hparams_drop_secret_fields(tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), hub_token=SECRET, report_to=[], learning_rate=3e-4, run_name="r1")
    hparams = hparams_from_args(args)
    assert hparams["learning_rate"] == 3e-4 and hparams["run_name"] == "r1"
    assert "hub_token" not in hparams
    assert SECRET not in json.dumps(hparams, default=str)

    class Args:
        def to_dict(self):
            return {"model_init_kwargs": {"api_key": SECRET, "dtype": "bf16"}}

    nested = hparams_from_args(Args())
    assert nested == {"model_init_kwargs": {"dtype": "bf16"}}


def test_callback_errors_never_reach_training(tmp_path, make_telemetry, caplog, monkeypatch):
    tel = make_telemetry(framework=TRL)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    callback = OtelRLCallback()
    callback.on_train_begin(args, state, control)
    assert callback.telemetry is tel, "an earlier otel_rl.init() is reused"

    def broken(*args, **kwargs):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(tel, "step", broken)
    monkeypatch.setattr(tel, "log", broken)
    callback.on_step_begin(args, state, control)
    callback.on_log(args, state, control, logs={"loss": 1.0})
    callback.on_log(args, state, control, logs={"loss": 0.5})
    state.global_step = 1
    callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control)
    failures = [r for r in caplog.records if "Trainer callback failed" in r.getMessage()]
    assert [r.getMessage().split(" in ")[1].split(";")[0] for r in failures] == ["on_step_begin", "on_log"]
    assert not tel._closed, "telemetry the callback did not start stays up"
    assert callback.telemetry is None


def test_callback_event_order_for_a_plain_trainer_and_gradient_accumulation(tmp_path, make_telemetry):
    """Without generation (SFT, DPO, ...) the update is the whole step; epoch-level saves stay in the last step."""
    tel = make_telemetry(framework=TRL)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), report_to=[], save_strategy="epoch", logging_steps=1, gradient_accumulation_steps=2
    )
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    callback = OtelRLCallback()
    callback.on_train_begin(args, state, control)
    for step in (1, 2):
        callback.on_step_begin(args, state, control)
        callback.on_substep_end(args, state, control)
        callback.on_pre_optimizer_step(args, state, control)
        callback.on_optimizer_step(args, state, control)
        state.global_step, state.epoch = step, step / 2
        control.should_log = True
        callback.on_step_end(args, state, control)
        callback.on_log(args, state, control, logs={"loss": 1.0 / step})
        control.should_log = False
    # transformers' DefaultFlowCallback asks for the epoch's checkpoint at on_epoch_end.
    control.should_save = True
    callback.on_epoch_end(args, state, control)
    callback.on_save(args, state, control)
    callback.on_train_end(args, state, control)
    tel.flush()

    spans = read_spans(tel.run_dir)
    by_trace = defaultdict(list)
    for span in sorted(spans, key=lambda s: s.start_ns):
        by_trace[span.trace_id].append(span)
    shapes = sorted((trace[0].attributes[A.RL_STEP], [s.name for s in trace]) for trace in by_trace.values())
    assert shapes == [(1, ["rl.step", "rl.train_step"]), (2, ["rl.step", "rl.train_step", "rl.do_checkpoint"])]
    assert tel.latest(M.RL_LOSS, {A.RL_MODEL_ROLE: A.RlModelRoleValues.ACTOR.value, A.RL_LOSS_TYPE: A.RlLossTypeValues.TOTAL.value}) == 0.5
