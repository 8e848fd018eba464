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
from dataclasses import dataclass
from typing import Any

from otel_rl.analyze._changes import Change, series_changes, sustained_changes
from otel_rl.analyze._series import Series, SeriesKey
from otel_rl.detect.records import Finding, danger_bounds, direction_of, format_number
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

HEADLINE_SIZE = 7
_SEVERITY_WEIGHT = {"critical": 100.0, "warning": 10.0, "info": 1.0}
_MEAN = A.RlStatisticValues.MEAN.value

# What the report is about: (metric, attribute filter, family, importance). A series joins when its
# attributes hold the filter's values (rl.statistic missing counts as mean).
WATCHED: tuple[tuple[str, Mapping[str, str], str, float], ...] = (
    (M.RL_SCORE, {A.RL_STATISTIC: _MEAN}, "reward", 1.0),
    (M.RL_REWARD, {A.RL_STATISTIC: _MEAN}, "reward", 1.0),
    (M.RL_VALIDATION_SCORE, {A.RL_STATISTIC: _MEAN}, "validation", 0.8),
    (M.RL_REWARD, {A.RL_STATISTIC: A.RlStatisticValues.STD.value}, "signal", 0.6),
    (M.RL_REWARD_ZERO_STD_RATIO, {}, "signal", 0.7),
    (M.RL_POLICY_KL, {}, "kl", 0.9),
    (M.RL_LOSS, {A.RL_LOSS_TYPE: A.RlLossTypeValues.KL.value}, "kl", 0.8),
    (M.RL_GRAD_NORM, {}, "grad", 0.9),
    (M.RL_POLICY_ENTROPY, {A.RL_STATISTIC: _MEAN}, "entropy", 0.9),
    (M.RL_RESPONSE_LENGTH, {A.RL_STATISTIC: _MEAN}, "length", 0.8),
    (M.RL_RESPONSE_CLIPPED_RATIO, {}, "length", 0.8),
)
_FAMILY_WORDS = {
    "reward": "reward",
    "validation": "validation score",
    "signal": "reward spread",
    "kl": "KL",
    "grad": "gradient norm",
    "entropy": "entropy",
    "length": "response length",
}


def watched(s: Series) -> tuple[str, float] | None:
    """(family, importance) of a series the incidents are about; None for the others."""
    if s.metric == M.RL_POLICY_KL and s.attributes.get(A.RL_POLICY) == A.RlPolicyValues.OLD.value:
        return None  # the KL to the policy that sampled the batch: a PPO diagnostic, 0 by construction on-policy
    for metric, wanted, family, importance in WATCHED:
        if s.metric != metric:
            continue
        if all(s.attributes.get(k, _MEAN if k == A.RL_STATISTIC else None) == v for k, v in wanted.items()):
            return family, importance
    return None


@dataclass
class Incident:
    name: str  # what a person calls it: "policy collapse", "KL spikes", ...
    severity: str  # "critical" | "warning" | "info"
    first_step: int
    last_step: int
    parts: list[Change]
    families: dict[str, str]  # series -> family
    score: float = 0.0
    text: str = ""
    note: str = ""  # what the report knows or not about a limit it names
    tolerance: int = 1  # steps a marked step may be off (one log interval)

    @property
    def metrics(self) -> set[str]:
        return {p.metric for p in self.parts}

    @property
    def recovered(self) -> bool:
        return all(p.recovered for p in self.parts)

    @property
    def marked_steps(self) -> list[int]:
        return sorted({s for p in self.parts for s in p.steps})

    def reaches(self, lo: int, hi: int) -> bool:
        """Whether the incident reaches into steps lo..hi: a spike by a marked step, anything else by its span."""
        for p in self.parts:
            if p.kind == "spike":
                if any(lo - self.tolerance <= s <= hi + self.tolerance for s in p.steps):
                    return True
            elif p.first_step - self.tolerance <= hi and lo <= p.last_step + self.tolerance:
                return True
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "severity": self.severity,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "recovered": self.recovered,
            "score": round(self.score, 3),
            "text": self.text,
            **({"note": self.note} if self.note else {}),
            "parts": [p.as_dict() for p in self.parts],
        }


