"""The SDK facade end to end with the real OpenTelemetry SDK, read back from the run folder."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import otel_rl
from otel_rl.runs.folder import find_step_trace, read_log_records, read_metrics, read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

STAGES = ("generate", "compute_rewards", "compute_log_probs", "advantage", "train_step")


def run_steps(tel: otel_rl.Telemetry, steps: int = 2) -> dict[int, str]:
    """A miniature training loop; returns each step's trace id."""
    trace_ids = {}
    for step in range(steps):
        with tel.step(step) as scope:
            trace_ids[step] = scope.trace_id
            with tel.stage("generate", cluster="actor_infer"):
                time.sleep(0.002)
            with tel.stage("compute_rewards", cluster="reward"):
                pass
            with tel.stage("compute_log_probs", cluster="actor_train", offload=True) as st:
                with st.phase("onload"):
                    time.sleep(0.001)
                with st.phase("execute"):
                    time.sleep(0.002)
                with st.phase("offload"):
                    time.sleep(0.001)
            with tel.stage("advantage"):
                pass
            with tel.stage("train_step", cluster="actor_train"):
                pass
            tel.log({"actor/pg_loss": 0.5 + step, "critic/rewards/mean": float(step), **st.metrics}, step=step)
    return trace_ids


def test_each_step_is_one_trace_with_stages_phases_and_memory_events(make_telemetry):
    tel = make_telemetry()
    trace_ids = run_steps(tel, steps=2)
    tel.shutdown()
    spans = read_spans(tel.run_dir)
    assert not spans.problems
    assert len({s.trace_id for s in spans}) == 2

    for step, trace_id in trace_ids.items():
        trace = find_step_trace(spans, step)
        assert {s.trace_id for s in trace} == {trace_id}
        by_name = {s.name: s for s in trace}
        root = by_name[N.RL_STEP_SPAN]
        assert root.parent_span_id is None and root.attributes[A.RL_STEP] == step
        for stage in STAGES:
            span = by_name[f"rl.{stage}"]
            assert span.parent_span_id == root.span_id
            assert span.attributes[A.RL_STAGE] == stage
            assert span.attributes[A.RL_STEP] == step and span.attributes[A.RL_RANK] == 0
            assert root.start_ns <= span.start_ns and span.end_ns <= root.end_ns
        assert by_name["rl.generate"].attributes[A.RL_CLUSTER] == "actor_infer"
        assert A.RL_CLUSTER not in by_name["rl.advantage"].attributes
        stage = by_name["rl.compute_log_probs"]
        phases = [s for s in trace if s.parent_span_id == stage.span_id]
        assert [p.name for p in sorted(phases, key=lambda s: s.start_ns)] == ["rl.onload", "rl.execute", "rl.offload"]
        for phase in phases:
            assert stage.start_ns <= phase.start_ns and phase.end_ns <= stage.end_ns
            assert phase.attributes[A.RL_STAGE_PHASE] == phase.name.removeprefix("rl.")
        snapshots = [
            (e.attributes[A.RL_MEMORY_WHEN], e.attributes[A.RL_MEMORY_STATE]) for e in stage.events if e.name == N.RL_MEMORY_SNAPSHOT_EVENT
        ]
        assert snapshots == [("start", "offload"), ("start", "onload"), ("end", "onload"), ("end", "offload")]
        offload_events = [e for e in stage.events if e.attributes[A.RL_MEMORY_STATE] == "offload"]
        assert all(e.attributes[A.RL_MEMORY_RSS] > 0 and e.attributes[A.RL_MEMORY_VMS] > 0 for e in offload_events)
        assert not by_name["rl.generate"].events  # memory tracking is opt-in per stage


