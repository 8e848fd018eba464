"""`otel-rl demo --agent` with the real SDK: the tool-calling policy's rollouts become agent
trajectories in the run folder, kept by the step's tail rule, and `otel-rl trace` shows them
(the slowest as span trees, every kept one as a track of the Chrome export)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

pytest.importorskip("torch")

from otel_rl import cli  # noqa: E402
from otel_rl.runs.folder import find_step_trace, read_log_records, read_metrics, read_spans  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

STEPS, QUESTIONS, GROUP = 6, 8, 8  # 64 trajectories a step; the CLI's group size is 8
R = A.RlTrajectoryReasonValues
TAIL = {R.FAILED.value, R.SLOWEST.value, R.HIGHEST_REWARD.value, R.LOWEST_REWARD.value}
KEPT = TAIL | {R.HEAD_SAMPLED.value}
GENERATE_SPAN = N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", A.RlStageValues.GENERATE.value)


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One real agent demo run with the default trajectory sampling: (run folder, what it printed)."""
    out = tmp_path_factory.mktemp("agent") / "run"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(printed):
        for name in ("OTEL_RL_TRAJECTORY_SAMPLE_RATIO", "OTEL_RL_TRAJECTORY_KEEP_SLOWEST", "OTEL_EXPORTER_OTLP_ENDPOINT"):
            env.delenv(name, raising=False)
        rc = cli.main(["demo", "--agent", "--steps", str(STEPS), "--questions", str(QUESTIONS), "--out", str(out), "--quiet"])
    assert rc == 0, printed.getvalue()
    return out, printed.getvalue()


def _trajectories(run: Path) -> dict[str, list]:
    """trace id -> [root, children in start order] of every kept trajectory."""
    traces: dict[str, list] = defaultdict(list)
    for span in read_spans(run):
        if span.name in (N.RL_TRAJECTORY_SPAN, N.RL_TURN_SPAN, N.RL_TOOL_SPAN):
            traces[span.trace_id].append(span)
    for members in traces.values():
        members.sort(key=lambda s: (s.parent_span_id is not None, s.start_ns))
    return dict(traces)


def test_the_summary_counts_what_was_kept_and_says_how_to_look(agent_run):
    run, printed = agent_run
    recorded = STEPS * QUESTIONS * GROUP
    kept = len(_trajectories(run))
    assert 0 < kept < recorded  # the default sampling keeps a visible set, not everything
    assert f"{STEPS} GRPO steps of {QUESTIONS * GROUP} trajectories" in printed
    assert f"trajectories kept as traces: {kept} of {recorded} (" in printed, printed
    assert f"only counted: sampled_out {recorded - kept}" in printed
    assert "its 3 slowest, its highest and lowest reward, and 0.01 of the rest" in printed
    assert f"otel-rl trace {run} --step {STEPS} --slowest 5" in printed
    assert f"otel-rl trace {run} --step {STEPS} --format chrome --out" in printed
    calls = int(re.search(r"tool calls: (\d+), (\d+) failed", printed).group(1))  # type: ignore[union-attr]

    # every trajectory is measured, kept or not; every logged key maps and nothing was refused
    points = read_metrics(run)
    last = {p.name: p for p in points if p.name in (M.RL_TRAJECTORY_DURATION, M.RL_TRAJECTORY_TURNS)}
    assert last[M.RL_TRAJECTORY_DURATION].count == last[M.RL_TRAJECTORY_TURNS].count == recorded
    tool = [p for p in points if p.name == M.RL_TOOL_DURATION and p.attributes == {A.GEN_AI_TOOL_NAME: "calculator"}]
    assert tool[-1].count == calls
    names = Counter(p.name for p in points)
    assert not names[M.RL_UNMAPPED] and not names[M.RL_TELEMETRY_REJECTED] and not names[M.RL_TELEMETRY_DROPPED]
    logged = [r for r in read_log_records(run) if r.get("event_name") == N.RL_LOG_EVENT]
    assert [r["attributes"][A.RL_STEP] for r in logged] == list(range(1, STEPS + 1))
    assert all(0.0 <= r["body"]["critic/score/mean"] <= 1.0 for r in logged)


