"""Telemetry across fork and spawn: no deadlock, nothing exported twice, nothing lost.

Each scenario runs as its own Python process (a forked pytest would go on running the test
session in the child), under a timeout: a deadlock fails the test instead of hanging it. The
parent exports over OTLP to a counting receiver on 127.0.0.1 (tests/otlp_sink.py) and to its
run folder, so duplicates from a child would show in both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from otlp_sink import GrpcSink, OtlpSink

from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

TIMEOUT_S = 90
PRELUDE = """
import faulthandler, json, multiprocessing, os, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # forked children inherit it: a hang shows every stack
import otel_rl
from otel_rl.semconv import metrics as M

def start(**extra):
    options = dict(service_name="fork-test", endpoint=os.environ["SINK"], exporters="otlp,file",
                   run_dir=os.environ["RUN_DIR"], console=False, metric_export_interval_s=0.2)
    options.update(extra)
    return otel_rl.init(**options)

def train(tel, steps, first=0):
    for step in range(first, first + steps):
        with tel.step(step):
            with tel.stage("generate"):
                pass
            tel.log({"actor/pg_loss": float(step)})

def wait_child(pid, timeout_s=30):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    raise SystemExit(f"child {pid} still running after {timeout_s} s: deadlocked")
"""


def run_script(tmp_path: Path, sink: OtlpSink, body: str) -> dict:
    script = PRELUDE + textwrap.dedent(body)
    env = {**os.environ, "SINK": sink.endpoint, "RUN_DIR": str(tmp_path / "run"), "PYTHONUNBUFFERED": "1"}
    path = tmp_path / "scenario.py"  # a file, not -c: spawned children import their target from it
    path.write_text(script, encoding="utf-8")
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        # A session of its own: on a hang every process of the scenario prints its stacks, then is killed.
        scenario = subprocess.Popen([sys.executable, str(path)], env=env, cwd=tmp_path, stdout=out, stderr=err, start_new_session=True)
        try:
            scenario.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for process in [psutil.Process(scenario.pid), *psutil.Process(scenario.pid).children(recursive=True)]:
                process.send_signal(signal.SIGUSR1)  # one at a time: their stacks do not interleave
                time.sleep(0.5)
            os.killpg(scenario.pid, signal.SIGKILL)
            scenario.wait(10)
            pytest.fail(f"the scenario hung for {TIMEOUT_S} s; its processes were doing:\n{err_path.read_text()[-12000:]}")
    stdout, stderr = out_path.read_text(), err_path.read_text()
    assert scenario.returncode == 0, stdout[-4000:] + stderr[-4000:]
    results = [json.loads(line[len("RESULT ") :]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    return {"results": results, "stderr": stderr}


def steps_received(sink: OtlpSink, service: str | None = None) -> list[int]:
    return sorted(r[1][A.RL_STEP] for r in sink.received.events(N.RL_LOG_EVENT) if service is None or r[3].get("service.name") == service)


def file_events(run_dir: Path, name: str = "logs.jsonl") -> list[int]:
    steps = []
    for line in (run_dir / name).read_text().splitlines():
        for rl in json.loads(line)["resourceLogs"]:
            for sl in rl["scopeLogs"]:
                for record in sl["logRecords"]:
                    if record.get("eventName") == N.RL_LOG_EVENT:
                        attrs = {a["key"]: a["value"] for a in record.get("attributes", [])}
                        steps.append(int(attrs[A.RL_STEP]["intValue"]))
    return sorted(steps)


def test_a_forked_child_gets_a_disabled_copy_that_drops_and_counts_and_never_deadlocks(tmp_path: Path) -> None:
    with OtlpSink() as sink:
        out = run_script(
            tmp_path,
            sink,
            """
            tel = start()
            train(tel, 10)
            tel.flush()
            # Fork while the pipeline and the spool hold their locks, as a worker thread might.
            tel._pipeline._drain_lock.acquire()
            tel._providers.spool._lock.acquire()
            pid = os.fork()
            if pid == 0:
                t0 = time.perf_counter()
                for i in range(100):
                    tel.log({"actor/pg_loss": -1.0}, step=1000 + i)
                with tel.step(2000):
                    with tel.stage("generate"):
                        pass
                tel.record(M.RL_SAMPLE_REWARD, [1.0, 2.0])
                flushed = tel.flush(timeout_s=1)
                print("RESULT " + json.dumps({"closed": tel.closed, "dropped": tel.dropped_calls, "flushed": flushed,
                      "seconds": time.perf_counter() - t0, "current": otel_rl.get_telemetry() is None}), flush=True)
                time.sleep(0.5)  # the SDK's restarted threads get their chance to export (they must not)
                sys.exit(0)  # a normal exit: atexit (telemetry shutdown, SDK providers) runs in the child
            tel._providers.spool._lock.release()
            tel._pipeline._drain_lock.release()
            code = wait_child(pid)
            train(tel, 10, first=10)
            tel.shutdown()
            print("RESULT " + json.dumps({"child_exit": code}), flush=True)
        """,
        )
        child, parent = out["results"]
        assert child == {"closed": True, "dropped": 101, "flushed": False, "seconds": child["seconds"], "current": True}
        assert child["seconds"] < 2.0
        assert parent == {"child_exit": 0}
        assert "was forked from" in out["stderr"] and out["stderr"].count("was forked from") == 1  # reported once
        # The parent's 20 steps, each once; nothing the child logged or re-exported.
        assert steps_received(sink) == list(range(20))
        spans = sink.received.spans
        assert len(spans) == 40 and len({s[1] for s in spans}) == 40
        assert not [s for s in spans if s[3].get(A.RL_STEP) == 2000]
        points = sink.received.points
        assert len(set(points)) == len(points)
        assert file_events(tmp_path / "run") == list(range(20))


def test_multiprocessing_fork_workers_log_dropped_and_one_that_inits_exports_its_own(tmp_path: Path) -> None:
    with OtlpSink() as sink:
        out = run_script(
            tmp_path,
            sink,
            """
            tel = start()

            def loader_worker(i):
                # A DataLoader-style worker using the telemetry its parent created.
                for k in range(20):
                    tel.log({"actor/pg_loss": 0.0}, step=5000 + 100 * i + k)
                return tel.dropped_calls

            def own_worker(q):
                mine = start(service_name="worker", rank=7)
                train(mine, 5, first=900)
                mine.shutdown()
                q.put(mine.closed)

            ctx = multiprocessing.get_context("fork")
            train(tel, 5)
            with ctx.Pool(2) as pool:
                dropped = pool.map(loader_worker, range(4), chunksize=1)
            q = ctx.Queue()
            p = ctx.Process(target=own_worker, args=(q,))
            p.start()
            own_closed = q.get(timeout=30)
            p.join(30)
            train(tel, 5, first=5)
            tel.shutdown()
            print("RESULT " + json.dumps({"dropped": dropped, "own_exit": p.exitcode, "own_closed": own_closed}), flush=True)
        """,
        )
        [result] = out["results"]
        assert result["own_exit"] == 0 and result["own_closed"] is True
        assert all(n >= 20 for n in result["dropped"])  # each task's 20 calls counted in its worker
        assert steps_received(sink, "fork-test") == list(range(10))  # the parent's, once
        # The worker's own telemetry. If some is missing: what the processes said, and whether the
        # worker's events reached its run folder (made, not sent) or not (never made).
        worker_file = tmp_path / "run" / "logs.rank7.jsonl"
        written = file_events(tmp_path / "run", worker_file.name) if worker_file.exists() else "no file"
        assert steps_received(sink, "worker") == list(range(900, 905)), f"in the run folder: {written}\n{out['stderr'][-4000:]}"
        assert not [s for s in steps_received(sink) if s >= 5000]
        spans = sink.received.spans
        by_service = Counter(r.get("service.name") for r in sink.received.span_resources)
        # 10 spans (a step and a stage for each of 5 steps) per process per train() call, once each
        assert len({s[1] for s in spans}) == len(spans) == 2 * 10 + 2 * 5, f"spans by service: {dict(by_service)}\n{out['stderr'][-4000:]}"


def test_spawned_children_start_clean_and_export_their_own(tmp_path: Path) -> None:
    with OtlpSink() as sink:
        out = run_script(
            tmp_path,
            sink,
            """
            def child(rank):
                tel = start(service_name="spawned", rank=rank)
                train(tel, 6, first=100 * rank)
                tel.shutdown()

            if __name__ == "__main__":
                tel = start()
                ctx = multiprocessing.get_context("spawn")
                procs = [ctx.Process(target=child, args=(r,)) for r in (1, 2)]
                for p in procs:
                    p.start()
                train(tel, 8)
                for p in procs:
                    p.join(60)
                tel.shutdown()
                print("RESULT " + json.dumps([p.exitcode for p in procs]), flush=True)
        """,
        )
        assert out["results"] == [[0, 0]]
        assert steps_received(sink, "fork-test") == list(range(8))
        assert steps_received(sink, "spawned") == [*range(100, 106), *range(200, 206)]
        assert len({s[1] for s in sink.received.spans}) == len(sink.received.spans) == 2 * 8 + 2 * 12


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.register_at_fork")
def test_sigterm_in_a_forked_child_ends_it_without_touching_the_parents_telemetry(tmp_path: Path) -> None:
    with OtlpSink() as sink:
        out = run_script(
            tmp_path,
            sink,
            """
            import signal
            tel = start()
            train(tel, 3)
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            time.sleep(0.2)
            os.kill(pid, signal.SIGTERM)
            code = wait_child(pid, 15)
            train(tel, 3, first=3)
            tel.shutdown()
            print("RESULT " + json.dumps({"child_exit": code}), flush=True)
        """,
        )
        assert out["results"] == [{"child_exit": -15}]
        assert steps_received(sink) == list(range(6))


@pytest.mark.parametrize(
    ("protocol", "spool_bytes"),
    [("http/protobuf", None), ("http/protobuf", "0"), ("grpc", None)],
    ids=["http-spool", "http-sdk-exporters", "grpc-spool"],
)
def test_telemetry_threads_import_nothing_a_fork_could_catch_half_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str, spool_bytes: str | None
) -> None:
    """A module a background thread is importing when the main thread forks stays half-imported in
    the child, its import lock held by a thread the child does not have: every later import of it
    there blocks forever. (requests imports netrc on a session's first request: a forked child that
    called init() had its senders stuck on it.) So after init() the telemetry's threads import nothing."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    if spool_bytes is not None:
        monkeypatch.setenv("OTEL_RL_SPOOL_MAX_BYTES", spool_bytes)
    with GrpcSink() if protocol == "grpc" else OtlpSink() as sink:
        out = run_script(
            tmp_path,
            sink,
            """
            import threading
            tel = start()
            imported = []

            def on_audit(event, args):
                if event == "import" and threading.current_thread() is not threading.main_thread():
                    imported.append(f"{args[0]} (thread {threading.current_thread().name})")

            sys.addaudithook(on_audit)
            for step in range(3):
                train(tel, 1, first=step)
                time.sleep(0.3)  # the metric reader (every 0.2 s) and the senders run meanwhile
            tel.flush()
            tel.shutdown()
            print("RESULT " + json.dumps(imported), flush=True)
        """,
        )
    assert out["results"] == [[]], f"imported on a telemetry thread after init(): {out['results']}"
    assert steps_received(sink) == [0, 1, 2]


