"""Analyze on extreme values: a failing plot never costs the report; overflowed statistics are never findings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from otel_rl.analyze import analyze


def _log(path: Path) -> Path:
    with open(path, "w") as f:
        for step in range(1, 41):
            huge = 1e308 if step % 2 else -1e308  # finite values whose medians and means overflow
            f.write(json.dumps({"step": step, "data": {"critic/rewards/mean": huge, "actor/pg_loss": 0.1 + 0.001 * step}}) + "\n")
    return path


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_plus_minus_1e308_without_plots(tmp_path: Path) -> None:
    (run,) = analyze([_log(tmp_path / "log.jsonl")], out=tmp_path / "report", plots=False)
    for f in run.findings:
        assert all(math.isfinite(v) for v in (f.baseline, f.scale, f.z)), f.detail
    report = (tmp_path / "report" / "report.md").read_text()
    assert " vs inf" not in report and " vs nan" not in report
    json.loads((tmp_path / "report" / "report.json").read_text())  # strict JSON: no bare NaN / Infinity


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_failing_plot_does_not_cost_the_report(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    (run,) = analyze([_log(tmp_path / "log.jsonl")], out=tmp_path / "report", plots=True)
    assert run.plot_failures and run.plot_failures[0].startswith("critic/rewards/mean: ")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "could not be drawn" in report and run.plot_failures[0] in report
    assert json.loads((tmp_path / "report" / "report.json").read_text())["runs"][0]["plot_failures"] == run.plot_failures
