"""Rollout samples in the trackers: each backend writes a step's ``rl.sample`` rows as its users
expect (W&B Table, TensorBoard Markdown text, SwanLab echarts Table, MLflow table artifact, jsonl
lines), and each is read back with the library's own reader. The fan-out hands a step's samples
over in one call, before that step's values."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N
from otel_rl.trackers.base import Tracker, create_trackers
from otel_rl.trackers.fanout import TrackerFanout, deliver
from otel_rl.trackers.jsonl import read_jsonl, read_jsonl_samples
from otel_rl.trackers.samples import columns, markdown_table

STEP_ROWS: dict[int, list[dict[str, Any]]] = {
    1: [
        {
            "step": 1,
            "index": 0,
            "group_id": "0",
            "prompt": "reverse 12 =",
            "response": "21 | ok\nthen ünïcode ✓",
            "reward": 1.0,
            "rewards/accuracy": 0.8,
            "rewards/format": 0.2,
            "response_length": 3,
            "truncated": False,
        },
        {"step": 1, "index": 5, "prompt": "reverse 345 =", "response": "5", "reward": 0.25, "rewards/accuracy": 0.25, "truncated": True},
    ],
    2: [{"step": 2, "index": 1, "group_id": "1", "prompt": "reverse 9 =", "response": "9", "reward": 0.5, "response_length": 1}],
}


def feed(tracker: Tracker) -> None:
    """Both steps through the fan-out as the exporter sees them: samples, then the step's values."""
    fanout = TrackerFanout([tracker])
    fanout.start()
    for step, rows in STEP_ROWS.items():
        for row in rows:
            assert deliver(fanout, N.RL_SAMPLE_EVENT, {A.RL_STEP: step, A.RL_SAMPLE_INDEX: row["index"]}, row)
        deliver(fanout, N.RL_LOG_EVENT, {A.RL_STEP: step}, {"reward": float(step)})
    fanout.flush()
    fanout.finish()


