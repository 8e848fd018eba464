"""Profiler windows (``profile_steps``) and CUDA memory snapshots on the memory-risk alert.

The windows run the real torch.profiler on CPU and read the Chrome trace it writes back. What
needs a CUDA device (NVTX ranges, the allocator's history and snapshots) runs through the same
code with stand-ins for those torch.cuda functions, marked as such below, whose signatures mirror
torch's own (``torch.cuda.memory._record_memory_history(enabled="all", context="all",
stacks="all", max_entries=..., ...)``, ``torch.cuda.memory._dump_snapshot(filename=...)``,
``torch.cuda.nvtx.range_push(msg)`` / ``range_pop()``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl._sdk.settings.config import resolve_config
from otel_rl._sdk.settings.parsers import parse_profile_steps
from otel_rl._sdk.sources.profiling import MEMORY_HISTORY_ENTRIES, MEMORY_RISK_RULE, PROFILES_DIR
from otel_rl.detect.rules import default_rules
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N
from otel_rl.testing import capture

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def _run_steps(tel: otel_rl.Telemetry, steps: range) -> None:
    """A small real loop: each step has a shared stage and one named after the step."""
    for step in steps:
        with tel.step(step):
            with tel.stage("generate"):
                (torch.randn(32, 32) @ torch.randn(32, 32)).sum()
            with tel.stage(f"probe_{step}"):
                torch.randn(16).cumsum(0)


def _annotations(trace_path: str | Path) -> list[str]:
    """The record_function ranges of a Chrome trace torch.profiler wrote (category user_annotation)."""
    data = json.loads(Path(trace_path).read_text())
    return [e["name"] for e in data["traceEvents"] if e.get("cat") == "user_annotation"]


# ------------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("raw", "windows"),
    [
        ("10-12", ((10, 12),)),
        ("5", ((5, 5),)),
        ("5,9-11", ((5, 5), (9, 11))),
        (" 9-11 , 5 ", ((5, 5), (9, 11))),
        ("1-4,3-6,8", ((1, 6), (8, 8))),
        (7, ((7, 7),)),
        ([3, "5-6"], ((3, 3), (5, 6))),
    ],
)
def test_profile_steps_parse(raw: Any, windows: tuple) -> None:
    assert parse_profile_steps(raw) == windows


@pytest.mark.parametrize(
    ("raw", "named"), [("abc", "'abc'"), ("5-3", "'5-3'"), ("-1", "'-1'"), ("2,x-4", "'x-4'"), (True, "True"), (1.5, "1.5")]
)
def test_bad_profile_steps_name_the_bad_part(raw: Any, named: str) -> None:
    with pytest.raises(ValueError, match="10-12") as info:
        parse_profile_steps(raw)
    assert named in str(info.value)


def test_bad_profile_steps_argument_raises_and_bad_env_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match=r"otel_rl.init\(profile_steps='9-2'\)"):
        resolve_config({"profile_steps": "9-2", "run_dir": str(tmp_path)})
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        config = resolve_config({"run_dir": str(tmp_path)}, environ={"OTEL_RL_PROFILE_STEPS": "later"})
    assert config.profile_steps is None
    assert "OTEL_RL_PROFILE_STEPS='later'" in caplog.text
    env = resolve_config({"run_dir": str(tmp_path)}, environ={"OTEL_RL_PROFILE_STEPS": "3,5-6", "OTEL_RL_MEMORY_SNAPSHOT_ON_ALERT": "1"})
    assert env.profile_steps == ((3, 3), (5, 6)) and env.memory_snapshot_on_alert is True
    tel = otel_rl.init(run_dir=str(tmp_path / "init"), console=False, profile_steps="5,9-11")
    try:
        assert tel.config.profile_steps == ((5, 5), (9, 11)) and tel._profiler is not None
    finally:
        tel.shutdown()


# ------------------------------------------------------------------------------------------ windows


def test_window_over_two_of_five_steps_writes_a_trace_named_in_its_step_spans(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="otel_rl"), capture(profile_steps="2-3") as cap:
        _run_steps(cap.telemetry, range(1, 6))
        steps = {s.attributes[A.RL_STEP]: s for s in cap.spans(N.RL_STEP_SPAN)}
        trace = cap.run_dir / PROFILES_DIR / "steps-2-3.rank0.pt.trace.json"
        assert trace.is_file()
        assert {step: span.attributes.get(A.RL_PROFILE_PATH) for step, span in steps.items()} == {
            1: None,
            2: str(trace.resolve()),
            3: str(trace.resolve()),
            4: None,
            5: None,
        }
        names = _annotations(trace)
        # The stages of the profiled steps, as rl.<stage> ranges; none of the steps outside.
        assert sorted(n for n in names if n.startswith("rl.")) == ["rl.generate", "rl.generate", "rl.probe_2", "rl.probe_3"]
        assert list(cap.run_dir.joinpath(PROFILES_DIR).iterdir()) == [trace]  # no memory snapshot: no CUDA
    # CPU only: decided once, said once, at INFO; no NVTX, no memory history.
    no_cuda = [r for r in caplog.records if "CUDA is not available" in r.getMessage()]
    assert len(no_cuda) == 1 and no_cuda[0].levelno == logging.INFO


def test_several_windows_and_one_no_cuda_line(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    pushed: list[str] = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", pushed.append)  # must never be reached on CPU
    with caplog.at_level(logging.INFO, logger="otel_rl"), capture(profile_steps="1,4-5") as cap:
        _run_steps(cap.telemetry, range(1, 7))
        folder = cap.run_dir / PROFILES_DIR
        assert sorted(p.name for p in folder.iterdir()) == ["steps-1.rank0.pt.trace.json", "steps-4-5.rank0.pt.trace.json"]
        assert sorted(n for n in _annotations(folder / "steps-1.rank0.pt.trace.json") if n.startswith("rl.probe")) == ["rl.probe_1"]
        assert sorted(n for n in _annotations(folder / "steps-4-5.rank0.pt.trace.json") if n.startswith("rl.probe")) == [
            "rl.probe_4",
            "rl.probe_5",
        ]
        marked = {s.attributes[A.RL_STEP] for s in cap.spans(N.RL_STEP_SPAN) if A.RL_PROFILE_PATH in s.attributes}
        assert marked == {1, 4, 5}
    assert pushed == []
    assert sum("CUDA is not available" in r.getMessage() for r in caplog.records) == 1


def test_a_window_the_loop_ends_inside_is_written_at_shutdown(tmp_path: Path) -> None:
    with capture(tmp_path / "run", profile_steps="3-10") as cap:
        _run_steps(cap.telemetry, range(1, 5))
        trace = cap.run_dir / PROFILES_DIR / "steps-3-10.rank0.pt.trace.json"
        assert not trace.exists()  # still open
    assert sorted(n for n in _annotations(trace) if n.startswith("rl.probe")) == ["rl.probe_3", "rl.probe_4"]


def test_a_window_the_steps_jump_over_is_closed_or_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="otel_rl"), capture(tmp_path / "run", profile_steps="2,5-6,20") as cap:
        tel = cap.telemetry
        _run_steps(tel, range(4, 7))  # resumed at step 4: the window at step 2 is gone
        _run_steps(tel, range(30, 31))  # 20 never comes
        folder = cap.run_dir / PROFILES_DIR
        assert sorted(p.name for p in folder.iterdir()) == ["steps-5-6.rank0.pt.trace.json"]
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert skipped == [
        "otel-rl: profile window steps-2 skipped: the run is at step 4 already",
        "otel-rl: profile window steps-20 skipped: the run is at step 30 already",
    ]


@pytest.mark.slow
def test_without_profile_steps_a_stage_costs_one_check_and_torch_waits_for_the_window(tmp_path: Path) -> None:
    # A fresh interpreter: otel-rl must not import torch before the first window opens.
    script = textwrap.dedent(
        f"""
        import sys
        from otel_rl.testing import capture
        with capture({str(tmp_path / "off")!r}) as cap:
            assert cap.telemetry._profiler is None
            with cap.telemetry.step(1), cap.telemetry.stage("generate"):
                pass
        assert "torch" not in sys.modules, "imported without a window"
        with capture({str(tmp_path / "on")!r}, profile_steps="3") as cap:
            for step in (1, 2):
                with cap.telemetry.step(step), cap.telemetry.stage("generate"):
                    pass
            assert "torch" not in sys.modules, "imported before the window"
            with cap.telemetry.step(3), cap.telemetry.stage("generate"):
                pass
            assert "torch" in sys.modules
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OTEL_RL_PROFILE_STEPS", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


