"""Load balance: per-rank tokens and times, the straggler and its margin, queue depth."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dfx_support import latest  # noqa: E402

from otel_rl import dfx  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402


def test_straggler_of_known_per_rank_times(stats, tel):
    # 4 ranks; rank 2 is slowest: 12 s against a median of (10 + 10.5) / 2 = 10.25 s
    active = [10.0, 9.0, 12.0, 10.5]
    dfx.rank_balance(stats, tokens=[4000, 4100, 6000, 3900], active_time=active, communication_time=[1, 1, 0.5, 1], step_time=13.0)
    stats.flush()
    assert latest(tel, M.RL_STRAGGLER_RANK) == 2.0
    assert latest(tel, M.RL_STRAGGLER_MARGIN) == pytest.approx(12.0 / 10.25 - 1)
    for rank, (a, tokens) in enumerate(zip(active, [4000, 4100, 6000, 3900])):
        assert latest(tel, M.RL_RANK_ACTIVE_TIME, {A.RL_MEASURED_RANK: rank}) == a
        assert latest(tel, M.RL_RANK_IDLE_TIME, {A.RL_MEASURED_RANK: rank}) == 13.0 - a
        assert latest(tel, M.RL_RANK_TOKENS, {A.RL_MEASURED_RANK: rank}) == tokens
    assert latest(tel, M.RL_RANK_COMMUNICATION_TIME, {A.RL_MEASURED_RANK: 2}) == 0.5
    stat = {s: latest(tel, M.RL_RANK_TOKENS, {A.RL_STATISTIC: s}) for s in ("min", "max", "mean", "minmax_diff")}
    assert stat == {"min": 3900.0, "max": 6000.0, "mean": 4500.0, "minmax_diff": 2100.0}


def test_explicit_ranks_idle_time_and_gathered_device_scalars(stats, tel):
    # what all_gather gives: one device scalar per rank (here ranks 8..10 of a larger job)
    tokens = [torch.tensor(100), torch.tensor(300), torch.tensor(200)]
    dfx.rank_balance(stats, tokens=tokens, active_time=torch.tensor([2.0, 2.0, 2.0]), idle_time=[0.5, 0.0, 0.25], ranks=[8, 9, 10])
    stats.flush()
    assert latest(tel, M.RL_RANK_TOKENS, {A.RL_MEASURED_RANK: 9}) == 300.0
    assert latest(tel, M.RL_RANK_IDLE_TIME, {A.RL_MEASURED_RANK: 10}) == 0.25
    assert latest(tel, M.RL_STRAGGLER_RANK) == 8.0  # a tie: the lowest rank
    assert latest(tel, M.RL_STRAGGLER_MARGIN) == 0.0


def test_find_straggler_and_single_process_gather():
    assert dfx.find_straggler([1.0, 3.0, 2.0]) == dfx.Straggler(rank=1, active_time=3.0, margin=0.5)
    assert dfx.find_straggler([0.0, 0.0]).margin == 0.0
    assert dfx.gather_per_rank(3) == [3.0]  # torch.distributed not initialized: this rank only


def test_queue_depth(stats, tel):
    dfx.queue_depth(stats, "rollout", 96)
    dfx.queue_depth(stats, "replay_buffer", 2048)
    assert latest(tel, M.RL_QUEUE_DEPTH, {A.RL_QUEUE_NAME: "rollout"}) == 96.0
    assert latest(tel, M.RL_QUEUE_DEPTH, {A.RL_QUEUE_NAME: "replay_buffer"}) == 2048.0


def test_a_straggler_past_the_margin_is_an_event_in_the_step_trace(stats, tel):
    from otel_rl.runs.folder import read_log_records
    from otel_rl.semconv import names as N

    with tel.step(5) as scope:  # balanced first: no event
        dfx.rank_balance(stats, active_time=[1.0, 1.05, 0.98], step_time=1.2)
        stats.flush()
    with tel.step(6) as slow:  # rank 1 takes 1.5x the median
        dfx.rank_balance(stats, active_time=[1.0, 1.5, 0.98], step_time=1.6)
        stats.flush()
    tel.shutdown()
    events = [r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_STRAGGLER_EVENT]
    assert len(events) == 1
    (event,) = events
    assert event["attributes"] == {A.RL_STEP: 6, A.RL_MEASURED_RANK: 1}
    assert event["body"]["margin"] == pytest.approx(0.5)
    assert event["body"]["active_time_s"] == 1.5
    assert event["trace_id"] == slow.trace_id != scope.trace_id


def test_unknown_event_names_are_reported_once_not_raised(tel, caplog):
    tel.event("rl.not_an_event", {"x": 1})
    tel.event("rl.not_an_event", {"x": 1})
    tel.flush()
    assert len([r for r in caplog.records if "rl.not_an_event" in r.getMessage()]) == 1
