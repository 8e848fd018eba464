"""The alert rules (otel_rl/_alerts.py -> grafana/alerts, grafana/provisioning/alerting).

Generated files current; only registry metrics and labels; every rule with `for`, severity and
annotations naming the run and its metrics; Grafana's copy equal to the Prometheus one; the real
promtool and vmalert accept every file and reject broken ones; the unit tests in
tests/alerts/*.test.yml (firing and silent cases per rule) pass under promtool AND vmalert-tool,
and fail when a rule is weakened.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from alert_tools import REPO, RuleTools

import otel_rl.ops.alerts as _alerts
from otel_rl.cli import alerts as alerts_cli
from otel_rl.codegen.generate import differences, prometheus_name
from otel_rl.semconv import ENUM_MEMBERS, METRICS
from otel_rl.semconv import attributes as A

RULES = REPO / _alerts.RULES_PATH
GRAFANA = REPO / _alerts.GRAFANA_PATH
RULE_FILES = sorted(p for p in (REPO / "grafana" / "alerts").iterdir() if p.suffix in (".yml", ".yaml"))
UNIT_TESTS = sorted((REPO / "tests" / "alerts").glob("*.test.yml"))
RULE_REF = "../../" + _alerts.RULES_PATH.as_posix()  # how the unit tests name the rule file


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def prometheus_rules(path: Path = RULES) -> dict[str, dict]:
    return {r["alert"]: r for g in load(path)["groups"] for r in g["rules"]}


# ---------------------------------------------------------------------------------------------
# What an expression names


_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
_CLAUSE = re.compile(r"\b(by|on|ignoring|without|group_left|group_right)\s*\(([^)]*)\)")


def expr_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression reads (a small PromQL tokenizer, enough for these rules)."""
    labels: set[str] = set()
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals cannot hold names
    for match in _CLAUSE.finditer(text):
        labels |= {x.strip() for x in match.group(2).split(",") if x.strip()}
    text = _CLAUSE.sub(" ", text)
    for block in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", block))
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\boffset\s+\w+", " ", text)
    text = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", " ", text)
    metrics = {name for name in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text) if name not in _KEYWORDS}
    return metrics, labels


def registry_prometheus_names() -> set[str]:
    names = set()
    for name, mdef in METRICS.items():
        prom = prometheus_name(name, mdef.unit, mdef.instrument)
        names.add(prom)
        if mdef.instrument == "histogram":
            names |= {f"{prom}_bucket", f"{prom}_sum", f"{prom}_count"}
    return names


def registry_labels() -> dict[str, str]:
    """{Prometheus label: attribute id} of every registry attribute (data point and resource)."""
    return {_alerts.label(getattr(A, n)): getattr(A, n) for n in A.__all__ if n.isupper()}


def test_the_tokenizer_finds_metrics_and_labels():
    metrics, labels = expr_names(
        'max by (a_b) (max_over_time(rl_x_ratio{c="d.e", f=~"g"}[5m] offset 1h)) > 2 * rl_y '
        'and on (h) label_replace(rl_z, "i", "j", "", "")'
    )
    assert metrics == {"rl_x_ratio", "rl_y", "rl_z"}
    assert labels == {"a_b", "c", "f", "h"}


def test_generated_files_are_current():
    assert differences(REPO, _alerts.render(REPO)) == []


def test_generate_check_command(capsys, tmp_path):
    parser = argparse.ArgumentParser(prog="otel-rl")
    alerts_cli.add_cli(parser.add_subparsers(dest="command"))

    args = parser.parse_args(["alerts", "generate", "--check", "--root", str(REPO)])
    assert args.func(args) == 0, capsys.readouterr().err
    assert "ok (2 files up to date)" in capsys.readouterr().out

    # a hand edit in a copy of the checkout: --check fails and names the file; generate repairs it
    for rel in (_alerts.RULES_PATH, _alerts.GRAFANA_PATH, _alerts.DATASOURCES_PATH):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    edited = tmp_path / _alerts.RULES_PATH
    edited.write_text(edited.read_text().replace("> 10", "> 20"))
    args = parser.parse_args(["alerts", "generate", "--check", "--root", str(tmp_path)])
    assert args.func(args) == 1
    assert f"{_alerts.RULES_PATH} (differs)" in capsys.readouterr().err
    args = parser.parse_args(["alerts", "generate", "--root", str(tmp_path)])
    assert args.func(args) == 0
    assert edited.read_text() == RULES.read_text()


