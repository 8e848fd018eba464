"""GPU memory: fragmentation, activation peak, KV-cache peak, communication buffers.

Allocated and reserved memory themselves come from the core's stage snapshots
(``rl.gpu.memory.usage``). Every number here is a host-side counter (torch.cuda's allocator
statistics, an inference engine's stats dict, a size the caller knows): reading them never
synchronizes a device. Without an initialized CUDA device the GPU-only values are absent
(nothing recorded, said once): host RAM has no allocator "reserved" pool to fragment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import otel_rl.dfx._tensors as T
from otel_rl.dfx._collector import StepStats
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

_GIB = float(2**30)  # Stage.metrics reports memory in GiB, as ROLL logs it


def _cuda() -> Any | None:
    """The program's torch.cuda when it initialized CUDA (a flag check, no driver call)."""
    torch = T.torch_module()
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def fragmentation(
    stats: StepStats,
    *,
    allocated: float | None = None,
    reserved: float | None = None,
    device: str | int | None = None,
    stage: str | None = None,
) -> float | None:
    """1 - allocated / reserved -> ``rl.gpu.memory.fragmentation{rl.stage, hw.id}``.

    allocated / reserved: bytes; by default read from torch.cuda for ``device`` (default the
    current one). Returns the ratio, or None when there is no CUDA device (or nothing reserved).
    """
    if allocated is None or reserved is None:
        cuda = _cuda()
        if cuda is None:
            stats.report_once(
                "memory:cuda", "otel-rl dfx: no initialized CUDA device; GPU memory fragmentation and activation peak are absent"
            )
            return None
        index = cuda.current_device() if device is None else int(device)
        allocated, reserved, device = cuda.memory_allocated(index), cuda.memory_reserved(index), index
    if not reserved:
        return None
    assert allocated is not None  # given, or read from torch.cuda above
    ratio = 1.0 - float(allocated) / float(reserved)
    stats.record(M.RL_GPU_MEMORY_FRAGMENTATION, ratio, _attrs(stage=stage, device=device))
    return ratio


def record_activation_peak(stats: StepStats, peak_bytes: float, *, stage: str | None = None, device: str | int | None = None) -> None:
    """``rl.gpu.memory.activation_peak{rl.stage, hw.id}`` from a number the caller measured."""
    stats.record(M.RL_GPU_MEMORY_ACTIVATION_PEAK, max(0.0, float(peak_bytes)), _attrs(stage=stage, device=device))


def activation_peak_from_stage(stats: StepStats, stage: Any) -> dict[str, float]:
    """Activation peak of a finished memory-tracking stage from its GPU snapshots.

    peak = max_allocated at the end of the work - allocated at its start (the onload snapshots
    of an offload stage, else the stage's own start / end), per device, from ``stage.metrics``.
    torch's max_allocated is the peak since the last ``torch.cuda.reset_peak_memory_stats()``:
    reset it when the work starts (as ROLL does) or this is an upper bound. No GPU snapshots
    (CPU run, CUDA not initialized): returns {} and records nothing.
    """
    infix = f"{stage.cluster}/{stage.name}" if getattr(stage, "cluster", None) else stage.name
    metrics = stage.metrics
    peaks: dict[str, float] = {}
    for device in _snapshot_devices(metrics, infix):
        start = _first_key(metrics, infix, ("start/onload", "start/offload"), "allocated", device)
        end = _first_key(metrics, infix, ("end/onload", "end/offload"), "max_allocated", device)
        if start is None or end is None:
            continue
        peaks[device] = max(0.0, (end - start) * _GIB)
        record_activation_peak(stats, peaks[device], stage=stage.name, device=device)
    return peaks


def _snapshot_devices(metrics: Mapping[str, float], infix: str) -> list[str]:
    prefix = f"memory/{infix}/"
    return sorted({key.rsplit("/", 1)[1] for key in metrics if key.startswith(prefix) and key.endswith(tuple("0123456789"))})


def _first_key(metrics: Mapping[str, float], infix: str, moments: Sequence[str], kind: str, device: str) -> float | None:
    for moment in moments:
        value = metrics.get(f"memory/{infix}/{moment}/{kind}/{device}")
        if value is not None:
            return value
    return None


# Keys read from an inference engine's stats dict, in order of preference.
# Fraction of the KV cache in use (0..1):
KV_USAGE_KEYS = (
    "kv_cache_usage",  # vLLM V1 SchedulerStats.kv_cache_usage
    "gpu_cache_usage",  # vLLM V1 before the rename (SchedulerStats.gpu_cache_usage)
    "gpu_cache_usage_sys",  # vLLM V0 engine Stats.gpu_cache_usage_sys
    "gpu_cache_usage_perc",  # vLLM's Prometheus gauge vllm:gpu_cache_usage_perc (a 0..1 fraction despite the name)
    "token_usage",  # SGLang scheduler / get_server_info: share of the KV token pool in use
)


