"""A text UTF-8 cannot encode (a lone surrogate, as ``surrogateescape`` decoding of a file name
makes) costs that text alone: it is written escaped, said once with the escaped text named, and
counted in ``rl.telemetry.rejected{reason=not_utf8}``; every other value of the run is written, in
the run folder and over OTLP, and the SDK prints no traceback. Before, one such key logged once
left ``metrics.jsonl`` empty for the whole run, and one such sample id cost every span of its batch."""

from __future__ import annotations

import logging

import pytest
from otlp_sink import OtlpSink

import otel_rl
from otel_rl._sdk.pipeline.utf8 import clean_mapping, clean_value, encodes, escaped
from otel_rl.runs.folder import read_log_records, read_metrics, read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

BAD = b"file\xff.txt".decode("utf-8", "surrogateescape")  # 'file\udcff.txt'
SHOWN = "file\\udcff.txt"
NOT_UTF8 = {A.RL_TELEMETRY_REASON: A.RlTelemetryReasonValues.NOT_UTF8.value}


def test_escaping_keeps_good_text_and_names_the_bad_characters() -> None:
    assert encodes("naïve 学习") and not encodes(BAD)
    assert escaped(BAD) == SHOWN and escaped("naïve\udcff") == "naïve\\udcff"
    said: list[tuple[str, str]] = []
    assert clean_mapping({"a": 1.0, "b": "ok", "c": "é"}, "x", lambda *a: said.append(a)) is None
    assert clean_value(["ok", BAD], "x", lambda *a: said.append(a)) == ["ok", SHOWN]
    assert said == [("x", SHOWN)]


def _run(tel: otel_rl.Telemetry, steps: int = 30, trajectories: int = 50) -> None:
    for step in range(1, steps + 1):
        with tel.step(step):
            with tel.stage("generate", cluster=BAD if step == 2 else "actor"):
                if step == 3:
                    for i in range(trajectories):
                        with tel.trajectory(f"{BAD}-{i}", group=BAD) as traj:
                            with traj.turn(tokens_in=3, prompt=BAD) as turn:
                                turn.done(tokens_out=2, response="ok")
                            traj.reward(1.0)
            values = {"actor/entropy": 0.5, "critic/score/mean": step / steps}
            if step == 1:
                values[BAD] = 1.0
            tel.log(values)
    tel.event(N.RL_LOG_EVENT, {"note": BAD, "x": 1.0}, step=steps)
    tel.record(M.RL_SAMPLE_REWARD, [1.0, 0.5], {"my.dataset": BAD})  # a user's own attribute, not a convention


def test_one_bad_text_costs_itself_alone_in_the_run_folder_and_over_otlp(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING)
    with OtlpSink() as sink:
        tel = otel_rl.Telemetry(
            otel_rl.resolve_config(
                dict(
                    run_dir=str(tmp_path / "run"),
                    exporters="otlp,file",
                    endpoint=sink.endpoint,
                    spool_max_bytes=0,
                    console=False,
                    service_name="bad-text",
                    trajectory_sample_ratio=1.0,
                )
            )
        )
        try:
            _run(tel)
            tel.flush()
            rejected = tel.latest(M.RL_TELEMETRY_REJECTED, NOT_UTF8)
        finally:
            tel.shutdown()
        received = sink.received
    # Nothing the SDK's encoder failed on: no traceback, no "failed to encode" in the console.
    sdk = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]
    assert not [m for m in sdk if "ncode" in m or "surrogate" in m], sdk
    said = [r.getMessage() for r in caplog.records if r.name == "otel_rl" and "UTF-8 cannot encode" in r.getMessage()]
    # one line per distinct bad text (the key, the stage attribute, 50 sample ids + the group, the
    # prompt, the event's note, the record's attribute): each once, never per step or per export
    assert len(said) == len(set(said)) and all("\udcff" not in m for m in said), said
    assert any(repr(SHOWN) in m and "the key" in m for m in said)
    assert rejected is not None and rejected >= 5

    run = tmp_path / "run"
    # Every step's values are in the run folder, the bad key's under its escaped name.
    steps = {r["attributes"].get(A.RL_STEP) for r in read_log_records(run) if r["event_name"] == N.RL_LOG_EVENT}
    assert set(range(1, 31)) <= steps
    points = read_metrics(run)
    assert any(p.attributes.get(A.RL_KEY) == SHOWN for p in points), "the bad key's value is lost"
    assert any(p.name == M.RL_POLICY_ENTROPY for p in points) and any(p.attributes.get(A.RL_CLUSTER) == SHOWN for p in points)
    spans = read_spans(run)
    kept = [s for s in spans if s.name == N.RL_TRAJECTORY_SPAN]
    assert len(kept) == 50 and {s.attributes[A.RL_SAMPLE_ID] for s in kept} == {f"{SHOWN}-{i}" for i in range(50)}
    assert sum(1 for s in spans if s.name == N.RL_STEP_SPAN) == 30

    # The collector got the same: every step event, every step span, all 50 trajectories.
    logged = {a.get(A.RL_STEP) for name, a, _, _ in received.logs if name == N.RL_LOG_EVENT}
    assert set(range(1, 31)) <= logged
    names = [name for _, _, name, _ in received.spans]
    assert names.count(N.RL_STEP_SPAN) == 30 and names.count(N.RL_TRAJECTORY_SPAN) == 50
    sample_ids = {a[A.RL_SAMPLE_ID] for _, _, name, a in received.spans if name == N.RL_TRAJECTORY_SPAN}
    assert sample_ids == {f"{SHOWN}-{i}" for i in range(50)}
    assert any((A.RL_KEY, SHOWN) in attrs for _, attrs, _, _ in received.points), "the bad key's series did not arrive"
    assert any(name == M.RL_POLICY_ENTROPY for name, _, _, _ in received.points)


@pytest.mark.parametrize("where", ["key", "sample id"])
def test_the_metrics_file_keeps_every_export_after_a_bad_key(make_telemetry, where) -> None:
    tel = make_telemetry(trajectory_sample_ratio=1.0)
    for step in range(1, 6):
        if where == "key":
            tel.log({BAD: 1.0, "actor/entropy": 0.5} if step == 1 else {"actor/entropy": 0.5}, step=step)
        else:
            with tel.step(step):
                with tel.trajectory(BAD) as traj:
                    traj.reward(1.0)
                tel.log({"actor/entropy": 0.5})
        tel.flush()
    run = tel.run_dir
    tel.shutdown()
    metrics = run / "metrics.jsonl"
    assert metrics.stat().st_size > 0
    entropy = [p for p in read_metrics(run) if p.name == M.RL_POLICY_ENTROPY]
    assert entropy, "no entropy point was written"
