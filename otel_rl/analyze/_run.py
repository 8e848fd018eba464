"""Analysis of one run: series, findings, chains, replayed alert rules, settings and recommendations."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from otel_rl._sdk.keys.resolver import KeyResolver
from otel_rl.analyze._explain import kl_coefficient_from_loss
from otel_rl.analyze._incidents import Incident, decline_incidents, find_incidents, gave_back, headline, watched_metric
from otel_rl.analyze._run_incidents import demote_silent_functions, demote_training_floor, ending_incident, nonfinite_incidents
from otel_rl.analyze._series import Series, SeriesKey, build_series, resolved_records
from otel_rl.analyze._verdict import Verdict, validation_series, verdict
from otel_rl.detect.detectors import (
    Alert,
    AlertEngine,
    Chain,
    DetectorConfig,
    Finding,
    Rule,
    build_chains,
    danger_bounds,
    default_rules,
    detect_series,
    direction_of,
)
from otel_rl.replay import ParsedLog
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

# Schedules, counters and clocks: they move by design, so their changes are context, not events.
NOT_JUDGED = frozenset({
    M.RL_LEARNING_RATE, M.RL_KL_COEFFICIENT, M.RL_PROGRESS_EPOCH, M.RL_PROGRESS_STEP, M.RL_PROGRESS_RATIO,
    M.RL_PROGRESS_MAX_STEPS, M.RL_RUN_ELAPSED_TIME, M.RL_RUN_REMAINING_TIME, M.RL_BATCH_SAMPLES,
})
_DIRECTION_TEXT = {"higher": "higher is better", "lower": "lower is better",
                   "range": "stay in its normal range", None: "no good direction (context)"}

# Plot and summary order, as an engineer reads a run: the outcome (score, reward, validation) first,
# then the policy's state (length, truncation, entropy), then the optimizer's signals.
KEY_FAMILIES: tuple[tuple[str, dict[str, str]], ...] = (
    (M.RL_SCORE, {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}),
    (M.RL_REWARD, {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}),
    (M.RL_VALIDATION_SCORE, {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}),
    (M.RL_REWARD_COMPONENT, {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}),
    (M.RL_RESPONSE_LENGTH, {A.RL_STATISTIC: A.RlStatisticValues.MEAN.value}),
    (M.RL_RESPONSE_CLIPPED_RATIO, {}),
    (M.RL_POLICY_ENTROPY, {}),
    (M.RL_POLICY_KL, {}),
    (M.RL_LOSS, {A.RL_LOSS_TYPE: A.RlLossTypeValues.KL.value}),
    (M.RL_GRAD_NORM, {}),
    (M.RL_TRAIN_INFER_KL, {}),
    (M.RL_LOSS, {A.RL_LOSS_TYPE: A.RlLossTypeValues.TOTAL.value}),
    (M.RL_STEP_DURATION, {}),
    (M.RL_LEARNING_RATE, {}),
)

# The length limit read from the data: only where the log states none and the truncation ratio confirms it.
INFERRED_MAX_LENGTH = "max completion length (from the log: lengths held there while the truncation ratio is >= 0.5)"
_KL_SETTING = re.compile(r"(^|[/._])(beta|kl_coef|kl_ctl|init_kl_coef|kl_loss_coef|kl_coeff)$")
_GRAD_CLIP_SETTING = re.compile(r"(^|[/._])(max_grad_norm|grad_clip|clip_grad)$")
_MAX_LEN_SETTING = re.compile(r"(^|[/._])(max_completion_length|max_new_tokens|response_length|max_response_length)$")
_WARMUP_SETTING = re.compile(r"(^|[/._])(warmup_ratio|warmup_steps|lr_warmup_steps|lr_warmup_steps_ratio)$")


@dataclass
class MetricRow:
    label: str
    keys: list[str]
    metric: str
    attributes: dict[str, str]
    brief: str
    unit: str
    direction: str | None
    points: int
    first: float
    last: float
    minimum: float
    maximum: float
    trend: str
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for key in ("first", "last", "minimum", "maximum"):
            out[key] = _num(out[key])
        out["good_direction"] = _DIRECTION_TEXT.get(self.direction, "no good direction (context)")
        return out


def _num(value: float) -> float | str:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return float(f"{value:.6g}")


def fmt(value: float) -> str:
    if isinstance(value, (int, np.integer)):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.3g}"
    return f"{value:.4g}"


@dataclass
class Recommendation:
    topic: str
    action: str
    evidence: list[str]
    setting: str | None = None  # what the log shows of the setting concerned

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class RunAnalysis:
    parsed: ParsedLog
    series: dict[SeriesKey, Series]
    unmapped: list[str]
    metrics: list[MetricRow]
    findings: list[Finding]
    chains: list[Chain]
    alerts: list[Alert]
    settings: dict[str, Any]
    recommendations: list[Recommendation]
    step_interval: int
    plots: list[str] = field(default_factory=list)
    plot_failures: list[str] = field(default_factory=list)  # "<series>: <why>" of each plot that failed
    verdict: Verdict | None = None
    incidents: list[Incident] = field(default_factory=list)  # most important first
    incident_plots: list[tuple[int, str]] = field(default_factory=list)  # (headline index, picture path)

    @property
    def headline(self) -> list[Incident]:
        """The incidents the report opens with (the top of the ranking, at most 7)."""
        return headline(self.incidents)

    @property
    def first_step(self) -> int | None:
        return min((r.step for r in self.parsed.records), default=None)

    @property
    def last_step(self) -> int | None:
        return max((r.step for r in self.parsed.records), default=None)

    @property
    def events(self) -> list[Finding]:
        """Findings that are anomalies (not schedules): everything but periodic patterns."""
        return [f for f in self.findings if f.kind != "periodic"]


def _matches(series: Series, metric: str, attrs: dict[str, str]) -> bool:
    return series.metric == metric and all(series.attributes.get(k) == v for k, v in attrs.items())


def key_series(series: dict[SeriesKey, Series]) -> list[Series]:
    """The run's headline series, in reading order (one per family, plus the reward components)."""
    out: list[Series] = []
    for metric, attrs in KEY_FAMILIES:
        found = sorted((s for s in series.values() if _matches(s, metric, attrs)),
                       key=lambda s: (s.attributes.get(A.RL_STATISTIC, "mean") != "mean", s.label))
        if metric == M.RL_REWARD_COMPONENT:
            out.extend(found[:3])
        elif found:
            out.append(found[0])
    seen: set[SeriesKey] = set()
    unique = []
    for s in out:
        if s.key not in seen:
            seen.add(s.key)
            unique.append(s)
    return unique


