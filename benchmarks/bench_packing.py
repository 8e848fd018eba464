"""What packing a step on the caller's thread saves, side by side in one process.

    python benchmarks/bench_packing.py              # 40 interleaved rounds of 500 steps
    python benchmarks/bench_packing.py --rounds 10  # fewer

``log()`` packs a step of a key set the worker has planned, every value a float, into one buffer
of doubles; any other step is copied and the worker reads its keys and values. Two telemetries run
the same loop (1 ms of pure-Python work, then 250 ROLL keys with fresh values, as a training loop
makes them each step), in alternating rounds: one is given plain dicts (packed), the other the same
values in a dict subclass, which ``log()`` copies as it always did (the worker's bulk path then
reads them). Reported per step, the median over rounds: the caller's ``log()`` (thread CPU around
each call), the worker thread's CPU (``/proc`` schedstat, to the nanosecond), their sum, and the
whole process's CPU (every thread) with the paired difference between the two ways.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hotpath import step_values  # noqa: E402
from bench_total import OtelRl, calibrate, thread_cpu  # noqa: E402


class Copied(dict):
    """Not an exact dict: ``log()`` copies it instead of packing it."""


def telemetry() -> OtelRl:
    """otel-rl with its default exporters (the run folder), its key set's plan built."""
    way = OtelRl(Path(tempfile.mkdtemp(prefix="otel-rl-bench-pack-")), step_values(), None, None)
    for s in range(3):
        way.keys(s, lambda: None)
        way.flush()
    return way


def run(rounds: int, steps: int) -> dict[str, Any]:
    logging.getLogger("otel_rl").setLevel(logging.ERROR)
    base = step_values()
    work = calibrate(1.0)
    ways = {"packed": (telemetry(), dict), "copied": (telemetry(), Copied)}
    clock = time.thread_time_ns
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    for r in range(rounds):
        order = list(ways.items()) if r % 2 == 0 else list(ways.items())[::-1]
        for name, (way, kind) in order:
            tel = way.tel
            worker = tel._pipeline._thread.native_id  # no public handle on the worker thread
            caller_ns, w0, p0 = 0, thread_cpu(worker), time.process_time()
            for s in range(steps):
                work()
                values = kind({k: v + s * 1e-9 for k, v in base.items()})
                t0 = clock()
                tel.log(values, step=r * steps + s)
                caller_ns += clock() - t0
            way.settle()  # the round pays what it queued
            samples[name].append(
                (caller_ns / 1e3 / steps, (thread_cpu(worker) - w0) * 1e6 / steps, (time.process_time() - p0) * 1e6 / steps)
            )
    for way, _ in ways.values():
        way.close()
    out: dict[str, Any] = {}
    for name, rows in samples.items():
        table = np.array(rows)
        out[name] = {
            "log_us": float(np.median(table[:, 0])),
            "worker_us": float(np.median(table[:, 1])),
            "parts_us": float(np.median(table[:, 0] + table[:, 1])),
            "process_us": float(np.median(table[:, 2])),
        }
    paired = np.array(samples["packed"]) - np.array(samples["copied"])
    out["packed_minus_copied"] = {
        "parts_us": float(np.median(paired[:, 0] + paired[:, 1])),
        "process_us": float(np.median(paired[:, 2])),
        "process_quartiles_us": [float(q) for q in np.percentile(paired[:, 2], [25, 75])],
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="alternating rounds per way (default 40)")
    parser.add_argument("--steps", type=int, default=500, help="steps per round (default 500)")
    args = parser.parse_args(argv)
    print(f"{args.rounds} rounds of {args.steps} steps per way, 1 ms of work and 250 fresh float values a step...", file=sys.stderr)
    result = run(args.rounds, args.steps)
    print(f"{'way':8s} {'log() (caller)':>15s} {'worker':>8s} {'the two':>8s} {'process CPU':>12s}   (us per step, medians)")
    for name in ("packed", "copied"):
        row = result[name]
        print(f"{name:8s} {row['log_us']:15.1f} {row['worker_us']:8.1f} {row['parts_us']:8.1f} {row['process_us']:12.0f}")
    diff = result["packed_minus_copied"]
    low, high = diff["process_quartiles_us"]
    print(
        f"packed - copied, paired: the two parts {diff['parts_us']:+.1f} us, the whole process {diff['process_us']:+.1f} us "
        f"(middle half of the rounds: {low:+.0f} to {high:+.0f} us)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
