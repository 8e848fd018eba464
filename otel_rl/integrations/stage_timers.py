"""A framework's step timers as stage spans: each timer key's ``rl.stage`` and ``rl.cluster`` come
from the framework's key mapping (``semconv/mappings/<framework>.yaml``), so a step's trace and its
``rl.stage.duration`` metrics name a stage alike.

Imports no framework: ``otel-rl replay`` uses it too. Used with ``Telemetry.trace_finished_step``
by the verl, OpenRLHF and AReaL integrations, which time their stages themselves and log the seconds
once the step is over.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from otel_rl.semconv import attributes as A


def timed_stages(values: Mapping[str, Any], keys: Sequence[str], framework: str) -> list[tuple[str, Any, str | None]]:
    """``[(rl.stage, seconds, rl.cluster), ...]`` of the timer ``keys`` present in one logged step,
    in the order of ``keys`` (the order the framework runs them)."""
    stages = []
    for key in keys:
        seconds = values.get(key)
        if seconds is not None:
            stage, cluster = stage_of(key, framework)
            stages.append((stage, seconds, cluster))
    return stages


@functools.cache
def stage_of(key: str, framework: str) -> tuple[str, str | None]:
    """(rl.stage, rl.cluster) of a timer key through ``framework``'s mapping; a key the mapping
    does not name a stage for keeps its last segment (``timing_s/gen_max`` -> ``gen_max``)."""
    from otel_rl._sdk.keys.resolver import KeyResolver

    attributes = dict(KeyResolver.default().resolve(key, framework).attributes)
    cluster = attributes.get(A.RL_CLUSTER)
    return str(attributes.get(A.RL_STAGE, key.rsplit("/", 1)[-1])), None if cluster is None else str(cluster)
