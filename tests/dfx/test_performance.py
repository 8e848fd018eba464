"""Performance helpers: throughput, the FLOPs formula and MFU, peak table, SM activity, bubble."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from dfx_support import latest  # noqa: E402

from otel_rl import dfx  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402


def test_throughput_from_counts_and_seconds(stats, tel):
    dfx.throughput(stats, seconds=2.0, tokens=torch.tensor([[1, 1, 0], [1, 0, 0]]).sum() * 1000, samples=64)
    stats.flush()
    assert latest(tel, M.RL_THROUGHPUT_TOKENS) == 1500.0
    assert latest(tel, M.RL_THROUGHPUT_SAMPLES) == 32.0


def test_flops_formula_by_hand():
    spec = dfx.ModelSpec(num_params=7_000_000_000, num_layers=32, hidden_size=4096)
    seq = [1024, 2048]  # T = 3072 tokens, sum s^2 = 1024^2 + 2048^2 = 5_242_880
    train = 6 * 7e9 * 3072 + 12 * 32 * 4096 * 5_242_880
    assert dfx.model_flops(spec, 3072, 5_242_880) == pytest.approx(train)
    assert dfx.model_flops(spec, 3072, 5_242_880, training=False) == pytest.approx(2 * 7e9 * 3072 + 4 * 32 * 4096 * 5_242_880)
    assert train == pytest.approx(sum(s * (6 * 7e9 + 12 * 32 * 4096 * s) for s in seq))  # "6N + 12*L*H*S per token"


def test_mfu_for_a_known_config_on_a_known_device(stats, tel):
    spec = dfx.ModelSpec(num_params=7_000_000_000, num_layers=32, hidden_size=4096)
    seq_lens = torch.tensor([1024, 2048] * 64)  # 128 sequences, T = 196_608 tokens
    flops = 6 * 7e9 * 196_608 + 12 * 32 * 4096 * (64 * 5_242_880)
    dfx.mfu(stats, spec, seq_lens, seconds=1.5, device_name="NVIDIA H100 80GB HBM3", num_devices=8)
    dfx.mfu(stats, spec, seq_lens.tolist(), seconds=3.0, role="critic", peak_flops=312e12, num_devices=8)
    stats.flush()
    assert latest(tel, M.RL_MFU, {A.RL_MODEL_ROLE: "actor"}) == pytest.approx(flops / (1.5 * 989.4e12 * 8))
    assert latest(tel, M.RL_MFU, {A.RL_MODEL_ROLE: "critic"}) == pytest.approx(flops / (3.0 * 312e12 * 8))


def test_mfu_without_a_known_peak_records_nothing(stats, tel, monkeypatch):
    monkeypatch.delenv("OTEL_RL_PEAK_FLOPS", raising=False)
    dfx.mfu(stats, dfx.ModelSpec(1000, 1, 8), [4], 1.0, device_name="Some New Accelerator")
    stats.flush()
    assert latest(tel, M.RL_MFU, {A.RL_MODEL_ROLE: "actor"}) is None
    monkeypatch.setenv("OTEL_RL_PEAK_FLOPS", "1e6")  # an override for devices outside the table
    dfx.mfu(stats, dfx.ModelSpec(1000, 1, 8), [4], 1.0, device_name="Some New Accelerator")
    stats.flush()
    assert latest(tel, M.RL_MFU, {A.RL_MODEL_ROLE: "actor"}) == pytest.approx((6 * 1000 * 4 + 12 * 8 * 16) / 1e6)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A800-SXM4-80GB", 312e12),
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H800", 989.4e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA H20", 148e12),  # not H200
        ("NVIDIA L40S", 362.05e12),
        ("NVIDIA L40", 181.05e12),  # not L40S
        ("NVIDIA GeForce RTX 4090", 165.2e12),
        ("Ascend910B2", 354e12),
        ("Tesla T4", None),
        (None, None),
    ],
)
def test_peak_table_lookup(name, peak):
    assert dfx.peak_flops_for(name) == peak


def test_measured_peak_is_positive_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    assert dfx.measure_peak_flops("cpu", size=128, repeat=2) > 1e6
    assert torch.equal(state, torch.random.get_rng_state())


# --------------------------------------------------------------------------------------------
# SM activity


class FakeGpmNvml:
    """Stand-in for pynvml's GPM API (nvmlGpmQueryDeviceSupport, nvmlGpmSampleAlloc / Get / Free,
    c_nvmlGpmMetricsGet_t, nvmlGpmMetricsGet with NVML_GPM_METRIC_SM_UTIL in percent), with the
    real pynvml names; GPU 1 does not support GPM."""

    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2

    class _Metric:
        metricId = 0
        value = 0.0

    class c_nvmlGpmMetricsGet_t:  # noqa: N801 - pynvml's name
        def __init__(self):
            self.metrics = [FakeGpmNvml._Metric()]

    def __init__(self, sm_util_percent):
        self.util = sm_util_percent
        self.freed = 0

    def nvmlInit(self):
        pass  # noqa: E704

    def nvmlDeviceGetCount(self):
        return 2  # noqa: E704

    def nvmlDeviceGetHandleByIndex(self, i):
        return i  # noqa: E704

    def nvmlGpmQueryDeviceSupport(self, handle):
        return type("Support", (), {"isSupportedDevice": int(handle == 0)})()

    def nvmlGpmSampleAlloc(self):
        return {}  # noqa: E704

    def nvmlGpmSampleGet(self, handle, sample):
        sample["device"] = handle

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1

    def nvmlGpmMetricsGet(self, query):
        assert query.metrics[0].metricId == self.NVML_GPM_METRIC_SM_UTIL and query.numMetrics == 1
        assert query.sample1["device"] == query.sample2["device"] == 0
        query.metrics[0].value = self.util


def test_sm_activity_from_nvml_gpm(stats, tel, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeGpmNvml(sm_util_percent=73.0)
    probe = dfx.SmActivityProbe(nvml=nvml)
    probe.begin()
    assert probe.record(stats) == {"0": 0.73}
    assert latest(tel, M.RL_SM_ACTIVITY, {A.HW_ID: "0"}) == 0.73
    assert latest(tel, M.RL_SM_ACTIVITY, {A.HW_ID: "1"}) is None  # no GPM on that one
    assert nvml.freed == 2 and probe.status.startswith("present")
    assert probe.record(stats) == {}  # no begin(): no window to measure


def test_sm_activity_is_absent_without_nvml(stats, tel):
    class NoDriver:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    probe = dfx.SmActivityProbe(nvml=NoDriver())
    probe.begin()
    assert probe.record(stats) == {} and probe.status.startswith("absent")
    assert latest(tel, M.RL_SM_ACTIVITY, {A.HW_ID: "0"}) is None
    dfx.record_sm_activity(stats, {"3": 0.5})  # e.g. from DCGM's DCGM_FI_PROF_SM_ACTIVE
    assert latest(tel, M.RL_SM_ACTIVITY, {A.HW_ID: "3"}) == 0.5


# --------------------------------------------------------------------------------------------
# Pipeline bubble


def test_bubble_of_a_hand_drawn_timeline(stats, tel):
    # step [0, 10): rollout on actor_infer 0-4 and 8-9; actor_train 4-8 with an overlapping pair
    # 5-7 / 6-8 (union 4-8); reward 4-5. Busy: infer 5 s, train 4 s, reward 1 s of 10.
    tl = dfx.StepTimeline()
    tl.begin(at=0.0)
    for cluster, start, end in [
        ("actor_infer", 0, 4),
        ("actor_train", 4, 7),
        ("reward", 4, 5),
        ("actor_train", 5, 7),
        ("actor_train", 6, 8),
        ("actor_infer", 8, 9),
    ]:
        tl.add(cluster, start, end)
    assert tl.busy_seconds("actor_train") == 4.0
    assert tl.busy_seconds() == 9.0  # any cluster busy: 0-9
    ratios = dfx.pipeline_bubble(stats, tl, end=10.0)
    assert ratios == pytest.approx({"actor_infer": 0.5, "actor_train": 0.6, "reward": 0.9})
    assert latest(tel, M.RL_PIPELINE_BUBBLE_RATIO, {A.RL_CLUSTER: "actor_train"}) == pytest.approx(0.6)
    # intervals are clipped to the window asked for
    assert tl.bubble_ratios(start=2.0, end=6.0) == pytest.approx({"actor_infer": 0.5, "actor_train": 0.5, "reward": 0.75})


def test_timeline_reads_the_cluster_from_real_stages(stats, tel):
    tl = dfx.StepTimeline()
    with tel.step(1):
        tl.begin()
        with tl.track(tel.stage("generate", cluster="actor_infer")) as st:
            time.sleep(0.02)
        with tl.track(tel.stage("advantage")):  # driver work: no cluster, not in the bubble
            time.sleep(0.02)
        ratios = dfx.pipeline_bubble(stats, tl)
    assert st.name == "generate" and tl.clusters == ["actor_infer"]
    assert 0.3 < ratios["actor_infer"] < 0.7
    assert tl.busy_seconds("actor_infer") == pytest.approx(st.elapsed, rel=1e-9)  # the stage's own interval
