"""The Grafana dashboards: generated from the registry, type-checked against Grafana's own schema,
every query parsed by Prometheus' parser, every metric and label a registry one, units, trace links."""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_checks import GRAFANA_12_SCHEMA_VERSION, GRAFANA_SCHEMA_VERSION, REPO_ROOT, find_promtool, promtool_parse, typecheck
from promql_names import promql_metric_names  # a second, independent name reader

import otel_rl.ops.dashboards as D
from otel_rl.cli import dashboards as dashboards_cli
from otel_rl.codegen.generate import prometheus_name
from otel_rl.codegen.registry import load_registry
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

DASHBOARDS = REPO_ROOT / "grafana" / "dashboards"
DATASOURCES = REPO_ROOT / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
COMPOSE = REPO_ROOT / "deploy" / "docker-compose.yml"
SEED_BOARDS = {"e2e-timeline", "rank-heatmap", "memory-timeline", "training-stability"}  # seed 002 section 5
MORE_BOARDS = {"data-quality", "rollout", "algorithm", "system"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}


@pytest.fixture(scope="module")
def registry() -> Any:
    return load_registry(REPO_ROOT / "semconv")


@pytest.fixture(scope="module")
def metrics(registry: Any) -> D.Metrics:
    return D.Metrics(registry)


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    """The committed boards, as Grafana reads them."""
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def all_targets(boards: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(slug, panel, target) for slug, board in boards.items() for panel, target in D.dashboard_targets(board)]


def registry_series() -> set[str]:
    """Every Prometheus series name the registry's metrics produce (histograms: only _bucket/_sum/_count)."""
    names = set()
    for metric in METRICS.values():
        base = prometheus_name(metric.name, metric.unit, metric.instrument)
        names |= {base + s for s in D.HISTOGRAM_SUFFIXES} if metric.instrument == "histogram" else {base}
    return names


# --------------------------------------------------------------------------------------------
# Generated, complete, registry-only


def test_committed_boards_are_what_the_registry_generates() -> None:
    assert D.check(REPO_ROOT) == [], "run `otel-rl dashboards generate`"


def test_the_seed_boards_and_the_others_exist(boards: dict[str, dict[str, Any]]) -> None:
    assert set(boards) == SEED_BOARDS | MORE_BOARDS
    uids = [b["uid"] for b in boards.values()]
    titles = [b["title"] for b in boards.values()]
    assert len(set(uids)) == len(uids) and len(set(titles)) == len(titles)
    assert all(len(uid) <= 40 for uid in uids), "Grafana uids are at most 40 characters"
    for slug, board in boards.items():
        assert board["uid"] == f"otel-rl-{slug}" and D.TAG in board["tags"]
        assert len(panels(board)) >= 5, slug
        titles = [p["title"] for p in board["panels"]]
        assert len(titles) == len(set(titles)), f"{slug}: panel titles repeat"


def test_every_query_names_only_registry_series(boards: dict[str, dict[str, Any]]) -> None:
    allowed = registry_series()
    targets = all_targets(boards)
    assert len(targets) > 80
    for slug, panel, target in targets:
        by_tokens = set(D.promql_metric_names(target["expr"]))
        by_regex = promql_metric_names(target["expr"])
        assert by_tokens == by_regex, (slug, panel["title"], target["expr"])
        assert by_tokens, f"{slug} / {panel['title']}: no metric in {target['expr']}"
        unknown = by_tokens - allowed
        assert not unknown, f"{slug} / {panel['title']}: {sorted(unknown)} are not registry series"


@pytest.mark.parametrize(
    "expr, names",
    [
        (
            'histogram_quantile(0.95, sum by (le, rl_stage) (rate(rl_stage_duration_seconds_bucket{rl_run_id="$run"}[$__rate_interval])))',
            ["rl_stage_duration_seconds_bucket"],
        ),
        ('sum(rate(a_sum{x="y"}[5m])) / scalar(sum(rate(b_count[1m])))', ["a_sum", "b_count"]),
        ('max by (rl_statistic) (rl_reward_ratio{rl_statistic=~"mean|max"}) offset 5m', ["rl_reward_ratio"]),
        ("avg without (rl_rank) (x) and on(rl_run_id) group_left y", ["x", "y"]),
        ('sum by (le) (increase(h_bucket{le!="+Inf", a=~"by|sum"}[$__range]))', ["h_bucket"]),
        ("1 - x / 2e3", ["x"]),
    ],
)
def test_metric_name_readers_agree_on_examples(expr: str, names: list[str]) -> None:
    assert D.promql_metric_names(expr) == names
    assert promql_metric_names(expr) == set(names)


