"""Agent trajectories (``Telemetry.trajectory``): each a trace of its own, read back from the run
folder the real exporters wrote; the step's tail rule; many coroutines and threads at once; a
trajectory that outlives its step; bad input said once."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time

import pytest

import otel_rl
from otel_rl.runs.folder import read_metrics, read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

R = A.RlTrajectoryReasonValues
CHAT, TOOL, AGENT = (
    A.GenAiOperationNameValues.CHAT.value,
    A.GenAiOperationNameValues.EXECUTE_TOOL.value,
    A.GenAiOperationNameValues.INVOKE_AGENT.value,
)
INTERNAL, CLIENT = 1, 3  # OTLP span kinds


def _trees(run_dir) -> dict[str, list]:
    """The run folder's trajectory traces: trace id -> [root, children in start order]."""
    spans = read_spans(run_dir)
    assert not spans.problems
    traces: dict[str, list] = {}
    for span in spans:
        if span.name in (N.RL_TRAJECTORY_SPAN, N.RL_TURN_SPAN, N.RL_TOOL_SPAN):
            traces.setdefault(span.trace_id, []).append(span)
    for trace_id, members in traces.items():
        members.sort(key=lambda s: (s.parent_span_id is not None, s.start_ns))
        assert members[0].name == N.RL_TRAJECTORY_SPAN and members[0].parent_span_id is None, trace_id
    return traces


def _kept(run_dir) -> dict[str, str]:
    """sample id -> why its trajectory was kept."""
    return {t[0].attributes[A.RL_SAMPLE_ID]: t[0].attributes[A.RL_TRAJECTORY_REASON] for t in _trees(run_dir).values()}


def _count(tel, kept: bool, reason: str) -> float:
    return tel.latest(M.RL_TRAJECTORY_COUNT, {A.RL_TRAJECTORY_KEPT: kept, A.RL_TRAJECTORY_REASON: reason}) or 0


def test_a_kept_trajectory_is_its_own_trace_of_turns_and_tool_calls_linked_to_the_generate_stage(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=1.0)
    with tel.step(7):
        with tel.stage("generate"):
            with tel.trajectory("s-1", group=3) as traj:
                with traj.turn(tokens_in=512, engine="10.0.0.3:8000") as turn:
                    time.sleep(0.002)
                    turn.done(tokens_out=87, finish_reason="tool_calls")
                with pytest.raises(TimeoutError):
                    with traj.tool("search", call_id="call-1", arguments={"q": "secret prompt"}):
                        raise TimeoutError("the search timed out")
                with traj.tool("python") as tool:
                    tool.done(result="42")
                with traj.turn(tokens_in=640, engine="[::1]:30000") as turn:
                    pass
                turn.done(tokens_out=12, finish_reason="stop")  # after its block, before the trajectory ends
                traj.reward(0.7, components={"format": 1.0, "answer": 0.5})
    tel.shutdown()

    spans = read_spans(tel.run_dir)
    step = next(s for s in spans if s.name == N.RL_STEP_SPAN)
    generate = next(s for s in spans if s.name == "rl.generate")
    (tree,) = _trees(tel.run_dir).values()
    root, *children = tree
    assert root.trace_id not in (step.trace_id, generate.trace_id)  # a trace of its own
    assert root.links == [(generate.trace_id, generate.span_id)]
    assert [c.name for c in children] == [N.RL_TURN_SPAN, N.RL_TOOL_SPAN, N.RL_TOOL_SPAN, N.RL_TURN_SPAN]  # time order
    assert all(c.parent_span_id == root.span_id and c.trace_id == root.trace_id for c in children)
    assert all(root.start_ns <= c.start_ns <= c.end_ns <= root.end_ns for c in children)
    assert children[0].end_ns - children[0].start_ns >= 2_000_000
    assert {s.resource.get(A.RL_RUN_ID) for s in (root, step)} == {tel.config.run_id}
    assert {(s.scope, s.scope_version) for s in tree} == {(step.scope, step.scope_version)} == {("otel_rl", otel_rl.__version__)}
    assert [s.kind for s in tree] == [INTERNAL, CLIENT, INTERNAL, INTERNAL, CLIENT]

    assert root.attributes == {
        A.GEN_AI_OPERATION_NAME: AGENT,
        A.RL_SAMPLE_ID: "s-1",
        A.RL_STEP: 7,
        A.RL_RUN_ID: tel.config.run_id,
        A.RL_RANK: 0,
        A.RL_SAMPLE_GROUP_ID: "3",
        A.RL_TRAJECTORY_REWARD: 0.7,
        f"{A.RL_TRAJECTORY_REWARDS}.format": 1.0,
        f"{A.RL_TRAJECTORY_REWARDS}.answer": 0.5,
        A.RL_TRAJECTORY_TURN_COUNT: 2,
        A.RL_TRAJECTORY_TOOL_CALL_COUNT: 2,
        A.RL_TRAJECTORY_TRUNCATED: False,
        A.RL_TRAJECTORY_FAILED: True,  # the search raised
        A.RL_TRAJECTORY_REASON: R.FAILED.value,  # kept first of all for that
        A.GEN_AI_USAGE_INPUT_TOKENS: 1152,
        A.GEN_AI_USAGE_OUTPUT_TOKENS: 99,
    }
    assert root.status == "unset"  # nothing left the trajectory's block
    first, search, python, last = children
    assert first.attributes == {
        A.GEN_AI_OPERATION_NAME: CHAT,
        A.RL_TURN_INDEX: 0,
        A.GEN_AI_USAGE_INPUT_TOKENS: 512,
        A.GEN_AI_USAGE_OUTPUT_TOKENS: 87,
        A.GEN_AI_RESPONSE_FINISH_REASONS: ["tool_calls"],
        A.SERVER_ADDRESS: "10.0.0.3",
        A.SERVER_PORT: 8000,
    }
    assert (last.attributes[A.RL_TURN_INDEX], last.attributes[A.SERVER_ADDRESS], last.attributes[A.SERVER_PORT]) == (1, "::1", 30000)
    assert last.attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] == 12
    # samples are off: no text, and no exception message (it may quote the call's text)
    assert search.attributes == {
        A.GEN_AI_OPERATION_NAME: TOOL,
        A.GEN_AI_TOOL_NAME: "search",
        A.GEN_AI_TOOL_CALL_ID: "call-1",
        A.ERROR_TYPE: "TimeoutError",
    }
    assert (search.status, search.status_message) == ("error", "")
    assert python.attributes == {A.GEN_AI_OPERATION_NAME: TOOL, A.GEN_AI_TOOL_NAME: "python"} and python.status == "unset"
    assert "secret prompt" not in (tel.run_dir / "traces.jsonl").read_text()


