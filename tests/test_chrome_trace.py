"""``otel-rl trace --format chrome``: steps' traces as Chrome Trace Event JSON (Perfetto, chrome://tracing).

A real two-rank run (two telemetries writing one run folder, rank 1 joining rank 0's steps through
the inject/join carrier) goes through the CLI; the JSON is checked against the Trace Event Format
and against the spans read back. A real CPU torch.profiler run inside a step is merged.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from test_probes import GIB, StandInCuda  # stand-in for torch.cuda: no CUDA device here

from otel_rl import cli
from otel_rl._sdk.sources.probes import CudaMemoryProbe
from otel_rl.runs.chrome_trace import parse_steps
from otel_rl.runs.folder import find_step_trace, read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

STEPS = (1, 2, 3)
PROFILED_STEP = 2


def _run(make_telemetry: Any, run_dir: Path, profile_dir: Path | None = None) -> Path:
    """Rank 0 drives 3 steps; rank 1 (a GPU worker, stand-in CUDA) joins each step's generate stage."""
    rank0 = make_telemetry(run_dir=str(run_dir), rank=0, world_size=2, service_name="chrome-test")
    rank1 = make_telemetry(run_dir=str(run_dir), rank=1, world_size=2, service_name="chrome-test")
    rank1._cuda_probe = CudaMemoryProbe(cuda=StandInCuda())
    for step in STEPS:
        with rank0.step(step):
            with rank0.stage("generate", cluster="actor_infer", memory=True):
                carrier = rank0.inject()
                with rank1.join(carrier), rank1.stage("generate", cluster="actor_infer", memory=True):
                    time.sleep(0.002)
            with rank0.stage("reward", cluster="reward"):
                time.sleep(0.001)
            with rank0.stage("train_step", cluster="actor_train", offload=True) as stage:
                with stage.phase("onload"):
                    pass
                with stage.phase("execute"):
                    if step == PROFILED_STEP and profile_dir is not None:
                        _profile(profile_dir)
                    time.sleep(0.002)
                with stage.phase("offload"):
                    pass
    rank0.flush()
    rank1.flush()
    return run_dir


def _profile(out_dir: Path) -> None:
    """A real CPU torch.profiler run, exported both ways torch writes Chrome traces; the wall-clock
    bounds of each profiled block go to ``bounds.json`` (Unix ns, the spans' clock)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    time.sleep(0.02)  # the profile sits well inside the step, so "inside the window" is a strict check
    x = torch.randn(128, 128)
    bounds = {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.time_ns()
        (x @ x).relu().sum()
        bounds["step2.json"] = (t0, time.time_ns())
    prof.export_chrome_trace(str(out_dir / "step2.json"))
    handler = tensorboard_trace_handler(str(out_dir / "tb"), worker_name="rank0", use_gzip=True)
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=handler):
        t0 = time.time_ns()
        torch.nn.functional.softmax(x @ x.T, dim=-1).mean()
        bounds["tb"] = (t0, time.time_ns())
    (out_dir / "bounds.json").write_text(json.dumps(bounds))
    time.sleep(0.02)


def _validate_trace_event_format(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The fields the Trace Event Format (JSON Object Format) requires of each phase we write."""
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    assert data["displayTimeUnit"] in ("ms", "ns")
    assert isinstance(data["otherData"], dict)
    for event in data["traceEvents"]:
        ph = event["ph"]
        assert isinstance(event["name"], str) and event["name"], event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        if ph == "M":
            assert isinstance(event["args"], dict), event
            continue
        assert isinstance(event["ts"], (int, float)), event
        if ph == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0, event
        elif ph == "C":
            assert event["args"] and all(isinstance(v, (int, float)) for v in event["args"].values()), event
        elif ph == "i":
            assert event.get("s", "t") in ("g", "p", "t"), event
    return data["traceEvents"]


def _metadata(events: list[dict[str, Any]], name: str) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == name}


def _assert_nested(slices: list[dict[str, Any]]) -> None:
    """Complete events of one thread form a strict stack (what a viewer draws per thread)."""
    stack: list[float] = []
    for event in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        end = event["ts"] + event["dur"]
        while stack and stack[-1] <= event["ts"] + 1e-3:
            stack.pop()
        assert not stack or end <= stack[-1] + 1e-3, f"{event['name']} overlaps its thread's open slice"
        stack.append(end)