def test_an_unknown_metric_fails_generation(metrics: D.Metrics) -> None:
    with pytest.raises(ValueError, match="not a registry metric"):
        metrics.used_in('max(rl_made_up_ratio{rl_run_id="$run"})')
    with pytest.raises(KeyError):
        metrics.prom("rl.made.up")
    with pytest.raises(ValueError, match="histogram"):
        metrics.prom(M.RL_STAGE_DURATION)  # a histogram is only its _bucket / _sum / _count series


def test_every_registry_metric_is_on_a_board_or_excluded_with_a_reason(boards: dict[str, dict[str, Any]], metrics: D.Metrics) -> None:
    on_boards = {name for _, _, t in all_targets(boards) for name in metrics.used_in(t["expr"])}
    excluded = set(D.NOT_ON_A_BOARD)
    assert excluded <= set(METRICS), sorted(excluded - set(METRICS))
    assert not on_boards & excluded, sorted(on_boards & excluded)
    missing = set(METRICS) - on_boards - excluded
    assert not missing, f"registry metrics on no board (place them or add them to NOT_ON_A_BOARD): {sorted(missing)}"
    assert all(reason.strip() for reason in D.NOT_ON_A_BOARD.values())
    assert D.GPU_ONLY_METRICS <= on_boards


def test_every_label_is_a_registry_attribute(boards: dict[str, dict[str, Any]]) -> None:
    attributes = {v for k, v in vars(A).items() if k.isupper() and isinstance(v, str)}
    labels = {D.label(a) for a in attributes} | {"le"}
    for slug, panel, target in all_targets(boards):
        expr = target["expr"]
        used = set(re.findall(r'(\w+)\s*(?:=~|!~|!=|=)\s*"', expr))
        for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
            used |= {x.strip() for x in group.split(",") if x.strip()}
        used |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target["legendFormat"]))
        assert used <= labels, f"{slug} / {panel['title']}: {sorted(used - labels)} are not registry attribute labels"
    for variable in next(iter(boards.values()))["templating"]["list"]:
        if variable["type"] == "query":
            label = re.search(r",\s*(\w+)\)$", variable["query"]).group(1)
            assert label in labels, variable


def test_stage_groups_cover_every_registry_stage_once() -> None:
    grouped = [_v for _, stages in D.STAGE_GROUPS for _v in stages]
    assert len(grouped) == len(set(grouped))
    assert set(grouped) == set(A.RlStageValues)


# --------------------------------------------------------------------------------------------
# Units, descriptions, layout


@pytest.mark.parametrize(
    "unit, fraction, grafana",
    [
        ("s", False, "s"),
        ("By", False, "bytes"),
        ("W", False, "watt"),
        ("Cel", False, "celsius"),
        ("{token}", False, "count:tokens"),
        ("{token}/s", False, "count:tokens/s"),
        ("{sample}/s", False, "count:samples/s"),
        ("1", False, "none"),
        ("1", True, "percentunit"),
        ("{rank}", False, "none"),
        ("s/{token}", False, "s"),
        ("{version}", False, "count:versions"),
    ],
)
def test_registry_units_map_to_grafana_units(unit: str, fraction: bool, grafana: str) -> None:
    assert D.grafana_unit(unit, fraction=fraction) == grafana


def test_every_panel_has_a_unit_and_the_registry_briefs_as_description(boards: dict[str, dict[str, Any]], metrics: D.Metrics) -> None:
    known = {"s", "bytes", "watt", "celsius", "none", "percentunit"}
    for slug, board in boards.items():
        for panel in panels(board):
            unit = panel["fieldConfig"]["defaults"].get("unit")
            assert unit in known or unit.startswith("count:"), f"{slug} / {panel['title']}: unit {unit!r}"
            used: list[str] = []
            for target in panel["targets"]:
                used += [n for n in metrics.used_in(target["expr"]) if n not in used]
            briefs = " ".join(metrics.brief(n) for n in used)
            assert panel["description"].startswith(briefs), f"{slug} / {panel['title']}"