def test_text_only_when_samples_are_on_and_cut_as_samples_are(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=1.0, log_samples=2, sample_text_limit=64)
    with tel.step(1):
        with tel.trajectory(5) as traj:
            with traj.turn(tokens_in=3, prompt="What is 17 * 23?") as turn:
                turn.done(tokens_out=2, finish_reason="stop", response="é" * 100)
            try:
                with traj.tool("calc", arguments={"expression": "17 * 23"}) as tool:
                    raise ValueError("bad expression 17 * 23")
            except ValueError:
                pass
            with traj.tool("calc") as tool:
                tool.done(result="391", error="tool_error")
    tel.shutdown()
    (tree,) = _trees(tel.run_dir).values()
    root, turn_span, failed, reported = tree
    assert root.attributes[A.RL_SAMPLE_ID] == "5"  # an int id, in decimal
    assert turn_span.attributes[A.RL_TURN_PROMPT] == "What is 17 * 23?"
    response = turn_span.attributes[A.RL_TURN_RESPONSE]
    assert len(response.encode()) <= 64 and response.endswith("[cut: 200 bytes]")
    assert failed.attributes[A.GEN_AI_TOOL_CALL_ARGUMENTS] == '{"expression": "17 * 23"}'
    assert (failed.status, failed.status_message) == ("error", "ValueError: bad expression 17 * 23")
    assert reported.attributes[A.GEN_AI_TOOL_CALL_RESULT] == "391" and reported.attributes[A.ERROR_TYPE] == "tool_error"
    assert root.attributes[A.RL_TRAJECTORY_FAILED] is True


def test_without_a_generate_stage_the_trajectory_links_to_the_step_span(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=1.0)
    with tel.step(2) as scope:
        with tel.trajectory("a"):
            pass
    with tel.trajectory("no-step"):  # no step at all: no link, no rl.step
        pass
    tel.shutdown()
    spans = read_spans(tel.run_dir)
    step = next(s for s in spans if s.name == N.RL_STEP_SPAN)
    assert step.trace_id == scope.trace_id
    roots = {t[0].attributes[A.RL_SAMPLE_ID]: t[0] for t in _trees(tel.run_dir).values()}
    assert roots["a"].links == [(step.trace_id, step.span_id)] and roots["a"].attributes[A.RL_STEP] == 2
    assert roots["no-step"].links == [] and A.RL_STEP not in roots["no-step"].attributes