def test_generate_a_short_window_variant(capsys, tmp_path):
    parser = argparse.ArgumentParser(prog="otel-rl")
    alerts_cli.add_cli(parser.add_subparsers(dest="command"))
    out = tmp_path / "fast.yml"
    args = parser.parse_args(["alerts", "generate", "--time-scale", "30", "--rules-out", str(out)])
    assert args.func(args) == 0
    assert "[20s]" in out.read_text() and "interval: 2s" in out.read_text()
    # the committed files are the standard rules: a scaled variant must go elsewhere
    args = parser.parse_args(["alerts", "generate", "--time-scale", "30", "--root", str(tmp_path)])
    assert args.func(args) == 2
    assert "--rules-out" in capsys.readouterr().err
    with pytest.raises(ValueError, match="does not divide"):
        _alerts.build_groups(7)


@pytest.mark.parametrize("seconds", [1, 20, 60, 90, 600, 3600, 5400])
def test_durations_round_trip(seconds):
    assert _alerts.parse_duration(_alerts.duration(seconds)) == seconds


def test_every_metric_and_label_in_every_rule_is_in_the_registry():
    known_metrics, known_labels = registry_prometheus_names(), registry_labels()
    seen: set[str] = set()
    for path in RULE_FILES:
        for group in load(path)["groups"]:
            for rule in group["rules"]:
                metrics, labels = expr_names(rule["expr"])
                assert metrics, rule["alert"]
                assert metrics <= known_metrics, (rule["alert"], sorted(metrics - known_metrics))
                assert labels <= set(known_labels), (rule["alert"], sorted(set(labels) - set(known_labels)))
                seen |= metrics
                # a matcher's value must be one the attribute's enum allows
                for lab, value in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', rule["expr"]):
                    if lab in known_labels and known_labels[lab] in ENUM_MEMBERS:
                        assert value in ENUM_MEMBERS[known_labels[lab]], (rule["alert"], lab, value)
    # the metrics seeds 002 and 003 name, by their registry names
    assert {
        "rl_policy_kl_ratio",
        "rl_grad_norm_ratio",
        "rl_policy_entropy_ratio",
        "rl_response_clipped_ratio",
        "rl_rollout_abort_ratio",
        "rl_rollout_timeout_ratio",
        "rl_step_tokens",
        "rl_rank_tokens",
        "rl_rank_active_time_seconds",
        "rl_gpu_memory_usage_bytes",
        "rl_gpu_memory_utilization_ratio",
    } <= seen


def test_a_name_outside_the_registry_would_be_caught():
    metrics, _ = expr_names('max by (rl_run_id) (rl_policy_kl{rl_policy="reference"}) > 10')
    assert metrics - registry_prometheus_names() == {"rl_policy_kl"}  # the OTel name, not the Prometheus one


def test_every_rule_has_for_severity_and_annotations_naming_the_run_and_metrics():
    rules = prometheus_rules()
    assert set(rules) == {
        "RLTrainingDivergence",
        "RLKLAboveThreshold",
        "RLResponseClippedRatioAboveThreshold",
        "RLInferenceAnomaly",
        "RLDynamicBatchRunaway",
        "RLGPUMemoryRisk",
        "RLRankImbalance",
        "RLTrainInferMismatch",
    }
    for name, rule in rules.items():
        assert _alerts.parse_duration(rule["for"]) > 0, name
        assert rule["labels"]["severity"] in _alerts.SEVERITIES, name
        notes = rule["annotations"]
        assert set(notes) == {"summary", "description", "runbook"}, name
        assert "{{ $labels.rl_run_id }}" in notes["summary"] and "{{ $labels.service_name }}" in notes["summary"], name
        metrics, _ = expr_names(rule["expr"])
        text = notes["summary"] + notes["description"]
        assert all(m in text for m in metrics), (name, [m for m in metrics if m not in text])
        assert len(notes["runbook"]) > 40, name


def test_seed_003_thresholds():
    rules = prometheus_rules()
    assert rules["RLKLAboveThreshold"]["expr"].rstrip().endswith("> 10")
    assert rules["RLResponseClippedRatioAboveThreshold"]["expr"].rstrip().endswith("> 0.3")


