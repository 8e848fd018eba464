"""How an incident is named and told in one line: from the registry meaning of what moved and how.

Every number a sentence gives comes from the incident's parts (their before, after, steps and
shares) or from the series' one typical value (its median), so the same series never reads as
three different "typical" values in three places.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from otel_rl.analyze._changes import Change
from otel_rl.analyze._incident import Incident
from otel_rl.detect.records import danger_bounds, format_number
from otel_rl.semconv import metrics as M

FAMILY_WORDS = {  # how a report names each family
    "reward": "reward",
    "validation": "validation score",
    "signal": "reward spread",
    "kl": "KL",
    "grad": "gradient norm",
    "mismatch": "training-inference mismatch",
    "entropy": "entropy",
    "length": "response length",
    "loss": "loss",
}


def silent_function_part(p: Change, families: Mapping[str, str]) -> bool:
    """A part that is a reward function never firing (such a series joins the reward's spread, see
    ``_incidents.watched``); a success rate held at its floor is the reward's own family instead."""
    return p.kind == "sustained" and p.metric == M.RL_REWARD_COMPONENT and families.get(p.series) == "signal"


def past_danger(p: Change) -> bool:
    """Whether a level change may be critical: it ends past the metric's registry danger threshold in
    its direction, where the registry has one (a KL rising 1e-4 -> 0.02 is a climb to watch, not a
    blow-up; past 10 it is one)."""
    metric = M.RL_POLICY_KL if p.metric == M.RL_LOSS else p.metric  # a KL loss term is the KL's value (verl's actor/kl_loss)
    bounds = [
        limit for way, limit, _inclusive, _why in danger_bounds(metric, {} if metric != p.metric else p.attributes) if way == p.direction
    ]
    if not bounds:
        return True
    return any(p.after > limit if p.direction == "up" else p.after < limit for limit in bounds)


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
        held = [p for p in i.parts if p.kind == "sustained" and i.families.get(p.series) == "length"]
        left = bool(held) and all(p.recovered for p in held)  # the run stopped running into the cap for good
        out.append(("length", "responses at the length limit, then under it" if left else "responses pinned at the length limit"))
    silent = {p.series for p in i.parts if silent_function_part(p, i.families)}
    if silent:
        out.append(("signal", "reward functions never fire" if len(silent) > 1 else "a reward function never fires"))
    vanishes = any(
        i.families.get(p.series) == "signal"
        and not silent_function_part(p, i.families)
        and p.kind in _LEVEL
        and p.size >= 1.0
        and p.direction == ("up" if p.metric == M.RL_REWARD_ZERO_STD_RATIO else "down")
        for p in i.parts
    )
    spread = any(
        i.families.get(p.series) == "signal" and p.kind == "sustained" and not silent_function_part(p, i.families) for p in i.parts
    )
    if spread or vanishes:
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
        i.families.get(p.series) == "kl" and p.direction == "up" and p.kind == "shift" and p.size >= 0.7 and past_danger(p) for p in i.parts
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
    if _part(i, "mismatch", "up") or _part(i, "mismatch", "up", ("spike",)):
        out.append(("mismatch", "training-inference mismatch climbs"))
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
            out.append(("signal", "the reward's spread grows" if grows else "learning signal fades (the reward's spread shrinks)"))
    return out


def _net_direction(i: Incident, family: str) -> str | None:
    """Where the family's level changes in the incident took its first series, all told (a reward that
    climbs -2.1 -> -0.09 and then eases to -0.5 rose)."""
    levels = sorted((p for p in i.parts if i.families.get(p.series) == family and p.kind in _LEVEL), key=lambda p: p.first_step)
    if not levels:
        return None
    own = [p for p in levels if p.series == levels[0].series]
    return "up" if own[-1].after > own[0].before else "down"


def incident_name(i: Incident) -> str:
    """What a person calls the incident: the most telling description, and a second of another family."""
    phrases = _phrases(i)
    if i.severity == "info":  # no alarm words for what is information
        phrases = [(f, ph) for f, ph in phrases if not any(w in ph for w in ("collapse", "blow-up", "pinned", "fades"))]
    if not phrases:
        p = i.parts[0]
        words = FAMILY_WORDS.get(i.families.get(p.series, ""), p.series)
        return f"{words} {'spike' if p.kind == 'spike' else 'rises' if p.direction == 'up' else 'falls'}"
    # What the incident alarms on names it first; a move that only came with it never leads.
    alarming = i.alarm_families if i.alarming else set()
    phrases.sort(key=lambda fp: fp[0] not in alarming)
    family, name = phrases[0]
    if name == "responses pinned at the length limit" and "not at the stated limit" in i.note:
        name = "responses held at one length"
    covered = {family} | ({"entropy"} if name == "policy collapse" else set())
    # The second name is another alarm of the same incident, never a plain move ("length rises") nor
    # a move that is information: two unrelated moves read as one event otherwise.
    second = next((ph for f, ph in phrases[1:6] if f not in covered and f in alarming and any(w in ph for w in _ALARM_WORDS)), None)
    return f"{name} with {second}" if second else name


_ALARM_WORDS = ("collapse", "blow-up", "pinned", "spike", "no learning", "danger", "no gradient", "climbs", "fades")


def limit_note(i: Incident, stated: Mapping[str, tuple[Any, str]]) -> str:
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


def incident_text(
    i: Incident, families: Mapping[str, tuple[str, float]], severities: Mapping[int, str], typical: Mapping[str, float]
) -> str:
    """One line: name, where, and each series' part, what matters most first (spikes with their steps:
    the largest always among them; "typically" is the series' median over the whole log)."""
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
        shown = sorted(sorted(group, key=lambda p: -p.size)[:6], key=lambda p: p.first_step)
        peaks = ", ".join(f"{format_number(p.after)} at {p.first_step}" for p in shown)
        more = f" and {len(group) - 6} smaller" if len(group) > 6 else ""
        usual = typical.get(name, group[0].before)
        text = f"{name} spike{'s' if len(group) > 1 else ''} {peaks}{more} (typically {format_number(usual)})"
        told.append((min(weight(p) for p in group), text))
    told.sort(key=lambda item: item[0])
    lines = [text for _, text in told[:_TEXT_SERIES]]
    if len(told) > _TEXT_SERIES:
        lines.append(f"and {len(told) - _TEXT_SERIES} more part(s) in report.json")
    where = _span(i.first_step, i.last_step)
    # a spike is back by definition; a reward function that never fired has no "back" to come to
    ended = i.recovered or all(p.kind == "spike" or silent_function_part(p, i.families) for p in i.parts)
    tail = "" if not i.parts or ended else "; not back by the end of the log"
    note = f" ({i.note})" if i.note else ""
    return f"{i.name} at {where}: " + "; ".join(lines) + tail + note
