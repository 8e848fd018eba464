"""Performance: throughput, MFU, SM activity, pipeline bubble.

MFU counts model FLOPs the way PaLM (Chowdhery et al. 2022, appendix B) and verl's
``flops_counter`` do. For a batch of sequences with lengths s_i (T = sum s_i tokens), a model
with N matmul parameters, L layers and attention width H (= heads x head_dim):

    training (forward + backward):  6 * N * T  +  12 * L * H * sum(s_i ** 2)
    forward only (log-probs):       2 * N * T  +   4 * L * H * sum(s_i ** 2)

i.e. per token 6N (2N forward) for the weight matmuls plus 12*L*H*s (4*L*H*s) for the
attention scores and the weighted sum over its s-token context ("6N + 12*L*H*S per token").
N counts the weights every token multiplies (linear layers and the LM head; not embedding
lookups). MFU = FLOPs / (seconds * peak FLOP/s per device * devices).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import otel_rl.dfx._tensors as T
import otel_rl.environment_variables as ENV
from otel_rl.dfx._collector import StepStats
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

logger = logging.getLogger("otel_rl")


def throughput(stats: StepStats, *, seconds: float, tokens: Any = None, samples: Any = None) -> None:
    """tokens / seconds -> ``rl.throughput.tokens``, samples / seconds -> ``rl.throughput.samples``.

    tokens / samples: counts (a number, or a device scalar such as ``attention_mask.sum()``);
    seconds: the step's (or stage's) wall time.
    """
    if seconds <= 0:
        return
    if tokens is not None:
        stats.defer([tokens], lambda v: stats.record(M.RL_THROUGHPUT_TOKENS, v[0] / seconds))
    if samples is not None:
        stats.defer([samples], lambda v: stats.record(M.RL_THROUGHPUT_SAMPLES, v[0] / seconds))


# --------------------------------------------------------------------------------------------
# MFU

# Dense BF16 tensor-core peak per device (FLOP/s, no sparsity), the denominator of MFU.
# Matched against the device name (torch.cuda.get_device_name()); the longest key contained in
# the name wins, so "H100 PCIe" beats "H100" and "L40S" beats "L40". Override with peak_flops=.
PEAK_BF16_FLOPS: dict[str, float] = {
    # NVIDIA A100 datasheet: BF16 tensor core 312 TFLOPS (624 with sparsity), SXM and PCIe.
    "A100": 312e12,
    # A800: A100 silicon with a reduced NVLink (China SKU), same tensor-core peak.
    "A800": 312e12,
    # NVIDIA H100 datasheet, SXM: BF16 1,979 TFLOPS with sparsity -> 989.4 dense.
    "H100": 989.4e12,
    # H100 PCIe: 1,513 TFLOPS with sparsity -> 756 dense; H100 NVL: 1,671 per GPU -> 835.5 dense.
    "H100 PCIe": 756e12,
    "H100 NVL": 835.5e12,
    # H800 SXM / PCIe: H100 SXM / PCIe silicon with a reduced NVLink (China SKU), same tensor-core peaks.
    "H800": 989.4e12,
    "H800 PCIe": 756e12,
    # NVIDIA H200 datasheet, SXM: BF16 1,979 TFLOPS with sparsity -> 989.4 dense (same GH100 SMs).
    "H200": 989.4e12,
    # NVIDIA H20 (China SKU): 148 TFLOPS BF16 dense (as in verl's flops_counter table).
    "H20": 148e12,
    # NVIDIA L40S datasheet: BF16 tensor core 362.05 TFLOPS dense (733 with sparsity).
    "L40S": 362.05e12,
    # NVIDIA L40 datasheet: BF16 181.05 TFLOPS dense (362.1 with sparsity).
    "L40": 181.05e12,
    # NVIDIA Ada whitepaper, GeForce RTX 4090: BF16 tensor with FP32 accumulate 165.2 TFLOPS dense
    # (torch accumulates bf16 matmuls in FP32; 330.3 with FP16 accumulate).
    "4090": 165.2e12,
    # NVIDIA HGX B200: 36 PFLOPS BF16 with sparsity for 8 GPUs -> 2.25 PFLOPS dense per GPU.
    "B200": 2.25e15,
    # AMD Instinct MI300X datasheet: 1,307.4 TFLOPS BF16 dense.
    "MI300X": 1307.4e12,
    # Huawei Ascend 910B: Huawei publishes no per-SKU BF16 figure; 354 TFLOPS is the value verl's
    # flops_counter uses (910B1-B4 differ: pass peak_flops= for yours). There is no settled
    # Ascend formula or data source yet; this is the same FLOPs formula with this peak.
    "910B": 354e12,
}


def peak_flops_for(device_name: str | None, table: Mapping[str, float] = PEAK_BF16_FLOPS) -> float | None:
    """Peak dense BF16 FLOP/s of a device by name, or None when it is not in the table."""
    if not device_name:
        return None
    name = device_name.upper()
    for key in sorted(table, key=len, reverse=True):
        if key.upper() in name:
            return table[key]
    return None


def current_device_name() -> str | None:
    """Name of the current CUDA device when the program initialized CUDA (no driver call otherwise)."""
    torch = T.torch_module()
    try:
        if torch is not None and torch.cuda.is_initialized():
            return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:
        return None
    return None


@functools.lru_cache(maxsize=8)
def measure_peak_flops(device: str = "cpu", size: int = 1024, repeat: int = 5, dtype: str = "float32") -> float:
    """Best achieved FLOP/s of a square matmul on ``device``: a measured ceiling for devices
    with no datasheet peak (the demo's CPU). Runs once per process; synchronizes the device,
    so call it at start-up, never per step."""
    import torch

    rng = torch.Generator(device=device).manual_seed(0)  # leave the program's global RNG alone
    a = torch.randn(size, size, device=device, dtype=getattr(torch, dtype), generator=rng)
    b = torch.randn(size, size, device=device, dtype=getattr(torch, dtype), generator=rng)
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    torch.matmul(a, b)  # warm-up
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


@dataclass(frozen=True)
class ModelSpec:
    """What the FLOPs formula needs of a model.

    num_params: parameters every token multiplies (linear layers and LM head, no embedding lookups);
    num_layers: transformer layers; hidden_size: attention width H = heads * head_dim.
    """

    num_params: int
    num_layers: int
    hidden_size: int

    @classmethod
    def from_module(cls, module: Any, *, num_layers: int, hidden_size: int) -> ModelSpec:
        """Count the weights of the module's torch.nn.Linear layers (call before offloading it)."""
        import torch

        n = sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))
        return cls(num_params=int(n), num_layers=num_layers, hidden_size=hidden_size)


