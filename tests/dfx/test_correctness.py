"""Correctness helpers against hand-computed values: NaN/Inf, mask ratio, alignment, shape ledger."""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dfx_support import latest  # noqa: E402
from opentelemetry.semconv.attributes.exception_attributes import EXCEPTION_MESSAGE  # noqa: E402

from otel_rl import dfx  # noqa: E402
from otel_rl.dfx import _tensors as T  # noqa: E402
from otel_rl.runs.folder import read_spans  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402

NAN, INF = float("nan"), float("inf")


def nonfinite(tel, name, kind):
    return latest(tel, M.RL_TENSOR_NONFINITE, {A.RL_TENSOR_NAME: name, A.RL_NONFINITE_KIND: kind})


def test_nonfinite_counts_per_tensor_and_kind_and_accumulate_over_steps(stats, tel):
    logp = torch.tensor([[NAN, -1.0, INF], [-INF, NAN, NAN]])  # 3 NaN, 2 Inf
    adv = np.array([0.0, np.inf, 1.0])  # 0 NaN, 1 Inf
    ids = torch.tensor([1, 2, 3])  # integers cannot hold NaN: counted as 0 without a pass
    dfx.count_nonfinite(stats, {"old_log_probs": logp, "advantages": adv, "input_ids": ids})
    stats.flush()
    assert (nonfinite(tel, "old_log_probs", "nan"), nonfinite(tel, "old_log_probs", "inf")) == (3.0, 2.0)
    assert (nonfinite(tel, "advantages", "nan"), nonfinite(tel, "advantages", "inf")) == (0.0, 1.0)
    assert (nonfinite(tel, "input_ids", "nan"), nonfinite(tel, "input_ids", "inf")) == (0.0, 0.0)
    dfx.count_nonfinite(stats, {"old_log_probs": torch.tensor([NAN])})  # a counter: the next step adds
    stats.flush()
    assert nonfinite(tel, "old_log_probs", "nan") == 4.0


def test_response_mask_ratio_per_stage(stats, tel):
    dfx.response_mask_ratio(stats, "compute_log_probs", torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]))  # 4 of 8
    dfx.response_mask_ratio(stats, "train_step", torch.tensor([[True, True, True], [True, True, False]]))  # 5 of 6
    stats.flush()
    assert latest(tel, M.RL_RESPONSE_MASK_RATIO, {A.RL_STAGE: "compute_log_probs"}) == 0.5
    assert latest(tel, M.RL_RESPONSE_MASK_RATIO, {A.RL_STAGE: "train_step"}) == pytest.approx(5 / 6)


MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])  # row sums 3, 2, 1


@pytest.mark.parametrize(
    ("kwargs", "misaligned"),
    [
        ({"logprobs": torch.zeros(3, 4), "response_lengths": [3, 2, 1]}, 0),
        ({"response_lengths": torch.tensor([3, 3, 1])}, 1),  # engine says 3 tokens, mask keeps 2
        ({"logprobs": [np.zeros(3), np.zeros(2), np.zeros(2)]}, 1),  # per-sample log-probs: the third has 2
        ({"logprobs": [np.zeros(3), np.zeros(1), np.zeros(2)], "response_lengths": [3, 2, 2]}, 2),  # rows 1 and 2
        ({"logprobs": torch.zeros(3, 5)}, 3),  # padded to another width: every sample misaligned
        ({"response_lengths": [3, 2]}, 3),  # a sample missing: the whole batch
    ],
)
def test_token_alignment(stats, tel, kwargs, misaligned):
    dfx.token_alignment(stats, "train_step", MASK, **kwargs)
    stats.flush()
    assert latest(tel, M.RL_BATCH_TOKEN_MISALIGNED, {A.RL_STAGE: "train_step"}) == misaligned


@pytest.mark.parametrize(
    ("ids", "expected", "misaligned"),
    [
        (torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2, 3]), 0),
        (torch.tensor([0, 2, 1, 3]), torch.tensor([0, 1, 2, 3]), 2),  # two samples swapped
        (np.array([0, 0, 1, 1]), np.array([0, 0, 1, 2]), 1),  # GRPO group ids
        (["a", "b", "c"], ["a", "b", "c", "d"], 1),  # uuids; one sample dropped
        (["a", "x", "c"], ["a", "b", "c"], 1),
    ],
)
def test_id_alignment(stats, tel, ids, expected, misaligned):
    dfx.id_alignment(stats, "train_step", ids, expected)
    stats.flush()
    assert latest(tel, M.RL_BATCH_ID_MISALIGNED, {A.RL_STAGE: "train_step"}) == misaligned


def test_checksum_by_hand_on_both_backends():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    # rows 3, 7 -> 1*3 + 2*7 = 17; columns 4, 6 -> 1*4 + 2*6 = 16
    assert T.checksum(x) == 33.0
    assert float(T.checksum(torch.tensor(x, dtype=torch.float32))) == 33.0
    assert T.checksum(x[::-1].copy()) != T.checksum(x)  # reordered samples
    assert T.checksum(np.array([[0.0, 1.0], [3.0, 4.0]])) != T.checksum(np.array([[1.0, 0.0], [3.0, 4.0]]))  # shift
    assert float(T.checksum(torch.arange(6))) == 1 * 0 + 2 * 1 + 3 * 2 + 4 * 3 + 5 * 4 + 6 * 5 + 15  # 1-D: [6, 1]
    assert T.checksum(np.zeros((0, 3))) == 0.0


