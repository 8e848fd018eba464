"""Capture what otel-rl emits, for the tests of code that uses it.

A capture is a real telemetry writing a run folder in a temporary directory; reading it back goes
through the same readers as ``otel-rl show``, so a test sees exactly what an exporter wrote (spans,
``rl.*`` events, metric points), never private state::

    from otel_rl.testing import capture

    def test_my_loop_logs_the_loss():
        with capture(framework="verl") as cap:
            my_training_step(cap.telemetry)
            assert cap.latest("rl.loss", {"rl.loss.type": "policy", "rl.model.role": "actor"}) == 0.5
            assert [s.name for s in cap.spans()] == ["rl.step", ...]

Under pytest, add ``from otel_rl.testing import otel_rl_capture  # noqa: F401`` to a conftest.py and
take ``otel_rl_capture`` as a fixture. A capture is built with ``Telemetry(config)``, not
``init()``: it never replaces the process's own telemetry.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from otel_rl._sdk.settings.config import resolve_config
from otel_rl._sdk.telemetry import Telemetry
from otel_rl.runs.folder import MetricPoint, SpanRecord, read_log_records, read_metrics, read_spans

__all__ = ["Capture", "capture", "otel_rl_capture"]


class Capture:
    """What one telemetry exported; every reader flushes it first."""

    def __init__(self, telemetry: Telemetry, run_dir: Path) -> None:
        self.telemetry = telemetry
        self.run_dir = run_dir

    def spans(self, name: str | None = None) -> list[SpanRecord]:
        """Finished spans in export order, optionally only those named ``name``."""
        self.telemetry.flush()
        return [s for s in read_spans(self.run_dir) if name is None or s.name == name]

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Log records (``event_name``, ``body``, ``attributes``, ...), optionally of one event name."""
        self.telemetry.flush()
        return [r for r in read_log_records(self.run_dir) if name is None or r.get("event_name") == name]

    def points(self, metric: str | None = None) -> list[MetricPoint]:
        """Every exported metric point (each flush exports the current values), optionally of one metric."""
        self.telemetry.flush()
        return [p for p in read_metrics(self.run_dir) if metric is None or p.name == metric]

    def series(self, metric: str) -> list[dict[str, Any]]:
        """The attribute sets ``metric`` was exported with."""
        seen: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
        for point in self.points(metric):
            seen.setdefault(tuple(sorted(point.attributes.items())), dict(point.attributes))
        return list(seen.values())

    def last_point(self, metric: str, attributes: Mapping[str, Any] | None = None) -> MetricPoint | None:
        """The latest exported point of one series (exactly these attributes), or None."""
        wanted = dict(attributes or {})
        matching = [p for p in self.points(metric) if dict(p.attributes) == wanted]
        return matching[-1] if matching else None

    def latest(self, metric: str, attributes: Mapping[str, Any] | None = None) -> float | None:
        """The value of a gauge or counter series as last exported."""
        point = self.last_point(metric, attributes)
        return None if point is None else point.value

    def histogram(self, metric: str, attributes: Mapping[str, Any] | None = None) -> tuple[int, float] | None:
        """``(count, sum)`` of a histogram series as last exported."""
        point = self.last_point(metric, attributes)
        return None if point is None else (int(point.count or 0), float(point.sum or 0.0))


@contextmanager
def capture(run_dir: str | Path | None = None, **options: Any) -> Iterator[Capture]:
    """A telemetry (``init()``'s options; no console line, files only) whose output the
    :class:`Capture` reads back; shut down, and its folder removed unless given, on exit."""
    folder = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="otel-rl-capture-"))
    settings = {"service_name": "otel-rl-test", "console": False, "exporters": "file", **options, "run_dir": str(folder)}
    telemetry = Telemetry(resolve_config(settings))
    try:
        yield Capture(telemetry, folder)
    finally:
        telemetry.shutdown()
        if run_dir is None:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def otel_rl_capture(tmp_path: Path) -> Iterator[Capture]:
    """A :func:`capture` writing under pytest's ``tmp_path``."""
    with capture(tmp_path / "otel-rl") as cap:
        yield cap
