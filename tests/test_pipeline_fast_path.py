"""A step with the same keys as the step before takes the pipeline's bulk path: it must store,
record and emit exactly what the per-key path does, and leave to it anything unusual."""

from __future__ import annotations

import math

import numpy as np
import pytest
from shared_files import LOGS, needs_shared_logs

import otel_rl
from otel_rl._sdk.settings.config import resolve_config
from otel_rl.replay import parse_file
from otel_rl.runs.folder import read_log_records, read_metrics
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

ROLL_STEP = {
    "critic/score/mean": 0.25,  # a headline value
    "actor/pg_loss": -0.0125,
    "memory/actor_train/train_step/end/onload/allocated/0": 12.5,  # the gib transform
    "time/actor_train/train_step/total": 3.5,  # a stage timer: a histogram
    "actor/grad_norm": np.float64(0.75),  # a numpy scalar: the event carries the Python float
}


# The process probe's series, read into the held values at each metric export, not logged: they differ between two runs.
_PROBED = {(M.PROCESS_MEMORY_USAGE, ()), (M.PROCESS_MEMORY_VIRTUAL, ())}


def _state(tel):
    latest = tel._latest
    gauges = {(m, a): latest.get(m, a) for m in latest.metrics() for a in latest.series(m) if (m, a) not in _PROBED}
    hist = tel._histograms.snapshot(M.RL_STAGE_DURATION, next(iter(tel._histograms._states[M.RL_STAGE_DURATION])))
    return gauges, hist


def _second_telemetry(request: pytest.FixtureRequest, tmp_path, **options) -> otel_rl.Telemetry:
    """A telemetry running beside the fixture's: built directly, since a second init() replaces the first."""
    tel = otel_rl.Telemetry(resolve_config({"run_dir": str(tmp_path / "second"), "console": False, **options}))
    request.addfinalizer(tel.shutdown)
    return tel


def _steps(tel, values_per_step):
    for step, values in enumerate(values_per_step, start=1):
        tel.log(values, step=step)
    tel.flush()


def test_bulk_path_matches_the_per_key_path(make_telemetry, request, tmp_path):
    steps = [
        {k: (v * (1 + 0.1 * i) if not isinstance(v, np.floating) else np.float64(float(v) * (1 + 0.1 * i))) for k, v in ROLL_STEP.items()}
        for i in range(4)
    ]
    fast = make_telemetry(framework="roll")
    slow = _second_telemetry(request, tmp_path, framework="roll", service_name="otel-rl-test")
    slow._pipeline.stamped = None
    _steps(fast, steps)
    for step, values in enumerate(steps, start=1):  # the per-key path every time
        slow.log(values, step=step)
        slow.flush()
        slow._pipeline.step_plans.clear()
    assert any(plan is not None for plan in fast._pipeline.step_plans.values())
    assert _state(fast) == _state(slow)
    # the gib transform applied, exactly as the per-key path converts it
    gib = [v for (m, _), v in _state(fast)[0].items() if m == M.RL_GPU_MEMORY_USAGE]
    assert gib == [12.5 * 1.3 * 2**30]
    fast.shutdown()
    slow.shutdown()
    events_fast = [r["body"] for r in read_log_records(fast.run_dir) if r["event_name"] == N.RL_LOG_EVENT]
    events_slow = [r["body"] for r in read_log_records(slow.run_dir) if r["event_name"] == N.RL_LOG_EVENT]
    assert events_fast == events_slow and len(events_fast) == 4
    assert all(type(v) is float for body in events_fast for v in body.values())
    assert events_fast[3]["actor/grad_norm"] == float(np.float64(0.75 * 1.3))


