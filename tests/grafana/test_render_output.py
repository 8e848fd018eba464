"""Where ``otel-rl dashboards render`` writes its PNGs: under the given run folder, else a new
temporary folder; never the checkout's committed ``docs/dashboards`` unless ``--out`` names it.
The render runs against a real VictoriaMetrics on 127.0.0.1 (the stack's package)."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_rl.cli import main
from otel_rl.cli.dashboards import render_out_dir
from otel_rl.codegen.generate import prometheus_name
from otel_rl.semconv import METRICS
from otel_rl.semconv import metrics as M
from otel_rl.stack import Stack, free_port_offset
from otel_rl.testing import capture

REPO = Path(__file__).resolve().parents[2]


def test_the_default_output_is_the_run_folder_or_a_new_temporary_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert render_out_dir("docs/dashboards", None, None) == Path("docs/dashboards")  # asked for explicitly
    assert render_out_dir(None, "runs/a", "x") == Path("runs/a/dashboards")
    (tmp_path / "otel-rl-runs" / "rid-1").mkdir(parents=True)
    assert render_out_dir(None, None, "rid-1") == Path("otel-rl-runs/rid-1/dashboards")
    fresh = render_out_dir(None, None, "not-here")
    try:
        assert fresh.is_dir() and not list(fresh.iterdir()) and not fresh.resolve().is_relative_to(tmp_path)
    finally:
        fresh.rmdir()


@pytest.fixture
def victoria_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    stack = Stack(tmp_path_factory.mktemp("vm"), port_offset=free_port_offset(), only=["victoria-metrics"], out=None)
    try:
        stack.up()
        yield stack.endpoints["victoria_metrics"]
    finally:
        stack.down()


def _import_run(vm: str, service: str, run_id: str) -> None:
    """Five step-duration exports of one run, 10 s apart, ending a minute ago (Prometheus text import)."""
    step = METRICS[M.RL_STEP_DURATION]
    name = prometheus_name(step.name, step.unit, step.instrument) + "_count"
    end_ms = int(time.time() * 1000) - 60_000
    body = "".join(f'{name}{{service_name="{service}",rl_run_id="{run_id}"}} {i + 1} {end_ms - (4 - i) * 10_000}\n' for i in range(5))
    urllib.request.urlopen(urllib.request.Request(f"{vm}/api/v1/import/prometheus", data=body.encode()), timeout=10).read()
    query = urllib.parse.urlencode({"query": f'count(count_over_time({name}{{rl_run_id="{run_id}"}}[1h]))'})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # VictoriaMetrics makes new series searchable after a few seconds
        with urllib.request.urlopen(f"{vm}/api/v1/query?{query}", timeout=10) as response:
            if json.load(response)["data"]["result"]:
                return
        time.sleep(0.5)
    pytest.fail(f"run {run_id} not searchable in VictoriaMetrics after 60 s")


@pytest.mark.e2e
def test_render_writes_under_the_run_or_a_temporary_folder_never_docs(
    victoria_metrics: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    with capture(run, service_name="render-out"):
        pass
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    _import_run(victoria_metrics, "render-out", run_id)
    _import_run(victoria_metrics, "render-other", "other-run")  # reported last: the run folder must pick its own
    monkeypatch.chdir(tmp_path)  # the old default, docs/dashboards, would land here
    board = ["--board", "e2e-timeline", "--repo", str(REPO)]

    assert main(["dashboards", "render", str(run), "--vm", victoria_metrics, *board]) == 0
    out = capsys.readouterr().out
    assert (run / "dashboards" / "e2e-timeline.png").stat().st_size > 0
    assert f"the boards of run {run_id} are in {run / 'dashboards'}" in out

    assert main(["dashboards", "render", "--vm", victoria_metrics, *board]) == 0
    out = capsys.readouterr().out
    where = Path(out.rsplit(" are in ", 1)[1].strip())
    try:
        assert "the boards of run other-run" in out
        assert (where / "e2e-timeline.png").is_file() and not where.resolve().is_relative_to(tmp_path)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert not (tmp_path / "docs").exists()
