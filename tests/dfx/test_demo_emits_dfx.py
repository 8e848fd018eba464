"""One demo run emits every registry metric of seed 002 sections 2 and 3 (the RL DFX design),
except a short list that a CPU run cannot have.

The metrics are enumerated from the seed-002 table of tests/semconv/test_seed_keys.py (which is
checked against the seed's own bullets there), not from a list written here.
"""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("torch")

from otel_rl.demo import run_demo  # noqa: E402
from otel_rl.runs.folder import read_metrics  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402

SEED_KEYS = Path(__file__).resolve().parents[1] / "semconv" / "test_seed_keys.py"

# What a CPU run cannot produce, and why. Everything else of sections 2 and 3 must be emitted.
GPU_ONLY = {
    # SM activity is read from NVML GPU performance monitoring (or DCGM): no GPU, no SMs.
    M.RL_SM_ACTIVITY: "no NVML / GPU",
    # allocated / reserved memory are torch.cuda caching-allocator counters (the core's stage
    # snapshots); host RAM has no such allocator.
    M.RL_GPU_MEMORY_USAGE: "no CUDA allocator",
    # fragmentation = 1 - allocated / reserved: the same allocator counters.
    M.RL_GPU_MEMORY_FRAGMENTATION: "no CUDA allocator",
    # activation peak = max_allocated during a stage - allocated at its start: the same counters.
    M.RL_GPU_MEMORY_ACTIVATION_PEAK: "no CUDA allocator",
}


def seed002_metrics_of_sections_2_and_3() -> set[str]:
    spec = importlib.util.spec_from_file_location("seed_keys_table", SEED_KEYS)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    metrics = set()
    for (section, _bullet), names in table.SEED002_TABLE.items():
        if section.split(".")[0] in {"2", "3"}:
            assert isinstance(names, tuple), (section, _bullet)
            metrics.update(names)
    return metrics


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    import otel_rl

    run_dir = tmp_path_factory.mktemp("dfx-demo")
    tel = otel_rl.init(run_dir=str(run_dir), console=False, framework="roll", service_name="otel-rl-dfx-test")
    try:
        run_demo(steps=2, algo="grpo", telemetry=tel, out=run_dir, progress=False)
    finally:
        tel.shutdown()
    points = read_metrics(run_dir)
    assert not points.problems
    latest = {}
    for p in points:  # file order: the last point of a series is its final value
        latest[(p.name, tuple(sorted(p.attributes.items())))] = p
    by_name = defaultdict(list)
    for (name, _attrs), point in latest.items():
        by_name[name].append(point)
    return by_name


def test_the_enumeration_is_not_vacuous():
    metrics = seed002_metrics_of_sections_2_and_3()
    assert len(metrics) >= 45
    assert set(GPU_ONLY) <= metrics, "a GPU-only exception that is no seed-002 metric"
    assert len(GPU_ONLY) <= 4


def test_demo_emits_every_seed002_metric_of_sections_2_and_3(demo_run):
    required = seed002_metrics_of_sections_2_and_3() - set(GPU_ONLY)
    missing = sorted(m for m in required if m not in demo_run)
    assert not missing, f"the demo did not emit: {missing}"
    assert M.RL_TELEMETRY_REJECTED not in demo_run and M.RL_UNMAPPED not in demo_run


def values(run, metric, **attrs):
    return [p.value for p in run[metric] if all(p.attributes.get(k) == v for k, v in attrs.items())]


def test_the_demos_dfx_values_are_those_of_a_healthy_synchronous_run(demo_run):
    run = demo_run
    for metric in (
        M.RL_TENSOR_NONFINITE,
        M.RL_SHAPE_LEDGER_MISMATCHES,
        M.RL_BATCH_TOKEN_MISALIGNED,
        M.RL_BATCH_ID_MISALIGNED,
        M.RL_REWARD_EXCEPTIONS,
        M.RL_ROLLOUT_ABORT_RATIO,
        M.RL_ROLLOUT_TIMEOUT_RATIO,
        M.RL_ASYNC_STALE_SAMPLE_RATIO,
        M.RL_GPU_MEMORY_KV_CACHE_PEAK,
        M.RL_ROLLOUT_KV_CACHE_UTILIZATION,
        M.RL_STRAGGLER_MARGIN,
    ):
        assert set(values(run, metric)) == {0}, metric
    assert values(run, M.RL_ASYNC_POLICY_LAG, **{A.RL_STATISTIC: "max"}) == [0]  # on-policy
    # the sampler's log-probs and the trainer's recomputed ones: one model in float32, so they agree
    # to rounding on every response token (an off-by-one position would put them nats apart)
    assert values(run, M.RL_TRAIN_INFER_NONFINITE_RATIO) == [0]
    assert 0 < values(run, M.RL_TRAIN_INFER_LOGPROB_ABS_DIFF, **{A.RL_STATISTIC: "max"})[0] < 1e-4
    assert abs(values(run, M.RL_TRAIN_INFER_KL, **{A.RL_KL_ESTIMATOR: "k1"})[0]) < 1e-6
    assert values(run, M.RL_TRAIN_INFER_IMPORTANCE_RATIO, **{A.RL_STATISTIC: "mean"})[0] == pytest.approx(1.0, abs=1e-5)
    stages = {p.attributes[A.RL_STAGE] for p in run[M.RL_SHAPE_LEDGER_MISMATCHES]}
    assert stages == {"generate", "compute_log_probs", "compute_ref_log_probs", "advantage", "train_step"}
    # the same tensor checksums the same at every stage that sees it
    old = {p.attributes[A.RL_STAGE]: p.value for p in run[M.RL_TENSOR_CHECKSUM] if p.attributes[A.RL_TENSOR_NAME] == "old_log_probs"}
    assert set(old) == {"compute_log_probs", "train_step"} and len(set(old.values())) == 1
    assert all(0 <= v <= 1 for v in values(run, M.RL_PIPELINE_BUBBLE_RATIO))
    assert {p.attributes[A.RL_CLUSTER] for p in run[M.RL_PIPELINE_BUBBLE_RATIO]} == {"actor_infer", "reward", "actor_train", "reference"}
    assert 0 < values(run, M.RL_MFU, **{A.RL_MODEL_ROLE: "actor"})[0] <= 1
    assert values(run, M.RL_LOGPROB_SHAPE, **{A.RL_STAGE: "compute_log_probs", A.RL_TENSOR_DIM: 0}) == [512]
    assert values(run, M.RL_QUEUE_DEPTH, **{A.RL_QUEUE_NAME: "rollout"}) == [512]
    assert values(run, M.RL_STRAGGLER_RANK) == [0]
    ops = {(p.attributes[A.RL_STAGE], p.attributes[A.RL_COMPUTE_OP]) for p in run[M.RL_COMPUTE_DURATION]}
    assert ops == {
        ("compute_log_probs", "forward"),
        ("compute_ref_log_probs", "forward"),
        ("train_step", "forward"),
        ("train_step", "backward"),
        ("train_step", "optimizer_step"),
        ("model_update", "communication"),
    }
    (duration,) = run[M.GEN_AI_SERVER_REQUEST_DURATION]
    (ttft,) = run[M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN]
    assert duration.count == 2 * 512 and ttft.count == 2 * 512 and 0 < ttft.sum <= duration.sum
    assert values(run, M.RL_GPU_MEMORY_COMM_BUFFER_PEAK)[0] > 0  # the weight-sync staging copy
