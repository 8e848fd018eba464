"""Collector faults with the real OpenTelemetry Collector: never lose telemetry, never hurt the run.

    training loop -> otel-rl (spool) --OTLP--> otelcol --OTLP/HTTP--> counting receiver (tests/otlp_sink.py)

The collector (the build of collector-config/builder-config.yaml the stack runs) runs alone on
127.0.0.1 with a config of this test's (otlp receiver -> batch -> otlp_http exporter), started and
stopped by its PID here so it can be stopped and restarted on the same ports mid-run. The receiver decodes every
request, so what arrived is compared with what was emitted exactly: every span, every rl.log
record, every metric data point, none twice.

What each test does to the collector, while a training loop runs 20 steps a second:
- down when the run starts, up 3 s later;
- stopped mid-run for 8 s, then restarted (the 30 s outage of a collector upgrade is the `slow`
  variant; 8 s keeps CI short and already spans several exporter retries and backoffs);
- flapping: up and down every 1.5 s;
- down for longer than a small spool holds: the oldest is dropped, and exactly that is counted;
- and once the whole way to a store: the local stack's agent collector (-> gateway ->
  VictoriaMetrics) stopped for 8 s, after which VictoriaMetrics holds exactly one sample per step.

The collector is stopped with SIGTERM, on which it forwards what it already accepted: a SIGKILLed
collector loses the batch it holds in memory, which no client can get back, so exact counts
would then measure the collector, not otel-rl.

The training loop's telemetry calls are timed each step (step span, two stages, log()). The
outage must not add more than 1 ms to the median step; the slowest step must stay under 1 ms +
TOLERANCE_S, where TOLERANCE_S (250 ms) covers GIL hand-overs to the exporter threads (the SDK's
own exporters cause the same, up to a 5 ms switch interval each) and this 2-core machine being
shared with other jobs (the other test worker: one step took 83 ms there once, its median 0.36 ms).
A blocked export would cost the exporter's timeout (10 s), forty times the tolerance.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from go_builds import collector_binary  # noqa: E402
from local_collector import Collector  # noqa: E402
from otlp_sink import OtlpSink  # noqa: E402
from stack_support import poll, raw_samples  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl._sdk.spool.store import LOGS, METRICS, SPOOL_FULL, TRACES  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

pytestmark = pytest.mark.e2e

TOLERANCE_S = 0.250
STEP_PERIOD_S = 0.05
FIGURES = os.environ.get("OTEL_RL_FAULTS_FIGURES")  # a JSON-lines file to append the measured figures to


@pytest.fixture(scope="module")
def otelcol_binary() -> Path:
    return collector_binary()


@pytest.fixture
def collector(otelcol_binary: Path, tmp_path: Path) -> Iterator[tuple[Collector, OtlpSink]]:
    with OtlpSink() as sink:
        otelcol = Collector(otelcol_binary, sink.endpoint, tmp_path)
        try:
            yield otelcol, sink
        finally:
            otelcol.stop()


def run_training(
    tel: otel_rl.Telemetry,
    seconds: float,
    phase: str,
    timings: dict[str, list[float]],
    start: int,
    tick: Callable[[float], None] | None = None,
) -> int:
    """Train (telemetry only) at 20 steps/s for ``seconds``; time each step's telemetry calls."""
    step = start
    end = time.monotonic() + seconds
    values = {
        "actor/pg_loss": 0.0,
        "actor/entropy": 0.0,
        "critic/score/mean": 0.0,
        **{f"critic/rewards/{s}": 1.0 for s in ("mean", "max", "min")},
    }
    while time.monotonic() < end:
        values["actor/pg_loss"] = float(step)
        t0 = time.perf_counter()
        with tel.step(step):
            with tel.stage("generate", cluster="actor_infer"):
                pass
            with tel.stage("train_step", cluster="actor_train"):
                pass
            tel.log(values)
        timings.setdefault(phase, []).append(time.perf_counter() - t0)
        step += 1
        if tick is not None:
            tick(time.monotonic())
        time.sleep(STEP_PERIOD_S)
    return step


def start_telemetry(otelcol: Collector, protocol: str, tmp_path: Path, **options: Any) -> otel_rl.Telemetry:
    return otel_rl.init(
        service_name="otel-rl-faults",
        endpoint=otelcol.endpoint(protocol),
        protocol=protocol,
        exporters="otlp",
        run_dir=str(tmp_path / "run"),
        console=False,
        metric_export_interval_s=0.5,
        **options,
    )


