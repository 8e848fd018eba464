"""Goodput: each step split into productive, overhead and idle seconds, from the real telemetry.

The steps run through the public scopes (``step``, ``stage``, ``phase``) of a real telemetry
(``otel_rl.testing.capture``) and are read back from the exported metric files. Where exact values
are checked, the scopes read a test clock (the one ``time.perf_counter`` they call) that the test
moves, so each stage has a known interval; one test runs on the real clock with sleeps.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from otel_rl._sdk.pipeline import goodput as G
from otel_rl._sdk.spans import scopes
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.testing import Capture, capture

BUCKETS = (G.PRODUCTIVE, G.OVERHEAD, G.IDLE)


class Clock:
    """The perf_counter the scopes read, moved by the test (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    test_clock = Clock()
    # Only the scopes' module sees it (they call time.perf_counter and nothing else of `time`).
    monkeypatch.setattr(scopes, "time", SimpleNamespace(perf_counter=test_clock))
    return test_clock


def buckets(cap: Capture) -> dict[str, tuple[int, float]]:
    """(count, sum) of rl.step.goodput.duration per bucket, as exported."""
    out = {}
    for bucket in BUCKETS:
        got = cap.histogram(M.RL_STEP_GOODPUT_DURATION, {A.RL_GOODPUT_BUCKET: bucket})
        assert got is not None, f"no {bucket} series exported"
        out[bucket] = got
    return out


def test_live_step_with_async_overlap_offload_phases_weight_sync_and_a_wait(clock: Clock) -> None:
    # step [0, 10): a rollout thread generates over [1, 6) while the trainer runs train_step over
    # [2, 8) with onload [2, 3), execute [3, 7), offload [7, 8); model_update [8.5, 9.5); an explicit
    # wait [9.5, 9.8). Productive = [1, 7) = 6 (the onload under generate stays productive);
    # overhead = offload [7, 8) + model_update = 2; idle = [0, 1) + [8, 8.5) + [9.5, 10) = 2.
    with capture() as cap:
        tel = cap.telemetry
        started, entered, release, done = threading.Event(), threading.Event(), threading.Event(), threading.Event()

        def rollout() -> None:
            started.wait()
            with tel.stage("generate", cluster="actor_infer"):
                entered.set()
                release.wait()
            done.set()

        worker = threading.Thread(target=rollout)
        worker.start()
        clock.now = 0.0
        with tel.step(0):
            clock.now = 1.0
            started.set()
            assert entered.wait(5)
            clock.now = 2.0
            with tel.stage("train_step", cluster="actor_train", offload=True) as st:
                with st.phase("onload"):
                    clock.now = 3.0
                with st.phase("execute"):
                    clock.now = 6.0
                    release.set()  # the rollout ends at 6, inside the trainer's execute phase
                    assert done.wait(5)
                    clock.now = 7.0
                with st.phase("offload"):
                    clock.now = 8.0
            clock.now = 8.5
            with tel.stage("model_update", cluster="actor_infer"):
                clock.now = 9.5
            with tel.stage("wait"):
                clock.now = 9.8
            clock.now = 10.0
        worker.join(5)

        got = buckets(cap)
        assert {b: c for b, (c, _) in got.items()} == dict.fromkeys(BUCKETS, 1)
        assert got[G.PRODUCTIVE][1] == pytest.approx(6.0)
        assert got[G.OVERHEAD][1] == pytest.approx(2.0)
        assert got[G.IDLE][1] == pytest.approx(2.0)
        step = cap.histogram(M.RL_STEP_DURATION)
        assert step is not None and step == (1, pytest.approx(10.0))
        assert sum(s for _, s in got.values()) == pytest.approx(step[1], abs=1e-9)
        assert cap.latest(M.RL_STEP_GOODPUT_RATIO) == pytest.approx(0.6)


def test_nested_stages_count_once_and_each_step_gets_its_own_buckets(clock: Clock) -> None:
    with capture() as cap:
        tel = cap.telemetry
        clock.now = 0.0
        with tel.step(0):  # rollout [0, 4) around generate [1, 3); do_checkpoint [4, 5): 4 / 1 / 0
            with tel.stage("rollout"):
                clock.now = 1.0
                with tel.stage("generate"):
                    clock.now = 3.0
                clock.now = 4.0
            with tel.stage("do_checkpoint"):
                clock.now = 5.0
        clock.now = 20.0
        with tel.step(1):  # compute_rewards [21, 22) in a 4 s step: 1 / 0 / 3
            clock.now = 21.0
            with tel.stage("compute_rewards", cluster="reward"):
                clock.now = 22.0
            clock.now = 24.0
        got = buckets(cap)
        assert got[G.PRODUCTIVE] == (2, pytest.approx(5.0))
        assert got[G.OVERHEAD] == (2, pytest.approx(1.0))
        assert got[G.IDLE] == (2, pytest.approx(3.0))
        assert cap.latest(M.RL_STEP_GOODPUT_RATIO) == pytest.approx(0.25)  # the latest step's


def test_a_step_without_stages_records_no_goodput(clock: Clock) -> None:
    with capture() as cap:
        clock.now = 0.0
        with cap.telemetry.step(0):
            clock.now = 3.0
        assert cap.histogram(M.RL_STEP_DURATION) == (1, pytest.approx(3.0))
        assert cap.points(M.RL_STEP_GOODPUT_DURATION) == []
        assert cap.latest(M.RL_STEP_GOODPUT_RATIO) is None


def test_on_the_real_clock_the_buckets_add_up_to_the_step_and_are_computed_off_the_training_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    real_split = G.split_step

    def split_step(*args: Any) -> tuple[float, float, float]:
        threads.append(threading.current_thread().name)
        return real_split(*args)

    monkeypatch.setattr(G, "split_step", split_step)  # the real function, watched for its thread
    with capture() as cap:
        tel = cap.telemetry
        with tel.step(0):
            with tel.stage("compute_log_probs", cluster="actor_train", offload=True) as st:
                with st.phase("onload"):
                    time.sleep(0.01)
                with st.phase("execute"):
                    time.sleep(0.03)
                with st.phase("offload"):
                    time.sleep(0.01)
            time.sleep(0.02)  # outside any stage: idle
        # the step's exit only queued it: nothing was computed on the training thread
        # (the worker may have done it already; a flush below drains the rest on the reader's thread)
        assert threading.main_thread().name not in threads
        got = buckets(cap)
        step = cap.histogram(M.RL_STEP_DURATION)
        assert step is not None
        assert sum(s for _, s in got.values()) == pytest.approx(step[1], rel=1e-6)
        assert got[G.PRODUCTIVE][1] >= 0.03
        assert got[G.OVERHEAD][1] >= 0.02
        assert got[G.IDLE][1] >= 0.02
    assert len(threads) == 1


def test_finished_steps_get_buckets_from_their_laid_out_stages() -> None:
    with capture() as cap:
        tel = cap.telemetry
        # back to back in 7 s: generate 3 + train_step 2 productive, model_update 1 overhead, 1 s idle
        tel.trace_finished_step(0, [("generate", 3.0), ("train_step", 2.0, "actor_train"), ("model_update", 1.0)], step_seconds=7.0)
        got = buckets(cap)
        assert got[G.PRODUCTIVE] == (1, pytest.approx(5.0))
        assert got[G.OVERHEAD] == (1, pytest.approx(1.0))
        assert got[G.IDLE] == (1, pytest.approx(1.0))
        assert cap.latest(M.RL_STEP_GOODPUT_RATIO) == pytest.approx(5 / 7)
        # the stages overran the 5 s step: model_update is moved to end with it, over train_step
        # (as verl's overlapping timers did), and the productive time wins the overlap
        tel.trace_finished_step(1, [("generate", 3.0), ("train_step", 2.0), ("model_update", 1.0)], step_seconds=5.0)
        got = buckets(cap)
        assert got[G.PRODUCTIVE] == (2, pytest.approx(10.0))
        assert got[G.OVERHEAD] == (2, pytest.approx(1.0))
        assert got[G.IDLE] == (2, pytest.approx(1.0))
        assert cap.latest(M.RL_STEP_GOODPUT_RATIO) == pytest.approx(1.0)
        spans = {s.attributes.get(A.RL_STAGE): s for s in cap.spans() if s.attributes.get(A.RL_STEP) == 1 and A.RL_STAGE in s.attributes}
        assert spans["model_update"].start_ns == spans["train_step"].start_ns + 1_000_000_000


# -- the classification table and the interval arithmetic ------------------------------------


def test_every_registry_stage_has_a_bucket() -> None:
    missing = [s.value for s in A.RlStageValues if s.value not in G.STAGE_BUCKETS]
    assert not missing, f"add these rl.stage values to goodput.STAGE_BUCKETS: {missing}"
    assert set(G.STAGE_BUCKETS.values()) == set(BUCKETS)
    assert {m.value for m in A.RlGoodputBucketValues} == set(BUCKETS)


@pytest.mark.parametrize(
    ("stage", "bucket"),
    [
        ("generate", G.PRODUCTIVE),
        ("train_step", G.PRODUCTIVE),
        ("model_update", G.OVERHEAD),
        ("do_checkpoint", G.OVERHEAD),
        ("save_checkpoint", G.OVERHEAD),
        ("barrier", G.IDLE),
        ("wait_for_buffer", G.IDLE),  # an unknown name, by its words
        ("sync_weights", G.OVERHEAD),
        ("my_reward_model", G.PRODUCTIVE),  # an unknown name of no known word: work
    ],
)
def test_bucket_of(stage: str, bucket: str) -> None:
    assert G.bucket_of(stage) == bucket


def test_split_step_clips_to_the_step_and_sums_to_it() -> None:
    stages = [
        ("generate", -5.0, 2.0, ()),  # started before the step: only [0, 2) counts
        ("train_step", 1.0, 4.0, [("onload", 1.0, 1.0), ("offload", 0.5, 3.5)]),  # [1, 2) under generate, [2, 3.5) work
        ("model_update", 3.0, 12.0, ()),  # runs past the end: [3.5, 6)
        ("wait", 0.0, 6.0, ()),  # explicit wait: never productive or overhead
    ]
    productive, overhead, idle = G.split_step(0.0, 6.0, stages)
    assert (productive, overhead, idle) == pytest.approx((3.5, 2.5, 0.0))
    assert G.split_step(0.0, 6.0, []) == (0.0, 0.0, 6.0)
    assert G.split_step(0.0, 6.0, [("wait", 0.0, 6.0, [("onload", 1.0, 2.0)])]) == pytest.approx((0.0, 1.0, 5.0))