@pytest.mark.parametrize("options", [{}, {"track_with": "stdout"}, {"console": True}], ids=["run-folder", "through-the-sdk", "console"])
def test_float_steps_are_packed_by_log_and_match_the_per_key_path(make_telemetry, request, tmp_path, options):
    # Steps of a planned key set whose values are all floats are packed on the caller's thread; the
    # worker reads them back only where it needs each value. Stored, recorded and emitted: the same.
    float_step = {k: float(v) for k, v in ROLL_STEP.items()}
    steps = [{k: v * (1 + 0.1 * i) for k, v in float_step.items()} for i in range(8)]
    steps[5] = {**steps[5], "actor/pg_loss": math.nan}  # NaN: the per-key path rejects it, named
    steps[3] = {**steps[3], "actor/pg_loss": 1e200}  # large but finite: packed and stored as is
    # numpy float scalars among them: packed too, each as float(value), as the per-key path reads it
    steps[6] = {**steps[6], "actor/grad_norm": np.float32(steps[6]["actor/grad_norm"]), "actor/pg_loss": np.float64(-0.5)}
    fast = make_telemetry(framework="roll", **options)
    slow = _second_telemetry(request, tmp_path, framework="roll", service_name="otel-rl-test", **options)
    slow._pipeline.stamped = None
    packed = []
    fast._pipeline._process_log_packed = lambda *a, _orig=fast._pipeline._process_log_packed: packed.append(a[0]) or _orig(*a)
    for tel, per_key in ((fast, False), (slow, True)):
        for step, values in enumerate(steps, start=1):
            tel.log(values, step=step)
            tel.flush()  # each step's plan is in place before the next log()
            if per_key:
                tel._pipeline.step_plans.clear()
    # Step 1 builds the plan (per key). Step 6 holds a NaN: packed, then sent per key by the worker.
    assert packed == [2, 3, 4, 5, 6, 7, 8]
    assert _state(fast) == _state(slow)
    fast.shutdown()
    slow.shutdown()
    events_fast, events_slow = _events(fast), _events(slow)
    assert len(events_fast) == 8 and events_fast.keys() == events_slow.keys()
    for step, body in events_fast.items():
        assert body.keys() == events_slow[step].keys()
        for key, value in body.items():  # NaN != NaN: compared as text
            assert type(value) is float and repr(value) == repr(events_slow[step][key])
    assert events_fast[8]["actor/grad_norm"] == 0.75 * (1 + 0.1 * 7)
    assert events_fast[4]["actor/pg_loss"] == 1e200
    assert events_fast[7]["actor/grad_norm"] == float(np.float32(0.75 * 1.6)) != 0.75 * 1.6


def test_with_nothing_taking_events_a_packed_step_is_stored_without_building_its_event(make_telemetry, request, tmp_path):
    # exporters="none" and no tracker: the values are held for the metrics as with a run folder,
    # and the step's 250-value event body is never built for a pipeline that drops it.
    steps = [{k: float(v) * (1 + 0.1 * i) for k, v in ROLL_STEP.items()} for i in range(4)]
    quiet = make_telemetry(framework="roll", exporters="none")
    filed = _second_telemetry(request, tmp_path, framework="roll", service_name="otel-rl-test")
    filed._pipeline.stamped = None
    emitted: list[str] = []
    quiet._pipeline.emit_event = lambda name, *a, **k: emitted.append(name)
    for tel in (quiet, filed):
        for step, values in enumerate(steps, start=1):
            tel.log(values, step=step)
            tel.flush()
    # Step 1 goes per key (its plan is made then) and hands its event to emit_event, which drops it;
    # steps 2-4 are packed, and no event is made for them.
    assert quiet._pipeline.step_plans and emitted == [N.RL_LOG_EVENT]
    assert _state(quiet) == _state(filed)


def _events(tel) -> dict[int, dict]:
    return {r["attributes"][A.RL_STEP]: r["body"] for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT}


