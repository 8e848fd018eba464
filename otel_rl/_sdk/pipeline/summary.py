"""The one-line console summary rank 0 prints after each step: which logged metrics it shows
(``HEADLINE_LABELS``), in what order, and how it is formatted."""

from __future__ import annotations

import sys
from collections.abc import Callable

from otel_rl._sdk.pipeline.aggregation import Attrs
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M


def _statistic_label(name: str) -> Callable[[Attrs], str]:
    def label(attrs: Attrs) -> str:
        stat = dict(attrs).get(A.RL_STATISTIC)
        return name if stat in (None, "mean") else f"{name}_{stat}"

    return label


def _loss_label(attrs: Attrs) -> str:
    d = dict(attrs)
    return "loss" if d.get(A.RL_LOSS_TYPE) == "total" and d.get(A.RL_MODEL_ROLE, "actor") == "actor" else f"loss_{d.get(A.RL_LOSS_TYPE)}"


# Values the one-line console summary shows when a step logs them.
HEADLINE_LABELS: dict[str, Callable[[Attrs], str]] = {
    M.RL_SCORE: _statistic_label("score"),
    M.RL_REWARD: _statistic_label("reward"),
    M.RL_POLICY_ENTROPY: _statistic_label("entropy"),
    M.RL_VALIDATION_SCORE: _statistic_label("val"),
    M.RL_POLICY_KL: lambda attrs: "kl" if dict(attrs).get(A.RL_POLICY) == "reference" else "kl_old",
    M.RL_LOSS: _loss_label,
    M.RL_RESPONSE_LENGTH: _statistic_label("resp_len"),
    M.RL_THROUGHPUT_TOKENS: lambda attrs: "tok/s",
    M.RL_GRAD_NORM: lambda attrs: "grad_norm",
}
HEADLINE_ORDER = ("score", "reward", "val", "kl", "kl_old", "entropy", "loss", "grad_norm", "resp_len", "tok/s")


def format_summary(step: int, seconds: float, headline: dict[str, float]) -> str:
    """``[otel-rl] step 3 | 1.20s | reward 0.5 | ...``: the step's time, then its headline values."""
    parts = [f"[otel-rl] step {step}", f"{seconds:.2f}s"]
    for name in HEADLINE_ORDER:
        if name in headline:
            value = headline[name]
            parts.append(f"{name} {value:,.0f}" if abs(value) >= 1000 else f"{name} {value:.4g}")
    return " | ".join(parts)


def print_summary(step: int, seconds: float, headline: dict[str, float]) -> None:
    """Print the step's summary line to stdout (the worker calls it after each step on rank 0)."""
    sys.stdout.write(format_summary(step, seconds, headline) + "\n")
    sys.stdout.flush()
