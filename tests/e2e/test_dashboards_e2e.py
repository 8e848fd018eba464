"""The Grafana boards against a real run: after the demo went through rotel into VictoriaMetrics (and
through vmagent into Prometheus), every panel query returns data for that run, except exactly the
GPU-only ones; Prometheus parses and answers every query; the boards render to PNGs from it."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from stack_support import DemoRun, poll

import otel_rl.ops.dashboards as D
import otel_rl.ops.grafana_render as R
from otel_rl.codegen.registry import load_registry

# One demo run is enough (the gRPC one, shared with the other e2e tests of the session).
pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("demo_run", ["grpc"], indirect=True)]

REPO_ROOT = Path(__file__).resolve().parents[2]


def board_targets() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    out = []
    for rel, text in D.generate(REPO_ROOT).items():
        for panel, target in D.dashboard_targets(json.loads(text)):
            out.append((rel.stem, panel, target))
    return out


def gpu_only(targets: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> set[str]:
    metrics = D.Metrics(load_registry(REPO_ROOT / "semconv"))
    return {key(t) for t in targets if D.uses_gpu_only_metric(t[2]["expr"], metrics)}


def key(item: tuple[str, dict[str, Any], dict[str, Any]]) -> str:
    slug, panel, target = item
    return f"{slug} / {panel['title']} / {target['refId']}"


def run_window(api: R.QueryAPI, demo_run: DemoRun) -> R.RunWindow:
    def found() -> R.RunWindow:
        return R.find_run(api, service=demo_run.service, run=demo_run.run_id)

    return poll(found, lambda w: w.last > w.first, 60, f"run {demo_run.run_id}'s step durations in {api.base_url}")


def targets_without_data(api: R.QueryAPI, window: R.RunWindow, targets: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> set[str]:
    values = window.values()
    start, end, step = window.span()
    empty = set()
    for item in targets:
        expr = D.substitute(item[2]["expr"], values)
        if item[2].get("instant"):
            result = api.query(expr, end)
        else:
            result = api.query_range(expr, start, end, step)
        if not any(R.to_series(r, "").has_data for r in result):
            empty.add(key(item))
    return empty


def remote_write_drops(vmagent_url: str) -> dict[str, float]:
    """vmagent's count of blocks a remote-write target rejected, per target (its /metrics page)."""
    with urllib.request.urlopen(f"{vmagent_url}/metrics", timeout=10) as response:  # noqa: S310 - loopback test server
        lines = response.read().decode("utf-8").splitlines()
    name = "vmagent_remotewrite_packets_dropped_total{"
    return {line[len(name) :].rsplit("}", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name)}


_SETTLED: dict[str, tuple[R.RunWindow, set[str]]] = {}


def settled(stack: Any, demo_run: DemoRun) -> tuple[R.RunWindow, set[str]]:
    """The run's window once VictoriaMetrics shows all of it, and the queries still without data then.

    Series that first appear in the run's last export (validation, checkpoint) become searchable
    about 10 s after the samples of older series: ask again, with the window read again, until
    only the GPU queries are empty or the deadline passes.
    """
    if demo_run.run_id not in _SETTLED:
        api = R.QueryAPI(stack.endpoints["victoria_metrics"])
        targets = board_targets()
        expected = gpu_only(targets)

        def attempt() -> tuple[R.RunWindow, set[str]]:
            window = run_window(api, demo_run)
            return window, targets_without_data(api, window, targets)

        _SETTLED[demo_run.run_id] = poll(attempt, lambda got: got[1] <= expected, 60, "data for every non-GPU panel query")
    return _SETTLED[demo_run.run_id]


def test_every_panel_query_returns_data_from_victoria_metrics(stack, demo_run: DemoRun) -> None:
    targets = board_targets()
    expected_empty = gpu_only(targets)
    assert 8 <= len(expected_empty) < len(targets) // 4
    _, empty = settled(stack, demo_run)
    assert empty == expected_empty, (
        f"queries without data: {sorted(empty - expected_empty)}; GPU-only queries with data on a CPU run: {sorted(expected_empty - empty)}"
    )


def test_prometheus_parses_and_answers_every_panel_query(stack, demo_run: DemoRun) -> None:
    """The Docker stack's Grafana reads Prometheus: its PromQL must accept and answer every query."""
    prometheus = R.QueryAPI(stack.endpoints["prometheus"])
    window, _ = settled(stack, demo_run)
    targets = board_targets()
    empty = poll(
        lambda: targets_without_data(prometheus, window, targets),
        lambda e: e <= gpu_only(targets),
        60,
        "data for every non-GPU panel query in Prometheus",
    )
    assert empty == gpu_only(targets)
    # vmagent delivered every block to both stores: Prometheus rejects a block with any sample out
    # of order (vmagent's queues run in parallel) unless the stack gives it an out-of-order window.
    dropped = remote_write_drops(stack.endpoints["vmagent"])
    assert len(dropped) == 2 and not any(dropped.values()), dropped
    # The same path rejects what Prometheus cannot parse (a query error, not an empty answer).
    with pytest.raises(R.QueryError, match="parse error"):
        prometheus.query(D.substitute(targets[0][2]["expr"], window.values()) + ")", window.last)
    variables = next(iter(json.loads(t) for t in D.generate(REPO_ROOT).values()))["templating"]["list"]
    for variable in variables:  # the variables' label_values(selector, label) on Prometheus' label API
        if variable["type"] != "query":
            continue
        selector, label = variable["query"].removeprefix("label_values(").removesuffix(")").rsplit(",", 1)
        selector = D.substitute(selector, D.template_values(service=window.service, run=window.run))
        url = f"{stack.endpoints['prometheus']}/api/v1/label/{label.strip()}/values?" + urllib.parse.urlencode(
            {"match[]": selector, "start": f"{window.first - 60:.0f}"}
        )
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback test server
            answer = json.loads(response.read())
        assert answer["status"] == "success", (variable["name"], answer)
        if variable["name"] in ("service", "run", "cluster", "rank"):
            assert answer["data"], f"variable {variable['name']} has no values for the run"
        if variable["name"] == "run":
            assert window.run in answer["data"]


def test_the_boards_render_from_the_run(stack, demo_run: DemoRun, tmp_path: Path) -> None:
    from PIL import Image

    api = R.QueryAPI(stack.endpoints["victoria_metrics"])
    window, _ = settled(stack, demo_run)
    results = R.render(api, window, tmp_path, repo_root=REPO_ROOT)
    boards = {rel.stem: json.loads(text) for rel, text in D.generate(REPO_ROOT).items()}
    assert {r.slug for r in results} == set(boards)
    metrics = D.Metrics(load_registry(REPO_ROOT / "semconv"))
    for result in results:
        assert result.path.is_file() and result.size == result.path.stat().st_size < R.PNG_LIMIT_BYTES, result.path
        with Image.open(result.path) as image:
            assert image.format == "PNG" and image.width >= 1000 and image.height >= 600
        gpu_panels = {
            p["title"]
            for p in boards[result.slug]["panels"]
            if p["type"] != "row" and any(D.uses_gpu_only_metric(t["expr"], metrics) for t in p["targets"])
        }
        assert set(result.empty_panels) == gpu_panels, result.slug
        assert not any(data.errors for data in result.panels.values()), result.slug