@needs_shared_logs
@pytest.mark.parametrize("options", [{}, {"track_with": "stdout"}], ids=["run-folder", "through-the-sdk"])
def test_real_verl_steps_with_ints_take_the_bulk_path_and_match_the_per_key_path(make_telemetry, request, tmp_path, options):
    # verl logs a dozen ints a step (global_seqlen/*, training/global_step, num_turns/*): metrics
    # take them as floats, the event keeps them as ints, as the per-key path does.
    log = parse_file(LOGS / "verl_opd_qwen2-3b_wandb-outputlog_healthy.log")
    steps = [r.values for r in log.records if "training/global_step" in r.values][:6]
    keys = list(steps[0])
    assert all(list(values) == keys for values in steps)
    assert sum(type(v) is int for v in steps[0].values()) >= 10 and sum(type(v) is float for v in steps[0].values()) >= 40
    steps[3] = {k: (np.int64(v) if type(v) is int else np.float32(v) if k.startswith("actor/") else v) for k, v in steps[3].items()}
    fast = make_telemetry(framework="verl", **options)
    slow = _second_telemetry(request, tmp_path, framework="verl", service_name="otel-rl-test", **options)
    slow._pipeline.stamped = None
    per_key = []
    slow._pipeline._process_log_slow = lambda *a, _orig=slow._pipeline._process_log_slow: per_key.append(a[0]) or _orig(*a)
    bulk_skipped = []
    fast._pipeline._process_log_slow = lambda *a, _orig=fast._pipeline._process_log_slow: bulk_skipped.append(a[0]) or _orig(*a)
    _steps(fast, steps)
    for step, values in enumerate(steps, start=1):
        slow.log(values, step=step)
        slow.flush()
        slow._pipeline.step_plans.clear()
    assert per_key == [1, 2, 3, 4, 5, 6]
    assert len(bulk_skipped) < len(steps) - 2  # the first steps go per key until the plan is built
    plan = fast._pipeline.step_plans[tuple(keys)]
    assert plan is not None and plan.template is None
    assert (len(plan.int_templates) == 1) == (not options)  # the run folder's writer took the steps with ints
    assert _state(fast) == _state(slow)
    fast.shutdown()
    slow.shutdown()
    events_fast, events_slow = _events(fast), _events(slow)
    assert events_fast == events_slow and len(events_fast) == 6
    for body in events_fast.values():  # the exact types, not only equal values (1 == 1.0)
        assert [type(v) for v in body.values()] == [type(v) for v in events_slow[1].values()]
        assert body["training/global_step"] in range(1, 200)


def test_an_int_beyond_int64_and_a_bool_take_the_per_key_path(make_telemetry):
    tel = make_telemetry(framework="roll")
    for step in range(1, 4):
        tel.log({"actor/pg_loss": 0.5, "actor/grad_norm": 1.0, "actor/n": 3}, step=step)
    tel.log({"actor/pg_loss": 0.5, "actor/grad_norm": 1.0, "actor/n": 2**64}, step=4)
    tel.log({"actor/pg_loss": 0.5, "actor/grad_norm": 1.0, "actor/n": True}, step=5)
    tel.log({"actor/pg_loss": 0.5, "actor/grad_norm": 1.0, "actor/n": np.uint64(2**63)}, step=6)
    tel.flush()
    tel.shutdown()
    events = _events(tel)
    assert events[3]["actor/n"] == 3 and type(events[3]["actor/n"]) is int
    assert events[4]["actor/n"] == float(2**64)  # OTLP has no wider int: the per-key path's float
    assert events[5]["actor/n"] is True
    assert events[6]["actor/n"] == float(2**63)