def check_complete(tel: otel_rl.Telemetry, sink: OtlpSink, steps: int, timeout_s: float = 20.0) -> dict[str, Any]:
    """Every emitted span, rl.log record and metric point arrived exactly once (spool bound not reached)."""
    stats = tel._providers.spool.stats()
    assert all(s.dropped_total == 0 for s in stats.values()), {k: v.dropped for k, v in stats.items()}
    emitted_points = stats[METRICS].appended
    sink.wait_for(
        lambda r: len(r.spans) >= 3 * steps and len(r.events(N.RL_LOG_EVENT)) >= steps and len(r.points) >= emitted_points,
        timeout_s,
        "everything the run emitted",
    )
    time.sleep(0.5)  # anything extra (a duplicate) would arrive now
    received = sink.received
    logs = received.events(N.RL_LOG_EVENT)
    assert sorted(r[1][A.RL_STEP] for r in logs) == list(range(steps))  # each step's event, once
    assert len(received.spans) == 3 * steps == stats[TRACES].appended
    assert len({s[1] for s in received.spans}) == len(received.spans)  # no span twice
    assert len(received.points) == emitted_points
    assert len(set(received.points)) == len(received.points)  # no (metric, attributes, time) twice
    assert len(received.logs) == stats[LOGS].appended
    return {"spans": len(received.spans), "logs": len(logs), "points": len(received.points)}


def check_timings(timings: dict[str, list[float]], outage: str = "outage", healthy: str = "healthy") -> dict[str, float]:
    base, hit = timings[healthy], timings[outage]
    figures = {
        "healthy_median_ms": statistics.median(base) * 1e3,
        "outage_median_ms": statistics.median(hit) * 1e3,
        "healthy_max_ms": max(base) * 1e3,
        "outage_max_ms": max(hit) * 1e3,
        "outage_steps": len(hit),
    }
    assert statistics.median(hit) <= statistics.median(base) + 0.001, figures
    assert max(hit) <= 0.001 + TOLERANCE_S, figures
    return figures


