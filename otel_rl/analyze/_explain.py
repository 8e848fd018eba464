"""What explains a move, so that it is told as information instead of an alarm.

An engineer explains before alarming: a gradient norm of 0 on steps whose groups all got the same
reward is GRPO's zero advantage; groups without spread while the reward sits at its best are groups
saturated by success; a length held at one value that is not the length limit (and that no
truncation ratio confirms) is answers of one length, not cut ones; a gradient norm logged as 0 while
the loss is not 0 is how the trainer reported it. Each marker sets the part's ``bad`` to False and
says why in ``why``; the incident then says it in its line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from otel_rl.analyze._changes import Change
from otel_rl.analyze._series import Series, SeriesKey
from otel_rl.detect.records import format_number
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

_MEAN = A.RlStatisticValues.MEAN.value


def explain_parts(parts: list[Change], series: Mapping[SeriesKey, Series], settings: Mapping[str, Any]) -> None:
    """Mark every part an explanation covers (see the module doc)."""
    _mark_reporting_artifacts(parts, series)
    _mark_no_advantage(parts, series)
    _mark_saturation(parts, series)
    _mark_unconfirmed_limits(parts, series, settings)


def _mark_reporting_artifacts(parts: list[Change], series: Mapping[SeriesKey, Series]) -> None:
    """A gradient norm logged as exactly 0 while the loss is not 0 at some of those steps (three, or all)
    is no vanishing gradient (a nonzero loss has one): how the trainer reported it, or a skipped update.
    Such a condition is information, said so."""
    overall = (None, A.RlLossTypeValues.TOTAL.value, A.RlLossTypeValues.POLICY.value)
    loss = [s for s in series.values() if s.metric == M.RL_LOSS and s.attributes.get(A.RL_LOSS_TYPE) in overall]
    grads = {s.label: s for s in series.values() if s.metric == M.RL_GRAD_NORM}
    for p in parts:
        if p.kind != "sustained" or p.series not in grads or p.after != 0.0 or not loss:
            continue
        zero_steps = [st for st, v in grads[p.series].by_step.items() if v == 0.0]
        nonzero_loss = sum(1 for st in zero_steps if loss[0].by_step.get(st, 0.0) != 0.0)
        if zero_steps and nonzero_loss >= min(3, len(zero_steps)):
            p.bad = False  # not a bad direction: see the note
            p.why = (
                f"{loss[0].label} is not 0 at {nonzero_loss} of those {len(zero_steps)} steps: not a vanishing gradient, "
                "but how the trainer reported it or a skipped update; the log cannot tell which"
            )


def _mark_no_advantage(parts: list[Change], series: Mapping[SeriesKey, Series]) -> None:
    """A gradient norm of exactly 0 on steps where the reward had no spread (every group's rewards
    equal) is GRPO's zero advantage, not a failure: the no-signal condition already says it."""
    spread = [s for s in series.values() if s.metric == M.RL_REWARD_ZERO_STD_RATIO]
    std = [s for s in series.values() if s.metric == M.RL_REWARD and s.attributes.get(A.RL_STATISTIC) == A.RlStatisticValues.STD.value]
    grads = {s.label: s for s in series.values() if s.metric == M.RL_GRAD_NORM}
    for p in parts:
        if p.kind != "sustained" or p.series not in grads or p.after != 0.0 or p.bad is False:
            continue
        zero_steps = [st for st, v in grads[p.series].by_step.items() if v == 0.0]
        flat = sum(1 for st in zero_steps if any(s.by_step.get(st) == 1.0 for s in spread) or any(s.by_step.get(st) == 0.0 for s in std))
        if zero_steps and flat >= 0.8 * len(zero_steps):
            p.bad = False
            p.why = f"the reward had no spread at {flat} of those {len(zero_steps)} steps: zero advantage, so no gradient"


def _reward_mean(series: Mapping[SeriesKey, Series]) -> Series | None:
    for metric in (M.RL_REWARD, M.RL_SCORE):
        found = [s for s in series.values() if s.metric == metric and s.attributes.get(A.RL_STATISTIC, _MEAN) == _MEAN]
        if found:
            return min(found, key=lambda s: (len(s.attributes), s.label))
    return None