def test_unusual_values_take_the_per_key_path(make_telemetry, caplog):
    tel = make_telemetry(framework="roll")
    base = {"actor/pg_loss": 0.5, "actor/grad_norm": 1.0}
    tel.log(base, step=1)
    tel.log(base, step=2)
    tel.log({"actor/pg_loss": math.nan, "actor/grad_norm": 2.0}, step=3)  # NaN: rejected, named
    tel.log({"actor/pg_loss": 7, "actor/grad_norm": 3.0}, step=4)  # an int stays an int in the event
    tel.log({"actor/pg_loss": "high", "actor/grad_norm": 4.0}, step=5)
    tel.flush()
    latest = tel._latest
    assert latest.get(M.RL_GRAD_NORM, ((A.RL_MODEL_ROLE, "actor"),)) == 4.0
    rejected = {a: v for a, v in latest.series(M.RL_TELEMETRY_REJECTED).items()}
    assert sum(slot[0] for slot in rejected.values()) == 2
    tel.shutdown()
    bodies = {r["attributes"][A.RL_STEP]: r["body"] for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT}
    assert bodies[4]["actor/pg_loss"] == 7 and type(bodies[4]["actor/pg_loss"]) is int
    assert bodies[5]["actor/pg_loss"] == "high"
    assert math.isnan(bodies[3]["actor/pg_loss"])
    points = read_metrics(tel.run_dir)
    assert any(p.name == M.RL_GRAD_NORM and p.value == 4.0 for p in points)


def test_a_series_whose_first_value_was_rejected_is_stored_once_it_has_values(make_telemetry):
    # The first step's NaN creates no series; the plan is built only once every series exists,
    # so later values land in the series instead of nowhere.
    tel = make_telemetry(framework="roll")
    tel.log({"actor/pg_loss": math.nan, "actor/grad_norm": 1.0}, step=1)
    for step in range(2, 8):
        tel.log({"actor/pg_loss": 0.1 * step, "actor/grad_norm": 1.0 + step}, step=step)
    tel.flush()
    loss = tel._latest.get(M.RL_LOSS, ((A.RL_LOSS_TYPE, "policy"), (A.RL_MODEL_ROLE, "actor")))
    assert loss == 0.1 * 7 and tel._latest.get(M.RL_GRAD_NORM, ((A.RL_MODEL_ROLE, "actor"),)) == 8.0
    assert any(plan is not None for plan in tel._pipeline.step_plans.values())


def test_alternating_key_sets_keep_their_plans(make_telemetry):
    tel = make_telemetry(framework="roll")
    train = {"actor/pg_loss": 0.5, "actor/grad_norm": 1.0}
    val = {"val/score/mean": 0.25}
    for step in range(1, 9):
        tel.log(train if step % 2 else val, step=step)
    tel.flush()
    plans = tel._pipeline.step_plans
    assert set(plans) == {tuple(train), tuple(val)} and all(plan is not None for plan in plans.values())


def test_a_timer_a_stage_span_measured_is_not_counted_twice_on_the_bulk_path(make_telemetry):
    tel = make_telemetry(framework="roll")
    packed = []
    tel._pipeline._process_log_packed = lambda *a, _orig=tel._pipeline._process_log_packed: packed.append(a[0]) or _orig(*a)
    steps = 8
    for step in range(steps):
        tel.flush()  # the plan, once built, is there for the next log()
        with tel.step(step):
            with tel.stage("train_step", cluster="actor_train"):
                pass
        # train_step's total was measured by its span; model_update's only by the logged timer
        tel.log(
            {"actor/pg_loss": 0.1 * step, "time/actor_train/train_step/total": 2.0, "time/actor_train/model_update/total": 1.0 + step},
            step=step,
        )
    tel.flush()
    assert any(plan is not None for plan in tel._pipeline.step_plans.values())
    assert packed == list(range(1, steps))  # float steps: packed by log() once the plan is built
    histograms = tel._histograms
    measured = ((A.RL_CLUSTER, "actor_train"), (A.RL_STAGE, "train_step"), (A.RL_STAGE_PHASE, "total"))
    logged = ((A.RL_CLUSTER, "actor_train"), (A.RL_STAGE, "model_update"), (A.RL_STAGE_PHASE, "total"))
    count, total, _ = histograms.snapshot(M.RL_STAGE_DURATION, measured)
    assert count == steps and total < 1.0  # the spans' own (near-zero) durations, never the logged 2.0
    count, total, _ = histograms.snapshot(M.RL_STAGE_DURATION, logged)
    assert count == steps and total == sum(1.0 + s for s in range(steps))
    tel.shutdown()
