"""`otel-rl trace --slowest` and the Chrome export's trajectory tracks, on trajectories of known
lengths written by the real SDK to a run folder: which are a step's (its rl.step or a link to its
trace), in what order, what each line says, and what is said when a step has none."""

from __future__ import annotations

import contextvars
import json
import re
import threading
import time

import pytest

from otel_rl import cli
from otel_rl.runs.folder import find_step_trace, read_spans
from otel_rl.runs.trajectories import read_trajectory_counts, slowest, step_trajectories
from otel_rl.semconv import names as N


def _rollout(tel, sample_id: str, seconds: float, *, tool_error: bool = False, reward: float = 0.5) -> None:
    with tel.trajectory(sample_id, group=sample_id[0]) as traj:
        with traj.turn(tokens_in=12) as turn:
            turn.done(tokens_out=5, finish_reason="tool_calls")
        try:
            with traj.tool("search", call_id=f"{sample_id}-call"):
                time.sleep(seconds)
                if tool_error:
                    raise TimeoutError("the search timed out")
        except TimeoutError:
            pass
        with traj.turn(tokens_in=30) as turn:
            turn.done(tokens_out=2, finish_reason="stop")
        traj.reward(reward)


@pytest.fixture
def run_dir(make_telemetry):
    """Step 1 without trajectories; step 2 with five of known lengths (every one kept), the last
    linked to the step only: it starts after the step ended, in a thread of the generate stage's
    context, so it carries no step and is decided on its own."""
    tel = make_telemetry(trajectory_sample_ratio=1.0, trajectory_keep_slowest=1)
    with tel.step(1):
        with tel.stage("generate", cluster="actor_infer"):
            pass
    with tel.step(2):
        with tel.stage("generate", cluster="actor_infer"):
            _rollout(tel, "a-fast", 0.001, reward=1.0)
            _rollout(tel, "b-slowest", 0.120)
            _rollout(tel, "c-failed", 0.040, tool_error=True)
            _rollout(tel, "d-middle", 0.015, reward=0.0)
            late = contextvars.copy_context()
    worker = threading.Thread(target=late.run, args=(_rollout, tel, "e-linked", 0.080))
    worker.start()
    worker.join()
    tel.shutdown()
    return tel.run_dir


def test_a_steps_trajectories_are_its_own_and_those_linked_to_its_trace(run_dir):
    spans = read_spans(run_dir)
    found = step_trajectories(spans, 2, find_step_trace(spans, 2))
    assert [t.sample_id for t in found] == ["a-fast", "b-slowest", "c-failed", "d-middle", "e-linked"]  # start order
    assert found[-1].step is None
    assert [t.sample_id for t in step_trajectories(spans, 2)] == ["a-fast", "b-slowest", "c-failed", "d-middle"]  # the link needs the trace
    assert step_trajectories(spans, 1, find_step_trace(spans, 1)) == []
    assert [t.sample_id for t in slowest(found, 3)] == ["b-slowest", "e-linked", "c-failed"]
    assert [t.reason for t in found] == ["highest_reward", "slowest", "failed", "lowest_reward", "head_sampled"]
    counts = read_trajectory_counts(run_dir)
    assert counts is not None and counts.recorded == 5 and not counts.not_kept
    assert counts.kept == {"highest_reward": 1, "slowest": 1, "failed": 1, "lowest_reward": 1, "head_sampled": 1}


