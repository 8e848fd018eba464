"""Probes: GPU allocator memory (torch.cuda), GPU device state (NVML) and process state (psutil).

None of them synchronizes a device: torch.cuda's allocator statistics are host-side counters and
NVML reads the driver. torch is never imported here: the probe only looks at a torch that the
training program already imported and whose CUDA context is already initialized. A probe that
has nothing to read says so once ("absent") and costs nothing after that.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import psutil
from opentelemetry.metrics import CallbackOptions, Observation

from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

logger = logging.getLogger("otel_rl")

MEMORY_KINDS = (
    A.RlMemoryKindValues.ALLOCATED.value,
    A.RlMemoryKindValues.RESERVED.value,
    A.RlMemoryKindValues.MAX_ALLOCATED.value,
    A.RlMemoryKindValues.MAX_RESERVED.value,
)


@dataclass(frozen=True, slots=True)
class GpuMemorySnapshot:
    """Allocator statistics of one device, in bytes."""

    device: str
    allocated: int
    reserved: int
    max_allocated: int
    max_reserved: int
    total: int

    def by_kind(self) -> dict[str, int]:
        return {
            MEMORY_KINDS[0]: self.allocated,
            MEMORY_KINDS[1]: self.reserved,
            MEMORY_KINDS[2]: self.max_allocated,
            MEMORY_KINDS[3]: self.max_reserved,
        }


class CudaMemoryProbe:
    """``torch.cuda`` memory statistics of the current device, read at stage boundaries."""

    def __init__(self, cuda: Any | None = None) -> None:
        self._given = cuda  # a torch.cuda-like module; by default the program's own torch.cuda
        self._totals: dict[int, int] = {}
        self._absent_reported = False
        self.status = "absent: torch not imported by the program"

    def _cuda(self) -> Any | None:
        cuda = self._given
        if cuda is None:
            torch = sys.modules.get("torch")
            if torch is None:
                return None
            cuda = torch.cuda
        # is_initialized() is a flag check; is_available() would touch the driver on every call.
        if not cuda.is_initialized():
            return None
        return cuda

    def snapshot(self) -> GpuMemorySnapshot | None:
        cuda = self._cuda()
        if cuda is None:
            if not self._absent_reported:
                self._absent_reported = True
                logger.info("otel-rl: no initialized CUDA device in this process; GPU memory snapshots are absent")
            return None
        try:
            index = cuda.current_device()
            total = self._totals.get(index)
            if total is None:
                total = self._totals[index] = int(cuda.get_device_properties(index).total_memory)
            self.status = "present"
            return GpuMemorySnapshot(
                device=str(index),
                allocated=int(cuda.memory_allocated(index)),
                reserved=int(cuda.memory_reserved(index)),
                max_allocated=int(cuda.max_memory_allocated(index)),
                max_reserved=int(cuda.max_memory_reserved(index)),
                total=total,
            )
        except Exception as exc:  # a broken CUDA context must not reach the training loop
            if not self._absent_reported:
                self._absent_reported = True
                logger.warning("otel-rl: reading torch.cuda memory statistics failed (%s); GPU memory snapshots are off", exc)
            return None


class ProcessProbe:
    """Resident and virtual memory of this process (psutil), read at memory-tracking stage boundaries."""

    def __init__(self) -> None:
        self._process = psutil.Process()

    def memory(self) -> tuple[int, int]:
        info = self._process.memory_info()
        return int(info.rss), int(info.vms)

    def observe_memory(self, _options: CallbackOptions) -> Iterable[Observation]:
        rss, _vms = self.memory()
        return [Observation(rss)]

    def observe_virtual(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.memory()[1])]

    def observe_cpu(self, _options: CallbackOptions) -> Iterable[Observation]:
        # cpu_percent(None) is the share since the previous call; upstream divides by the CPU count.
        return [Observation(self._process.cpu_percent(None) / 100.0 / (psutil.cpu_count() or 1))]

    def callbacks(self) -> dict[str, Callable[[CallbackOptions], Iterable[Observation]]]:
        return {
            M.PROCESS_MEMORY_USAGE: self.observe_memory,
            M.PROCESS_MEMORY_VIRTUAL: self.observe_virtual,
            M.PROCESS_CPU_UTILIZATION: self.observe_cpu,
        }


class NvmlProbe:
    """GPU utilization, memory, power and temperature from NVML, read at metric collection time."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._handles: list[tuple[str, Any]] = []
        self.status = "not started"

    def start(self) -> bool:
        """Open NVML; on a machine without a driver, report absent once and register nothing."""
        try:
            nvml = self._nvml
            if nvml is None:
                import pynvml as nvml  # nvidia-ml-py, a hard dependency; the driver may still be missing
            nvml.nvmlInit()
            indices = visible_device_indices(nvml.nvmlDeviceGetCount())
            self._handles = [(str(i), nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
            self._nvml = nvml
        except Exception as exc:
            self.status = f"absent: {type(exc).__name__}: {exc}"
            logger.info("otel-rl: NVML unavailable (%s); hw.gpu.* metrics are absent", exc)
            return False
        self.status = f"present: {len(self._handles)} device(s)"
        return bool(self._handles)

    def _observe(self, read: Callable[[Any], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            out = []
            for device, handle in self._handles:
                try:
                    out.append(Observation(read(handle), {A.HW_ID: device, A.HW_TYPE: A.HwTypeValues.GPU.value}))
                except Exception:  # a device that stops answering is skipped, not fatal
                    continue
            return out

        return observe

    def callbacks(self) -> dict[str, Callable[[CallbackOptions], Iterable[Observation]]]:
        nvml = self._nvml
        if not self._handles:
            return {}
        assert nvml is not None  # start() found devices, so it kept the NVML module
        nvml = cast(Any, nvml)  # pynvml's stubs type its structs' fields as str
        return {
            M.HW_GPU_UTILIZATION: self._observe(lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
            M.HW_GPU_MEMORY_USAGE: self._observe(lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used),
            M.HW_GPU_MEMORY_LIMIT: self._observe(lambda h: nvml.nvmlDeviceGetMemoryInfo(h).total),
            M.HW_POWER: self._observe(lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
            M.HW_TEMPERATURE: self._observe(lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
        }

    def stop(self) -> None:
        if self._handles and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._handles = []


def visible_device_indices(count: int) -> list[int]:
    """NVML indices of the devices this process may use (CUDA_VISIBLE_DEVICES when it lists indices)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() == "":
        return list(range(count)) if visible is None else []
    indices = []
    for part in visible.split(","):
        part = part.strip()
        if not part.isdigit():  # UUIDs / MIG ids: fall back to every device
            return list(range(count))
        if int(part) < count:
            indices.append(int(part))
    return indices