_PLAIN = re.compile(r"^(?:max|min|avg|sum)(?: by \([^)]*\) )?\((\w+)\{[^}]*\}\)$")


def test_panels_of_plain_gauges_carry_their_metrics_registry_unit(boards: dict[str, dict[str, Any]], metrics: D.Metrics) -> None:
    checked = 0
    for slug, board in boards.items():
        for panel in panels(board):
            overrides = {
                o["matcher"]["options"]: p["value"] for o in panel["fieldConfig"]["overrides"] for p in o["properties"] if p["id"] == "unit"
            }
            for target in panel["targets"]:
                # A plain gauge, or one statistic per part joined with `or` (max of maxima, ...).
                plain = all(_PLAIN.match(part) for part in target["expr"].split(" or "))
                if not plain or panel["type"] == "heatmap":
                    continue
                (metric,) = metrics.used_in(target["expr"])
                unit = overrides.get(target["refId"], panel["fieldConfig"]["defaults"]["unit"])
                assert unit == metrics.unit(metric), f"{slug} / {panel['title']} / {target['refId']}: {unit} != {metrics.unit(metric)}"
                checked += 1
    assert checked > 40


def test_layout_fits_the_grid_without_overlaps(boards: dict[str, dict[str, Any]]) -> None:
    for slug, board in boards.items():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), slug
        cells: set[tuple[int, int]] = set()
        for panel in board["panels"]:
            g = panel["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, (slug, panel["title"])
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not mine & cells, f"{slug}: {panel['title']} overlaps another panel"
            cells |= mine


def test_gpu_only_panels_are_marked_and_never_mix_with_cpu_metrics(boards: dict[str, dict[str, Any]], metrics: D.Metrics) -> None:
    gpu_panels = 0
    for slug, panel, target in all_targets(boards):
        used = set(metrics.used_in(target["expr"]))
        if used & D.GPU_ONLY_METRICS:
            assert used <= D.GPU_ONLY_METRICS, f"{slug} / {panel['title']}: mixes GPU-only and other metrics"
            assert "GPU only" in panel["description"], f"{slug} / {panel['title']}"
            gpu_panels += 1
    assert gpu_panels >= 10


def test_the_e2e_board_shows_rollout_latency_by_trajectory_turn_and_tool(boards: dict[str, dict[str, Any]], metrics: D.Metrics) -> None:
    """Every agent-loop metric is on the E2E board, marked as such, never mixed with other metrics;
    the three durations as p50 / p95 / p99, the tool calls by tool, kept and sampled-out trajectories."""
    on_board: dict[str, list[str]] = {}
    for slug, panel, target in all_targets(boards):
        used = set(metrics.used_in(target["expr"]))
        if used & D.AGENT_LOOP_METRICS:
            assert slug == "e2e-timeline" and used <= D.AGENT_LOOP_METRICS, (slug, panel["title"], sorted(used))
            assert "Agent loops only" in panel["description"], panel["title"]
            for name in used:
                on_board.setdefault(name, []).append(target["expr"])
    assert set(on_board) == D.AGENT_LOOP_METRICS
    for name in (M.RL_TRAJECTORY_DURATION, M.RL_TURN_DURATION, M.RL_TOOL_DURATION):
        assert [e.split(",", 1)[0] for e in on_board[name]] == [f"histogram_quantile({q}" for q in (0.5, 0.95, 0.99)], name
    assert all(f"by (le, {D.label(A.GEN_AI_TOOL_NAME)})" in e for e in on_board[M.RL_TOOL_DURATION])
    kept = D.label(A.RL_TRAJECTORY_KEPT)
    assert sorted(re.search(rf'{kept}="(\w+)"', e).group(1) for e in on_board[M.RL_TRAJECTORY_COUNT]) == ["false", "true"]


# --------------------------------------------------------------------------------------------
# Variables, data sources, trace links, exemplars


def provisioned() -> dict[str, dict[str, Any]]:
    return {ds["uid"]: ds for ds in yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))["datasources"]}