def test_slowest_prints_them_longest_first_with_their_turns_tools_and_why_kept(run_dir, capsys):
    assert cli.main(["trace", str(run_dir), "--step", "2", "--slowest", "3"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"step 2: 5 agent trajectories kept, from run folder {run_dir}; the 3 slowest, longest first"
    assert (
        lines[1]
        == "  the run's metrics (all steps): 5 recorded, 5 kept as traces (failed 1, slowest 1, highest_reward 1, lowest_reward 1, head_sampled 1)"
    )
    heads = [line for line in lines if line.startswith("#")]
    assert [h.split()[2] for h in heads] == ["b-slowest", "e-linked", "c-failed"]
    assert re.match(r"#1  trajectory b-slowest \(group b\)  \d+\.?\d* ms  reward 0\.5  kept: slowest  2 turns, 1 tool call$", heads[0])
    assert heads[2].endswith("kept: failed  2 turns, 1 tool call (1 failed)")
    failed = out.split("#3  ")[1]
    assert re.search(r"├─ rl\.turn  finish=tool_calls tokens 12->5 ", failed)
    assert re.search(r"├─ rl\.tool  search ERROR: TimeoutError ", failed)  # samples off: the error's type, not its text
    assert re.search(r"└─ rl\.turn  finish=stop tokens 30->2 ", failed)
    assert "a-fast" not in out and "d-middle" not in out


def test_a_step_without_trajectories_says_so_with_the_runs_counts(run_dir, capsys):
    assert cli.main(["trace", str(run_dir), "--step", "1", "--slowest", "5"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        f"otel-rl trace: step 1 has no kept agent trajectories in run folder {run_dir}; the run's metrics (all steps): "
        "5 recorded, 5 kept as traces (failed 1, slowest 1, highest_reward 1, lowest_reward 1, head_sampled 1)"
    )


def test_a_run_without_trajectories_says_its_metrics_count_none(make_telemetry, capsys):
    tel = make_telemetry()
    with tel.step(3):
        pass
    tel.shutdown()
    assert cli.main(["trace", str(tel.run_dir), "--step", "3", "--slowest", "5"]) == 1
    assert "the run's metrics count no agent trajectory (no rl.trajectory.count in its metrics.jsonl)" in capsys.readouterr().err
    assert cli.main(["trace", str(tel.run_dir), "--step", "3"]) == 0
    assert "agent trajectories" not in capsys.readouterr().out  # no hint where there is nothing to show


def test_the_step_tree_points_at_the_trajectories(run_dir, capsys):
    assert cli.main(["trace", str(run_dir), "--step", "2"]) == 0
    out = capsys.readouterr().out
    assert f"  5 agent trajectories of this step are traces of their own:  otel-rl trace {run_dir} --step 2 --slowest 5" in out


def test_slowest_from_jaeger_or_with_jaeger_json_is_refused_with_what_to_do(run_dir, capsys):
    assert cli.main(["trace", "--step", "2", "--slowest", "3", "--jaeger", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "--slowest reads agent trajectories from a run folder" in err and "operation rl.trajectory with the tag rl.step=N" in err
    assert cli.main(["trace", str(run_dir), "--step", "2", "--slowest", "3", "--out", "x.json"]) == 2
    assert "add --format chrome" in capsys.readouterr().err
    assert cli.main(["trace", str(run_dir), "--step", "2", "--slowest", "0"]) == 2


@pytest.mark.parametrize(
    ("extra", "expected"),
    [([], ["a-fast", "b-slowest", "c-failed", "d-middle", "e-linked"]), (["--slowest", "2"], ["b-slowest", "e-linked"])],
)
def test_chrome_puts_each_trajectory_on_a_thread_of_its_own_after_the_clusters(run_dir, tmp_path, capsys, extra, expected):
    out = tmp_path / "steps.json"
    assert cli.main(["trace", str(run_dir), "--steps", "1-2", "--format", "chrome", "--out", str(out), *extra]) == 0
    assert f"{len(expected)} agent trajectories (a thread each)" in capsys.readouterr().out
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    order = {e["tid"]: e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"}
    tracks = sorted((tid for tid, name in names.items() if name.startswith("trajectory ")), key=order.__getitem__)
    reasons = {"a-fast": "step 2, highest_reward", "b-slowest": "step 2, slowest", "c-failed": "step 2, failed"}
    reasons |= {"d-middle": "step 2, lowest_reward", "e-linked": "head_sampled"}  # no rl.step on the linked one
    assert [names[tid] for tid in tracks] == [f"trajectory {sample} ({reasons[sample]})" for sample in expected]  # in start order
    assert max(order[t] for t, n in names.items() if not n.startswith("trajectory ")) < min(order[t] for t in tracks)
    slices: dict[int, list] = {tid: [] for tid in tracks}
    for e in events:
        if e["ph"] == "X" and e["tid"] in slices:
            slices[e["tid"]].append(e)
    for tid in tracks:
        root, *children = sorted(slices[tid], key=lambda e: (e["ts"], -e["dur"]))
        assert (root["name"], root["cat"], [c["name"] for c in children]) == (
            N.RL_TRAJECTORY_SPAN,
            N.RL_TRAJECTORY_SPAN,
            [N.RL_TURN_SPAN, N.RL_TOOL_SPAN, N.RL_TURN_SPAN],
        )
        assert all(root["ts"] <= c["ts"] and c["ts"] + c["dur"] <= root["ts"] + root["dur"] + 0.001 for c in children)
        assert {e["pid"] for e in slices[tid]} == {0}  # in the rank's process