def model_flops(spec: ModelSpec, tokens: float, sum_sq_seq_len: float, *, training: bool = True) -> float:
    """FLOPs of a batch: see the module docstring. tokens = sum s_i, sum_sq_seq_len = sum s_i**2."""
    dense, attention = (6.0, 12.0) if training else (2.0, 4.0)
    return dense * spec.num_params * tokens + attention * spec.num_layers * spec.hidden_size * sum_sq_seq_len


def mfu(
    stats: StepStats,
    spec: ModelSpec,
    seq_lens: Any,
    seconds: float,
    *,
    role: str = A.RlModelRoleValues.ACTOR.value,
    training: bool = True,
    peak_flops: float | None = None,
    device_name: str | None = None,
    num_devices: int = 1,
) -> None:
    """Model FLOPs utilization -> ``rl.mfu{rl.model.role}``.

    seq_lens: each processed sequence's length (repeat it per pass: PPO epochs process the batch
    several times), a device tensor such as ``attention_mask.sum(-1)`` or host numbers.
    seconds: the wall time of that work; num_devices: devices it ran on.
    peak_flops: per-device peak; default from ``PEAK_BF16_FLOPS`` by ``device_name`` (default the
    current CUDA device, or ``OTEL_RL_PEAK_FLOPS``). Unknown peak: nothing is recorded (said once).
    """
    peak = peak_flops or _env_peak() or peak_flops_for(device_name or current_device_name())
    if not peak or seconds <= 0:
        stats.report_once(
            "mfu:peak",
            "otel-rl dfx: no peak FLOP/s for device %r; rl.mfu is absent (pass peak_flops=)",
            device_name or current_device_name(),
        )
        return
    lens = T.as_vector(seq_lens)
    sums = [T.total(lens), T.total(lens * lens)]

    def on_ready(v: list[float]) -> None:
        flops = model_flops(spec, v[0], v[1], training=training)
        stats.record(M.RL_MFU, flops / (seconds * peak * num_devices), {A.RL_MODEL_ROLE: role})

    stats.defer(sums, on_ready)