def test_steps_become_one_process_per_rank_one_thread_per_cluster_with_memory_counters(make_telemetry, tmp_path, capsys):
    run_dir = _run(make_telemetry, tmp_path / "run")
    out = tmp_path / "steps.json"
    assert cli.main(["trace", str(run_dir), "--steps", "1-3", "--format", "chrome", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}: 3 steps" in printed and "ranks 0, 1" in printed and "ui.perfetto.dev" in printed

    data = json.loads(out.read_text())
    events = _validate_trace_event_format(data)
    spans = [s for step in STEPS for s in find_step_trace(read_spans(run_dir), step)]
    slices = [e for e in events if e["ph"] == "X"]

    # Every span is there once, as a complete event with its attributes as args and microsecond times.
    by_id = {e["args"]["otel.span_id"]: e for e in slices}
    assert len(slices) == len(spans) == len(by_id) == 3 * (1 + 2 + 1 + 1 + 3)
    origin = data["baseTimeNanoseconds"]
    for span in spans:
        event = by_id[span.span_id]
        assert event["name"] == span.name
        assert {k: event["args"][k] for k in span.attributes} == span.attributes
        assert event["ts"] == pytest.approx((span.start_ns - origin) / 1000, abs=1e-3)
        assert event["dur"] == pytest.approx(span.duration_ns / 1000, abs=1e-3)
        # Nesting by time: a span lies within its parent.
        if span.parent_span_id:
            parent = by_id[span.parent_span_id]
            assert parent["ts"] <= event["ts"] + 1e-3 and event["ts"] + event["dur"] <= parent["ts"] + parent["dur"] + 1e-3
    assert {e["cat"] for e in slices} == {"rl.step", "rl.stage", "rl.stage.phase"}

    # pid = rank, named "rank N"; one tid per cluster, named after it, unique across the file.
    processes = _metadata(events, "process_name")
    threads = _metadata(events, "thread_name")
    assert {pid: name for (pid, _), name in processes.items()} == {0: "rank 0", 1: "rank 1"}
    assert sorted(threads.values()) == sorted(["step", "actor_infer", "reward", "actor_train", "actor_infer"])
    assert len({tid for _, tid in threads}) == len(threads)
    for event in slices:
        assert event["pid"] == event["args"][A.RL_RANK]
        expected = event["args"].get(A.RL_CLUSTER, "step")
        assert threads[(event["pid"], event["tid"])] == expected
    rank1 = [e for e in slices if e["pid"] == 1]
    assert {e["name"] for e in rank1} == {"rl.generate"} and len(rank1) == 3
    per_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in slices:
        per_thread[(event["pid"], event["tid"])].append(event)
    for thread_slices in per_thread.values():
        _assert_nested(thread_slices)

    # Memory snapshots: instants on the stage's thread and counter samples on the rank's process.
    snapshots = [e for e in events if e["ph"] == "i" and e["name"] == N.RL_MEMORY_SNAPSHOT_EVENT]
    assert len(snapshots) == 3 * (2 + 2 + 4)  # generate on both ranks (start, end), train_step (4)
    counters = [e for e in events if e["ph"] == "C"]
    process_memory = [e for e in counters if e["name"] == "process memory"]
    gpu_memory = [e for e in counters if e["name"] == "gpu 1 memory"]
    assert len(process_memory) == 3 * (2 + 2 + 2) and len(gpu_memory) == 3 * 2 and len(counters) == 3 * 8
    assert all(set(e["args"]) == {"rss", "vms"} and e["args"]["rss"] > 0 for e in process_memory)
    assert all(e["pid"] == 1 for e in gpu_memory)
    assert gpu_memory[0]["args"] == {"allocated": 3 * GIB, "reserved": 4 * GIB, "max_allocated": 6 * GIB, "max_reserved": 8 * GIB}
    step_window = {e["args"][A.RL_STEP]: (e["ts"], e["ts"] + e["dur"]) for e in slices if e["name"] == N.RL_STEP_SPAN}
    for counter in counters:
        assert any(lo - 1e-3 <= counter["ts"] <= hi + 1e-3 for lo, hi in step_window.values())


def test_overlapping_stages_of_one_cluster_get_a_second_thread(make_telemetry, tmp_path):
    """Two rollout workers of one cluster in one process (threads) overlap without nesting: a viewer
    draws a thread as a strict stack, so the second goes on a thread "actor_infer (2)"."""
    tel = make_telemetry(run_dir=str(tmp_path / "run"))

    def worker(delay: float) -> None:
        time.sleep(delay)
        with tel.stage("generate", cluster="actor_infer"):
            time.sleep(0.03)

    with tel.step(1):
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(worker, d)) for d in (0.0, 0.01)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    tel.flush()
    out = tmp_path / "o.json"
    assert cli.main(["trace", str(tmp_path / "run"), "--step", "1", "--format", "chrome", "--out", str(out)]) == 0
    events = _validate_trace_event_format(json.loads(out.read_text()))
    names = _metadata(events, "thread_name")
    generate = [e for e in events if e["ph"] == "X" and e["name"] == "rl.generate"]
    assert len(generate) == 2 and generate[0]["ts"] < generate[1]["ts"] < generate[0]["ts"] + generate[0]["dur"]
    assert sorted(names[(e["pid"], e["tid"])] for e in generate) == ["actor_infer", "actor_infer (2)"]
    per_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in (e for e in events if e["ph"] == "X"):
        per_thread[(event["pid"], event["tid"])].append(event)
    for thread_slices in per_thread.values():
        _assert_nested(thread_slices)


