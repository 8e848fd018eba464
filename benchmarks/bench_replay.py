"""Replay throughput, side by side: reading a log only vs reading and logging it through telemetry.

    python benchmarks/bench_replay.py                 # a table (20,000 steps x 28 keys per format)
    python benchmarks/bench_replay.py --steps 5000 --json

Per format the same synthetic log (written as that framework writes it) is
- parsed only (``parse_file``): points (key -> value pairs) per second;
- parsed and replayed with ``exporters=none``: the telemetry pipeline itself (key resolution,
  coercion, metric tables, the step event);
- parsed and replayed into a run folder (the default: OTLP-JSON lines files);
- parsed and replayed to an OTLP/HTTP endpoint (a sink in a separate process that discards what
  it gets), when ``--otlp`` is given.
Target: >= 100,000 points/s for parse + log through the pipeline.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_rl.replay import parse_file, replay_file  # noqa: E402

TARGET_POINTS_PER_S = 100_000
KEYS = [
    "loss",
    "grad_norm",
    "learning_rate",
    "kl",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "rewards/Format/mean",
    "rewards/Format/std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "entropy/mean",
    "entropy/max",
    "entropy/min",
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
    "epoch",
]

_SINK = r"""
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H); print(s.server_address[1], flush=True); s.serve_forever()
"""


def rows(steps: int) -> list[tuple[int, dict[str, float]]]:
    rng = random.Random(0)
    # epoch grows with the step, as every trainer logs it (an epoch that goes back starts another run)
    return [(s, {k: (s / steps if k == "epoch" else rng.random()) for k in KEYS}) for s in range(1, steps + 1)]


def write_logs(folder: Path, steps: int) -> dict[str, Path]:
    data = rows(steps)
    files = {}
    swift = folder / "logging.jsonl"
    with open(swift, "w") as f:
        for s, v in data:
            f.write(
                json.dumps(
                    {
                        **v,
                        "global_step/max_steps": f"{s}/{steps}",
                        "elapsed_time": f"{s // 60}m {s % 60}s",
                        "memory(GiB)": 55.3,
                        "train_speed(iter/s)": 0.1,
                        "percentage": f"{s / steps * 100:.2f}%",
                        "remaining_time": "1h 0m 0s",
                    }
                )
                + "\n"
            )
    files["swift"] = swift
    state = folder / "trainer_state.json"
    state.write_text(json.dumps({"log_history": [{**v, "step": s} for s, v in data], "max_steps": steps}, indent=2))
    files["trl-state"] = state
    hf = folder / "hf_console.log"
    with open(hf, "w") as f:
        for s, v in data:
            f.write(f"\r{s * 100 // steps:3d}%|###       | {s}/{steps} [00:{s % 60:02d}<00:10,  1.00it/s]\r{' ' * 40}\r")
            f.write(str({k: f"{x:.4g}" for k, x in v.items()}) + "\n")
    files["hf-console"] = hf
    verl = folder / "verl.log"
    with open(verl, "w") as f:
        for s, v in data:
            f.write("\x1b[36m(TaskRunner pid=1)\x1b[0m " + " - ".join([f"step:{s}", *(f"{k}:{x!r}" for k, x in v.items())]) + "\n")
    files["verl-console"] = verl
    verl_jsonl = folder / "verl.jsonl"
    with open(verl_jsonl, "w") as f:
        for s, v in data:
            f.write(json.dumps({"step": s, "data": v}, separators=(",", ":")) + "\n")
    files["verl-jsonl"] = verl_jsonl
    roll = folder / "roll.log"
    with open(roll, "w") as f:
        for s, v in data:
            f.write(
                f"[2025-06-01 10:{s // 60 % 60:02d}:{s % 60:02d},000] [tracking.py (112)] [INFO] metrics_tag: "
                f"{json.dumps({'step': s, 'metrics': v})}\n"
            )
    files["roll-stdout"] = roll
    return files


def measure(files: dict[str, Path], work: Path, otlp: bool) -> list[dict[str, object]]:
    sink = None
    endpoint = None
    if otlp:
        sink = subprocess.Popen([sys.executable, "-c", _SINK], stdout=subprocess.PIPE, text=True)
        endpoint = f"http://127.0.0.1:{sink.stdout.readline().strip()}"  # type: ignore[union-attr]
    results = []
    try:
        for fmt, path in files.items():
            t0 = time.perf_counter()
            parsed = parse_file(path)
            parse_s = time.perf_counter() - t0
            row: dict[str, object] = {
                "format": fmt,
                "steps": len(parsed.records),
                "points": parsed.points,
                "parse_points_per_s": parsed.points / parse_s,
            }
            modes = [("pipeline", {"exporters": "none"}), ("run_folder", {"exporters": "file"})]
            if endpoint:
                modes.append(("otlp_http", {"endpoint": endpoint, "protocol": "http/protobuf", "exporters": "otlp"}))
            for mode, options in modes:
                t0 = time.perf_counter()
                parsed_again = parse_file(path)
                result = replay_file(
                    path, parsed=parsed_again, out=io.StringIO(), progress=False, force=True, run_dir=str(work / f"{fmt}-{mode}"), **options
                )  # type: ignore[arg-type]
                total = time.perf_counter() - t0
                row[f"{mode}_points_per_s"] = result.points / total  # parse + log, end to end
            results.append(row)
    finally:
        if sink is not None:
            sink.terminate()
            sink.wait(5)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000, help="steps per synthetic log (default 20000)")
    parser.add_argument("--otlp", action="store_true", help="also replay to a local OTLP/HTTP sink")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-replay-") as tmp:
        work = Path(tmp)
        files = write_logs(work, args.steps)
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        results = measure(files, work, args.otlp)
    if args.json:
        print(json.dumps({"target_points_per_s": TARGET_POINTS_PER_S, "results": results}, indent=2))
        return 0
    cols = ["parse_points_per_s", "pipeline_points_per_s", "run_folder_points_per_s"] + (["otlp_http_points_per_s"] if args.otlp else [])
    heads = ["parse only", "parse+log (pipeline)", "parse+log -> run folder"] + (["parse+log -> OTLP/HTTP"] if args.otlp else [])
    print(f"{'format':<14}{'points':>10}  " + "  ".join(f"{h:>24}" for h in heads))
    for row in results:
        print(f"{row['format']:<14}{row['points']:>10,}  " + "  ".join(f"{row[c]:>24,.0f}" for c in cols))
    worst = min(float(r["pipeline_points_per_s"]) for r in results)  # type: ignore[arg-type]
    verdict = "meets" if worst >= TARGET_POINTS_PER_S else "MISSES"
    print(
        f"\nparse + log through the pipeline: slowest format {worst:,.0f} points/s, {verdict} the {TARGET_POINTS_PER_S:,} points/s target"
    )
    print("(points/s; each column is the whole job: reading the file plus, where named, logging and exporting every point)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