def test_each_kept_trajectory_is_a_trace_of_turns_and_tool_calls_linked_to_its_generate_stage(agent_run):
    run, _ = agent_run
    spans = read_spans(run)
    generate = {}
    for step in range(1, STEPS + 1):
        (stage,) = [s for s in find_step_trace(spans, step) if s.name == GENERATE_SPAN]
        generate[step] = (stage.trace_id, stage.span_id)
    errors: Counter[str] = Counter()
    for root, *children in _trajectories(run).values():
        attributes = root.attributes
        assert root.name == N.RL_TRAJECTORY_SPAN and root.parent_span_id is None
        assert root.links == [generate[attributes[A.RL_STEP]]]
        assert re.fullmatch(r"q\d+\.\d+", attributes[A.RL_SAMPLE_ID])
        assert attributes[A.RL_SAMPLE_ID].split(".")[0] == f"q{attributes[A.RL_SAMPLE_GROUP_ID]}"
        assert attributes[A.RL_TRAJECTORY_REASON] in KEPT
        turns = [c for c in children if c.name == N.RL_TURN_SPAN]
        tools = [c for c in children if c.name == N.RL_TOOL_SPAN]
        assert len(turns) == attributes[A.RL_TRAJECTORY_TURN_COUNT] >= 1
        assert len(tools) == attributes[A.RL_TRAJECTORY_TOOL_CALL_COUNT] == len(turns) - 1
        # turns and tool calls alternate; every turn but the last asked for the tool
        assert [c.name for c in children] == [N.RL_TURN_SPAN, N.RL_TOOL_SPAN] * len(tools) + [N.RL_TURN_SPAN]
        reasons = [t.attributes[A.GEN_AI_RESPONSE_FINISH_REASONS] for t in turns]
        assert reasons == [["tool_calls"]] * len(tools) + [["stop"]]
        assert all(t.attributes[A.GEN_AI_USAGE_INPUT_TOKENS] > 0 and t.attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] > 0 for t in turns)
        assert {t.attributes[A.GEN_AI_TOOL_NAME] for t in tools} <= {"calculator"}
        failed_tools = [t for t in tools if t.status == "error"]
        for tool in failed_tools:
            assert tool.attributes[A.ERROR_TYPE] in ("TimeoutError", "ZeroDivisionError")
            errors[tool.attributes[A.ERROR_TYPE]] += 1
        assert attributes[A.RL_TRAJECTORY_FAILED] is bool(failed_tools)
        if failed_tools:
            assert attributes[A.RL_TRAJECTORY_REASON] == R.FAILED.value
        assert all(root.start_ns <= c.start_ns <= c.end_ns <= root.end_ns for c in children)
        parts = attributes[f"{A.RL_TRAJECTORY_REWARDS}.answer"] + attributes[f"{A.RL_TRAJECTORY_REWARDS}.tool_cost"]
        assert attributes[A.RL_TRAJECTORY_REWARD] == pytest.approx(parts)
        assert A.RL_TURN_PROMPT not in str([t.attributes for t in turns])  # samples off: no text exported
    assert errors["TimeoutError"] > 0  # the calculator's hanging calls hit the timeout


def test_the_tail_rule_keeps_failed_slowest_highest_and_lowest_of_each_step(agent_run):
    run, _ = agent_run
    by_step: dict[int, list] = defaultdict(list)
    for root, *_ in _trajectories(run).values():
        by_step[root.attributes[A.RL_STEP]].append(root)
    assert sorted(by_step) == list(range(1, STEPS + 1))
    seen = set()
    for step, roots in by_step.items():
        reasons = Counter(r.attributes[A.RL_TRAJECTORY_REASON] for r in roots)
        seen |= set(reasons)
        assert reasons[R.HIGHEST_REWARD.value] <= 1 and reasons[R.LOWEST_REWARD.value] <= 1 and reasons[R.SLOWEST.value] <= 3
        rewards = [r.attributes[A.RL_TRAJECTORY_REWARD] for r in roots]
        for root in roots:
            reason = root.attributes[A.RL_TRAJECTORY_REASON]
            if reason == R.HIGHEST_REWARD.value:  # the step's best: none kept beats it
                assert root.attributes[A.RL_TRAJECTORY_REWARD] == max(rewards), step
            if reason == R.LOWEST_REWARD.value:
                assert root.attributes[A.RL_TRAJECTORY_REWARD] == min(rewards), step
        slowest = [r.duration_ns for r in roots if r.attributes[A.RL_TRAJECTORY_REASON] == R.SLOWEST.value]
        others = [r.duration_ns for r in roots if r.attributes[A.RL_TRAJECTORY_REASON] not in (R.SLOWEST.value, R.FAILED.value)]
        if slowest and others:
            assert min(slowest) > max(others), step  # nothing kept for another reason ran longer
    assert seen >= TAIL, seen