# ------------------------------------------------------------------- CUDA through stand-ins (no GPU here)


class CudaStandIn:
    """STAND-IN for the CUDA device: the torch.cuda calls otel-rl makes, recorded, with torch's
    signatures. ``_dump_snapshot`` writes a small file where the real one writes its pickle."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.dumps: list[str] = []
        self.nvtx: list[str] = []

    def record_memory_history(
        self, enabled: str | None = "all", context: str | None = "all", stacks: str = "all", max_entries: int = sys.maxsize, **rest: Any
    ) -> None:
        self.history.append({"enabled": enabled, "max_entries": max_entries})

    def dump_snapshot(self, filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
        Path(filename).write_bytes(b"stand-in for torch's allocator snapshot")
        self.dumps.append(filename)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", self.record_memory_history)
        monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", self.dump_snapshot)
        monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda msg: self.nvtx.append(f"push {msg}") or 0)
        monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: self.nvtx.append("pop") or 0)


def _feed_memory_risk(tel: otel_rl.Telemetry) -> None:
    """ROLL's memory keys: peak reserved near the limit while the reserved - allocated gap widens at step 25."""
    prefix = "memory/actor_train/train_step/end/onload"
    for step in range(1, 30):
        gap, util = (2.0, 0.8) if step < 25 else (9.0, 0.95)
        tel.log({f"{prefix}/allocated/0": 60.0, f"{prefix}/reserved/0": 60.0 + gap, f"{prefix}/max_reserved_frac/0": util}, step=step)


