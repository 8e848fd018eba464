"""When a move is big enough to matter: the registry's scale of each metric, and what explains a move.

An engineer reads optimizer signals (KL to the reference, gradient norm) against an absolute scale
and against the outcome: a gradient norm of 0.4 under a clip of 1.0 is no blow-up whatever its
fold, a KL going 0.0006 -> 0.04 is a policy still near its reference, and a gradient norm 300x
its median on the only steps of a sparse-reward run with a success is that success's advantage,
not instability. So a move of an optimizer signal is an alarm on its own only at the registry's
``scale`` (``annotations.otel_rl.scale.notable``, in units of the stated clip for gradient norms);
below it, only when a reward, validation or policy-state change (entropy, length) comes with it
or just after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from otel_rl.analyze._changes import Change
from otel_rl.analyze._incident import RUN_END
from otel_rl.analyze._series import Series
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

OPTIMIZER = frozenset({"kl", "grad", "mismatch"})  # families that are signals of the update, not its outcome
CONTEXT = frozenset({"reward", "validation", "entropy", "length", RUN_END})  # outcome and policy state
DEFAULT_GRAD_CLIP = 1.0  # the Trainer's, verl's and OpenRLHF's default max_grad_norm

# A one-log KL spike is large past the danger level and this many decades (20x) above the run's median:
# a run whose KL sits near 1 from its first step (an SFT adapter measured against its base) blips
# to 12 and back without leaving its reference; KL-spike runs reach 100-400x.
LONE_SPIKE_DECADES = 1.3
OUTLIER_SPIKE_DECADES = 2.3
# A sparse reward: at its floor on at least this share of the steps, with hits above it.
SPARSE_SHARE = 0.5


def grad_clip(settings: Mapping[str, Any]) -> tuple[float, str]:
    """The gradient clip in effect and where it comes from (the log, else the frameworks' default)."""
    clip = settings.get("grad_clip")
    if isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip > 0:
        return float(clip), "stated"
    return DEFAULT_GRAD_CLIP, "default"


def notable_level(family: str, settings: Mapping[str, Any], metric: str | None = None) -> float | None:
    """The level at which a move of an optimizer family matters on its own (registry ``scale``); the
    training-inference mismatch's metrics each have their own (``metric``)."""
    if family == "mismatch":
        mdef = METRICS.get(metric or "")
        return mdef.notable if mdef is not None else None
    if family == "kl":
        mdef = METRICS.get(M.RL_POLICY_KL)
        return mdef.notable if mdef is not None else None
    if family == "grad":
        mdef = METRICS.get(M.RL_GRAD_NORM)
        if mdef is None or mdef.notable is None:
            return None
        return mdef.notable * (grad_clip(settings)[0] if mdef.notable_relative_to == "grad_clip" else 1.0)
    return None


def danger_level(family: str) -> float | None:
    mdef = METRICS.get(M.RL_POLICY_KL) if family == "kl" else None
    return mdef.danger_above if mdef is not None else None


def is_large(p: Change, family: str, settings: Mapping[str, Any], typical: float | None = None) -> bool:
    """Whether a rise of an optimizer signal is large on its metric's absolute scale.

    A one-step KL spike needs the registry's danger level and 20x its baseline (healthy runs blip to
    ~1, or from ~1 to ~12, and come back); a level the KL settles at needs the notable level. A gradient norm needs the notable level (10x the
    clip) and, for a spike, a tenfold rise over its own baseline."""
    level = notable_level(family, settings, p.metric)
    if level is None or p.direction != "up":
        return True  # no scale in the registry: the size of the change decides, as before
    if family == "kl":
        if p.kind == "spike":  # one log past the danger level, and far past the run's own level (20x its median)
            usual = typical if typical is not None and typical > 0 else p.before
            far = p.after >= 10**LONE_SPIKE_DECADES * usual if usual > 0 else p.size >= LONE_SPIKE_DECADES
            # ... or past the notable level and hundreds of times the run's own level (0.015 -> 4.8)
            farther = p.after >= 10**OUTLIER_SPIKE_DECADES * usual if usual > 0 else p.size >= OUTLIER_SPIKE_DECADES
            return (p.after >= (danger_level("kl") or level) and far) or (p.after >= level and farther)
        return p.after >= level
    if p.kind == "spike":
        return p.after >= level and p.size >= 1.0
    return p.after >= level


def sparse_hits(series: Mapping[Any, Series], families: Mapping[str, tuple[str, float]]) -> dict[int, str]:
    """Steps that carry one of a sparse reward's few hits, with what the reward was there.

    A reward (or score, or success rate) at one floor value on most steps, from the first quarter of
    the run on, with rare hits above it gives GRPO-style advantages only on those steps: the gradient
    there is large by construction. A reward that fell to its floor (a collapse) was not sparse."""
    hits: dict[int, str] = {}
    for s in series.values():
        if families.get(s.label, ("", 0.0))[0] != "reward":
            continue
        if s.attributes.get(A.RL_STATISTIC, A.RlStatisticValues.MEAN.value) != A.RlStatisticValues.MEAN.value:
            continue
        steps, x = s.arrays()
        finite = np.isfinite(x)
        steps, x = steps[finite], x[finite]
        if x.size < 8:
            continue
        floor = float(np.min(x))
        at_floor = np.abs(x - floor) <= 1e-9 + 1e-6 * abs(floor)
        # Hits spread over the run: a reward that collapsed to its floor has its "hits" all before the
        # collapse, which is no sparse reward.
        quarter = int(steps[0] + 0.25 * (steps[-1] - steps[0]))
        hit_steps = steps[~at_floor]
        if (
            float(at_floor.mean()) < SPARSE_SHARE
            or not hit_steps.size
            or (hit_steps.size >= 3 and float((hit_steps > quarter).mean()) < 0.5)
        ):
            continue
        for st, v in zip(steps[~at_floor], x[~at_floor]):
            hits.setdefault(int(st), f"{s.label} {float(v):.4g} (at {floor:.4g} on {float(at_floor.mean()):.0%} of the steps)")
    return hits


def explained_by_sparse_hits(
    parts: Sequence[Change], families: Mapping[str, str], hits: Mapping[int, str], tolerance: int
) -> dict[int, str]:
    """Rises of optimizer signals (by part id) that sit on a sparse reward's hit: why, in words."""
    out: dict[int, str] = {}
    if not hits:
        return out
    for p in parts:
        if families.get(p.series) not in OPTIMIZER or p.direction != "up" or p.kind not in ("spike", "shift"):
            continue
        marks = p.steps if p.kind == "spike" else [p.first_step]
        near = [hits[s + d] for s in marks for d in range(-tolerance, tolerance + 1) if s + d in hits]
        if near and len(near) >= len(marks) * 0.5:
            out[id(p)] = f"on a step with one of the sparse reward's few hits ({near[0]}): its advantage is large by construction"
    return out


def outcome_marks(parts: Sequence[Change], families: Mapping[str, str], severity_of: Any) -> list[tuple[int, int]]:
    """Steps where the outcome or the policy state changed for the worse (warning or worse; a one-log
    dip of a batch's reward or length is the batch, not a change): what makes an optimizer signal's
    move near them matter."""
    marks = []
    for p in parts:
        if families.get(p.series) in CONTEXT and p.bad is not False and p.kind != "spike" and severity_of(p) != "info":
            # a change's span (a KL rising while the entropy is blowing up comes with it); a held
            # condition marks where it starts, not the whole run it is held over
            marks.append((p.first_step, p.first_step if p.kind == "sustained" else p.last_step))
    return sorted(marks)
