"""Several gateways behind a node agent, with one gateway stopped mid-run: nothing lost, nothing twice.

    8 rank processes (otel-rl, OTLP/gRPC) -> agent (agent.yaml + agent-gateways.yaml, the real
    collector build) --load_balancing--> gateway A, gateway B -> a counting receiver each

The agent runs the shipped files unchanged, plus an overlay (tests/local_collector.py) that only
moves its ports onto free loopback ones. The two gateways are the same collector build with a forwarding
config (tests/local_collector.py): what the agent's routing and queue do is under test here; the
shipped gateway files are checked by `validate` (tests/test_collector_config.py).

Once the ranks step, gateway B is stopped (SIGTERM: it forwards what it had accepted) for 7 s and
started again on the same ports. Then, across both receivers:
- every rank's rl.log event of every step arrived exactly once, and every span exactly once;
- spans of steps sent while B was down reached B (they waited in the agent's queue on disk);
- each step's trace is whole on one gateway, and both gateways got traces (the load is spread);
- each rank's metric points, span metrics included, all passed through one gateway;
- the span metrics the agent computed count every step of every rank (calls == steps), although
  each gateway saw only part of each rank's steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from go_builds import collector_binary  # noqa: E402
from local_collector import Collector  # noqa: E402
from otlp_sink import OtlpSink, Received  # noqa: E402

from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
OTELCOL = REPO / "collector-config" / "otelcol"
RANKS = 8
STEPS = 40
STEP_PERIOD_S = 0.15
STAGES = (A.RlStageValues.GENERATE.value, A.RlStageValues.TRAIN_STEP.value)
OUTAGE_S = 7.0  # B is down this long once the ranks step: longer than an exporter's 5 s default timeout
# The span_metrics connector's names: its namespace in the shipped files, its own calls counter and
# span name dimension (the connector's, not otel-rl's conventions).
SPAN_METRICS_CALLS = yaml.safe_load((OTELCOL / "agent-gateways.yaml").read_text())["connectors"]["span_metrics"]["namespace"] + ".calls"
SPAN_NAME = "span.name"

RANK = """
import sys, time
import otel_rl
rank, steps, period, endpoint, folder = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
tel = otel_rl.init(service_name="tier", run_id="tier-run", rank=rank, world_size={ranks}, endpoint=endpoint,
                   protocol="grpc", console=False, run_dir=folder, spool_dir=folder + "/spool",
                   metric_export_interval_s=1.0)
begin = time.monotonic()
for step in range(steps):
    with tel.step(step):
        for stage in {stages!r}:
            with tel.stage(stage):
                time.sleep(0.002)
        tel.log({{"actor/pg_loss": 0.01 * step, "critic/score/mean": 0.5}})
    time.sleep(max(0.0, begin + (step + 1) * period - time.monotonic()))
