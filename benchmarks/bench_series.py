"""How many series a 1,024-rank job puts in the metrics store, with the series budget and without.

    python benchmarks/bench_series.py            # about 1 minute
    python benchmarks/bench_series.py --json

Real rank processes send through the local stack's real collectors (agent -> gateway ->
prometheus_remote_write -> VictoriaMetrics), as a job would: rank 0 and two other ranks of a
1,024-rank world, each a loop of 250 ROLL keys, a step span and 6 stage spans each with a
cluster (as benchmarks/bench_rank_cost.py), 6 steps. Then the series VictoriaMetrics holds for
each rank are counted (its /api/v1/series, by rl_rank and run). A second run does the same with
``OTEL_RL_PER_RANK_METRICS=all``: every rank sends everything, as before the budget.

The 1,024-rank figure is computed from the measured per-rank counts (rank 0's, plus 1,023 times
the mean of the others'): the ranks of a job differ in values, not in which series they have. The
span metrics the gateway makes from each rank's spans are counted with the rank's series.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLD = 1024
RANKS = (0, 1, 2)
STEPS = 6

RANK = r"""
import sys
sys.path.insert(0, {bench!r})
from bench_hotpath import step_values
import otel_rl

rank, steps, endpoint, run_id, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
STAGES = [("generate", "actor_infer"), ("reward", "reward"), ("old_logprob", "actor_train"),
          ("ref_logprob", "reference"), ("train_step", "actor_train"), ("sync_weights", "actor_train")]
values = step_values(250)
tel = otel_rl.init(service_name="bench-series", run_id=run_id, rank=rank, world_size={world}, endpoint=endpoint,
                   protocol="grpc", console=False, run_dir=folder, metric_export_interval_s=1.0, framework="roll")
for step in range(steps):
    with tel.step(step):
        for stage, cluster in STAGES:
            with tel.stage(stage, cluster=cluster):
                pass
        tel.log(values)
tel.shutdown()
"""


def series_of(vm: str, run_id: str, rank: int) -> list[dict]:
    query = urllib.parse.urlencode({"match[]": f'{{rl_run_id="{run_id}", rl_rank="{rank}"}}', "start": "-1h"})
    with urllib.request.urlopen(f"{vm}/api/v1/series?{query}", timeout=30) as reply:
        return json.load(reply)["data"]


SPAN_METRICS = "traces_span_metrics_calls_total"  # the gateway's span metrics flush every 15 s


def settled_counts(vm: str, run_id: str, timeout_s: float = 180.0) -> dict[int, dict[str, int]]:
    """Series per rank and metric name, once every rank's span metrics are in and three reads 5 s
    apart agree (the agent's and gateway's batches and VictoriaMetrics' buffers have landed)."""
    end, seen = time.monotonic() + timeout_s, []
    while True:
        time.sleep(5)
        urllib.request.urlopen(f"{vm}/internal/force_flush", timeout=30).read()
        seen.append({rank: dict(Counter(s["__name__"] for s in series_of(vm, run_id, rank))) for rank in RANKS})
        last = seen[-1]
        if len(seen) >= 3 and last == seen[-2] == seen[-3] and all(SPAN_METRICS in last[r] for r in RANKS):
            return last
        if time.monotonic() > end:
            raise SystemExit(f"the series of {run_id} did not settle in {timeout_s:.0f} s: {[totals(c) for c in seen]}")


def totals(by_name: dict[int, dict[str, int]]) -> dict[int, int]:
    return {rank: sum(names.values()) for rank, names in by_name.items()}


def run_job(stack_endpoints: dict[str, str], run_id: str, folder: Path, env: dict[str, str]) -> dict[int, dict[str, int]]:
    code = RANK.format(bench=str(ROOT / "benchmarks"), world=WORLD)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(rank), str(STEPS), stack_endpoints["otlp_grpc"], run_id, str(folder / f"{run_id}-{rank}")],
            env=clean | env,
        )
        for rank in RANKS
    ]
    for p in procs:
        if p.wait(300) != 0:
            raise SystemExit(f"a rank exited with {p.returncode}")
    return settled_counts(stack_endpoints["victoria_metrics"], run_id)


def job_total(counts: dict[int, int]) -> int:
    others = [counts[r] for r in RANKS if r != 0]
    return round(counts[0] + (WORLD - 1) * sum(others) / len(others))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from otel_rl.stack import Stack, free_port_offset

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        stack = Stack(folder / "stack", port_offset=free_port_offset(), only="otelcol-agent,otelcol-gateway,victoria-metrics", out=None)
        stack.up()
        try:
            tag = int(time.time())
            budget_names = run_job(stack.endpoints, f"series-budget-{tag}", folder, {})
            everything_names = run_job(stack.endpoints, f"series-all-{tag}", folder, {"OTEL_RL_PER_RANK_METRICS": "all"})
        finally:
            stack.down()
    budget, everything = totals(budget_names), totals(everything_names)
    other = sorted(budget_names[RANKS[1]].items(), key=lambda kv: -kv[1])
    result = {
        "world": WORLD,
        "per_rank_budget": budget,
        "per_rank_all": everything,
        "other_rank_budget_by_name": dict(other),
        "job_budget": job_total(budget),
        "job_all": job_total(everything),
    }
    result["ratio"] = round(result["job_budget"] / result["job_all"], 4)
    if args.json:
        print(json.dumps(result))
        return
    print(f"series in VictoriaMetrics per rank (ranks {', '.join(map(str, RANKS))} of {WORLD}):")
    print(f"  with the series budget: {budget}")
    print(f"  every rank sends all:   {everything}")
    print(f"  rank {RANKS[1]} with the budget, by name: " + ", ".join(f"{n} {c}" for n, c in other[:8]))
    print(f"a {WORLD}-rank job: {result['job_budget']:,} series with the budget, {result['job_all']:,} without ({result['ratio']:.3f}x)")


if __name__ == "__main__":
    main()
