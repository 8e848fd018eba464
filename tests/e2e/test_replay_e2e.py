"""A replayed log in the metrics store: through the agent and gateway collectors (the gateway's
prometheus_remote_write exporter) into VictoriaMetrics, every step's metric sample sits at the
step's original time (not at replay time), one sample per logged step.

A store that scrapes (the stack's Prometheus reads the gateway's :8889) sees only each series'
latest value at each scrape, never a replay's history: replays need remote write."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from shared_files import LOGS, needs_shared_logs
from stack_support import poll, raw_samples

import otel_rl.ops.alerts as _alerts
from otel_rl.replay import parse_file, replay_file
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

pytestmark = pytest.mark.e2e

STEP_SECONDS = 3


@needs_shared_logs
def test_a_replayed_log_lands_on_its_original_timeline(stack: Any, tmp_path: Path):
    src = LOGS / "trl_grpo_aaipl_checkpoint-500_trainer_state.json"
    start = int(time.time()) - 27 * 60  # 500 steps x 3 s: from 27 to 2 minutes ago
    run_id = f"e2e-replay-{start}"
    result = replay_file(
        src,
        out=io.StringIO(),
        progress=False,
        run_id=run_id,
        run_dir=tmp_path / "run",
        endpoint=stack.endpoints["otlp_http"],
        protocol="http/protobuf",
        exporters="otlp",
        start_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
        step_seconds=STEP_SECONDS,
    )
    replayed_at = time.time()
    parsed = parse_file(src)
    expected = [(start + r.step * STEP_SECONDS, float(r.values["entropy"])) for r in parsed.records if "entropy" in r.values]
    assert result.records == len(parsed.records) == len(expected) == 50

    selector = f'{_alerts.metric(M.RL_POLICY_ENTROPY)}{{{_alerts.label(A.RL_RUN_ID)}="{run_id}"}}'
    samples = poll(
        lambda: raw_samples(stack, selector, start - 60, replayed_at + 60),
        lambda got: len(got) >= len(expected),
        60,
        f"the replayed entropy samples of {run_id} in VictoriaMetrics",
    )
    assert [t for t, _ in samples] == [when * 1000 for when, _ in expected]  # the steps' own times, one each
    assert [v for _, v in samples] == pytest.approx([v for _, v in expected])
    assert samples[-1][0] / 1000 < replayed_at - 60  # nothing landed at replay time


def test_a_replay_with_the_default_clock_stores_every_point_it_sent(stack: Any, tmp_path: Path, monkeypatch, capsys):
    """`otel-rl replay LOG` into the stack's endpoint, no clock flag: the samples it prints as
    stored are all it sent, and VictoriaMetrics holds exactly that many for the run."""
    from otel_rl.cli import main

    src = tmp_path / "verl.jsonl"
    rows = [
        {"step": s, "data": {"actor/entropy": 0.5 + s / 100, "critic/score/mean": s / 10, "actor/pg_loss": -s / 1000}} for s in range(1, 31)
    ]
    src.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_id = f"e2e-default-clock-{int(time.time())}"
    monkeypatch.setenv("OTEL_RL_STACK_DIR", str(stack.data_dir))
    before = time.time()
    code = main(
        ["replay", str(src), "--endpoint", stack.endpoints["otlp_http"], "--run-id", run_id, "--run-dir", str(tmp_path / "run"), "-q"]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    match = re.search(r"stored: ([\d,]+) of ([\d,]+) metric samples", printed)
    assert match is not None, printed
    stored, sent = (int(g.replace(",", "")) for g in match.groups())
    assert stored == sent >= 3 * len(rows)  # every value of every step is a sample
    assert "so that the last step is now" in printed and "retention is unknown" not in printed

    # Read back independently: every sample of the run, at the replayed steps' times (30 steps x 60 s, ending now).
    selector = f'{{{_alerts.label(A.RL_RUN_ID)}="{run_id}"}}'
    entropy = raw_samples(stack, f"{_alerts.metric(M.RL_POLICY_ENTROPY)}{selector}", before - 31 * 60, time.time() + 60)
    assert [v for _, v in entropy] == pytest.approx([r["data"]["actor/entropy"] for r in rows])
    assert entropy[-1][0] / 1000 == pytest.approx(before, abs=30)  # the run ends now
    assert entropy[-1][0] - entropy[0][0] == 29 * 60_000  # one step a minute, kept
    step_ms = {t for t, _ in entropy}
    samples = raw_samples(stack, selector, before - 31 * 60, time.time() + 60)
    assert sum(1 for t, _ in samples if t in step_ms) == stored  # the store holds what replay said it stored