tel.shutdown()
"""


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[tuple[str, Collector, Received, Received]]:
    """(agent OTLP/gRPC endpoint, gateway B, what gateway A forwarded, what gateway B forwarded)."""
    binary = collector_binary()
    with OtlpSink() as sink_a, OtlpSink() as sink_b:
        gateways = []
        for name, sink in (("a", sink_a), ("b", sink_b)):
            folder = tmp_path / f"gateway-{name}"
            folder.mkdir()
            gateways.append(Collector(binary, sink.endpoint, folder))
        agent_dir = tmp_path / "agent"
        agent_dir.mkdir()
        agent = None
        try:
            for gateway in gateways:
                gateway.start()
            env = {
                "OTEL_AGENT_BIND": "127.0.0.1",
                "OTEL_AGENT_STORAGE_DIR": str(agent_dir / "queue"),
                "OTEL_GATEWAY_HOSTNAMES": "[" + ", ".join(f"127.0.0.1:{g.grpc_port}" for g in gateways) + "]",
            }
            agent = Collector(binary, None, agent_dir, files=[OTELCOL / "agent.yaml", OTELCOL / "agent-gateways.yaml"], env=env)
            agent.start(timeout_s=20)
            yield agent.endpoint("grpc"), gateways[1], sink_a.received, sink_b.received
        finally:
            for collector in ([agent] if agent else []) + gateways:
                collector.stop(timeout_s=15)


def rank_of(resource: dict) -> int:
    return int(resource[A.RL_RANK])


def calls_by_rank(received: Received) -> dict[tuple[int, str], int]:
    """The last cumulative span-metric calls per (rank, span name) in one receiver."""
    latest: dict[tuple[int, str], tuple[int, int]] = {}
    with received.lock:
        for (name, attrs, at, value), resource in zip(received.points, received.point_resources, strict=True):
            if name == SPAN_METRICS_CALLS:
                key = (rank_of(resource), dict(attrs)[SPAN_NAME])
                if key not in latest or at >= latest[key][0]:
                    latest[key] = (at, int(value))
    return {key: value for key, (_, value) in latest.items()}


def all_calls(a: Received, b: Received) -> dict[tuple[int, str], int]:
    return calls_by_rank(a) | calls_by_rank(b)


def test_a_gateway_stopped_mid_run_loses_nothing_and_the_agent_spreads_and_keeps_each_rank_on_one_gateway(
    tier: tuple[str, Collector, Received, Received], tmp_path: Path
) -> None:
    endpoint, gateway_b, a, b = tier
    code = RANK.format(ranks=RANKS, stages=STAGES)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    started = time.time()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), str(STEPS), str(STEP_PERIOD_S), endpoint, str(tmp_path / f"rank-{r}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(RANKS)
    ]
    outage: list[float] = []

    def stop_and_restart_b() -> None:
        # once the ranks are stepping (their first events arrived): starting 8 processes on a busy
        # machine can take longer than the whole run takes afterwards
        end = time.monotonic() + 60
        while not (a.events(N.RL_LOG_EVENT) or b.events(N.RL_LOG_EVENT)) and time.monotonic() < end:
            time.sleep(0.05)
        gateway_b.stop()
        outage.append(time.time())
        time.sleep(OUTAGE_S)
        outage.append(time.time())
        gateway_b.start()

    fault = threading.Thread(target=stop_and_restart_b)
    fault.start()
    for proc in ranks:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    fault.join(30)
    assert len(outage) == 2

    expected_events = {(r, s) for r in range(RANKS) for s in range(STEPS)}
    expected_calls = {
        (r, name): STEPS
        for r in range(RANKS)
        for name in (N.RL_STEP_SPAN, *(N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", s) for s in STAGES))
    }

    def step_events(received: Received) -> list[tuple[int, int]]:
        return [(rank_of(resource), int(attrs[A.RL_STEP])) for _, attrs, _, resource in received.events(N.RL_LOG_EVENT)]

    def arrived() -> bool:
        return set(step_events(a) + step_events(b)) == expected_events and all_calls(a, b) == expected_calls

    end = time.monotonic() + 60  # the span metrics flush every 15 s
    while not arrived() and time.monotonic() < end:
        time.sleep(0.5)
    time.sleep(2.0)  # anything sent twice would arrive by now

    events = Counter(step_events(a) + step_events(b))
    missing = expected_events - set(events)
    assert not missing, f"{len(missing)} rl.log events lost, e.g. {sorted(missing)[:5]}"
    assert not [k for k, n in events.items() if n > 1], "rl.log events arrived twice"

    spans = a.spans + b.spans
    span_ids = Counter(span_id for _, span_id, _, _ in spans)
    assert not [s for s, n in span_ids.items() if n > 1], "spans arrived twice"
    step_spans = {
        (rank_of(res), int(attrs[A.RL_STEP]))
        for (_, _, name, attrs), res in zip(spans, a.span_resources + b.span_resources, strict=True)
        if name == N.RL_STEP_SPAN
    }
    assert step_spans == expected_events, f"{len(expected_events - step_spans)} step spans lost"
    assert len(spans) == RANKS * STEPS * (1 + len(STAGES))

    traces_a, traces_b = {t for t, *_ in a.spans}, {t for t, *_ in b.spans}
    assert traces_a and traces_b, "every trace went to one gateway"
    assert not traces_a & traces_b, "a step's trace was split over the two gateways"

    # Steps that began while B was down: those routed to B waited in the agent's queue on disk.
    down_ns = (int(outage[0] * 1e9), int(outage[1] * 1e9))
    held = sum(1 for start in b.span_starts if down_ns[0] < start < down_ns[1])
    assert held, "no span of the outage reached gateway B: the outage missed the run"

    for received_by, other in ((a, b), (b, a)):
        ranks_here = {rank_of(res) for res in received_by.point_resources}
        ranks_there = {rank_of(res) for res in other.point_resources}
        assert not ranks_here & ranks_there, f"ranks {sorted(ranks_here & ranks_there)} had metric points through both gateways"
    assert all_calls(a, b) == expected_calls, f"span metrics {all_calls(a, b)}"
    print(
        f"\n{RANKS} ranks x {STEPS} steps; B down {outage[1] - outage[0]:.1f} s; traces A {len(traces_a)} B {len(traces_b)}; {held} spans held for B while it was down; took {time.time() - started:.0f} s"
    )
