"""Incidents beyond the series' changes: how the run ended, non-finite values, and the demotions the
verdict makes (a training reward at its floor while validation rises, reward functions that never
fired while the reward rises)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from otel_rl.analyze._incident import RUN_END, Incident
from otel_rl.analyze._incidents import _SEVERITY_WEIGHT, watched
from otel_rl.analyze._series import Series, SeriesKey
from otel_rl.analyze._wording import FAMILY_WORDS, silent_function_part
from otel_rl.semconv import metrics as M


def demote_training_floor(incidents: list[Incident], why: str) -> list[Incident]:
    """Where validation shows the run learning, a training reward held at its floor (a sparse success
    rate, a shaped score) is no failure: its conditions become information, saying why."""
    for i in incidents:
        held = i.parts and all(p.kind == "sustained" for p in i.parts)
        if held and set(i.families.values()) <= {"reward", "signal"}:
            _demote(i, why)
    return sorted(incidents, key=lambda i: (-i.score, i.first_step))


def demote_silent_functions(incidents: list[Incident], why: str) -> list[Incident]:
    """Where the reward rises all the same, reward functions that never fired (a strict format no
    answer matches) did not stop the run: information, saying why."""
    for i in incidents:
        if i.parts and all(silent_function_part(p, i.families) for p in i.parts):
            _demote(i, why)
    return sorted(incidents, key=lambda i: (-i.score, i.first_step))


def _demote(i: Incident, why: str) -> None:
    if i.severity != "info":
        i.severity = "info"
        i.score = _SEVERITY_WEIGHT["info"] * (1.0 + i.score / 1000.0)
        i.text += f" (information: {why})"


def nonfinite_incidents(series: Mapping[SeriesKey, Series]) -> list[Incident]:
    """NaN or infinite values of a training signal (reward, KL, gradient norm, entropy, length, loss):
    an update that produced them cannot be trusted, whatever the finite steps say. One step that the
    run came back from is a warning; more, or a run that ends in them, is critical."""
    out = []
    for s in series.values():
        role = watched(s) or ((("loss", 0.6)) if s.metric == M.RL_LOSS else None)
        if role is None:
            continue
        steps, x = s.arrays()
        bad = ~np.isfinite(x)
        if not bad.any():
            continue
        where = [int(st) for st in steps[bad]]
        kinds = sorted({"NaN" if math.isnan(v) else "infinite" for v in x[bad]})
        severity = "warning" if len(where) == 1 and bool(np.isfinite(x[-1])) else "critical"
        name = f"non-finite {FAMILY_WORDS.get(role[0], s.label)}"
        incident = Incident(
            name=name,
            severity=severity,
            first_step=where[0],
            last_step=where[-1],
            parts=[],
            families={s.label: role[0], NONFINITE: NONFINITE},
        )
        steps_text = ", ".join(str(st) for st in where[:6]) + (f" and {len(where) - 6} more" if len(where) > 6 else "")
        incident.text = (
            f"{name} at {'step' if len(where) == 1 else 'steps'} {steps_text}: {s.label} is {' or '.join(kinds)} at "
            f"{len(where)} of {x.size} logged steps ({len(where) / x.size:.0%})"
        )
        incident.score = _SEVERITY_WEIGHT[severity] * 1.2 * (1.0 + min(len(where) / x.size * 10, 3.0))
        out.append(incident)
    return out


NONFINITE = "non-finite"  # the family that marks an incident of NaN or infinite values


def ending_incident(ending: Any, *, snapshot: bool = False) -> Incident | None:
    """How the run ended, as an incident when it did not finish: a crash (a traceback, OOM, NCCL
    timeout, full disk after the last step) is critical and ranks first; a log that stops before its
    planned total with no error is a warning (information for a checkpoint's snapshot, which is
    written mid-run by design)."""
    if ending is None or ending.status not in ("crashed", "stopped") or ending.step is None:
        return None
    crashed = ending.status == "crashed"
    severity = "critical" if crashed else ("info" if snapshot else "warning")
    name = f"run crashed ({ending.cause})" if crashed else "run stopped before its planned end"
    incident = Incident(
        name=name,
        severity=severity,
        first_step=ending.step,
        last_step=ending.step,
        parts=[],
        families={RUN_END: RUN_END},
        note=ending.evidence if crashed else "",
    )
    incident.text = f"{name} at step {ending.step}: {ending.text}"
    incident.score = 1e6 if crashed else _SEVERITY_WEIGHT[severity] * 1.3
    return incident
