"""The registry checker (otel_rl.codegen.registry): the real registry is clean, and every rule catches its
own mistake at the right file and line.

Broken registries are built in tmp_path: the real ``semconv/registry`` is copied and ONE thing is
added (a fixture file from tests/fixtures/broken_registry/) or edited in place. Each fixture marks
the line the problem must be reported at with ``# EXPECT``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from otel_rl.codegen.registry import Problem, is_ucum, load_registry

REPO_ROOT = Path(__file__).resolve().parents[1]
SEMCONV = REPO_ROOT / "semconv"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "broken_registry"


def _copy_registry(tmp_path: Path) -> Path:
    semconv = tmp_path / "semconv"
    shutil.copytree(SEMCONV / "registry", semconv / "registry")
    return semconv


def _marked_line(text: str) -> int:
    lines = [n for n, line in enumerate(text.splitlines(), start=1) if "# EXPECT" in line]
    assert len(lines) == 1, "a fixture marks exactly one line with '# EXPECT'"
    return lines[0]


def _line_of(text: str, needle: str) -> int:
    lines = [n for n, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(lines) == 1, f"{needle!r} occurs {len(lines)} times"
    return lines[0]


# ---------------------------------------------------------------------------- the real registry


@pytest.fixture(scope="module")
def real_registry():
    return load_registry(SEMCONV)


def test_real_registry_has_no_problems(real_registry):
    assert [str(p) for p in real_registry.problems] == []


def test_real_registry_defines_stage_duration(real_registry):
    g = real_registry.metrics["rl.stage.duration"]
    assert (g.id, g.type, g.instrument, g.unit) == ("metric.rl.stage.duration", "metric", "histogram", "s")
    assert g.otel_rl["buckets"] == "duration"
    assert g.otel_rl["direction"] == "lower"
    assert g.stability == "development"
    assert {r.id: r.requirement_level for r in g.attributes} == {
        "rl.stage": "required",
        "rl.cluster": "conditionally_required",
        "rl.stage.phase": "required",
    }
    assert g.file == "semconv/registry/performance.yaml"
    text = (SEMCONV / "registry" / "performance.yaml").read_text(encoding="utf-8")
    assert g.line == _line_of(text, "- id: metric.rl.stage.duration")


def test_real_registry_stage_attribute_is_an_enum_with_the_spec_members(real_registry):
    stage = real_registry.attributes["rl.stage"]
    assert stage.type == "enum"
    assert set(real_registry.enum_members()["rl.stage"]) >= {
        "rollout",
        "generate",
        "compute_rewards",
        "compute_log_probs",
        "compute_ref_log_probs",
        "compute_values",
        "advantage",
        "train_step",
        "model_update",
        "do_checkpoint",
        "validation",
    }
    assert real_registry.enum_members()["rl.stage.phase"] == ("total", "onload", "execute", "offload")


# Every metric of the spec (name, instrument, unit). The registry must define exactly these.
SPEC_METRICS = """
rl.validation.score gauge 1
rl.learning_rate gauge 1
rl.loss gauge 1
rl.grad_norm gauge 1
rl.critic.prediction gauge 1
rl.critic.error gauge 1
rl.critic.explained_variance gauge 1
rl.clip.fraction gauge 1
rl.score gauge 1
rl.reward gauge 1
rl.reward.component gauge 1
rl.reward.zero_std_ratio gauge 1
rl.advantage gauge 1
rl.return gauge 1
rl.value gauge 1
rl.policy.ratio gauge 1
rl.policy.kl gauge 1
rl.policy.entropy gauge 1
rl.logprob gauge 1
rl.batch.samples gauge {sample}
rl.batch.valid_samples gauge {sample}
rl.batch.valid_ratio gauge 1
rl.sample.weight gauge 1
rl.response.length gauge {token}
rl.response.terminated_length gauge {token}
rl.prompt.length gauge {token}
rl.response.clipped_ratio gauge 1
rl.response.mask_ratio gauge 1
rl.sample.response_length histogram {token}
rl.sample.prompt_length histogram {token}
rl.sample.reward histogram 1
rl.sample.advantage histogram 1
rl.sample.policy_lag histogram {version}
rl.throughput.tokens gauge {token}/s
rl.throughput.samples gauge {sample}/s
rl.throughput.steps gauge {step}/s
rl.progress.step gauge {step}
rl.progress.max_steps gauge {step}
rl.progress.epoch gauge 1
rl.progress.ratio gauge 1
rl.progress.samples counter {sample}
rl.progress.tokens counter {token}
rl.step.tokens gauge {token}
rl.run.elapsed_time gauge s
rl.run.remaining_time gauge s
rl.step.duration histogram s
rl.step.goodput.duration histogram s
rl.step.goodput.ratio gauge 1
rl.stage.duration histogram s
rl.stage.time_per_token gauge s/{token}
rl.compute.duration histogram s
rl.mfu gauge 1
rl.sm_activity gauge 1
rl.pipeline.bubble_ratio gauge 1
rl.gpu.memory.usage gauge By
rl.gpu.memory.utilization gauge 1
rl.gpu.memory.fragmentation gauge 1
rl.gpu.memory.activation_peak gauge By
rl.gpu.memory.kv_cache_peak gauge By
rl.gpu.memory.comm_buffer_peak gauge By
process.memory.usage updowncounter By
process.memory.virtual updowncounter By
process.cpu.utilization gauge 1
hw.gpu.utilization gauge 1
hw.gpu.memory.usage updowncounter By
hw.gpu.memory.limit updowncounter By
hw.power gauge W
hw.temperature gauge Cel
rl.tensor.nonfinite counter {value}
rl.tensor.checksum gauge 1
rl.shape_ledger.mismatches counter {mismatch}
rl.batch.token_misaligned counter {sample}
rl.batch.id_misaligned counter {sample}
rl.rank.tokens gauge {token}
rl.rank.active_time gauge s
rl.rank.idle_time gauge s
rl.rank.communication_time gauge s
rl.queue.depth gauge {sample}
rl.straggler.rank gauge {rank}
rl.straggler.margin gauge 1
rl.rollout.tokens counter {token}
gen_ai.server.request.duration histogram s
gen_ai.server.time_to_first_token histogram s
gen_ai.server.time_per_output_token histogram s
rl.rollout.kv_cache.utilization gauge 1
rl.rollout.abort_ratio gauge 1
rl.rollout.timeout_ratio gauge 1
rl.reward.duration histogram s
rl.reward.batch_tokens gauge {token}
rl.reward.exceptions counter {exception}
rl.reward.throughput gauge {token}/s
rl.logprob.micro_batch_tokens histogram {token}
rl.logprob.shape gauge 1
rl.async.policy_lag gauge {version}
rl.async.stale_sample_ratio gauge 1
rl.unmapped gauge 1
rl.telemetry.rejected counter {value}
rl.telemetry.dropped counter {item}
rl.telemetry.spool.usage gauge By
rl.kl.coefficient gauge 1
rl.prompt.clipped_ratio gauge 1
rl.response.non_aborted_length gauge {token}
rl.response.non_aborted_clipped_ratio gauge 1
rl.rollout.sample.duration gauge s
rl.rollout.preemptions gauge {preemption}
rl.rollout.engine.preemptions counter {preemption}
rl.rollout.requests gauge {request}
rl.run.flops counter {flop}
rl.run.loss gauge 1
rl.alert counter {alert}
rl.trajectory.duration histogram s
rl.turn.duration histogram s
rl.tool.duration histogram s
rl.trajectory.turns histogram {turn}
rl.trajectory.tool_calls histogram {call}
rl.trajectory.count counter {trajectory}
rl.train_infer.logprob.abs_diff gauge 1
rl.train_infer.prob.abs_diff gauge 1
rl.train_infer.kl gauge 1
rl.train_infer.importance_ratio gauge 1
rl.train_infer.nonfinite_ratio gauge 1
"""


def test_real_registry_defines_every_spec_metric_with_its_instrument_and_unit(real_registry):
    expected = {name: (instrument, unit) for name, instrument, unit in (l.split() for l in SPEC_METRICS.strip().splitlines())}
    actual = {name: (g.instrument, g.unit) for name, g in real_registry.metrics.items()}
    assert actual == expected


def test_real_registry_histograms_have_bucket_sets_and_no_metric_carries_rl_step(real_registry):
    for name, g in real_registry.metrics.items():
        assert "rl.step" not in {r.id for r in g.attributes}, name
        if g.instrument == "histogram":
            assert g.otel_rl.get("buckets") in ("duration", "tokens", "signed", "ratio", "count"), name


# ---------------------------------------------------------------------------- one rule per fixture

FIXTURE_CASES = [
    ("duplicate_metric", "unique-id"),
    ("unit_in_name", "unit-in-name"),
    ("unit_in_name_segment", "unit-in-name"),
    ("unit_not_ucum", "unit-ucum"),
    ("bad_instrument", "instrument"),
    ("unknown_attribute_ref", "attribute-ref"),
    ("missing_brief", "brief-required"),
    ("missing_attribute_brief", "brief-required"),
    ("missing_stability", "stability"),
    ("bad_requirement_level", "requirement-level"),
    ("uppercase_attribute_id", "name-format"),
    ("uppercase_metric_name", "name-format"),
    ("step_on_metric", "high-cardinality"),
    ("histogram_without_buckets", "histogram-buckets"),
    ("histogram_unknown_buckets", "histogram-buckets"),
    ("yaml_syntax", "yaml-syntax"),
    ("foreign_attribute_namespace", "namespace"),
    ("foreign_metric_namespace", "namespace"),
    ("metric_group_id", "metric-group-id"),
    ("unknown_field", "unknown-field"),
    ("missing_id", "id-required"),
    ("bad_group_type", "group-type"),
    ("enum_without_members", "enum-members"),
    ("duplicate_enum_member", "unique-id"),
    ("duplicate_attribute", "unique-id"),
    ("bad_attribute_type", "attribute-type"),
    ("event_without_name", "event-name"),
    ("metric_without_name", "metric-name"),
    ("bad_direction", "direction"),
    ("bad_danger", "danger"),
    ("bad_floor", "floor"),
    ("not_a_groups_list", "schema"),
]


def test_every_fixture_is_used():
    on_disk = {p.stem for p in FIXTURES.glob("*.yaml")}
    assert on_disk == {case for case, _ in FIXTURE_CASES} | {"valid_metric"}


def _problems_with_fixture(tmp_path: Path, case: str) -> tuple[list[Problem], str, int]:
    semconv = _copy_registry(tmp_path)
    text = (FIXTURES / f"{case}.yaml").read_text(encoding="utf-8")
    # "zz_" sorts after every real file, so duplicates are reported on the fixture, not the original.
    (semconv / "registry" / f"zz_{case}.yaml").write_text(text, encoding="utf-8")
    line = _marked_line(text) if "# EXPECT" in text else 0
    return load_registry(semconv).problems, f"semconv/registry/zz_{case}.yaml", line


@pytest.mark.parametrize(("case", "rule"), FIXTURE_CASES, ids=[c for c, _ in FIXTURE_CASES])
def test_broken_fixture_reports_its_rule_at_the_offending_line(tmp_path, case, rule):
    problems, file, line = _problems_with_fixture(tmp_path, case)
    assert problems, f"{case}: no problem reported"
    # Exactly this rule at exactly this place, and nothing else anywhere in the registry.
    assert {(p.file, p.line, p.rule) for p in problems} == {(file, line, rule)}, [str(p) for p in problems]
    for p in problems:
        assert str(p).startswith(f"{file}:{line}: [{rule}] ")
        assert p.message


def test_valid_fixture_adds_no_problem(tmp_path):
    problems, _, _ = _problems_with_fixture(tmp_path, "valid_metric")
    assert problems == []


def test_duplicate_metric_names_the_first_definition(tmp_path):
    problems, _, _ = _problems_with_fixture(tmp_path, "duplicate_metric")
    text = (SEMCONV / "registry" / "performance.yaml").read_text(encoding="utf-8")
    first = f"semconv/registry/performance.yaml:{_line_of(text, '- id: metric.rl.stage.duration')}"
    messages = [p.message for p in problems]
    assert any("metric `rl.stage.duration`" in m and first in m for m in messages), messages


def test_unknown_attribute_ref_names_the_attribute(tmp_path):
    problems, _, _ = _problems_with_fixture(tmp_path, "unknown_attribute_ref")
    assert len(problems) == 1 and "rl.no_such_attribute" in problems[0].message


# ---------------------------------------------------------------------------- edits of real files

# (file, the group's "- id:" line, old text inside that group, new text, rule)
IN_PLACE_CASES = [
    ("performance.yaml", "- id: metric.rl.stage.duration", '    brief: "Wall time of one stage or stage phase."\n', "", "brief-required"),
    (
        "performance.yaml",
        "- id: metric.rl.stage.duration",
        'instrument: histogram\n    unit: "s"',
        'instrument: histogram\n    unit: "seconds"',
        "unit-ucum",
    ),
    ("performance.yaml", "- id: metric.rl.stage.duration", "instrument: histogram\n", "instrument: timer\n", "instrument"),
    (
        "performance.yaml",
        "- id: metric.rl.stage.duration",
        "metric_name: rl.stage.duration\n",
        "metric_name: rl.stage.duration_seconds\n",
        "metric-group-id",
    ),
]


@pytest.mark.parametrize(("file", "anchor", "old", "new", "rule"), IN_PLACE_CASES, ids=[c[-1] for c in IN_PLACE_CASES])
def test_edit_in_a_real_file_is_reported_at_its_group(tmp_path, file, anchor, old, new, rule):
    semconv = _copy_registry(tmp_path)
    path = semconv / "registry" / file
    text = path.read_text(encoding="utf-8")
    start = text.index(anchor)
    at = text.index(old, start)
    assert text.find("- id:", start + 1) > at, "the edit must fall inside the anchored group"
    edited = text[:at] + new + text[at + len(old) :]
    path.write_text(edited, encoding="utf-8")
    problems = load_registry(semconv).problems
    line = _line_of(edited, anchor)
    assert (f"semconv/registry/{file}", line, rule) in {(p.file, p.line, p.rule) for p in problems}, [str(p) for p in problems]


def test_metric_name_with_unit_word_is_reported_even_when_the_group_id_matches(tmp_path):
    semconv = _copy_registry(tmp_path)
    path = semconv / "registry" / "performance.yaml"
    text = path.read_text(encoding="utf-8").replace("rl.stage.duration", "rl.stage.duration_seconds")
    path.write_text(text, encoding="utf-8")
    problems = load_registry(semconv).problems
    line = _line_of(text, "- id: metric.rl.stage.duration_seconds")
    assert {(p.file, p.line, p.rule) for p in problems} == {("semconv/registry/performance.yaml", line, "unit-in-name")}


def test_problem_str_is_file_line_rule_message():
    assert str(Problem("semconv/registry/a.yaml", 12, "unit-ucum", "bad unit")) == "semconv/registry/a.yaml:12: [unit-ucum] bad unit"


def test_empty_registry_folder_is_a_problem(tmp_path):
    (tmp_path / "semconv" / "registry").mkdir(parents=True)
    problems = load_registry(tmp_path / "semconv").problems
    assert [p.rule for p in problems] == ["no-files"]


# ---------------------------------------------------------------------------- UCUM units


@pytest.mark.parametrize(
    "unit",
    [
        "s",
        "By",
        "1",
        "{token}",
        "{token}/s",
        "s/{token}",
        "Cel",
        "W",
        "ms",
        "KiBy",
        "{sample}/s",
        "%",
        "Hz",
        "GiBy",
        "us",
        "min",
        "s^2",
        "By/s",
        "1/s",
    ],
)
def test_is_ucum_accepts(unit):
    assert is_ucum(unit) is True


@pytest.mark.parametrize(
    "unit",
    ["seconds", "", " s", "s ", "tokens/s", "sec", "bytes", "by", "cel", "{token", "{tok en}", "{}", "/s", "s/", "s//s", "tokens", "m"],
)
def test_is_ucum_rejects(unit):
    assert is_ucum(unit) is False
