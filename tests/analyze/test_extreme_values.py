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


def test_a_run_of_nan_gradient_norms_and_infinite_kl_is_not_stable(tmp_path: Path) -> None:
    """300 steps, 14% NaN grad norms and 9% infinite KL, the reward rising: each non-finite training
    signal is a critical headline incident naming its steps, and the verdict is not "Stable"."""
    import numpy as np

    rng = np.random.default_rng(0)
    nan_steps, inf_steps = set(), set()
    lines = []
    for step in range(1, 301):
        grad, kl = 0.3 + 0.05 * rng.standard_normal(), 0.01 + 0.001 * rng.standard_normal()
        if rng.random() < 0.14:
            grad = math.nan
            nan_steps.add(step)
        if rng.random() < 0.09:
            kl = math.inf
            inf_steps.add(step)
        lines.append(f"step:{step} - actor/grad_norm:{grad} - actor/kl_loss:{kl} - critic/score/mean:{0.3 + step / 1000:.4f}")
    log = tmp_path / "nan.log"
    log.write_text("\n".join(lines) + "\n")
    (run,) = analyze([log], plots=False)
    assert run.verdict is not None and run.verdict.stable not in ("stable", "unknown"), run.verdict.stable_text
    nonfinite = [i for i in run.headline if i.severity == "critical" and i.name.startswith("non-finite")]
    grad = next(i for i in nonfinite if "gradient" in i.name)
    kl = next(i for i in nonfinite if "KL" in i.name)
    assert f"{len(nan_steps)} of 300" in grad.text and "NaN" in grad.text and grad.first_step == min(nan_steps)
    assert f"{len(inf_steps)} of 300" in kl.text and "infinite" in kl.text and kl.first_step == min(inf_steps)