def test_every_query_is_scoped_by_the_template_variables(boards: dict[str, dict[str, Any]]) -> None:
    for slug, board in boards.items():
        variables = board["templating"]["list"]
        assert [v["name"] for v in variables] == list(D.VARIABLES), slug
        defined = {v["name"] for v in variables}
        multi = {v["name"] for v in variables if v.get("multi")}
        for _, panel, target in all_targets({slug: board}):
            expr = target["expr"]
            assert f'{D.label(A.SERVICE_NAME)}="$service"' in expr and f'{D.label(A.RL_RUN_ID)}="$run"' in expr, panel["title"]
            for name in re.findall(r"\$\{?(\w+)", expr):
                assert name in defined | GRAFANA_BUILTINS, f"{slug} / {panel['title']}: ${name} is not a variable"
                if name in multi:  # a multi-value variable expands to a regex alternation
                    assert re.search(rf'=~"\${name}"', expr), f"{slug} / {panel['title']}: ${name} without =~"
        for variable in variables:
            if variable.get("multi"):
                assert variable["allValue"] == ".*" and variable["current"]["value"] == ["$__all"], variable["name"]


def test_queries_use_the_provisioned_prometheus_through_the_datasource_variable(boards: dict[str, dict[str, Any]]) -> None:
    sources = provisioned()
    (datasource,) = [v for v in next(iter(boards.values()))["templating"]["list"] if v["type"] == "datasource"]
    assert datasource["current"]["value"] in sources and sources[datasource["current"]["value"]]["type"] == "prometheus"
    for slug, panel, target in all_targets(boards):
        assert panel["datasource"] == target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (slug, panel["title"])


def _link_panes(url: str) -> dict[str, Any]:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    text = query["panes"][0]
    # Grafana fills in its variables before opening the link: do the same with sample values.
    text = D.substitute(
        text,
        {"service": "svc", "run": "run-1", "__value.numeric": "0.25", "__from": "1", "__to": "2", "__field.labels.rl_stage": "generate"},
    )
    return json.loads(text)


def test_step_and_stage_panels_link_to_their_traces_in_jaeger_and_tempo(boards: dict[str, dict[str, Any]]) -> None:
    sources = provisioned()
    linked = []
    for board in boards.values():
        for panel in panels(board):
            links = panel["fieldConfig"]["defaults"].get("links", [])
            if not links:
                continue
            linked.append(panel["title"])
            kinds = set()
            for link in links:
                assert link["url"].startswith("/explore?"), link
                (pane,) = _link_panes(link["url"]).values()
                (query,) = pane["queries"]
                uid = pane["datasource"]
                assert uid in sources and query["datasource"] == {"type": sources[uid]["type"], "uid": uid}
                kinds.add(sources[uid]["type"])
                if sources[uid]["type"] == "jaeger":
                    assert query["service"] == "svc" and query["tags"] == f"{A.RL_RUN_ID}=run-1"
                    assert query["operation"] in (
                        N.RL_STEP_SPAN,
                        N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", "generate"),
                        N.RL_TRAJECTORY_SPAN,
                    )
                else:
                    assert f'resource.{A.RL_RUN_ID}="run-1"' in query["query"] and query["queryType"] == "traceql"
            assert kinds == {"jaeger", "tempo"}, panel["title"]
    assert {"Seconds per step by stage (pipeline order)", "Step time p50 / p95", "Stage duration p95"} <= set(linked)
    assert "Trajectory duration p50 / p95 / p99" in linked


def test_exemplars_are_asked_for_on_the_duration_histograms(boards: dict[str, dict[str, Any]], metrics: D.Metrics) -> None:
    with_exemplars = [(p["title"], t) for _, p, t in all_targets(boards) if t.get("exemplar")]
    assert with_exemplars
    for title, target in with_exemplars:
        assert target["expr"].startswith("histogram_quantile("), title
        assert set(metrics.used_in(target["expr"])) <= {M.RL_STEP_DURATION, M.RL_STAGE_DURATION}, title


# --------------------------------------------------------------------------------------------
# Grafana's own schema


def test_schema_version_is_the_grafana_deploy_runs() -> None:
    services = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]
    (image,) = [s["image"] for s in services.values() if s["image"].startswith("grafana/grafana:")]
    assert image.split(":")[1] == GRAFANA_SCHEMA_VERSION


# The boards are built for the Grafana that deploy/docker-compose.yml runs (11.6) and must also
# type-check against Grafana 12's schema, which still reads this (v1) dashboard JSON.
SCHEMAS = [GRAFANA_SCHEMA_VERSION, GRAFANA_12_SCHEMA_VERSION]


