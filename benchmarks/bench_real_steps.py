"""What logging the steps of real training runs costs the whole process, side by side in one process.

    python benchmarks/bench_real_steps.py            # the table
    python benchmarks/bench_real_steps.py --quick    # fewer steps and rounds
    python benchmarks/bench_real_steps.py --json

The steps are those of public training logs (``../shared/logs``, read with ``otel_rl.replay``):
verl's metric dicts (58-80 keys, of which 5-12 are ints: ``training/global_step``,
``global_seqlen/*``, ``num_turns/*``) and TRL's ``log_history`` entries (13-28 floats). Each log's
steps are logged in their order, one per 1 ms of pure-Python work, by each way in interleaved
rounds of 100 steps (201 pairs per log, as ``bench_total.py``'s target row, whose machinery this uses):

- off: the work alone;
- otel-rl: ``otel_rl.init()`` with the log's framework and its default exporters (the run folder),
  ``log()`` of the step's dict;
- OTel SDK: one synchronous gauge per key, ``set()`` each step.

A way's added CPU per step is the median of its rounds' paired differences with the work alone,
plus what its threads use while the other ways run (the whole process: every thread, flush
included). Without ``../shared/logs`` (a user's clone) there is nothing to read: it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
from bench_total import FLUSH_EVERY, TARGET_STEPS, Off, OtelRl, Sdk, Way, _added, calibrate, measure, owned  # noqa: E402

from otel_rl.replay import parse_file  # noqa: E402

LOGS = ROOT.parent / "shared" / "logs"
RUNS = {
    "verl_opd_qwen2-3b_wandb-outputlog_healthy.log": "verl",
    "verl_opd_qwen3-4b_wandb-outputlog_collapse.log": "verl",
    "trl_grpo_qwen3-4b_checkpoint-1134_trainer_state.json": "trl",
    "trl_grpo_telelogs_checkpoint-200_trainer_state.json": "trl",
}


def real_steps(path: Path) -> list[dict[str, Any]]:
    """The log's step dicts as the framework logged them (numbers; text values left out, as
    a trainer's metric dict has none)."""
    steps = []
    for record in parse_file(path).records:
        values = {k: v for k, v in record.values.items() if type(v) in (int, float)}
        if values:
            steps.append(values)
    return steps


class OtelRlSteps(OtelRl):
    """``bench_total``'s otel-rl way, logging each real step in turn under the log's framework."""

    def __init__(self, folder: Path, steps: list[dict[str, Any]], framework: str) -> None:
        super().__init__(folder, steps[0], None, None, framework=framework)
        self.steps = steps

    def keys(self, s: int, work: Callable[[], None]) -> None:
        work()
        self.tel.log(self.steps[s % len(self.steps)], step=s)

    step = keys


class SdkSteps(Sdk):
    def __init__(self, folder: Path, steps: list[dict[str, Any]]) -> None:
        keys = list({k: None for values in steps for k in values})
        # an instrument name takes letters, digits and _.-/ only (verl's "reward/mean@16" does not)
        super().__init__(folder, {re.sub(r"[^A-Za-z0-9_./-]", "_", key): 0.0 for key in keys}, np.zeros(1))
        self.by_key = {key: gauge for key, (gauge, _) in zip(keys, self.gauges)}
        self.steps = steps

    def keys(self, s: int, work: Callable[[], None]) -> None:
        work()
        by_key = self.by_key
        for key, value in self.steps[s % len(self.steps)].items():
            by_key[key].set(value)

    step = keys


PAIRS = 201  # paired rounds of 100 steps per log


def run(quick: bool = False) -> dict[str, Any]:
    logging.getLogger("otel_rl").setLevel(logging.ERROR)
    folder = Path(tempfile.mkdtemp(prefix="otel-rl-bench-real-"))
    work = calibrate(1)
    results: dict[str, Any] = {}
    for name, framework in RUNS.items():
        steps = real_steps(LOGS / name)
        run_folder = folder / name.split(".")[0]
        run_folder.mkdir()
        ways: list[Way] = [Off(), owned(lambda: OtelRlSteps(run_folder, steps, framework)), owned(lambda: SdkSteps(run_folder, steps))]
        # many short paired rounds, as bench_total's target row: the median tightens with the pairs
        rows = measure(ways, work, TARGET_STEPS, 21 if quick else PAIRS, only_keys=True, flush_every=FLUSH_EVERY)
        _added(rows)
        for way in ways:
            way.close()
        keys = max(len(v) for v in steps)
        ints = max(sum(type(x) is int for x in v.values()) for v in steps)
        own = (rows["otel-rl"]["threads_s"] + rows["otel-rl"]["idle_s"]) * 1e6  # partial: without the caller's log()
        results[name] = {"framework": framework, "steps": len(steps), "keys": keys, "ints": ints, "own_threads_us": own, "rows": rows}
    return results


def print_table(results: dict[str, Any]) -> None:
    print("real steps, logged one per 1 ms of work (whole process: every thread, flush included)")
    print(
        f"{'log':54} {'keys':>4} {'ints':>4} {'otel-rl':>10} {'its 95% interval':>17} {'SDK gauges':>11} {'SDK/otel-rl':>11} "
        f"{'otel-rl threads':>16}"
    )
    for name, result in results.items():
        rows = result["rows"]
        mine, sdk = rows["otel-rl"]["added_cpu_us"], rows["OTel SDK (sync gauges)"]["added_cpu_us"]
        ratio = f"{sdk / mine:.1f}x" if mine > 0 else "-"
        low, high = rows["otel-rl"]["added_cpu_ci95_us"]
        print(
            f"{name:54} {result['keys']:>4} {result['ints']:>4} {mine:>7.0f} us {f'{low:.0f}-{high:.0f} us':>17} {sdk:>8.0f} us "
            f"{ratio:>11} {result['own_threads_us']:>13.1f} us"
        )
    print("(added CPU per step: the median of the rounds' paired differences with the work alone, plus idle threads' CPU")
    print(" and metric exports every 10,000 steps; with a 95% bootstrap interval of that median. otel-rl threads: its")
    print(" worker and metric reader, counted apart to the nanosecond: a partial figure, without log() on the training thread)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    missing = [name for name in RUNS if not (LOGS / name).is_file()]
    if missing:
        print(f"bench_real_steps: the real training logs are not here ({LOGS / missing[0]} is absent; they sit in ../shared/logs)")
        return 2
    results = run(quick=args.quick)
    if args.json:
        summary = {
            name: {**{k: v for k, v in r.items() if k != "rows"}, "added_cpu_us": {w: row["added_cpu_us"] for w, row in r["rows"].items()}}
            for name, r in results.items()
        }
        print(json.dumps(summary, indent=2))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
