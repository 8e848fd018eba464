"""otel_rl.testing: a capture reads back what the exporters wrote, and leaves init()'s telemetry alone."""

from __future__ import annotations

import numpy as np

import otel_rl
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.testing import capture, otel_rl_capture  # noqa: F401 - the fixture


def test_a_capture_reads_back_spans_events_and_points(make_telemetry):
    running = make_telemetry()  # the process's own telemetry, from init()
    with capture(framework="roll") as cap:
        tel = cap.telemetry
        for step in range(2):
            with tel.step(step), tel.stage("generate", cluster="actor_infer"):
                tel.log({"actor/pg_loss": 0.5 + step}, step=step)
                tel.record(M.RL_SAMPLE_RESPONSE_LENGTH, np.array([10.0, 20.0, 30.0]))
        assert [s.name for s in cap.spans("rl.step")] == ["rl.step", "rl.step"]
        assert len(cap.spans()) == 4  # each step and its stage
        bodies = [e["body"] for e in cap.events("rl.log")]
        assert bodies == [{"actor/pg_loss": 0.5}, {"actor/pg_loss": 1.5}]
        loss = {A.RL_LOSS_TYPE: "policy", A.RL_MODEL_ROLE: "actor"}
        assert cap.latest(M.RL_LOSS, loss) == 1.5
        assert cap.series(M.RL_LOSS) == [loss]
        assert cap.histogram(M.RL_SAMPLE_RESPONSE_LENGTH) == (6, 120.0)
        assert cap.latest(M.RL_LOSS, {A.RL_LOSS_TYPE: "kl"}) is None
        folder = cap.run_dir
    assert not folder.exists()  # its own temporary folder is removed
    assert otel_rl.get_telemetry() is running and not running.closed


def test_the_fixture_captures_under_tmp_path(otel_rl_capture, tmp_path):
    assert otel_rl_capture.run_dir.parent == tmp_path
    otel_rl_capture.telemetry.log({M.RL_GRAD_NORM: 0.25}, step=3)
    assert otel_rl_capture.latest(M.RL_GRAD_NORM) == 0.25
    assert [e["attributes"][A.RL_STEP] for e in otel_rl_capture.events("rl.log")] == [3]
