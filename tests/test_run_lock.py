"""One live process per run folder and rank: a second one writes to a sibling folder, never merges.

Real processes (subprocess, and a real fork) share one run folder and rank; each writes its own
run id into its files, so a merge shows as the other's id in a folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import otel_rl
from otel_rl._sdk.lifecycle.run_lock import RunFolderBusy, lock_path, take
from otel_rl.runs.folder import read_metrics
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

TIMEOUT_S = 60

# Starts telemetry on RUN_DIR as run RUN_ID, logs two steps, exports its metrics, logs a third step
# and waits for its event on disk, says where it writes, then holds the folder until a line arrives
# on stdin.
HOLDER = textwrap.dedent("""
    import logging, os, sys, time
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import otel_rl
    tel = otel_rl.init(run_dir=os.environ["RUN_DIR"], run_id=os.environ["RUN_ID"], rank=0, console=False, service_name="lock-test")
    for step in range(2):
        with tel.step(step):
            tel.log({"actor/pg_loss": 0.5})
    tel.flush()
    with tel.step(2):  # after the last metric export: only its event reaches the folder
        tel.log({"actor/pg_loss": 0.25})
    from otel_rl.runs.folder import read_log_records
    from otel_rl.semconv import names as N
    while sum(r["event_name"] == N.RL_LOG_EVENT for r in read_log_records(tel.run_dir)) < 3:
        time.sleep(0.01)
    print("READY", os.getpid(), tel.run_dir, flush=True)
    sys.stdin.readline()
    tel.shutdown()
    print("DONE", flush=True)
""")


def _start(run_dir: Path, run_id: str) -> subprocess.Popen[str]:
    env = {**os.environ, "RUN_DIR": str(run_dir), "RUN_ID": run_id}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _ready(proc: subprocess.Popen[str]) -> tuple[int, Path]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
    _, pid, where = line.split(maxsplit=2)
    return int(pid), Path(where.strip())


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate("\n", timeout=TIMEOUT_S)
    assert proc.returncode == 0 and "DONE" in out, err
    return err


def _run_ids_in(folder: Path) -> set[str]:
    """The run ids found in every file the telemetry wrote in ``folder`` (run.json and the jsonl files)."""
    ids = {json.loads((folder / "run.json").read_text())["run_id"]}
    for path in folder.glob("*.jsonl"):
        text = path.read_text()
        ids |= {run_id for run_id in ("run-A", "run-B", "run-C") if run_id in text}
    return ids


def test_second_process_of_a_rank_writes_beside_the_first_and_the_folder_is_free_again_after(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = _start(run_dir, "run-A")
    second = None
    try:
        pid_a, where_a = _ready(first)
        second = _start(run_dir, "run-B")
        pid_b, where_b = _ready(second)
        assert where_a == run_dir
        assert where_b == tmp_path / "run-2", "the second process must not write into the folder the first holds"
        err_a = _finish(first)
        err_b = _finish(second)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    # Nothing merged: each folder holds one run's files only.
    assert _run_ids_in(run_dir) == {"run-A"}
    assert _run_ids_in(tmp_path / "run-2") == {"run-B"}
    # One message, in the process that moved, naming both folders, both processes and the fix.
    assert "in use" not in err_a
    assert err_b.count("is in use for rank 0") == 1, err_b
    assert str(run_dir) in err_b and str(tmp_path / "run-2") in err_b
    assert f"process {pid_a}" in err_b and f"({pid_b})" in err_b
    assert "its own run folder" in err_b and "OTEL_RL_RUN_DIR" in err_b

    # Both have exited: a new process takes the folder again, with no message.
    third = _start(run_dir, "run-C")
    try:
        _, where_c = _ready(third)
        err_c = _finish(third)
    finally:
        if third.poll() is None:
            third.kill()
            third.wait()
    assert where_c == run_dir and "in use" not in err_c
    assert "ended without shutting down" not in err_c  # run-A shut down cleanly
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == "run-C"


def test_a_killed_holder_frees_the_folder_and_the_next_process_rebuilds_its_points(tmp_path: Path, caplog) -> None:
    run_dir = tmp_path / "run"
    holder = _start(run_dir, "run-A")
    try:
        pid, _ = _ready(holder)
        with pytest.raises(RunFolderBusy):
            take(run_dir, 0)
        take(run_dir, 1).release()  # another rank's lock is its own
    finally:
        holder.kill()  # SIGKILL: no shutdown
        holder.wait()
    lock = take(run_dir, 0)  # the kernel released the dead holder's lock
    assert lock.unclean_end_pid == pid  # its PID was still in the file
    lock.release()
    assert take(run_dir, 0).unclean_end_pid is None  # that release was a clean end
    lock_path(run_dir, 0).write_text(f"{pid}\n")  # as the killed process left it

    tel = otel_rl.Telemetry(otel_rl.resolve_config({"run_dir": str(run_dir), "console": False, "service_name": "resumed"}))
    tel.shutdown()
    said = [r.getMessage() for r in caplog.records if "ended without shutting down" in r.getMessage()]
    assert len(said) == 1 and f"process {pid}" in said[0] and f"otel-rl recover {run_dir} --rank 0 --before" in said[0]
    # The killed holder's points, never exported, are rebuilt by a process of their own: here.
    assert tel.recovery is not None and tel.recovery.wait(TIMEOUT_S) == 0
    points = sorted(
        (p for p in read_metrics(run_dir) if p.name == M.RL_LOSS and p.resource[A.SERVICE_NAME] == "lock-test"), key=lambda p: p.time_ns
    )
    assert [p.value for p in points] == [0.5, 0.25]  # its export, then its last step's point, rebuilt from the event
    assert "wrote 1 point of 1 series for 1 event after" in (run_dir / "recover.rank0.log").read_text()  # its report
    caplog.clear()
    otel_rl.Telemetry(otel_rl.resolve_config({"run_dir": str(run_dir), "console": False, "service_name": "again"})).shutdown()
    assert not [r for r in caplog.records if "ended without shutting down" in r.getMessage()]


FORK = textwrap.dedent("""
    import os, sys
    import otel_rl
    from otel_rl._sdk.lifecycle.run_lock import RunFolderBusy, lock_path, take
    run_dir = sys.argv[1]
    tel = otel_rl.init(run_dir=run_dir, run_id="run-A", console=False)
    pid = os.fork()
    if pid == 0:  # the child: its copy is off; its own init() must not merge into the parent's folder
        child = otel_rl.init(run_dir=run_dir, run_id="run-B", console=False)
        child.log({"actor/pg_loss": 1.0}, step=0)
        child.shutdown()
        print("CHILD", child.run_dir, flush=True)
        sys.exit(0)  # a normal exit: the inherited lock's copy is collected and closed, never unlocked
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
    try:
        take(__import__("pathlib").Path(run_dir), 0)
        print("PARENT LOST ITS LOCK", flush=True)
    except RunFolderBusy:
        print("PARENT HOLDS", flush=True)
    tel.log({"actor/pg_loss": 2.0}, step=1)
    tel.shutdown()
""")


def test_a_forked_child_neither_merges_nor_releases_the_parents_lock(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", FORK, str(run_dir)], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert f"CHILD {tmp_path / 'run-2'}" in done.stdout, done.stdout + done.stderr
    assert "PARENT HOLDS" in done.stdout, done.stdout
    assert _run_ids_in(run_dir) == {"run-A"}
    assert _run_ids_in(tmp_path / "run-2") == {"run-B"}
