"""Memory and time of ``otel-rl show RUN`` as the folder grows: the whole command in a process of its own.

    python benchmarks/bench_show.py                 # 5,000 and 50,000 steps
    python benchmarks/bench_show.py --steps 2000 20000 --json

Each folder is written by ``otel-rl replay`` of a synthetic verl console log (20 series per step,
the shape of a real run's), then ``otel-rl show`` runs in a child process; its peak RSS is the
child's ``ru_maxrss``. Target: ten times the steps costs under 1.5 times the memory (the table
holds only the rows it prints; what grows is one set entry per step).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
_PEAK = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)
KEYS = ("actor/entropy", "actor/grad_norm", "actor/kl_loss", "actor/pg_loss", "critic/score/mean", "response_length/mean")


def synthetic_log(path: Path, steps: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    with open(path, "w") as fh:
        for step in range(1, steps + 1):
            values = [f"{k}:{v:.6g}" for k, v in zip(KEYS, rng.random(len(KEYS)))]
            values += [f"timing_s/stage_{i}:{v:.4g}" for i, v in enumerate(rng.random(14))]
            fh.write(f"step:{step} - " + " - ".join(values) + "\n")
    return path


def measure(folder: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of ``otel-rl show folder``."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, sys.executable, "-m", "otel_rl.cli", "show", str(folder)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return time.perf_counter() - start, int(out.stdout.strip()) / 1024.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs=2, default=[5000, 50000], metavar=("SMALL", "LARGE"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-show-") as tmp:
        for steps in args.steps:
            log = synthetic_log(Path(tmp) / f"train-{steps}.log", steps)
            folder = Path(tmp) / f"run-{steps}"
            subprocess.run(
                [sys.executable, "-m", "otel_rl.cli", "replay", str(log), "--run-dir", str(folder), "-q"],
                check=True,
                capture_output=True,
                cwd=ROOT,
            )
            seconds, mib = measure(folder)
            rows.append({"steps": steps, "seconds": round(seconds, 2), "peak_rss_mib": round(mib, 1)})
    ratio = rows[1]["peak_rss_mib"] / rows[0]["peak_rss_mib"]
    if args.json:
        print(json.dumps({"runs": rows, "memory_ratio": round(ratio, 2), "target": "< 1.5"}, indent=2))
        return 0
    for r in rows:
        print(f"{r['steps']:>9,} steps  {r['seconds']:7.2f} s  {r['peak_rss_mib']:8.1f} MiB peak")
    print(f"memory ratio {rows[1]['steps'] // rows[0]['steps']}x steps: {ratio:.2f}x (target < 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
