"""``init()``'s options in groups: where telemetry goes, which trackers it feeds, its limits, its alerts.

Each group is a small frozen dataclass whose fields are ``init()``'s flat keywords of that group
(the same names, the same environment variables); a field left at ``None`` is not given. The flat
keywords keep working; giving one both flat and in a group is an error that names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    """Where telemetry goes and how fast: ``exporters`` (``auto``, ``file``, ``otlp``, ``none``), the
    OTLP ``endpoint`` and ``protocol``, the metric export interval, the run folder's flush bound, the
    disk spool, and whether log() values become points at their own time."""

    exporters: str | list[str] | tuple[str, ...] | None = None
    endpoint: str | None = None
    protocol: str | None = None
    metric_export_interval_s: float | None = None
    file_flush_interval_s: float | None = None
    spool_dir: str | None = None
    spool_max_bytes: int | str | None = None
    metrics_at_log_time: bool | None = None


@dataclass(frozen=True, kw_only=True)
class TrackerOptions:
    """The experiment trackers fed with each step (``track_with``, their ``tracker_kwargs``), the keys
    they show, and whether every rank feeds them."""

    track_with: str | list[str] | None = None
    # Tracker settings hold credentials: never in repr().
    tracker_kwargs: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    tracker_keys: str | None = None
    tracker_all_ranks: bool | None = None


@dataclass(frozen=True, kw_only=True)
class LimitOptions:
    """What one process may put into telemetry: series per metric, unmapped keys, the worker's queue,
    string attribute length, whether text reaches exported events, the rollout samples kept per step,
    and the agent trajectories kept as traces."""

    series_limit: int | None = None
    per_rank_metrics: str | list[str] | None = None
    unmapped_key_limit: int | None = None
    max_queue: int | None = None
    attribute_value_limit: int | None = None
    export_text: bool | None = None
    log_samples: int | None = None
    sample_text_limit: int | None = None
    trajectory_sample_ratio: float | None = None
    trajectory_keep_slowest: int | None = None
    trajectory_limit: int | None = None


@dataclass(frozen=True, kw_only=True)
class AlertOptions:
    """Online alerts: the rules (``default``, ``off`` or a YAML file) and the hooks called per alert."""

    alert_rules: str | None = None
    on_alert: Callable[[Any], Any] | Sequence[Callable[[Any], Any]] | None = None


def merge_groups(flat: dict[str, Any], *groups: Any) -> dict[str, Any]:
    """``flat`` (init()'s keywords that were given) with each group's given fields added."""
    merged = dict(flat)
    for group in groups:
        if group is None:
            continue
        for option in dataclasses.fields(group):
            value = getattr(group, option.name)
            if value is None:
                continue
            if merged.get(option.name) is not None:
                raise TypeError(f"otel_rl.init() got {option.name} twice: as a keyword and in {type(group).__name__}; give it once")
            merged[option.name] = value
    return merged
