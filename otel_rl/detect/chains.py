"""Offline: chains of co-occurring findings (``otel-rl analyze``).

Findings of different metrics whose steps overlap are one story told in lead/lag order, e.g.
KL -> clip fraction -> response length -> entropy -> reward; :func:`build_chains` groups them
and marks the composite divergence (KL, grad norm and entropy or reward together).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from otel_rl.detect.findings import Finding
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

__all__ = ["CHAIN_KINDS", "Chain", "build_chains"]

# Reading order for findings of the same step: the chain seen in a 6000-step GRPO run, KL -> ratio/clip -> length ->
# entropy -> reward -> loss -> grad norm.
_CAUSAL_RANK = {
    M.RL_POLICY_KL: 0,
    M.RL_POLICY_RATIO: 1,
    M.RL_CLIP_FRACTION: 1,
    M.RL_RESPONSE_LENGTH: 2,
    M.RL_RESPONSE_CLIPPED_RATIO: 2,
    M.RL_RESPONSE_TERMINATED_LENGTH: 2,
    M.RL_POLICY_ENTROPY: 3,
    M.RL_REWARD: 4,
    M.RL_REWARD_COMPONENT: 4,
    M.RL_SCORE: 4,
    M.RL_VALIDATION_SCORE: 4,
    M.RL_LOSS: 5,
    M.RL_GRAD_NORM: 6,
}
CHAIN_KINDS = frozenset({"spike", "level shift", "collapse", "explosion"})


def _rank(f: Finding) -> int:
    if f.metric == M.RL_LOSS and f.attributes.get(A.RL_LOSS_TYPE) == A.RlLossTypeValues.KL.value:
        return 0
    return _CAUSAL_RANK.get(f.metric, 7)


def _family(f: Finding) -> tuple[str, tuple[tuple[str, str], ...]]:
    return f.metric, tuple(sorted((k, v) for k, v in f.attributes.items() if k != A.RL_STATISTIC))


@dataclass
class Chain:
    """Findings of different metrics that happened together, in lead/lag order."""

    findings: list[Finding]
    first_step: int
    last_step: int
    divergence: bool = False  # KL, grad norm and entropy or reward all in it (the composite divergence rule)

    def text(self) -> str:
        start = self.findings[0].first_step
        parts = []
        for f in self.findings:
            lag = f.first_step - start
            parts.append(f"{f.series} {f.kind} {f.direction} @{f.first_step}" + (f" (+{lag})" if lag else ""))
        return " -> ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_step": self.first_step,
            "last_step": self.last_step,
            "divergence": self.divergence,
            "order": [
                {
                    "series": f.series,
                    "metric": f.metric,
                    "kind": f.kind,
                    "direction": f.direction,
                    "first_step": f.first_step,
                    "lag_steps": f.first_step - self.first_step,
                }
                for f in self.findings
            ],
            "text": self.text(),
        }


def build_chains(findings: Iterable[Finding], *, gap_steps: int = 1) -> list[Chain]:
    """Group findings of different metric families whose [first, last] steps overlap or lie within
    ``gap_steps`` of each other; order each group by first step, then by the causal reading order.
    Periodic, pinned and improving (good-direction) findings are states, not links of a chain."""
    events = sorted((f for f in findings if f.kind in CHAIN_KINDS and f.bad is not False), key=lambda f: (f.first_step, _rank(f)))
    groups: list[list[Finding]] = []
    end = None
    for f in events:
        if groups and end is not None and f.first_step <= end + gap_steps:
            groups[-1].append(f)
            end = max(end, f.last_step)
        else:
            groups.append([f])
            end = f.last_step
    chains = []
    for group in groups:
        seen: dict[tuple[str, tuple[tuple[str, str], ...]], Finding] = {}
        for f in group:
            key = _family(f)
            if key not in seen:  # the earliest finding of a metric family stands for it
                seen[key] = f
        members = sorted(seen.values(), key=lambda f: (f.first_step, _rank(f), f.series))
        if len({f.metric for f in members}) < 2:
            continue
        metrics = {f.metric for f in members} | {M.RL_POLICY_KL for f in members if _rank(f) == 0}
        divergence = (
            M.RL_POLICY_KL in metrics
            and M.RL_GRAD_NORM in metrics
            and bool(metrics & {M.RL_POLICY_ENTROPY, M.RL_REWARD, M.RL_REWARD_COMPONENT, M.RL_SCORE})
        )
        chains.append(Chain(members, min(f.first_step for f in members), max(f.last_step for f in members), divergence))
    return chains
