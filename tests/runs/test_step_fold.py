"""A step of a many-rank job read as one trace: each stage's ranks folded into one line with the
slowest, median and fastest rank and the stragglers; --rank R and --ranks expand it."""

from __future__ import annotations

from pathlib import Path

import pytest
from multi_rank_trace import STAGES, TRAIN_STEP_SPAN, write_multi_rank_steps

from otel_rl.cli import main
from otel_rl.runs.folder import find_step_trace, read_spans
from otel_rl.runs.waterfall import FOLD_MIN_RANKS, keep_rank, render_waterfall


@pytest.fixture(scope="module")
def run_64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("run64")
    write_multi_rank_steps(run, 64, steps=(1, 2), straggler=(37, TRAIN_STEP_SPAN))
    return run


def test_each_stage_of_64_ranks_is_one_line_naming_the_straggler(run_64: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(run_64), "--step", "2"]) == 0
    out = capsys.readouterr().out
    assert "385 spans on 7 lines (the ranks of a stage folded)" in out  # 1 root + 64 x (3 stages + 3 phases)
    lines = out.splitlines()
    train = next(i for i, line in enumerate(lines) if TRAIN_STEP_SPAN in line)
    assert "(folded)" in lines[train] and "x64 ranks: slowest rank 37" in lines[train + 1]
    assert "straggler" in lines[train + 1] and "rank 37" in lines[train + 1].split("straggler")[1]
    generate = next(line for line in lines if "x64 ranks" in line and "straggler" not in line)
    assert "median" in generate and "fastest rank" in generate
    assert "orphans" not in out


def test_rank_shows_that_ranks_spans_alone_and_ranks_shows_every_span(run_64: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(run_64), "--step", "2", "--rank", "37"]) == 0
    out = capsys.readouterr().out
    assert "7 spans" in out and "rank 37" in out and "(folded)" not in out  # the step's root and rank 37's six
    assert main(["show", str(run_64), "--step", "2", "--ranks"]) == 0
    assert "385 spans" in (out := capsys.readouterr().out) and "(folded)" not in out and len(out.splitlines()) == 2 + 385
    assert main(["show", str(run_64), "--step", "2", "--rank", "99"]) == 1
    assert "no span of rank 99 in step 2's trace (ranks there: 0-63)" in capsys.readouterr().err
    assert main(["show", str(run_64), "--rank", "3"]) == 2  # the step table has no ranks to expand
    assert "--rank / --ranks needs --step N" in capsys.readouterr().err
    assert main(["trace", str(run_64), "--steps", "1-2", "--format", "chrome", "--out", str(run_64.parent / "c.json"), "--ranks"]) == 2
    assert "--rank / --ranks need --step N" in capsys.readouterr().err


def test_fewer_ranks_than_the_fold_threshold_keep_a_line_each(tmp_path: Path) -> None:
    write_multi_rank_steps(tmp_path, FOLD_MIN_RANKS - 1)
    trace = find_step_trace(read_spans(tmp_path), 1)
    text = render_waterfall(trace)
    assert "(folded)" not in text and len(text.splitlines()) == 2 + len(trace)
    write_multi_rank_steps(tmp_path / "more", FOLD_MIN_RANKS)
    assert "(folded)" in render_waterfall(find_step_trace(read_spans(tmp_path / "more"), 1))


def test_a_stage_run_several_times_a_step_is_judged_by_each_ranks_total(tmp_path: Path) -> None:
    # Three generate / reward / update rounds a step on each of 16 ranks; rank 5's updates take
    # twice as long. The stage's line counts spans and ranks apart, ranks by their total time in
    # it, and names the straggler once, not once per span.
    write_multi_rank_steps(tmp_path, 16, straggler=(5, TRAIN_STEP_SPAN), stages=STAGES * 3)
    text = render_waterfall(find_step_trace(read_spans(tmp_path), 1))
    lines = text.splitlines()
    train = next(i for i, line in enumerate(lines) if TRAIN_STEP_SPAN in line)
    note = lines[train + 1]
    assert "x48 spans on 16 ranks (3 a rank), each rank's total: slowest rank 5" in note, note
    assert note.endswith("rank 5"), note  # the one straggler, named once
    assert "ranks 5, 5" not in text


def test_keep_rank_keeps_the_path_to_the_root(run_64: Path) -> None:
    trace = find_step_trace(read_spans(run_64), 1)
    kept = keep_rank(trace, 5)
    assert len(kept) == 7 and sum(span.parent_span_id is None for span in kept) == 1
