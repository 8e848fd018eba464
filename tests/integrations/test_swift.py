"""ms-swift adapter: ``--callbacks otel_rl`` (ms-swift 4.x's ``callbacks_map``) and its log keys.

ms-swift's GRPOTrainer (swift/rlhf_trainers/grpo_trainer.py) is TRL's GRPOTrainer plus ms-swift's
template / model machinery, and ms-swift 4.6 pins trl < 1.0 and downloads its models from a hub,
so it cannot train here. The run below is TRL's GRPOTrainer with ms-swift's real parts around
it: the callback registry (``swift.callbacks.callbacks_map``), the progress callback that adds
ms-swift's keys and writes ``logging.jsonl`` (swift/trainers/patcher.py) and ms-swift's
``profiling_decorator`` (swift/rlhf_trainers/utils.py). ms-swift is installed with
``pip install --no-deps ms-swift`` plus the few modules its callback and utils imports need.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_files import LOGS, needs_shared_logs

transformers = pytest.importorskip("transformers")

from otel_rl._sdk.keys.resolver import KeyResolver  # noqa: E402
from otel_rl.integrations.swift import CALLBACK_NAME, OtelRLSwiftCallback  # noqa: E402
from otel_rl.runs.folder import read_log_records, read_metrics, read_spans  # noqa: E402
from otel_rl.semconv import METRICS  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

S = A.RlStageValues
TRL, SWIFT = A.RlFrameworkValues.TRL.value, A.RlFrameworkValues.SWIFT.value
SWIFT_ROWS = LOGS / "swift_grpo_logging_lines_from_issues.jsonl"
PROGRESS_KEYS = ("global_step/max_steps", "elapsed_time", "remaining_time", "train_speed(s/it)")


def expected_series(resolver: KeyResolver, rows: list[dict]) -> dict[tuple[str, frozenset], float]:
    """(metric, attributes) -> the value its last logged key gives, for gauges and counters."""
    out: dict[tuple[str, frozenset], float] = {}
    for row in rows:
        for key, value in row.items():
            res = resolver.resolve(key, SWIFT)
            if METRICS[res.metric].instrument == "histogram" or value is None:
                continue
            out[(res.metric, frozenset(dict(res.attributes).items()))] = res.transform(value) if res.transform else float(value)
    return out


def latest_points(run_dir: Path) -> dict[tuple[str, frozenset], object]:
    latest: dict[tuple[str, frozenset], object] = {}
    for point in sorted(read_metrics(run_dir), key=lambda p: p.time_ns):
        latest[(point.name, frozenset(point.attributes.items()))] = point
    return latest


@needs_shared_logs
def test_logging_rows_of_real_swift_runs_arrive_through_the_callback(tmp_path, make_telemetry):
    """Rows of ms-swift's logging.jsonl pasted in its issues, sent the way its trainer logs them."""
    rows = [json.loads(line) for line in SWIFT_ROWS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) == 4
    tel = make_telemetry(framework=SWIFT)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    callback = OtelRLSwiftCallback()  # as ms-swift 3.x's extra_callbacks holds it: no args, no trainer
    callback.on_train_begin(args, state, control)
    for number, row in enumerate(rows, start=1):
        state.global_step = number
        callback.on_log(args, state, control, logs=dict(row))
    callback.on_train_end(args, state, control)

    resolver = KeyResolver.default()
    for key in {k for row in rows for k in row}:
        res = resolver.resolve(key, SWIFT)
        assert not res.fallback and res.metric in METRICS, (key, res)
    events = [r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT]
    assert [e["body"] for e in events] == rows
    points = latest_points(tel.run_dir)
    for series, value in expected_series(resolver, rows).items():
        assert points[series].value == pytest.approx(value, rel=1e-12), series
    # "2/4389" is step 2, "10d 9h 50m 13s" seconds, train_speed(iter/s) steps per second.
    assert points[(M.RL_PROGRESS_STEP, frozenset())].value == 2
    assert points[(M.RL_RUN_REMAINING_TIME, frozenset())].value == 10 * 86400 + 9 * 3600 + 50 * 60 + 13
    assert points[(M.RL_THROUGHPUT_STEPS, frozenset())].value == rows[-1]["train_speed(iter/s)"]


# ---------------------------------------------------------------------------------------------
# A GRPO run with ms-swift's callbacks


@pytest.fixture
def swift_parts(monkeypatch):
    """ms-swift's callback registry, progress callbacks and profiling decorator.

    Importing swift.trainers.patcher replaces transformers' default callbacks for the whole
    process (as ms-swift does); they are put back at once and set only for this test.
    """
    pytest.importorskip("trl")
    try:
        from swift.callbacks import callbacks_map
        from swift.rlhf_trainers.utils import profiling_decorator
        from swift.trainers import patcher
    except Exception as exc:  # ms-swift's imports reach into many optional packages
        pytest.skip(f"ms-swift is not importable here: {type(exc).__name__}: {exc}")
    from transformers import trainer as hf_trainer
    from transformers import trainer_callback

    hf_trainer.DEFAULT_PROGRESS_CALLBACK = trainer_callback.ProgressCallback
    hf_trainer.DEFAULT_CALLBACKS = [trainer_callback.DefaultFlowCallback]
    hf_trainer.PrinterCallback = trainer_callback.PrinterCallback
    monkeypatch.setattr(hf_trainer, "DEFAULT_PROGRESS_CALLBACK", patcher.ProgressCallbackNew)
    monkeypatch.setattr(hf_trainer, "DEFAULT_CALLBACKS", [patcher.DefaultFlowCallbackNew])
    monkeypatch.setattr(hf_trainer, "PrinterCallback", patcher.PrinterCallbackNew)
    return callbacks_map, profiling_decorator


