"""verl validation generations as rollout samples, through verl's real ``Tracking`` and
``ValidationGenerationsLogger`` (verl/utils/tracking.py) on CPU: with ``trainer.logger`` naming
``"otel"``, the samples ``RayPPOTrainer._maybe_log_val_generations`` picks reach
``Telemetry.log_samples``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import otel_rl
from otel_rl.runs.folder import read_log_records
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

try:
    import verl.utils.tracking  # noqa: F401

    REAL_VERL = True
except Exception:  # verl absent, or present without its import-time dependencies
    REAL_VERL = False
pytestmark = pytest.mark.skipif(not REAL_VERL, reason="verl is not importable here")


@pytest.fixture
def verl_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from otel_rl.integrations import verl as otel_verl

    for name in ("OTEL_SERVICE_NAME", "OTEL_RL_EXPERIMENT", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_RL_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    run_dir = tmp_path / "run"
    monkeypatch.setenv("OTEL_RL_RUN_DIR", str(run_dir))
    monkeypatch.setenv("OTEL_RL_EXPORTERS", "file")
    monkeypatch.setenv("OTEL_RL_CONSOLE", "false")
    monkeypatch.setenv("OTEL_RL_LOG_SAMPLES", "2")
    monkeypatch.setattr(otel_rl, "_current", None)
    assert otel_verl.install() is True
    return run_dir


def picked_like_verl(inputs: list[str], outputs: list[str], scores: list[float], n: int) -> list[tuple[str, str, float]]:
    """What ``RayPPOTrainer._maybe_log_val_generations`` (verl 0.9.1) hands the logger."""
    samples = list(zip(inputs, outputs, scores, strict=True))
    samples.sort(key=lambda x: x[0])
    np.random.RandomState(42).shuffle(samples)
    return samples[:n]


def test_validation_generations_reach_log_samples(verl_run: Path) -> None:
    from verl.utils.tracking import Tracking, ValidationGenerationsLogger

    loggers = ["console", "otel"]
    tracking = Tracking(project_name="p", experiment_name="e", default_backend=loggers)
    inputs = [f"question {i}" for i in range(6)]
    outputs = [f"answer {i} ✓" for i in range(6)]
    scores = [i / 5 for i in range(6)]
    samples = picked_like_verl(inputs, outputs, scores, n=3)
    ValidationGenerationsLogger().log(loggers, samples, 10)
    ValidationGenerationsLogger().log(["console"], samples, 11)  # no "otel": not ours
    tracking.log({"val-core/acc/mean": 0.5}, step=10)
    tracking.finish()

    records = [r for r in read_log_records(verl_run) if r["event_name"] == N.RL_SAMPLE_EVENT]
    assert len(records) == 2  # OTEL_RL_LOG_SAMPLES=2 of verl's 3
    by_prompt = {s[0]: s for s in samples}
    for record in records:
        assert record["attributes"][A.RL_STEP] == 10
        body = record["body"]
        prompt, response, score = by_prompt[body["prompt"]]
        assert (body["response"], body["reward"]) == (response, score)
        assert body["index"] == [s[0] for s in samples].index(prompt)


def test_off_without_log_samples(verl_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.utils.tracking import Tracking, ValidationGenerationsLogger

    monkeypatch.setenv("OTEL_RL_LOG_SAMPLES", "0")
    tracking = Tracking(project_name="p", experiment_name="e", default_backend=["otel"])
    ValidationGenerationsLogger().log(["otel"], [("q", "a", 1.0)], 1)
    tracking.finish()
    assert not [r for r in read_log_records(verl_run) if r["event_name"] == N.RL_SAMPLE_EVENT]
