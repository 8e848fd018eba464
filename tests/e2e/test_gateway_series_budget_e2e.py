"""The gateway keeps the series budget for senders that do not (gateway-series-budget.yaml).

    rank 0 and rank 3 (otel-rl with OTEL_RL_PER_RANK_METRICS=all: no budget at the source)
    -> the gateway (gateway.yaml + gateway-series-budget.yaml, the real collector build)
    -> a counting receiver

The gateway runs the shipped files, plus an overlay of the test that sends its traces and metrics
pipelines to the receiver instead of Jaeger, Tempo and remote write (and tests/local_collector.py's,
which moves its ports onto free loopback ones). What must arrive: rank 0 whole; from rank 3 no
job-level copy, its stage-time histogram and the span metrics the gateway made of its spans folded
to their sum and count, and its share of the samples whole.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from go_builds import collector_binary  # noqa: E402
from local_collector import Collector  # noqa: E402
from otlp_sink import OtlpSink, Received  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.semconv import METRICS  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402

pytestmark = pytest.mark.e2e

OTELCOL = Path(__file__).resolve().parents[2] / "collector-config" / "otelcol"
STEPS = 3
SPAN_DURATION = yaml.safe_load((OTELCOL / "gateway.yaml").read_text())["connectors"]["span_metrics"]["namespace"] + ".duration"


def send_as_rank(rank: int, endpoint: str, folder: Path) -> None:
    tel = otel_rl.init(
        service_name="budget-gateway",
        run_id="budget-gateway-run",
        rank=rank,
        world_size=4,
        endpoint=endpoint,
        protocol="grpc",
        exporters="otlp",
        console=False,
        run_dir=str(folder / f"rank{rank}"),
        per_rank_metrics="all",  # a sender that keeps no budget of its own
    )
    for step in range(STEPS):
        with tel.step(step):
            with tel.stage(A.RlStageValues.GENERATE.value):
                pass
            tel.log({"actor/pg_loss": 0.01 * step, "critic/score/mean": 0.5})
            tel.record(M.RL_SAMPLE_REWARD, [0.1, 0.5, 0.9])
    tel.shutdown()


def by_rank(received: Received, rank: int) -> dict[str, list[tuple[tuple[float, ...] | None, float]]]:
    """Metric name -> (bucket bounds or None, value or a histogram's count) of each point from ``rank``."""
    out: dict[str, list[tuple[tuple[float, ...] | None, float]]] = {}
    with received.lock:
        for (name, _, _, value), resource, bounds in zip(received.points, received.point_resources, received.point_bounds, strict=True):
            if resource.get(A.RL_RANK) == rank:
                out.setdefault(name, []).append((bounds, value))
    return out


def test_the_gateway_drops_copies_and_folds_per_rank_buckets_of_ranks_other_than_the_lead(tmp_path: Path) -> None:
    binary = collector_binary()
    with OtlpSink() as sink:
        overlay = tmp_path / "to-the-receiver.yaml"
        overlay.write_text(
            yaml.safe_dump(
                {
                    "exporters": {"otlp_http/sink": {"endpoint": sink.endpoint, "encoding": "proto"}},
                    "service": {"pipelines": {s: {"exporters": ["otlp_http/sink"]} for s in ("traces", "metrics")}},
                }
            )
        )
        env = {"OTEL_GATEWAY_BIND": "127.0.0.1", "OTEL_GATEWAY_EVENTS_FILE": str(tmp_path / "events.jsonl")}
        files = [OTELCOL / "gateway.yaml", OTELCOL / "gateway-series-budget.yaml", overlay]
        gateway = Collector(binary, None, tmp_path, files=files, env=env)
        gateway.start(timeout_s=20)
        try:
            for rank in (0, 3):
                send_as_rank(rank, gateway.endpoint("grpc"), tmp_path)
            sink.wait_for(lambda r: {0, 3} <= {res.get(A.RL_RANK) for res in r.point_resources}, 20, "both ranks' metrics")
            # The gateway's batch: 1 s. The second rank's last export may follow its first points.
            sink.wait_for(lambda r: M.RL_SAMPLE_REWARD in by_rank(r, 3) and M.RL_STAGE_DURATION in by_rank(r, 3), 20, "rank 3's points")
            # The span metrics the gateway makes from both ranks' spans: flushed every 15 s.
            sink.wait_for(lambda r: all(SPAN_DURATION in by_rank(r, rank) for rank in (0, 3)), 40, "both ranks' span metrics")
        finally:
            gateway.stop(timeout_s=15)
        lead, other = by_rank(sink.received, 0), by_rank(sink.received, 3)
    assert {M.RL_LOSS, M.RL_SCORE} <= set(lead)
    copies = sorted(n for n in other if n in METRICS and METRICS[n].ranks == "copy")
    assert not copies, f"job-level copies from rank 3 passed the gateway: {copies}"
    assert all(bounds for bounds, _ in lead[M.RL_STAGE_DURATION])
    # Folded, with its count kept: every stage call of rank 3 is still counted.
    assert all(bounds == () for bounds, _ in other[M.RL_STAGE_DURATION])
    assert max(count for _, count in other[M.RL_STAGE_DURATION]) == STEPS
    assert all(bounds for bounds, _ in other[M.RL_SAMPLE_REWARD])
    # gateway.yaml's own part of the budget: span-metric buckets from rank 0 only.
    assert all(bounds for bounds, _ in lead[SPAN_DURATION])
    assert all(bounds == () for bounds, _ in other[SPAN_DURATION])