def test_one_step_prints_its_tree_and_writes_only_that_step(make_telemetry, tmp_path, capsys):
    run_dir = _run(make_telemetry, tmp_path / "run")
    out = tmp_path / "step2.json"
    assert cli.main(["trace", "--run-dir", str(run_dir), "--step", "2", "--format", "chrome", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "rl.train_step" in printed and f"wrote {out}: step 2" in printed
    slices = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert {e["args"][A.RL_STEP] for e in slices} == {2} and len(slices) == 8


def test_profiler_trace_is_merged_on_its_own_tracks_inside_the_step(make_telemetry, tmp_path, capsys):
    pytest.importorskip("torch")
    profiles = tmp_path / "prof"
    (profiles / "tb").mkdir(parents=True)
    run_dir = _run(make_telemetry, tmp_path / "run", profile_dir=profiles)
    gz = sorted((profiles / "tb").glob("*.pt.trace.json.gz"))
    assert len(gz) == 1
    out = tmp_path / "merged.json"
    argv = ["trace", str(run_dir), "--steps", "1-3", "--format", "chrome", "--out", str(out)]
    assert cli.main([*argv, "--profile", str(profiles / "step2.json"), "--profile", str(gz[0])]) == 0
    captured = capsys.readouterr()
    assert "merged" in captured.out and "none of" not in captured.err

    data = json.loads(out.read_text())
    events = _validate_trace_event_format(data)
    processes = {pid: name for (pid, _), name in _metadata(events, "process_name").items()}
    threads = _metadata(events, "thread_name")
    assert len({tid for _, tid in threads}) == len(threads)  # the profile's OS tids never reuse a span thread's
    span_pids = {0, 1}
    torch_pids = {pid for pid, name in processes.items() if "torch.profiler" in name}
    assert torch_pids and not torch_pids & span_pids and set(processes) == span_pids | torch_pids
    # Each file's processes (the traced python process, Kineto's "Spans"/"Traces" rows) are its own.
    for name in ("step2.json", gz[0].name):
        assert any(processes[p] == f"torch.profiler {name}: python" for p in torch_pids)

    step2 = next(e for e in events if e["ph"] == "X" and e["name"] == N.RL_STEP_SPAN and e["args"][A.RL_STEP] == 2)
    execute = next(e for e in events if e["ph"] == "X" and e["name"] == "rl.execute" and e["args"][A.RL_STEP] == 2)
    ops = [e for e in events if e["ph"] == "X" and e["pid"] in torch_pids]
    names = {e["name"] for e in ops}
    assert {"aten::matmul", "aten::relu", "aten::softmax"} <= names
    for op in ops:  # on the spans' clock: inside the profiled execute phase of step 2
        assert execute["ts"] <= op["ts"] and op["ts"] + op["dur"] <= execute["ts"] + execute["dur"], op["name"]
        assert step2["ts"] <= op["ts"] <= step2["ts"] + step2["dur"]
        assert threads[(op["pid"], op["tid"])]  # every profile thread is named
    # Tight alignment: each aten op lies within the wall-clock bounds taken around its profiled block
    # (Kineto's clock vs time.time_ns(): within 1 ms).
    bounds = json.loads((profiles / "bounds.json").read_text())
    base = data["baseTimeNanoseconds"]
    for op in (e for e in ops if e["name"].startswith("aten::")):
        pid_name = processes[op["pid"]]
        lo, hi = bounds["step2.json"] if "step2.json" in pid_name else bounds["tb"]
        start_ns, end_ns = op["ts"] * 1000 + base, (op["ts"] + op["dur"]) * 1000 + base
        assert lo - 1e6 <= start_ns and end_ns <= hi + 1e6, (op["name"], (start_ns - lo) / 1e6, (hi - end_ns) / 1e6)


def test_profile_errors_name_the_file_and_the_fix(make_telemetry, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    run_dir = _run(make_telemetry, tmp_path / "run")
    argv = ["trace", str(run_dir), "--step", "1", "--format", "chrome", "--out", str(tmp_path / "o.json")]
    missing = tmp_path / "nope.json"
    assert cli.main([*argv, "--profile", str(missing)]) == 2
    assert f"profile {missing} does not exist" in capsys.readouterr().err

    # A profile taken after the run: merged, with a warning that it is outside the steps' window.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(8).sum()
    later = tmp_path / "later.json"
    prof.export_chrome_trace(str(later))
    assert cli.main([*argv, "--profile", str(later)]) == 0
    assert f"none of {later}'s events fall in the steps' window" in capsys.readouterr().err

    # No time base and relative ts: it cannot be placed on the spans' clock.
    data = json.loads(later.read_text())
    del data["baseTimeNanoseconds"]
    for event in data["traceEvents"]:
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] = float(event["ts"]) % 1e6
    relative = tmp_path / "relative.json"
    relative.write_text(json.dumps(data))
    assert cli.main([*argv, "--profile", str(relative)]) == 2
    assert f"profile {relative} has no 'baseTimeNanoseconds'" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"traceEvents": 3}')
    assert cli.main([*argv, "--profile", str(tmp_path / "bad.json")]) == 2
    assert "has no 'traceEvents' list" in capsys.readouterr().err


def test_step_errors_list_the_steps_there_are(make_telemetry, tmp_path, capsys):
    run_dir = _run(make_telemetry, tmp_path / "run")
    out = tmp_path / "o.json"
    assert cli.main(["trace", str(run_dir), "--step", "9", "--format", "chrome", "--out", str(out)]) == 1
    assert "no 'rl.step' trace for step 9; steps available: 1-3" in capsys.readouterr().err
    assert cli.main(["trace", str(run_dir), "--steps", "7-9", "--format", "chrome", "--out", str(out)]) == 1
    assert "no 'rl.step' trace for steps 7-9; steps available: 1-3" in capsys.readouterr().err
    assert not out.exists()
    assert cli.main(["trace", str(run_dir), "--steps", "2-5", "--format", "chrome", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "no trace for steps 4, 5 (skipped)" in captured.err and "2 steps" in captured.out
    assert cli.main(["trace", str(run_dir), "--steps", "1-3"]) == 2
    assert "--steps needs --format chrome" in capsys.readouterr().err
    assert cli.main(["trace", str(run_dir), "--step", "1", "--format", "chrome"]) == 2
    assert "--format chrome needs --out FILE" in capsys.readouterr().err
    assert cli.main(["trace", str(run_dir), "--steps", "3-1", "--format", "chrome", "--out", str(out)]) == 2
    assert "bad step range" in capsys.readouterr().err


def test_parse_steps():
    assert parse_steps("3-7") == [3, 4, 5, 6, 7]
    assert parse_steps("1,4-5, 9") == [1, 4, 5, 9]
    with pytest.raises(ValueError, match="bad step range"):
        parse_steps("a-b")