def test_a_forked_child_ends_on_sigterm_by_default_and_one_that_inits_flushes_first(tmp_path: Path) -> None:
    """The parent's SIGTERM handler has nothing to flush in a forked child, and a Python handler can
    miss a SIGTERM that lands just before the main thread blocks: Pool.terminate() waited forever on
    such a worker. The child gets the default back; a child that calls init() gets the flushing one."""
    with OtlpSink() as sink:
        out = run_script(
            tmp_path,
            sink,
            """
            tel = start()
            ours = signal.getsignal(signal.SIGTERM)
            pid = os.fork()
            if pid == 0:
                inherited = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
                mine = start(service_name="worker", rank=3)
                again = signal.getsignal(signal.SIGTERM) is ours
                mine.shutdown()
                print("RESULT " + json.dumps({"default_in_child": inherited, "flushing_after_init": again}), flush=True)
                os._exit(0)
            wait_child(pid)
            ctx = multiprocessing.get_context("fork")
            for _ in range(5):
                pool = ctx.Pool(2)
                pool.map(abs, range(4))
                pool.terminate()  # SIGTERM to workers waiting for their next task
                pool.join()
            print("RESULT " + json.dumps({"parent_still_flushing": signal.getsignal(signal.SIGTERM) is ours}), flush=True)
            tel.shutdown()
        """,
        )
    assert out["results"] == [{"default_in_child": True, "flushing_after_init": True}, {"parent_still_flushing": True}]
