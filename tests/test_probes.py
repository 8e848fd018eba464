"""Probes: the absent path with the real libraries on this GPU-less machine, and the present path
through stand-ins that mirror the real call signatures of torch.cuda and pynvml (no GPU here)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_rl._sdk.sources.probes import CudaMemoryProbe, NvmlProbe, ProcessProbe, visible_device_indices
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

GIB = 2**30


class StandInCuda:
    """Stand-in for torch.cuda (signatures as in torch/cuda/memory.py and torch/cuda/__init__.py)."""

    def __init__(self) -> None:
        self.allocated = 3 * GIB
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 1

    def get_device_properties(self, device: int) -> SimpleNamespace:
        self.calls.append("get_device_properties")
        return SimpleNamespace(total_memory=80 * GIB)

    def memory_allocated(self, device: int | None = None) -> int:
        return self.allocated

    def memory_reserved(self, device: int | None = None) -> int:
        return 4 * GIB

    def max_memory_allocated(self, device: int | None = None) -> int:
        return 6 * GIB

    def max_memory_reserved(self, device: int | None = None) -> int:
        return 8 * GIB

    def synchronize(self, device: int | None = None) -> None:  # must never be called by a probe
        raise AssertionError("a probe synchronized the device")


class StandInNvml:
    """Stand-in for pynvml (nvidia-ml-py): the functions NvmlProbe calls, with their real units."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        self.shutdown_called = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle{index}"

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=87, memory=40)  # percent

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(used=10 * GIB, total=80 * GIB, free=70 * GIB)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 350_000  # milliwatts

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        if handle == "handle1":
            raise RuntimeError("device fell off the bus")
        return 61


def test_cuda_probe_is_absent_without_torch_cuda_and_says_so_once(caplog):
    probe = CudaMemoryProbe()
    with caplog.at_level(logging.INFO, logger="otel_rl"):
        assert probe.snapshot() is None
        assert probe.snapshot() is None
    assert len([r for r in caplog.records if "GPU memory snapshots are absent" in r.getMessage()]) == 1


def test_cuda_probe_with_real_cpu_torch_stays_absent():
    torch = pytest.importorskip("torch")
    assert not torch.cuda.is_initialized()
    assert CudaMemoryProbe().snapshot() is None


def test_cuda_probe_reads_allocator_counters_without_synchronizing():
    cuda = StandInCuda()
    probe = CudaMemoryProbe(cuda=cuda)
    snap = probe.snapshot()
    assert snap is not None and snap.device == "1" and snap.total == 80 * GIB
    assert snap.by_kind() == {"allocated": 3 * GIB, "reserved": 4 * GIB, "max_allocated": 6 * GIB, "max_reserved": 8 * GIB}
    probe.snapshot()
    assert cuda.calls.count("get_device_properties") == 1  # the device total is read once


def test_stage_with_a_gpu_exports_roll_memory_keys_gauges_and_events(make_telemetry):
    tel = make_telemetry()
    tel._cuda_probe = CudaMemoryProbe(cuda=StandInCuda())
    with tel.step(0):
        with tel.stage("train_step", cluster="actor_train", offload=True) as st:
            with st.phase("execute"):
                pass
    tel.flush()
    keys = st.metrics
    assert keys["memory/actor_train/train_step/start/offload/allocated/1"] == 3.0  # GiB, as ROLL logs it
    assert keys["memory/actor_train/train_step/end/onload/max_reserved/1"] == 8.0
    assert keys["memory/actor_train/train_step/end/onload/max_allocated_frac/1"] == pytest.approx(6 / 80)
    assert len([k for k in keys if k.startswith("memory/actor_train/")]) == 4 * 4 + 2
    attrs = {
        A.RL_STAGE: "train_step",
        A.RL_CLUSTER: "actor_train",
        A.RL_MEMORY_WHEN: "end",
        A.RL_MEMORY_STATE: "onload",
        A.RL_MEMORY_KIND: "max_reserved",
        A.HW_ID: "1",
    }
    assert tel.latest(M.RL_GPU_MEMORY_USAGE, attrs) == 8 * GIB
    assert tel.latest(M.RL_GPU_MEMORY_UTILIZATION, attrs) == pytest.approx(0.1)
    # Every logged ROLL key resolves onto the very series the stage already set.
    for key, value in keys.items():
        res = tel.resolve(key)
        assert not res.fallback, key
        if res.metric != M.RL_STAGE_DURATION:
            exported = res.transform(value) if res.transform else value
            assert tel.latest(res.metric, dict(res.attributes)) == pytest.approx(exported), key


def test_nvml_probe_is_absent_on_a_machine_without_the_driver(caplog):
    pytest.importorskip("pynvml")
    probe = NvmlProbe()
    with caplog.at_level(logging.INFO, logger="otel_rl"):
        started = probe.start()
    if started:  # pragma: no cover - only on a machine with an NVIDIA driver
        pytest.skip("an NVIDIA driver is present here")
    assert probe.status.startswith("absent") and probe.callbacks() == {}
    assert any("NVML unavailable" in r.getMessage() for r in caplog.records)


def test_nvml_probe_reports_devices_in_registry_units_and_skips_a_failing_read(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = StandInNvml()
    probe = NvmlProbe(nvml=nvml)
    assert probe.start() and probe.status == "present: 2 device(s)"
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    for name, callback in probe.callbacks().items():
        meter.create_observable_gauge(name, callbacks=[callback])
    data = reader.get_metrics_data()
    points = {
        (m.name, p.attributes[A.HW_ID]): p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    }
    assert points[(M.HW_GPU_UTILIZATION, "0")] == pytest.approx(0.87)
    assert points[(M.HW_GPU_MEMORY_USAGE, "1")] == 10 * GIB and points[(M.HW_GPU_MEMORY_LIMIT, "0")] == 80 * GIB
    assert points[(M.HW_POWER, "0")] == pytest.approx(350.0)
    assert points[(M.HW_TEMPERATURE, "0")] == 61 and (M.HW_TEMPERATURE, "1") not in points
    probe.stop()
    assert nvml.shutdown_called


@pytest.mark.parametrize(
    ("visible", "expected"), [(None, [0, 1, 2, 3]), ("2,0", [2, 0]), ("", []), ("GPU-uuid", [0, 1, 2, 3]), ("1,9", [1])]
)
def test_visible_devices(monkeypatch, visible, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_device_indices(4) == expected


def test_process_probe_reads_real_memory_and_cpu():
    probe = ProcessProbe()
    rss, vms = probe.memory()
    assert 0 < rss <= vms
    callbacks = probe.callbacks()
    assert set(callbacks) == {M.PROCESS_MEMORY_USAGE, M.PROCESS_MEMORY_VIRTUAL, M.PROCESS_CPU_UTILIZATION}
    cpu = list(callbacks[M.PROCESS_CPU_UTILIZATION](None))[0].value
    assert 0.0 <= cpu <= 1.0
