"""collector-config/otelcol/gateway-series-budget.yaml, from the registry's rank scopes.

otel-rl's ranks keep the series budget themselves (otel_rl/_sdk/pipeline/series_budget.py). The
overlay makes the gateway keep it for senders that do not: another SDK, an older otel-rl, a rank
started with ``OTEL_RL_PER_RANK_METRICS=all`` where the store should not get it. Run
``python -m otel_rl.ops.series_budget_overlay`` after a metric's ``ranks`` changes; a test fails
until the file matches.
"""

from __future__ import annotations

import re

from otel_rl.semconv import METRICS

NAMES_PER_LINE = 6
# A rank other than the lead: otel-rl's rl.rank is an int; other senders may send it as text.
NOT_LEAD = 'resource.attributes["rl.rank"] != nil and resource.attributes["rl.rank"] != 0 and resource.attributes["rl.rank"] != "0"'

HEADER = """\
# Overlay for gateway.yaml: the series budget, kept at the gateway (generated from the registry's
# `ranks` annotations by `python -m otel_rl.ops.series_budget_overlay`; do not edit by hand).
#
#   otelcol-contrib --config collector-config/otelcol/gateway.yaml \\
#                   --config collector-config/otelcol/gateway-series-budget.yaml
#
# otel-rl's ranks keep the budget themselves; this keeps it for senders that do not (another SDK,
# an older otel-rl). From every rank but rank 0 (resource attribute rl.rank):
#   - job-level copies (ranks: copy - the trainer's reward, KL, loss, ...) are dropped;
#   - the buckets of per-rank histograms (ranks: own - stage and compute time) are folded into one,
#     keeping each rank's sum and count (its mean per call); rank 0 keeps the buckets.
# Per-rank state (GPU, process) and each rank's share of the observations pass as they are.
# Leave this overlay out where ranks send whole per-rank copies on purpose (OTEL_RL_PER_RANK_METRICS).
"""


def _alternation(names: list[str]) -> str:
    return "^(" + "|".join(re.escape(n).replace("\\", "\\\\") for n in names) + ")$$"  # $$: a literal $ in collector configs


def render() -> str:
    copies = sorted(n for n, d in METRICS.items() if d.ranks == "copy")
    folded = sorted(n for n, d in METRICS.items() if d.ranks == "own" and d.instrument == "histogram")
    lines = [HEADER, "processors:", "  filter/series_budget:", "    error_mode: ignore", "    metrics:", "      metric:"]
    for i in range(0, len(copies), NAMES_PER_LINE):
        lines.append(f"        - '{NOT_LEAD} and IsMatch(name, \"{_alternation(copies[i : i + NAMES_PER_LINE])}\")'")
    where = f'{NOT_LEAD} and metric.type == METRIC_DATA_TYPE_HISTOGRAM and IsMatch(metric.name, "{_alternation(folded)}")'
    lines += [
        "  transform/series_budget:",
        "    error_mode: ignore",
        "    metric_statements:",
        "      - context: datapoint",
        "        statements:",
        f"          - 'set(bucket_counts, [count]) where {where}'",
        f"          - 'set(explicit_bounds, []) where {where}'",
        "",
        "service:",
        "  pipelines:",
        "    metrics:",
        "      processors: [memory_limiter, filter/series_budget, transform/series_budget, transform/span_metrics_per_rank, transform/prometheus_labels, batch]",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