def test_threads_without_the_stage_context_still_link_to_the_generate_stage_seen_in_the_step(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=1.0)
    with tel.step(3):
        with tel.stage("generate"):
            with tel.trajectory("main"):
                pass
            worker = threading.Thread(target=lambda: tel.trajectory("thread").__enter__().__exit__(None, None, None))
            worker.start()
            worker.join()
    tel.shutdown()
    generate = next(s for s in read_spans(tel.run_dir) if s.name == "rl.generate")
    roots = {t[0].attributes[A.RL_SAMPLE_ID]: t[0] for t in _trees(tel.run_dir).values()}
    assert roots["thread"].links == roots["main"].links == [(generate.trace_id, generate.span_id)]


def _rollout(tel, sample_id, *, sleep=0.0, reward=0.5, truncated=False, tool_error=False, raises=False, step=None):
    try:
        with tel.trajectory(sample_id, group=0, step=step) as traj:
            with traj.turn(tokens_in=10) as turn:
                turn.done(tokens_out=5, finish_reason="length" if truncated else "stop")
            try:
                with traj.tool("search"):
                    if sleep:
                        time.sleep(sleep)
                    if tool_error:
                        raise ConnectionError("refused")
            except ConnectionError:
                pass
            traj.reward(reward)
            if raises:
                raise RuntimeError("the environment crashed")
    except RuntimeError:
        pass


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_the_tail_rule_keeps_the_slowest_the_failed_and_the_extreme_rewards_and_counts_the_rest(make_telemetry, ratio):
    tel = make_telemetry(trajectory_sample_ratio=ratio, trajectory_keep_slowest=3)
    special = {"slow-0", "slow-1", "slow-2", "tool-error", "truncated", "raised", "best", "worst"}
    with tel.step(4):
        with tel.stage("generate"):
            for i in range(150):
                _rollout(tel, f"plain-{i}", reward=0.25 + (i % 7) / 100)
                if i % 50 == 0:
                    _rollout(tel, f"slow-{i // 50}", sleep=0.1)
            _rollout(tel, "tool-error", tool_error=True)
            _rollout(tel, "truncated", truncated=True)
            _rollout(tel, "raised", raises=True)
            _rollout(tel, "best", reward=10.0)
            _rollout(tel, "worst", reward=-10.0)
    tel.flush()
    kept = _kept(tel.run_dir)
    expected = {"slow-0": R.SLOWEST, "slow-1": R.SLOWEST, "slow-2": R.SLOWEST, "tool-error": R.FAILED, "truncated": R.FAILED}
    expected |= {"raised": R.FAILED, "best": R.HIGHEST_REWARD, "worst": R.LOWEST_REWARD}
    assert {k: v for k, v in kept.items() if k in special} == {k: v.value for k, v in expected.items()}
    plain_kept = {k for k in kept if k.startswith("plain-")}
    assert plain_kept == (set() if ratio == 0.0 else {f"plain-{i}" for i in range(150)})
    assert all(v == R.HEAD_SAMPLED.value for k, v in kept.items() if k.startswith("plain-"))
    total = 150 + len(special)
    assert _count(tel, True, R.SLOWEST.value) == 3 and _count(tel, True, R.FAILED.value) == 3
    assert _count(tel, True, R.HIGHEST_REWARD.value) == 1 and _count(tel, True, R.LOWEST_REWARD.value) == 1
    assert _count(tel, True, R.HEAD_SAMPLED.value) == (150 if ratio else 0)
    assert _count(tel, False, R.SAMPLED_OUT.value) == (0 if ratio else 150)
    roots = {t[0].attributes[A.RL_SAMPLE_ID]: t[0] for t in _trees(tel.run_dir).values()}
    assert roots["truncated"].attributes[A.RL_TRAJECTORY_TRUNCATED] is True
    assert roots["raised"].attributes[A.ERROR_TYPE] == "RuntimeError" and roots["raised"].status == "error"
    # every trajectory is measured, kept or not
    tel.shutdown()
    durations = [p for p in read_metrics(tel.run_dir) if p.name == M.RL_TRAJECTORY_DURATION]
    assert durations[-1].count == total
    tools = [p for p in read_metrics(tel.run_dir) if p.name == M.RL_TOOL_DURATION and p.attributes == {A.GEN_AI_TOOL_NAME: "search"}]
    assert tools[-1].count == total and tools[-1].max >= 0.1


