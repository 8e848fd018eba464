"""Experiment-tracker backends, with the real libraries (no mocks).

Every backend test writes the same 5 steps of ROLL keys (a string, a bool, an int, a NaN, an
infinity and a None among them) and reads them back with the library's own reader:

- TensorBoard: ``tensorboard``'s ``EventAccumulator`` (scalars and text tensors, unlimited);
- W&B (offline): ``wandb leet inspect --json``, the installed wandb's reader of a run's
  ``.wandb`` transaction log (wandb 0.31 has no Python-side reader of it any more);
- SwanLab (offline): SwanLab's ``DataStoreReader`` over the run's ``.swanlab`` record log, parsed
  with SwanLab's ``Record`` protobuf; text values from the media files the records name;
- MLflow: ``MlflowClient.get_metric_history`` / ``get_run``;
- stdout: captured output parsed with :func:`parse_stdout_line`; jsonl: the file.

Each also checks that the secret given in tracker_kwargs or embedded in the hparams appears in no
file written (run folder and the library's home folders), no captured output or log record, and
no ``repr()``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import traceback
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import otel_rl.trackers.base as _tracker
from otel_rl.trackers.base import REDACTED, Tracker, TrackerError, create_trackers, known_trackers, redact, register_tracker
from otel_rl.trackers.jsonl import read_jsonl
from otel_rl.trackers.stdout import parse_stdout_line

SECRET = "sk-test-SECRET-123"
STEPS = range(1, 6)
# hparams as a training config carries them: with the tracker's own kwargs (and key) inside.
HPARAMS = {
    "exp_name": "grpo-demo",
    "actor": {"lr": 1e-6, "ppo_epochs": 1},
    "track_with": "wandb",
    "tracker_kwargs": {"api_key": SECRET, "project": "otel-rl"},
}


def step_values(step: int) -> dict[str, Any]:
    """~25 keys as ROLL logs them, with every kind of value a step can carry."""
    return {
        "actor/pg_loss": 0.1 * step - 0.35,
        "actor/kl_loss": 1e-3 * step,
        "actor/lr": 1e-6,
        "actor/clipfrac": step / 10,
        "actor/approxkl": 0.0007 * step,
        "actor/total_samples": 64,
        "actor/valid_sample_ratio": 0.75,
        "actor/grad_norm": math.nan if step == 3 else 1.242 + step,
        "actor/early_stop": step == 4,
        "critic/score/mean": 0.17 + 0.09 * step,
        "critic/score/max": 1.0,
        "critic/score/min": 0.0,
        "critic/rewards/mean": 0.01352 * step,
        "critic/advantages/mean": -0.0123 * step,
        "critic/returns/max": math.inf if step == 5 else 2.5,
        "critic/entropy/mean": 0.6845 - 0.01 * step,
        "critic/vpred": None,
        "tokens/response_length/mean": 3.4 + step,
        "time/actor_train/train_step/total": 0.261 + step / 100,
        "time/actor_train/compute_log_probs/onload": 216e-6,
        "memory/actor_train/end/onload/max_allocated/0": 12.5,
        "system/tps": 11500 + step,
        "system/samples": np.int64(64 * step),
        "actor/pg_loss@sum": 0.5 * step,
        "memory(GiB)": 3.25,
        "val/generation": f"step {step}: 12345 -> 54321 \u2713",
    }


def numeric_expected(step: int) -> dict[str, float]:
    """What a scalar backend holds: numbers and bools (0/1); no strings, no None."""
    out = {}
    for key, value in step_values(step).items():
        if value is None or isinstance(value, str):
            continue
        out[key] = float(value)
    return out


def text_expected(step: int) -> dict[str, str]:
    return {k: v for k, v in step_values(step).items() if isinstance(v, str)}


def same(actual: float, expected: float) -> bool:
    return (math.isnan(actual) and math.isnan(expected)) or actual == expected


def assert_no_secret(roots: list[Path], *texts: str) -> None:
    """The secret is in no file under ``roots`` and in none of ``texts``."""
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), f"secret written to {path}"
    for text in texts:
        assert SECRET not in text


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)


def run_steps(tracker: Tracker) -> None:
    tracker.start(HPARAMS)
    for step in STEPS:
        tracker.log(step_values(step), step)
    tracker.flush()
    tracker.finish()


@pytest.fixture
def restore_registry() -> Iterator[None]:
    saved = dict(_tracker._registry)
    yield
    _tracker._registry.clear()
    _tracker._registry.update(saved)


@pytest.fixture
def library_homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME and the libraries' config/cache folders inside tmp_path, so every file they write
    (including a ~/.netrc) is where the test looks, and nothing touches the real home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var, sub in [
        ("WANDB_CONFIG_DIR", ".config/wandb"),
        ("WANDB_CACHE_DIR", ".cache/wandb"),
        ("WANDB_DATA_DIR", ".local/share/wandb"),
        ("WANDB_ARTIFACT_DIR", "artifacts"),
        ("SWANLAB_ROOT", ".swanlab"),
        ("MPLCONFIGDIR", ".config/matplotlib"),
    ]:
        monkeypatch.setenv(var, str(home / sub))
    for var in ("WANDB_API_KEY", "SWANLAB_API_KEY", "MLFLOW_TRACKING_URI", "WANDB_MODE", "SWANLAB_MODE"):
        monkeypatch.delenv(var, raising=False)
    return home


# ---- registry, factory, secrets ------------------------------------------------------------


class ListTracker(Tracker):
    """A third-party tracker that keeps what it is given."""

    name = "memory"
    extra = None
    options = {"capacity": 10, "api_key": None}
    secret_keys = ("api_key",)

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        self.started = dict(hparams or {})
        self.steps: list[tuple[int | None, dict[str, Any]]] = []

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        self.steps.append((step, dict(values)))

    def finish(self) -> None:
        self.finished = True


def test_known_trackers_lists_the_builtins() -> None:
    assert {"tensorboard", "wandb", "swanlab", "stdout", "jsonl", "mlflow"} <= set(known_trackers())
    assert known_trackers() == sorted(known_trackers())


def test_importing_and_creating_imports_no_backend_library(tmp_path: Path) -> None:
    # A fresh interpreter: the libraries are imported by start(), never by import or creation.
    code = textwrap.dedent(
        f"""
        import sys
        import otel_rl
        from otel_rl.trackers.base import create_trackers
        trackers = create_trackers(
            ["tensorboard", "wandb", "swanlab", "stdout", "jsonl", "mlflow"],
            {{"wandb": {{"mode": "offline"}}}}, run_name="r", run_dir={str(tmp_path)!r})
        assert len(trackers) == 6
        heavy = ["wandb", "swanlab", "tensorboardX", "tensorboard", "mlflow", "torch"]
        print([m for m in heavy if m in sys.modules])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert not any(tmp_path.iterdir()), "creating trackers must not write anything"


