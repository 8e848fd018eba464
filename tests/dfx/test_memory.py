"""Memory helpers: fragmentation, activation peak, KV-cache peak and utilization, comm buffers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dfx_support import CAPTURES, latest  # noqa: E402

from otel_rl import dfx  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402

GIB = 2**30


def test_fragmentation_from_numbers(stats, tel):
    assert dfx.fragmentation(stats, allocated=30 * GIB, reserved=40 * GIB, device=0, stage="train_step") == 0.25
    assert latest(tel, M.RL_GPU_MEMORY_FRAGMENTATION, {A.RL_STAGE: "train_step", A.HW_ID: "0"}) == 0.25


def test_gpu_memory_is_absent_on_a_cpu_run(stats, tel):
    assert not torch.cuda.is_initialized()
    assert dfx.fragmentation(stats) is None
    with tel.step(1), tel.stage("compute_log_probs", cluster="actor_train", offload=True) as st:
        for phase in ("onload", "execute", "offload"):
            with st.phase(phase):
                pass
    assert dfx.activation_peak_from_stage(stats, st) == {}  # CPU snapshots only: no allocator peak
    assert not CAPTURES[tel].series(M.RL_GPU_MEMORY_FRAGMENTATION)  # absent: no series at all
    assert not CAPTURES[tel].series(M.RL_GPU_MEMORY_ACTIVATION_PEAK)


class SnapshotStage:
    """Stand-in for a finished otel_rl Stage with GPU snapshots: its ``metrics`` carry the ROLL keys
    (``memory/{cluster}/{stage}/{when}/{state}/{kind}/{device}``, GiB) the real Stage produces."""

    name, cluster = "compute_log_probs", "actor_train"

    def __init__(self, by_key):
        self.metrics = {f"memory/actor_train/compute_log_probs/{k}": v for k, v in by_key.items()}


def test_activation_peak_from_the_stages_gpu_snapshots(stats, tel):
    st = SnapshotStage(
        {
            "start/offload/allocated/0": 1.0,
            "start/onload/allocated/0": 15.0,
            "end/onload/max_allocated/0": 21.5,
            "end/offload/max_allocated/0": 21.5,
            "start/onload/allocated/1": 15.0,
            "end/onload/max_allocated/1": 19.0,
            "end/onload/max_allocated_frac/0": 0.27,
        }
    )
    # peak during the work = max_allocated at end/onload - allocated at start/onload (weights loaded)
    assert dfx.activation_peak_from_stage(stats, st) == {"0": 6.5 * GIB, "1": 4.0 * GIB}
    assert latest(tel, M.RL_GPU_MEMORY_ACTIVATION_PEAK, {A.RL_STAGE: "compute_log_probs", A.HW_ID: "0"}) == 6.5 * GIB


def test_kv_cache_from_vllm_and_sglang_stats(stats, tel):
    per_token = dfx.kv_cache_bytes_per_token(num_layers=32, num_kv_heads=8, head_dim=128)  # bf16
    assert per_token == 2 * 32 * 8 * 128 * 2  # 131072 bytes: K and V of every layer
    # vLLM: SchedulerStats.kv_cache_usage sampled during the rollout; 1000 blocks of 16 tokens
    samples = [{"kv_cache_usage": u, "num_gpu_blocks": 1000, "block_size": 16, "kv_bytes_per_token": per_token} for u in (0.2, 0.8, 0.5)]
    out = dfx.kv_cache(stats, samples, device=0)
    assert out == pytest.approx({"utilization": 0.5, "peak_bytes": 0.8 * 1000 * 16 * per_token})
    assert latest(tel, M.RL_ROLLOUT_KV_CACHE_UTILIZATION) == pytest.approx(0.5)
    assert latest(tel, M.RL_GPU_MEMORY_KV_CACHE_PEAK, {A.HW_ID: "0"}) == pytest.approx(0.8 * 16000 * per_token)
    # SGLang: token_usage of a pool of max_total_num_tokens
    sglang = dfx.kv_cache(stats, {"token_usage": 0.25, "max_total_num_tokens": 400_000, "kv_bytes_per_token": 1000}, device=1)
    assert sglang["peak_bytes"] == pytest.approx(0.25 * 400_000 * 1000)
    # an engine with no KV cache reports 0 honestly
    assert dfx.kv_cache(stats, {"kv_cache_usage": 0.0, "kv_cache_bytes": 0}) == {"utilization": 0.0, "peak_bytes": 0.0}


def test_comm_buffer_peak_of_a_state_dict(stats, tel):
    state = {"w": torch.zeros(10, 10), "b": torch.zeros(10, dtype=torch.float16), "n": [torch.zeros(3, dtype=torch.int64)]}
    assert dfx.tensors_nbytes(state) == 400 + 20 + 24
    dfx.comm_buffer_peak(stats, dfx.tensors_nbytes(state), device=0)
    assert latest(tel, M.RL_GPU_MEMORY_COMM_BUFFER_PEAK, {A.HW_ID: "0"}) == 444.0