def test_the_head_ratio_keeps_about_its_share(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=0.25, trajectory_keep_slowest=0)
    n = 2000
    with tel.step(1):
        for i in range(n):
            with tel.trajectory(i):  # no reward: only the ratio decides
                pass
    tel.flush()
    kept = _count(tel, True, R.HEAD_SAMPLED.value)
    assert kept + _count(tel, False, R.SAMPLED_OUT.value) == n
    sigma = math.sqrt(n * 0.25 * 0.75)
    assert abs(kept - n * 0.25) < 6 * sigma
    assert len(_trees(tel.run_dir)) == kept


def test_200_concurrent_coroutines_each_get_their_own_trace(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=1.0)

    async def rollout(i: int) -> None:
        async with tel.trajectory(f"c{i}", group=i % 8) as traj:
            for turn_index in range(i % 3 + 1):
                async with traj.turn(tokens_in=100 + i, engine="127.0.0.1:8000") as turn:
                    await asyncio.sleep(0.001 * (i % 5))
                    turn.done(tokens_out=turn_index + 1, finish_reason="stop")
                async with traj.tool(f"tool{i % 4}", call_id=f"{i}-{turn_index}"):
                    await asyncio.sleep(0)
            traj.reward(i / 200)

    async def main() -> None:
        await asyncio.gather(*(rollout(i) for i in range(200)))

    with tel.step(9):
        with tel.stage("generate"):
            asyncio.run(main())
    tel.flush()
    trees = _trees(tel.run_dir)
    assert len(trees) == 200
    for root, *children in trees.values():
        i = int(root.attributes[A.RL_SAMPLE_ID][1:])
        turns = i % 3 + 1
        assert [c.name for c in children] == [N.RL_TURN_SPAN, N.RL_TOOL_SPAN] * turns
        assert {c.attributes.get(A.GEN_AI_TOOL_CALL_ID) for c in children[1::2]} == {f"{i}-{t}" for t in range(turns)}
        assert {c.attributes[A.GEN_AI_USAGE_INPUT_TOKENS] for c in children[::2]} == {100 + i}
        assert root.attributes[A.RL_TRAJECTORY_TURN_COUNT] == turns and root.attributes[A.RL_TRAJECTORY_REWARD] == i / 200
        assert root.attributes[A.RL_SAMPLE_GROUP_ID] == str(i % 8)
    assert len({root.span_id for root, *_ in trees.values()}) == 200
    assert (
        _count(tel, True, R.HEAD_SAMPLED.value)
        + _count(tel, True, R.SLOWEST.value)
        + _count(tel, True, R.HIGHEST_REWARD.value)
        + _count(tel, True, R.LOWEST_REWARD.value)
        == 200
    )


def test_threads_record_at_once(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=1.0)

    def work(thread: int) -> None:
        for i in range(50):
            with tel.trajectory(f"{thread}-{i}") as traj:
                for _ in range(3):
                    with traj.tool("t"):
                        pass

    with tel.step(1):
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    tel.flush()
    trees = _trees(tel.run_dir)
    assert len(trees) == 400 and all(len(members) == 4 for members in trees.values())


def test_a_trajectory_that_ends_after_its_step_is_decided_on_its_own(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=0.0, trajectory_keep_slowest=1)
    late = tel.trajectory("late-slow")
    late_failed = tel.trajectory("late-failed")
    with tel.step(5):
        late.__enter__()
        late_failed.__enter__()
        _rollout(tel, "on-time")
        _rollout(tel, "on-time-2", reward=0.1)
    time.sleep(0.05)  # the slowest of step 5 by far: were it in the step's group, the tail rule would keep it
    late.__exit__(None, None, None)
    with late_failed.tool("search") as tool:
        tool.done(error="timeout")
    late_failed.__exit__(None, None, None)
    tel.flush()
    kept = _kept(tel.run_dir)
    assert kept == {"on-time": R.SLOWEST.value, "on-time-2": R.LOWEST_REWARD.value, "late-failed": R.FAILED.value} or kept == {
        "on-time": R.HIGHEST_REWARD.value,
        "on-time-2": R.SLOWEST.value,
        "late-failed": R.FAILED.value,
    }
    assert _count(tel, False, R.SAMPLED_OUT.value) == 1  # late-slow: counted, not kept
    roots = {t[0].attributes[A.RL_SAMPLE_ID]: t[0] for t in _trees(tel.run_dir).values()}
    assert roots["late-failed"].attributes[A.RL_STEP] == 5