def test_unknown_tracker_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError) as err:
        create_trackers("tensorbord", None, run_name="r", run_dir=None)
    message = str(err.value)
    assert "'tensorbord'" in message
    for name in ("jsonl", "mlflow", "stdout", "swanlab", "tensorboard", "wandb"):
        assert name in message


def test_no_tracker_gives_an_empty_list() -> None:
    assert create_trackers(None, None, run_name="r", run_dir=None) == []
    assert create_trackers([], {}, run_name="r", run_dir=None) == []


def test_unknown_kwarg_names_the_tracker_and_accepted_keys_but_not_values(tmp_path: Path) -> None:
    with pytest.raises(TypeError) as err:
        create_trackers("tensorboard", {"log_dir": str(tmp_path), "api_key": SECRET}, run_name="r", run_dir=None)
    message = str(err.value)
    assert "'tensorboard'" in message and "api_key" in message
    assert "flush_secs" in message and "log_dir" in message and "max_queue" in message
    assert SECRET not in message


def test_missing_library_names_the_pip_extra(restore_registry: None) -> None:
    class NeedsMissing(ListTracker):
        name = "missing"
        extra = "otel_rl_no_such_library_xyz"

    register_tracker("missing", NeedsMissing)
    with pytest.raises(ImportError) as err:
        create_trackers("missing", {}, run_name="r", run_dir=None)
    assert "pip install 'otel-rl[otel_rl_no_such_library_xyz]'" in str(err.value)
    assert "'missing'" in str(err.value)


