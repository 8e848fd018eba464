"""The series budget: what a rank other than the lead sends the metrics store (docs/overhead.md).

The end-to-end cases run real ranks' telemetry into a real OTLP/HTTP receiver and read the
protobuf requests they sent; the unit cases hold the filter to the registry's scopes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from otlp_sink import OtlpSink, Received

import otel_rl
from otel_rl._sdk.pipeline.series_budget import REGISTRY_SCOPES, SeriesBudget, series_budget
from otel_rl._sdk.settings.config import resolve_config
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

STEPS = 3


def run_rank(rank: int, folder: Path, endpoint: str, **options: object) -> None:
    tel = otel_rl.init(
        service_name="budget",
        run_id="budget-run",
        rank=rank,
        world_size=4,
        endpoint=endpoint,
        protocol="http/protobuf",
        exporters="otlp,file",
        console=False,
        run_dir=str(folder / f"rank{rank}"),
        metric_export_interval_s=60.0,  # one export, at shutdown
        **options,
    )
    for step in range(STEPS):
        with tel.step(step):
            with tel.stage("generate"):
                pass
            tel.log({"actor/pg_loss": 0.01 * step, "critic/score/mean": 0.5})
            tel.record(M.RL_SAMPLE_REWARD, [0.1, 0.5, 0.9])
    tel.shutdown()


def sent(received: Received, rank: int) -> dict[str, list[tuple[float, ...] | None]]:
    """Metric name -> the bucket bounds of each point rank ``rank`` sent (None: not a histogram)."""
    out: dict[str, list[tuple[float, ...] | None]] = {}
    for (name, _, _, _), resource, bounds in zip(received.points, received.point_resources, received.point_bounds):
        if resource.get(A.RL_RANK) == rank:
            out.setdefault(name, []).append(bounds)
    return out


def test_a_rank_other_than_the_lead_sends_its_own_state_and_its_share_but_no_copies(tmp_path: Path) -> None:
    with OtlpSink() as sink:
        run_rank(0, tmp_path, sink.endpoint)
        run_rank(3, tmp_path, sink.endpoint)
        lead, other = sent(sink.received, 0), sent(sink.received, 3)
    # The trainer's job-level values (copies on every rank): the lead's only.
    assert {M.RL_LOSS, M.RL_SCORE} <= set(lead)
    assert not {M.RL_LOSS, M.RL_SCORE} & set(other)
    assert not [n for n in other if REGISTRY_SCOPES.get(n) == "copy"]
    # Its stage time: every rank; the buckets from the lead, the sum and count from the others.
    assert all(bounds for bounds in lead[M.RL_STAGE_DURATION])
    assert other[M.RL_STAGE_DURATION] and all(bounds == () for bounds in other[M.RL_STAGE_DURATION])
    # Its part of the job's samples: every rank, whole.
    assert all(bounds for bounds in other[M.RL_SAMPLE_REWARD])
    # The rank's own run folder keeps everything.
    folder = (tmp_path / "rank3").rglob("*metrics*")
    assert any(f'"{M.RL_SCORE}"' in p.read_text() for p in folder if p.is_file())


def test_per_rank_metrics_asks_for_whole_copies(tmp_path: Path) -> None:
    with OtlpSink() as sink:
        run_rank(3, tmp_path, sink.endpoint, per_rank_metrics=f"{M.RL_SCORE},{M.RL_STAGE_DURATION}")
        other = sent(sink.received, 3)
    assert M.RL_SCORE in other and M.RL_LOSS not in other
    assert all(bounds for bounds in other[M.RL_STAGE_DURATION])
    with OtlpSink() as sink:
        run_rank(2, tmp_path, sink.endpoint, per_rank_metrics="all")
        assert {M.RL_SCORE, M.RL_LOSS} <= set(sent(sink.received, 2))


def test_the_lead_and_an_all_request_apply_no_budget() -> None:
    assert series_budget(None) is None and series_budget(0) is None
    assert series_budget(5, ("all",)) is None
    assert isinstance(series_budget(5), SeriesBudget)


def test_a_folded_histogram_keeps_its_count_sum_min_and_max() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    stage = meter.create_histogram(M.RL_STAGE_DURATION, unit="s")
    for v in (0.5, 2.0, 7.5):
        stage.record(v, {A.RL_STAGE: "generate"})
    meter.create_histogram("my.own.histogram").record(1.0)  # not in the registry: sent as it is
    data = SeriesBudget(REGISTRY_SCOPES).apply(reader.get_metrics_data())
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    point = metrics[M.RL_STAGE_DURATION].data.data_points[0]
    assert (point.count, point.sum, point.min, point.max) == (3, 10.0, 0.5, 7.5)
    assert list(point.bucket_counts) == [3] and list(point.explicit_bounds) == []
    assert list(metrics["my.own.histogram"].data.data_points[0].explicit_bounds)


def test_every_registry_metric_has_a_rank_scope_and_per_rank_state_is_own() -> None:
    assert set(REGISTRY_SCOPES) == set(METRICS)
    # What a straggler hunt compares across ranks.
    for name in (M.RL_STAGE_DURATION, M.RL_GPU_MEMORY_USAGE, M.HW_GPU_UTILIZATION, M.HW_GPU_MEMORY_USAGE, M.PROCESS_MEMORY_USAGE):
        assert REGISTRY_SCOPES[name] == "own", name
    for name in (M.RL_REWARD, M.RL_LOSS, M.RL_POLICY_KL, M.RL_GRAD_NORM, M.RL_STEP_DURATION):
        assert REGISTRY_SCOPES[name] == "copy", name


def test_per_rank_metrics_names_an_unknown_metric_and_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    config = resolve_config({}, {"OTEL_RL_PER_RANK_METRICS": f"{M.RL_SCORE}, rl.not_a_metric"})
    assert config.per_rank_metrics == ()  # a bad variable never stops the run: warned, then the default
    assert "OTEL_RL_PER_RANK_METRICS" in caplog.text and "'rl.not_a_metric' is not a registry metric name" in caplog.text
    with pytest.raises(ValueError, match=r"per_rank_metrics.*'rl.nope' is not a registry metric name.*or write all"):
        resolve_config({"per_rank_metrics": ["rl.nope"]}, {})
    assert resolve_config({"per_rank_metrics": "all"}, {}).per_rank_metrics == ("all",)
