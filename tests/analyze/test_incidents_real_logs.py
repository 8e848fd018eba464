"""The report against what a careful engineer sees in each real log: the corpus table.

``benchmarks/analyze_corpus.yaml`` holds, for every log in ../shared/logs (and for public logs named
by repository, path and commit), its outcome events (``expect``: each a warning or critical
incident of the headline, at its steps), what must not be called a problem (``not_alarms``), what
the scale leaves as information but the report must still hold (``noted``), and whether it is a
healthy control. ``python -m otel_rl.analyze.corpus ../shared/logs`` scores any folder against it;
these tests score the shared logs, every one of them.
"""

from __future__ import annotations

import pytest
from shared_files import COLLAPSE, KL_SPIKE, LOGS, REWARD_COLLAPSE, SPARSE, needs_shared_logs

from otel_rl.analyze import analyze
from otel_rl.analyze.corpus import load_table, score

pytestmark = needs_shared_logs

TABLE = {e.file: e for e in load_table()}
SHARED = sorted(name for name, e in TABLE.items() if e.raw.get("where") == "shared")

_RUNS: dict[str, object] = {}


def run_of(name: str):
    if name not in _RUNS:
        (_RUNS[name],) = analyze([LOGS / name], plots=False)
    return _RUNS[name]


def serious(incident) -> bool:
    return incident.severity in ("warning", "critical")


def test_every_shared_log_is_in_the_corpus_table() -> None:
    logs = {p.name for p in LOGS.iterdir() if p.is_file() and p.name != "README.md"}
    assert logs == set(SHARED), (
        f"shared logs without an entry: {sorted(logs - set(SHARED))}; entries without a log: {sorted(set(SHARED) - logs)}"
    )


def test_the_table_holds_healthy_controls_and_public_logs_with_their_source() -> None:
    assert sum(e.healthy for e in TABLE.values()) >= 8
    for e in TABLE.values():
        if e.raw.get("where") == "public":
            assert {"repo", "path", "commit"} <= set(e.source), e.file
            assert e.raw.get("first_contact") is None or "passed" in e.raw["first_contact"], e.file


@pytest.mark.parametrize("name", SHARED)
def test_each_shared_log_passes_its_corpus_entry(name: str) -> None:
    result = score(run_of(name), TABLE[name])
    assert result.passed, f"{name}:\n  " + "\n  ".join(result.failures) + "\n headline:\n  " + "\n  ".join(result.headline)


@pytest.mark.parametrize("name", SHARED)
def test_the_verdict_names_the_top_incident_of_every_headline(name: str) -> None:
    run = run_of(name)
    if run.headline and serious(run.headline[0]) and run.verdict.stable != "unknown":
        assert run.headline[0].name in run.verdict.stable_text


@pytest.mark.parametrize("name", [n for n in SHARED if TABLE[n].healthy])
def test_healthy_controls_have_no_warning_or_critical_incident(name: str) -> None:
    run = run_of(name)
    assert not [i.text for i in run.incidents if serious(i)]
    assert run.verdict.stable == "stable", run.verdict.stable_text


def test_a_score_fails_when_an_expected_event_is_missing_or_a_healthy_run_alarms() -> None:
    # The scorer itself can fail: the collapse log judged as if it were a healthy control, and the
    # healthy log held to the collapse log's events, both fail.
    import dataclasses

    collapse = TABLE[COLLAPSE]
    as_healthy = dataclasses.replace(collapse, healthy=True, expect=[])
    assert not score(run_of(COLLAPSE), as_healthy).passed
    healthy = next(n for n in SHARED if TABLE[n].healthy and TABLE[n].raw.get("framework") == "verl")
    with_events = dataclasses.replace(TABLE[healthy], expect=collapse.expect)
    assert not score(run_of(healthy), with_events).passed
    # A healthy control of which nothing was read is no pass either (its verdict is only "not judged").
    unread = analyze([LOGS / healthy], plots=False)[0]
    unread.parsed.records = []
    result = score(unread, TABLE[healthy])
    assert not result.passed and result.failures == ["not read: no logged step was read"]


def test_a_reward_sparse_from_its_first_step_is_a_held_condition_not_a_collapse() -> None:
    # 84 of 100 steps at 0 and isolated hits of 0.0625 / 0.125 from step 1 on (README): the first
    # two hits are the same hits, not a level the run fell from at step 2.
    run = run_of(SPARSE)
    assert run.verdict.stable_text.startswith("Critical condition"), run.verdict.stable_text
    assert "collapse" not in run.verdict.stable_text


def test_a_change_that_ends_in_a_held_condition_says_so_in_the_verdict() -> None:
    # The README: the collapse log's score sits at -1 from the collapse (steps 4-21) to the end, and
    # the reward-collapse log stays at 0 from s30 to s200: the steps of the change alone undersell it.
    for name in (COLLAPSE, REWARD_COLLAPSE):
        text = run_of(name).verdict.stable_text
        assert "then held to the end" in text, (name, text)
    assert "then held" not in run_of(KL_SPIKE).verdict.stable_text  # a spike that came back


def test_a_sparse_reward_explains_its_gradient_spikes_and_a_collapsed_one_does_not() -> None:
    # The sparse-reward run's gradient spikes sit on its 16 hits (README): explained, information. The
    # collapse log's score sits at its floor on 96% of the steps too, but it fell there: its early values
    # are no "hits", and its gradient spikes at s10 and s15 are part of the collapse.
    sparse = [i for i in run_of(SPARSE).incidents if "gradient-norm" in i.name]
    assert sparse and all(i.severity == "info" and "sparse reward's few hits" in i.text for i in sparse), [i.text for i in sparse]
    assert not [i.text for i in run_of(COLLAPSE).incidents if "sparse reward" in i.text]