def test_a_tracker_written_for_the_old_step_first_order_is_adapted_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="old argument order"):

        class OldTracker(Tracker):
            name = "old"

            def log(self, step: int | None, values: Mapping[str, Any]) -> None:  # the order trackers had at first
                self.got = (step, dict(values))

            def finish(self) -> None:
                pass

    tracker = OldTracker(run_name="r", run_dir=None)
    tracker.log({"a": 1.0}, 3)
    assert tracker.got == (3, {"a": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the current order is not touched

        class NewTracker(ListTracker):
            def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
                super().log(values, step)

    new = NewTracker(run_name="r", run_dir=None)
    new.start()
    new.log({"b": 2.0}, 4)
    assert new.steps == [(4, {"b": 2.0})]


def test_register_a_third_party_class_and_a_lazy_string(restore_registry: None) -> None:
    register_tracker("memory", ListTracker)
    register_tracker("memory-lazy", f"{__name__}:ListTracker")
    assert {"memory", "memory-lazy"} <= set(known_trackers())
    assert isinstance(_tracker._registry["memory-lazy"], str)  # not imported until used

    first, second = create_trackers(["memory", "memory-lazy"], {"memory": {"capacity": 3}}, run_name="run-1", run_dir=None)
    assert type(first) is ListTracker and type(second) is ListTracker
    assert first.settings == {"capacity": 3, "api_key": None} and second.settings["capacity"] == 10
    assert first.run_name == "run-1"
    first.start({"lr": 1})
    first.log({"a": 1.0}, 7)
    first.finish()
    assert first.steps == [(7, {"a": 1.0})] and first.started == {"lr": 1} and first.finished

    with pytest.raises(TypeError, match="not a Tracker subclass"):
        register_tracker("bad", dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="module:Class"):
        register_tracker("bad", "no_colon_here")
    register_tracker("broken", "otel_rl_no_such_module:Tracker")
    with pytest.raises(ImportError, match="'broken'"):
        create_trackers("broken", None, run_name="r", run_dir=None)


def test_list_form_takes_a_mapping_of_kwargs_per_tracker(tmp_path: Path) -> None:
    jsonl, stdout = create_trackers(["jsonl", "stdout"], {"jsonl": {"path": str(tmp_path / "m.jsonl")}}, run_name="r", run_dir=tmp_path)
    assert jsonl.path == tmp_path / "m.jsonl" and stdout.kwargs == {}
    # Kwargs for a tracker not in the list (typically flat single-tracker kwargs): an error.
    with pytest.raises(ValueError, match="maps tracker name -> its kwargs"):
        create_trackers(["jsonl", "stdout"], {"path": "x.jsonl"}, run_name="r", run_dir=tmp_path)
    with pytest.raises(ValueError, match="more than once"):
        create_trackers(["stdout", "stdout"], None, run_name="r", run_dir=tmp_path)


def test_redact_masks_secret_paths_and_api_keys_without_mutating() -> None:
    kwargs = {
        "api_key": SECRET,
        "project": "p",
        "login_kwargs": {"api_key": SECRET, "host": "https://example"},
        "settings": {"token": "tok-123456", "console": "off", "nested": {"api_key": SECRET}},
    }
    out = redact(kwargs, ("settings.token",))
    assert out == {
        "api_key": REDACTED,
        "project": "p",
        "login_kwargs": {"api_key": REDACTED, "host": "https://example"},
        "settings": {"token": REDACTED, "console": "off", "nested": {"api_key": REDACTED}},
    }
    assert kwargs["settings"]["token"] == "tok-123456"  # the input is untouched
    assert redact(kwargs, ("login_kwargs",))["login_kwargs"] == REDACTED


def test_repr_shows_redacted_kwargs(tmp_path: Path) -> None:
    wandb, swanlab = create_trackers(
        ["wandb", "swanlab"],
        {
            "wandb": {"api_key": SECRET, "project": "p", "settings": {"api_key": SECRET, "console": "off"}},
            "swanlab": {"login_kwargs": {"api_key": SECRET}, "project": "p", "mode": "offline"},
        },
        run_name="r",
        run_dir=tmp_path,
    )
    for tracker in (wandb, swanlab):
        assert SECRET not in repr(tracker) and REDACTED in repr(tracker)
    assert "'project': 'p'" in repr(wandb) and "'console': 'off'" in repr(wandb)
    assert "'login_kwargs': '***'" in repr(swanlab)


def assert_traceback_clean(error: BaseException) -> None:
    """No frame of the error's traceback holds the secret in a local variable (as debuggers,
    pytest and error reporters print them), and nothing is chained to it."""
    assert error.__cause__ is None and error.__context__ is None
    package = str(Path(_tracker.__file__).parents[1])
    frames = [f for f, _ in traceback.walk_tb(error.__traceback__) if f.f_code.co_filename.startswith(package)]
    assert frames  # otel_rl's own frames (the test's are not its concern)
    for frame in frames:
        for name, value in frame.f_locals.items():
            assert SECRET not in repr(value), f"{frame.f_code.co_name}: local {name} holds the secret"


def test_backend_errors_are_scrubbed_when_a_tracker_holds_secrets(restore_registry: None) -> None:
    def login(key: str) -> None:
        try:
            raise ConnectionError(f"refused for key={key}")
        except ConnectionError as inner:
            raise ValueError("login failed") from inner  # the key only in the cause

    class Echoing(ListTracker):
        def start(self, hparams: Mapping[str, Any] | None = None) -> None:
            self.backend_call("login", lambda: login(self.settings["api_key"]))

    register_tracker("echo", Echoing)
    (tracker,) = create_trackers("echo", {"api_key": SECRET}, run_name="r", run_dir=None)
    with pytest.raises(TrackerError) as err:
        tracker.start()
    assert str(err.value) == ("memory tracker: login failed: ValueError: login failed; caused by ConnectionError: refused for key=***")
    assert_traceback_clean(err.value)

    def init() -> None:
        raise KeyError("no-secret-here")

    class Plain(ListTracker):
        def start(self, hparams: Mapping[str, Any] | None = None) -> None:
            self.backend_call("init", init)

    register_tracker("plain", Plain)
    (tracker,) = create_trackers("plain", {}, run_name="r", run_dir=None)
    with pytest.raises(KeyError):  # no secrets configured: the original error, unchanged
        tracker.start()
    (tracker,) = create_trackers("plain", {"api_key": SECRET}, run_name="r", run_dir=None)
    with pytest.raises(TrackerError, match="init failed: KeyError: 'no-secret-here'"):
        tracker.start()


def test_hparams_are_scrubbed_of_keys_and_secret_values(restore_registry: None) -> None:
    register_tracker("memory", ListTracker)
    (tracker,) = create_trackers("memory", {"api_key": SECRET}, run_name="r", run_dir=None)
    scrubbed = tracker.scrub_hparams({**HPARAMS, "note": f"Bearer {SECRET}", "list": [SECRET, 1]})
    assert scrubbed["tracker_kwargs"] == {"api_key": REDACTED, "project": "otel-rl"}
    assert scrubbed["note"] == f"Bearer {REDACTED}" and scrubbed["list"] == [REDACTED, 1]
    assert scrubbed["actor"] == {"lr": 1e-6, "ppo_epochs": 1}


# ---- stdout ----------------------------------------------------------------------------------


def test_stdout_prints_rolls_line_format_and_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    (tracker,) = create_trackers("stdout", None, run_name="r", run_dir=tmp_path)
    run_steps(tracker)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == len(STEPS)
    assert all(line.startswith('metrics_tag: {"step": ') for line in lines)
    for step, line in zip(STEPS, lines):
        parsed_step, values = parse_stdout_line(line)
        assert parsed_step == step
        expected = {k: v for k, v in step_values(step).items() if v is not None}
        assert values.keys() == expected.keys()
        for key, value in expected.items():
            if isinstance(value, (bool, str)):
                assert values[key] == value and type(values[key]) is type(value), key
            else:
                assert same(values[key], float(value)), key
        # Byte for byte what ROLL's StdoutTracker formats for the same values.
        roll_values = {k: v.item() if isinstance(v, np.generic) else v for k, v in expected.items()}
        assert line == f"metrics_tag: {json.dumps({'step': step, 'metrics': roll_values})}"
    # ROLL's own log lines carry a logger prefix; other lines are not metrics.
    prefixed = "[2025-06-01 10:00:00,123] [INFO] [tracking.py:163] " + lines[0]
    assert parse_stdout_line(prefixed) == parse_stdout_line(lines[0])
    assert parse_stdout_line("epoch 1 done") is None
    with pytest.raises(ValueError):
        parse_stdout_line("metrics_tag: {not json")
    assert_no_secret([], out, err, log_text(caplog), repr(tracker))


# ---- jsonl -----------------------------------------------------------------------------------


def test_jsonl_writes_verls_file_format_and_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    (tracker,) = create_trackers("jsonl", {}, run_name="r", run_dir=tmp_path)
    assert tracker.path == tmp_path / "jsonl" / "metrics.jsonl"
    run_steps(tracker)
    raw = tracker.path.read_text(encoding="utf-8").splitlines()
    assert raw[0].startswith('{"step":1,"data":{"actor/pg_loss":')  # verl's compact orjson layout
    assert "NaN" not in tracker.path.read_text() and "\u2713" in raw[0]  # strict JSON, UTF-8
    rows = read_jsonl(tracker.path)
    assert [step for step, _ in rows] == list(STEPS)
    for step, data in rows:
        expected = {k: v for k, v in step_values(step).items() if v is not None}
        assert data.keys() == expected.keys()
        for key, value in expected.items():
            if isinstance(value, (bool, str)):
                assert data[key] == value and type(data[key]) is type(value), key
            elif math.isfinite(value):
                assert data[key] == value, key
            else:
                assert data[key] is None, key  # orjson's (and so verl's) NaN/inf
    out, err = capsys.readouterr()
    assert_no_secret([tmp_path], out, err, log_text(caplog), repr(tracker))


def test_jsonl_lines_match_verls_orjson_lines(tmp_path: Path) -> None:
    orjson = pytest.importorskip("orjson")
    (tracker,) = create_trackers("jsonl", {"log_dir": str(tmp_path)}, run_name="r", run_dir=None)
    assert tracker.path == tmp_path / "metrics.jsonl"
    run_steps(tracker)
    for step, line in zip(STEPS, tracker.path.read_bytes().splitlines()):
        # verl's FileLogger.log: orjson.dumps({"step": step, "data": data}, OPT_SERIALIZE_NUMPY)
        data = {k: v for k, v in step_values(step).items() if v is not None}
        verl = orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY)
        # Same layout, keys, order and values; the one spelling difference is a float exponent
        # (Python's 1e-06, orjson's 1e-6), which every JSON reader reads as the same number.
        assert list(json.loads(line)["data"].items()) == list(json.loads(verl)["data"].items())
        assert line.replace(b"e-06", b"e-6") == verl


def test_jsonl_appends_and_refuses_the_otlp_metrics_file(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    for step in (1, 2):
        (tracker,) = create_trackers("jsonl", {"path": str(path)}, run_name="r", run_dir=tmp_path)
        tracker.start()
        tracker.log({"a": step}, step)
        tracker.finish()
    assert read_jsonl(path) == [(1, {"a": 1}), (2, {"a": 2})]
    with pytest.raises(ValueError, match="OTLP metrics file"):
        create_trackers("jsonl", {"path": str(tmp_path / "metrics.jsonl")}, run_name="r", run_dir=tmp_path)
    with pytest.raises(ValueError, match="run_dir"):
        create_trackers("jsonl", {}, run_name="r", run_dir=None)


# ---- TensorBoard -----------------------------------------------------------------------------


@pytest.mark.parametrize("writer", ["tensorboardX", "torch"])
def test_tensorboard_scalars_and_text_read_back_with_event_accumulator(
    writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip(writer)
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    if writer == "torch":  # the fallback: hide tensorboardX from the tracker's check
        find_spec = importlib.util.find_spec
        hide = lambda name, *args: None if name == "tensorboardX" else find_spec(name, *args)  # noqa: E731
        monkeypatch.setattr(importlib.util, "find_spec", hide)
    (tracker,) = create_trackers("tensorboard", None, run_name="r", run_dir=tmp_path)
    assert tracker.log_dir == tmp_path / "tensorboard"
    run_steps(tracker)
    assert tracker._summary.__module__.startswith("tensorboardX" if writer == "tensorboardX" else "tensorboard.")

    acc = ea.EventAccumulator(str(tracker.log_dir), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    numeric = {step: numeric_expected(step) for step in STEPS}
    renamed = {"actor/pg_loss@sum": "actor/pg_loss_sum", "memory(GiB)": "memory_GiB_"}  # tensorboardX's rule
    assert set(acc.Tags()["scalars"]) == {renamed.get(k, k) for k in numeric[1]}
    for key in numeric[1]:
        events = acc.Scalars(renamed.get(key, key))
        assert [e.step for e in events] == list(STEPS), key
        for event in events:
            # Stored as 32-bit floats (simple_value), as both writers do.
            assert same(event.value, float(np.float32(numeric[event.step][key]))), (key, event.step)
    for key in text_expected(1):
        events = acc.Tensors(f"{key}/text_summary")
        assert [e.step for e in events] == list(STEPS)
        for event in events:
            text = tensor_util.make_ndarray(event.tensor_proto).item().decode()
            assert text == text_expected(event.step)[key]
    (hparams,) = acc.Tensors("hparams/text_summary")
    hparams_text = tensor_util.make_ndarray(hparams.tensor_proto).item().decode()
    assert '"api_key": "***"' in hparams_text and '"lr": 1e-06' in hparams_text
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    session = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert session.hparams["actor/lr"].number_value == 1e-6
    assert session.hparams["tracker_kwargs/api_key"].string_value == REDACTED
    out, err = capfd.readouterr()
    assert "NaN or Inf" not in out + err + log_text(caplog)  # no tensorboardX warning per value
    assert_no_secret([tmp_path], out, err, log_text(caplog), repr(tracker))


# ---- W&B -------------------------------------------------------------------------------------


def read_wandb_history(run_folder: Path) -> list[tuple[int, dict[str, Any]]]:
    """The history records of an offline run, as wandb's own transaction-log reader prints them."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_folder)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    history = []
    for line in out.stdout.splitlines():
        record = json.loads(line)
        if record["type"] == "history":
            history.append((record["history"]["step"].get("num", 0), record["history"]["item"]))
    return history


@pytest.fixture
def wandb_session() -> Iterator[None]:
    wandb = pytest.importorskip("wandb")
    yield
    wandb.teardown()  # the W&B service caches settings and environment per process


def test_wandb_offline_reads_back_with_wandbs_reader(
    tmp_path: Path,
    library_homes: Path,
    wandb_session: None,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # no mode in kwargs: W&B's variable decides
    run_dir = tmp_path / "run"
    (tracker,) = create_trackers(
        "wandb",
        {"api_key": SECRET, "project": "otel-rl", "notes": "n", "tags": ["t1"], "settings": {"api_key": SECRET}},
        run_name="grpo-1",
        run_dir=run_dir,
    )
    run_steps(tracker)

    (run_folder,) = (run_dir / "wandb").glob("offline-run-*")
    history = read_wandb_history(run_folder)
    assert [step for step, _ in history] == list(STEPS)
    decode = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    for step, item in history:
        for key, value in numeric_expected(step).items():
            got = item[key]
            assert same(float(decode.get(got, got)), value), (key, step, got)
        for key, value in text_expected(step).items():
            assert item[key] == value
        assert "critic/vpred" not in item  # None is left out
    out, err = capfd.readouterr()
    assert not (library_homes / ".netrc").exists()
    assert_no_secret([run_dir, library_homes], out, err, log_text(caplog), repr(tracker))


def test_wandb_errors_carry_no_key(tmp_path: Path, library_homes: Path, wandb_session: None, caplog: pytest.LogCaptureFixture) -> None:
    # W&B rejects a key with surrounding whitespace while validating its settings: the key is in
    # that frame's arguments, which pytest or an error reporter would print.
    (tracker,) = create_trackers("wandb", {"api_key": f" {SECRET} ", "mode": "online"}, run_name="r", run_dir=tmp_path / "run")
    with pytest.raises(TrackerError) as err:
        tracker.start()
    assert str(err.value).startswith("wandb tracker: wandb.init failed: wandb.errors")
    assert str(err.value).endswith("UsageError: API key cannot start or end with whitespace")
    assert_traceback_clean(err.value)
    assert_no_secret([library_homes], log_text(caplog))


@pytest.mark.slow
def test_wandb_online_key_is_never_persisted(
    tmp_path: Path, library_homes: Path, wandb_session: None, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Online against a closed port: W&B authenticates with the key and fails to connect. The
    # key must not be written anywhere on the way (wandb.login would write ~/.netrc).
    key = SECRET * 3  # W&B requires 40+ characters
    (tracker,) = create_trackers(
        "wandb",
        {"api_key": key, "mode": "online", "settings": {"base_url": "http://127.0.0.1:9", "init_timeout": 5}},
        run_name="r",
        run_dir=tmp_path / "run",
    )
    with pytest.raises(TrackerError) as err:  # W&B's "cannot connect", made key-safe
        tracker.start()
    assert "wandb.init failed" in str(err.value)
    assert_traceback_clean(err.value)
    out, err_text = capfd.readouterr()
    assert not (library_homes / ".netrc").exists()
    assert_no_secret([tmp_path / "run", library_homes], str(err.value), out, err_text, log_text(caplog))


# ---- SwanLab ---------------------------------------------------------------------------------


def read_swanlab_run(logdir: Path) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, str]]]:
    """Scalars and texts per step from SwanLab's own record log of an offline run."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (run_file,) = logdir.glob("run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(run_file)
    scalars: dict[int, dict[str, float]] = {}
    texts: dict[int, dict[str, str]] = {}
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        if record.HasField("scalar"):
            scalars.setdefault(record.scalar.step, {})[record.scalar.key] = record.scalar.value.number
        elif record.HasField("media"):
            (item,) = record.media.value.items
            text = (run_file.parent / "media" / "text" / item.filename).read_text(encoding="utf-8")
            texts.setdefault(record.media.step, {})[record.media.key] = text
    reader.close()
    return scalars, texts


def test_swanlab_offline_reads_back_with_swanlabs_reader(
    tmp_path: Path, library_homes: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("swanlab")
    run_dir = tmp_path / "run"
    (tracker,) = create_trackers(
        "swanlab",
        {"login_kwargs": {"api_key": SECRET}, "project": "otel-rl", "experiment_name": "grpo-1", "tags": ["roll", "rl"], "mode": "offline"},
        run_name="r",
        run_dir=run_dir,
    )
    assert tracker.logdir == run_dir / "swanlog"
    run_steps(tracker)

    scalars, texts = read_swanlab_run(tracker.logdir)
    assert sorted(scalars) == list(STEPS)
    for step in STEPS:
        expected = numeric_expected(step)
        assert scalars[step].keys() == expected.keys()
        for key, value in expected.items():
            assert same(scalars[step][key], value), (key, step)
        assert texts[step] == text_expected(step)
    out, err = capfd.readouterr()
    assert not (library_homes / ".swanlab" / ".netrc").exists()
    assert_no_secret([run_dir, library_homes], out, err, log_text(caplog), repr(tracker))


@pytest.mark.slow
def test_swanlab_online_login_keeps_the_key_in_memory(
    tmp_path: Path, library_homes: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("swanlab")
    (tracker,) = create_trackers(
        "swanlab",
        {"login_kwargs": {"api_key": SECRET, "host": "http://127.0.0.1:9"}, "mode": "cloud", "project": "p"},
        run_name="r",
        run_dir=tmp_path / "run",
    )
    with pytest.raises(TrackerError) as err:  # SwanLab's "cannot log in", made key-safe
        tracker.start()
    assert "swanlab login failed" in str(err.value)
    assert_traceback_clean(err.value)
    out, err_text = capfd.readouterr()
    assert_no_secret([library_homes], str(err.value), out, err_text, log_text(caplog))
    assert not list(library_homes.rglob(".netrc"))


# ---- MLflow ----------------------------------------------------------------------------------


def test_mlflow_metrics_and_params_read_back_with_mlflow_client(
    tmp_path: Path,
    library_homes: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    # Recorded so the variable the tracker sets for the file store is removed afterwards.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    run_dir = tmp_path / "run"
    (tracker,) = create_trackers("mlflow", {"experiment_name": "otel-rl"}, run_name="grpo-1", run_dir=run_dir)
    assert tracker.tracking_uri == (run_dir / "mlruns").as_uri()
    with caplog.at_level(logging.INFO, logger="otel_rl"):
        run_steps(tracker)
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"

    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("otel-rl").experiment_id])
    assert run.info.run_name == "grpo-1" and run.info.status == "FINISHED"
    renamed = {"actor/pg_loss@sum": "actor/pg_loss_at_sum", "memory(GiB)": "memory_GiB_"}
    assert set(run.data.metrics) == {renamed.get(k, k) for k in numeric_expected(1)}
    for key, value in numeric_expected(1).items():
        history = client.get_metric_history(run.info.run_id, renamed.get(key, key))
        assert sorted(m.step for m in history) == list(STEPS), key
        for metric in history:
            assert same(metric.value, numeric_expected(metric.step)[key]), (key, metric.step)
    assert run.data.params["tracker_kwargs/api_key"] == REDACTED
    assert run.data.params["actor/lr"] == "1e-06" and run.data.params["exp_name"] == "grpo-demo"
    messages = log_text(caplog)
    assert messages.count("'memory(GiB)' is logged as 'memory_GiB_'") == 1  # said once
    assert "'val/generation' is left out" in messages

    out, err = capfd.readouterr()
    assert_no_secret([run_dir, library_homes], out, err, messages, repr(tracker))


def test_mlflow_key_sanitizing_matches_verl_and_mlflows_rules() -> None:
    from otel_rl.trackers.mlflow import sanitize_key

    assert sanitize_key("val-core/acc/mean@4") == "val-core/acc/mean_at_4"
    assert sanitize_key("train_speed(s/it)") == "train_speed_s/it_"
    assert sanitize_key("a//b/") == "a/b"
    assert sanitize_key("/a/../b") == "a/__/b"
    assert sanitize_key("time/actor_train/train_step/total") == "time/actor_train/train_step/total"
