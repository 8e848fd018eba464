"""The Grafana boards against a real run: after the demo went through the real collectors (agent ->
gateway) into VictoriaMetrics (the gateway's prometheus_remote_write exporter) and Prometheus (which
scrapes the gateway's prometheus exporter), every panel query returns data for that run from both,
except exactly the GPU-only ones and the agent-loop ones (the demo records no trajectories;
test_trajectories_e2e.py checks those on a run that does); the boards render to PNGs from it. The metric names are the
collector's own translation, so a name the boards expect and the collector writes otherwise fails here."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from stack_support import DemoRun, poll

import otel_rl.ops.dashboards as D
import otel_rl.ops.grafana_render as R
from otel_rl.codegen.generate import prometheus_name
from otel_rl.codegen.registry import load_registry
from otel_rl.ops.promql import label
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

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


def agent_loop_only(targets: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> set[str]:
    metrics = D.Metrics(load_registry(REPO_ROOT / "semconv"))
    return {key(t) for t in targets if D.uses_agent_loop_metric(t[2]["expr"], metrics)}


def empty_on_the_demo(targets: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> set[str]:
    """The queries a CPU demo run cannot answer: the GPU-only ones and the agent-loop ones."""
    return gpu_only(targets) | agent_loop_only(targets)


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


def gateway_failures(gateway_telemetry_url: str) -> dict[str, float]:
    """The gateway's own count of metric points its exporters failed to send, per exporter (its :8888-style page)."""
    with urllib.request.urlopen(f"{gateway_telemetry_url}/metrics", timeout=10) as response:  # noqa: S310 - loopback test server
        lines = response.read().decode("utf-8").splitlines()
    name = "otelcol_exporter_send_failed_metric_points"
    return {line.split('exporter="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{")}


_SETTLED: dict[str, tuple[R.RunWindow, set[str]]] = {}


def settled(stack: Any, demo_run: DemoRun) -> tuple[R.RunWindow, set[str]]:
    """The run's window once VictoriaMetrics shows all of it, and the queries still without data then.

    Series that first appear in the run's last export (validation, checkpoint) become searchable
    about 10 s after the samples of older series: ask again, with the window read again, until
    only the GPU and agent-loop queries are empty or the deadline passes.
    """
    if demo_run.run_id not in _SETTLED:
        api = R.QueryAPI(stack.endpoints["victoria_metrics"])
        targets = board_targets()
        expected = empty_on_the_demo(targets)

        def attempt() -> tuple[R.RunWindow, set[str]]:
            window = run_window(api, demo_run)
            return window, targets_without_data(api, window, targets)

        _SETTLED[demo_run.run_id] = poll(attempt, lambda got: got[1] <= expected, 60, "data for every non-GPU, non-agent-loop panel query")
    return _SETTLED[demo_run.run_id]


def test_every_panel_query_returns_data_from_victoria_metrics_behind_the_remote_write_exporter(stack, demo_run: DemoRun) -> None:
    targets = board_targets()
    expected_empty = empty_on_the_demo(targets)
    assert 8 <= len(gpu_only(targets)) < len(targets) // 4 and 8 <= len(agent_loop_only(targets)) < len(targets) // 4
    _, empty = settled(stack, demo_run)
    assert empty == expected_empty, (
        f"queries without data: {sorted(empty - expected_empty)}; "
        f"GPU-only or agent-loop queries with data on a CPU demo run: {sorted(expected_empty - empty)}"
    )


def scraped_window(prometheus: R.QueryAPI, window: R.RunWindow, steps: int) -> R.RunWindow:
    """The run's window as Prometheus holds it, once it holds the run's last step. A scraped sample
    carries the scrape's time, which trails the data point's own time (what remote write stores) by
    the agent's and the gateway's batching and the scrape interval: the window starts at the run's
    first scraped sample and ends at the first scrape whose step count is the run's last step (the
    event the panel queries need, waited for instead of a fixed time on a busy machine)."""
    mdef = METRICS[M.RL_STEP_DURATION]
    selector = f'{prometheus_name(mdef.name, mdef.unit, mdef.instrument)}_count{{{label(A.RL_RUN_ID)}="{window.run}"}}'

    def scraped() -> tuple[float, float]:
        """(first sample's time, time of the first sample that counts every step; 0 while none does)."""
        samples = sorted((float(t), float(v)) for s in prometheus.query(f"{selector}[1h]", time.time()) for t, v in s["values"])
        return samples[0][0], next((t for t, v in samples if v >= steps), 0.0)

    first, last = poll(scraped, lambda got: got[1] > 0, 300, f"the scrape of {selector} that counts all {steps} steps")
    lag = first - window.first
    assert 0 <= lag < 10, f"Prometheus' first sample of the run is {lag:.1f} s after the data point's time"
    return dataclasses.replace(window, first=first, last=max(last, window.last + lag))


def test_prometheus_parses_and_answers_every_panel_query_from_the_scraped_gateway(stack, demo_run: DemoRun) -> None:
    """The Docker stack's Grafana reads Prometheus: its PromQL must accept and answer every query, here
    on what Prometheus scraped from the gateway's prometheus exporter (its own metric names)."""
    prometheus = R.QueryAPI(stack.endpoints["prometheus"])
    vm_window, _ = settled(stack, demo_run)
    window = scraped_window(prometheus, vm_window, demo_run.steps)
    targets = board_targets()
    # Prometheus holds the scrape of the last step: every panel's data is there, no waiting on a clock.
    empty = targets_without_data(prometheus, window, targets)
    assert empty == empty_on_the_demo(targets), f"without data in Prometheus: {sorted(empty - empty_on_the_demo(targets))}"
    # The gateway's remote write delivered every point (a rejected sample shows in its own counters).
    telemetry = f"http://127.0.0.1:{stack.ports('otelcol-gateway')['telemetry']}"
    failed = gateway_failures(telemetry)
    assert not any(failed.values()), failed
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


def test_both_stores_take_a_range_step_of_a_fraction_of_a_second(stack, demo_run: DemoRun) -> None:
    """A run's window gives a step rounded to the millisecond (RunWindow.span), e.g. 1.007 s:
    Prometheus refused it written as a duration ("1.007s")."""
    end = time.time()
    for store in ("prometheus", "victoria_metrics"):
        answer = R.QueryAPI(stack.endpoints[store]).query_range("vector(1)", end - 60, end, 1.007)
        assert answer and len(answer[0]["values"]) >= 50, (store, answer)


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
        empty_on_a_cpu_demo = {
            p["title"]
            for p in boards[result.slug]["panels"]
            if p["type"] != "row"
            and any(D.uses_gpu_only_metric(t["expr"], metrics) or D.uses_agent_loop_metric(t["expr"], metrics) for t in p["targets"])
        }
        assert set(result.empty_panels) == empty_on_a_cpu_demo, result.slug
        assert not any(data.errors for data in result.panels.values()), result.slug


def test_every_metric_the_alert_rules_read_is_stored_under_the_collectors_name(stack, demo_run: DemoRun) -> None:
    """The rule expressions only return a result when a run misbehaves, so what is checked against the
    healthy demo run is what they read: every series name in every rule has data for the run in
    VictoriaMetrics, behind the real prometheus_remote_write exporter, except the metrics a CPU demo run
    cannot have (GPU-only), the agent-loop ones and those the demo does not emit (listed, with why, in NOT_ON_A_BOARD)."""
    import yaml
    from promql_names import promql_metric_names

    from otel_rl.ops.dashboard_boards import NOT_IN_DEMO, NOT_ON_A_BOARD
    from otel_rl.ops.dashboard_model import AGENT_LOOP_METRICS, GPU_ONLY_METRICS

    metrics = D.Metrics(load_registry(REPO_ROOT / "semconv"))
    absent = {m for m, why in NOT_ON_A_BOARD.items() if why.startswith(NOT_IN_DEMO)} | set(GPU_ONLY_METRICS) | set(AGENT_LOOP_METRICS)
    rules = yaml.safe_load((REPO_ROOT / "grafana" / "alerts" / "otel-rl.rules.yml").read_text())
    read = {name: rule["alert"] for group in rules["groups"] for rule in group["rules"] for name in promql_metric_names(rule["expr"])}
    assert read and all(name in metrics.by_series for name in read), sorted(n for n in read if n not in metrics.by_series)
    expected = {name for name in read if metrics.by_series[name] not in absent}
    assert len(expected) >= 8, sorted(expected)
    settled(stack, demo_run)  # the run's series are searchable by now
    url = f"{stack.endpoints['victoria_metrics']}/api/v1/series"
    missing = []
    for name in sorted(expected):
        query = urllib.parse.urlencode([("match[]", f'{name}{{{label(A.RL_RUN_ID)}="{demo_run.run_id}"}}'), ("start", "0")])
        with urllib.request.urlopen(f"{url}?{query}", timeout=10) as response:  # noqa: S310 - loopback test server
            if not json.loads(response.read())["data"]:
                missing.append(f"{name} (rule {read[name]})")
    assert not missing, f"series the alert rules read that the collector did not store for the run: {missing}"