def report(name: str, figures: dict[str, Any]) -> None:
    print(f"\n{name}: {json.dumps(figures)}")
    if FIGURES:
        with open(FIGURES, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": name, **figures}) + "\n")


def test_collector_down_when_the_run_starts(collector, tmp_path: Path) -> None:
    otelcol, sink = collector
    tel = start_telemetry(otelcol, "grpc", tmp_path)
    timings: dict[str, list[float]] = {}
    step = run_training(tel, 3.0, "outage", timings, 0)
    assert sink.received.counts() == {"traces": 0, "logs": 0, "metrics": 0}
    otelcol.start()
    step = run_training(tel, 3.0, "healthy", timings, step)
    t0 = time.monotonic()
    tel.shutdown()
    figures = {"shutdown_s": time.monotonic() - t0, **check_complete(tel, sink, step), **check_timings(timings)}
    report("down_at_start", figures)


@pytest.mark.parametrize("outage_s", [pytest.param(8.0, id="8s"), pytest.param(30.0, id="30s", marks=pytest.mark.slow)])
def test_collector_stopped_mid_run_then_restarted(collector, tmp_path: Path, outage_s: float) -> None:
    otelcol, sink = collector
    otelcol.start()
    tel = start_telemetry(otelcol, "http/protobuf", tmp_path)
    timings: dict[str, list[float]] = {}
    step = run_training(tel, 2.5, "healthy", timings, 0)
    otelcol.stop()
    step = run_training(tel, outage_s, "outage", timings, step)
    assert tel._providers.spool.pending_bytes > 0  # waiting on disk
    otelcol.start()
    step = run_training(tel, 2.5, "after", timings, step)
    # The backlog drains while the run goes on (a loaded machine takes longer than the 2.5 s above);
    # shutdown's own bound is not what this test measures.
    drained_by = time.monotonic() + 60
    while tel._providers.spool.pending_bytes and time.monotonic() < drained_by:
        time.sleep(0.2)
    t0 = time.monotonic()
    tel.shutdown()
    figures = {"outage_s": outage_s, "shutdown_s": time.monotonic() - t0, **check_complete(tel, sink, step), **check_timings(timings)}
    report(f"stopped_{outage_s:.0f}s", figures)


def test_every_step_reaches_victoria_metrics_through_a_restarted_stack_collector(stack: Any, tmp_path: Path) -> None:
    """The whole way to a metrics store: the stack's agent collector (-> gateway -> VictoriaMetrics)
    stopped for 8 s mid-run; with metrics_at_log_time every step's logged loss is its own sample, so the store
    must hold exactly one sample per step, values 0..N-1, none twice, none lost."""
    import otel_rl.ops.alerts as _alerts

    run_id = f"faults-vm-{time.time_ns()}"
    tel = otel_rl.init(
        service_name="otel-rl-faults",
        run_id=run_id,
        endpoint=stack.endpoints["otlp_http"],
        protocol="http/protobuf",
        exporters="otlp",
        run_dir=str(tmp_path / "run"),
        console=False,
        metric_export_interval_s=0.5,
        metrics_at_log_time=True,
    )
    timings: dict[str, list[float]] = {}
    started = time.time()
    try:
        step = run_training(tel, 2.5, "healthy", timings, 0)
        assert stack.down("otelcol-agent") == ["otelcol-agent"]
        step = run_training(tel, 8.0, "outage", timings, step)
        assert tel._providers.spool.pending_bytes > 0
    finally:
        stack.up()  # the agent again, on the same ports
    step = run_training(tel, 2.5, "after", timings, step)
    tel.shutdown()
    assert all(s.dropped_total == 0 for s in tel._providers.spool.stats().values())

    selector = (
        f'{_alerts.metric(M.RL_LOSS)}{{{_alerts.label(A.RL_RUN_ID)}="{run_id}", '
        f'{_alerts.label(A.RL_LOSS_TYPE)}="{A.RlLossTypeValues.POLICY.value}"}}'
    )
    until = time.time() + 60
    samples = poll(
        lambda: raw_samples(stack, selector, started - 60, until),
        lambda got: len(got) >= step,
        60,
        f"{step} samples of {run_id} in VictoriaMetrics",
    )
    got = sorted(v for _, v in samples)
    assert got == [float(s) for s in range(step)], (len(got), step)
    report("stack_restart_victoria_metrics", {"steps": step, "samples": len(got), **check_timings(timings)})


def test_flapping_collector(collector, tmp_path: Path) -> None:
    otelcol, sink = collector
    otelcol.start()
    tel = start_telemetry(otelcol, "grpc", tmp_path)
    timings: dict[str, list[float]] = {}
    step = 0
    for _ in range(4):
        step = run_training(tel, 1.5, "healthy", timings, step)
        otelcol.stop()
        step = run_training(tel, 1.5, "outage", timings, step)
        otelcol.start()
    step = run_training(tel, 1.5, "healthy", timings, step)
    t0 = time.monotonic()
    tel.shutdown()
    figures = {"cycles": 4, "shutdown_s": time.monotonic() - t0, **check_complete(tel, sink, step), **check_timings(timings)}
    report("flapping", figures)


def test_outage_longer_than_the_spool_holds_drops_the_oldest_counted(collector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    otelcol, sink = collector
    monkeypatch.setenv("OTEL_RL_SPOOL_MAX_BYTES", "64KiB")
    otelcol.start()
    tel = start_telemetry(otelcol, "http/protobuf", tmp_path)
    timings: dict[str, list[float]] = {}
    step = outage_start = run_training(tel, 1.0, "healthy", timings, 0)
    otelcol.stop()
    step = run_training(tel, 8.0, "outage", timings, step)
    stats = tel._providers.spool.stats()
    assert stats[LOGS].dropped_total > 0
    otelcol.start()
    step = run_training(tel, 1.0, "after", timings, step)
    tel.shutdown(timeout_s=10)
    stats = tel._providers.spool.stats()
    dropped = {s: st.dropped.get(SPOOL_FULL, 0) for s, st in stats.items()}
    assert all(st.dropped_total == dropped[s] for s, st in stats.items())  # nothing else was dropped
    sink.wait_for(lambda r: len(r.spans) + dropped[TRACES] >= 3 * step, 20, "the spans not dropped")
    sink.wait_for(lambda r: len(r.points) + dropped[METRICS] >= stats[METRICS].appended, 20, "the metric points")
    time.sleep(0.5)
    received = sink.received
    logs = received.events(N.RL_LOG_EVENT)
    # Delivered + dropped == emitted, per signal; nothing twice.
    assert len(received.spans) + dropped[TRACES] == 3 * step == stats[TRACES].appended
    assert len(received.logs) + dropped[LOGS] == stats[LOGS].appended
    assert len(received.points) + dropped[METRICS] == stats[METRICS].appended
    assert len({s[1] for s in received.spans}) == len(received.spans)
    # The oldest of the outage went: the steps whose events arrived are those before the outage
    # (delivered then) and one unbroken run up to the last step.
    kept = sorted(r[1][A.RL_STEP] for r in logs)
    gaps = [(a, b) for a, b in zip(kept, kept[1:]) if b != a + 1]
    assert kept[0] == 0 and kept[-1] == step - 1 and len(gaps) == 1, gaps
    assert gaps[0][0] < outage_start + 20  # the gap starts around the outage, not later
    # The counter reached the collector with the same numbers.
    final: dict[str, float] = {}
    for name, attrs, when, value in sorted(received.points, key=lambda p: p[2]):
        if name == M.RL_TELEMETRY_DROPPED:
            final[dict(attrs)[A.RL_TELEMETRY_SIGNAL]] = value
    assert final.get(LOGS) == dropped[LOGS] and final.get(TRACES) == dropped[TRACES]
    report("over_the_bound", {"steps": step, "dropped": dropped, "delivered_logs": len(logs), **check_timings(timings)})