def as_records(names: Sequence[str], data: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Table rows back as mappings, without the cells a row did not have."""
    return [{k: v for k, v in zip(names, row) if v is not None} for row in data]


@pytest.fixture
def library_homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var, sub in [
        ("WANDB_CONFIG_DIR", ".config/wandb"),
        ("WANDB_CACHE_DIR", ".cache/wandb"),
        ("WANDB_DATA_DIR", ".local/share/wandb"),
        ("WANDB_ARTIFACT_DIR", "artifacts"),
        ("SWANLAB_ROOT", ".swanlab"),
    ]:
        monkeypatch.setenv(var, str(home / sub))
    for var in ("WANDB_API_KEY", "SWANLAB_API_KEY", "MLFLOW_TRACKING_URI", "WANDB_MODE", "SWANLAB_MODE"):
        monkeypatch.delenv(var, raising=False)
    return home


# ---- the shared table shape and the fan-out -------------------------------------------------------


def test_columns_are_ordered_and_markdown_cells_stay_on_one_line() -> None:
    rows = STEP_ROWS[1]
    assert columns(rows) == [
        "step",
        "index",
        "group_id",
        "prompt",
        "response",
        "reward",
        "rewards/accuracy",
        "rewards/format",
        "response_length",
        "truncated",
    ]
    table = markdown_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert "21 \\| ok<br>then ünïcode ✓" in table[2]
    assert table[3].count(" | ") == len(columns(rows)) - 1  # the missing cells are empty, not dropped


class Recorder(Tracker):
    name = "recorder"
    extra = None

    def __init__(self) -> None:
        super().__init__(run_name="r", run_dir=None)
        self.calls: list[tuple[str, Any, Any]] = []

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        self.calls.append(("log", step, dict(values)))

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int | None) -> None:
        self.calls.append(("samples", step, [dict(r) for r in rows]))

    def finish(self) -> None:
        pass


def test_fanout_gives_a_step_its_samples_in_one_call_before_its_values() -> None:
    recorder = Recorder()
    feed(recorder)
    assert recorder.calls == [
        ("samples", 1, STEP_ROWS[1]),
        ("log", 1, {"reward": 1.0}),
        ("samples", 2, STEP_ROWS[2]),
        ("log", 2, {"reward": 2.0}),
    ]


def test_fanout_delivers_held_samples_at_flush_and_a_tracker_without_log_samples_ignores_them(tmp_path: Path) -> None:
    recorder = Recorder()
    (stdout,) = create_trackers("stdout", None, run_name="r", run_dir=tmp_path)  # no log_samples: the default, nothing
    fanout = TrackerFanout([stdout, recorder])
    deliver(fanout, N.RL_SAMPLE_EVENT, {A.RL_STEP: 3}, {"prompt": "p", "step": 3, "index": 0})
    deliver(fanout, N.RL_LOG_EVENT, {A.RL_STEP: 2}, {"x": 1.0})  # an earlier step's values: samples of 3 wait
    assert [c[0] for c in recorder.calls] == ["log"]
    fanout.flush()
    assert recorder.calls[-1] == ("samples", 3, [{"prompt": "p", "step": 3, "index": 0}])


# ---- each backend, read back with its own reader ---------------------------------------------------


def test_jsonl_writes_sample_lines_beside_the_step_lines(tmp_path: Path) -> None:
    (tracker,) = create_trackers("jsonl", None, run_name="r", run_dir=tmp_path)
    feed(tracker)
    assert read_jsonl_samples(tracker.path) == [(1, STEP_ROWS[1]), (2, STEP_ROWS[2])]
    assert read_jsonl(tracker.path) == [(1, {"reward": 1.0}), (2, {"reward": 2.0})]  # verl-format readers skip them
    for line in tracker.path.read_text(encoding="utf-8").splitlines():
        json.loads(line)  # every line standard JSON


def test_tensorboard_shows_a_markdown_table_per_step(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    (tracker,) = create_trackers("tensorboard", None, run_name="r", run_dir=tmp_path)
    feed(tracker)
    acc = ea.EventAccumulator(str(tracker.log_dir), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    events = acc.Tensors("samples/text_summary")
    assert [e.step for e in events] == [1, 2]
    for event in events:
        text = tensor_util.make_ndarray(event.tensor_proto).item().decode()
        assert text == markdown_table(STEP_ROWS[event.step])
    assert "reverse 345 =" in tensor_util.make_ndarray(events[0].tensor_proto).item().decode()


def test_wandb_offline_logs_a_table_per_step(tmp_path: Path, library_homes: Path) -> None:
    wandb = pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    (tracker,) = create_trackers("wandb", {"mode": "offline", "project": "otel-rl"}, run_name="r", run_dir=run_dir)
    try:
        feed(tracker)
    finally:
        wandb.teardown()
    (run_folder,) = (run_dir / "wandb").glob("offline-run-*")
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_folder)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    history = [json.loads(line) for line in out.stdout.splitlines()]
    tables = {}
    for record in (r["history"] for r in history if r["type"] == "history"):
        step = record["step"].get("num", 0)
        item = record["item"]
        if "samples._type" in item:  # the table's reference; its rows are in the run's media file
            assert item["samples._type"] == "table-file"
            assert item["samples.nrows"] == len(STEP_ROWS[step])
            tables[step] = json.loads((run_folder / "files" / item["samples.path"]).read_text(encoding="utf-8"))
        assert item["reward"] == step
    assert sorted(tables) == [1, 2]
    for step, table in tables.items():
        assert table["columns"] == columns(STEP_ROWS[step])
        assert as_records(table["columns"], table["data"]) == STEP_ROWS[step]


def test_swanlab_offline_logs_an_echarts_table_per_step(tmp_path: Path, library_homes: Path) -> None:
    pytest.importorskip("swanlab")
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (tracker,) = create_trackers("swanlab", {"mode": "offline", "project": "otel-rl"}, run_name="r", run_dir=tmp_path / "run")
    feed(tracker)
    assert tracker.logdir is not None
    (run_file,) = tracker.logdir.glob("run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(run_file)
    tables: dict[int, dict[str, Any]] = {}
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        if record.HasField("media") and record.media.key == "samples":
            (item,) = record.media.value.items
            tables[record.media.step] = json.loads((run_file.parent / "media" / "echarts" / item.filename).read_text(encoding="utf-8"))
    reader.close()
    assert sorted(tables) == [1, 2]
    for step, table in tables.items():
        assert table["_swanLab"] == "table"
        assert [c["field"] for c in table["colDefs"]] == columns(STEP_ROWS[step])
        assert [{k: v for k, v in row.items() if v is not None} for row in table["rowData"]] == STEP_ROWS[step]


@pytest.fixture
def mlflow_file_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    pytest.importorskip("mlflow")
    # Recorded so the variable the tracker sets for the file store is removed afterwards.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    yield


def test_mlflow_logs_a_table_artifact_per_step(tmp_path: Path, library_homes: Path, mlflow_file_store: None) -> None:
    import mlflow

    from otel_rl.trackers.mlflow import samples_artifact

    (tracker,) = create_trackers("mlflow", {"experiment_name": "otel-rl"}, run_name="r", run_dir=tmp_path / "run")
    tracker.start()
    run_id = tracker.run_id
    # A step whose samples came in two calls: the second appends to the table.
    tracker.log_samples(STEP_ROWS[1][:1], 1)
    tracker.log_samples(STEP_ROWS[1][1:], 1)
    tracker.log_samples(STEP_ROWS[2], 2)
    tracker.finish()

    mlflow.set_tracking_uri(tracker.tracking_uri)  # load_table searches runs through the fluent API
    try:
        client = mlflow.MlflowClient(tracking_uri=tracker.tracking_uri)
        experiment_id = client.get_experiment_by_name("otel-rl").experiment_id
        for step, rows in STEP_ROWS.items():
            frame = client.load_table(experiment_id, samples_artifact(step), run_ids=[run_id])
            assert list(frame.columns) == columns(rows)
            assert list(frame["prompt"]) == [r["prompt"] for r in rows] and list(frame["reward"]) == [r["reward"] for r in rows]
            if step == 2:  # one call: the artifact holds the cells exactly (an append goes through pandas' reader)
                path = client.download_artifacts(run_id, samples_artifact(step), str(tmp_path / "download"))
                table = json.loads(Path(path).read_text(encoding="utf-8"))
                assert as_records(table["columns"], table["data"]) == rows
    finally:
        mlflow.set_tracking_uri(None)