def find_incidents(
    series: Mapping[SeriesKey, Series],
    findings: Sequence[Finding],
    *,
    interval: int,
    settings: Mapping[str, Any],
    sources: Mapping[str, str] | None = None,
) -> list[Incident]:
    """The run's incidents, most important first."""
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
        parts.extend(sustained_changes(own, len(s.by_step) or logged))
    # A one-step excursion in a series' good direction (a KL or gradient norm dropping on a step whose
    # groups had no spread) is texture, not part of an incident; report.json's findings keep it. The
    # reward's spread is kept: its step of spread is what explains a gradient there (_explained).
    parts = [p for p in parts if not (p.kind == "spike" and p.bad is False and families[p.series][0] != "signal")]
    if not parts:
        return []
    _mark_reporting_artifacts(parts, series)
    steps = [st for s in series.values() for st in s.by_step]
    span = (max(steps) - min(steps)) if steps else 0
    window = max(2 * interval, int(0.02 * span))
    warmup_end = (min(steps) if steps else 0) + int(0.1 * span)
    stated = {k: (v, (sources or {}).get(k, "the log")) for k, v in settings.items()}
    incidents = [_incident(group, families, interval, stated, warmup_end) for group in _group(parts, families, window)]
    incidents = _merge_namesakes(incidents, lambda group: _incident(group, families, interval, stated, warmup_end))
    incidents.sort(key=lambda i: (-i.score, i.first_step))
    return incidents


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