def test_log_emits_one_event_per_call_with_the_exact_values(make_telemetry):
    tel = make_telemetry()
    values = {
        "actor/pg_loss": 0.25,
        "system/samples": 64,
        "flag": True,
        "np": np.float32(1.5),
        "note": "warmup",
        "missing": None,
        "nested": {"a": 1.0, "b": 2},
    }
    with tel.step(7) as scope:
        tel.log(values)
        tel.log({"actor/pg_loss": 0.5}, step=7)
    tel.shutdown()
    records = [r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT]
    assert len(records) == 2
    first = records[0]
    assert first["attributes"][A.RL_STEP] == 7
    assert first["trace_id"] == scope.trace_id
    assert first["body"] == {
        "actor/pg_loss": 0.25,
        "system/samples": 64,
        "flag": True,
        "np": 1.5,
        "note": "warmup",
        "missing": None,
        "nested/a": 1.0,
        "nested/b": 2,
    }
    assert records[1]["body"] == {"actor/pg_loss": 0.5}


def _last_points(run_dir: Path) -> dict:
    points = {}
    for p in read_metrics(run_dir):
        points[(p.name, tuple(sorted(p.attributes.items())))] = p
    return points


def test_framework_keys_become_registry_metrics_and_spans_are_not_double_counted(make_telemetry):
    tel = make_telemetry(framework="roll")
    run_steps(tel, steps=3)
    tel.flush()
    assert tel.latest(M.RL_LOSS, {A.RL_MODEL_ROLE: "actor", A.RL_LOSS_TYPE: "policy"}) == 2.5
    tel.shutdown()
    points = _last_points(tel.run_dir)
    loss = points[(M.RL_LOSS, ((A.RL_LOSS_TYPE, "policy"), (A.RL_MODEL_ROLE, "actor")))]
    assert loss.kind == "gauge" and loss.value == 2.5 and loss.unit == "1"
    reward = points[(M.RL_REWARD, ((A.RL_STATISTIC, "mean"),))]
    assert reward.value == 2.0
    # The stage span measured compute_log_probs; logging st.metrics must not add a second sample.
    total = points[(M.RL_STAGE_DURATION, ((A.RL_CLUSTER, "actor_train"), (A.RL_STAGE, "compute_log_probs"), (A.RL_STAGE_PHASE, "total")))]
    assert total.kind == "histogram" and total.count == 3 and total.unit == "s"
    onload = points[(M.RL_STAGE_DURATION, ((A.RL_CLUSTER, "actor_train"), (A.RL_STAGE, "compute_log_probs"), (A.RL_STAGE_PHASE, "onload")))]
    assert onload.count == 3
    assert points[(M.RL_STEP_DURATION, ())].count == 3
    rss = points[(M.PROCESS_MEMORY_USAGE, ((A.RL_CLUSTER, "actor_train"), (A.RL_MEMORY_WHEN, "end"), (A.RL_STAGE, "compute_log_probs")))]
    assert rss.value > 10_000_000
    # No metric series carries the step (one series per step would be unbounded).
    assert not any(A.RL_STEP in attrs for (_name, attrs_t) in points for attrs in [dict(attrs_t)])


def test_framework_logged_durations_are_recorded_when_no_span_measured_them(make_telemetry):
    tel = make_telemetry(framework="verl")
    for step in range(4):
        tel.log({"timing_s/gen": 1.5, "timing_s/step": 3.0}, step=step)
    tel.shutdown()
    points = _last_points(tel.run_dir)
    gen = [p for (name, attrs), p in points.items() if name == M.RL_STAGE_DURATION and dict(attrs).get(A.RL_STAGE) == "generate"]
    assert len(gen) == 1 and gen[0].count == 4 and gen[0].sum == pytest.approx(6.0)


