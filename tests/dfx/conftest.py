"""Fixtures of the DFX tests: a real telemetry and the StepStats that writes to it."""

from __future__ import annotations

import dfx_support
import pytest

from otel_rl import dfx
from otel_rl.testing import otel_rl_capture  # noqa: F401 - the fixture


@pytest.fixture
def tel(otel_rl_capture):
    """A real otel_rl telemetry writing its run folder under tmp_path (no console line), read back
    through otel_rl.testing's capture."""
    dfx_support.CAPTURES[otel_rl_capture.telemetry] = otel_rl_capture
    return otel_rl_capture.telemetry


@pytest.fixture
def stats(tel) -> dfx.StepStats:
    return dfx.StepStats(tel)
