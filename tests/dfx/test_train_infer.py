"""The training-inference mismatch from two log-prob tensors: values checked by hand, torch and
numpy alike, non-finite tokens counted and left out, and the demo's own engine-vs-trainer gap."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dfx_support import latest  # noqa: E402

from otel_rl import dfx  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402

NAN = float("nan")
TRAIN = [[-1.0, -2.0, NAN, -0.5, -3.0]]
INFER = [[-1.5, -2.0, -1.0, -0.5, -9.0]]
MASK = [[1, 1, 1, 1, 0]]  # the last token is padding: its large gap must not count


def by(statistic: str) -> dict[str, str]:
    return {A.RL_MODEL_ROLE: "actor", A.RL_STATISTIC: statistic}


@pytest.mark.parametrize("as_tensor", [torch.tensor, np.array], ids=["torch", "numpy"])
def test_each_statistic_matches_the_hand_computed_value(stats, tel, as_tensor):
    dfx.train_infer_mismatch(stats, as_tensor(TRAIN), as_tensor(INFER), as_tensor(MASK))
    stats.flush()
    # finite masked tokens: log-ratios train - infer = 0.5, 0, 0 (the NaN one is counted, not used)
    gaps = [0.5, 0.0, 0.0]
    ratios = [math.exp(g) for g in gaps]
    assert latest(tel, M.RL_TRAIN_INFER_NONFINITE_RATIO, {A.RL_MODEL_ROLE: "actor"}) == pytest.approx(1 / 4)
    assert latest(tel, M.RL_TRAIN_INFER_LOGPROB_ABS_DIFF, by("mean")) == pytest.approx(0.5 / 3)
    assert latest(tel, M.RL_TRAIN_INFER_LOGPROB_ABS_DIFF, by("max")) == pytest.approx(0.5)
    assert latest(tel, M.RL_TRAIN_INFER_LOGPROB_ABS_DIFF, by("std")) == pytest.approx(float(np.std(gaps)), rel=1e-5)
    prob_gap = math.exp(-1.0) - math.exp(-1.5)
    assert latest(tel, M.RL_TRAIN_INFER_PROB_ABS_DIFF, by("max")) == pytest.approx(prob_gap, rel=1e-6)
    assert latest(tel, M.RL_TRAIN_INFER_PROB_ABS_DIFF, by("mean")) == pytest.approx(prob_gap / 3, rel=1e-6)
    k1 = latest(tel, M.RL_TRAIN_INFER_KL, {A.RL_MODEL_ROLE: "actor", A.RL_KL_ESTIMATOR: "k1"})
    k3 = latest(tel, M.RL_TRAIN_INFER_KL, {A.RL_MODEL_ROLE: "actor", A.RL_KL_ESTIMATOR: "k3"})
    assert k1 == pytest.approx(-0.5 / 3)  # mean of log pi_infer - log pi_train: signed
    assert k3 == pytest.approx(sum(r - 1 - g for r, g in zip(ratios, gaps)) / 3, rel=1e-6)
    assert latest(tel, M.RL_TRAIN_INFER_IMPORTANCE_RATIO, by("mean")) == pytest.approx(sum(ratios) / 3, rel=1e-6)
    assert latest(tel, M.RL_TRAIN_INFER_IMPORTANCE_RATIO, by("min")) == pytest.approx(1.0)
    assert latest(tel, M.RL_TRAIN_INFER_IMPORTANCE_RATIO, by("max")) == pytest.approx(math.exp(0.5), rel=1e-6)


def test_a_total_mismatch_reads_at_the_bound_instead_of_overflowing(stats, tel):
    dfx.train_infer_mismatch(stats, torch.tensor([[-0.01, -1.0]]), torch.tensor([[-90.0, -1.0]]), role="critic")
    stats.flush()
    largest = latest(tel, M.RL_TRAIN_INFER_IMPORTANCE_RATIO, {A.RL_MODEL_ROLE: "critic", A.RL_STATISTIC: "max"})
    assert largest == pytest.approx(math.exp(dfx.train_infer.LOG_RATIO_BOUND), rel=1e-5)
    assert math.isfinite(latest(tel, M.RL_TRAIN_INFER_KL, {A.RL_MODEL_ROLE: "critic", A.RL_KL_ESTIMATOR: "k3"}))


def test_a_batch_with_no_finite_token_records_only_its_share(stats, tel):
    dfx.train_infer_mismatch(stats, torch.tensor([[NAN, float("inf")]]), torch.tensor([[-1.0, -1.0]]))
    stats.flush()
    assert latest(tel, M.RL_TRAIN_INFER_NONFINITE_RATIO, {A.RL_MODEL_ROLE: "actor"}) == 1.0
    assert latest(tel, M.RL_TRAIN_INFER_KL, {A.RL_MODEL_ROLE: "actor", A.RL_KL_ESTIMATOR: "k1"}) is None


def test_shapes_that_differ_are_refused_naming_both(stats):
    with pytest.raises(ValueError, match=r"train_logprobs \(2, 3\) and infer_logprobs \(2, 4\)"):
        dfx.train_infer_mismatch(stats, np.zeros((2, 3)), np.zeros((2, 4)))


def test_the_values_stay_on_the_device_until_the_steps_one_transfer(stats):
    dfx.train_infer_mismatch(stats, torch.tensor(TRAIN), torch.tensor(INFER), torch.tensor(MASK))
    assert stats.pending == 1
    assert stats.flush() == 1  # one batched read for the device the tensors are on