def test_a_finished_step_is_traced_from_its_logged_durations(make_telemetry, caplog):
    tel = make_telemetry(framework="verl")
    end = time.time_ns()
    stages = [("generate", 4.0), ("compute_rewards", 1.0), ("train_step", 3.0, "actor_train"), ("validation", 0.5)]
    tel.trace_finished_step(7, stages, step_seconds=10.0, end_time_ns=end)
    # stages overrunning the step (overlapped in the run) end with it; bad entries are skipped, once
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.trace_finished_step(
            8, [("generate", 2.0), ("bad", "x"), ("bad", -1.0), ("train_step", 2.0)], step_seconds=3.0, end_time_ns=end + 5 * 10**9
        )
        tel.trace_finished_step(9, [("generate", 1.0), ("bad", "x")])
    tel.shutdown()
    assert len([r for r in caplog.records if "trace_finished_step" in r.getMessage()]) == 2
    spans = read_spans(tel.run_dir)
    assert not spans.problems
    by_step: dict[int, list] = {}
    for span in spans:
        assert span.attributes[A.RL_SPAN_RECONSTRUCTED] is True
        by_step.setdefault(span.attributes[A.RL_STEP], []).append(span)
    assert sorted(by_step) == [7, 8, 9]

    def laid_out(step: int) -> tuple:
        (root,) = [s for s in by_step[step] if s.name == N.RL_STEP_SPAN]
        children = sorted((s for s in by_step[step] if s is not root), key=lambda s: s.start_ns)
        assert root.parent_span_id is None
        assert all(s.parent_span_id == root.span_id and s.trace_id == root.trace_id for s in children)
        assert all(root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns for s in children)
        return root, children

    root, children = laid_out(7)
    assert (root.end_ns, root.duration_ns) == (end, 10 * 10**9)
    assert [(s.name, s.duration_ns / 1e9, s.attributes.get(A.RL_CLUSTER)) for s in children] == [
        ("rl.generate", 4.0, None),
        ("rl.compute_rewards", 1.0, None),
        ("rl.train_step", 3.0, "actor_train"),
        ("rl.validation", 0.5, None),
    ]
    assert [s.start_ns - root.start_ns for s in children] == [0, 4 * 10**9, 5 * 10**9, 8 * 10**9]  # back to back
    root, children = laid_out(8)
    assert [(s.name, s.start_ns - root.start_ns, s.duration_ns) for s in children] == [
        ("rl.generate", 0, 2 * 10**9),
        ("rl.train_step", 1 * 10**9, 2 * 10**9),
    ]  # moved to end with the step
    root, children = laid_out(9)
    assert root.duration_ns == 10**9 and [s.name for s in children] == ["rl.generate"]  # step = the stages' sum
    # spans only: no stage-duration metric came from them
    assert not [p for p in read_metrics(tel.run_dir) if p.name == M.RL_STAGE_DURATION]


