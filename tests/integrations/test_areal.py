"""AReaL 1.0.4's own StatsLogger and stats_tracker, with and without otel-rl.

Each step records what AReaL's PPO trainer records, through AReaL's own ``stats_tracker`` calls:
the ``timeperf/*`` timers in ``PPOTrainer.train``'s order (``record_timing``), and the actor's
statistics under the ``ppo_actor`` scope (``denominator`` / ``stat`` / ``scalar``, as
``PPOActor._ppo_update`` and ``grpo_loss_fn`` call them, areal/trainer/ppo/actor.py). The real
``export_all`` gives the step's dict and the real ``StatsLogger.commit`` logs it to TensorBoard.
No stand-ins: the trackers W&B, SwanLab and trackio stay in AReaL's "disabled" mode.
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

STEPS = 3
TIMERS = ("rollout", "recompute_logp", "compute_advantage", "train_step", "update_weights")


def one_step(stats_tracker: Any, step: int) -> dict[str, float]:
    """What one PPO step records, through AReaL's stats_tracker; its export_all()."""
    for timer in TIMERS:
        with stats_tracker.record_timing(timer):
            pass
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0]) + 0.1 * step
    with stats_tracker.scope("ppo_actor"):
        seqs = torch.ones(4, dtype=torch.bool)
        stats_tracker.denominator(n_seqs=seqs, correct_n_seqs=rewards > 0.5)
        stats_tracker.stat(task_reward=rewards, seq_len=torch.tensor([5.0, 7.0, 6.0, 9.0]), denominator="n_seqs")
        with stats_tracker.scope("update"):
            tokens = torch.ones(8, dtype=torch.bool)
            stats_tracker.denominator(n_valid_tokens=tokens)
            stats_tracker.stat(
                actor_loss=torch.full((8,), 0.1 * step), importance_weight=torch.ones(8), entropy=torch.full((8,), 2.0 - 0.1 * step),
                denominator="n_valid_tokens",
            )  # fmt: skip
            stats_tracker.stat(clip_ratio=torch.zeros(8), denominator="n_valid_tokens")
            stats_tracker.scalar(grad_norm=0.5 + step, lr=1e-6)
            with stats_tracker.scope("compute_logp"):
                stats_tracker.denominator(n_valid_tokens=tokens)
                stats_tracker.stat(kl_div_direct=torch.full((8,), 1e-3 * step), kl_div_dual=torch.full((8,), 5e-4 * step),
                                   denominator="n_valid_tokens")  # fmt: skip
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
    for step in range(STEPS):
        stats.commit(0, step, step, one_step(stats_tracker, step))
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
    assert kl == {"k1", "k3"}

    # each step is one trace, its stages in the order AReaL's trainer runs them
    spans = read_spans(run_dir)
    steps = [s for s in spans if s.name == N.RL_STEP_SPAN]
    assert sorted(s.attributes[A.RL_STEP] for s in steps) == list(range(STEPS))
    for step in steps:
        children = sorted((s for s in spans if s.parent_span_id == step.span_id), key=lambda s: s.start_ns)
        assert [s.attributes[A.RL_STAGE] for s in children] == ["generate", "compute_log_probs", "advantage", "train_step", "model_update"]
