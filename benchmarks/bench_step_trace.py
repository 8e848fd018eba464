"""One step of a 1,024-rank job, read back: ``otel-rl trace`` and ``otel-rl show --step`` on its run
folder, and ``otel-rl trace --jaeger`` from a real Jaeger holding the same spans.

    python benchmarks/bench_step_trace.py                  # 1,024 ranks, 3 steps
    python benchmarks/bench_step_trace.py --ranks 256 --json
    python benchmarks/bench_step_trace.py --no-jaeger      # the run folder only
    python benchmarks/bench_step_trace.py --rounds 1       # one round of the stages a step (6 spans a rank)

The run folder is written as such a job writes it (tests/multi_rank_trace.py): one traces file per
rank, each rank's resource, every rank's 3 stage spans (each with a phase) in rank 0's step trace,
run ``--rounds`` times a step (default 3: 18 spans a rank, ~18,400 a step, more than the 16 a rank
the replayed demo of bench_tier_replay.py sends). Each command runs whole, in a process of its own, three times; the figure is
the median wall time and the largest peak RSS. Target (issue: a step trace that reads at 1,024
ranks): <= 3 s end to end, the ranks of each stage folded into one line. The commands may cache
their bytecode, as a user's installation does (this machine sets PYTHONDONTWRITEBYTECODE, which
makes every start compile ~230 modules: 0.7 s).

The Jaeger part starts the local stack's Jaeger alone (``otel-rl stack up --only jaeger``: Jaeger v2
built from its Go module, Badger on disk, in a temporary data folder on offset ports), sends it
the same spans over OTLP/gRPC, and times ``otel-rl trace --jaeger URL --step 2``: Jaeger's search
for the step's root span, its fetch of the ~18,400-span trace, and the folded print, whole.
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


def jaeger_trace(ranks: int, tmp: Path, rounds: int) -> dict:
    """Start Jaeger, load the steps into it, time ``otel-rl trace --jaeger`` (stopped by its PID after)."""
    from multi_rank_trace import STAGES, TRAIN_STEP_SPAN, write_multi_rank_steps
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    from otel_rl.stack import free_port_offset

    cli = [sys.executable, "-m", "otel_rl.cli"]
    # (an offset at which every stack port is free: away from a local stack a user runs)
    stack = ["--dir", str(tmp / "stack"), "--port-offset", str(free_port_offset())]
    subprocess.run([*cli, "stack", "up", "--only", "jaeger", *stack], check=True, capture_output=True, text=True, cwd=ROOT, timeout=600)
    try:
        # (status exits 1 while any component is down: here all but Jaeger are)
        status = json.loads(subprocess.run([*cli, "stack", "status", *stack, "--json"], capture_output=True, text=True).stdout)
        jaeger = next(c for c in status if c["name"] == "jaeger")
        query_url = f"http://127.0.0.1:{jaeger['ports']['http']}"
        start = time.perf_counter()
        exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{jaeger['ports']['otlp_grpc']}", insecure=True)
        recent = int(time.time()) - 600  # within Jaeger's retention and the command's lookback
        straggler = (ranks // 3, TRAIN_STEP_SPAN)
        write_multi_rank_steps(
            tmp / "unused", ranks, steps=(1, 2, 3), straggler=straggler, exporter=exporter, start_s=recent, stages=STAGES * rounds
        )
        command = [*cli, "trace", "--jaeger", query_url, "--step", "2"]
        while subprocess.run(command, capture_output=True, cwd=ROOT, env=_ENV).returncode != 0:  # until Jaeger wrote it
            if time.perf_counter() - start > 120:
                raise RuntimeError("Jaeger did not hold step 2 within 120 s")
            time.sleep(1.0)
        loaded = time.perf_counter() - start
        seconds, mib, out = measure(command)
        return {
            "load_s": round(loaded, 1),
            "seconds": round(seconds, 2),
            "peak_rss_mib": round(mib),
            "lines": len(out.splitlines()),
            "folded": "(the ranks of a stage folded)" in out and f"rank {ranks // 3}" in out,
        }
    finally:
        subprocess.run([*cli, "stack", "down", *stack], capture_output=True, timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-jaeger", action="store_true", help="skip the part through a real Jaeger")
    parser.add_argument("--rounds", type=int, default=3, help="times each rank runs the 3 stages a step (default 3)")
    args = parser.parse_args()
    from multi_rank_trace import STAGES, TRAIN_STEP_SPAN, write_multi_rank_steps

    results: dict = {"ranks": args.ranks, "rounds": args.rounds, "target_s": TARGET_SECONDS}
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-step-trace-") as tmp:
        run = Path(tmp) / "run"
        start = time.perf_counter()
        write_multi_rank_steps(run, args.ranks, steps=(1, 2, 3), straggler=(args.ranks // 3, TRAIN_STEP_SPAN), stages=STAGES * args.rounds)
        results["write_s"] = round(time.perf_counter() - start, 1)
        cli = [sys.executable, "-m", "otel_rl.cli"]
        for name, command in (("trace", [*cli, "trace", str(run), "--step", "2"]), ("show", [*cli, "show", str(run), "--step", "2"])):
            seconds, mib, out = measure(command)
            results[name] = {"seconds": round(seconds, 2), "peak_rss_mib": round(mib), "lines": len(out.splitlines())}
            results[name]["folded"] = "(the ranks of a stage folded)" in out and f"rank {args.ranks // 3}" in out
        if not args.no_jaeger:
            results["trace --jaeger"] = jaeger_trace(args.ranks, Path(tmp), args.rounds)
    timed = [n for n in ("trace", "show", "trace --jaeger") if n in results]
    results["within_target"] = all(results[n]["seconds"] <= TARGET_SECONDS and results[n]["folded"] for n in timed)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{args.ranks:,} ranks x {6 * args.rounds} spans, 3 steps ({results['write_s']} s to write the folder):")
    for name in timed:
        r = results[name]
        print(
            f"  otel-rl {name:<14} --step 2: {r['seconds']:5.2f} s, {r['peak_rss_mib']} MiB peak, {r['lines']} lines, "
            f"{'folded, straggler named' if r['folded'] else 'NOT folded'}"
            + (f" (Jaeger took the 3 steps' spans in {r['load_s']} s)" if "load_s" in r else "")
        )
    print(f"target <= {TARGET_SECONDS:g} s: {'met' if results['within_target'] else 'not met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