def _group(parts: list[Change], families: Mapping[str, tuple[str, float]], window: int) -> list[list[Change]]:
    """Which parts are one incident.

    Shifts whose steepest steps lie within ``window`` of each other are one group; overlapping slow
    drifts of one family are one; a condition held for much of the run joins the shifts or the drift
    it starts with (a score pinned at its floor right after a collapse), else conditions of one family
    are a group of their own; a spike joins the group of shifts around it; the remaining spikes at one step are one event, and
    events of the same series set are one group of repeated spikes."""
    family = {p.series: families.get(p.series, ("", 0.0))[0] for p in parts}
    shifts = sorted((p for p in parts if p.kind == "shift"), key=lambda p: p.center)
    groups: list[list[Change]] = []
    for p in shifts:
        if groups and p.center <= max(q.center for q in groups[-1]) + window:
            groups[-1].append(p)
        else:
            groups.append([p])
    abrupt = [(min(q.center for q in g) - window, max(q.center for q in g) + window, g) for g in groups]
    # Slow drifts of one family that overlap are one group.
    for p in sorted((p for p in parts if p.kind == "drift"), key=lambda p: p.center):
        home = next((g for g in groups if g[0].kind == "drift" and family[g[0].series] == family[p.series] and _overlap(g, p)), None)
        (home.append(p) if home is not None else groups.append([p]))
    # A condition that starts with shifts or a drift of its family, or soon after (a score pinned at its
    # floor after a collapse, lengths pinned at the limit after they rose), is their incident; one that
    # was there before them is not theirs. Conditions of one family otherwise are one group.
    starts = [
        *abrupt,
        *((min(q.first_step for q in g) - window, max(q.last_step for q in g) + window, g) for g in groups if g[0].kind == "drift"),
    ]
    for p in sorted((p for p in parts if p.kind == "sustained"), key=lambda p: p.center):
        kin = _kin(family[p.series], "sustained")
        host = next(
            (g for lo, hi, g in starts if lo <= p.first_step <= hi + window and any(_kin(family[q.series], "sustained") == kin for q in g)),
            None,
        ) or next(
            (g for g in groups if g[0].kind == "sustained" and _kin(family[g[0].series], "sustained") == kin and _overlap(g, p)), None
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
    notable = [p for p in loose if _severity(p, families) != "info"]
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
    return groups


def _kin(family: str, kind: str) -> str:
    """Families told together: a reward or validation score held at its floor and a reward without
    spread are one condition."""
    return "signal" if kind == "sustained" and family in ("reward", "validation") else family


def _overlap(group: Sequence[Change], p: Change) -> bool:
    lo, hi = min(q.first_step for q in group), max(q.last_step for q in group)
    return p.first_step <= hi and lo <= p.last_step


_NOTCH = {"critical": "warning", "warning": "info", "info": "info"}


def _severity(p: Change, families: Mapping[str, tuple[str, float]], warmup_end: int = -1) -> str:
    """How much a part matters, from the registry's good direction and the size of the change
    (sizes in decades of the fold, or relative where the sign changes; see change_size)."""
    family = families.get(p.series, ("", 0.0))[0]
    if p.bad is False:
        return "info"
    if p.kind == "spike":
        # One-step excursions matter where they are instability (KL, gradient norm); a batch's reward
        # or length dipping for one log and coming back is the batch.
        if family not in ("kl", "grad") or p.direction != "up":
            return "info"  # a KL or gradient norm dropping for one log (a zero-advantage step) is not instability
        # A gradient norm twice its level is a warning; a KL, noisier from one batch to the next, at 3x.
        return "critical" if p.size >= 1.0 else ("warning" if p.size >= (0.5 if family == "kl" else 0.25) else "info")
    if p.kind == "sustained":
        return "critical" if (p.share or 0.0) >= 0.5 else "warning"
    if family == "kl" and p.direction == "up" and p.kind == "shift" and p.steps[-1] <= warmup_end:
        return "info"  # the policy starts at the reference: KL rising from ~0 in the first logs is training starting
    if not _past_danger(p):
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


def _past_danger(p: Change) -> bool:
    """Whether a level change may be critical: it ends past the metric's registry danger threshold in
    its direction, where the registry has one (a KL rising 1e-4 -> 0.02 is a climb to watch, not a
    blow-up; past 10 it is one)."""
    bounds = [limit for way, limit, _inclusive, _why in danger_bounds(p.metric, p.attributes) if way == p.direction]
    if not bounds:
        return True
    return any(p.after > limit if p.direction == "up" else p.after < limit for limit in bounds)


def _incident(
    parts: list[Change], families: Mapping[str, tuple[str, float]], interval: int, stated: Mapping[str, tuple[Any, str]], warmup_end: int
) -> Incident:
    explained = _explained(parts, families, max(interval, 1))
    severities = ["info" if id(p) in explained else _severity(p, families, warmup_end) for p in parts]
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
    incident.name = _name(incident)
    incident.note = _limit_note(incident, stated)
    weight = max(families.get(p.series, ("", 0.5))[1] * (1.0 + min(p.size, 3.0)) for p in parts)
    incident.score = _SEVERITY_WEIGHT[severity] * weight * (1.0 if incident.recovered else 1.3) + 0.1 * len({p.series for p in parts})
    incident.text = _text(incident, families, {id(p): s for p, s in zip(parts, severities)})
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


_LEVEL = ("shift", "drift")


def _part(
    i: Incident, family: str, direction: str | None = None, kinds: tuple[str, ...] = _LEVEL, size: float = 0.0, metric: str | None = None
) -> bool:
    return any(
        i.families.get(p.series) == family
        and (direction is None or p.direction == direction)
        and p.kind in kinds
        and p.size >= size
        and (metric is None or p.metric == metric)
        for p in i.parts
    )


def _phrases(i: Incident) -> list[tuple[str, str]]:
    """(family, phrase) of every description that fits, most telling first."""
    out: list[tuple[str, str]] = []
    length_down = _part(i, "length", "down", size=0.7, metric=M.RL_RESPONSE_LENGTH)
    if length_down and _part(i, "entropy", "down", size=0.5):
        out.append(("length", "policy collapse"))
    elif length_down:
        out.append(("length", "response length collapse"))
    if _part(i, "reward", "down", ("shift",), size=0.3) or _part(i, "reward", "down", size=0.6):
        out.append(("reward", "reward collapse"))
    if _part(i, "entropy", "down", size=0.7) and not any(f == "length" and ph == "policy collapse" for f, ph in out):
        out.append(("entropy", "entropy collapse"))
    if _part(i, "entropy", "up", size=0.7):
        out.append(("entropy", "entropy blow-up"))
    pinned = _part(i, "length", "up", ("sustained",)) or any(
        p.metric == M.RL_RESPONSE_CLIPPED_RATIO and p.direction == "up" and p.kind in _LEVEL and p.after >= 0.9 for p in i.parts
    )
    if pinned:
        out.append(("length", "responses pinned at the length limit"))
    vanishes = any(
        i.families.get(p.series) == "signal"
        and p.kind in _LEVEL
        and p.size >= 1.0
        and p.direction == ("up" if p.metric == M.RL_REWARD_ZERO_STD_RATIO else "down")
        for p in i.parts
    )
    if _part(i, "signal", kinds=("sustained",)) or vanishes:
        out.append(("signal", "no learning signal (the reward has no spread)"))
    if _part(i, "reward", "down", ("sustained",)):
        out.append(("reward", "reward pinned at its floor"))
    if _part(i, "length", "up", ("shift",), size=0.3):
        out.append(("length", "response length blow-up"))
    elif _part(i, "length", "up", ("drift",)):
        out.append(("length", "response length climbs"))
    if _part(i, "grad", "up", size=0.5) and not all(p.recovered for p in i.parts if i.families.get(p.series) == "grad"):
        out.append(("grad", "gradient-norm blow-up"))
    if any(
        i.families.get(p.series) == "kl" and p.direction == "up" and p.kind == "shift" and p.size >= 0.7 and _past_danger(p)
        for p in i.parts
    ):
        out.append(("kl", "KL blow-up"))
    elif _part(i, "kl", "up"):
        out.append(("kl", "KL climbs"))
    spikes = {i.families.get(p.series) for p in i.parts if p.kind == "spike" and p.direction == "up"}
    many = len({s for p in i.parts if p.kind == "spike" for s in p.steps}) > 1
    s = "s" if many else ""
    if {"kl", "grad"} <= spikes:
        out.append(("kl", f"KL and gradient-norm spike{s}"))
    elif "kl" in spikes:
        out.append(("kl", f"KL spike{s}"))
    elif "grad" in spikes:
        out.append(("grad", f"gradient-norm spike{s}"))
    if any(i.families.get(p.series) == "grad" and p.kind == "sustained" and p.after == 0.0 and p.bad is False for p in i.parts):
        out.append(("grad", "gradient norm logged as 0 while the loss is not"))
    elif _part(i, "grad", "down", ("sustained",)):
        out.append(("grad", "no gradient on many steps"))
    if _part(i, "kl", kinds=("sustained",)):
        out.append(("kl", "KL above its danger threshold"))
    if _part(i, "grad", "up", ("sustained",)):
        out.append(("grad", "gradient norm above its danger threshold"))
    for family, up, down in (
        ("reward", "reward rises", "reward declines"),
        ("validation", "validation score rises", "validation score falls"),
        ("entropy", "entropy rises", "entropy falls"),
        ("length", "response length rises", "response length falls"),
        ("kl", "KL rises", "KL falls"),
        ("grad", "gradient norm rises", "gradient norm falls"),
    ):
        way = _net_direction(i, family)
        if way is not None:
            out.append((family, up if way == "up" else down))
    for p in i.parts:
        if i.families.get(p.series) == "signal" and p.kind in _LEVEL:
            grows = p.direction == ("down" if p.metric == M.RL_REWARD_ZERO_STD_RATIO else "up")
            out.append(("signal", "the reward's spread grows" if grows else "the reward's spread shrinks"))
    return out


def _net_direction(i: Incident, family: str) -> str | None:
    """Where the family's level changes in the incident took its first series, all told (a reward that
    climbs -2.1 -> -0.09 and then eases to -0.5 rose)."""
    levels = sorted((p for p in i.parts if i.families.get(p.series) == family and p.kind in _LEVEL), key=lambda p: p.first_step)
    if not levels:
        return None
    own = [p for p in levels if p.series == levels[0].series]
    return "up" if own[-1].after > own[0].before else "down"


def _name(i: Incident) -> str:
    """What a person calls the incident: the most telling description, and a second of another family."""
    phrases = _phrases(i)
    if i.severity == "info":  # no alarm words for what is information
        phrases = [(f, ph) for f, ph in phrases if not any(w in ph for w in ("collapse", "blow-up", "pinned"))]
    if not phrases:
        p = i.parts[0]
        words = _FAMILY_WORDS.get(i.families.get(p.series, ""), p.series)
        return f"{words} {'spike' if p.kind == 'spike' else 'rises' if p.direction == 'up' else 'falls'}"
    family, name = phrases[0]
    covered = {family} | ({"entropy"} if name == "policy collapse" else set())
    second = next((ph for f, ph in phrases[1:6] if f not in covered and not ph.startswith(("reward rises", "the reward's"))), None)
    return f"{name} with {second}" if second else name


def _limit_note(i: Incident, stated: Mapping[str, tuple[Any, str]]) -> str:
    """For lengths pinned at a value: whether that value is the stated limit, corroborated, or not known.

    A stated setting (config dump, trainer arguments) beats an inferred one; an inferred limit needs a
    truncation ratio that says the responses were cut there."""
    pinned = [p for p in i.parts if p.kind == "sustained" and p.metric == M.RL_RESPONSE_LENGTH and p.limit is not None]
    if not pinned:
        return ""
    value = float(pinned[0].limit or 0.0)
    limit, source = stated.get("max_response_length", (None, ""))
    clipped = [p for p in i.parts if p.metric == M.RL_RESPONSE_CLIPPED_RATIO and p.after >= 0.5]
    if isinstance(limit, (int, float)) and not isinstance(limit, bool):
        if math.isclose(value, float(limit), rel_tol=0.01):
            return f"{format_number(value)} tokens is the stated limit (max_response_length, {source})"
        return (
            f"the length sits at {format_number(value)}, not at the stated limit {format_number(float(limit))} ({source}): why is not known"
        )
    if clipped:
        return f"{format_number(value)} tokens is the limit: {clipped[0].series} is {format_number(clipped[0].after)} there"
    return f"the length sits at {format_number(value)}; the log states no limit and no truncation ratio confirms one"


def _span(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


_TEXT_SERIES = 5  # series told in an incident's line; report.json has them all


def _text(i: Incident, families: Mapping[str, tuple[str, float]], severities: Mapping[int, str]) -> str:
    """One line: name, where, and each series' part, what matters most first (spikes with their steps)."""
    rank = {"critical": 0, "warning": 1, "info": 2}

    order = {"shift": 0, "spike": 1, "drift": 2, "sustained": 3}  # what happened, then what it left

    def weight(p: Change) -> tuple[int, int, float, float]:
        return (rank[severities.get(id(p), "info")], order[p.kind], -families.get(p.series, ("", 0.0))[1], -p.size)

    spikes: dict[str, list[Change]] = {}
    told: list[tuple[tuple[int, int, float, float], str]] = []
    for p in i.parts:
        if p.kind == "spike":
            spikes.setdefault(p.series, []).append(p)
        else:
            how = {"drift": " (slowly)", "sustained": ""}.get(p.kind, "")
            told.append((weight(p), p.text + how))
    for name, group in spikes.items():
        group.sort(key=lambda p: p.first_step)
        peaks = ", ".join(f"{format_number(p.after)} at {p.first_step}" for p in group[:6])
        more = f" and {len(group) - 6} more" if len(group) > 6 else ""
        text = f"{name} spike{'s' if len(group) > 1 else ''} {peaks}{more} (typically {format_number(group[0].before)})"
        told.append((min(weight(p) for p in group), text))
    told.sort(key=lambda item: item[0])
    lines = [text for _, text in told[:_TEXT_SERIES]]
    if len(told) > _TEXT_SERIES:
        lines.append(f"and {len(told) - _TEXT_SERIES} more part(s) in report.json")
    where = _span(i.first_step, i.last_step)
    tail = "" if not i.parts or i.recovered or all(p.kind == "spike" for p in i.parts) else "; not back by the end of the log"
    note = f" ({i.note})" if i.note else ""
    return f"{i.name} at {where}: " + "; ".join(lines) + tail + note


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
