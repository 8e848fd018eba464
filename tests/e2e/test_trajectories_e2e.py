"""Agent trajectories through the real stack: a run records steps whose generate stage holds
multi-turn trajectories with tool calls (a failed one, a slow one, rewarded ones, ones left out),
exporting OTLP to the collector; then

- Jaeger's query API finds a kept trajectory by its ``rl.sample.id`` tag: a trace of its own, the
  ``rl.trajectory`` root with its ``rl.turn`` / ``rl.tool`` children, and a reference to the
  step's ``rl.generate`` span; a sampled-out trajectory is not there;
- the step's trace in Jaeger holds no trajectory span;
- the trajectory-duration panel's Jaeger link, clicked at 0.1 s, finds exactly the slow trajectories;
- VictoriaMetrics, behind the collector's prometheus_remote_write exporter, answers every query of
  the E2E board's rollout-latency panels (the board's own PromQL, so its metric names are the
  collector's), with a series per tool and the kept / sampled-out counts the run produced.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from stack_support import http_json, poll

import otel_rl
import otel_rl.ops.dashboards as D
import otel_rl.ops.grafana_render as R
from otel_rl.codegen.registry import load_registry
from otel_rl.runs.jaeger import JaegerClient
from otel_rl.runs.records import SpanRecord
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
TRAJECTORY_NAMES = {N.RL_TRAJECTORY_SPAN, N.RL_TURN_SPAN, N.RL_TOOL_SPAN}
REASON = A.RlTrajectoryReasonValues
# Per step: what each trajectory does and, with one slowest kept and no head sampling, why it is kept.
PLAN = (
    ("highest", 0.9, REASON.HIGHEST_REWARD),
    ("failed", 0.5, REASON.FAILED),  # its search tool reports a timeout
    ("slow", 0.5, REASON.SLOWEST),  # a slow python call
    ("lowest", 0.1, REASON.LOWEST_REWARD),
    ("plain-a", 0.5, REASON.SAMPLED_OUT),
    ("plain-b", 0.5, REASON.SAMPLED_OUT),
)


@dataclass(frozen=True)
class TrajectoryRun:
    service: str
    run_id: str

    def sample_id(self, step: int, kind: str) -> str:
        return f"{self.run_id}-{step}-{kind}"


def _agent_loop(tel: Any, sample_id: str, group: int, kind: str, reward: float) -> None:
    """One rollout: generate, call a tool, generate the answer; rewarded."""
    with tel.trajectory(sample_id, group=group) as traj:
        with traj.turn(tokens_in=128, engine="127.0.0.1:8000") as turn:
            time.sleep(0.003)
            turn.done(tokens_out=24, finish_reason="tool_calls")
        if kind == "failed":
            with traj.tool("search", call_id=f"{sample_id}-call") as tool:
                time.sleep(0.002)
                tool.done(error="timeout")
        else:
            with traj.tool("python", call_id=f"{sample_id}-call") as tool:
                time.sleep(0.12 if kind == "slow" else 0.002)
                tool.done(result="42")
        with traj.turn(tokens_in=160) as turn:
            time.sleep(0.003)
            turn.done(tokens_out=8, finish_reason="stop")
        traj.reward(reward, components={"answer": reward})


@pytest.fixture(scope="module")
def trajectory_run(stack: Any) -> TrajectoryRun:
    run = TrajectoryRun(f"otel-rl-e2e-trajectories-{uuid.uuid4().hex[:6]}", f"traj-{uuid.uuid4().hex[:8]}")
    tel = otel_rl.init(
        service_name=run.service,
        run_id=run.run_id,
        endpoint=stack.endpoints["otlp_grpc"],
        protocol="grpc",
        exporters="otlp",
        metric_export_interval_s=1.0,
        trajectory_sample_ratio=0.0,
        trajectory_keep_slowest=1,
        console=False,
    )
    try:
        for step in range(1, STEPS + 1):
            with tel.step(step), tel.stage("generate"):
                for group, (kind, reward, _) in enumerate(PLAN):
                    _agent_loop(tel, run.sample_id(step, kind), group // 2, kind, reward)
                time.sleep(0.8)  # steps spread over several metric exports, so rates have points to read
    finally:
        tel.shutdown()
    return run


def _traces_by_sample_id(stack: Any, run: TrajectoryRun, sample_id: str) -> list[dict[str, Any]]:
    """Jaeger's own search: ``/api/traces?service=...&tags={"rl.sample.id": ...}``."""
    end_us = int(time.time() * 1e6)
    params = {
        "service": run.service,
        "tags": json.dumps({A.RL_SAMPLE_ID: sample_id}),
        "start": str(end_us - 3600 * 10**6),
        "end": str(end_us),
        "limit": "20",
    }
    return list(http_json(f"{stack.endpoints['jaeger']}/api/traces", params).get("data") or [])


