"""The telemetry worker's wake-ups: an idle worker is woken by the first item, a busy one drains
every ``file_flush_interval_s`` on its own, so steady steps cost no wake-up from the caller."""

from __future__ import annotations

import time

from otel_rl.runs.folder import read_log_records
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

VALUES = {"actor/pg_loss": 0.5, "actor/grad_norm": 1.0}


def _logged_steps(tel) -> set[int]:
    return {r["attributes"][A.RL_STEP] for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT}


def _wait_idle(pipeline, deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not pipeline.idle:
        assert time.monotonic() < deadline, "the worker never went idle"
        time.sleep(0.01)


def test_a_step_after_an_idle_spell_is_written_without_waiting_for_the_poll(make_telemetry):
    tel = make_telemetry(framework="roll", file_flush_interval_s=0.05)
    tel._pipeline._poll = 120.0  # were the worker not woken, the step would wait this long
    tel.log(VALUES, step=1)
    tel.flush()
    _wait_idle(tel._pipeline)
    tel.log(VALUES, step=2)
    deadline = time.monotonic() + 10
    while 2 not in _logged_steps(tel):
        assert time.monotonic() < deadline, "the step was not written: the idle worker was not woken"
        time.sleep(0.02)


def _idle_with_counted_drains(tel) -> list[int]:
    """Step 0 logged and written, the worker idle; the list then gets an entry per drain."""
    tel.log(VALUES, step=0)
    tel.flush()
    _wait_idle(tel._pipeline)
    drains: list[int] = []
    drain = tel._pipeline.drain
    tel._pipeline.drain = lambda: drains.append(1) or drain()
    return drains


def test_sparse_steps_cost_the_worker_one_drain_each(make_telemetry):
    # At the rates jobs run (a step a second or slower) each wake-up is paid in CPU: a drain after
    # a quiet spell goes idle at once, with no second gather to find the queue still empty, and an
    # idle worker sleeps until a caller wakes it (its poll is a 5 s safety net, not 2 wake-ups a second).
    tel = make_telemetry(framework="roll", file_flush_interval_s=0.02)
    drains = _idle_with_counted_drains(tel)
    for step in range(1, 6):  # a step every 0.6 s
        tel.log(VALUES, step=step)
        time.sleep(0.6)
    assert len(drains) <= 6, len(drains)  # one a step (and one more for a scheduler stall)
    tel.flush()
    assert _logged_steps(tel) == set(range(6))


def test_steady_steps_keep_the_worker_busy_with_no_wake_up_from_the_caller(make_telemetry):
    tel = make_telemetry(framework="roll", file_flush_interval_s=0.05)
    drains = _idle_with_counted_drains(tel)
    wakes = []
    wake_soon = tel._wake_soon
    tel._wake_soon = lambda: wakes.append(1) or wake_soon()
    for step in range(1, 201):  # a step every ~5 ms for ~1 s: never 50 ms without one
        tel.log(VALUES, step=step)
        time.sleep(0.005)
    busy_drains = len(drains)
    tel.flush()
    # One wake-up starts the busy spell; a stall of this machine's scheduler may idle it a few more times.
    assert 1 <= len(wakes) <= 10, len(wakes)
    # It drained as it went, every 50 ms or so, not once per step and not only at the flush.
    assert 5 <= busy_drains <= 100, busy_drains
    assert _logged_steps(tel) == set(range(201))
