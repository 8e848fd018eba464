"""Profiler windows: torch.profiler over chosen steps, the stages as ranges inside it, and CUDA
memory snapshots when the memory-risk alert fires.

``profile_steps="10-12"`` (``OTEL_RL_PROFILE_STEPS``; also ``"5"`` or ``"5,9-11"``) starts
torch.profiler when step 10's ``tel.step()`` scope opens and stops it when step 12's closes, then
writes ``<run_dir>/profiles/steps-10-12.rank0.pt.trace.json`` (Chrome trace format: Perfetto,
chrome://tracing, TensorBoard's profiler plugin) and sets ``rl.profile.path`` on the window's
``rl.step`` spans. Inside a window each stage is a ``torch.profiler.record_function("rl.<stage>")``
range and, on CUDA, an NVTX range, so Nsight Systems shows the stages as well (the ranges verl's
``marked_timer`` and NeMo-RL's ``wrap_with_nvtx_name`` push). On CUDA the allocator's history is
recorded through the window and dumped beside the trace (``steps-10-12.rank0.memory.pickle``, for
https://pytorch.org/memory_viz).

``memory_snapshot_on_alert=True`` (``OTEL_RL_MEMORY_SNAPSHOT_ON_ALERT``) records that history for
the whole run and dumps a snapshot each time the ``memory_risk`` alert (or a rule with the
``memory_snapshot`` action) fires; the dump runs in the alert hook, on the telemetry worker.

Cost: with neither option set, ``Telemetry._profiler`` is None and a stage pays one attribute check
on entry and one on exit; torch is imported when a window opens (at init for memory snapshots).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from otel_rl._sdk.settings.parsers import Window
from otel_rl.reporting import ReportOnce
from otel_rl.semconv import attributes as A

logger = logging.getLogger("otel_rl")

PROFILES_DIR = "profiles"
"""The run folder's subfolder for traces and memory snapshots."""
MEMORY_RISK_RULE = "memory_risk"
"""The default alert rule (``otel_rl.detect.rules``) whose firing dumps a memory snapshot."""
SNAPSHOT_ACTION = "memory_snapshot"
"""A rule's action that asks for a memory snapshot too (rules files name it under ``actions``)."""
MEMORY_HISTORY_ENTRIES = 100_000
"""Allocator events kept (torch's ``max_entries``): enough for a few steps, bounded in memory."""
MAX_ALERT_SNAPSHOTS = 5
"""Snapshots dumped on alerts per run: each can be hundreds of MB."""


def window_name(window: Window) -> str:
    """``steps-10-12`` (``steps-5`` for one step): the stem of the window's files."""
    first, last = window
    return f"steps-{first}" if first == last else f"steps-{first}-{last}"


