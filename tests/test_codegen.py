"""Code generation (otel_rl.codegen.generate, `otel-rl semconv generate`): the committed files match the
registry, --check catches drift and stale files, and the generated package is usable on a real
OpenTelemetry SDK MeterProvider."""

from __future__ import annotations

import enum
import shutil
from pathlib import Path

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum

import otel_rl.codegen.generate as _codegen
import otel_rl.semconv._tables as _tables
from otel_rl import cli
from otel_rl.codegen.generate import BUCKETS, MD_HEADER, PY_HEADER, constant_name, enum_class_name, prometheus_name
from otel_rl.codegen.registry import load_registry, registry_files
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

REPO_ROOT = Path(__file__).resolve().parents[1]
SEMCONV = REPO_ROOT / "semconv"
REGISTRY = load_registry(SEMCONV)
METRIC_NAMES = sorted(REGISTRY.metrics)
ENUM_ATTRIBUTES = sorted(a.id for a in REGISTRY.attributes.values() if a.type == "enum")

STAGE_DURATION_BRIEF = 'brief: "Wall time of one stage or stage phase."'


def _oneline(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------------------- the repository


def test_generate_check_passes_on_the_repository(monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    rc = cli.main(["semconv", "generate", "--check"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "ok" in out


def test_committed_files_equal_what_generation_renders():
    registry, files = _codegen.generate(REPO_ROOT)
    assert registry.problems == []
    assert _codegen.diff(REPO_ROOT, files) == []


def test_generation_covers_the_package_and_the_docs():
    _, files = _codegen.generate(REPO_ROOT)
    paths = {f.path.as_posix() for f in files}
    assert {
        "otel_rl/semconv/__init__.py",
        "otel_rl/semconv/attributes.py",
        "otel_rl/semconv/metrics.py",
        "otel_rl/semconv/names.py",
        "otel_rl/semconv/_tables.py",
        "docs/semconv/mappings.md",
    } <= paths
    # one Markdown page per registry file
    stems = {p.stem for p in registry_files(SEMCONV / "registry")}  # not manifest.yaml: it holds no groups
    assert {f"docs/semconv/{s}.md" for s in stems} <= paths


def test_every_generated_file_starts_with_the_do_not_edit_line():
    _, files = _codegen.generate(REPO_ROOT)
    assert "DO NOT EDIT" in PY_HEADER and "`otel-rl semconv generate`" in PY_HEADER
    assert "DO NOT EDIT" in MD_HEADER and "`otel-rl semconv generate`" in MD_HEADER
    for f in files:
        header = PY_HEADER if f.path.suffix == ".py" else MD_HEADER
        assert f.content.splitlines()[0] == header, f.path
        # and the committed copy on disk too
        assert (REPO_ROOT / f.path).read_text(encoding="utf-8").splitlines()[0] == header, f.path


def test_rendering_is_deterministic():
    _, first = _codegen.generate(REPO_ROOT)
    _, second = _codegen.generate(REPO_ROOT)
    assert [f.path for f in first] == [f.path for f in second]
    assert [f.content.encode() for f in first] == [f.content.encode() for f in second]


# ---------------------------------------------------------------------------- a copy of the repository


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """semconv/, otel_rl/semconv/ and docs/semconv/ copied into tmp_path (a repository layout)."""
    shutil.copytree(SEMCONV, tmp_path / "semconv", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "otel_rl" / "semconv", tmp_path / "otel_rl" / "semconv", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "docs" / "semconv", tmp_path / "docs" / "semconv")
    # Start from an up-to-date copy even if someone is editing the real mappings right now.
    _, files = _codegen.generate(tmp_path)
    _codegen.write(tmp_path, files)
    assert _codegen.diff(tmp_path, files) == []
    return tmp_path


def _check(repo: Path, capsys) -> tuple[int, str, str]:
    rc = cli.main(["semconv", "generate", "--check", "--registry", str(repo / "semconv")])
    out, err = capsys.readouterr()
    return rc, out, err


def _edit_stage_duration_brief(repo: Path) -> None:
    path = repo / "semconv" / "registry" / "performance.yaml"
    text = path.read_text(encoding="utf-8")
    assert text.count(STAGE_DURATION_BRIEF) == 1
    path.write_text(text.replace(STAGE_DURATION_BRIEF, 'brief: "Wall time of one stage, edited."'), encoding="utf-8")


def test_check_passes_on_an_up_to_date_copy(repo_copy, capsys):
    rc, out, err = _check(repo_copy, capsys)
    assert rc == 0, err
    assert "generate --check: ok" in out


def test_check_reports_the_files_a_brief_edit_changes(repo_copy, capsys):
    before = {p: p.read_bytes() for p in repo_copy.rglob("*") if p.is_file() and "semconv/registry" not in p.as_posix()}
    _edit_stage_duration_brief(repo_copy)
    rc, out, err = _check(repo_copy, capsys)
    assert rc == 1
    reported = {line.strip() for line in err.splitlines() if line.startswith("  ")}
    assert reported == {
        "otel_rl/semconv/metrics.py (differs)",
        "otel_rl/semconv/_tables.py (differs)",
        "docs/semconv/performance.md (differs)",
    }
    assert "out of date" in err
    # --check writes nothing
    assert {p: p.read_bytes() for p in before} == before


def test_write_brings_an_edited_copy_up_to_date(repo_copy, capsys):
    _edit_stage_duration_brief(repo_copy)
    _, files = _codegen.generate(repo_copy)
    written = _codegen.write(repo_copy, files)
    assert {p.as_posix() for p in written} == {"otel_rl/semconv/metrics.py", "otel_rl/semconv/_tables.py", "docs/semconv/performance.md"}
    assert "Wall time of one stage, edited." in (repo_copy / "otel_rl" / "semconv" / "metrics.py").read_text(encoding="utf-8")
    rc, out, err = _check(repo_copy, capsys)
    assert rc == 0, err
    # a second write has nothing left to do
    assert _codegen.write(repo_copy, files) == []


def test_generate_command_writes_then_check_passes(repo_copy, capsys):
    _edit_stage_duration_brief(repo_copy)
    rc = cli.main(["semconv", "generate", "--registry", str(repo_copy / "semconv")])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert "3 of" in out and "otel_rl/semconv/metrics.py" in out
    rc, _, err = _check(repo_copy, capsys)
    assert rc == 0, err


@pytest.mark.parametrize("stale", ["otel_rl/semconv/old_metrics.py", "docs/semconv/old_page.md"])
def test_check_reports_a_stale_generated_file_and_write_removes_it(repo_copy, capsys, stale):
    (repo_copy / stale).write_text(PY_HEADER + "\n", encoding="utf-8")
    rc, _, err = _check(repo_copy, capsys)
    assert rc == 1
    assert f"  {stale} (stale" in err
    _, files = _codegen.generate(repo_copy)
    assert [p.as_posix() for p in _codegen.stale_files(repo_copy, files)] == [stale]
    assert [p.as_posix() for p in _codegen.write(repo_copy, files)] == [stale]
    assert not (repo_copy / stale).exists()
    assert _check(repo_copy, capsys)[0] == 0


def test_check_reports_a_missing_generated_file(repo_copy, capsys):
    (repo_copy / "otel_rl" / "semconv" / "names.py").unlink()
    rc, _, err = _check(repo_copy, capsys)
    assert rc == 1
    assert "  otel_rl/semconv/names.py (missing)" in err


def test_generate_refuses_a_broken_registry(repo_copy, capsys):
    path = repo_copy / "semconv" / "registry" / "performance.yaml"
    path.write_text(path.read_text(encoding="utf-8").replace('unit: "s"', 'unit: "seconds"', 1), encoding="utf-8")
    before = (repo_copy / "otel_rl" / "semconv" / "metrics.py").read_bytes()
    rc = cli.main(["semconv", "generate", "--registry", str(repo_copy / "semconv")])
    _, err = capsys.readouterr()
    assert rc == 1
    assert "[unit-ucum]" in err and "semconv/registry/performance.yaml:" in err
    assert (repo_copy / "otel_rl" / "semconv" / "metrics.py").read_bytes() == before


# ---------------------------------------------------------------------------- awkward registry text


def _render_with_extra_registry_file(tmp_path: Path, text: str) -> dict[str, str]:
    shutil.copytree(SEMCONV, tmp_path / "semconv", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "semconv" / "registry" / "zz_extra.yaml").write_text(text, encoding="utf-8")
    registry, files = _codegen.generate(tmp_path)
    assert [str(p) for p in registry.problems] == []
    return {f.path.as_posix(): f.content for f in files}


def _exec_generated(source: str, name: str) -> dict:
    # relative imports (`from ._tables import BUCKETS`) resolve against the installed package
    namespace: dict = {"__name__": f"otel_rl.semconv.{name}", "__package__": "otel_rl.semconv"}
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - our own generated code
    return namespace


# A brief with double quotes, a backslash, a triple quote and a trailing backslash; a note with both
# kinds of triple quotes. (YAML single-quoted scalars keep backslashes as they are.)
NASTY_BRIEF = 'Has "quotes", a backslash \\ and triple """ quotes, ending in a backslash \\'
NASTY_METRIC = (
    "groups:\n"
    "  - id: metric.rl.quote.test\n"
    "    type: metric\n"
    "    metric_name: rl.quote.test\n"
    "    stability: development\n"
    f"    brief: '{NASTY_BRIEF}'\n"
    "    note: |\n"
    "      A note with \"\"\" and ''' and a backslash \\\n"
    "    instrument: gauge\n"
    '    unit: "1"\n'
)


def test_briefs_with_quotes_and_backslashes_render_valid_python(tmp_path):
    files = _render_with_extra_registry_file(tmp_path, NASTY_METRIC)
    for path, content in files.items():
        if path.endswith(".py"):
            compile(content, path, "exec")
    metrics_ns = _exec_generated(files["otel_rl/semconv/metrics.py"], "generated_metrics")
    assert metrics_ns["RL_QUOTE_TEST"] == "rl.quote.test"
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        gauge = metrics_ns["create_rl_quote_test"](provider.get_meter("t"), callbacks=[lambda o: [Observation(1.0)]])
        assert gauge.description == NASTY_BRIEF
    finally:
        provider.shutdown()


ODD_ENUM_VALUE = """\
groups:
  - id: registry.rl.quote
    type: attribute_group
    stability: development
    brief: "Fixture attributes."
    attributes:
      - id: rl.quote.kind
        type:
          members:
            - id: quoted
              value: 'say "hi"'
              brief: "A value with double quotes."
        stability: development
        brief: "A kind."
"""


def test_enum_member_value_with_a_quote_renders_valid_python(tmp_path):
    files = _render_with_extra_registry_file(tmp_path, ODD_ENUM_VALUE)
    attrs_ns = _exec_generated(files["otel_rl/semconv/attributes.py"], "generated_attributes")
    assert attrs_ns["RlQuoteKindValues"].QUOTED.value == 'say "hi"'


# ---------------------------------------------------------------------------- the generated package


def test_metrics_module_exports_a_constant_and_a_factory_per_metric():
    expected = {constant_name(n) for n in METRIC_NAMES} | {f"create_{constant_name(n).lower()}" for n in METRIC_NAMES}
    assert set(M.__all__) == expected


@pytest.fixture
def meter_and_reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider.get_meter("otel-rl-test-codegen"), reader
    provider.shutdown()


def _collected(reader: InMemoryMetricReader) -> dict:
    data = reader.get_metrics_data()
    return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_factory_creates_the_registry_instrument_on_a_real_meter(name, meter_and_reader):
    meter, reader = meter_and_reader
    group = REGISTRY.metrics[name]
    const = constant_name(name)
    assert getattr(M, const) == name
    factory = getattr(M, f"create_{const.lower()}")
    if group.instrument == "gauge":
        instrument = factory(meter, callbacks=[lambda options: [Observation(0.5)]])
    else:
        instrument = factory(meter)
    assert (instrument.name, instrument.unit, instrument.description) == (name, group.unit, _oneline(group.brief))
    if group.instrument == "histogram":
        instrument.record(0.3)
    elif group.instrument in ("counter", "updowncounter"):
        instrument.add(2)

    metric = _collected(reader)[name]
    assert (metric.unit, metric.description) == (group.unit, _oneline(group.brief))
    data = metric.data
    if group.instrument == "histogram":
        assert isinstance(data, Histogram)
        (point,) = data.data_points
        assert tuple(point.explicit_bounds) == BUCKETS[group.otel_rl["buckets"]]
        assert point.count == 1 and point.sum == pytest.approx(0.3)
    elif group.instrument == "gauge":
        assert isinstance(data, Gauge)
        assert data.data_points[0].value == 0.5
    else:
        assert isinstance(data, Sum)
        assert data.is_monotonic == (group.instrument == "counter")
        assert data.data_points[0].value == 2


def test_stage_duration_factory_uses_duration_buckets(meter_and_reader):
    meter, reader = meter_and_reader
    M.create_rl_stage_duration(meter).record(42.0, {"rl.stage": "generate", "rl.stage.phase": "total"})
    point = _collected(reader)["rl.stage.duration"].data.data_points[0]
    assert point.explicit_bounds[0] == 0.005 and point.explicit_bounds[-1] == 3600.0
    assert dict(point.attributes) == {"rl.stage": "generate", "rl.stage.phase": "total"}
    # 42 s falls in the (30, 60] bucket
    assert point.bucket_counts[list(point.explicit_bounds).index(60.0)] == 1


def test_tables_match_the_registry():
    assert set(_tables.METRICS) == set(METRIC_NAMES)
    for name, mdef in _tables.METRICS.items():
        g = REGISTRY.metrics[name]
        assert (mdef.name, mdef.instrument, mdef.unit) == (name, g.instrument, g.unit)
        assert mdef.attributes == tuple(r.id for r in g.attributes)
        assert mdef.buckets == g.otel_rl.get("buckets")
        assert mdef.direction == g.otel_rl.get("direction")
        assert mdef.floor == g.otel_rl.get("floor")
        danger = g.otel_rl.get("danger") or {}
        assert (mdef.danger_above, mdef.danger_below) == (danger.get("above"), danger.get("below"))
        assert (mdef.danger_why is None) == ("why" not in danger)
        assert mdef.brief == _oneline(g.brief)
    assert _tables.BUCKETS == BUCKETS
    assert _tables.ENUM_MEMBERS == REGISTRY.enum_members()


def test_attribute_constants_name_every_registry_attribute():
    for attr_id in REGISTRY.attributes:
        assert getattr(A, constant_name(attr_id)) == attr_id
    assert A.RL_STAGE == "rl.stage"
    assert A.RL_STAGE_PHASE == "rl.stage.phase"


@pytest.mark.parametrize("attr_id", ENUM_ATTRIBUTES)
def test_enum_class_has_the_registry_members(attr_id):
    cls = getattr(A, enum_class_name(attr_id))
    assert issubclass(cls, str) and issubclass(cls, enum.Enum)
    members = REGISTRY.attributes[attr_id].members
    assert {m.name: m.value for m in cls} == {constant_name(m.id): m.value for m in members}
    assert len(cls) == len(members)


def test_enum_class_examples():
    assert A.RlStageValues.GENERATE == "generate"
    assert A.RlStageValues.GENERATE.value == "generate"
    assert [m.value for m in A.RlStagePhaseValues] == ["total", "onload", "execute", "offload"]
    assert A.GenAiTokenTypeValues.OUTPUT == "output"


def test_span_and_event_names():
    assert N.RL_STEP_SPAN == "rl.step"
    assert N.RL_STAGE_SPAN_TEMPLATE == "rl.<stage>"
    assert N.RL_PHASE_SPAN_TEMPLATE == "rl.<phase>"
    assert N.RL_LOG_EVENT == "rl.log"
    assert N.RL_MEMORY_SNAPSHOT_EVENT == "rl.memory.snapshot"


# ---------------------------------------------------------------------------- naming helpers


@pytest.mark.parametrize(
    ("name", "unit", "instrument", "expected"),
    [
        ("rl.stage.duration", "s", "histogram", "rl_stage_duration_seconds"),
        ("rl.progress.tokens", "{token}", "counter", "rl_progress_tokens_total"),
        ("rl.tensor.nonfinite", "{value}", "counter", "rl_tensor_nonfinite_total"),
        ("rl.loss", "1", "gauge", "rl_loss_ratio"),
        ("rl.throughput.tokens", "{token}/s", "gauge", "rl_throughput_tokens_per_second"),
        ("rl.gpu.memory.usage", "By", "gauge", "rl_gpu_memory_usage_bytes"),
        ("process.memory.usage", "By", "updowncounter", "process_memory_usage_bytes"),
        ("rl.response.length", "{token}", "gauge", "rl_response_length"),
        ("rl.sample.reward", "1", "histogram", "rl_sample_reward"),
        ("rl.stage.time_per_token", "s/{token}", "gauge", "rl_stage_time_per_token_seconds"),
        ("hw.power", "W", "gauge", "hw_power_watts"),
        ("hw.temperature", "Cel", "gauge", "hw_temperature_celsius"),
        ("rl.run.elapsed_time", "s", "gauge", "rl_run_elapsed_time_seconds"),
        ("rl.progress.samples_total", "{sample}", "counter", "rl_progress_samples_total"),
    ],
)
def test_prometheus_name(name, unit, instrument, expected):
    assert prometheus_name(name, unit, instrument) == expected


def test_constant_and_enum_class_names():
    assert constant_name("rl.sample.reward") == "RL_SAMPLE_REWARD"
    assert constant_name("rl.stage") == "RL_STAGE"
    assert constant_name("gen_ai.token.type") == "GEN_AI_TOKEN_TYPE"
    assert enum_class_name("rl.stage") == "RlStageValues"
    assert enum_class_name("rl.stage.phase") == "RlStagePhaseValues"
    assert enum_class_name("gen_ai.token.type") == "GenAiTokenTypeValues"
    # the member `none` of rl.telemetry.reason becomes NONE (not the keyword None)
    assert constant_name("none") == "NONE"
    assert A.RlTelemetryReasonValues.NONE == "none"