def test_trace_slowest_prints_the_steps_longest_trajectories_first_as_trees(agent_run, capsys):
    run, _ = agent_run
    kept = [t for t in _trajectories(run).values() if t[0].attributes[A.RL_STEP] == STEPS]
    assert cli.main(["trace", str(run), "--step", str(STEPS), "--slowest", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"step {STEPS}: {len(kept)} agent trajectories kept, from run folder {run}; the 3 slowest, longest first")
    recorded = STEPS * QUESTIONS * GROUP
    assert f"the run's metrics (all steps): {recorded} recorded, {len(_trajectories(run))} kept as traces (" in out
    printed = re.findall(r"^trace ([0-9a-f]{32})  rl\.trajectory ", out, flags=re.MULTILINE)
    by_id = {t[0].trace_id: t for t in kept}
    expected = sorted(kept, key=lambda t: -t[0].duration_ns)[:3]
    assert printed == [t[0].trace_id for t in expected]
    blocks = out.split("\n#")[1:]
    for rank, (block, trace_id) in enumerate(zip(blocks, printed), 1):
        root, *children = by_id[trace_id]
        head = block.splitlines()[0]
        assert head.startswith(f"{rank}  trajectory {root.attributes[A.RL_SAMPLE_ID]} (group {root.attributes[A.RL_SAMPLE_GROUP_ID]})")
        assert f"kept: {root.attributes[A.RL_TRAJECTORY_REASON]}" in head and "reward " in head
        assert block.count("rl.turn  finish=") == sum(c.name == N.RL_TURN_SPAN for c in children)
        assert block.count("rl.tool  calculator") == sum(c.name == N.RL_TOOL_SPAN for c in children)
        assert block.count("ERROR: ") == sum(c.status == "error" for c in children)


def test_chrome_export_gives_each_kept_trajectory_a_track_of_its_own(agent_run, tmp_path, capsys):
    run, _ = agent_run
    kept = [t for t in _trajectories(run).values() if t[0].attributes[A.RL_STEP] == STEPS]
    out = tmp_path / "step.json"
    assert cli.main(["trace", str(run), "--step", str(STEPS), "--format", "chrome", "--out", str(out)]) == 0
    assert f"{len(kept)} agent trajectories (a thread each)" in capsys.readouterr().out
    events = json.loads(out.read_text())["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    tracks = {tid: name for tid, name in threads.items() if name.startswith("trajectory ")}
    assert len(tracks) == len(kept)
    tid_of_trace: dict[str, set[int]] = defaultdict(set)
    for e in events:
        if e["ph"] == "X" and e["cat"] in (N.RL_TRAJECTORY_SPAN, N.RL_TURN_SPAN, N.RL_TOOL_SPAN):
            tid_of_trace[e["args"]["otel.trace_id"]].add(e["tid"])
    assert set(tid_of_trace) == {t[0].trace_id for t in kept}
    assert all(len(tids) == 1 for tids in tid_of_trace.values())  # a trajectory's turns and tools on its own thread
    assert len({next(iter(tids)) for tids in tid_of_trace.values()}) == len(kept)
    for root, *_ in kept:
        (tid,) = tid_of_trace[root.trace_id]
        a = root.attributes
        assert tracks[tid] == f"trajectory {a[A.RL_SAMPLE_ID]} (step {STEPS}, {a[A.RL_TRAJECTORY_REASON]})"
    assert {"step", "actor_infer", "actor_train"} <= set(threads.values())  # the step's own threads are still there


def test_agent_mode_refuses_the_other_demos_options(capsys):
    assert cli.main(["demo", "--agent", "--ranks", "2", "--async"]) == 2
    assert "otel-rl demo: --ranks, --async: not with --agent (it trains with GRPO on one process)" in capsys.readouterr().err


def test_demo_help_explains_the_agent_mode(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "--agent" in out and "--questions" in out and "otel-rl trace RUN --step N --slowest 5" in out