def test_metrics_at_log_time_keep_one_point_per_log_at_its_time(make_telemetry):
    t0 = 1_700_000_000_000_000_000
    tel = make_telemetry(framework="verl", metrics_at_log_time=True)
    for i in range(4):
        values = {"actor/pg_loss": 0.1 * i, "timing_s/gen": 1.0 + i}
        if i % 2 == 0:
            values["val-core/gsm8k/reward/mean@1"] = 0.5 + i  # a sparse key: only its own points
        tel.log(values, step=i, time_ns=t0 + i * 10**9)
    tel.flush()
    tel.log({"actor/pg_loss": 9.0}, step=4, time_ns=t0 + 4 * 10**9)  # after an export: the next one sends it
    tel.shutdown()
    points = read_metrics(tel.run_dir)
    assert not points.problems

    def series(name: str) -> list:
        return sorted(((p.time_ns - t0) // 10**9, p) for p in points if p.name == name and p.time_ns < t0 + 10**12)

    loss = series(M.RL_LOSS)
    assert [(t, p.value) for t, p in loss] == [(0, 0.0), (1, 0.1), (2, 0.2), (3, pytest.approx(0.3)), (4, 9.0)]
    gen = series(M.RL_STAGE_DURATION)
    assert [(t, p.count, p.sum) for t, p in gen] == [(0, 1, 1.0), (1, 2, 3.0), (2, 3, 6.0), (3, 4, 10.0)]
    assert {p.start_time_ns for _, p in gen} == {t0} and gen[-1][1].max == 4.0 and gen[-1][1].min == 1.0
    assert [t for t, _ in series(M.RL_VALIDATION_SCORE)] == [0, 2]
    # nothing from log() also went out at export time; otel-rl's own metrics did
    logged = {M.RL_LOSS, M.RL_STAGE_DURATION, M.RL_VALIDATION_SCORE}
    assert not [p for p in points if p.name in logged and p.time_ns > t0 + 10**12]
    assert any(p.name == M.PROCESS_MEMORY_USAGE and p.time_ns > t0 + 10**12 for p in points)


def test_record_bins_a_whole_array_including_negative_values(make_telemetry):
    tel = make_telemetry()
    rewards = np.array([-3.0, -1.0, -0.05, 0.0, 0.3, 1.0, 7.0])
    tel.record(M.RL_SAMPLE_REWARD, rewards)
    tel.record(M.RL_SAMPLE_REWARD, [np.nan, 0.3])
    tel.shutdown()
    point = _last_points(tel.run_dir)[(M.RL_SAMPLE_REWARD, ())]
    bounds = point.explicit_bounds
    expected = np.bincount(np.searchsorted(bounds, np.append(rewards, 0.3), side="left"), minlength=len(bounds) + 1)
    assert point.bucket_counts == expected.tolist()
    assert point.count == 8 and point.sum == pytest.approx(rewards.sum() + 0.3)
    assert point.min == -3.0 and point.max == 7.0
    rejected = _last_points(tel.run_dir)[(M.RL_TELEMETRY_REJECTED, ((A.RL_TELEMETRY_REASON, "nan"),))]
    assert rejected.value == 1


@pytest.mark.parametrize(
    ("value", "reason"),
    [(float("nan"), "nan"), (float("inf"), "inf"), (None, "none"), ("text", "non_numeric"), (np.ones(3), "multi_element")],
)
def test_bad_values_are_counted_and_reported_once_with_the_key(make_telemetry, caplog, value, reason):
    tel = make_telemetry()
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        for step in range(3):
            tel.log({"actor/pg_loss": value, "actor/kl_loss": 0.1}, step=step)
        tel.flush()
    reports = [r.getMessage() for r in caplog.records if "'actor/pg_loss'" in r.getMessage()]
    assert len(reports) == 1 and reason in reports[0]
    assert tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: reason}) == 3
    assert tel.latest(M.RL_LOSS, {A.RL_MODEL_ROLE: "actor", A.RL_LOSS_TYPE: "kl"}) == 0.1


def test_non_string_keys_and_non_mappings_never_raise(make_telemetry, caplog):
    tel = make_telemetry()
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.log({3: 1.0, ("a",): 2.0, "actor/pg_loss": 0.5})
        tel.log(None)  # type: ignore[arg-type]
        tel.log([1, 2, 3])  # type: ignore[arg-type]
        tel.record("not.a.metric", [1.0])
        tel.flush()
    assert tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: "bad_key"}) == 2
    assert tel.latest(M.RL_LOSS, {A.RL_MODEL_ROLE: "actor", A.RL_LOSS_TYPE: "policy"}) == 0.5
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "3" in messages and "not.a.metric" in messages and "NoneType" in messages


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"actor/pg_loss": float("nan")}, "'actor/pg_loss' is nan"),
        ({"actor/pg_loss": "x"}, "'actor/pg_loss' is non_numeric"),
        ({"actor/pg_loss": None}, "'actor/pg_loss' is none"),
        ({"actor/pg_loss": np.zeros(2)}, "'actor/pg_loss' is multi_element"),
        ({5: 1.0}, "key 5 is a int"),
    ],
)
def test_strict_mode_raises_naming_the_key(make_telemetry, values, fragment):
    tel = make_telemetry(strict=True)
    tel.log({"actor/pg_loss": 1.0})  # good values pass
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        tel.log(values)
    with pytest.raises(ValueError, match="registry metric"):
        tel.record("nope", [1.0])


