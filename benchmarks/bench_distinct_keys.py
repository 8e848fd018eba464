"""A run that logs new key names every step, against one that logs the same keys every step.

    python benchmarks/bench_distinct_keys.py                  # 1,000 steps x 1,000 keys: 1M distinct keys
    python benchmarks/bench_distinct_keys.py --steps 200      # fewer
    python benchmarks/bench_distinct_keys.py --json

A step counter or a sample id inside the key (``sample/<step>/<i>/score``) makes every key new:
whatever telemetry keeps per key name grows with the run. Two ways log the same number of values,
1,000 float values a step, with ``--step-ms`` of sleep between steps as the training step (the
telemetry worker runs meanwhile), with the default options (the run folder; unmapped_key_limit 256):

- ``distinct``: every step's keys are new (1M distinct keys at the defaults);
- ``stable``: the same 1,000 keys every step (the baseline).

Peak RSS is a whole process's high-water mark, so each way runs in a process of its own (this
script started again with ``--way``); both are started from here, one after the other, and compared.
Reported per way: peak RSS (``VmHWM``) and its growth over the RSS right after ``init()`` (and
the RSS growth over the second half of the steps: per-key state that is bounded stops growing), the
process's CPU time (every thread: the loop, the telemetry worker, the exporters), lines printed to
stderr, ``shutdown()`` seconds (default timeout 5 s), and log() calls dropped with the queue full.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import otel_rl  # noqa: E402

WAYS = ("distinct", "stable")


def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB (VmRSS, VmHWM); the peak from getrusage where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_way(way: str, steps: int, keys: int, step_s: float, timeout_s: float) -> dict[str, Any]:
    """Run one way in this process; its figures."""
    with tempfile.TemporaryDirectory(prefix="bench-distinct-") as folder:
        tel = otel_rl.init(run_dir=str(Path(folder) / "run"), console=False, service_name=f"bench-distinct-{way}")
        rss_start = _status_kib("VmRSS")
        cpu_start, wall_start = _cpu_s(), time.perf_counter()
        stable = [f"sample/{i}/score" for i in range(keys)]
        rss_half = rss_start
        for step in range(steps):
            if step == steps // 2:
                rss_half = _status_kib("VmRSS")
            names = [f"sample/{step}/{i}/score" for i in range(keys)] if way == "distinct" else stable
            tel.log(dict(zip(names, map(float, range(keys)))), step=step)
            time.sleep(step_s)  # the training step; the worker works meanwhile
        logged_s = time.perf_counter() - wall_start
        rss_end = _status_kib("VmRSS")
        started = time.perf_counter()
        tel.shutdown(timeout_s)
        shutdown_s = time.perf_counter() - started
        return {
            "way": way,
            "distinct_keys": steps * keys if way == "distinct" else keys,
            "values": steps * keys,
            "peak_rss_mib": _status_kib("VmHWM") / 1024,
            "rss_growth_mib": (_status_kib("VmHWM") - rss_start) / 1024,
            "second_half_rss_growth_mib": (rss_end - rss_half) / 1024,  # bounded state: about nothing
            "cpu_s": _cpu_s() - cpu_start,
            "loop_wall_s": logged_s,
            "shutdown_s": shutdown_s,
            "queue_dropped_calls": tel.queue_dropped_calls,
        }


def run(steps: int, keys: int, step_s: float, timeout_s: float) -> dict[str, Any]:
    """Each way in a process of its own (peak RSS is per process), its stderr lines counted here."""
    results: dict[str, Any] = {}
    for way in WAYS:
        command = [sys.executable, __file__, "--way", way, "--steps", str(steps), "--keys", str(keys)]
        command += ["--step-ms", str(step_s * 1e3), "--timeout", str(timeout_s)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the {way} way failed:\n{done.stderr[-4000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["stderr_lines"] = len(done.stderr.splitlines())
        row["stderr_bytes"] = len(done.stderr.encode())
        row["last_stderr_lines"] = done.stderr.splitlines()[-3:]
        results[way] = row
    distinct, stable = results["distinct"], results["stable"]
    results["distinct_vs_stable"] = {
        "peak_rss": distinct["peak_rss_mib"] / stable["peak_rss_mib"],
        "cpu": distinct["cpu_s"] / max(stable["cpu_s"], 1e-9),
        "second_half_rss_growth_mib": distinct["second_half_rss_growth_mib"],
    }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="steps per way (default 1,000)")
    parser.add_argument("--keys", type=int, default=1000, help="float values a step (default 1,000)")
    parser.add_argument("--step-ms", type=float, default=10.0, help="sleep between steps, the training step (default 10 ms)")
    parser.add_argument("--timeout", type=float, default=5.0, help="shutdown() timeout in s (default 5, as at exit)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in the child process
    args = parser.parse_args(argv)
    if args.way:
        print(json.dumps(one_way(args.way, args.steps, args.keys, args.step_ms / 1e3, args.timeout)))
        return 0
    print(f"{args.steps:,} steps x {args.keys:,} float values a step, each way in its own process...", file=sys.stderr)
    results = run(args.steps, args.keys, args.step_ms / 1e3, args.timeout)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        f"{'way':9s} {'distinct keys':>14s} {'peak RSS':>10s} {'RSS growth':>11s} {'CPU':>8s} {'stderr lines':>13s} "
        f"{'shutdown':>9s} {'queue drops':>12s}"
    )
    for way in WAYS:
        r = results[way]
        print(
            f"{way:9s} {r['distinct_keys']:>14,} {r['peak_rss_mib']:>7.0f} MiB {r['rss_growth_mib']:>7.0f} MiB {r['cpu_s']:>6.1f} s "
            f"{r['stderr_lines']:>13,} {r['shutdown_s']:>7.2f} s {r['queue_dropped_calls']:>12,}"
        )
    ratios = results["distinct_vs_stable"]
    print(
        f"distinct / stable: peak RSS x{ratios['peak_rss']:.2f}, CPU x{ratios['cpu']:.2f}; "
        f"RSS growth over the distinct way's second half ({results['distinct']['distinct_keys'] // 2:,} new keys): "
        f"{ratios['second_half_rss_growth_mib']:+.1f} MiB"
    )
    print(f"last stderr line of the distinct way: {(results['distinct']['last_stderr_lines'] or [''])[-1][:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
