"""verl's step timers as stage spans: which ``timing_s/*`` keys are a step's stages, in what order.

Kept apart from ``verl.py`` (which imports verl when it is installed) so that replaying a verl log
needs no verl. Used by the verl backend after each logged step and by ``otel-rl replay``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_rl.integrations.stage_timers import timed_stages
from otel_rl.semconv import attributes as A

FRAMEWORK = A.RlFrameworkValues.VERL.value
# The step-level marked_timer names of RayPPOTrainer.fit (verl/trainer/ppo/ray_trainer.py, 0.9.1), in
# the order it runs them inside `step` (`ref` is str(Role.RefPolicy)). Other timing_s keys are parts
# of these (generate_sequences, agent_loop/*, gen_max) or outside the step (start/stop_profile).
STEP_TIMERS = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "save_checkpoint",
    "update_weights",
    "dump_rollout_generations",
    "testing",
)
TIMING_PREFIX = "timing_s/"


def step_stages(data: Mapping[str, Any]) -> tuple[list[tuple[str, Any, str | None]], Any]:
    """``([(rl.stage, seconds, rl.cluster), ...] in fit()'s order, timing_s/step)`` of one logged step,
    for ``Telemetry.trace_finished_step``; no stages when the step logged no timer."""
    return timed_stages(data, _TIMER_KEYS, FRAMEWORK), data.get(TIMING_PREFIX + "step")


_TIMER_KEYS = tuple(TIMING_PREFIX + timer for timer in STEP_TIMERS)
