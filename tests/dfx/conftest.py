"""Fixtures of the DFX tests: a real telemetry and the StepStats that writes to it."""

from __future__ import annotations

import pytest

from otel_rl import dfx


@pytest.fixture
def tel(make_telemetry):
    """A real otel_rl telemetry writing its run folder under tmp_path (no console line)."""
    return make_telemetry()


@pytest.fixture
def stats(tel) -> dfx.StepStats:
    return dfx.StepStats(tel)
