"""One step of a 1,024-rank job, read back: ``otel-rl trace`` and ``otel-rl show --step`` on its run folder.

    python benchmarks/bench_step_trace.py                  # 1,024 ranks, 3 steps
    python benchmarks/bench_step_trace.py --ranks 256 --json

The run folder is written as such a job writes it (tests/multi_rank_trace.py): one traces file per
rank, each rank's resource, every rank's 3 stage spans (each with a phase) in rank 0's step trace,
~6,000 spans a step. Each command runs whole, in a process of its own, three times; the figure is
the median wall time and the largest peak RSS. Target (issue: a step trace that reads at 1,024
ranks): <= 3 s end to end, the ranks of each stage folded into one line. The commands may cache
their bytecode, as a user's installation does (this machine sets PYTHONDONTWRITEBYTECODE, which
makes every start compile ~230 modules: 0.7 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

TARGET_SECONDS = 3.0
_PEAK = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "sys.stdout.write(done.stdout); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)"
)


_ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def measure(command: list[str], runs: int = 3) -> tuple[float, float, str]:
    """(median seconds, peak RSS MiB, the output of the last run) of ``command`` run whole."""
    times, peaks, out = [], [], ""
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _PEAK, *command], capture_output=True, text=True, cwd=ROOT, check=True, env=_ENV)
        times.append(time.perf_counter() - start)
        *text, peak = done.stdout.rstrip("\n").split("\n")
        peaks.append(int(peak) / 1024.0)
        out = "\n".join(text)
    return statistics.median(times), max(peaks), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from multi_rank_trace import TRAIN_STEP_SPAN, write_multi_rank_steps

    results: dict = {"ranks": args.ranks, "target_s": TARGET_SECONDS}
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-step-trace-") as tmp:
        run = Path(tmp) / "run"
        start = time.perf_counter()
        write_multi_rank_steps(run, args.ranks, steps=(1, 2, 3), straggler=(args.ranks // 3, TRAIN_STEP_SPAN))
        results["write_s"] = round(time.perf_counter() - start, 1)
        cli = [sys.executable, "-m", "otel_rl.cli"]
        for name, command in (("trace", [*cli, "trace", str(run), "--step", "2"]), ("show", [*cli, "show", str(run), "--step", "2"])):
            seconds, mib, out = measure(command)
            results[name] = {"seconds": round(seconds, 2), "peak_rss_mib": round(mib), "lines": len(out.splitlines())}
            results[name]["folded"] = "(the ranks of a stage folded)" in out and f"rank {args.ranks // 3}" in out
    results["within_target"] = all(results[n]["seconds"] <= TARGET_SECONDS and results[n]["folded"] for n in ("trace", "show"))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{args.ranks:,} ranks, 3 steps ({results['write_s']} s to write the folder):")
    for name in ("trace", "show"):
        r = results[name]
        print(
            f"  otel-rl {name:<5} --step 2: {r['seconds']:5.2f} s, {r['peak_rss_mib']} MiB peak, {r['lines']} lines, "
            f"{'folded, straggler named' if r['folded'] else 'NOT folded'}"
        )
    print(f"target <= {TARGET_SECONDS:g} s: {'met' if results['within_target'] else 'not met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