class Profiler:
    """One telemetry's profile windows and memory snapshots (see the module docstring).

    The training thread calls ``step_enter`` / ``step_exit`` from the step scope and, while
    ``active``, ``stage_enter`` / ``stage_exit`` from the stage scope; ``on_alert`` runs on the
    telemetry worker. Nothing here raises into the loop: failures are reported once.
    """

    __slots__ = (
        "active",
        "_windows",
        "_open",
        "_session",
        "_path",
        "_dir",
        "_rank",
        "_torch",
        "_cuda",
        "_for_alerts",
        "_history",
        "_dumps",
        "_report",
    )

    def __init__(self, windows: Iterable[Window], run_dir: str | Path, rank: int) -> None:
        self.active = False  # True while a window is open: the one thing a stage looks at
        self._windows = sorted(windows)  # those not opened yet
        self._open: Window | None = None
        self._session: Any = None  # the torch.profiler.profile of the open window
        self._path: str | None = None  # its trace file
        self._dir = Path(run_dir) / PROFILES_DIR
        self._rank = rank
        self._torch: Any = None
        self._cuda: bool | None = None  # decided at first use
        self._for_alerts = False  # the allocator's history is recorded for alert snapshots
        self._history = False  # ... or for the open window
        self._dumps = 0
        self._report = ReportOnce(logger)

    @classmethod
    def start(cls, tel: Any) -> Profiler | None:
        """The profiler ``tel``'s options ask for, or None (no window, no snapshots: no cost)."""
        config = tel.config
        if not config.profile_steps and not config.memory_snapshot_on_alert:
            return None
        if importlib.util.find_spec("torch") is None:
            # Said at init, not when the window comes; a warning, not an ImportError: the exporters
            # and the worker are running by now, and the run goes on without profiling.
            option = "profile_steps" if config.profile_steps else "memory_snapshot_on_alert"
            logger.warning("otel-rl: %s needs torch (pip install 'otel-rl[torch]'); it is off for this run", option)
            return None
        profiler = cls(config.profile_steps or (), str(config.run_dir), tel.rank)
        if config.memory_snapshot_on_alert:
            profiler._record_history_for_alerts()
            tel.on_alert(profiler.on_alert)
        return profiler

    @staticmethod
    def stop(profiler: Profiler | None) -> None:
        """At shutdown: a window still open (the loop ended inside it) is closed and written."""
        if profiler is not None and profiler._open is not None:
            profiler._close()

    # -- steps (training thread) ----------------------------------------------------------------
    def step_enter(self, step: int, span: Any) -> None:
        """Open a window at its first step; mark the step span of a profiled step with the trace path."""
        if self._open is not None and step > self._open[1]:  # the window's last step never came
            self._close()
        if self._open is None:
            windows = self._windows
            while windows and windows[0][1] < step:
                skipped = windows.pop(0)
                logger.info("otel-rl: profile window %s skipped: the run is at step %d already", window_name(skipped), step)
            if not windows or step < windows[0][0]:
                return
            self._begin(windows.pop(0))
        if self._path is not None:
            span.set_attribute(A.RL_PROFILE_PATH, self._path)

    def step_exit(self, step: int) -> None:
        if self._open is not None and step >= self._open[1]:
            self._close()

    # -- stages (training thread, only while active) --------------------------------------------
    def stage_enter(self, name: str) -> Any:
        """Open the stage's record_function range (and NVTX range on CUDA); what ``stage_exit`` closes."""
        torch = self._torch
        try:
            recorded = torch.profiler.record_function(name)
            recorded.__enter__()
        except Exception as exc:
            self._report("record_function", "otel-rl: torch.profiler.record_function(%r) failed: %r; stages get no ranges", name, exc)
            return None
        if self._cuda:
            try:
                torch.cuda.nvtx.range_push(name)
            except Exception as exc:
                self._report("nvtx", "otel-rl: torch.cuda.nvtx.range_push(%r) failed: %r; no NVTX ranges", name, exc)
                self._cuda = False
                return (recorded, False)
        return (recorded, bool(self._cuda))

    def stage_exit(self, handle: Any) -> None:
        if handle is None:
            return
        recorded, pushed = handle
        try:
            if pushed:
                self._torch.cuda.nvtx.range_pop()
            recorded.__exit__(None, None, None)
        except Exception as exc:
            self._report("stage-exit", "otel-rl: closing a stage's profiler range failed: %r", exc)

    # -- alerts (telemetry worker) --------------------------------------------------------------
    def on_alert(self, alert: Any) -> None:
        """Dump a CUDA memory snapshot when the memory-risk alert (or a ``memory_snapshot`` action) fires."""
        if alert.name != MEMORY_RISK_RULE and SNAPSHOT_ACTION not in getattr(alert, "actions", ()):
            return
        if not self._for_alerts:
            return  # no CUDA: said once at init
        if self._dumps >= MAX_ALERT_SNAPSHOTS:
            self._report("dump-limit", "otel-rl: %d memory snapshots written on alerts; no more this run", MAX_ALERT_SNAPSHOTS)
            return
        self._dumps += 1
        at = f"step-{alert.step}" if alert.step is not None else f"alert-{self._dumps}"
        path = self._dir / f"memory-{alert.name}-{at}.rank{self._rank}.pickle"
        if self._dump(path):
            logger.warning(
                "otel-rl: alert %s at step %s: CUDA memory snapshot in %s (open it at https://pytorch.org/memory_viz)",
                alert.name,
                alert.step,
                path,
            )

    # -- internals ------------------------------------------------------------------------------
    def _import_torch(self) -> Any:
        if self._torch is None:
            self._torch = importlib.import_module("torch")  # torch's presence was checked at init
            self._cuda = bool(self._torch.cuda.is_available())
        return self._torch

    def _record_history_for_alerts(self) -> None:
        self._import_torch()
        if not self._cuda:
            self._report(
                "no-cuda-alerts", "otel-rl: memory_snapshot_on_alert: CUDA is not available; no memory snapshots", level=logging.INFO
            )
            return
        self._for_alerts = self._record_history(True)

    def _record_history(self, on: bool) -> bool:
        try:
            if on:
                self._torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
            else:
                self._torch.cuda.memory._record_memory_history(enabled=None)
            return True
        except Exception as exc:
            self._report("history", "otel-rl: torch.cuda.memory._record_memory_history failed: %r; no memory snapshots", exc)
            return False

    def _dump(self, path: Path) -> bool:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._torch.cuda.memory._dump_snapshot(str(path))
            return True
        except Exception as exc:
            self._report(("dump", type(exc)), "otel-rl: writing the CUDA memory snapshot %s failed: %r", path, exc)
            return False

    def _begin(self, window: Window) -> None:
        torch = self._import_torch()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._cuda:
            # CUDA kernels when this torch's profiler can trace them (a CUDA build with CUPTI).
            activities += [a for a in torch.profiler.supported_activities() if a == torch.profiler.ProfilerActivity.CUDA]
        else:
            self._report(
                "no-cuda",
                "otel-rl: profile window %s: CUDA is not available; CPU activity only, no NVTX ranges, no memory history",
                window_name(window),
                level=logging.INFO,
            )
        path = self._dir / f"{window_name(window)}.rank{self._rank}.pt.trace.json"
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            session = torch.profiler.profile(activities=activities)
            session.start()
        except Exception as exc:
            self._report(("start", window), "otel-rl: torch.profiler could not start for %s: %r; no profile", window_name(window), exc)
            return
        self._history = bool(self._cuda) and not self._for_alerts and self._record_history(True)
        self._open, self._session, self._path = window, session, str(path.resolve())
        self.active = True

    def _close(self) -> None:
        window, session, path = self._open, self._session, self._path
        self.active = False
        self._open = self._session = self._path = None
        if window is None or path is None:
            return
        try:
            session.stop()
            session.export_chrome_trace(path)
            logger.info("otel-rl: profile of %s written to %s", window_name(window), path)
        except Exception as exc:
            self._report(("stop", window), "otel-rl: writing the profile of %s failed: %r", window_name(window), exc)
        if self._history or self._for_alerts:
            self._dump(self._dir / f"{window_name(window)}.rank{self._rank}.memory.pickle")
        if self._history:  # recorded for this window only (the alert snapshots keep theirs on)
            self._history = False
            self._record_history(False)
