"""Telemetry's lifecycle with several instances in a process: exit hooks, calls after shutdown,
counter names outside the registry, and a second ``otel_rl.init()``."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import otel_rl
from otel_rl._sdk.settings.config import resolve_config
from otel_rl.runs.folder import read_log_records
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

OPTIONS = {"console": False, "service_name": "otel-rl-test"}


def _log_events(run_dir: Path) -> list[dict]:
    return [r for r in read_log_records(run_dir) if r["event_name"] == N.RL_LOG_EVENT]


def test_shutting_one_telemetry_down_keeps_the_exit_hook_of_another(tmp_path: Path) -> None:
    # Two live instances (a driver and a worker in one process): each must still be shut down,
    # and so flushed, when the interpreter exits, whichever was shut down by hand before.
    script = textwrap.dedent("""
        import atexit, json, sys
        import otel_rl
        from otel_rl._sdk.settings.config import resolve_config

        first = otel_rl.Telemetry(resolve_config({"run_dir": sys.argv[1], "console": False}))
        second = otel_rl.Telemetry(resolve_config({"run_dir": sys.argv[2], "console": False}))
        second.log({"actor/pg_loss": 0.5}, step=1)
        first.shutdown()
        atexit._run_exitfuncs()  # what the interpreter runs at exit
        print(json.dumps({"second_closed": second.closed}))
    """)
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    done = subprocess.run([sys.executable, "-c", script, str(first_dir), str(second_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"second_closed": True}
    assert [e["body"] for e in _log_events(second_dir)] == [{"actor/pg_loss": 0.5}]


def test_add_to_a_name_outside_the_registry_is_reported_once_and_ignored(make_telemetry, caplog) -> None:
    tel = make_telemetry()
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.add("rl.no_such_counter", 2.0)
        tel.add("rl.no_such_counter", 3.0)
        tel.add(M.RL_TENSOR_NONFINITE, 1.0)
        tel.flush()
    said = [r.getMessage() for r in caplog.records if "rl.no_such_counter" in r.getMessage()]
    assert len(said) == 1 and "is not a registry metric; ignored" in said[0]
    assert tel.latest("rl.no_such_counter") is None
    assert tel.latest(M.RL_TENSOR_NONFINITE) == 1.0


def test_add_to_a_name_outside_the_registry_raises_in_strict_mode(make_telemetry) -> None:
    tel = make_telemetry(strict=True)
    with pytest.raises(ValueError, match="rl.no_such_counter"):
        tel.add("rl.no_such_counter")
    tel.add(M.RL_TENSOR_NONFINITE)  # a registry counter still works


def test_every_call_after_shutdown_is_counted_as_dropped(make_telemetry) -> None:
    tel = make_telemetry()
    tel.shutdown()
    tel.log({"actor/pg_loss": 1.0}, step=0)
    tel.record(M.RL_SAMPLE_REWARD, [1.0])
    tel.event(N.RL_HPARAMS_EVENT, {"lr": 1e-6})
    tel.log_hparams({"lr": 1e-6})
    tel.add(M.RL_TENSOR_NONFINITE)
    tel.trace_finished_step(0, [("generate", 1.0)])
    assert tel.dropped_calls == 6


def test_a_second_init_shuts_the_first_down_and_says_so_naming_both_folders(tmp_path: Path, caplog) -> None:
    first = otel_rl.init(run_dir=str(tmp_path / "first"), **OPTIONS)
    try:
        first.log({"actor/pg_loss": 0.25}, step=0)  # still queued when the second init() comes
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            second = otel_rl.init(run_dir=str(tmp_path / "second"), **OPTIONS)
        assert first.closed and not second.closed
        assert otel_rl.get_telemetry() is second
        said = [r.getMessage() for r in caplog.records if "replac" in r.getMessage()]
        assert len(said) == 1
        assert str(tmp_path / "first") in said[0] and str(tmp_path / "second") in said[0]
        # the first was flushed, not cut off
        assert [e["body"] for e in _log_events(tmp_path / "first")] == [{"actor/pg_loss": 0.25}]
        second.log({"actor/pg_loss": 0.5}, step=1)
        second.shutdown()
        assert [e["body"] for e in _log_events(tmp_path / "second")] == [{"actor/pg_loss": 0.5}]
        assert first.dropped_calls == 0
    finally:
        otel_rl.shutdown()
        first.shutdown()


def test_a_second_init_that_fails_leaves_the_first_running(tmp_path: Path, caplog) -> None:
    first = otel_rl.init(run_dir=str(tmp_path / "first"), **OPTIONS)
    try:
        with pytest.raises(ValueError, match="unknown tracker"):
            otel_rl.init(run_dir=str(tmp_path / "second"), track_with="no_such_tracker", **OPTIONS)
        assert not first.closed and otel_rl.get_telemetry() is first
        assert not [r for r in caplog.records if "replac" in r.getMessage()]
    finally:
        first.shutdown()


def test_an_init_after_the_first_was_shut_down_says_nothing(tmp_path: Path, caplog) -> None:
    first = otel_rl.init(run_dir=str(tmp_path / "first"), **OPTIONS)
    first.shutdown()
    second = otel_rl.init(run_dir=str(tmp_path / "second"), **OPTIONS)
    try:
        assert not [r for r in caplog.records if "replac" in r.getMessage()]
        assert not second.closed
    finally:
        second.shutdown()


def test_a_telemetry_made_directly_is_not_replaced_by_init(tmp_path: Path) -> None:
    # Only init()'s own telemetry is the process's one; instances built directly (several ranks
    # simulated in one test process) are left to their owners.
    worker = otel_rl.Telemetry(resolve_config({"run_dir": str(tmp_path / "worker"), **OPTIONS}))
    driver = otel_rl.init(run_dir=str(tmp_path / "driver"), **OPTIONS)
    try:
        assert not worker.closed and not driver.closed
    finally:
        driver.shutdown()
        worker.shutdown()
