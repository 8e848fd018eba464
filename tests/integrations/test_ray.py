"""Ray: a real local cluster on 127.0.0.1 with two actors; their spans join the driver's step trace."""

from __future__ import annotations

import os
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from loopback import in_loopback_namespace, rerun_in_loopback_namespace  # noqa: E402
from ray_actors import RolloutWorker  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.integrations import ray as otel_ray  # noqa: E402
from otel_rl.runs.folder import find_step_trace, read_log_records, read_spans  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

HERE = Path(__file__).resolve().parent  # workers import ray_actors from here


@contextmanager
def local_ray_cluster(temp_dir: Path, deadline_s: int = 240):
    """A real local Ray cluster (2 CPUs, no dashboard), shut down by ray.shutdown()."""

    def expired(signum, frame):
        raise TimeoutError(f"Ray cluster test ran past {deadline_s} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(deadline_s)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        _temp_dir=str(temp_dir),
        configure_logging=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.slow
def test_remote_actor_calls_become_child_spans_of_the_drivers_stage(request, tmp_path: Path):
    if not in_loopback_namespace():  # Ray's services bind every interface
        rerun_in_loopback_namespace(request, timeout_s=300)
        return
    tel = otel_rl.init(run_dir=str(tmp_path), console=False, service_name="ray-driver", rank=0, world_size=3)
    with tempfile.TemporaryDirectory(prefix="ray") as ray_dir, local_ray_cluster(Path(ray_dir)):  # short: AF_UNIX paths
        Worker = ray.remote(RolloutWorker)
        workers = [
            Worker.options(runtime_env={"env_vars": {**otel_ray.worker_env(rank=r), "PYTHONPATH": str(HERE)}}).remote(0.05 * r)
            for r in (1, 2)
        ]
        pids = ray.get([w.pid.remote() for w in workers])
        assert os.getpid() not in pids and len(set(pids)) == 2  # really other processes
        trace_ids = {}
        for step in (1, 2):
            with tel.step(step) as scope, tel.stage("generate", cluster="actor_infer"):
                trace_ids[step] = scope.trace_id
                outs = ray.get([otel_ray.remote(w.generate, [step, 10]) for w in workers])
            assert outs == [[2 * step, 20]] * 2
        with tel.step(3), tel.stage("compute_rewards"):
            with pytest.raises(ray.exceptions.RayTaskError, match="worker failure"):
                ray.get(otel_ray.remote(workers[0].fail))
        ray.get([w.close.remote() for w in workers])
    tel.shutdown()

    spans = read_spans(tmp_path)
    assert not spans.problems
    for step, trace_id in trace_ids.items():
        trace = find_step_trace(spans, step)
        assert {s.trace_id for s in trace} == {trace_id}
        driver_stage = next(s for s in trace if s.name == "rl.generate" and s.resource[A.RL_RANK] == 0)
        worker_stages = [s for s in trace if s.name == "rl.generate" and s.resource[A.RL_RANK] != 0]
        assert sorted(s.resource[A.RL_RANK] for s in worker_stages) == [1, 2]
        for span in worker_stages:
            assert span.parent_span_id == driver_stage.span_id
            assert span.attributes[A.RL_STEP] == step
            assert span.attributes[A.RL_CLUSTER] == "actor_infer"
            assert span.resource[A.RL_RUN_ID] == tel.config.run_id  # the driver's run, via worker_env
            assert driver_stage.start_ns <= span.start_ns and span.end_ns <= driver_stage.end_ns
    failed = next(s for s in find_step_trace(spans, 3) if s.name == "rl.fail")
    assert failed.status == "error" and "worker failure" in failed.status_message
    worker_logs = [r for r in read_log_records(tmp_path) if r["event_name"] == N.RL_LOG_EVENT]
    assert sorted((r["attributes"][A.RL_STEP], r["trace_id"]) for r in worker_logs) == sorted(
        (step, trace_ids[step]) for step in (1, 2) for _ in range(2)
    )


def test_worker_env_carries_the_run_but_never_otlp_headers(make_telemetry, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret")
    tel = make_telemetry(endpoint="http://127.0.0.1:4318", run_id="run-7", world_size=4)
    env = otel_ray.worker_env(rank=3)
    assert env["OTEL_RL_RUN_ID"] == "run-7" and env["RANK"] == "3" and env["WORLD_SIZE"] == "4"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
    assert "s3cret" not in repr(env)
    from otel_rl._sdk.settings.config import resolve_config

    cfg = resolve_config({}, environ=env)  # what a worker started with that environment resolves
    assert (cfg.run_id, cfg.rank, cfg.world_size, cfg.endpoint) == ("run-7", 3, 4, tel.config.endpoint)