def _env_peak() -> float | None:
    raw = os.environ.get(ENV.OTEL_RL_PEAK_FLOPS)
    try:
        return float(raw) if raw else None
    except ValueError:
        logger.warning("otel-rl dfx: OTEL_RL_PEAK_FLOPS=%r is not a number; ignored", raw)
        return None


# --------------------------------------------------------------------------------------------
# SM activity


class SmActivityProbe:
    """SM activity (SMA) per GPU from NVML GPU performance monitoring (Hopper and later).

    ``begin()`` takes a GPM sample on every visible GPU, ``record(stats)`` takes a second one and
    records NVML_GPM_METRIC_SM_UTIL (percent of SMs busy between the two samples, the NVML
    counterpart of DCGM's DCGM_FI_PROF_SM_ACTIVE) as ``rl.sm_activity{hw.id}`` in 0..1. Both are
    driver reads: no device synchronize. Without NVML, a GPU, or GPM support it says "absent" once
    and records nothing; values from DCGM can be given to ``record_sm_activity`` instead.
    """

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._handles: list[tuple[str, Any]] | None = None
        self._first: dict[str, Any] = {}
        self.status = "not started"

    def _open(self) -> list[tuple[str, Any]]:
        if self._handles is not None:
            return self._handles
        self._handles = []
        try:
            nvml = self._nvml
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            from otel_rl._sdk.sources.probes import visible_device_indices

            for i in visible_device_indices(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                if nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                    self._handles.append((str(i), handle))
            self._nvml = nvml
            self.status = f"present: {len(self._handles)} device(s) with GPM" if self._handles else "absent: no GPM-capable GPU"
        except Exception as exc:
            self.status = f"absent: {type(exc).__name__}: {exc}"
        if not self._handles:
            logger.info("otel-rl dfx: SM activity is absent (%s)", self.status)
        return self._handles

    def begin(self) -> None:
        """First sample of the window (e.g. at the start of the step)."""
        for device, handle in self._open():
            self._free(self._first.pop(device, None))
            try:
                sample = self._nvml.nvmlGpmSampleAlloc()
                self._nvml.nvmlGpmSampleGet(handle, sample)
                self._first[device] = sample
            except Exception:
                continue

    def record(self, stats: StepStats) -> dict[str, float]:
        """Second sample; records and returns SM activity per device since ``begin()``."""
        nvml, out = self._nvml, {}
        for device, handle in self._open():
            first = self._first.pop(device, None)
            if first is None:
                continue
            second = None
            try:
                second = nvml.nvmlGpmSampleAlloc()
                nvml.nvmlGpmSampleGet(handle, second)
                query: Any = nvml.c_nvmlGpmMetricsGet_t()  # a ctypes struct; the stubs type its array loosely
                query.version = nvml.NVML_GPM_METRICS_GET_VERSION
                query.numMetrics = 1
                query.sample1, query.sample2 = first, second
                query.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
                nvml.nvmlGpmMetricsGet(query)
                out[device] = float(query.metrics[0].value) / 100.0
            except Exception as exc:
                stats.report_once(f"sma:{device}", "otel-rl dfx: reading SM activity of GPU %s failed: %s", device, exc)
            finally:
                self._free(first)
                self._free(second)
        record_sm_activity(stats, out)
        return out

    def _free(self, sample: Any) -> None:
        if sample is not None:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except Exception:
                pass


def record_sm_activity(stats: StepStats, by_device: Mapping[str, float]) -> None:
    """Record SM activity (0..1) per device id -> ``rl.sm_activity{hw.id}`` (e.g. from DCGM)."""
    for device, value in by_device.items():
        stats.record(M.RL_SM_ACTIVITY, float(value), {A.HW_ID: str(device)})


# --------------------------------------------------------------------------------------------
# Pipeline bubble


class StepTimeline:
    """Busy intervals of each cluster within one step, for the pipeline bubble.

    Feed it stage spans: ``with timeline.track(tel.stage("generate", cluster="actor_infer")) as st:``
    (the cluster is read from the Stage), or ``timeline.add(cluster, start, end)`` with
    ``time.perf_counter()`` times. ``begin()`` marks the step's start. Stages without a cluster
    run on the driver, not on a device pool, and are left out of the bubble. Colocated clusters
    sharing devices: track them under one name to get the devices' bubble.
    """

    def __init__(self) -> None:
        self._busy: dict[str, list[tuple[float, float]]] = {}
        self.start: float | None = None

    def begin(self, at: float | None = None) -> None:
        """Start a new step: forget the previous intervals."""
        self._busy = {}
        self.start = time.perf_counter() if at is None else at

    def add(self, cluster: str, start: float, end: float) -> None:
        if end > start:
            self._busy.setdefault(cluster, []).append((start, end))

    @contextmanager
    def track(self, stage_cm: Any) -> Iterator[Any]:
        """Enter a stage context manager (``tel.stage(...)``), noting its cluster's busy interval."""
        t0 = time.perf_counter()
        with stage_cm as stage:
            yield stage
        t1 = time.perf_counter()
        cluster = getattr(stage, "cluster", None)
        if cluster:
            # the stage's own timer, when it has one: the same interval its span and duration report
            started, elapsed = getattr(stage, "started", None), getattr(stage, "elapsed", None)
            if started is not None and elapsed is not None:
                t0, t1 = started, started + elapsed
            self.add(cluster, t0, t1)

    @contextmanager
    def span(self, cluster: str) -> Iterator[None]:
        """Mark a block as busy time of ``cluster`` (work outside any telemetry stage)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(cluster, t0, time.perf_counter())

    @property
    def clusters(self) -> list[str]:
        return list(self._busy)

    def busy_seconds(self, cluster: str | None = None, start: float | None = None, end: float | None = None) -> float:
        """Length of the union of a cluster's busy intervals (all clusters' with None), clipped to [start, end]."""
        intervals = self._busy.get(cluster, []) if cluster is not None else [i for v in self._busy.values() for i in v]
        return _union_length(intervals, start, end)

    def bubble_ratios(self, start: float | None = None, end: float | None = None) -> dict[str, float]:
        """Idle share of each cluster in [start, end] (default: begin() .. now)."""
        start = self.start if start is None else start
        if start is None:
            start = min((s for v in self._busy.values() for s, _ in v), default=0.0)
        end = time.perf_counter() if end is None else end
        span = end - start
        if span <= 0:
            return {}
        return {c: max(0.0, 1.0 - self.busy_seconds(c, start, end) / span) for c in self._busy}


def _union_length(intervals: list[tuple[float, float]], lo: float | None, hi: float | None) -> float:
    clipped = sorted((max(s, lo) if lo is not None else s, min(e, hi) if hi is not None else e) for s, e in intervals)
    covered, cur_start, cur_end = 0.0, 0.0, None  # cur_start is read only once cur_end is set
    for s, e in clipped:
        if e <= s:
            continue
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                covered += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        covered += cur_end - cur_start
    return covered


def pipeline_bubble(stats: StepStats, timeline: StepTimeline, *, start: float | None = None, end: float | None = None) -> dict[str, float]:
    """Record each cluster's idle share of the step -> ``rl.pipeline.bubble_ratio{rl.cluster}``."""
    ratios = timeline.bubble_ratios(start, end)
    for cluster, ratio in ratios.items():
        stats.record(M.RL_PIPELINE_BUBBLE_RATIO, ratio, {A.RL_CLUSTER: cluster})
    return ratios
