"""StepStats: values queued by the helpers reach the host in one batched transfer per step."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dfx_support import histogram, latest  # noqa: E402

from otel_rl import dfx  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402

# Every way a torch tensor's data reaches the host (or forces the device to finish).
_HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "__array__")


@contextlib.contextmanager
def count_host_reads():
    """Count, on this thread only, every call that moves a tensor's data to the host."""
    calls: Counter[str] = Counter()
    main = threading.get_ident()
    originals = {name: getattr(torch.Tensor, name) for name in _HOST_READS}

    def wrap(name, fn):
        def counted(self, *args, **kwargs):
            if threading.get_ident() == main:
                calls[name] += 1
            return fn(self, *args, **kwargs)

        return counted

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def test_values_come_back_in_order_as_floats_and_arrays(stats):
    got = []
    stats.defer([torch.tensor(2.5), torch.tensor([1, 2, 3]), 7, np.array([0.5, 1.5]), np.float32(4.0)], got.extend)
    stats.defer([torch.ones(2, 2)], got.extend)
    assert stats.pending == 2
    assert stats.flush() == 1  # every torch value is on the CPU device: one read
    assert stats.pending == 0 and stats.transfers == 1
    assert got[0] == 2.5 and isinstance(got[0], float)
    np.testing.assert_array_equal(got[1], [1.0, 2.0, 3.0])
    assert got[2] == 7.0 and got[4] == 4.0
    np.testing.assert_array_equal(got[3], [0.5, 1.5])
    np.testing.assert_array_equal(got[5], [1.0, 1.0, 1.0, 1.0])  # a [2, 2] tensor arrives flat
    assert stats.flush() == 0  # nothing queued: no read at all


def test_a_failing_callback_is_reported_and_the_others_still_record(stats, tel, caplog):
    def boom(_values):
        raise RuntimeError("bad callback")

    stats.defer([torch.tensor(1.0)], boom)
    dfx.response_mask_ratio(stats, "train_step", torch.tensor([[1, 0], [1, 1]]))
    stats.flush()
    assert latest(tel, M.RL_RESPONSE_MASK_RATIO, {A.RL_STAGE: "train_step"}) == 0.75
    assert any("bad callback" in r.getMessage() for r in caplog.records)


def one_step_of_every_tensor_helper(stats: dfx.StepStats) -> None:
    """A GRPO step's worth of DFX on CPU tensors: every helper that reads tensors, once."""
    g = torch.Generator().manual_seed(0)
    batch, width = 64, 16
    mask = (torch.arange(width)[None, :] < torch.randint(1, width + 1, (batch, 1), generator=g)).long()
    logp = -torch.rand(batch, width, generator=g)
    adv = torch.randn(batch, width, generator=g) * mask
    rewards = torch.randn(batch, generator=g)
    ids = torch.arange(batch)
    ledger = dfx.ShapeLedger(stats)
    timer = dfx.ComputeTimer(stats, "train_step", device="cpu")

    dfx.count_nonfinite(stats, {"old_log_probs": logp, "advantages": adv, "rewards": rewards})
    dfx.response_mask_ratio(stats, "compute_log_probs", mask)
    dfx.token_alignment(stats, "compute_log_probs", mask, logprobs=logp, response_lengths=mask.sum(-1))
    dfx.id_alignment(stats, "train_step", ids, torch.arange(batch))
    for stage in ("compute_log_probs", "train_step"):
        ledger.record(dfx.batch_id(3), stage, {"response_mask": mask, "old_log_probs": logp}, sample_ids=ids)
    dfx.logprob_stage(stats, "compute_log_probs", logp, mask, micro_batch_tokens=[mask[:32].sum(), mask[32:].sum()])
    with timer.op("forward"):
        loss = (logp * adv).sum()
    dfx.grad_norm(stats, loss.abs().sqrt())
    dfx.losses(stats, {"policy": loss, "kl": loss * 0.1, "total": loss * 1.1})
    dfx.lengths(stats, prompt_lengths=torch.full((batch,), 5), response_lengths=mask.sum(-1), max_response_length=width)
    dfx.clipped_ratio(stats, mask.sum(-1) == width)
    dfx.aborted_ratio(stats, torch.zeros(batch, dtype=torch.bool))
    dfx.reward_distribution(stats, rewards)
    dfx.throughput(stats, seconds=0.5, tokens=mask.sum(), samples=batch)
    dfx.mfu(stats, dfx.ModelSpec(1_000_000, 4, 256), mask.sum(-1) + 5, 0.5, peak_flops=1e12)
    dfx.policy_lag(stats, torch.full((batch,), 2), 3, max_lag=1)
    dfx.rank_balance(stats, tokens=[mask.sum(), mask.sum() + 3], active_time=[1.0, 1.2], step_time=1.5)


def test_a_whole_step_of_helpers_reads_the_host_once(stats, tel):
    with tel.step(3):
        with count_host_reads() as calls:
            one_step_of_every_tensor_helper(stats)
            assert sum(calls.values()) == 0, calls  # the helpers only queue device values
            assert stats.flush() == 1
    # exactly one batched read: .cpu() of the concatenated buffer and its zero-copy .numpy() view
    assert calls == Counter({"cpu": 1, "numpy": 1}), calls
    # and the step's metrics are all there
    assert latest(tel, M.RL_RESPONSE_MASK_RATIO, {A.RL_STAGE: "compute_log_probs"}) is not None
    assert latest(tel, M.RL_MFU, {A.RL_MODEL_ROLE: "actor"}) is not None
    assert latest(tel, M.RL_STRAGGLER_RANK) == 1.0
    assert histogram(tel, M.RL_SAMPLE_REWARD)[0] == 64
    assert histogram(tel, M.RL_LOGPROB_MICRO_BATCH_TOKENS, {A.RL_STAGE: "compute_log_probs"})[0] == 2
    assert histogram(tel, M.RL_COMPUTE_DURATION, {A.RL_COMPUTE_OP: "forward", A.RL_STAGE: "train_step"})[0] == 1
    assert latest(tel, M.RL_SHAPE_LEDGER_MISMATCHES, {A.RL_STAGE: "train_step"}) == 0.0
    assert latest(tel, M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: "nan"}) is None


def test_numpy_and_lists_need_no_transfer(stats, tel):
    dfx.count_nonfinite(stats, {"scores": np.array([1.0, np.nan, np.inf, -np.inf])})
    dfx.response_mask_ratio(stats, "train_step", [[1, 1, 0, 0]])
    dfx.reward_distribution(stats, [0.0, 1.0, 1.0, 0.0])
    assert stats.flush() == 0
    assert latest(tel, M.RL_TENSOR_NONFINITE, {A.RL_TENSOR_NAME: "scores", A.RL_NONFINITE_KIND: "inf"}) == 2.0
    assert latest(tel, M.RL_RESPONSE_MASK_RATIO, {A.RL_STAGE: "train_step"}) == 0.5
    assert latest(tel, M.RL_REWARD, {A.RL_STATISTIC: "std"}) == 0.5
