"""TRL rollout samples: a real GRPOTrainer run on CPU (the tiny model of conftest.py, the setup of
test_trl.py) with ``OtelRLCallback(log_samples=K)``: the completions TRL keeps for its
``log_completions`` table arrive as ``rl.sample`` events, K per generation, with TRL's rewards."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
pytest.importorskip("transformers")

from otel_rl.integrations._hf_samples import as_text  # noqa: E402
from otel_rl.integrations.trl import OtelRLCallback  # noqa: E402
from otel_rl.runs.folder import read_log_records  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

PROMPTS = ["1+1=", "2+2=", "3+3=", "4+4=", "5+5=", "6+6=", "7+7=", "8+8="]


def count_a(completions, **kwargs):
    return [float(text.count("a")) for text in completions]


def brevity(completions, **kwargs):
    return [-len(text) / 10 for text in completions]


def test_grpo_completions_arrive_as_samples(tmp_path: Path, hf_tiny_lm) -> None:
    model_dir, tokenizer = hf_tiny_lm
    run_dir = tmp_path / "otel"
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=4,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        num_iterations=2,  # a generation every other step: the same batch must not be logged twice
        reward_weights=[1.0, 0.5],
        save_strategy="no",
    )
    callback = OtelRLCallback(run_dir=str(run_dir), console=False, log_samples=3, track_with="jsonl")
    trainer = trl.GRPOTrainer(
        model=model_dir,
        reward_funcs=[count_a, brevity],
        args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
        callbacks=[callback],
    )
    trainer.train()

    samples = [r for r in read_log_records(run_dir) if r["event_name"] == N.RL_SAMPLE_EVENT]
    steps = sorted({r["attributes"][A.RL_STEP] for r in samples})
    assert steps == [1, 3], "one batch per generation (num_iterations=2), logged at the step that generated it"
    assert len(samples) == 3 * len(steps)
    last = {i: (as_text(p), as_text(c)) for i, (p, c) in enumerate(zip(trainer._logs["prompt"], trainer._logs["completion"]))}
    for record in samples:
        body = record["body"]
        assert body["prompt"] in PROMPTS
        assert set(body) >= {"prompt", "response", "reward", "rewards/count_a", "rewards/brevity", "advantage", "group_id"}
        # TRL's own reward functions and weights, recomputed from the logged response
        assert body["rewards/count_a"] == count_a([body["response"]])[0]
        assert math.isclose(body["rewards/brevity"], brevity([body["response"]])[0], rel_tol=1e-6)
        assert math.isclose(body["reward"], body["rewards/count_a"] + 0.5 * body["rewards/brevity"], rel_tol=1e-6)
        assert body["group_id"] == str(body["index"] // 4)
        if record["attributes"][A.RL_STEP] == 3:  # the batch TRL still holds
            assert last[body["index"]] == (body["prompt"], body["response"])


def test_chat_messages_become_role_lines() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}]
    assert as_text(messages) == "user: hi\nassistant: hello"
    assert as_text("plain") == "plain"