def count_a(completions, **kwargs):
    return [float(text.count("a")) for text in completions]


def brevity(completions, **kwargs):
    return [-len(text) / 10 for text in completions]


@pytest.mark.slow
def test_grpo_run_with_callbacks_otel_rl(tmp_path, hf_tiny_lm, make_telemetry, swift_parts):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    import swift.rlhf_trainers.utils as swift_utils

    callbacks_map, swift_profiling_decorator = swift_parts
    assert callbacks_map[CALLBACK_NAME] is OtelRLSwiftCallback, "importing the module registers --callbacks otel_rl"

    class SwiftStyleGRPOTrainer(trl.GRPOTrainer):
        """stand-in: mirrors swift/trainers/mixin.py (ms-swift 4.6.0), SwiftMixin.__init__ / _get_callbacks:
        the callbacks named by --callbacks are built as callbacks_map[name](args, self) and passed
        to Trainer.__init__; and swift/rlhf_trainers/grpo_trainer.py, whose reward computation is
        `_compute_rewards_per_func` under ms-swift's own profiling_decorator."""

        def __init__(self, *, args, swift_callbacks, **kwargs):
            callbacks = [callbacks_map[name](args, self) for name in swift_callbacks]
            super().__init__(args=args, callbacks=callbacks, **kwargs)

        @swift_profiling_decorator
        def _compute_rewards_per_func(self, *args, **kwargs):
            # TRL's reward code without TRL's own profiling: only ms-swift's block marks the stage.
            return trl.GRPOTrainer._calculate_rewards.__wrapped__(self, *args, **kwargs)

        def _calculate_rewards(self, *args, **kwargs):
            return self._compute_rewards_per_func(*args, **kwargs)

    tel = make_telemetry(framework=SWIFT)
    model_dir, tokenizer = hf_tiny_lm
    output_dir = tmp_path / "out"
    config = trl.GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        save_strategy="no",
    )
    config.max_epochs = None  # a field of ms-swift's TrainingArguments (swift/trainers/arguments.py) its flow callback reads
    trainer = SwiftStyleGRPOTrainer(
        model=model_dir,
        reward_funcs=[count_a, brevity],
        args=config,
        swift_callbacks=[CALLBACK_NAME],
        train_dataset=datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3=", "4+4="]}),
        processing_class=tokenizer,
    )
    (callback,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, OtelRLSwiftCallback)]
    assert callback.trainer is trainer and callback.args is config
    original_profiling = swift_utils.profiling_context
    trainer.train()

    assert callback.telemetry is None and not tel._closed, "the earlier otel_rl.init() is reused and left running"
    assert swift_utils.profiling_context is original_profiling
    assert trainer.callback_handler.callbacks[-1] is callback, "runs after ms-swift's progress callback"

    # ms-swift's own record of what it logged, progress keys included.
    rows = [json.loads(line) for line in (output_dir / "logging.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == config.max_steps + 1  # one per step and the end-of-training summary
    for row in rows:
        assert all(key in row for key in PROGRESS_KEYS), row

    # Flushed at on_train_end: the files hold everything without another flush.
    events = [r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT]
    assert [e["body"] for e in events] == rows

    resolver = KeyResolver.default()
    for key in {k for row in rows for k in row}:
        res = resolver.resolve(key, SWIFT)
        assert not res.fallback and res.metric in METRICS, (key, res)
    assert resolver.resolve("train_speed(s/it)", SWIFT).framework == SWIFT
    points = latest_points(tel.run_dir)
    expected = expected_series(resolver, rows)
    assert len(expected) > 20
    for series, value in expected.items():
        assert points[series].value == pytest.approx(value, rel=1e-12), series
    numerator, denominator = rows[-1]["global_step/max_steps"].split("/")
    assert points[(M.RL_PROGRESS_STEP, frozenset())].value == int(numerator) == config.max_steps
    assert points[(M.RL_THROUGHPUT_STEPS, frozenset())].value == pytest.approx(1 / rows[-1]["train_speed(s/it)"])

    spans = read_spans(tel.run_dir)
    steps = {s.attributes[A.RL_STEP]: s for s in spans if s.name == N.RL_STEP_SPAN}
    assert sorted(steps) == [1, 2]
    for step_span in steps.values():
        stages = sorted((s for s in spans if s.trace_id == step_span.trace_id and s is not step_span), key=lambda s: s.start_ns)
        assert all(s.parent_span_id == step_span.span_id for s in stages)
        assert [s.attributes[A.RL_STAGE] for s in stages] == [S.GENERATE.value, S.COMPUTE_REWARDS.value, S.TRAIN_STEP.value]
        assert {s.resource[A.RL_FRAMEWORK] for s in stages} == {SWIFT}