def kv_cache_bytes_per_token(*, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes one token takes in the KV cache: K and V, every layer, every KV head."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def kv_cache_capacity_bytes(engine_stats: Mapping[str, Any]) -> float | None:
    """Total KV-cache bytes an engine reserved, from the stats dict:

    ``kv_cache_bytes`` directly; or vLLM's ``num_gpu_blocks`` (cache_config.num_gpu_blocks) x
    ``block_size`` (tokens per block) x ``kv_bytes_per_token``; or SGLang's
    ``max_total_num_tokens`` x ``kv_bytes_per_token``.
    """
    if engine_stats.get("kv_cache_bytes") is not None:
        return float(engine_stats["kv_cache_bytes"])
    per_token = engine_stats.get("kv_bytes_per_token")
    if per_token is None:
        return None
    if engine_stats.get("num_gpu_blocks") is not None and engine_stats.get("block_size") is not None:
        return float(engine_stats["num_gpu_blocks"]) * float(engine_stats["block_size"]) * float(per_token)
    if engine_stats.get("max_total_num_tokens") is not None:
        return float(engine_stats["max_total_num_tokens"]) * float(per_token)
    return None


def kv_cache(
    stats: StepStats, samples: Mapping[str, Any] | Sequence[Mapping[str, Any]], *, device: str | int | None = None
) -> dict[str, float]:
    """KV-cache utilization and peak of the rollout engine over the step.

    samples: one or several stats dicts taken during the rollout (see ``KV_USAGE_KEYS`` and
    ``kv_cache_capacity_bytes`` for the keys read). Records the mean usage fraction as
    ``rl.rollout.kv_cache.utilization`` and peak usage x capacity as
    ``rl.gpu.memory.kv_cache_peak{hw.id}`` (bytes; ``kv_cache_peak_bytes`` in a sample is taken as
    is). An engine without a KV cache reports usage 0 and capacity 0: its peak is honestly 0.
    """
    rows = [samples] if isinstance(samples, Mapping) else list(samples)
    usages = [u for u in (_usage(r) for r in rows) if u is not None]
    out: dict[str, float] = {}
    if usages:
        out["utilization"] = sum(usages) / len(usages)
        stats.record(M.RL_ROLLOUT_KV_CACHE_UTILIZATION, out["utilization"])
    peaks = [float(r["kv_cache_peak_bytes"]) for r in rows if r.get("kv_cache_peak_bytes") is not None]
    capacity = next((c for c in map(kv_cache_capacity_bytes, rows) if c is not None), None)
    if usages and capacity is not None:
        peaks.append(max(usages) * capacity)
    if peaks:
        out["peak_bytes"] = max(peaks)
        stats.record(M.RL_GPU_MEMORY_KV_CACHE_PEAK, out["peak_bytes"], _attrs(device=device))
    return out


def _usage(row: Mapping[str, Any]) -> float | None:
    for key in KV_USAGE_KEYS:
        if row.get(key) is not None:
            return float(row[key])
    return None


def comm_buffer_peak(stats: StepStats, peak_bytes: float, *, device: str | int | None = None) -> None:
    """Peak bytes of communication buffers (NCCL / HCCL, weight-sync staging) the caller knows
    -> ``rl.gpu.memory.comm_buffer_peak{hw.id}``."""
    stats.record(M.RL_GPU_MEMORY_COMM_BUFFER_PEAK, float(peak_bytes), _attrs(device=device))


def tensors_nbytes(tensors: Any) -> int:
    """Bytes of a tensor, or of the tensors of a dict / list (e.g. a state dict being sent)."""
    if isinstance(tensors, Mapping):
        return sum(tensors_nbytes(v) for v in tensors.values())
    if isinstance(tensors, (list, tuple)):
        return sum(tensors_nbytes(v) for v in tensors)
    nbytes = getattr(tensors, "nbytes", None)
    if nbytes is not None:
        return int(nbytes)
    return int(tensors.numel() * tensors.element_size()) if hasattr(tensors, "element_size") else 0


def _attrs(*, stage: str | None = None, device: str | int | None = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if stage is not None:
        attrs[A.RL_STAGE] = stage
    if device is not None:
        attrs[A.HW_ID] = str(device)
    return attrs
