"""AReaL 1.0.4's own StatsLogger, stats_tracker and PPO actor, with and without otel-rl.

Each step records what AReaL's PPO trainer records, through AReaL's own code: the ``timeperf/*``
timers in ``PPOTrainer.train``'s order (``record_timing``), and the actor's statistics from
AReaL's ``PPOActor`` itself (``compute_advantages``, then ``ppo_update``, whose ``grpo_loss_fn``
records the update's statistics under ``ppo_actor/update``). The real ``export_all`` gives the
step's dict and the real ``StatsLogger.commit`` logs it to TensorBoard. The one stand-in is the
actor's FSDP engine (``Engine`` below, marked). No other: the trackers W&B, SwanLab and trackio
stay in AReaL's "disabled" mode.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("areal") is None:
    pytest.skip("areal is not installed (scripts/setup.sh installs it with --no-deps)", allow_module_level=True)

import torch  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.runs.folder import read_log_records, read_metrics, read_spans  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

# AReaL's loggers replace the logging module's root and manager: put back after each test.
pytestmark = pytest.mark.usefixtures("keep_logging")

STEPS = 3
TIMERS = ("rollout", "recompute_logp", "compute_advantage", "train_step", "update_weights")
VOCAB = 16


class Engine:
    """STAND-IN for AReaL's FSDPEngine (areal/engine/fsdp_engine.py), with what PPOActor calls:
    ``train()``, ``eval()``, ``get_version()`` and ``train_batch(mb, loss_fn, loss_weight_fn)``,
    which, as FSDPEngine does, packs the micro-batch (AReaL's ``pack_tensor_dict``), computes the
    log-probs and entropy of the next tokens (AReaL's ``gather_logprobs_entropy``) with a tiny
    model, calls the actor's loss function on them, steps the optimizer and returns its stats."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2)

    def train(self, mode: bool = True) -> Engine:
        self.model.train(mode)
        return self

    def eval(self) -> Engine:
        return self.train(False)

    def get_version(self) -> int:
        return 0

    def train_batch(self, input_: dict, loss_fn: Any, loss_weight_fn: Any) -> dict[str, float]:
        from areal.utils.data import pack_tensor_dict
        from areal.utils.functional.vocab_parallel import gather_logprobs_entropy

        self.optimizer.zero_grad()
        packed = pack_tensor_dict(input_)
        ids = packed["input_ids"]
        logprobs, entropy = gather_logprobs_entropy(self.model(ids), torch.roll(ids, shifts=-1, dims=-1))
        loss_fn(logprobs, entropy, packed).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return {"update_successful": 1.0, "grad_norm": float(grad_norm), "lr": 1e-2}


def new_actor() -> Any:
    """AReaL's PPOActor on a fresh stand-in engine: each run starts from the same weights."""
    from areal.api.cli_args import PPOActorConfig
    from areal.trainer.ppo.actor import PPOActor

    config = PPOActorConfig(experiment_name="e", trial_name="t", recompute_logprob=False, use_decoupled_loss=False, ppo_n_minibatches=1)
    return PPOActor(config, Engine())


def one_step(stats_tracker: Any, step: int, ppo: Any) -> dict[str, float]:
    """One PPO step through AReaL's own code: its timers, then PPOActor on a batch of 4 rollouts
    (rewards rising with the step); what ``export_all()`` gives StatsLogger."""
    for timer in TIMERS:
        with stats_tracker.record_timing(timer):
            pass
    generator = torch.Generator().manual_seed(step)
    ids = torch.randint(1, VOCAB, (4, 10), generator=generator)
    attention = torch.ones(4, 10, dtype=torch.bool)
    attention[0, 8:] = attention[2, 7:] = False
    loss_mask = torch.zeros(4, 10, dtype=torch.int32)
    loss_mask[:, 4:] = 1
    loss_mask *= attention
    batch = {
        "input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask,
        "logprobs": -torch.rand(4, 10, generator=generator) * loss_mask, "versions": torch.zeros(4, 10, dtype=torch.int32),
        "rewards": torch.tensor([0.0, 1.0, 1.0, 0.0]) + 0.1 * step,
    }  # fmt: skip
    ppo.ppo_update(ppo.compute_advantages([batch]))
    return stats_tracker.export_all()


def run(tmp_path: Path, name: str) -> Path:
    from areal.api import FinetuneSpec
    from areal.api.cli_args import BaseExperimentConfig
    from areal.utils import stats_tracker
    from areal.utils.stats_logger import StatsLogger

    config = BaseExperimentConfig(experiment_name="gsm8k-grpo", trial_name=name)
    config.cluster.fileroot = str(tmp_path / name)
    s = config.stats_logger
    s.experiment_name, s.trial_name, s.fileroot = "gsm8k-grpo", name, str(tmp_path / name)
    s.tensorboard.path = str(tmp_path / name / "tb")
    stats = StatsLogger(config, FinetuneSpec(total_train_epochs=1, dataset_size=4 * STEPS, train_batch_size=4))
    ppo = new_actor()
    for step in range(STEPS):
        stats.commit(0, step, step, one_step(stats_tracker, step, ppo))
    stats.close()
    return tmp_path / name / "tb"


def tensorboard_scalars(folder: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {(tag, e.step): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}


def test_commits_log_the_same_values_with_otel_rl_and_every_key_arrives(tmp_path: Path) -> None:
    from otel_rl.integrations.areal import AReaLInstrumentor

    plain = tensorboard_scalars(run(tmp_path, "plain"))
    run_dir = tmp_path / "run"
    telemetry = otel_rl.init(run_dir=str(run_dir), console=False, framework="areal")
    instrumentor = AReaLInstrumentor()
    if not instrumentor.is_instrumented:
        instrumentor.instrument()
    try:
        with_otel = tensorboard_scalars(run(tmp_path, "otel"))
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
    timing = {k for k in plain if k[0].startswith("timeperf/")}  # wall time differs run to run
    assert set(with_otel) == set(plain) and len(plain) > 20
    assert {k: v for k, v in with_otel.items() if k not in timing} == {k: v for k, v in plain.items() if k not in timing}

    # every committed value in its step's rl.log event, at the step AReaL logged it at
    events = [r for r in read_log_records(run_dir) if r["event_name"] == N.RL_LOG_EVENT]
    logged = {(k, e["attributes"][A.RL_STEP]): v for e in events for k, v in e["body"].items()}
    assert set(logged) == set(with_otel)
    for key, value in with_otel.items():
        assert logged[key] == pytest.approx(value, rel=1e-6), key

    points = read_metrics(run_dir)
    unmapped = {p.attributes[A.RL_KEY] for p in points if p.name == M.RL_UNMAPPED}
    names = {p.name for p in points}
    for metric in (
        M.RL_REWARD,
        M.RL_LOSS,
        M.RL_GRAD_NORM,
        M.RL_POLICY_ENTROPY,
        M.RL_CLIP_FRACTION,
        M.RL_TRAIN_INFER_KL,
        M.RL_STAGE_DURATION,
    ):
        assert metric in names, (metric, sorted(unmapped))
    kl = {p.attributes[A.RL_KL_ESTIMATOR] for p in points if p.name == M.RL_TRAIN_INFER_KL}
    assert kl == {"k1", "k2", "k3"}

    # each step is one trace, its stages in the order AReaL's trainer runs them
    spans = read_spans(run_dir)
    steps = [s for s in spans if s.name == N.RL_STEP_SPAN]
    assert sorted(s.attributes[A.RL_STEP] for s in steps) == list(range(STEPS))
    for step in steps:
        children = sorted((s for s in spans if s.parent_span_id == step.span_id), key=lambda s: s.start_ns)
        assert [s.attributes[A.RL_STAGE] for s in children] == ["generate", "compute_log_probs", "advantage", "train_step", "model_update"]