def test_unmapped_keys_are_exported_under_the_fallback_up_to_the_limit(make_telemetry):
    tel = make_telemetry(unmapped_key_limit=2)
    tel.log({f"custom/thing_{i}": float(i) for i in range(5)}, step=0)
    tel.flush()
    assert tel.latest(M.RL_UNMAPPED, {A.RL_KEY: "custom/thing_0"}) == 0.0
    assert tel.latest(M.RL_UNMAPPED, {A.RL_KEY: "custom/thing_1"}) == 1.0
    assert tel.latest(M.RL_UNMAPPED, {A.RL_KEY: "custom/thing_2"}) is None
    assert tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: "unmapped_overflow"}) == 3
    tel.shutdown()
    body = [r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT][0]["body"]
    assert len(body) == 5  # the event keeps every value, mapped or not


def test_torch_scalars_and_tensors(make_telemetry):
    torch = pytest.importorskip("torch")
    tel = make_telemetry()
    tel.log({"actor/pg_loss": torch.tensor(0.75), "actor/kl_loss": torch.tensor([0.5]), "actor/total_loss": torch.ones(2)})
    tel.record(M.RL_SAMPLE_RESPONSE_LENGTH, torch.tensor([3, 5, 700]))
    tel.flush()
    assert tel.latest(M.RL_LOSS, {A.RL_MODEL_ROLE: "actor", A.RL_LOSS_TYPE: "policy"}) == 0.75
    assert tel.latest(M.RL_LOSS, {A.RL_MODEL_ROLE: "actor", A.RL_LOSS_TYPE: "kl"}) == 0.5
    assert tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: "multi_element"}) == 1
    assert tel._histograms.snapshot(M.RL_SAMPLE_RESPONSE_LENGTH)[0] == 3


def test_an_exception_in_a_stage_reaches_the_caller_and_marks_the_span(make_telemetry):
    tel = make_telemetry()
    with pytest.raises(RuntimeError, match="boom"):
        with tel.step(0):
            with tel.stage("generate"):
                raise RuntimeError("boom")
    tel.shutdown()
    spans = {s.name: s for s in read_spans(tel.run_dir)}
    assert spans["rl.generate"].status == "error" and "boom" in spans["rl.generate"].status_message
    assert any(e.name == "exception" for e in spans["rl.generate"].events)
    assert spans["rl.step"].status == "error"


def test_stage_rejects_unknown_phase(make_telemetry):
    tel = make_telemetry()
    with tel.stage("train_step") as st:
        with pytest.raises(ValueError, match="onload"):
            st.phase("warmup")


def test_shutdown_is_idempotent_and_later_calls_are_ignored(make_telemetry):
    tel = make_telemetry()
    tel.log({"actor/pg_loss": 1.0}, step=0)
    tel.shutdown()
    tel.shutdown()
    tel.log({"actor/pg_loss": 2.0}, step=1)
    tel.record(M.RL_SAMPLE_REWARD, [1.0])
    assert len([r for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT]) == 1


def test_console_prints_one_summary_line_per_step(make_telemetry, capsys):
    tel = make_telemetry(console=True)
    for step in range(2):
        with tel.step(step):
            tel.log({"critic/rewards/mean": 0.5 + step, "actor/kl_loss": 0.1})
    tel.flush()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[otel-rl] step")]
    assert len(lines) == 2 and "reward 1.5" in lines[1]


def test_run_info_names_the_destinations_without_credentials(make_telemetry):
    tel = make_telemetry(exporters="file", endpoint="http://user:s3cret@127.0.0.1:4318")
    info = json.loads((tel.run_dir / "run.json").read_text())
    assert info["endpoint"] == "http://127.0.0.1:4318"
    assert "s3cret" not in (tel.run_dir / "run.json").read_text() and "s3cret" not in repr(tel)
    assert info["probes"]["torch.cuda"].startswith("absent")


