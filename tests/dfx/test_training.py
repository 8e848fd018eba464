"""Log-prob stage and actor update: shape, micro-batch tokens, compute timers, grad norm, losses."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from dfx_support import histogram, latest  # noqa: E402

from otel_rl import dfx  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402


def test_logprob_stage_shape_mask_ratio_and_micro_batch_tokens(stats, tel):
    logp = torch.zeros(6, 10)
    mask = torch.zeros(6, 10, dtype=torch.long)
    mask[:, :4] = 1  # 24 of 60
    attention = torch.ones(6, 16, dtype=torch.long)
    micro = [attention[:2].sum(), attention[2:4].sum(), 16]  # device scalars or numbers
    dfx.logprob_stage(stats, "compute_ref_log_probs", logp, mask, micro_batch_tokens=micro)
    stats.flush()
    stage = {A.RL_STAGE: "compute_ref_log_probs"}
    assert latest(tel, M.RL_LOGPROB_SHAPE, {**stage, A.RL_TENSOR_DIM: 0}) == 6
    assert latest(tel, M.RL_LOGPROB_SHAPE, {**stage, A.RL_TENSOR_DIM: 1}) == 10
    assert latest(tel, M.RL_RESPONSE_MASK_RATIO, stage) == 0.4
    assert histogram(tel, M.RL_LOGPROB_MICRO_BATCH_TOKENS, stage) == (3, 32 + 32 + 16)


def test_grad_norm_and_loss_decomposition(stats, tel):
    dfx.grad_norm(stats, torch.tensor(3.5))
    dfx.grad_norm(stats, 0.25, role="critic")
    dfx.losses(stats, {"policy": torch.tensor(0.5), "kl": torch.tensor(0.02), "entropy": 1.3, "total": torch.tensor(0.52)})
    stats.flush()
    assert latest(tel, M.RL_GRAD_NORM, {A.RL_MODEL_ROLE: "actor"}) == 3.5
    assert latest(tel, M.RL_GRAD_NORM, {A.RL_MODEL_ROLE: "critic"}) == 0.25
    loss = {t: latest(tel, M.RL_LOSS, {A.RL_MODEL_ROLE: "actor", A.RL_LOSS_TYPE: t}) for t in ("policy", "kl", "entropy", "total")}
    assert loss == pytest.approx({"policy": 0.5, "kl": 0.02, "entropy": 1.3, "total": 0.52})
    with pytest.raises(ValueError, match="not rl.loss.type"):
        dfx.losses(stats, {"pg": 1.0})


def test_compute_timer_on_cpu_sums_each_op_over_the_step(stats, tel):
    timer = dfx.ComputeTimer(stats, "train_step", device="cpu")
    for _ in range(2):  # two micro batches
        with timer.op("forward"):
            time.sleep(0.02)
        with timer.op("backward"):
            time.sleep(0.03)
    with timer.op("optimizer_step"):
        time.sleep(0.01)
    with timer.op("communication"):
        time.sleep(0.01)
    stats.flush()
    totals = timer.last_totals
    assert totals["forward"] == pytest.approx(0.04, abs=0.02) and totals["backward"] == pytest.approx(0.06, abs=0.02)
    count, seconds = histogram(tel, M.RL_COMPUTE_DURATION, {A.RL_COMPUTE_OP: "backward", A.RL_STAGE: "train_step"})
    assert count == 1 and seconds == totals["backward"]  # one measurement per op per step
    assert latest(tel, M.RL_RANK_COMMUNICATION_TIME, {A.RL_MEASURED_RANK: 0}) == totals["communication"]
    with pytest.raises(ValueError):
        timer.op("sleep").__enter__()


class FakeCudaEvent:
    """Stand-in for torch.cuda.Event(enable_timing=True): record() stamps a fake device clock,
    query() says whether the device reached it, elapsed_time() is in milliseconds."""

    clock = 0.0
    device_done_until = 0.0
    waits = 0

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.at = None

    def record(self, stream=None):
        self.at = FakeCudaEvent.clock

    def query(self):
        return self.at <= FakeCudaEvent.device_done_until

    def elapsed_time(self, end):
        assert self.query() and end.query(), "reading an unfinished event would block"
        return (end.at - self.at) * 1000.0

    def synchronize(self):
        FakeCudaEvent.waits += 1


def test_compute_timer_with_cuda_events_never_waits(stats, tel, monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    FakeCudaEvent.clock = FakeCudaEvent.device_done_until = 0.0
    timer = dfx.ComputeTimer(stats, "train_step", device="cuda")
    assert timer.use_events

    def op(name, seconds):
        with timer.op(name):
            FakeCudaEvent.clock += seconds

    op("forward", 0.5)
    op("backward", 1.0)  # step 1: queued on the device until t = 1.5
    stats.flush()  # the device is behind: nothing recorded, nothing waited for
    assert timer.last_totals == {} and histogram(tel, M.RL_COMPUTE_DURATION, {A.RL_COMPUTE_OP: "forward", A.RL_STAGE: "train_step"}) is None
    op("forward", 0.25)  # step 2
    FakeCudaEvent.device_done_until = 1.6  # step 1 done, step 2 still running
    stats.flush()
    assert timer.last_totals == pytest.approx({"forward": 0.5, "backward": 1.0})
    FakeCudaEvent.device_done_until = 10.0
    stats.flush()
    assert timer.last_totals == pytest.approx({"forward": 0.25})
    assert histogram(tel, M.RL_COMPUTE_DURATION, {A.RL_COMPUTE_OP: "forward", A.RL_STAGE: "train_step"}) == pytest.approx((2, 0.75))
    assert FakeCudaEvent.waits == 0
