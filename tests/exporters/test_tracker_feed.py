"""Trackers fed by otel_rl.init(track_with=...): every step exactly, off the training thread,
rank 0 only, failures isolated, secrets nowhere. Real libraries, read back with their own readers."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_trackers import library_homes, read_swanlab_run, read_wandb_history  # noqa: F401 - fixture import

import otel_rl
import otel_rl.trackers.base as _tracker
from otel_rl import Tracker
from otel_rl.runs.folder import read_log_records
from otel_rl.semconv import names as N
from otel_rl.trackers.stdout import parse_stdout_line

SECRET = "sk-otel-rl-SECRET-7f3a9c"


def logged_steps(run_dir: Path) -> dict[int, dict[str, Any]]:
    """step -> exact values, from the run folder's rl.log events (what the program logged)."""
    return {r["attributes"]["rl.step"]: r["body"] for r in read_log_records(run_dir) if r["event_name"] == N.RL_LOG_EVENT}


def numeric(values: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class Recorder(Tracker):
    """A third-party tracker (registered by the test) that records calls and their thread."""

    name = "recorder"
    options = {"fail_on_step": None, "api_key": None}
    secret_keys = ("api_key",)
    instances: list[Recorder] = []

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        self.steps: list[tuple[int | None, dict[str, Any]]] = []
        self.threads: set[str] = set()
        self.hparams: dict[str, Any] = {}
        self.finished = False
        Recorder.instances.append(self)

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        self.threads.add(threading.current_thread().name)
        if step == self.kwargs.get("fail_on_step"):
            raise RuntimeError(f"backend down (key {self.kwargs.get('api_key')})")
        self.steps.append((step, dict(values)))

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        self.hparams.update(hparams)

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def recorder():
    saved = dict(_tracker._registry)
    Recorder.instances = []
    otel_rl.register_tracker("recorder", Recorder)
    yield Recorder
    _tracker._registry.clear()
    _tracker._registry.update(saved)


def test_a_demo_run_reaches_tensorboard_jsonl_and_stdout_exactly(tmp_path, capsys):
    pytest.importorskip("torch")
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from otel_rl.demo import run_demo

    tel = otel_rl.init(
        run_dir=str(tmp_path / "run"),
        console=False,
        framework="roll",
        track_with=["tensorboard", "jsonl", "stdout"],
        tracker_kwargs={"tensorboard": {"log_dir": str(tmp_path / "tb")}, "jsonl": {"path": str(tmp_path / "steps.jsonl")}},
    )
    run_demo(steps=5, telemetry=tel, out=tmp_path / "run", progress=False)
    tel.shutdown()
    logged = logged_steps(tmp_path / "run")
    assert sorted(logged) == [1, 2, 3, 4, 5] and len(logged[5]) > 80

    acc = ea.EventAccumulator(str(tmp_path / "tb"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    for step, values in logged.items():
        for key, value in numeric(values).items():
            (event,) = [e for e in acc.Scalars(key) if e.step == step]
            assert event.value == pytest.approx(float(np.float32(value)), nan_ok=True), (step, key)

    jsonl = {row["step"]: row["data"] for row in map(json.loads, (tmp_path / "steps.jsonl").read_text().splitlines())}
    assert jsonl == logged

    printed = [parse_stdout_line(line) for line in capsys.readouterr().out.splitlines() if line.startswith("metrics_tag:")]
    assert {step: values for step, values in printed} == logged


def test_wandb_and_swanlab_offline_receive_every_step(tmp_path, library_homes, monkeypatch):  # noqa: F811
    pytest.importorskip("wandb")
    pytest.importorskip("swanlab")
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    tel = otel_rl.init(
        run_dir=str(tmp_path / "run"),
        console=False,
        track_with=["wandb", "swanlab"],
        tracker_kwargs={
            "wandb": {"api_key": SECRET, "project": "otel-rl", "name": "feed"},
            "swanlab": {
                "login_kwargs": {"api_key": SECRET},
                "project": "otel-rl",
                "mode": "offline",
                "logdir": str(tmp_path / "swanlog"),
                "experiment_name": "feed",
            },
        },
    )
    try:
        for step in range(1, 4):
            with tel.step(step):
                tel.log({"actor/pg_loss": 0.1 * step, "critic/score/mean": 0.5 + step, "note": f"s{step}"})
        tel.shutdown()
    finally:
        wandb.teardown()
    (run_folder,) = (tmp_path / "run").rglob("offline-run-*")
    history = {step: item for step, item in read_wandb_history(run_folder)}
    for step in (1, 2, 3):
        item = history[step]
        assert float(item["actor/pg_loss"]) == pytest.approx(0.1 * step)
        assert float(item["critic/score/mean"]) == pytest.approx(0.5 + step)
    scalars, _texts = read_swanlab_run(tmp_path / "swanlog")
    assert {s: v["actor/pg_loss"] for s, v in scalars.items()} == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_a_failing_tracker_is_reported_once_and_never_stops_the_run_or_the_others(tmp_path, recorder, caplog):
    tel = otel_rl.init(
        run_dir=str(tmp_path / "run"),
        console=False,
        track_with=["recorder", "jsonl"],
        tracker_kwargs={"recorder": {"fail_on_step": 2, "api_key": SECRET}},
    )
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        for step in range(1, 5):
            with tel.step(step):
                tel.log({"actor/pg_loss": float(step)})
        tel.shutdown()
    (rec,) = recorder.instances
    assert [s for s, _ in rec.steps] == [1, 3, 4] and rec.finished
    failures = [r.getMessage() for r in caplog.records if "tracker 'recorder' failed" in r.getMessage()]
    assert len(failures) == 1 and SECRET not in failures[0] and "***" in failures[0]
    rows = [json.loads(line)["step"] for line in (tmp_path / "run" / "jsonl" / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3, 4]


def test_trackers_write_off_the_training_thread_and_get_hparams(tmp_path, recorder):
    tel = otel_rl.init(run_dir=str(tmp_path / "run"), console=False, track_with="recorder")
    tel.log_hparams({"actor": {"lr": 1e-6}, "algo": "grpo"})
    tel.log({"actor/pg_loss": 1.0}, step=0)
    tel.shutdown()
    (rec,) = recorder.instances
    assert rec.steps == [(0, {"actor/pg_loss": 1.0})]
    assert threading.main_thread().name not in rec.threads
    assert rec.hparams == {"actor/lr": 1e-6, "algo": "grpo"}


def test_only_rank_zero_tracks_unless_asked(tmp_path, recorder):
    for rank, all_ranks, expected in ((1, False, 0), (1, True, 1), (0, False, 1)):
        tel = otel_rl.init(
            run_dir=str(tmp_path / f"r{rank}{all_ranks}"), console=False, track_with="recorder", rank=rank, tracker_all_ranks=all_ranks
        )
        tel.log({"actor/pg_loss": 1.0}, step=0)
        tel.shutdown()
        assert len(recorder.instances) == expected, (rank, all_ranks)
        recorder.instances = []


def test_registry_key_style(tmp_path, recorder):
    tel = otel_rl.init(run_dir=str(tmp_path / "run"), console=False, track_with="recorder", tracker_keys="registry", framework="roll")
    tel.log({"actor/pg_loss": 1.0, "my/custom": 2.0}, step=0)
    tel.shutdown()
    (rec,) = recorder.instances
    assert rec.steps == [(0, {'rl.loss{rl.loss.type="policy",rl.model.role="actor"}': 1.0, "my/custom": 2.0})]


def test_unknown_tracker_and_missing_library_fail_at_init(tmp_path, recorder):
    with pytest.raises(ValueError, match="unknown tracker 'tensorbord'.*tensorboard"):
        otel_rl.init(run_dir=str(tmp_path / "a"), console=False, track_with="tensorbord")

    class Missing(Recorder):
        name = "missing"
        extra = "otel_rl_no_such_backend_library"

    otel_rl.register_tracker("missing", Missing)
    with pytest.raises(ImportError, match=r"pip install 'otel-rl\[otel_rl_no_such_backend_library\]'"):
        otel_rl.init(run_dir=str(tmp_path / "b"), console=False, track_with="missing")


def test_roll_style_yaml_config_file(tmp_path, recorder):
    config = tmp_path / "otel-rl.yaml"
    config.write_text(f"track_with: recorder\ntracker_kwargs:\n  api_key: {SECRET}\n  fail_on_step: 99\n")
    tel = otel_rl.init(run_dir=str(tmp_path / "run"), console=False, config_file=str(config))
    tel.log({"actor/pg_loss": 3.0}, step=1)
    tel.shutdown()
    (rec,) = recorder.instances
    assert rec.steps == [(1, {"actor/pg_loss": 3.0})] and rec.kwargs["fail_on_step"] == 99
    assert SECRET not in repr(tel.config) and SECRET not in json.dumps(tel.config.public_dict())
    assert tel.config.public_dict()["tracker_kwargs"]["api_key"] == "***"


def test_the_secret_appears_nowhere_a_run_writes(tmp_path, library_homes, monkeypatch, capfd, caplog):  # noqa: F811
    """Issue: API keys never in logs, spans, resource attributes, events, config dumps, reprs, errors."""
    pytest.importorskip("torch")
    pytest.importorskip("wandb")
    import wandb

    from otel_rl.demo import run_demo

    monkeypatch.setenv("WANDB_MODE", "offline")
    with caplog.at_level(logging.DEBUG):
        tel = otel_rl.init(
            run_dir=str(tmp_path / "run"),
            framework="roll",
            track_with=["wandb", "tensorboard", "stdout", "jsonl"],
            tracker_kwargs={"wandb": {"api_key": SECRET, "project": "p", "name": "n"}, "tensorboard": {"log_dir": str(tmp_path / "tb")}},
        )
        try:
            tel.log_hparams({"tracker": {"wandb": {"project": "p"}}, "lr": 1e-6})
            run_demo(steps=3, telemetry=tel, out=tmp_path / "run", progress=False)
            texts = [repr(tel), repr(tel.config), json.dumps(tel.config.public_dict(), default=str), repr(tel._trackers.trackers)]
            tel.shutdown()
        finally:
            wandb.teardown()
    out, err = capfd.readouterr()
    assert "metrics_tag:" in out  # the run did write to stdout
    for text in [out, err, *texts, *(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)]:
        assert SECRET not in text
    written = [p for p in [*tmp_path.rglob("*"), *library_homes.rglob("*")] if p.is_file()]
    assert len(written) > 10
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