def test_the_memory_risk_rule_is_a_default_rule() -> None:
    assert MEMORY_RISK_RULE in {rule.name for rule in default_rules()}


def test_memory_risk_alert_dumps_a_snapshot_into_the_run_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cuda = CudaStandIn()
    cuda.install(monkeypatch)
    fired: list[tuple[str, int | None]] = []
    with capture(tmp_path / "run", framework="roll", memory_snapshot_on_alert=True) as cap:
        assert cuda.history == [{"enabled": "all", "max_entries": MEMORY_HISTORY_ENTRIES}]  # recording from init
        cap.telemetry.on_alert(lambda alert: fired.append((alert.name, alert.step)))
        _feed_memory_risk(cap.telemetry)
        cap.telemetry.flush()
        assert fired == [("memory_risk", 25)]
        expected = cap.run_dir / PROFILES_DIR / "memory-memory_risk-step-25.rank0.pickle"
        assert cuda.dumps == [str(expected)] and expected.is_file()
        alerts = cap.events(N.RL_ALERT_EVENT)
        assert [a["attributes"][A.RL_ALERT_NAME] for a in alerts] == ["memory_risk"]


def test_other_alerts_dump_nothing_and_cpu_says_so_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="otel_rl"), capture(tmp_path / "cpu", framework="roll", memory_snapshot_on_alert=True) as cap:
        _feed_memory_risk(cap.telemetry)  # the alert fires, but there is no CUDA allocator to snapshot
        cap.telemetry.flush()
        assert [a["attributes"][A.RL_ALERT_NAME] for a in cap.events(N.RL_ALERT_EVENT)] == ["memory_risk"]
        assert not (cap.run_dir / PROFILES_DIR).exists()
    lines = [r for r in caplog.records if "no memory snapshots" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO

    cuda = CudaStandIn()
    cuda.install(monkeypatch)
    with capture(tmp_path / "kl", framework="trl", memory_snapshot_on_alert=True) as cap:
        for step in range(1, 21):
            cap.telemetry.log({"kl": 25.0 if step == 15 else 0.02}, step=step)
        cap.telemetry.flush()
        assert [a["attributes"][A.RL_ALERT_NAME] for a in cap.events(N.RL_ALERT_EVENT)] == ["kl_above_threshold"]
    assert cuda.dumps == []


def test_cuda_window_pushes_nvtx_ranges_and_dumps_the_window_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cuda = CudaStandIn()
    cuda.install(monkeypatch)
    with capture(tmp_path / "run", profile_steps="2") as cap:
        _run_steps(cap.telemetry, range(1, 4))
        folder = cap.run_dir / PROFILES_DIR
        # NVTX ranges for the profiled step's stages only, balanced.
        assert cuda.nvtx == ["push rl.generate", "pop", "push rl.probe_2", "pop"]
        # The allocator's history is recorded through the window only, and dumped beside the trace.
        assert cuda.history == [{"enabled": "all", "max_entries": MEMORY_HISTORY_ENTRIES}, {"enabled": None, "max_entries": sys.maxsize}]
        assert cuda.dumps == [str(folder / "steps-2.rank0.memory.pickle")]
        assert sorted(p.name for p in folder.iterdir()) == ["steps-2.rank0.memory.pickle", "steps-2.rank0.pt.trace.json"]


def test_a_rule_with_the_memory_snapshot_action_dumps_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cuda = CudaStandIn()
    cuda.install(monkeypatch)
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  - name: kl_snapshot\n    severity: warning\n    actions: [memory_snapshot]\n    any: [{metric: rl.policy.kl, above: 10}]\n"
    )
    with capture(tmp_path / "run", framework="trl", alert_rules=str(rules), memory_snapshot_on_alert=True) as cap:
        for step in range(1, 21):
            cap.telemetry.log({"kl": 25.0 if step == 15 else 0.02}, step=step)
        cap.telemetry.flush()
        assert cuda.dumps == [str(cap.run_dir / PROFILES_DIR / "memory-kl_snapshot-step-15.rank0.pickle")]


def test_without_torch_the_options_warn_at_init_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import otel_rl._sdk.sources.profiling as profiling

    real = profiling.importlib.util.find_spec
    monkeypatch.setattr(profiling.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with caplog.at_level(logging.WARNING, logger="otel_rl"), capture(profile_steps="1") as cap:
        assert cap.telemetry._profiler is None
        _run_steps(cap.telemetry, range(1, 3))
        assert len(cap.spans(N.RL_STEP_SPAN)) == 2 and not (cap.run_dir / PROFILES_DIR).exists()
    assert "profile_steps needs torch (pip install 'otel-rl[torch]')" in caplog.text
