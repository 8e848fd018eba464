"""Readers of what a real telemetry holds, for the DFX tests (imported as `dfx_support`)."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from otel_rl.testing import Capture

# The capture each test's telemetry writes through (tests/dfx/conftest.py fills it).
CAPTURES: weakref.WeakKeyDictionary[Any, Capture] = weakref.WeakKeyDictionary()


def latest(tel: Any, metric: str, attributes: Mapping[str, Any] | None = None) -> float | None:
    """The latest value of a gauge / counter series, as exported after everything queued was processed."""
    return CAPTURES[tel].latest(metric, attributes)


def histogram(tel: Any, metric: str, attributes: Mapping[str, Any] | None = None) -> tuple[int, float] | None:
    """(count, sum) of a histogram series, as exported."""
    return CAPTURES[tel].histogram(metric, attributes)
