"""The `otel-rl` command (otel_rl.cli.main): help, semconv check / generate / resolve, and show.

The demo subcommand is covered elsewhere (it trains a model)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import otel_rl
from otel_rl import cli

REPO_ROOT = Path(__file__).resolve().parents[1]
SEMCONV = REPO_ROOT / "semconv"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "broken_registry"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------------------- help


def test_help_exits_0_and_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("semconv", "demo", "show"):
        assert re.search(rf"^\s+{command}\s", out, re.M), f"{command} missing from --help:\n{out}"
    assert "otel-rl semconv generate [--check]" in out  # the examples epilog


def test_a_command_that_reads_runs_starts_without_the_sdk_or_the_other_commands() -> None:
    # `otel-rl trace` / `show` on a 1,024-rank step have a 3 s budget: importing the SDK, numpy
    # and every other command's modules cost 0.7 s of each start.
    probe = (
        "import sys; from otel_rl.cli import main\n"
        "try:\n    main(['trace', '--help'])\nexcept SystemExit:\n    pass\n"
        "import otel_rl\n"
        "print(sorted(m for m in sys.modules if m.startswith(('otel_rl._sdk', 'otel_rl.analyze', 'otel_rl.stack', 'numpy'))))\n"
        "print(otel_rl.Telemetry.__name__, 'Telemetry' in dir(otel_rl))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    loaded, public = done.stdout.splitlines()[-2:]
    assert loaded == "[]", loaded
    assert public == "Telemetry True"  # the public API is there on first use


def test_semconv_help_exits_0_and_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["semconv", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for sub in ("check", "generate", "resolve"):
        assert re.search(rf"^\s+{sub}\s", out, re.M), f"{sub} missing from semconv --help:\n{out}"


@pytest.mark.parametrize("sub", ["check", "generate", "resolve"])
def test_semconv_subcommand_help(capsys, sub):
    with pytest.raises(SystemExit) as info:
        cli.main(["semconv", sub, "--help"])
    assert info.value.code == 0
    assert "--registry" in capsys.readouterr().out


def test_show_help_names_its_options(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["show", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "RUN_DIR" in out and "--step" in out


def test_no_command_prints_help_and_returns_2(capsys):
    rc, out, _ = _run(capsys)
    assert rc == 2
    assert "semconv" in out and "show" in out


def test_semconv_without_subcommand_prints_its_help_and_returns_2(capsys):
    rc, out, _ = _run(capsys, "semconv")
    assert rc == 2
    assert "check" in out and "generate" in out and "resolve" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"otel-rl {otel_rl.__version__}"


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# ---------------------------------------------------------------------------- semconv check


def test_semconv_check_passes_on_the_repository(monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    rc, out, err = _run(capsys, "semconv", "check")
    assert rc == 0, err
    assert "semconv check: ok" in out
    assert re.search(r"\(\d+ metrics, \d+ attributes, \d+ framework mappings", out)


def test_semconv_check_finds_the_registry_from_a_subfolder(monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT / "otel_rl")
    rc, out, _ = _run(capsys, "semconv", "check")
    assert rc == 0
    assert str(SEMCONV) in out


@pytest.fixture
def semconv_copy(tmp_path: Path) -> Path:
    target = tmp_path / "semconv"
    shutil.copytree(SEMCONV, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def test_semconv_check_passes_on_an_unchanged_copy(semconv_copy, capsys):
    rc, out, err = _run(capsys, "semconv", "check", "--registry", str(semconv_copy))
    assert rc == 0, err
    assert str(semconv_copy) in out


@pytest.mark.parametrize(
    ("case", "rule"), [("unit_not_ucum", "unit-ucum"), ("step_on_metric", "high-cardinality"), ("yaml_syntax", "yaml-syntax")]
)
def test_semconv_check_fails_on_a_broken_registry_with_file_and_line(semconv_copy, capsys, case, rule):
    text = (FIXTURES / f"{case}.yaml").read_text(encoding="utf-8")
    (semconv_copy / "registry" / f"zz_{case}.yaml").write_text(text, encoding="utf-8")
    line = next(n for n, l in enumerate(text.splitlines(), start=1) if "# EXPECT" in l)
    rc, out, err = _run(capsys, "semconv", "check", "--registry", str(semconv_copy))
    assert rc == 1
    assert out == ""
    assert f"semconv/registry/zz_{case}.yaml:{line}: [{rule}] " in err
    assert "semconv check: 1 problem(s)" in err


def test_semconv_check_fails_on_a_mapping_to_an_unknown_metric(semconv_copy, capsys):
    path = semconv_copy / "mappings" / "roll.yaml"
    text = path.read_text(encoding="utf-8")
    path.write_text(text + '  - key: "custom/loss_thing"\n    metric: rl.no_such_metric\n', encoding="utf-8")
    line = len(path.read_text(encoding="utf-8").splitlines()) - 1
    rc, _, err = _run(capsys, "semconv", "check", "--registry", str(semconv_copy))
    assert rc == 1
    assert f"{path}:{line}:" in err
    assert "rl.no_such_metric" in err


def test_semconv_check_with_a_folder_without_registry_exits(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["semconv", "check", "--registry", str(tmp_path)])
    assert "no registry/ folder" in str(info.value.code)


# ---------------------------------------------------------------------------- semconv generate


def test_semconv_generate_check_passes_on_the_repository(monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    rc, out, err = _run(capsys, "semconv", "generate", "--check")
    assert rc == 0, err
    assert "up to date" in out


# ---------------------------------------------------------------------------- semconv resolve


def test_resolve_roll_pg_loss(capsys):
    rc, out, err = _run(capsys, "semconv", "resolve", "--framework", "roll", "actor/pg_loss")
    assert rc == 0, err
    (line,) = out.splitlines()
    assert line.startswith("actor/pg_loss\t-> rl.loss{")
    assert 'rl.loss.type="policy"' in line
    assert 'rl.model.role="actor"' in line
    assert "via roll" in line
    assert "fallback" not in line


def test_resolve_several_keys_one_line_each(capsys):
    rc, out, _ = _run(capsys, "semconv", "resolve", "--framework", "roll", "actor/pg_loss", "critic/lr")
    assert rc == 0
    lines = out.splitlines()
    assert [l.split("\t")[0] for l in lines] == ["actor/pg_loss", "critic/lr"]
    assert "-> rl.learning_rate{" in lines[1] and 'rl.model.role="critic"' in lines[1]


def test_resolve_unknown_key_exits_1_and_says_fallback(capsys):
    rc, out, _ = _run(capsys, "semconv", "resolve", "--framework", "roll", "not/a_known_key")
    assert rc == 1
    assert 'rl.unmapped{rl.key="not/a_known_key"}' in out
    assert "fallback" in out


def test_resolve_exits_1_when_any_key_falls_back(capsys):
    rc, out, _ = _run(capsys, "semconv", "resolve", "--framework", "roll", "actor/pg_loss", "not/a_known_key")
    assert rc == 1
    lines = out.splitlines()
    assert "fallback" not in lines[0] and "fallback" in lines[1]


def test_resolve_registry_metric_name_without_framework(capsys):
    rc, out, _ = _run(capsys, "semconv", "resolve", "rl.stage.duration")
    assert rc == 0
    assert out.startswith("rl.stage.duration\t-> rl.stage.duration{")


def test_resolve_reads_mappings_from_registry_folder(semconv_copy, capsys):
    path = semconv_copy / "mappings" / "roll.yaml"
    path.write_text(
        path.read_text(encoding="utf-8") + '  - key: "custom/total_loss_x"\n    metric: rl.loss\n    attributes: {rl.loss.type: total}\n',
        encoding="utf-8",
    )
    # the generated tables do not know the new rule ...
    rc, out, _ = _run(capsys, "semconv", "resolve", "--framework", "roll", "custom/total_loss_x")
    assert rc == 1 and "fallback" in out
    # ... the edited folder does
    rc, out, _ = _run(capsys, "semconv", "resolve", "--framework", "roll", "--registry", str(semconv_copy), "custom/total_loss_x")
    assert rc == 0
    assert "-> rl.loss{" in out and 'rl.loss.type="total"' in out


def test_resolve_unknown_framework_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["semconv", "resolve", "--framework", "nemo", "actor/pg_loss"])
    assert info.value.code == 2


# ---------------------------------------------------------------------------- show


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    """A real run folder: two steps of spans written by otel_rl through the SDK."""
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=str(run_dir), console=False, service_name="otel-rl-test-cli")
    try:
        with tel.step(2):
            with tel.stage("validation"):
                time.sleep(0.002)
        with tel.step(3):
            with tel.stage("generate", cluster="actor_infer"):
                time.sleep(0.002)
            with tel.stage("train_step", cluster="actor_train", offload=True) as st:
                with st.phase("onload"):
                    pass
                with st.phase("execute"):
                    time.sleep(0.002)
                with st.phase("offload"):
                    pass
    finally:
        tel.shutdown()
    assert (run_dir / "traces.jsonl").is_file()
    return run_dir


def _span_names(waterfall: str) -> list[str]:
    names = []
    for line in waterfall.splitlines()[2:]:  # after the trace line and the column header
        match = re.match(r"^[\s│├└─]*(rl\.[a-z_]+)", line)
        if match:
            names.append(match.group(1))
    return names


def test_show_prints_the_steps_waterfall(run_folder, capsys):
    rc, out, err = _run(capsys, "show", str(run_folder), "--step", "3")
    assert rc == 0, err
    first = out.splitlines()[0]
    assert "rl.step 3" in first and "6 spans" in first
    assert _span_names(out) == ["rl.step", "rl.generate", "rl.train_step", "rl.onload", "rl.execute", "rl.offload"]
    assert "actor_infer" in out and "actor_train" in out
    # the other step's spans are in a different trace
    assert "rl.validation" not in out


def test_show_other_step(run_folder, capsys):
    rc, out, _ = _run(capsys, "show", str(run_folder), "--step", "2")
    assert rc == 0
    assert _span_names(out) == ["rl.step", "rl.validation"]


def test_show_missing_step_exits_1_and_lists_available_steps(run_folder, capsys):
    rc, out, err = _run(capsys, "show", str(run_folder), "--step", "9")
    assert rc == 1
    assert out == ""
    assert "step 9" in err
    assert "steps available: 2-3" in err


def test_show_missing_folder_exits_2(tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    rc, out, err = _run(capsys, "show", str(missing), "--step", "0")
    assert rc == 2
    assert out == ""
    assert str(missing) in err and "does not exist" in err


def test_show_folder_without_spans_exits_1(tmp_path, capsys):
    rc, _, err = _run(capsys, "show", str(tmp_path), "--step", "0")
    assert rc == 1
    assert "no spans" in err


def test_show_without_step_lists_every_step(run_folder, capsys):
    # no log() calls: each step's row still has its wall time (the values are in tests/test_step_table.py)
    rc, out, _ = _run(capsys, "show", str(run_folder))
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("2 steps (2-3)")
    table = [line.split() for line in lines[1:4]]
    assert [row[:2] for row in table[:1]] == [["step", "seconds"]]
    assert [row[0] for row in table[1:]] == ["2", "3"] and all(float(row[1]) >= 0.002 for row in table[1:])


# ---------------------------------------------------------------------------- trace


def _two_step_run(run_dir):
    tel = otel_rl.init(run_dir=str(run_dir), console=False, service_name="trace-test")
    for step in (1, 2):
        with tel.step(step):
            with tel.stage("generate", cluster="actor_infer"):
                pass
            with tel.stage("train_step", cluster="actor_train", offload=True) as st:
                with st.phase("execute"):
                    pass
    tel.shutdown()
    return run_dir


def test_trace_prints_the_url_and_tree_and_writes_jaeger_json(tmp_path, capsys):
    run_dir = _two_step_run(tmp_path / "run")
    out = tmp_path / "step2.json"
    assert cli.main(["trace", "--step", "2", "--run-dir", str(run_dir), "--out", str(out), "--jaeger", "http://127.0.0.1:9/"]) == 0
    printed = capsys.readouterr().out
    trace = json.loads(out.read_text())["data"][0]
    trace_id = trace["traceID"]
    # no Jaeger answers on the discard port: no link, the upload of the written file instead (tests/e2e/test_stack_truth_e2e.py)
    assert "/trace/" not in printed and f"load the file --out writes ({out}) in Jaeger's UI (Search > JSON File)" in printed
    assert "rl.train_step" in printed and "rl.execute" in printed
    # Jaeger's model (model/json/model.go): these fields, microsecond times, typed tags, CHILD_OF references.
    spans = {s["operationName"]: s for s in trace["spans"]}
    assert set(spans) == {"rl.step", "rl.generate", "rl.train_step", "rl.execute"}
    for span in trace["spans"]:
        assert set(span) >= {"traceID", "spanID", "operationName", "references", "startTime", "duration", "tags", "logs", "processID"}
        assert span["traceID"] == trace_id and len(span["spanID"]) == 16
        assert span["processID"] in trace["processes"]
        assert all(t["type"] in ("string", "bool", "int64", "float64") for t in span["tags"])
    assert spans["rl.step"]["references"] == []
    assert spans["rl.execute"]["references"] == [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": spans["rl.train_step"]["spanID"]}]
    assert {"key": "rl.step", "type": "int64", "value": 2} in spans["rl.generate"]["tags"]
    assert spans["rl.step"]["startTime"] <= spans["rl.generate"]["startTime"] < 10**17  # microseconds, not ns
    snapshot_logs = [
        log for log in spans["rl.train_step"]["logs"] if {"key": "event", "type": "string", "value": "rl.memory.snapshot"} in log["fields"]
    ]
    assert len(snapshot_logs) == 4
    assert trace["processes"][spans["rl.step"]["processID"]]["serviceName"] == "trace-test"


def test_trace_defaults_to_the_latest_run_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "otel-rl-runs").mkdir()
    _two_step_run(tmp_path / "otel-rl-runs" / "older")
    time.sleep(0.05)
    _two_step_run(tmp_path / "otel-rl-runs" / "newer")
    assert cli.main(["trace", "--step", "1"]) == 0
    assert "otel-rl-runs/newer" in capsys.readouterr().out
    assert cli.main(["trace", "--step", "9"]) == 1
    assert "steps available: 1-2" in capsys.readouterr().err


def test_trace_from_a_jaeger_that_is_not_there_says_where_it_looked(tmp_path, capsys, monkeypatch):
    import socket

    monkeypatch.chdir(tmp_path)  # no otel-rl-runs/ here
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert cli.main(["trace", "--step", "1", "--jaeger", closed]) == 1
    assert f"cannot reach Jaeger's query API at {closed}" in capsys.readouterr().err
    assert cli.main(["trace", "--step", "1", "--jaeger", closed, "--lookback", "soon"]) == 2
    assert "--lookback: not a lookback: 'soon'" in capsys.readouterr().err
