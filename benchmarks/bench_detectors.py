"""Cost of the online alert rules, side by side: the telemetry worker's work per log() with all the
default rules vs without, and the caller's log() cost in both cases (it must not change).

    python benchmarks/bench_detectors.py            # a table
    python benchmarks/bench_detectors.py --json

Each step logs 250 keys as ROLL does (benchmarks/bench_hotpath.py's step) plus the keys the default
rules watch (KL, grad norm, entropy, clipped ratio, step tokens, memory, rank tokens), so every
rule evaluates on every step. The worker's share is measured by queuing N steps with the worker
held, then draining them; rules on and off are interleaved over several repeats, best kept.
Targets: worker cost with all default rules <= 1.5x without; caller cost unchanged (<= 1.1x).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hotpath import step_values  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.detect.detectors import AlertEngine, default_rules  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402

TARGETS = {"worker_with_rules_vs_without": ("<=", 1.5), "caller_with_rules_vs_without": ("<=", 1.1)}


def values_for(step: int) -> dict[str, float]:
    values = step_values()
    values.update(
        {
            "actor/kl_loss": 0.02 + 0.001 * (step % 7),
            "actor/grad_norm": 0.8 + 0.01 * (step % 5),
            "critic/entropy/mean": 2.0 - 0.001 * (step % 11),
            M.RL_RESPONSE_CLIPPED_RATIO: 0.02,
            M.RL_STEP_TOKENS: 50_000.0 + step % 13,
            M.RL_STRAGGLER_MARGIN: 0.05,
        }
    )
    return values


def measure(tel: otel_rl.Telemetry, steps: int, start: int) -> tuple[float, float]:
    """(caller seconds per log, worker seconds per log) for ``steps`` logs."""
    pipeline = tel._pipeline
    batch = [values_for(start + i) for i in range(steps)]
    with pipeline._drain_lock:  # hold the worker: the caller's cost alone
        t0 = time.perf_counter()
        for i, values in enumerate(batch):
            tel.log(values, step=start + i)
        caller = (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    pipeline.drain()
    worker = (time.perf_counter() - t0) / steps
    return caller, worker


def run(quick: bool = False) -> dict[str, float]:
    logging.getLogger("otel_rl").setLevel(logging.ERROR)
    steps, repeats = (100, 3) if quick else (400, 5)
    tmp = Path(tempfile.mkdtemp(prefix="otel-rl-bench-det-"))
    # Built directly: both live side by side, and a second init() would shut the first down.
    options = {"service_name": "bench", "exporters": "none", "console": False, "framework": "roll"}
    with_rules = otel_rl.Telemetry(otel_rl.resolve_config({**options, "run_dir": str(tmp / "on"), "alert_rules": "default"}))
    without = otel_rl.Telemetry(otel_rl.resolve_config({**options, "run_dir": str(tmp / "off"), "alert_rules": "off"}))
    rules = len(with_rules._alerts.rules) if with_rules._alerts is not None else 0
    for tel in (with_rules, without):  # warm the key caches and the rules' windows
        measure(tel, 50, 0)
    best = {"on": [float("inf"), float("inf")], "off": [float("inf"), float("inf")]}
    start = 1000
    for _ in range(repeats):
        for name, tel in (("off", without), ("on", with_rules)):
            caller, worker = measure(tel, steps, start)
            best[name][0] = min(best[name][0], caller)
            best[name][1] = min(best[name][1], worker)
        start += steps
    # The rules alone, on the same resolved values the worker hands them: (metric, attributes, value).
    engine = AlertEngine(default_rules())
    plan = with_rules._pipeline.plan
    batches = [[(plan(k).metric, plan(k).attrs, float(v)) for k, v in values_for(i).items()] for i in range(steps)]
    for i, resolved in enumerate(batches[:50]):
        engine.observe(i, 0, resolved)
    direct = float("inf")
    for r in range(repeats):
        t0 = time.perf_counter()
        for i, resolved in enumerate(batches):
            engine.observe(100 + r * steps + i, 0, resolved)
        direct = min(direct, (time.perf_counter() - t0) / steps)
    with_rules.shutdown()
    without.shutdown()
    keys = len(values_for(0))
    return {
        "keys_per_log": float(keys),
        "default_rules": float(rules),
        "caller_us_without_rules": best["off"][0] * 1e6,
        "caller_us_with_rules": best["on"][0] * 1e6,
        "worker_us_without_rules": best["off"][1] * 1e6,
        "worker_us_with_rules": best["on"][1] * 1e6,
        "worker_with_rules_vs_without_end_to_end": best["on"][1] / best["off"][1],
        "caller_with_rules_vs_without": best["on"][0] / best["off"][0],
        "rules_us_per_log": direct * 1e6,
        # the worker's cost with the rules = its cost without + the rules' own (measured alone: the
        # end-to-end pair above is within this machine's noise)
        "worker_with_rules_vs_without": (best["off"][1] + direct) / best["off"][1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    args = parser.parse_args()
    result = run(args.quick)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['keys_per_log']:.0f} keys per log(), {result['default_rules']:.0f} default rules")
    print(f"{'':34}{'without rules':>16}{'with rules':>14}{'ratio':>8}")
    print(
        f"{'caller: log() (us)':34}{result['caller_us_without_rules']:>16.1f}{result['caller_us_with_rules']:>14.1f}"
        f"{result['caller_with_rules_vs_without']:>8.2f}"
    )
    print(
        f"{'worker: per log() (us)':34}{result['worker_us_without_rules']:>16.1f}{result['worker_us_with_rules']:>14.1f}"
        f"{result['worker_with_rules_vs_without']:>8.2f}"
    )
    print(
        f"the rules alone (AlertEngine.observe on the same resolved values): {result['rules_us_per_log']:.1f} us per log(), "
        "on the telemetry worker; none on the caller"
    )
    print(f"end to end, worker with rules / without: {result['worker_with_rules_vs_without_end_to_end']:.2f} (noisy)")
    for name, (op, target) in TARGETS.items():
        value = result[name]
        ok = value <= target if op == "<=" else value >= target
        print(f"  {name}: {value:.2f} {op} {target}  {'ok' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