def _tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags") or []}


def _step_trace(stack: Any, run: TrajectoryRun, step: int) -> list[SpanRecord]:
    client = JaegerClient(stack.endpoints["jaeger"])
    return poll(
        lambda: client.step_trace_spans(step, service=run.service, run_id=run.run_id),
        lambda spans: any(s.name == "rl.generate" for s in spans),
        60,
        f"step {step}'s trace in Jaeger",
    )


def test_jaeger_finds_a_trajectory_by_sample_id_as_a_trace_of_its_own_linked_to_the_generate_span(
    stack: Any, trajectory_run: TrajectoryRun
) -> None:
    step = 2
    sample_id = trajectory_run.sample_id(step, "failed")
    (trace,) = poll(
        lambda: _traces_by_sample_id(stack, trajectory_run, sample_id),
        lambda traces: len(traces) == 1 and len(traces[0]["spans"]) == 4,
        60,
        f"trajectory {sample_id} in Jaeger",
    )
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in sorted(trace["spans"], key=lambda s: s["startTime"]):
        by_name.setdefault(span["operationName"], []).append(span)
    (root,) = by_name[N.RL_TRAJECTORY_SPAN]
    root_tags = _tags(root)
    assert root_tags[A.RL_SAMPLE_ID] == sample_id and root_tags[A.RL_STEP] == step
    assert root_tags[A.RL_TRAJECTORY_REASON] == REASON.FAILED.value and root_tags[A.RL_TRAJECTORY_FAILED] is True
    assert root_tags[A.RL_TRAJECTORY_TURN_COUNT] == 2 and root_tags[A.RL_TRAJECTORY_TOOL_CALL_COUNT] == 1
    assert root_tags[A.RL_TRAJECTORY_REWARD] == pytest.approx(0.5)
    # The turns and the tool call are the root's children in its own trace.
    assert len(by_name[N.RL_TURN_SPAN]) == 2 and len(by_name[N.RL_TOOL_SPAN]) == 1
    for child in by_name[N.RL_TURN_SPAN] + by_name[N.RL_TOOL_SPAN]:
        assert child["traceID"] == root["traceID"]
        assert [(r["refType"], r["spanID"]) for r in child["references"]] == [("CHILD_OF", root["spanID"])]
    tool_tags = _tags(by_name[N.RL_TOOL_SPAN][0])
    assert tool_tags[A.GEN_AI_TOOL_NAME] == "search" and tool_tags[A.ERROR_TYPE] == "timeout" and tool_tags["error"] is True
    # The root refers to the step's generate stage span, in the step's own trace.
    generate = next(s for s in _step_trace(stack, trajectory_run, step) if s.name == "rl.generate")
    assert generate.trace_id != root["traceID"]
    assert [(r["refType"], r["traceID"], r["spanID"]) for r in root["references"]] == [
        ("FOLLOWS_FROM", generate.trace_id, generate.span_id)
    ]
    # Left out by the step's rule and the zero head ratio: counted, not exported.
    assert _traces_by_sample_id(stack, trajectory_run, trajectory_run.sample_id(step, "plain-a")) == []


def test_the_steps_trace_in_jaeger_holds_no_trajectory_span(stack: Any, trajectory_run: TrajectoryRun) -> None:
    for step in range(1, STEPS + 1):
        spans = _step_trace(stack, trajectory_run, step)
        names = Counter(s.name for s in spans)
        assert names[N.RL_STEP_SPAN] == 1 and names["rl.generate"] == 1, names
        assert not TRAJECTORY_NAMES & set(names), f"step {step}'s trace holds trajectory spans: {names}"
    # Every kept trajectory of a step is a trace of its own.
    step_traces = {s.trace_id for step in range(1, STEPS + 1) for s in _step_trace(stack, trajectory_run, step)}
    kept = [kind for kind, _, reason in PLAN if reason != REASON.SAMPLED_OUT]
    for kind in kept:
        (trace,) = poll(
            lambda kind=kind: _traces_by_sample_id(stack, trajectory_run, trajectory_run.sample_id(3, kind)),
            lambda traces: len(traces) == 1,
            60,
            f"trajectory {kind} of step 3 in Jaeger",
        )
        assert trace["traceID"] not in step_traces
        assert {s["operationName"] for s in trace["spans"]} == TRAJECTORY_NAMES


