"""Time and memory of ``otel-rl analyze`` on a long log: the whole command in a process of its own.

    python benchmarks/bench_analyze_scale.py                  # 45,500 and 455,000 steps
    python benchmarks/bench_analyze_scale.py --steps 20000 200000 --json

Each log is a synthetic verl console log (20 series per step, the shape of a real run's; the same
generator as bench_show.py), analyzed with ``--no-plots`` in a child process; its peak RSS is the
child's ``ru_maxrss``, its time the wall time of the whole command. Target (issue: analyze at
scale): the 455,000-step log (~260 MB) in <= 60 s and <= 1 GB; the ratios say how the cost grows.
Measured on 2 shared cores: 48.4-52.1 s and 984-991 MiB (6.0-8.0 s and 166-175 MiB for 45,500
steps). It was 86 s and 2.3 GB before keys were shared, lines read a block at a time and series held
as arrays, and 66-72 s before the windows' medians were taken from sorted rows, the log's tail was
searched for errors a block at a time and the online rules refused on the median before the spread.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_show import _PEAK, ROOT, synthetic_log  # noqa: E402

TARGET_SECONDS, TARGET_MIB = 60.0, 1024.0


def measure(log: Path, out: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of ``otel-rl analyze log --out out --no-plots``."""
    command = [sys.executable, "-m", "otel_rl.cli", "analyze", str(log), "--out", str(out), "--no-plots", "-q"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PEAK, *command], check=True, capture_output=True, text=True, cwd=ROOT)
    return time.perf_counter() - start, int(done.stdout.strip()) / 1024.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs=2, default=[45_500, 455_000], metavar=("SMALL", "LARGE"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-analyze-") as tmp:
        for steps in args.steps:
            log = synthetic_log(Path(tmp) / f"train-{steps}.log", steps)
            seconds, mib = measure(log, Path(tmp) / f"report-{steps}")
            rows.append(
                {"steps": steps, "mb": round(log.stat().st_size / 1e6, 1), "seconds": round(seconds, 1), "peak_rss_mib": round(mib)}
            )
    large = rows[-1]
    verdict = {
        "time_ratio": round(rows[1]["seconds"] / rows[0]["seconds"], 2),
        "memory_ratio": round(rows[1]["peak_rss_mib"] / rows[0]["peak_rss_mib"], 2),
        "large_within_target": large["seconds"] <= TARGET_SECONDS and large["peak_rss_mib"] <= TARGET_MIB,
    }
    if args.json:
        print(json.dumps({"runs": rows, **verdict, "target": f"<= {TARGET_SECONDS:.0f} s, <= {TARGET_MIB:.0f} MiB"}, indent=2))
        return 0
    for r in rows:
        print(f"{r['steps']:>9,} steps ({r['mb']:6.1f} MB)  {r['seconds']:7.1f} s  {r['peak_rss_mib']:7,} MiB peak")
    print(
        f"{rows[1]['steps'] // rows[0]['steps']}x steps: {verdict['time_ratio']}x time, {verdict['memory_ratio']}x memory; "
        f"target for the large log: <= {TARGET_SECONDS:.0f} s and <= {TARGET_MIB:.0f} MiB: {'met' if verdict['large_within_target'] else 'not met'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