def test_the_short_window_variant_differs_only_in_durations():
    """--time-scale 60 (the end-to-end test's rules) is the same rules with every duration / 60."""
    standard, fast = _alerts.build_groups(), _alerts.build_groups(_alerts.FAST_TIME_SCALE)

    def scaled(expr: str) -> str:
        return re.sub(
            r"(\[|offset )(\w+)",
            lambda m: m.group(1) + _alerts.duration(_alerts.parse_duration(m.group(2)) // _alerts.FAST_TIME_SCALE),
            expr,
        )

    for g_std, g_fast in zip(standard, fast, strict=True):
        assert g_fast.interval_s * _alerts.FAST_TIME_SCALE == g_std.interval_s
        for r_std, r_fast in zip(g_std.rules, g_fast.rules, strict=True):
            assert r_fast.expr == scaled(r_std.expr), r_std.alert
            assert r_fast.for_s * _alerts.FAST_TIME_SCALE == r_std.for_s
            assert r_fast.labels == r_std.labels
    assert "[10s]" in fast[0].rules[0].expr and "[1m] offset 10s" in fast[0].rules[0].expr


# ---------------------------------------------------------------------------------------------
# Grafana's copy


def prometheus_datasource_uid() -> str:
    sources = load(REPO / _alerts.DATASOURCES_PATH)["datasources"]
    return next(ds["uid"] for ds in sources if ds["type"] == "prometheus")


def test_grafana_rules_equal_the_prometheus_rules():
    prom_doc, graf_doc = load(RULES), load(GRAFANA)
    assert graf_doc["apiVersion"] == 1
    uid = prometheus_datasource_uid()
    prom_groups = {g["name"]: g for g in prom_doc["groups"]}
    assert [g["name"] for g in graf_doc["groups"]] == list(prom_groups)
    uids = set()
    for group in graf_doc["groups"]:
        prom = prom_groups[group["name"]]
        assert group["orgId"] == 1 and group["folder"] and group["interval"] == prom["interval"]
        assert [r["title"] for r in group["rules"]] == [r["alert"] for r in prom["rules"]]
        for rule, prom_rule in zip(group["rules"], prom["rules"]):
            assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", rule["uid"]) and rule["uid"] not in uids
            uids.add(rule["uid"])
            by_ref = {d["refId"]: d for d in rule["data"]}
            assert rule["condition"] in by_ref
            query = by_ref["A"]
            assert query["datasourceUid"] == uid and query["model"]["datasource"]["uid"] == uid
            assert query["model"]["expr"] == prom_rule["expr"]
            assert query["model"]["instant"] is True
            assert query["relativeTimeRange"]["from"] > query["relativeTimeRange"]["to"] == 0
            condition = by_ref[rule["condition"]]
            assert condition["datasourceUid"] == "__expr__" and condition["model"]["expression"] == "A"
            assert rule["for"] == prom_rule["for"]
            assert rule["labels"] == prom_rule["labels"]
            # Grafana's templates call the query value $values.A.Value
            assert {k: v.replace("$values.A.Value", "$value") for k, v in rule["annotations"].items()} == prom_rule["annotations"]
            assert rule["noDataState"] == "OK"  # no series means the condition does not hold


# ---------------------------------------------------------------------------------------------
# The real tools


def _assert_ok(result, what: str) -> None:
    assert result.returncode == 0, f"{what} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules_accepts_the_rule_file(rule_tools: RuleTools, path: Path):
    result = rule_tools.run([rule_tools.promtool, "check", "rules", path])
    _assert_ok(result, "promtool check rules")
    count = sum(len(g["rules"]) for g in load(path)["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_vmalert_accepts_the_rule_file(rule_tools: RuleTools, path: Path):
    # -dryRun parses every expression as MetricsQL and every annotation template, and exits
    _assert_ok(rule_tools.run([rule_tools.vmalert, "-dryRun", f"-rule={path}"]), "vmalert -dryRun")


def test_the_short_window_variant_is_accepted(rule_tools: RuleTools, tmp_path: Path):
    path = _alerts.write_rules_file(tmp_path / "fast.yml", _alerts.FAST_TIME_SCALE)
    _assert_ok(rule_tools.run([rule_tools.promtool, "check", "rules", path]), "promtool check rules")
    _assert_ok(rule_tools.run([rule_tools.vmalert, "-dryRun", f"-rule={path}"]), "vmalert -dryRun")


BROKEN = {
    "unbalanced-parenthesis": ("max_over_time(rl_response_clipped_ratio[2m])) > 0.3", "max_over_time(rl_response_clipped_ratio[2m]) > 0.3"),
    "unknown-function": ("max_over_time(rl_response_clipped_ratio[2m])", "maximum_over_time(rl_response_clipped_ratio[2m])"),
    "bad-duration": ("for: 1m", "for: one minute"),
    "bad-template": ("{{ $value | humanizePercentage }} of responses", "{{ $value | humanizePercentage of responses"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_rule_file_is_rejected(rule_tools: RuleTools, tmp_path: Path, case: str):
    old, new = BROKEN[case]
    text = RULES.read_text()
    assert old in text
    broken = tmp_path / "broken.yml"
    broken.write_text(text.replace(old, new, 1))
    promtool = rule_tools.run([rule_tools.promtool, "check", "rules", broken])
    assert promtool.returncode != 0 and "FAILED" in promtool.stdout + promtool.stderr, promtool.stdout
    vmalert = rule_tools.run([rule_tools.vmalert, "-dryRun", f"-rule={broken}"])
    assert vmalert.returncode != 0, vmalert.stdout + vmalert.stderr


# ---------------------------------------------------------------------------------------------
# Unit tests per rule


def alert_tests(path: Path) -> list[dict]:
    return [case for test in load(path)["tests"] for case in test.get("alert_rule_test", [])]


def test_every_rule_has_a_firing_and_a_silent_unit_test():
    cases: dict[str, list[dict]] = {}
    for path in UNIT_TESTS:
        assert load(path)["rule_files"] == [RULE_REF], path.name
        for case in alert_tests(path):
            cases.setdefault(case["alertname"], []).append(case)
    for name in prometheus_rules():
        assert any(c["exp_alerts"] for c in cases.get(name, [])), f"{name}: no test where it fires"
        assert any(not c["exp_alerts"] for c in cases.get(name, [])), f"{name}: no test where it stays silent"


def test_divergence_tests_cover_every_partial_combination():
    """All three anomalous fire; each one alone and each pair stay silent (seed 002: composite first)."""
    path = REPO / "tests" / "alerts" / "divergence.test.yml"
    runs = {re.search(r'rl_run_id="([^"]+)"', s["series"]).group(1) for t in load(path)["tests"] for s in t["input_series"]}
    assert {
        "diverging",
        "kl-only",
        "grad-norm-only",
        "entropy-only",
        "kl-and-grad-norm",
        "kl-and-entropy",
        "grad-norm-and-entropy",
        "below-floors",
        "no-baseline",
    } <= runs
    fired = {a["exp_labels"]["rl_run_id"] for c in alert_tests(path) for a in c["exp_alerts"]}
    assert fired == {"diverging", "entropy-jump"}


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.stem)
def test_promtool_unit_tests(rule_tools: RuleTools, path: Path):
    result = rule_tools.run([rule_tools.promtool, "test", "rules", path])
    _assert_ok(result, f"promtool test rules {path.name}")
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.stem)
def test_vmalert_tool_unit_tests(rule_tools: RuleTools, path: Path):
    result = rule_tools.vmalert_tool_unittest(path)
    _assert_ok(result, f"vmalert-tool unittest {path.name}")
    assert "SUCCESS" in result.stdout + result.stderr


def _weakened_copy(tmp_path: Path, test_file: str, alert: str, old: str, new: str) -> Path:
    """A copy of a unit test and of the rule file with one rule's expression edited."""
    doc = load(RULES)
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == alert:
                assert old in rule["expr"]
                rule["expr"] = rule["expr"].replace(old, new)
    rules = tmp_path / _alerts.RULES_PATH
    rules.parent.mkdir(parents=True)
    rules.write_text(yaml.safe_dump(doc, sort_keys=False))
    test = tmp_path / "tests" / "alerts" / test_file
    test.parent.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "alerts" / test_file, test)
    return test


WEAKENED = {
    # divergence without its grad-norm condition: KL + entropy alone would fire
    "divergence-without-grad-norm": (
        "divergence.test.yml",
        "RLTrainingDivergence",
        "and on (rl_run_id, service_name)\n(\n  max by (rl_run_id, service_name) (max_over_time(rl_grad_norm_ratio",
        "or on (rl_run_id, service_name)\n(\n  max by (rl_run_id, service_name) (max_over_time(rl_grad_norm_ratio",
        "kl-and-grad-norm",
    ),
    "kl-threshold-moved": ("thresholds.test.yml", "RLKLAboveThreshold", "> 10", "> 20", "kl-spike"),
    # the mismatch's growth floor lowered: a gap still under 0.01 would fire
    "train-infer-floor-moved": ("train_infer.test.yml", "RLTrainInferMismatch", "> 0.01\n", "> 0.001\n", "under-floor"),
}


@pytest.mark.parametrize("case", sorted(WEAKENED))
def test_the_unit_tests_fail_when_a_rule_is_weakened(rule_tools: RuleTools, tmp_path: Path, case: str):
    test_file, alert, old, new, run_named = WEAKENED[case]
    test = _weakened_copy(tmp_path, test_file, alert, old, new)
    promtool = rule_tools.run([rule_tools.promtool, "test", "rules", test])
    assert promtool.returncode != 0 and run_named in promtool.stdout + promtool.stderr, promtool.stdout
    vmtool = rule_tools.vmalert_tool_unittest(test, cwd=tmp_path)
    assert vmtool.returncode != 0 and run_named in vmtool.stdout + vmtool.stderr, vmtool.stdout + vmtool.stderr