def test_the_trajectory_duration_panels_jaeger_link_opens_the_kept_trajectories_at_least_that_slow(
    stack: Any, trajectory_run: TrajectoryRun
) -> None:
    """The panel's data link, with Grafana's variables filled in as a click on a 0.1 s point would,
    asked of Jaeger's API: the slow trajectory of every step, nothing faster."""
    board = json.loads(D.generate(REPO_ROOT)[D.DASHBOARDS_DIR / "e2e-timeline.json"])
    (panel,) = [p for p in board["panels"] if p["title"] == "Trajectory duration p50 / p95 / p99"]
    (url,) = [link["url"] for link in panel["fieldConfig"]["defaults"]["links"] if "Jaeger" in link["title"]]
    panes = D.substitute(
        urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["panes"][0],
        {"service": trajectory_run.service, "run": trajectory_run.run_id, "__value.numeric": "0.1", "__from": "0", "__to": "0"},
    )
    (pane,) = json.loads(panes).values()
    (query,) = pane["queries"]
    end_us = int(time.time() * 1e6)
    params = {
        "service": query["service"],
        "operation": query["operation"],
        "tags": json.dumps(dict(pair.split("=", 1) for pair in query["tags"].split())),  # the UI's logfmt, as the API takes it
        "minDuration": query["minDuration"],
        "start": str(end_us - 3600 * 10**6),
        "end": str(end_us),
        "limit": str(query["limit"]),
    }
    expected = {trajectory_run.sample_id(step, "slow") for step in range(1, STEPS + 1)}
    traces = poll(
        lambda: http_json(f"{stack.endpoints['jaeger']}/api/traces", params).get("data") or [],
        lambda found: len(found) >= len(expected),
        60,
        "the slow trajectories through the panel's Jaeger link",
    )
    roots = [s for t in traces for s in t["spans"] if s["operationName"] == N.RL_TRAJECTORY_SPAN]
    assert {_tags(r)[A.RL_SAMPLE_ID] for r in roots} == expected


def _rollout_latency_targets() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The E2E board's queries over agent-loop metrics, as the committed generator writes them."""
    metrics = D.Metrics(load_registry(REPO_ROOT / "semconv"))
    board = json.loads(D.generate(REPO_ROOT)[D.DASHBOARDS_DIR / "e2e-timeline.json"])
    return [(panel, target) for panel, target in D.dashboard_targets(board) if D.uses_agent_loop_metric(target["expr"], metrics)]


def test_victoria_metrics_answers_every_rollout_latency_query_of_the_e2e_board(stack: Any, trajectory_run: TrajectoryRun) -> None:
    api = R.QueryAPI(stack.endpoints["victoria_metrics"])
    metrics = D.Metrics(load_registry(REPO_ROOT / "semconv"))
    targets = _rollout_latency_targets()
    used = {name for _, t in targets for name in metrics.used_in(t["expr"])}
    assert used == D.AGENT_LOOP_METRICS and len(targets) >= 10

    def answers() -> dict[str, list[dict[str, Any]]]:
        window = R.find_run(api, service=trajectory_run.service, run=trajectory_run.run_id)
        values = window.values()
        start, end, step = window.span()
        out = {}
        for panel, target in targets:
            raw = api.query_range(D.substitute(target["expr"], values), start, end, step)
            out[f"{panel['title']} / {target['refId']}"] = [r for r in raw if R.to_series(r, "").has_data]
        return out

    got = poll(answers, lambda a: all(a.values()), 60, "data for every rollout-latency query in VictoriaMetrics", interval_s=2.0)
    tool_label, reason_label = D.label(A.GEN_AI_TOOL_NAME), D.label(A.RL_TRAJECTORY_REASON)
    for key, series in got.items():
        if key.startswith("Tool call duration"):
            assert {s["metric"].get(tool_label) for s in series} == {"search", "python"}, key
    # The kept / sampled-out panel: its kept=true query (A) shows the rules' reasons, kept=false (B) the rest.
    reasons = {
        key[-1]: {s["metric"].get(reason_label) for s in series} for key, series in got.items() if key.startswith("Trajectories kept")
    }
    assert reasons == {"A": {r.value for _, _, r in PLAN if r != REASON.SAMPLED_OUT}, "B": {REASON.SAMPLED_OUT.value}}

    # Every trajectory counted once, under the reason the step's rule gave it.
    selector = f"{metrics.prom(M.RL_TRAJECTORY_COUNT)}{{{D.eq(A.RL_RUN_ID, trajectory_run.run_id)}}}"
    kept_label = D.label(A.RL_TRAJECTORY_KEPT)
    counts = poll(
        lambda: {
            (s["metric"][kept_label], s["metric"][reason_label]): float(s["value"][1])
            for s in api.query(f"sum by ({kept_label}, {reason_label}) (last_over_time({selector}[1h]))", time.time())
        },
        lambda c: sum(c.values()) == STEPS * len(PLAN),
        30,
        "every trajectory in rl.trajectory.count",
    )
    expected = Counter(("false" if r == REASON.SAMPLED_OUT else "true", r.value) for _, _, r in PLAN)
    assert counts == {k: float(STEPS * n) for k, n in expected.items()}, counts
