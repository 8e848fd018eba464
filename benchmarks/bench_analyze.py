"""How long `otel-rl analyze` takes, as a user runs it: the whole command in a process of its own.

    python benchmarks/bench_analyze.py              # a table
    python benchmarks/bench_analyze.py --json

Two workloads, each the wall time of `otel-rl analyze FILE --out DIR` (reading, detection,
changepoints, incidents, the reports and their pictures; Python's start included), best of three:
- every real log in ../shared/logs (when it is there); target: the largest under 5 s;
- a synthetic verl console log of 2,000 steps and 80 series (noise, trends, a collapse, spikes);
  target: under 10 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT.parent / "shared" / "logs"
TARGETS = {"largest shared log": 5.0, "2,000 steps x 80 series": 10.0}


def synthetic_log(path: Path, steps: int = 2000, series: int = 80, seed: int = 0) -> Path:
    """A verl console log (``step:N - key:value - ...``) with the run's key families and filler series."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    cols: dict[str, np.ndarray] = {
        "actor/entropy": np.where(t < 1400, 0.3, 0.002) * (1 + 0.05 * rng.standard_normal(steps)),
        "response_length/mean": np.where(t < 1400, 900.0, 3.0) * (1 + 0.05 * rng.standard_normal(steps)),
        "actor/grad_norm": 0.4 * (1 + 0.2 * rng.standard_normal(steps)),
        "actor/reward_kl_penalty": np.geomspace(0.001, 0.5, steps) * (1 + 0.1 * rng.standard_normal(steps)),
        "critic/score/mean": np.clip(0.2 + t / steps * 0.5 + 0.05 * rng.standard_normal(steps), -1, 1),
        "response_length/clip_ratio": np.abs(0.01 * rng.standard_normal(steps)),
    }
    cols["actor/grad_norm"][[300, 900, 1500]] *= 40
    for k in range(series - len(cols)):
        cols[f"timing_s/stage_{k}"] = (1 + k) * (1 + 0.1 * rng.standard_normal(steps)) * (1 + 0.3 * t / steps)
    with open(path, "w") as fh:
        for i, step in enumerate(t):
            fh.write(f"step:{step} - " + " - ".join(f"{key}:{values[i]:.6g}" for key, values in cols.items()) + "\n")
    return path


def timed(log: Path, out: Path, repeats: int = 3) -> float:
    command = [sys.executable, "-m", "otel_rl.cli", "analyze", str(log), "--out", str(out), "-q"]
    best = float("inf")
    for _ in range(repeats):
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: list[tuple[str, float, float | None]] = []
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-analyze-") as tmp:
        work = Path(tmp)
        if LOGS.is_dir():
            logs = sorted((p for p in LOGS.iterdir() if p.is_file() and p.name != "README.md"), key=lambda p: p.stat().st_size)
            for log in logs:
                rows.append((log.name, timed(log, work / "out"), None))
            largest = max(logs, key=lambda p: p.stat().st_size)
            rows.append(("largest shared log", next(s for n, s, _ in rows if n == largest.name), TARGETS["largest shared log"]))
        synth = synthetic_log(work / "synthetic-2000x80.log")
        rows.append(("2,000 steps x 80 series", timed(synth, work / "out"), TARGETS["2,000 steps x 80 series"]))
    if args.json:
        print(json.dumps([{"log": n, "seconds": round(s, 2), "target_s": t} for n, s, t in rows], indent=2))
        return 0
    width = max(len(n) for n, _, _ in rows)
    print(f"{'log':<{width}}  seconds  target")
    for name, seconds, target in rows:
        mark = "" if target is None else f"<= {target:g} s {'met' if seconds <= target else 'NOT met'}"
        print(f"{name:<{width}}  {seconds:7.2f}  {mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
