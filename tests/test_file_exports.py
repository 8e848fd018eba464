"""The run folder's spans and events are written by the telemetry worker: no SDK batch thread
waking every few milliseconds, and the lines still reach the files within the gather interval."""

from __future__ import annotations

import threading
import time

from otlp_sink import OtlpSink

import otel_rl
from otel_rl._sdk.export.file_exports import QueuedSpanExport
from otel_rl.runs.folder import read_log_records, read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

GENERATE_SPAN = N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", A.RlStageValues.GENERATE.value)

BATCH_THREADS = ("OtelBatchSpanRecordProcessor", "OtelBatchLogRecordProcessor")


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.flushed = self.shut = 0

    def export(self, batch):
        self.batches.append(list(batch))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flushed += 1
        return True

    def shutdown(self) -> None:
        self.shut += 1


def test_a_queued_export_writes_one_batch_when_asked_and_wakes_its_writer():
    inner = Recorder()
    queued = QueuedSpanExport(inner)
    woken = []
    queued.wake = lambda: woken.append(1)
    queued.export(["a"])
    queued.export(["b", "c"])
    assert inner.batches == [] and len(woken) == 2  # nothing written on the exporting thread
    queued.write()
    queued.write()  # nothing queued: nothing exported
    assert inner.batches == [["a", "b", "c"]]
    queued.export(["d"])
    assert queued.force_flush() and inner.batches[-1] == ["d"] and inner.flushed == 1
    queued.export(["e"])
    queued.shutdown()
    assert inner.batches[-1] == ["e"] and inner.shut == 1


def _wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def _started_since(before: set[threading.Thread]) -> list[str]:
    """The names of the threads started since ``before`` (other tests' threads may share a name)."""
    return [t.name for t in threading.enumerate() if t not in before]


TEXT_NOTE = "text takes the SDK's event path"


def _one_step_with_a_text_event(tel) -> None:
    """A step span, a stage span, and a log() whose text value takes the SDK's event path."""
    with tel.step(1):
        with tel.stage(A.RlStageValues.GENERATE.value):
            pass
        tel.log({"actor/pg_loss": 0.5, "note": TEXT_NOTE}, step=1)


def test_the_run_folder_gets_spans_and_events_from_the_worker_without_a_flush(tmp_path):
    before = set(threading.enumerate())
    tel = otel_rl.init(service_name="t", run_dir=str(tmp_path / "run"), console=False, framework="roll")
    try:
        started = set(_started_since(before))
        assert not started & set(BATCH_THREADS), started
        _one_step_with_a_text_event(tel)
        run = tmp_path / "run"
        assert _wait_for(lambda: {s.name for s in read_spans(run)} >= {N.RL_STEP_SPAN, GENERATE_SPAN})
        assert _wait_for(lambda: any(r["event_name"] == N.RL_LOG_EVENT for r in read_log_records(run)))
    finally:
        tel.shutdown()


def test_with_a_collector_too_only_its_signals_keep_batch_threads(tmp_path):
    before = set(threading.enumerate())
    with OtlpSink() as sink:
        tel = otel_rl.init(
            service_name="t", run_dir=str(tmp_path / "run"), console=False, exporters="otlp,file", endpoint=sink.endpoint, spool_max_bytes=0
        )
        try:
            names = _started_since(before)
            assert names.count("OtelBatchSpanRecordProcessor") == 1 and names.count("OtelBatchLogRecordProcessor") == 1
            with tel.step(1):
                pass
            assert _wait_for(lambda: any(s.name == N.RL_STEP_SPAN for s in read_spans(tmp_path / "run")))
        finally:
            tel.shutdown()
        assert sink.received.spans


def test_with_the_spool_a_collectors_spans_and_events_take_the_worker_too(tmp_path):
    """The spool is a disk like the run folder: the worker stores spans and events there after its
    drain; the SDK's batch threads (50 wake-ups a second each) are only for a collector without it."""
    before = set(threading.enumerate())
    with OtlpSink() as sink:
        tel = otel_rl.init(service_name="t", console=False, exporters="otlp", endpoint=sink.endpoint, spool_dir=str(tmp_path / "spool"))
        try:
            started = set(_started_since(before))
            assert not started & set(BATCH_THREADS), started
            _one_step_with_a_text_event(tel)
            sink.wait_for(lambda r: {s[2] for s in r.spans} >= {N.RL_STEP_SPAN, GENERATE_SPAN}, 10, "the step's spans")
            sink.wait_for(lambda r: TEXT_NOTE in str(r.events(N.RL_LOG_EVENT)), 10, "the event")
        finally:
            tel.shutdown()


def test_with_no_destination_no_event_is_built_and_a_tracker_still_gets_them(tmp_path, monkeypatch, capsys):
    """exporters="none" and no tracker: nothing would take an event, so none is built (the values
    are still resolved and stored); with a tracker the events are built and reach it."""
    for options, exported in (({}, False), ({"track_with": "stdout"}, True)):
        tel = otel_rl.init(service_name="t", exporters="none", console=False, framework="roll", **options)
        try:
            assert tel._providers.events_exported is exported
            emitted = []
            logger = tel._pipeline._event_logger
            monkeypatch.setattr(logger, "emit", lambda *a, **k: emitted.append(k.get("event_name")))
            for step in range(4):  # the first steps take the per-key path, the later ones the bulk path
                tel.log({"actor/pg_loss": 0.5 + step, "note": "x"} if step == 0 else {"actor/pg_loss": 0.5 + step}, step=step)
            tel.flush()
            assert (emitted == [N.RL_LOG_EVENT] * 4) is exported and (emitted == []) is not exported
            assert (
                tel.latest(M.RL_LOSS, {A.RL_LOSS_TYPE: A.RlLossTypeValues.POLICY.value, A.RL_MODEL_ROLE: A.RlModelRoleValues.ACTOR.value})
                == 3.5
            )
        finally:
            tel.shutdown()
