"""A run that logs new key names every step (a step counter or a sample id inside the key) holds
bounded memory and prints a bounded number of lines: everything kept per key is capped, and what
goes past a cap is counted and summarized, never one line per key."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from otel_rl._sdk.keys.resolver import NAMED_UNMAPPED, RESOLUTION_CACHE_LIMIT
from otel_rl._sdk.pipeline.step_plan import KEY_SET_KEYS
from otel_rl._sdk.pipeline.worker import REPORTED_KEYS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.trackers.base import NAME_CACHE_LIMIT

STEPS, KEYS_PER_STEP = 200, 1_000  # 200,000 distinct keys
LIMIT = 16  # unmapped_key_limit


def _containers(owner: Any, seen: set[int], depth: int = 0) -> list[tuple[str, int]]:
    """(where, size) of every dict, set, list and deque reachable from ``owner``'s attributes, a
    few levels deep: whatever holds something per key shows up here, however it is named."""
    found: list[tuple[str, int]] = []
    if id(owner) in seen or depth > 3:
        return found
    seen.add(id(owner))
    try:
        attributes = vars(owner)
    except TypeError:
        return found
    for name, value in attributes.items():
        if isinstance(value, (dict, set, frozenset, list, deque)):
            found.append((f"{type(owner).__name__}.{name}", len(value)))
        elif type(value).__module__.startswith("otel_rl."):
            found.extend(_containers(value, seen, depth + 1))
    return found


def test_two_hundred_thousand_distinct_keys_keep_every_per_key_structure_at_its_cap(make_telemetry, caplog) -> None:
    caplog.set_level(logging.INFO, logger="otel_rl")
    # a tracker fed with the keys' registry names too: the fan-out keeps a name per key
    tel = make_telemetry(unmapped_key_limit=LIMIT, track_with="jsonl", tracker_keys="registry")
    for step in range(STEPS):
        tel.log({f"sample/{step}/{i}/score": float(i) for i in range(KEYS_PER_STEP)}, step=step)
        if step % 20 == 19:
            tel.flush()  # a worker that keeps up (a backlog is another test's business)
    tel.flush()

    sizes = _containers(tel, set())
    largest = max(size for _, size in sizes)
    assert largest <= max(RESOLUTION_CACHE_LIMIT, KEY_SET_KEYS), sorted(sizes, key=lambda s: -s[1])[:5]
    assert largest < STEPS * KEYS_PER_STEP // 3  # nothing grows with the keys
    assert len(tel._resolver.unmapped_keys) == LIMIT
    assert len(tel._latest.series(M.RL_UNMAPPED)) == LIMIT
    assert len(tel._pipeline._reported) <= REPORTED_KEYS
    assert 0 < len(tel._trackers._names) <= NAME_CACHE_LIMIT
    assert tel._pipeline.step_plans.keys_held <= KEY_SET_KEYS

    overflow = STEPS * KEYS_PER_STEP - LIMIT
    assert tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: "unmapped_overflow"}) == overflow
    tel.shutdown()
    # (records of this telemetry: an earlier test's exporters may still be retrying on threads of their own)
    said = [r.getMessage() for r in caplog.records if r.name == "otel_rl" and r.threadName in ("MainThread", "otel-rl-pipeline")]
    # a handful of lines: the first NAMED_UNMAPPED keys named, one line for the rest up to the limit, one
    # when the limit is reached, and the count of the values past it (one summary, or one a minute)
    assert len(said) <= NAMED_UNMAPPED + 4, said
    assert sum("no mapping knows the metric key" in m for m in said) == NAMED_UNMAPPED
    assert sum("more metric keys no mapping knows" in m for m in said) == 1
    summaries = [m for m in said if "more values of unmapped keys were not exported" in m]
    assert summaries and sum(int(m.split()[1].replace(",", "")) for m in summaries) == overflow
    assert "unmapped_key_limit=16" in summaries[-1]