def test_resource_carries_run_and_rank(make_telemetry):
    tel = make_telemetry(run_id="r-42", experiment="exp", framework="trl", rank=3, world_size=8, local_rank=1)
    attrs = dict(tel.resource.attributes)
    assert attrs[A.RL_RUN_ID] == "r-42" and attrs[A.RL_EXPERIMENT_NAME] == "exp" and attrs[A.RL_FRAMEWORK] == "trl"
    assert (attrs[A.RL_RANK], attrs[A.RL_WORLD_SIZE], attrs[A.RL_LOCAL_RANK]) == (3, 8, 1)
    assert attrs[A.TELEMETRY_DISTRO_NAME] == "otel-rl" and attrs[A.SERVICE_NAME] == "otel-rl-test"


def test_importing_and_running_otel_rl_never_imports_torch(tmp_path):
    code = (
        "import sys, otel_rl\n"
        f"tel = otel_rl.init(run_dir={str(tmp_path)!r}, console=False)\n"
        "with tel.step(0):\n"
        "    with tel.stage('train_step', offload=True) as st:\n"
        "        with st.phase('execute'): pass\n"
        "    tel.log({'actor/pg_loss': 1.0})\n"
        "tel.shutdown()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_every_stage_phase_and_span_is_exported_once(make_telemetry):
    tel = make_telemetry()
    run_steps(tel, steps=3)
    tel.shutdown()
    names = Counter(s.name for s in read_spans(tel.run_dir))
    assert names["rl.step"] == 3 and names["rl.execute"] == 3
    assert all(names[f"rl.{stage}"] == 3 for stage in STAGES)


def test_no_metric_attribute_repeats_a_resource_attribute(make_telemetry):
    """Prometheus-compatible stores turn resource attributes into labels and reject a sample whose
    label repeats (remote write answers "label name ... is not unique"), so a data-point attribute
    must never share a name with a resource attribute otel-rl sets."""
    from otel_rl.semconv import METRICS

    tel = make_telemetry(run_id="r", experiment="e", framework="roll", rank=1, world_size=2, local_rank=1)
    resource_keys = set(tel.resource.attributes)
    for mdef in METRICS.values():
        assert not set(mdef.attributes) & resource_keys, mdef.name


def test_a_worker_max_queue_behind_drops_calls_without_blocking_and_counts_them(make_telemetry, caplog):
    tel = make_telemetry(framework="roll", max_queue=10)
    pipeline = tel._pipeline
    with pipeline._drain_lock:  # the worker stalls (a long export, a stuck GIL holder)
        t0 = time.perf_counter()
        for step in range(25):
            tel.log({"actor/pg_loss": float(step)}, step=step)
        tel.record(M.RL_RESPONSE_LENGTH, np.arange(8.0))
        took = time.perf_counter() - t0
    assert took < 1.0  # never waited for the worker
    assert tel.queue_dropped_calls == 16  # 10 queued, 15 log() calls and the record() dropped
    tel.flush()
    dropped = {
        dict(attrs)[A.RL_TELEMETRY_SIGNAL]: slot[0]
        for attrs, slot in tel._latest.series(M.RL_TELEMETRY_DROPPED).items()
        if dict(attrs)[A.RL_TELEMETRY_DROP_REASON] == A.RlTelemetryDropReasonValues.QUEUE_FULL.value
    }
    assert dropped == {A.RlTelemetrySignalValues.LOGS.value: 15, A.RlTelemetrySignalValues.METRICS.value: 1}
    with pipeline._drain_lock:
        for step in range(25, 40):
            tel.log({"actor/pg_loss": float(step)}, step=step)
    tel.flush()
    said = [r for r in caplog.records if "max_queue" in r.getMessage()]
    assert len(said) == 1 and "OTEL_RL_MAX_QUEUE" in said[0].getMessage()
    tel.shutdown()
    steps = sorted(r["attributes"][A.RL_STEP] for r in read_log_records(tel.run_dir) if r["event_name"] == N.RL_LOG_EVENT)
    assert steps == list(range(10)) + list(range(25, 35))  # what was queued went out; nothing twice