def _mark_saturation(parts: list[Change], series: Mapping[SeriesKey, Series]) -> None:
    """Groups without reward spread while the reward sits at its best (its upper quartile) are groups
    where every completion succeeded: saturation by success, not a dead learning signal."""
    reward = _reward_mean(series)
    if reward is None:
        return
    steps, x = reward.arrays()
    finite = np.isfinite(x)
    if finite.sum() < 8:
        return
    high = float(np.quantile(x[finite], 0.75))
    last = int(steps[-1])
    # The reward's spread by series: (the direction in which it vanishes, whether a value is "no spread").
    spread: dict[str, tuple[Series, str, Any]] = {}
    for s in series.values():
        if s.metric == M.RL_REWARD_ZERO_STD_RATIO:
            spread[s.label] = (s, "up", lambda v: v >= 0.9)
        elif s.metric == M.RL_REWARD and s.attributes.get(A.RL_STATISTIC) == A.RlStatisticValues.STD.value:
            spread[s.label] = (s, "down", lambda v: abs(v) <= 1e-9)
    for p in parts:
        if p.series not in spread or p.bad is False or p.kind == "spike" or p.direction != spread[p.series][1]:
            continue
        own, _way, flat_value = spread[p.series]
        # A level the series moved to holds until it comes back (or the log ends).
        end = p.last_step if p.kind == "sustained" or p.recovered else last
        flat = [st for st, v in own.by_step.items() if p.first_step <= st <= end and flat_value(v)]
        at = [reward.by_step[st] for st in flat if st in reward.by_step and math.isfinite(reward.by_step[st])]
        if len(at) >= 3 and float(np.median(at)) >= high and high > float(np.quantile(x[finite], 0.25)):
            if _failed_alike(series, flat):
                continue  # the total is at its best, but a reward function sat at its worst: all failed alike
            p.bad = False
            p.why = (
                f"saturated by success: {reward.label} is {format_number(float(np.median(at)))} (median) on those "
                f"steps, at its upper quartile {format_number(high)}: every completion got the same high reward"
            )


def _failed_alike(series: Mapping[SeriesKey, Series], steps: list[int]) -> bool:
    """Whether a reward function (a correctness check) sat at its lowest on ``steps`` though it
    varied over the run: the total reward at its best there is then a ceiling of the other terms
    (the format rewards), not success."""
    for s in series.values():
        if s.metric != M.RL_REWARD_COMPONENT:
            continue
        _, y = s.arrays()
        y = y[np.isfinite(y)]
        on = [s.by_step[st] for st in steps if st in s.by_step and math.isfinite(s.by_step[st])]
        if y.size < 8 or len(on) < 3:
            continue
        low, high = float(np.quantile(y, 0.25)), float(np.quantile(y, 0.75))
        if low < high and float(np.median(on)) <= low and float(np.median(on)) < 0.0:
            return True
    return False


def _mark_unconfirmed_limits(parts: list[Change], series: Mapping[SeriesKey, Series], settings: Mapping[str, Any]) -> None:
    """A length held at one high value is the length limit only where the log states that limit or a
    truncation ratio says responses were cut there; otherwise it is answers of one length."""
    limit = settings.get("max_response_length")
    clipped = [s for s in series.values() if s.metric == M.RL_RESPONSE_CLIPPED_RATIO]
    for p in parts:
        if p.kind != "sustained" or p.metric != M.RL_RESPONSE_LENGTH or p.past or p.direction != "up" or p.limit is None:
            continue
        if isinstance(limit, (int, float)) and not isinstance(limit, bool) and math.isclose(float(p.limit), float(limit), rel_tol=0.02):
            continue
        cut = [v for s in clipped for st, v in s.by_step.items() if p.first_step <= st <= p.last_step and math.isfinite(v)]
        if cut and float(np.median(cut)) >= 0.5:
            continue
        p.bad = False
        stated = (
            f"the stated limit is {format_number(float(limit))}"
            if isinstance(limit, (int, float)) and not isinstance(limit, bool)
            else "the log states no limit"
        )
        p.why = f"{stated} and no truncation ratio says responses were cut: answers of one length, not cut ones"


def kl_coefficient_from_loss(series: Mapping[SeriesKey, Series]) -> tuple[float, str] | None:
    """The KL coefficient the values prove, where the log states none: on steps whose policy term is 0
    (no advantage, or every completion cut), GRPO's loss is exactly coefficient x KL. Needs the same
    ratio (within 2%) on at least half of 10 or more steps with a KL above 0."""
    overall = (None, A.RlLossTypeValues.TOTAL.value)
    loss = next((s for s in series.values() if s.metric == M.RL_LOSS and s.attributes.get(A.RL_LOSS_TYPE) in overall), None)
    kl = next(
        (s for s in series.values() if s.metric == M.RL_POLICY_KL and s.attributes.get(A.RL_POLICY) != A.RlPolicyValues.OLD.value), None
    )
    if loss is None or kl is None:
        return None
    pairs = [
        (st, loss.by_step[st] / v)
        for st, v in kl.by_step.items()
        if st in loss.by_step and math.isfinite(v) and v > 0 and math.isfinite(loss.by_step[st]) and loss.by_step[st] > 0
    ]
    if len(pairs) < 10:
        return None
    ratios = np.array([r for _, r in pairs])
    c = float(np.median(ratios))
    close = np.abs(ratios / c - 1.0) <= 0.02
    if close.mean() < 0.5:
        return None
    c = float(f"{float(np.median(ratios[close])):.2g}")
    return c, (
        f"loss = {format_number(c)} x KL at {int(close.sum())} of {len(pairs)} logged steps with a KL above 0 "
        "(steps whose policy term is 0)"
    )