def test_ledger_clean_batch_reports_zero_and_checksums(stats, tel):
    ledger = dfx.ShapeLedger(stats)
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    for stage in ("generate", "compute_log_probs", "train_step"):
        ledger.record(dfx.batch_id(7), stage, {"input_ids": ids.clone(), "response_mask": mask}, sample_ids=[0, 1])
    stats.flush()
    for stage in ("generate", "compute_log_probs", "train_step"):
        assert latest(tel, M.RL_SHAPE_LEDGER_MISMATCHES, {A.RL_STAGE: stage}) == 0.0
        assert latest(tel, M.RL_BATCH_ID_MISALIGNED, {A.RL_STAGE: stage}) == 0.0
        # mask rows 2, 1 -> 2 + 2 = 4; columns 2, 1, 0 -> 2 + 2 + 0 = 4
        assert latest(tel, M.RL_TENSOR_CHECKSUM, {A.RL_TENSOR_NAME: "response_mask", A.RL_STAGE: stage}) == 8.0
    assert not ledger.mismatches


def test_ledger_names_the_tensor_and_both_shapes(stats, tel, caplog):
    ledger = dfx.ShapeLedger(stats)
    logp = torch.zeros(4, 6)
    with tel.step(1), tel.stage("train_step", cluster="actor_train"):
        ledger.record(dfx.batch_id(1, 0), "compute_log_probs", {"old_log_probs": logp}, rank=0)
        ledger.record(dfx.batch_id(1, 0), "train_step", {"old_log_probs": logp[:, :5]}, rank=0)  # truncated
        ledger.record(dfx.batch_id(1, 0), "train_step", {"old_log_probs": logp.double()}, rank=1)  # another dtype
        ledger.record(dfx.batch_id(1, 1), "train_step", {"old_log_probs": logp[:, :5]}, rank=0)  # another batch: fine
        stats.flush()
    assert latest(tel, M.RL_SHAPE_LEDGER_MISMATCHES, {A.RL_STAGE: "train_step"}) == 2.0
    assert latest(tel, M.RL_SHAPE_LEDGER_MISMATCHES, {A.RL_STAGE: "compute_log_probs"}) == 0.0
    shape, dtype = ledger.mismatches
    assert (shape.what, shape.shape, shape.expected.shape) == ("shape", (4, 5), (4, 6))
    assert (dtype.what, dtype.dtype, dtype.expected.dtype, dtype.rank) == ("dtype", "float64", "float32", 1)
    text = shape.describe()
    assert "'old_log_probs'" in text and "(4, 5)" in text and "(4, 6)" in text and "compute_log_probs" in text
    assert any("(4, 5)" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    # ... and as an exception event on the span that was current, naming the tensor and both shapes
    tel.shutdown()
    (stage_span,) = [s for s in read_spans(tel.run_dir) if s.name == "rl.train_step"]
    events = [e for e in stage_span.events if EXCEPTION_MESSAGE in e.attributes]
    assert len(events) == 2
    assert events[0].attributes[A.RL_TENSOR_NAME] == "old_log_probs"
    message = events[0].attributes[EXCEPTION_MESSAGE]
    assert "'old_log_probs'" in message and "(4, 5)" in message and "(4, 6)" in message


def test_ledger_checksum_catches_reordered_rows_and_shifted_tokens(stats, tel):
    ledger = dfx.ShapeLedger(stats)
    ids = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0]])
    ledger.record("b", "generate", {"input_ids": ids})
    stats.flush()  # the reference checksum may come from an earlier flush
    ledger.record("b", "compute_log_probs", {"input_ids": ids.flip(0)})  # samples reordered
    ledger.record("b", "train_step", {"input_ids": torch.tensor([[0, 3, 4, 5], [6, 7, 0, 0]])})  # left-shifted pad
    ledger.record("b", "advantage", {"input_ids": ids.clone()})
    stats.flush()
    assert [m.what for m in ledger.mismatches] == ["checksum", "checksum"]
    assert latest(tel, M.RL_SHAPE_LEDGER_MISMATCHES, {A.RL_STAGE: "compute_log_probs"}) == 1.0
    assert latest(tel, M.RL_SHAPE_LEDGER_MISMATCHES, {A.RL_STAGE: "train_step"}) == 1.0
    assert latest(tel, M.RL_SHAPE_LEDGER_MISMATCHES, {A.RL_STAGE: "advantage"}) == 0.0


def test_ledger_sample_ids_and_peers(stats, tel):
    ledger = dfx.ShapeLedger(stats)
    x = np.ones((3, 2))
    ledger.record("b", "generate", {"x": x}, sample_ids=np.array([0, 1, 2]))
    ledger.record("b", "train_step", {"x": x}, sample_ids=np.array([0, 2, 1]))  # two rows moved
    stats.flush()
    assert latest(tel, M.RL_BATCH_ID_MISALIGNED, {A.RL_STAGE: "train_step"}) == 2.0
    # another rank's entries (as all_gather_object would deliver them) are compared too
    peer = dfx.ShapeLedger(dfx.StepStats(tel))
    peer.record("b", "generate", {"x": np.ones((3, 3))}, rank=1)
    peer.stats.flush()
    ledger.compare_entries("b", peer.entries("b"))
    assert ledger.mismatches[-1].what == "shape" and ledger.mismatches[-1].rank == 1
    assert latest(tel, M.RL_SHAPE_LEDGER_MISMATCHES, {A.RL_STAGE: "generate"}) == 1.0


def test_ledger_keeps_a_bounded_number_of_batches(stats):
    ledger = dfx.ShapeLedger(stats, keep_batches=2)
    for step in range(5):
        ledger.record(dfx.batch_id(step), "generate", {"x": np.zeros(2)})
    stats.flush()
    assert ledger.entries(dfx.batch_id(0)) == [] and len(ledger.entries(dfx.batch_id(4))) == 1