def _trend(x: np.ndarray) -> str:
    n = len(x)
    if n < 4:
        return ""
    k = max(1, n // 10)
    start, end = float(np.median(x[:k])), float(np.median(x[-k:]))
    if start == end:
        return "flat"
    change = f" ({(end - start) / abs(start):+.0%})" if start != 0 else ""
    return f"{fmt(start)} -> {fmt(end)}{change}"


def _metric_rows(series: dict[SeriesKey, Series]) -> list[MetricRow]:
    rows = []
    for s in sorted(series.values(), key=lambda s: (s.metric, s.label)):
        steps, x = s.arrays()
        finite = x[np.isfinite(x)]
        mdef = METRICS.get(s.metric)
        row = MetricRow(
            label=s.label, keys=list(s.keys), metric=s.metric, attributes=dict(s.attributes),
            brief=mdef.brief if mdef is not None else "", unit=mdef.unit if mdef is not None else "",
            direction=direction_of(s.metric, s.attributes), points=len(x),
            first=float(x[0]), last=float(x[-1]),
            minimum=float(finite.min()) if finite.size else float("nan"),
            maximum=float(finite.max()) if finite.size else float("nan"),
            trend=_trend(finite),
        )
        if finite.size and float(finite.min()) == float(finite.max()):
            row.notes.append(f"constant {fmt(float(finite[0]))}")
        elif finite.size:
            zeros = int((finite == 0).sum())
            if zeros and s.metric == M.RL_GRAD_NORM:
                row.notes.append(f"exactly 0 on {zeros} step(s)")
        if finite.size < x.size:
            row.notes.append(f"{x.size - finite.size} non-finite value(s)")
        if s.metric == M.RL_UNMAPPED:
            row.notes.append("no mapping knows this key")
        rows.append(row)
    return rows


def _step_interval(series: dict[SeriesKey, Series]) -> int:
    best: list[int] = []
    for s in series.values():
        steps = sorted(s.by_step)
        if len(steps) > len(best):
            best = steps
    if len(best) < 2:
        return 1
    return max(1, int(np.median(np.diff(best))))


def _settings(parsed: ParsedLog, series: dict[SeriesKey, Series], findings: list[Finding]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for key, value in parsed.settings.items():
        settings[str(key)] = value
    lr = next((s for s in series.values() if s.metric == M.RL_LEARNING_RATE), None)
    if lr is not None:
        steps, x = lr.arrays()
        if x.size and float(np.nanmax(x)) > 0:
            peak = float(np.nanmax(x))
            reach = int(steps[np.argmax(x >= 0.95 * peak)])
            held = steps[x >= 0.8 * peak]
            settings["learning_rate (peak, from the log)"] = peak
            settings["warm-up (steps to 95% of the peak LR, from the log)"] = reach
            settings["LR >= 80% of its peak (steps, from the log)"] = f"{int(held[0])}-{int(held[-1])}"
    # A limit inferred from the data only where the log states none and a truncation ratio says the
    # responses were cut there: a length that sits at one value is not, by itself, the limit.
    if parsed.settings.get("max_response_length") is None:
        clipped = [s for s in series.values() if s.metric == M.RL_RESPONSE_CLIPPED_RATIO]
        for f in findings:
            if (f.kind == "pinned-at-limit" and f.metric == M.RL_RESPONSE_LENGTH and f.limit and f.direction == "up"
                    and f.attributes.get(A.RL_STATISTIC, A.RlStatisticValues.MAX.value) == A.RlStatisticValues.MAX.value):
                cut = [v for s in clipped for st, v in s.by_step.items() if f.first_step <= st <= f.last_step]
                if cut and float(np.median(cut)) >= 0.5:
                    settings[INFERRED_MAX_LENGTH] = int(f.limit)
                break
    return settings


def _find_setting(settings: dict[str, Any], pattern: re.Pattern[str]) -> tuple[str, Any] | None:
    for key, value in settings.items():
        if pattern.search(str(key)):
            return str(key), value
    return None


def _is_kl(f: Finding | Series) -> bool:
    """KL to the REFERENCE model (or the KL loss term): what a KL coefficient controls. KL to the
    previous policy (verl's actor/ppo_kl) is not: with one update per batch it is 0 by construction."""
    if f.metric == M.RL_LOSS:
        return f.attributes.get(A.RL_LOSS_TYPE) == A.RlLossTypeValues.KL.value
    return f.metric == M.RL_POLICY_KL and f.attributes.get(A.RL_POLICY) != A.RlPolicyValues.OLD.value


def _setting(run: RunAnalysis, name: str) -> tuple[Any, str] | None:
    """A canonical setting the log shows, with where it shows it."""
    value = run.parsed.settings.get(name)
    if value is None:
        return None
    return value, run.parsed.setting_sources.get(name, "the log")


def _setting_text(run: RunAnalysis, name: str) -> str | None:
    found = _setting(run, name)
    return f"{name} = {found[0]} ({found[1]})" if found else None


def _where(findings: Sequence[Finding], limit: int = 4) -> str:
    parts = [f"step {f.peak_step} ({fmt(f.peak_value)} vs {fmt(f.baseline)})" for f in findings[:limit]]
    if len(findings) > limit:
        parts.append(f"{len(findings) - limit} more")
    return ", ".join(parts)


def recommend(run: RunAnalysis) -> list[Recommendation]:
    """Recommendations tied to this run's evidence (and its settings, where the log shows them)."""
    recs: list[Recommendation] = []
    events = [f for f in run.findings if f.kind in ("spike", "explosion", "level shift", "collapse")]
    # Advice follows what the report alarms on: a finding counts only inside a warning or critical
    # incident of its family (a spike the registry's scale, or an explanation, leaves as information
    # asks for no change of settings), and only a training signal's (a timer's spike is no instability).
    serious = [i for i in run.incidents if i.severity in ("critical", "warning")]
    bad = [f for f in events if f.bad is True and _in_alarm(f, serious, run.step_interval)]
    series = list(run.series.values())

    kl_up = [f for f in bad if _is_kl(f) and f.direction == "up"]
    kl_series = [s for s in series if _is_kl(s)]
    # Past the registry's danger threshold of the KL to the reference (10), from the first point.
    kl_high: list[int] = []
    kl_limit = None
    for s in kl_series:
        steps, x = s.arrays()
        for sign, limit, _inclusive, _why in danger_bounds(s.metric, s.attributes):
            if sign == "up":
                kl_limit = limit
                kl_high.extend(int(st) for st in steps[x > limit])
    kl_high.sort()
    kl_coef = _setting(run, "kl_coef")
    kl_text = _setting_text(run, "kl_coef")
    logged_coef = next((s for s in series if s.metric == M.RL_KL_COEFFICIENT), None)
    if kl_text is None and logged_coef is not None:
        value = float(logged_coef.arrays()[1][-1])
        kl_coef, kl_text = (value, f"the logged {logged_coef.label}"), f"{logged_coef.label} = {fmt(value)} (logged)"
    if kl_up or kl_high:
        evidence = []
        if kl_up:
            evidence.append(f"KL to the reference left its baseline {len(kl_up)} time(s): {_where(kl_up)}")
        if kl_high:
            evidence.append(f"KL to the reference > {fmt(kl_limit or 0.0)} (the registry's danger threshold, a common "
                            f"roll-back point) on {len(kl_high)} logged step(s), first at step {kl_high[0]}")
        if kl_coef is not None and kl_coef[0] == 0:
            action = ("Nothing holds the policy near the reference (the log's settings give no KL term): add one, e.g. "
                      "a KL loss with a coefficient of 0.001-0.04, or an adaptive KL controller.")
        else:
            action = ("Raise the KL coefficient so the policy is held nearer the reference, or make it adaptive "
                      "(target a KL and adjust the coefficient each step).")
            action += (f" The log shows {kl_text}: try 2-5x that." if kl_text else
                       " The log does not show the coefficient (no config or header with it); common values are 0.001-0.1.")
        recs.append(Recommendation("KL coefficient", action, evidence, kl_text))
    elif kl_series and all(np.all(s.arrays()[1] == 0) for s in kl_series):
        recs.append(Recommendation(
            "KL coefficient", "Nothing holds the policy near the reference (KL is 0 at every step: beta = 0, or KL not "
            "computed). That is a valid GRPO setting; if the run drifts (entropy falling, lengths growing), a small beta "
            "(0.01-0.04) is the first brake.", [f"{s.label} = 0 on all {len(s.by_step)} logged steps" for s in kl_series[:1]],
            kl_text))

    grad_up = [f for f in bad if f.metric == M.RL_GRAD_NORM and f.direction == "up"]
    g = next((s for s in series if s.metric == M.RL_GRAD_NORM), None)
    if grad_up and g is not None:
        clip = _setting(run, "grad_clip")
        limit = float(clip[0]) if clip is not None and isinstance(clip[0], (int, float)) and clip[0] > 0 else 1.0
        _, gx = g.arrays()
        over = [f for f in grad_up if f.peak_value > limit]
        # Advice to clip needs norms above the clip: a norm that never reaches it is clipped by nothing.
        if over:
            median = float(np.nanmedian(gx))
            where = (f"the log shows grad_clip = {clip[0]} ({clip[1]})" if clip is not None else
                     "the log does not show the clip; 1.0 (the Trainer's and verl's default) is assumed")
            action = (f"Gradient norms far above the clip ({fmt(limit)}) mean updates hit the clip hard: lower the "
                      "learning rate, or skip the optimizer step when the norm is far above its running median; "
                      f"{where}. The logged norm is measured before clipping.")
            recs.append(Recommendation("gradient clipping", action,
                                       [f"{g.label} median {fmt(median)}, max {fmt(float(np.nanmax(gx)))}; above the clip at "
                                        f"{_where(over)}"], _setting_text(run, "grad_clip")))
    zero_grad = [f for f in run.findings if f.kind == "pinned-at-limit" and f.metric == M.RL_GRAD_NORM and f.limit == 0.0]
    if zero_grad:
        f = zero_grad[0]
        zero_std = next((s for s in series if s.metric == M.RL_REWARD_ZERO_STD_RATIO), None)
        evidence = [f"{f.series} is exactly 0 on {f.count} logged steps ({f.first_step}-{f.last_step})"]
        if zero_std is not None:
            evidence.append(f"frac_reward_zero_std median {fmt(float(np.nanmedian(zero_std.arrays()[1])))}: "
                            "groups whose rewards are all equal give zero advantage")
        recs.append(Recommendation(
            "no learning signal", "Those steps changed nothing. Give each prompt a chance of differing rewards: more "
            "generations per prompt, a higher temperature, a graded reward, or drop prompts whose group rewards are all "
            "equal (dynamic sampling).", evidence))

    lr = next((s for s in series if s.metric == M.RL_LEARNING_RATE), None)
    if lr is not None and bad:
        steps, x = lr.arrays()
        peak = float(np.nanmax(x)) if x.size else 0.0
        unstable = [f for f in bad if f.kind in ("explosion", "collapse", "spike") and _family_of(f) is not None]
        at_peak = [f for f in unstable if _value_at(steps, x, f.first_step) >= 0.8 * peak] if peak > 0 else []
        # Only a schedule that moves (a warm-up or a decay over >= 5% of the logged steps) can be
        # blamed for when things broke: under a constant LR every break happens "at the peak".
        held_high = float((x >= 0.8 * peak).mean()) if x.size and peak > 0 else 0.0
        # Against the base rate: with the LR that high on 84% of the steps, 17 of 18 breaks there says nothing.
        share = len(at_peak) / len(unstable) if unstable else 0.0
        if at_peak and len(at_peak) >= 3 and share >= 0.5 and share >= held_high + 0.2 and held_high <= 0.95:
            warm = _find_setting(run.settings, _WARMUP_SETTING)
            action = (f"Lower the learning rate (peak {fmt(peak)}) and lengthen the warm-up (warmup_ratio 0.1): "
                      f"{len(at_peak)} of {len(unstable)} instabilities happened with the LR at >= 80% of its peak.")
            held = run.settings.get("LR >= 80% of its peak (steps, from the log)")
            evidence = [f"LR >= 80% of its peak over steps {held}" if held else
                        f"peak LR {fmt(peak)}, at >= 80% of it on {held_high:.0%} of logged steps",
                        f"instabilities at steps {', '.join(str(s) for s in sorted({f.first_step for f in at_peak})[:6])}"]
            recs.append(Recommendation("learning rate and warm-up", action, evidence,
                                       f"{warm[0]} = {warm[1]}" if warm else None))

    clipped = [s for s in series if s.metric == M.RL_RESPONSE_CLIPPED_RATIO]
    # Lengths held at the limit: the longest (or the mean) response of a step at its maximum.
    pinned_len = [f for f in run.findings if f.kind == "pinned-at-limit" and f.metric == M.RL_RESPONSE_LENGTH and
                  f.direction == "up" and f.attributes.get(A.RL_STATISTIC, "mean") in ("max", "mean")]
    configured = _setting(run, "max_response_length")
    clip_max = 0.0
    evidence = []
    for s in clipped[:1]:
        _, x = s.arrays()
        clip_max = float(np.nanmax(x)) if x.size else 0.0
        if clip_max > 0:
            over = int((x > 0.3).sum())
            evidence.append(f"{s.label} median {fmt(float(np.nanmedian(x)))}, max {fmt(clip_max)}"
                            + (f", > 0.3 on {over} of {x.size} logged steps" if over else ""))
    at_limit = pinned_len
    if configured is not None and isinstance(configured[0], (int, float)):
        at_limit = [f for f in pinned_len if f.limit is not None and f.limit >= 0.98 * float(configured[0])]
    for f in at_limit[:2]:
        evidence.append(f"{f.series} at {fmt(f.limit or 0)} on {f.count} logged steps")
    mean_at_limit = any(f.attributes.get(A.RL_STATISTIC, "mean") == "mean" for f in at_limit)
    clip_events = [f for f in bad if f.metric in (M.RL_RESPONSE_CLIPPED_RATIO, M.RL_RESPONSE_LENGTH) and f.direction == "up"]
    # Length advice needs material truncation in the log: at least 10% of responses cut at some
    # step, or the mean length at the limit. A rare long answer hitting the cap needs no change.
    material = clip_max >= 0.1 or mean_at_limit or (not clipped and bool(at_limit))
    if clip_events and material:
        evidence.append(f"length / truncation growth at {_where(clip_events)}")
    if material:
        limit = configured[0] if configured is not None else run.settings.get(INFERRED_MAX_LENGTH)
        action = "Responses run into the length limit, and truncated answers score badly or break the format."
        action += (f" Raise the limit above {limit} if the task needs long answers; otherwise penalize length and score "
                   "truncated completions 0 (cutting the limit and zeroing truncated answers stopped a length blow-up in a "
                   "6000-step GRPO run)." if limit else " Raise the limit if answers need the room; otherwise penalize "
                   "length and score truncated completions 0.")
        recs.append(Recommendation("max completion length", action, evidence,
                                   _setting_text(run, "max_response_length") or (f"limit seen in the log: {limit}" if limit else
                                                                                 "the log does not show the length limit")))

    entropy_drop = [f for f in bad if f.metric == M.RL_POLICY_ENTROPY and f.kind == "collapse"]
    ent = next((s for s in series if s.metric == M.RL_POLICY_ENTROPY and s.attributes.get(A.RL_STATISTIC, "mean") == "mean"), None)
    falling = None
    if ent is not None:
        _, x = ent.arrays()
        x = x[np.isfinite(x)]
        k = max(1, x.size // 10)
        if x.size >= 10 and float(np.median(x[:k])) > 0 and float(np.median(x[-k:])) < 0.5 * float(np.median(x[:k])):
            falling = f"{ent.label} fell from {fmt(float(np.median(x[:k])))} to {fmt(float(np.median(x[-k:])))}"
    if entropy_drop or falling:
        evidence = [e for e in (falling,) if e] + ([f"entropy collapse at {_where(entropy_drop)}"] if entropy_drop else [])
        recs.append(Recommendation("entropy", "The policy is becoming deterministic: raise the sampling temperature, add "
                                   "an entropy bonus, or loosen the upper clip (clip-higher) so low-probability tokens can grow.",
                                   evidence))

    # A reward collapse is the level (mean) going down and staying down, not one bad group's minimum.
    reward_down = [f for f in bad if f.metric in (M.RL_REWARD, M.RL_REWARD_COMPONENT, M.RL_SCORE) and f.direction == "down"
                   and f.attributes.get(A.RL_STATISTIC, "mean") == "mean"
                   and (f.kind in ("collapse", "level shift") or f.severity == "critical")]
    if reward_down:
        save = run.settings.get("save_steps")
        first = min(f.first_step for f in reward_down)
        chain = next((c for c in run.chains if c.first_step <= first <= c.last_step + run.step_interval), None)
        evidence = [f"reward drops at {_where(reward_down)}"]
        if chain is not None:
            evidence.append(f"together with: {chain.text()}")
        action = "Treat the reward drop as a symptom: fix what leads it in the chain (KL, length), and keep a checkpoint to roll back to"
        action += f" (the log shows save_steps = {save}: the last one before step {first} is step {first // int(save) * int(save)})." \
            if isinstance(save, int) and save > 0 else "."
        recs.append(Recommendation("reward collapse", action, evidence))

    periodic = [f for f in run.findings if f.kind == "periodic"]
    if periodic:
        f = periodic[0]
        save = run.settings.get("save_steps")
        eval_steps = run.settings.get("eval_steps")
        hint = ""
        if f.period and isinstance(save, int) and save and abs(f.period - save) <= max(1, 0.05 * save):
            hint = f" It matches save_steps = {save}: checkpointing."
        elif f.period and isinstance(eval_steps, int) and eval_steps and abs(f.period - eval_steps) <= max(1, 0.05 * eval_steps):
            hint = f" It matches eval_steps = {eval_steps}: validation."
        recs.append(Recommendation("periodic steps", "Expected work on a schedule, not an anomaly; make it asynchronous if "
                                   f"it costs too much.{hint}", [f"{f.series}: {f.detail}"]))

    if any(c.divergence for c in run.chains) or kl_high:
        recs.append(Recommendation("online alerts", "Catch this while training: otel_rl.init(alert_rules=\"default\", "
                                   "on_alert=...) fires rl.alert events for the divergence rule (KL, grad norm and entropy "
                                   "together) and the kl > 10 / clipped_ratio > 0.3 thresholds, off the training thread; poll "
                                   "tel.should_stop or tel.take_alerts() to save a snapshot or roll back.",
                                   [c.text() for c in run.chains if c.divergence][:2] or
                                   [f"KL > {fmt(kl_limit or 0.0)} at step {kl_high[0]}"]))
    v = run.verdict
    if v is not None and v.learned in ("no clear change", "worse") and not reward_down and \
            not any(r.topic == "no learning signal" for r in recs):
        zero_std = next((s for s in series if s.metric == M.RL_REWARD_ZERO_STD_RATIO), None)
        evidence = [v.learned_text]
        if zero_std is not None:
            evidence.append(f"{zero_std.label} median {fmt(float(np.nanmedian(zero_std.arrays()[1])))}: the share of "
                            "groups whose rewards are all equal (no advantage, no learning signal)")
        recs.append(Recommendation(
            "no learning", "The reward did not improve over the run. Check that the reward can differ within a group "
            "(a component that never fires, or one pinned at its maximum, gives no signal), that prompts are neither "
            "always solved nor never solved, and that the learning rate is not too small.", evidence))
    if not recs:
        if serious:
            recs.append(Recommendation("none", "No change of settings follows from what this log shows: the incidents above "
                                       "point to no setting the log states (see each incident's line for what happened).",
                                       [f"{len(serious)} warning or critical incident(s); {len(run.series)} series checked"]))
        else:
            recs.append(Recommendation("none", "No instability found that calls for a change of settings.",
                                       [f"{len(run.series)} series checked over {len(run.parsed.records)} logged steps"]))
    return recs


def _family_of(f: Finding) -> str | None:
    role = watched_metric(f.metric, f.attributes)
    return role[0] if role is not None else None


def _in_alarm(f: Finding, serious: Sequence[Incident], interval: int) -> bool:
    """Whether a finding sits inside a warning or critical incident that alarms on its family."""
    family = _family_of(f)
    return family is not None and any(
        family in i.alarm_families and i.first_step - interval <= f.peak_step <= i.last_step + interval for i in serious
    )


def _value_at(steps: np.ndarray, x: np.ndarray, step: int) -> float:
    i = int(np.searchsorted(steps, step, side="right")) - 1
    return float(x[max(i, 0)]) if x.size else float("nan")


def replay_rules(parsed: ParsedLog, rules: Sequence[Rule], resolver: KeyResolver | None = None) -> list[Alert]:
    """The alerts the online rules would have fired on this log, evaluated exactly as in training."""
    engine = AlertEngine(rules)
    alerts: list[Alert] = []
    for step, resolved in resolved_records(parsed, resolver, only=engine.watched_metrics):
        alerts.extend(engine.observe(step, 0, resolved))
    return alerts


def analyze_parsed(parsed: ParsedLog, *, cfg: DetectorConfig = DetectorConfig(), rules: Sequence[Rule] | None = None,
                   resolver: KeyResolver | None = None) -> RunAnalysis:
    """Everything the report says about one parsed log."""
    resolver = resolver or KeyResolver.default(unmapped_key_limit=1 << 20)
    series, unmapped = build_series(parsed, resolver)
    findings: list[Finding] = []
    clip = parsed.settings.get("grad_clip")
    known = {"grad_clip": float(clip)} if isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip > 0 else {}
    for s in series.values():
        mdef = METRICS.get(s.metric)
        if s.metric in NOT_JUDGED or (mdef is not None and mdef.instrument == "counter"):
            continue
        steps, x = s.arrays()
        findings.extend(detect_series(steps, x, series=s.label, metric=s.metric, attributes=s.attributes, cfg=cfg,
                                      settings=known))
    findings.sort(key=lambda f: (f.first_step, f.series))
    interval = _step_interval(series)
    chains = build_chains(findings, gap_steps=2 * interval)
    alerts = replay_rules(parsed, default_rules() if rules is None else rules, resolver)
    run = RunAnalysis(parsed=parsed, series=series, unmapped=unmapped, metrics=_metric_rows(series), findings=findings,
                      chains=chains, alerts=alerts, settings={}, recommendations=[], step_interval=interval)
    if parsed.settings.get("kl_coef") is None:
        proved = kl_coefficient_from_loss(series)
        if proved is not None:
            parsed.settings["kl_coef"], parsed.setting_sources["kl_coef"] = proved
    run.settings = _settings(parsed, series, findings)
    held_out = validation_series(series)
    fell = gave_back(held_out) if held_out is not None else None
    run.incidents = find_incidents(series, findings, interval=interval, settings=parsed.settings, sources=parsed.setting_sources,
                                   outcome_steps=[(fell.first_step, fell.last_step)] if fell is not None else [])
    ending = ending_incident(parsed.ending, snapshot=parsed.format == "trl-state")
    extra = [*([ending] if ending is not None else []), *nonfinite_incidents(series)]
    if extra:
        run.incidents = sorted([*extra, *run.incidents], key=lambda i: (-i.score, i.first_step))
    run.verdict = verdict(series, parsed.doubts, run.incidents)
    if run.verdict.training_learned == "yes":  # the reward rises: a reward function that never fired did not stop it
        run.incidents = demote_silent_functions(run.incidents, f"{run.verdict.reward_series or 'the reward'} rises without them")
        run.verdict = verdict(series, parsed.doubts, run.incidents)
    if run.verdict.validation_learned == "yes":  # validation rises: a training reward at its floor is no failure
        run.incidents = demote_training_floor(run.incidents, f"validation {run.verdict.validation_series} rises")
        run.verdict = verdict(series, parsed.doubts, run.incidents)
    declines = decline_incidents(run.verdict, series, run.incidents, fell)
    if declines:
        run.incidents = sorted([*run.incidents, *declines], key=lambda i: (-i.score, i.first_step))
        run.verdict = verdict(series, parsed.doubts, run.incidents)
    run.recommendations = recommend(run)
    return run
