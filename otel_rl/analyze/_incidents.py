"""Incidents: the changes of several series at about the same steps, as one thing a person names.

The parts come from :mod:`otel_rl.analyze._changes` for the series a report is about (reward and
score, KL, gradient norm, entropy, response length and truncation, the reward's spread). Parts
that start within a window of each other (two logs, or 2% of the run if longer) are one incident; spikes
join the incident around them, and spikes of the same series set at separate times are one
incident of repeated spikes. Each incident is named from the registry meaning of what moved and
how ("policy collapse": lengths and entropy fall together), ranked by severity, the importance
of its series, the size of the change and whether it came back, and told in one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from otel_rl.analyze._changes import Change, series_changes, sustained_changes
from otel_rl.analyze._explain import explain_parts
from otel_rl.analyze._incident import Incident
from otel_rl.analyze._scale import OPTIMIZER, explained_by_sparse_hits, is_large, notable_level, outcome_marks, sparse_hits
from otel_rl.analyze._series import Series, SeriesKey
from otel_rl.analyze._wording import incident_name, incident_text, limit_note, past_danger, silent_function_part
from otel_rl.detect.pinned import silent_reward_function
from otel_rl.detect.records import Finding, danger_bounds, direction_of, format_number
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

HEADLINE_SIZE = 7
_SEVERITY_WEIGHT = {"critical": 100.0, "warning": 10.0, "info": 1.0}
# The KL to the sampling policy is far from its trust region past this level and this many times its own.
_OFF_POLICY_KL = 0.3
_OFF_POLICY_FOLD = 30.0
_MEAN = A.RlStatisticValues.MEAN.value

# What the report is about: (metric, attribute filter, family, importance). The outcome (reward,
# validation) matters most, then the policy's state (entropy, length), then the optimizer's signals. A series joins when its
# attributes hold the filter's values (rl.statistic missing counts as mean).
WATCHED: tuple[tuple[str, Mapping[str, str], str, float], ...] = (
    (M.RL_SCORE, {A.RL_STATISTIC: _MEAN}, "reward", 1.0),
    (M.RL_REWARD, {A.RL_STATISTIC: _MEAN}, "reward", 1.0),
    (M.RL_REWARD_COMPONENT, {A.RL_REWARD_FUNCTION: "success", A.RL_STATISTIC: _MEAN}, "reward", 1.0),
    (M.RL_VALIDATION_SCORE, {A.RL_STATISTIC: _MEAN}, "validation", 1.0),
    (M.RL_REWARD, {A.RL_STATISTIC: A.RlStatisticValues.STD.value}, "signal", 0.6),
    (M.RL_REWARD_ZERO_STD_RATIO, {}, "signal", 0.6),
    (M.RL_POLICY_KL, {}, "kl", 0.7),
    (M.RL_LOSS, {A.RL_LOSS_TYPE: A.RlLossTypeValues.KL.value}, "kl", 0.65),
    (M.RL_GRAD_NORM, {}, "grad", 0.7),
    # the rollout engine and the trainer disagreeing on the sampled tokens: an optimizer-side signal
    # (the update is biased), named when it moves with the outcome or past its registry scale
    (M.RL_TRAIN_INFER_KL, {}, "mismatch", 0.6),
    (M.RL_TRAIN_INFER_LOGPROB_ABS_DIFF, {A.RL_STATISTIC: _MEAN}, "mismatch", 0.6),
    (M.RL_POLICY_ENTROPY, {A.RL_STATISTIC: _MEAN}, "entropy", 0.85),
    (M.RL_RESPONSE_LENGTH, {A.RL_STATISTIC: _MEAN}, "length", 0.85),
    (M.RL_RESPONSE_CLIPPED_RATIO, {}, "length", 0.8),
)


def _sampling_kl(metric: str, attributes: Mapping[str, str]) -> bool:
    """The KL to the policy that sampled the batch (PPO's ratio KL), not to the reference model."""
    return metric == M.RL_POLICY_KL and attributes.get(A.RL_POLICY) == A.RlPolicyValues.OLD.value


def watched(s: Series) -> tuple[str, float] | None:
    """(family, importance) of a series the incidents are about; None for the others. A reward
    function at 0 on every step joins the reward's spread: its share of the signal never came."""
    role = watched_metric(s.metric, s.attributes)
    if role is None and s.metric == M.RL_REWARD_COMPONENT and silent_reward_function(s.metric, s.attributes, s.label, s.arrays()[1]):
        return "signal", 0.6
    return role


def watched_metric(metric_name: str, attributes: Mapping[str, str]) -> tuple[str, float] | None:
    """(family, importance) of a metric with these attributes (a series', or a detector finding's)."""
    if _sampling_kl(metric_name, attributes):
        # The KL to the policy that sampled the batch: ~0 on-policy, small under clipping; it matters
        # only when an update leaves the trust region by far (see _severity).
        return "kl", 0.5
    if (
        metric_name == M.RL_GRAD_NORM
        and attributes.get(A.RL_MODEL_ROLE, A.RlModelRoleValues.ACTOR.value) != A.RlModelRoleValues.ACTOR.value
    ):
        return None  # a critic's gradient norm follows its value loss's scale (10-50 is usual): not the policy's stability
    for metric, wanted, family, importance in WATCHED:
        if metric_name != metric:
            continue
        if all(attributes.get(k, _MEAN if k == A.RL_STATISTIC else None) == v for k, v in wanted.items()):
            return family, importance
    return None


def find_incidents(
    series: Mapping[SeriesKey, Series],
    findings: Sequence[Finding],
    *,
    interval: int,
    settings: Mapping[str, Any],
    sources: Mapping[str, str] | None = None,
    outcome_steps: Sequence[tuple[int, int]] = (),
) -> list[Incident]:
    """The run's incidents, most important first. ``outcome_steps``: spans where the outcome got worse
    that no series change carries (a validation score falling from its best, see :func:`gave_back`)."""
    families: dict[str, tuple[str, float]] = {}
    parts: list[Change] = []
    by_series: dict[str, list[Finding]] = {}
    for f in findings:
        by_series.setdefault(f.series, []).append(f)
    logged = max((len(s.by_step) for s in series.values()), default=0)
    for s in series.values():
        role = watched(s)
        if role is None:
            continue
        families[s.label] = role
        own = by_series.get(s.label, [])
        parts.extend(series_changes(s, interval))
        parts.extend(sustained_changes(own, len(s.by_step) or logged, s))
    # A one-step excursion in a series' good direction (a KL or gradient norm dropping on a step whose
    # groups had no spread) is texture, not part of an incident; report.json's findings keep it. The
    # reward's spread is kept: its step of spread is what explains a gradient there (_explained).
    parts = [p for p in parts if not (p.kind == "spike" and p.bad is False and families[p.series][0] != "signal")]
    if not parts:
        return []
    explain_parts(parts, series, settings)
    ends = [(min(s.by_step), max(s.by_step)) for s in series.values() if s.by_step]  # (not a list of every step of every series)
    first, last = (min(a for a, _ in ends), max(b for _, b in ends)) if ends else (0, 0)
    span = last - first
    window = max(2 * interval, int(0.02 * span))
    context = _Context(
        families=families,
        interval=max(interval, 1),
        window=window,
        warmup_end=first + int(0.1 * span),
        settings=settings,
        stated={k: (v, (sources or {}).get(k, "the log")) for k, v in settings.items()},
        hits=sparse_hits(series, families),
        typical={s.label: _typical(s) for s in series.values() if s.label in families},
        silent_share=_silent_share(series, families),
    )
    family_of = {label: fam for label, (fam, _importance) in families.items()}
    context.marks = sorted([*outcome_marks(parts, family_of, lambda p: _severity(p, context, accompanied=True)), *outcome_steps])
    incidents = [_incident(group, context) for group in _group(parts, context)]
    incidents = _merge_namesakes(incidents, lambda group: _incident(group, context))
    incidents.sort(key=lambda i: (-i.score, i.first_step))
    return incidents


@dataclass
class _Context:
    """What every incident of a run is judged against."""

    families: Mapping[str, tuple[str, float]]
    interval: int
    window: int
    warmup_end: int
    settings: Mapping[str, Any]
    stated: Mapping[str, tuple[Any, str]]
    hits: Mapping[int, str]  # a sparse reward's hits: step -> what it was
    typical: Mapping[str, float]  # each series' median: the one "typical" value every sentence uses
    marks: list[tuple[int, int]] = field(default_factory=list)  # steps of outcome and policy-state changes (see _scale)
    silent_share: float = 0.0  # the share of the reward functions that never fired

    def accompanied(self, first: int, last: int) -> bool:
        """Whether an outcome or policy-state change comes with steps first..last, or just after them."""
        return any(lo - 2 * self.window <= last and first <= hi + self.window for lo, hi in self.marks)


def _silent_share(series: Mapping[SeriesKey, Series], families: Mapping[str, tuple[str, float]]) -> float:
    components = [s for s in series.values() if s.metric == M.RL_REWARD_COMPONENT and s.attributes.get(A.RL_STATISTIC, _MEAN) == _MEAN]
    silent = [s for s in components if s.label in families and families[s.label][0] == "signal"]
    return len(silent) / len(components) if components else 0.0


def _typical(s: Series) -> float:
    _, x = s.arrays()
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else math.nan


def _merge_namesakes(incidents: list[Incident], build: Callable[[list[Change]], Incident]) -> list[Incident]:
    """Incidents of one name whose steps overlap (a length climbing to the limit, and the same length
    held there) are one incident, told once."""
    out: list[Incident] = []
    for incident in sorted(incidents, key=lambda i: i.first_step):
        lo, hi = _reach(incident)
        twin = next(
            (
                o
                for o in out
                if o.name == incident.name and _reach(o)[0] <= hi + incident.tolerance and lo <= _reach(o)[1] + incident.tolerance
            ),
            None,
        )
        if twin is None:
            out.append(incident)
            continue
        out[out.index(twin)] = build([*twin.parts, *incident.parts])
    return out


def _reach(i: Incident) -> tuple[int, int]:
    return min(p.first_step for p in i.parts), max(p.last_step for p in i.parts)


def _group(parts: list[Change], context: _Context) -> list[list[Change]]:
    """Which parts are one incident.

    Shifts whose steepest steps lie within ``window`` of each other are one group; overlapping slow
    drifts of one family are one; a condition held for much of the run joins the shifts or the drift
    it starts with (a score pinned at its floor right after a collapse), else conditions of one family
    are a group of their own; a spike joins the group of shifts around it; the remaining spikes at one step are one event, and
    events of the same series set are one group of repeated spikes."""
    families, window = context.families, context.window
    family = {p.series: families.get(p.series, ("", 0.0))[0] for p in parts}
    shifts = sorted((p for p in parts if p.kind == "shift"), key=lambda p: p.center)
    groups: list[list[Change]] = []
    for p in shifts:
        if groups and p.center <= max(q.center for q in groups[-1]) + window:
            groups[-1].append(p)
        else:
            groups.append([p])
    abrupt = [(min(q.center for q in g) - window, max(q.center for q in g) + window, g) for g in groups]

    # Slow drifts of one family that overlap are one group; so are the policy's length and entropy
    # drifting over mostly the same steps (answers growing longer and more random is one move).
    def together(g: list[Change], p: Change) -> bool:
        if family[g[0].series] == family[p.series]:
            return _overlap(g, p)
        policy = {"length", "entropy"}
        return {family[g[0].series], family[p.series]} <= policy and _shared_span(g, p) >= 0.5

    for p in sorted((p for p in parts if p.kind == "drift"), key=lambda p: p.center):
        home = next((g for g in groups if g[0].kind == "drift" and together(g, p)), None)
        (home.append(p) if home is not None else groups.append([p]))
    # A condition that starts with shifts or a drift of its family, or soon after (a score pinned at its
    # floor after a collapse, lengths pinned at the limit after they rose), is their incident; one that
    # was there before them is not theirs. Conditions of one family otherwise are one group.
    starts = [
        *abrupt,
        *((min(q.first_step for q in g) - window, max(q.last_step for q in g) + window, g) for g in groups if g[0].kind == "drift"),
    ]
    for p in sorted((p for p in parts if p.kind == "sustained"), key=lambda p: p.center):
        kin = _kin(family[p.series], "sustained", p)
        host = next(
            (
                g
                for lo, hi, g in starts
                if lo <= p.first_step <= hi + window and any(_kin(family[q.series], "sustained", q) == kin for q in g)
            ),
            None,
        ) or next(
            (g for g in groups if g[0].kind == "sustained" and _kin(family[g[0].series], "sustained", g[0]) == kin and _overlap(g, p)), None
        )
        (host.append(p) if host is not None else groups.append([p]))
    spikes = sorted((p for p in parts if p.kind == "spike"), key=lambda p: p.first_step)
    loose: list[Change] = []
    for spike in spikes:
        host = next((g for lo, hi, g in abrupt if lo <= spike.first_step <= hi), None)
        (host if host is not None else loose).append(spike)
    # A spike that matters on its own (a KL or gradient norm up, see _severity) is an event with what
    # else spiked at its step; the rest of the spikes are the series' texture (found in report.json's
    # findings). Events of the same notable series are one group of repeated spikes.
    # (judged by their size alone: one the scale makes information is still an event, told as such)
    notable = [p for p in loose if _severity(p, context, accompanied=True) != "info"]
    events: list[list[Change]] = []
    for spike in notable:
        event = next((e for e in events if abs(e[0].first_step - spike.first_step) <= max(window // 3, 1)), None)
        (event.append(spike) if event is not None else events.append([spike]))
    for event in events:
        lead = {q.first_step for q in event}
        event.extend(q for q in loose if q not in event and any(abs(q.first_step - s) <= 1 for s in lead))
    by_set: dict[frozenset[str], list[Change]] = {}
    for event in events:
        key = frozenset(q.series for q in event if q in notable)
        members = by_set.setdefault(key, [])
        members.extend(q for q in event if all(q is not m for m in members))
    groups.extend(by_set.values())
    return _split_good(groups, family)


def _split_good(groups: list[list[Change]], family: Mapping[str, str]) -> list[list[Change]]:
    """Good and bad never share an incident: a reward or validation score rising at the steps of a
    KL climb is the run learning, told on its own."""
    out: list[list[Change]] = []
    for g in groups:
        good = [p for p in g if p.bad is False and family.get(p.series) in ("reward", "validation")]
        rest = [p for p in g if not any(p is q for q in good)]
        out.extend(part for part in (rest, good) if part)
    return out


def _kin(family: str, kind: str, p: Change | None = None) -> str:
    """Families told together: a reward or validation score held at its floor, a reward without
    spread and a gradient norm of exactly 0 (no advantage, so no gradient) are one condition."""
    if kind == "sustained" and family in ("reward", "validation"):
        return "signal"
    if kind == "sustained" and family == "grad" and p is not None and p.direction == "down" and p.after == 0.0:
        return "signal"
    return family


def _shared_span(group: Sequence[Change], p: Change) -> float:
    """The share of the shorter of two spans (a group's, a part's) that the other covers."""
    lo, hi = min(q.first_step for q in group), max(q.last_step for q in group)
    shared = min(hi, p.last_step) - max(lo, p.first_step)
    shorter = min(hi - lo, p.last_step - p.first_step)
    return shared / shorter if shorter > 0 else float(shared >= 0)


def _overlap(group: Sequence[Change], p: Change) -> bool:
    lo, hi = min(q.first_step for q in group), max(q.last_step for q in group)
    return p.first_step <= hi and lo <= p.last_step


_NOTCH = {"critical": "warning", "warning": "info", "info": "info"}


def _severity(p: Change, context: _Context, *, accompanied: bool) -> str:
    """How much a part matters, from the registry's good direction, the size of the change (sizes
    in decades of the fold, or relative where the sign changes; see change_size) and, for optimizer
    signals, the metric's absolute scale unless an outcome or policy change comes with it (_scale)."""
    family = context.families.get(p.series, ("", 0.0))[0]
    if p.bad is False:
        return "info"
    if _sampling_kl(p.metric, p.attributes):
        far = p.direction == "up" and p.after >= _OFF_POLICY_KL and p.after >= _OFF_POLICY_FOLD * max(abs(p.before), 1e-12)
        return "warning" if far else "info"
    if (
        family in OPTIMIZER
        and p.direction == "up"
        and not accompanied
        and not is_large(p, family, context.settings, context.typical.get(p.series))
    ):
        return "info"
    if family in OPTIMIZER and p.direction == "down" and p.kind != "sustained":
        return "info"  # a KL or gradient norm settling lower is no alarm on its own (no gradient at all is a condition)
    if p.kind == "spike":
        # One-step excursions matter where they are instability (KL, gradient norm); a batch's reward
        # or length dipping for one log and coming back is the batch.
        if family not in ("kl", "grad") or p.direction != "up":
            return "info"  # a KL or gradient norm dropping for one log (a zero-advantage step) is not instability
        # A gradient norm twice its level is a warning; a KL, noisier from one batch to the next, at 3x.
        return "critical" if p.size >= 1.0 else ("warning" if p.size >= (0.5 if family == "kl" else 0.25) else "info")
    if p.kind == "sustained":
        if silent_function_part(p, {p.series: family}):
            # Most of the reward's design paying nothing is a warning; a strict format reward among
            # several that nobody matches is information (the others still teach the run).
            return "warning" if context.silent_share >= 0.5 else "info"
        held = "critical" if (p.share or 0.0) >= 0.5 else "warning"
        return _NOTCH[held] if p.recovered else held  # a condition the run left for good weighs less
    if (
        family == "kl"
        and p.direction == "up"
        and p.kind == "shift"
        and p.steps[-1] <= context.warmup_end
        and p.after < (notable_level("kl", context.settings) or math.inf)
    ):
        return "info"  # the policy starts at the reference: KL rising from ~0 in the first logs is training starting
    if not past_danger(p):
        cap = "warning"
    else:
        cap = "critical"
    two_sided = direction_of(p.metric, p.attributes) in (None, "range")
    if two_sided:
        # No single good direction (entropy, KL to the reference, lengths): a slow drift by less than
        # fivefold is information (entropy halving over a run), a fall to a tenth in a few logs is not.
        if p.kind == "drift":
            level = "warning" if p.size >= 0.7 else "info"
        else:
            level = "critical" if p.size >= 1.0 else ("warning" if p.size >= 0.5 else "info")
    elif p.kind == "drift":
        level = "warning" if p.size >= 0.3 else "info"
    else:
        level = "critical" if p.size >= 0.6 else "warning"
    if cap == "warning" and level == "critical":
        level = "warning"
    return _NOTCH[level] if p.recovered else level


def _incident(parts: list[Change], context: _Context) -> Incident:
    families, interval, stated = context.families, context.interval, context.stated
    family_of = {p.series: families.get(p.series, ("", 0.0))[0] for p in parts}
    explained = dict.fromkeys(_explained(parts, families, interval), "")
    explained.update(explained_by_sparse_hits(parts, family_of, context.hits, interval))
    accompanied = context.accompanied(min(p.first_step for p in parts), max(p.last_step for p in parts))
    severities = ["info" if id(p) in explained else _severity(p, context, accompanied=accompanied) for p in parts]
    if not accompanied and "critical" in severities:
        # A lone KL spike past the danger level that comes back at once, with no large gradient and no
        # outcome change around it, is worth a look, not a verdict of instability.
        lone = all(family_of[p.series] == "kl" and p.kind == "spike" for p, sv in zip(parts, severities) if sv == "critical")
        grad = any(family_of[p.series] == "grad" and sv != "info" for p, sv in zip(parts, severities))
        if lone and not grad:
            severities = ["warning" if sv == "critical" else sv for sv in severities]
    rank = max(range(len(parts)), key=lambda k: (_SEVERITY_WEIGHT[severities[k]], families.get(parts[k].series, ("", 0.0))[1]))
    severity = severities[rank]
    fam = {p.series: families.get(p.series, ("", 0.0))[0] for p in parts}
    events = [p for p in parts if p.kind != "sustained"] or parts  # a condition held to the end is told apart
    incident = Incident(
        name="",
        severity=severity,
        first_step=min(p.first_step for p in events),
        last_step=max(p.last_step for p in events),
        parts=sorted(parts, key=lambda p: (p.first_step, -p.size)),
        families=fam,
        tolerance=max(interval, 1),
    )
    incident.alarming = {p.series for p, sv in zip(parts, severities) if sv != "info"}
    incident.note = limit_note(incident, stated)
    incident.name = incident_name(incident)
    # Ranked by what it alarms on: an explained part (a zero gradient where the reward had no spread)
    # is told, not weighed.
    weighed = [p for p, sv in zip(parts, severities) if sv != "info"] or parts
    weight = max(families.get(p.series, ("", 0.5))[1] * (1.0 + min(p.size, 3.0)) for p in weighed)
    incident.score = _SEVERITY_WEIGHT[severity] * weight * (1.0 if incident.recovered else 1.3) + 0.1 * len({p.series for p in parts})
    incident.text = incident_text(incident, families, {id(p): s for p, s in zip(parts, severities)}, context.typical)
    reasons = sorted({why for why in explained.values() if why})
    if reasons:
        incident.note = "; ".join(filter(None, [incident.note, *reasons]))
        incident.text += f" ({reasons[0]})"
    return incident


def _explained(parts: Sequence[Change], families: Mapping[str, tuple[str, float]], tolerance: int) -> set[int]:
    """The gradient-norm rises (by ids) that come with the reward's spread appearing at the same steps,
    from nearly nothing (a decade or more): GRPO's advantage is zero without spread, so those are
    the few steps with a learning signal, not instability."""
    fam = {p.series: families.get(p.series, ("", 0.0))[0] for p in parts}
    appears = {p.series: ("down" if p.metric == M.RL_REWARD_ZERO_STD_RATIO else "up") for p in parts}
    # The spread appears: from (nearly) none, not a spread that was there growing.
    signal = [
        p.first_step
        for p in parts
        if fam[p.series] == "signal"
        and p.direction == appears[p.series]
        and (p.before >= 0.9 if p.metric == M.RL_REWARD_ZERO_STD_RATIO else abs(p.before) <= 0.1 * abs(p.after))
    ]
    return {
        id(p)
        for p in parts
        if fam[p.series] == "grad"
        and p.direction == "up"
        and p.size >= 1.0
        and p.kind in ("spike", "shift")
        and any(abs(p.first_step - s) <= tolerance for s in signal)
    }


GAVE_BACK_RELATIVE = 0.1  # a fall from the best validation below this share of it is noise
GAVE_BACK_SHARE = 0.8  # ... and one that keeps a fifth of the gain or more is a dip, not the gain lost


def decline_incidents(
    verdict: Any, series: Mapping[SeriesKey, Series], incidents: Sequence[Incident], fell: Incident | None = None
) -> list[Incident]:
    """The outcome itself, when it got worse: a training reward whose last steps are clearly below its
    first (two standard errors), a validation score that fell past its noise, or ``fell`` (the
    validation's :func:`gave_back`, computed once by the caller). Told as an incident of its own
    where no warning or critical incident already alarms on that family."""
    out = []
    alarmed = {f for i in incidents if i.severity != "info" for f in i.alarm_families}
    for label, how, family in (
        (verdict.reward_series, verdict.training_learned, "reward"),
        (verdict.validation_series, verdict.validation_learned, "validation"),
    ):
        if label is None or family in alarmed or (family == "reward" and "signal" in alarmed):
            continue
        s = next((x for x in series.values() if x.label == label), None)
        if s is None:
            continue
        if how != "worse":
            if family == "validation" and fell is not None:
                out.append(fell)
            continue
        steps, x = s.arrays()
        keep = np.isfinite(x)
        steps, x = steps[keep], x[keep]
        k = max(1, min(x.size // 5, 10)) if family == "reward" else 1
        before, after = float(np.mean(x[:k])), float(np.mean(x[-k:]))
        name = "reward declines" if family == "reward" else "validation score falls"
        incident = Incident(
            name=name, severity="warning", first_step=int(steps[0]), last_step=int(steps[-1]), parts=[], families={label: family}
        )
        incident.text = (
            f"{name} over the run: {label} {format_number(before)} (first {k} logged step{'s' if k > 1 else ''}) -> "
            f"{format_number(after)} (last {k}), worst {format_number(float(np.min(x)))} at step {int(steps[np.argmin(x)])}"
        )
        incident.score = _SEVERITY_WEIGHT["warning"] * 2.0
        out.append(incident)
    return out


def gave_back(s: Series) -> Incident | None:
    """A validation score that rose, then fell from its best to its last evaluation by more than its
    noise and back to about where it started (GAVE_BACK_SHARE of its gain lost): the run lost what it
    learned (its first value against its last would say "no clear change")."""
    steps, x = s.arrays()
    keep = np.isfinite(x)
    steps, x = steps[keep], x[keep]
    if x.size < 4:
        return None
    best_at = int(np.argmax(x))
    first, best, last = float(x[0]), float(x[best_at]), float(x[-1])
    if best_at == x.size - 1:
        return None
    noise = float(np.std(np.diff(x))) / math.sqrt(2.0)
    bar = max(2.0 * noise, GAVE_BACK_RELATIVE * max(abs(best), abs(first)), 1e-3)
    gain, drop = best - first, best - last
    if gain <= bar or drop <= bar or drop < GAVE_BACK_SHARE * gain:
        return None
    # where it fell: after the last evaluation still near the best (within half the drop)
    near = np.flatnonzero(x[: x.size - 1] >= best - 0.5 * drop)
    best_step, last_step = int(steps[int(near[-1])]), int(steps[-1])
    name = "validation score falls from its best"
    incident = Incident(
        name=name, severity="warning", first_step=best_step, last_step=last_step, parts=[], families={s.label: "validation"}
    )
    incident.text = (
        f"{name}: {s.label} {format_number(first)} (step {int(steps[0])}) rose to {format_number(best)} (step {int(steps[best_at])}), "
        f"then fell to {format_number(last)} at the last evaluation (step {last_step}): {drop / gain:.0%} of its gain lost"
    )
    incident.score = _SEVERITY_WEIGHT["warning"] * 2.0
    return incident


def headline(incidents: Sequence[Incident]) -> list[Incident]:
    """The top of the ranking, at most HEADLINE_SIZE."""
    return list(incidents[:HEADLINE_SIZE])


def incident_limits(run: Any, incident: Incident) -> dict[str, tuple[float, str]]:
    """The limit or threshold to draw on each series of an incident: a condition's level, the stated
    length limit for lengths, the registry's danger threshold otherwise."""
    out: dict[str, tuple[float, str]] = {}
    stated = run.parsed.settings.get("max_response_length")
    for p in incident.parts:
        if p.series in out:
            continue
        if p.metric == M.RL_RESPONSE_LENGTH and isinstance(stated, (int, float)) and not isinstance(stated, bool):
            out[p.series] = (float(stated), f"stated limit {format_number(float(stated))}")
            continue
        bounds = danger_bounds(p.metric, p.attributes)
        if bounds:
            way, limit, _inclusive, _why = bounds[0]
            out[p.series] = (float(limit), f"danger {'above' if way == 'up' else 'below'} {format_number(float(limit))}")
        elif p.kind == "sustained" and p.limit is not None:
            out[p.series] = (float(p.limit), f"held at {format_number(float(p.limit))}")
    return out
