"""Readers of what a real telemetry holds, for the DFX tests (imported as `dfx_support`)."""

from __future__ import annotations

from typing import Any, Mapping


def latest(tel: Any, metric: str, attributes: Mapping[str, Any] | None = None) -> float | None:
    """The latest value of a gauge / counter series, after everything queued was processed."""
    tel.flush()
    return tel.latest(metric, attributes)


def histogram(tel: Any, metric: str, attributes: Mapping[str, Any] | None = None) -> tuple[int, float] | None:
    """(count, sum) of a histogram series, from the telemetry's histogram store."""
    tel.flush()
    snap = tel._histograms.snapshot(metric, tuple(sorted((attributes or {}).items())))
    return None if snap is None else (snap[0], snap[1])