@pytest.mark.slow
@pytest.mark.parametrize("schema_version", SCHEMAS)
def test_every_board_type_checks_against_grafanas_schema(boards: dict[str, dict[str, Any]], schema_version: str) -> None:
    errors = typecheck(boards, schema_version=schema_version)
    assert not any(errors.values()), "\n".join(line[:600] for lines in errors.values() for line in lines[:5])


def _first(board: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(p for p in board["panels"] if p["type"] == kind)


BREAKAGES = {
    # name: (board, change, what tsc must complain about)
    "wrong enum": ("e2e-timeline", lambda b: _first(b, "timeseries")["options"]["legend"].update(displayMode="sidebar"), '"sidebar"'),
    "missing gridPos field": ("e2e-timeline", lambda b: _first(b, "stat")["gridPos"].pop("w"), "Property 'w' is missing"),
    "unknown option": ("rank-heatmap", lambda b: _first(b, "heatmap")["options"].update(colour={}), "'\"colour\"' does not exist"),
    "wrong type": ("system", lambda b: _first(b, "timeseries")["gridPos"].update(h="8"), "not assignable to type 'number'"),
    "wrong stacking": (
        "e2e-timeline",
        lambda b: _first(b, "timeseries")["fieldConfig"]["defaults"]["custom"]["stacking"].update(mode="stacked"),
        '"stacked"',
    ),
    "wrong query format": ("data-quality", lambda b: _first(b, "heatmap")["targets"][0].update(format="graph"), '"graph"'),
    "wrong variable type": ("algorithm", lambda b: b["templating"]["list"][1].update(type="dropdown"), '"dropdown"'),
    "missing schemaVersion": ("training-stability", lambda b: b.pop("schemaVersion"), "'schemaVersion' is missing"),
}


@pytest.mark.slow
@pytest.mark.parametrize("schema_version", SCHEMAS)
def test_the_schema_check_rejects_broken_boards(boards: dict[str, dict[str, Any]], schema_version: str) -> None:
    broken = {}
    for name, (slug, change, _) in BREAKAGES.items():
        board = copy.deepcopy(boards[slug])
        change(board)
        broken[name] = board
    errors = typecheck(broken, schema_version=schema_version)
    for name, (_, _, expected) in BREAKAGES.items():
        assert errors[name], f"tsc accepted a board with a {name}"
        assert any(expected in line for line in errors[name]), f"{name}: {errors[name]}"


# --------------------------------------------------------------------------------------------
# Prometheus' parser


@pytest.mark.slow
def test_every_query_parses_with_promtool(boards: dict[str, dict[str, Any]]) -> None:
    promtool = find_promtool()
    values = D.template_values(service="otel-rl-demo", run="20261121-060000-ab12cd", rank="(0|1)", cluster="actor_train", device="(0|1)")
    expressions = {
        f"{slug} / {panel['title']} / {target['refId']}": D.substitute(target["expr"], values)
        for slug, panel, target in all_targets(boards)
    }
    for board in boards.values():
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":  # label_values(selector, label): its selector must parse too
                selector = re.match(r"label_values\((.*),\s*\w+\)$", variable["query"]).group(1)
                expressions[f"variable {variable['name']}"] = D.substitute(selector, values)
    # The check must be able to fail: two broken expressions ride along and must be the only failures.
    steps = prometheus_name(M.RL_STEP_DURATION, "s", "histogram") + "_count"
    expressions["broken: unclosed"] = f"sum(rate({steps}[5m])"
    expressions["broken: unsubstituted"] = f'rate({steps}{{rl_run_id="$run"}}[$__rate_interval])'
    failed = promtool_parse(expressions, promtool)
    assert set(failed) == {"broken: unclosed", "broken: unsubstituted"}, failed


def test_substitute_fills_every_variable_and_refuses_unknown_ones() -> None:
    values = D.template_values(service="s", run="r")
    assert D.substitute('x{a="$service", b=~"${rank}"}[$__rate_interval]', values) == 'x{a="s", b=~".*"}[1m]'
    with pytest.raises(KeyError, match="nope"):
        D.substitute("x[$nope]", values)


# --------------------------------------------------------------------------------------------
# The generator and its command


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of what generation reads and writes: semconv/ and grafana/dashboards/."""
    shutil.copytree(REPO_ROOT / "semconv", tmp_path / "semconv")
    shutil.copytree(DASHBOARDS, tmp_path / "grafana" / "dashboards")
    return tmp_path


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="otel-rl")
    dashboards_cli.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return int(args.func(args) or 0)


def test_check_reports_edited_missing_and_stale_boards_and_write_fixes_them(checkout: Path, capsys: Any) -> None:
    folder = checkout / "grafana" / "dashboards"
    assert D.check(checkout) == []
    assert _cli("dashboards", "generate", "--check", "--repo", str(checkout)) == 0
    edited = folder / "system.json"
    edited.write_text(edited.read_text().replace("GPU utilization", "GPU busy"))
    (folder / "algorithm.json").unlink()
    (folder / "old-board.json").write_text("{}")
    problems = D.check(checkout)
    assert any("system.json (differs)" in p for p in problems)
    assert any("algorithm.json (missing)" in p for p in problems)
    assert any("old-board.json (stale" in p for p in problems)
    assert _cli("dashboards", "generate", "--check", "--repo", str(checkout)) == 1
    assert "out of date" in capsys.readouterr().err
    assert _cli("dashboards", "generate", "--repo", str(checkout)) == 0
    assert D.check(checkout) == [] and not (folder / "old-board.json").exists()


def test_generate_without_the_sdk_names_the_extra_to_install(checkout: Path) -> None:
    """grafana-foundation-sdk is optional: without it, generate says which extra brings it and writes nothing."""
    # None in sys.modules makes Python's import fail as for a package that is not installed.
    code = (
        "import sys; sys.modules['grafana_foundation_sdk'] = None\n"
        "from otel_rl.cli import main\n"
        f"sys.exit(main(['dashboards', 'generate', '--repo', {str(checkout)!r}]))"
    )
    before = {p.name: p.read_bytes() for p in (checkout / "grafana" / "dashboards").glob("*.json")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'otel-rl[dashboards]'" in done.stderr
    assert {p.name: p.read_bytes() for p in (checkout / "grafana" / "dashboards").glob("*.json")} == before


def test_a_registry_change_reaches_the_boards(checkout: Path) -> None:
    """Renaming a unit in the registry changes the boards (here: the step duration in ms)."""
    performance = checkout / "semconv" / "registry" / "performance.yaml"
    text = performance.read_text(encoding="utf-8")
    start = text.index(f"metric_name: {M.RL_STEP_DURATION}\n")
    unit_at = text.index('unit: "s"', start)
    performance.write_text(text[:unit_at] + 'unit: "ms"' + text[unit_at + len('unit: "s"') :], encoding="utf-8")
    problems = D.check(checkout)
    assert any("e2e-timeline.json (differs)" in p for p in problems)
    files = D.generate(checkout)
    assert prometheus_name(M.RL_STEP_DURATION, "ms", "histogram") + "_bucket" in files[Path("grafana/dashboards/e2e-timeline.json")]


# --------------------------------------------------------------------------------------------
# The renderer's reading of units and legends (its drawing runs on real data in tests/e2e)


@pytest.mark.parametrize(
    "value, unit, text",
    [
        (0.0123, "s", "12.3 ms"),
        (95.0, "s", "1.58 min"),
        (3 * 2**30, "bytes", "3 GiB"),
        (0.257, "percentunit", "25.7%"),
        (12345.0, "count:tokens", "12.3K tokens"),
        (812.0, "count:tokens/s", "812 tokens/s"),
        (0.5, "none", "0.5"),
        (float("nan"), "s", "-"),
    ],
)
def test_values_read_as_grafana_writes_them(value: float, unit: str, text: str) -> None:
    from otel_rl.ops.grafana_render import format_value

    assert format_value(value, unit) == text


def test_legend_templates_fill_in_labels() -> None:
    from otel_rl.ops.grafana_render import legend_text

    labels = {"rl_stage": "generate", "rl_cluster": "actor_infer", "__name__": "x"}
    assert legend_text("{{rl_cluster}} {{ rl_stage }}", labels) == "actor_infer generate"
    assert legend_text("__auto", labels) == '{rl_cluster="actor_infer", rl_stage="generate"}'
