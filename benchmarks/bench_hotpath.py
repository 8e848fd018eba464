"""Hot-path overhead of otel-rl, measured side by side in one process and reported as ratios.

    python benchmarks/bench_hotpath.py            # a table
    python benchmarks/bench_hotpath.py --json     # the ratios as JSON

What is compared (each pair runs interleaved, best of several repeats, same process):
- log() of one step of 250 scalar keys vs a plain Python loop storing each value in a dict,
  and vs setting one OTel SDK gauge per key. The caller's cost is measured with the pipeline
  worker held, then the worker's own cost per step (resolution, metrics, the step event) is
  measured separately: that work runs off the training thread. The keys are a key set seen
  before, every value a float: log() packs them (what a training run's steps cost after its
  first); a step that is not packed (a dict copy) is timed too.
- recording a 4096-value distribution: the caller's cost, the worker's numpy binning, and the
  SDK's one-call-per-value Histogram.record for comparison.
- a stage span (tel.stage) vs a bare SDK span (tracer.start_as_current_span) on the same provider.

Targets: log <= 2x the dict loop and >= 20x cheaper than the SDK gauges; a 4096-value
distribution <= 1 ms; a stage span <= 1.5x a bare span.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import otel_rl  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402

TARGETS = {
    "log_vs_dict_loop": ("<=", 2.0),
    "sdk_gauges_vs_log": (">=", 20.0),
    "distribution_4096_ms": ("<=", 1.0),
    "stage_vs_bare_span": ("<=", 1.5),
}


def step_values(n: int = 250) -> dict[str, float]:
    """250 keys as ROLL logs them: algorithm scalars plus per-stage timing and memory keys."""
    keys = []
    stats = ("mean", "max", "min")
    for family in (
        "critic/score",
        "critic/rewards",
        "critic/advantages",
        "critic/returns",
        "critic/values",
        "tokens/response_length",
        "tokens/prompt_length",
        "val/score",
    ):
        keys += [f"{family}/{s}" for s in stats]
    keys += [
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/total_loss",
        "actor/approxkl",
        "actor/policykl",
        "actor/clipfrac",
        "actor/ppo_ratio_high_clipfrac",
        "actor/ppo_ratio_low_clipfrac",
        "actor/ppo_ratio_clipfrac",
        "actor/lr",
        "actor/grad_norm",
        "critic/lr",
        "critic/loss",
        "critic/value",
        "critic/vpred",
        "system/tps",
        "system/samples",
    ]
    stages = ("train_step", "generate", "model_update", "compute_log_probs", "do_checkpoint", "compute_values", "compute_rewards")
    for stage in stages:
        keys += [f"time/actor_train/{stage}/{p}" for p in ("total", "execute", "onload", "offload")]
        for when, state in (("start", "offload"), ("start", "onload"), ("end", "onload"), ("end", "offload")):
            keys += [f"memory/actor_train/{stage}/{when}/{state}/{k}/0" for k in ("allocated", "reserved", "max_allocated", "max_reserved")]
        keys += [f"memory/cpu/actor_train/{stage}/{w}/{k}" for w in ("start", "end") for k in ("rss", "vms")]
    keys = keys[:n]
    while len(keys) < n:  # per-reward-function keys (TRL / ms-swift style) fill up to n
        keys.append(f"rewards/fn{len(keys)}/mean")
    rng = np.random.default_rng(0)
    return {k: float(v) for k, v in zip(keys, rng.random(n))}


def best_of(fn: Callable[[], None], number: int, repeat: int) -> float:
    """Best (least disturbed) seconds per call over `repeat` runs of `number` calls."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def interleaved(fns: dict[str, Callable[[], None]], number: int, rounds: int = 7) -> dict[str, float]:
    """Run each function `number` times per round, alternating, and keep each one's best round."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], best_of(fn, number, 1))
    return best


def run(quick: bool = False) -> dict[str, float]:
    number = 200 if quick else 2000
    logging.getLogger("otel_rl").setLevel(logging.ERROR)  # the benchmark's keys are known; keep output to the figures
    tmp = tempfile.mkdtemp(prefix="otel-rl-bench-")
    # No bound on the queue: the worker is held while the caller's rounds run (thousands of calls),
    # and past the bound log() would be timing the drop of a call instead of the call.
    tel = otel_rl.init(service_name="bench", run_dir=tmp, exporters="none", console=False, framework="roll", max_queue=0)
    pipeline = tel._pipeline
    values = step_values()
    # Warm the key cache once, as after the first training step.
    tel.log(values, step=0)
    tel.flush()

    # 1. log() of 250 keys: caller cost with the worker held, so its work is not interleaved.
    sink: dict[str, float] = {}

    def dict_loop() -> None:
        for key, value in values.items():
            sink[key] = value

    sdk_meter = tel._providers.meter_provider.get_meter("bench.sdk")
    gauges = {key: sdk_meter.create_gauge(f"bench.{i}") for i, key in enumerate(values)}

    def sdk_gauges() -> None:
        for key, value in values.items():
            gauges[key].set(value)

    step = [0]

    def otel_rl_log() -> None:
        step[0] += 1
        tel.log(values, step=step[0])

    # The keys and one int: no packing on the caller's thread, a dict copy
    # (what log() pays for a key set's first step, or values that are not all floats).
    with_int = {**values, "actor/global_step": 1}
    for _ in range(2):  # its plan, then the worker's note that these keys' steps hold an int: log() copies them at once
        tel.log(with_int, step=0)
        tel.flush()

    def otel_rl_log_copy() -> None:
        step[0] += 1
        tel.log(with_int, step=step[0])

    with pipeline._drain_lock:
        caller = interleaved({"dict_loop": dict_loop, "otel_rl_log": otel_rl_log, "sdk_gauges": sdk_gauges}, number)
        queued = len(pipeline.queue)
        copy = interleaved({"otel_rl_log_copy": otel_rl_log_copy}, number)
    assert not tel.queue_dropped_calls, "the measured calls must be calls, not drops"
    # 2. The worker's share: drain what was queued, per step (the packed steps, then the copies).
    copies = len(pipeline.queue) - queued
    for _ in range(copies):
        pipeline.queue.pop()
    t0 = time.perf_counter()
    pipeline.drain()
    worker_per_step = (time.perf_counter() - t0) / max(queued, 1)

    # 3. A 4096-value distribution.
    rewards = np.random.default_rng(1).normal(size=4096)
    hist = tel._histograms
    sdk_hist = sdk_meter.create_histogram("bench.sdk.hist")
    abs_rewards = np.abs(rewards).tolist()  # the SDK histogram drops negative values

    def record_caller() -> None:
        tel.record(M.RL_SAMPLE_REWARD, rewards)

    def record_bin() -> None:
        hist.record_many(M.RL_SAMPLE_REWARD, rewards)

    def sdk_record() -> None:
        for v in abs_rewards:
            sdk_hist.record(v)

    with pipeline._drain_lock:
        dist = interleaved({"record_caller": record_caller, "record_bin": record_bin}, number // 4)
    pipeline.drain()
    dist["sdk_per_value"] = best_of(sdk_record, 3 if quick else 10, 3)

    # 4. Stage span vs bare SDK span on the same tracer provider.
    tracer = tel._providers.tracer_provider.get_tracer("bench.sdk")

    def bare_span() -> None:
        with tracer.start_as_current_span("rl.generate"):
            pass

    def stage_span() -> None:
        with tel.stage("generate", cluster="actor_infer"):
            pass

    with pipeline._drain_lock:
        spans = interleaved({"bare_span": bare_span, "stage_span": stage_span}, number)
    tel.shutdown()

    return {
        "dict_loop_us": caller["dict_loop"] * 1e6,
        "log_caller_us": caller["otel_rl_log"] * 1e6,
        "log_copy_caller_us": copy["otel_rl_log_copy"] * 1e6,
        "sdk_gauges_us": caller["sdk_gauges"] * 1e6,
        "log_worker_us_per_step": worker_per_step * 1e6,
        "log_vs_dict_loop": caller["otel_rl_log"] / caller["dict_loop"],
        "sdk_gauges_vs_log": caller["sdk_gauges"] / caller["otel_rl_log"],
        "distribution_caller_us": dist["record_caller"] * 1e6,
        "distribution_binning_us": dist["record_bin"] * 1e6,
        "distribution_4096_ms": (dist["record_caller"] + dist["record_bin"]) * 1e3,
        "sdk_histogram_4096_ms": dist["sdk_per_value"] * 1e3,
        "bare_span_us": spans["bare_span"] * 1e6,
        "stage_span_us": spans["stage_span"] * 1e6,
        "stage_vs_bare_span": spans["stage_span"] / spans["bare_span"],
    }


def verdicts(results: dict[str, float]) -> dict[str, bool]:
    out = {}
    for name, (op, bound) in TARGETS.items():
        value = results[name]
        out[name] = value <= bound if op == "<=" else value >= bound
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the measurements and ratios as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisier)")
    args = parser.parse_args(argv)
    results = run(quick=args.quick)
    ok = verdicts(results)
    if args.json:
        print(json.dumps({"results": results, "targets": {k: f"{op} {b}" for k, (op, b) in TARGETS.items()}, "met": ok}, indent=2))
    else:
        print(
            f"log() 250 keys, caller:      {results['log_caller_us']:8.2f} us   dict loop {results['dict_loop_us']:.2f} us   "
            f"SDK gauges {results['sdk_gauges_us']:.1f} us"
        )
        print(
            f"  ratio log / dict loop:      {results['log_vs_dict_loop']:8.2f}   (target <= 2)   {'ok' if ok['log_vs_dict_loop'] else 'MISSED'}"
        )
        print(f"  a step that is not packed:  {results['log_copy_caller_us']:8.2f} us   (a dict copy: one int among the floats)")
        print(
            f"  ratio SDK gauges / log:     {results['sdk_gauges_vs_log']:8.1f}   (target >= 20)  {'ok' if ok['sdk_gauges_vs_log'] else 'MISSED'}"
        )
        print(f"  worker, off-thread:         {results['log_worker_us_per_step']:8.1f} us per step")
        print(
            f"4096-value distribution:     {results['distribution_4096_ms']:8.3f} ms   (caller {results['distribution_caller_us']:.1f} us + "
            f"binning {results['distribution_binning_us']:.1f} us; SDK one call per value {results['sdk_histogram_4096_ms']:.2f} ms)"
            f"   (target <= 1 ms) {'ok' if ok['distribution_4096_ms'] else 'MISSED'}"
        )
        print(f"stage span:                  {results['stage_span_us']:8.2f} us   bare SDK span {results['bare_span_us']:.2f} us")
        print(
            f"  ratio stage / bare span:    {results['stage_vs_bare_span']:8.2f}   (target <= 1.5) {'ok' if ok['stage_vs_bare_span'] else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