def test_a_loop_that_never_ends_its_steps_has_them_decided_two_steps_later(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=0.0, trajectory_keep_slowest=1)
    for step in range(4):
        for i in range(3):
            _rollout(tel, f"{step}-{i}", step=step, sleep=0.02 if i == 1 else 0.0)
    tel._pipeline.drain()  # what the worker does on its own: no flush, no step end
    kept = _kept(tel.run_dir) if (tel.run_dir / "traces.jsonl").exists() else {}
    assert {k for k, v in kept.items() if v == R.SLOWEST.value} >= {"0-1", "1-1"}
    tel.flush()  # the held steps too
    assert {k for k, v in _kept(tel.run_dir).items() if v == R.SLOWEST.value} == {f"{s}-1" for s in range(4)}


def test_bad_input_is_reported_once_naming_it_and_counted(make_telemetry, caplog):
    tel = make_telemetry(trajectory_sample_ratio=1.0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.step(1):
            for i in range(3):
                with tel.trajectory(1.5 + i) as traj:  # not a str or int
                    with traj.turn(tokens_in=-5) as turn:
                        turn.done(tokens_out="many")
                    traj.reward(float("nan"), components={"format": float("inf"), "answer": 1.0})
        tel.flush()
    messages = [r.getMessage() for r in caplog.records]
    for what in ("trajectory.reward()", "turn(tokens_in)", "turn.done(tokens_out)", "components['format']", "trajectory(sample_id)"):
        assert len([m for m in messages if what in m]) == 1, (what, messages)
    rejected = {
        reason: tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: reason}) for reason in ("nan", "inf", "negative", "non_numeric")
    }
    assert rejected == {"nan": 3, "inf": 3, "negative": 3, "non_numeric": 3}
    roots = [t[0] for t in _trees(tel.run_dir).values()]
    assert len(roots) == 3 and {r.attributes[A.RL_SAMPLE_ID] for r in roots} == {"1.5", "2.5", "3.5"}
    for root in roots:  # what was bad is left out, the rest is kept
        assert A.RL_TRAJECTORY_REWARD not in root.attributes and root.attributes[f"{A.RL_TRAJECTORY_REWARDS}.answer"] == 1.0
        assert A.GEN_AI_USAGE_INPUT_TOKENS not in root.attributes


def test_past_the_limit_trajectories_are_counted_not_recorded(make_telemetry, caplog):
    tel = make_telemetry(trajectory_sample_ratio=1.0, trajectory_limit=5)
    with caplog.at_level(logging.WARNING, logger="otel_rl"), tel.step(1):
        open_ones = [tel.trajectory(i).__enter__() for i in range(8)]  # 5 held, 3 past the limit
        for traj in open_ones:
            with traj.turn(tokens_in=1):
                pass
            traj.__exit__(None, None, None)
    tel.flush()
    assert len(_trees(tel.run_dir)) == 5
    assert _count(tel, False, R.OVER_LIMIT.value) == 3
    dropped = {A.RL_TELEMETRY_DROP_REASON: "trajectory_limit", A.RL_TELEMETRY_SIGNAL: "traces"}
    assert tel.latest(M.RL_TELEMETRY_DROPPED, dropped) == 3
    assert len([r for r in caplog.records if "trajectory_limit=5" in r.getMessage()]) == 1
    # the held ones were decided: room again
    with tel.step(2), tel.trajectory("again"):
        pass
    tel.flush()
    assert "again" in _kept(tel.run_dir)


def test_after_shutdown_a_trajectory_is_dropped_and_counted(make_telemetry):
    tel = make_telemetry(trajectory_sample_ratio=1.0)
    with tel.trajectory("before"):
        pass
    tel.shutdown()
    assert "before" in _kept(tel.run_dir)
    with tel.trajectory("after") as traj, traj.turn(tokens_in=1):
        pass
    assert tel.dropped_calls == 1
    assert "after" not in _kept(tel.run_dir)


def test_trajectories_never_ended_are_counted_at_shutdown_not_lost_without_a_word(make_telemetry, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")
    tel = make_telemetry(trajectory_limit=1000)
    run_dir = tel.run_dir
    with tel.trajectory("done", step=1) as traj:
        traj.reward(1.0)
    for i in range(5000):  # started, never ended: past the limit too
        tel.trajectory(f"open-{i}", step=1).__enter__()
    tel.log({"actor/entropy": 0.5}, step=1)
    tel.shutdown()
    said = [r.getMessage() for r in caplog.records if "never ended" in r.getMessage()]
    assert len(said) == 1 and "5,000 agent trajectories" in said[0], said
    dropped = [
        p.value
        for p in read_metrics(run_dir)
        if p.name == M.RL_TELEMETRY_DROPPED
        and p.attributes.get(A.RL_TELEMETRY_DROP_REASON) == A.RlTelemetryDropReasonValues.UNFINISHED.value
    ]
    assert dropped and dropped[-1] == 5000
