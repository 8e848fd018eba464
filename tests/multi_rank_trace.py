"""A run folder as a multi-rank job writes it: each rank's file, each rank's resource, and every
rank's stage spans in rank 0's step trace (as workers join it through the propagated context).
Written through the SDK and the run folder's real span exporter; used by tests and benchmarks."""

from __future__ import annotations

import random
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

from otel_rl.exporters import OtlpJsonSpanExporter
from otel_rl.exporters.files import rank_file_name
from otel_rl.runs.folder import TRACES_FILE
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N


def stage_span(stage: A.RlStageValues) -> str:
    return N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", stage.value)


# (span name, cluster, typical seconds) of one step's stages on every rank
STAGES = (
    (stage_span(A.RlStageValues.GENERATE), "actor_infer", 2.0),
    (stage_span(A.RlStageValues.COMPUTE_REWARDS), "reward", 0.5),
    (stage_span(A.RlStageValues.TRAIN_STEP), "actor_train", 3.0),
)
TRAIN_STEP_SPAN = STAGES[2][0]
EXECUTE = A.RlStagePhaseValues.EXECUTE.value
SECOND = 1_000_000_000
SERVICE = "multi-rank"  # every rank's service.name


class _Collected(SpanProcessor):
    """Every span of every rank held, then handed to one exporter in chunks (one request each)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)

    def export(self, exporter: SpanExporter, chunk: int = 1000) -> None:
        for at in range(0, len(self.spans), chunk):
            exporter.export(self.spans[at : at + chunk])
        exporter.shutdown()


def write_multi_rank_steps(
    run_dir: Path,
    ranks: int,
    steps: tuple[int, ...] = (1,),
    straggler: tuple[int, str] | None = None,
    seed: int = 0,
    exporter: SpanExporter | None = None,
    start_s: int = 1_700_000_000,
    stages: tuple[tuple[str, str, float], ...] = STAGES,
) -> None:
    """``ranks`` ranks' spans of ``steps``; ``straggler`` (rank, span name): that stage takes twice as
    long there. Each rank's stage has an execute phase of half its time. Into ``run_dir`` (one
    traces file per rank), or with ``exporter`` (e.g. OTLP to a trace store) all through it. The
    first step starts at ``start_s`` (Unix seconds); the next ones a minute apart. ``stages``: each
    rank's (span name, cluster, typical seconds) in a step, each one a stage span and its phase."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    providers = []
    collected = _Collected()
    for rank in range(ranks):
        resource = Resource.create({SERVICE_NAME: SERVICE, A.RL_RUN_ID: "run-1", A.RL_RANK: rank})
        provider = TracerProvider(resource=resource)
        if exporter is None:
            provider.add_span_processor(SimpleSpanProcessor(OtlpJsonSpanExporter(run_dir / rank_file_name(TRACES_FILE, rank))))
        else:
            provider.add_span_processor(collected)
        providers.append(provider)
    for n, step in enumerate(steps):
        start = (start_s + 60 * n) * SECOND
        root = providers[0].get_tracer("otel_rl").start_span(N.RL_STEP_SPAN, attributes={A.RL_STEP: step}, start_time=start)
        parent = trace.set_span_in_context(root)
        end = start
        for rank, provider in enumerate(providers):
            tracer = provider.get_tracer("otel_rl")
            at = start
            for name, cluster, seconds in stages:
                took = int(seconds * rng.uniform(0.9, 1.1) * SECOND) * (2 if straggler == (rank, name) else 1)
                stage = tracer.start_span(name, context=parent, attributes={A.RL_CLUSTER: cluster}, start_time=at)
                phase = tracer.start_span(f"rl.{EXECUTE}", context=trace.set_span_in_context(stage), start_time=at)
                phase.set_attribute(A.RL_STAGE_PHASE, EXECUTE)
                phase.end(end_time=at + took // 2)
                stage.end(end_time=at + took)
                at += took
            end = max(end, at)
        root.end(end_time=end)
    for provider in providers:
        provider.shutdown()
    if exporter is not None:
        collected.export(exporter)
