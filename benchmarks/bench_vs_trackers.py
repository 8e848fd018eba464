"""otel-rl's overhead against what people use instead, and under production-like load.

    python benchmarks/bench_vs_trackers.py trackers   # side by side in one process (ratios)
    python benchmarks/bench_vs_trackers.py demo       # the CPU demo with telemetry on vs off (paired runs)
    python benchmarks/bench_vs_trackers.py ranks      # 16 ranks at 1 step/s through the collector
    python benchmarks/bench_vs_trackers.py rss        # RSS growth over 100k logged steps
    python benchmarks/bench_vs_trackers.py all --json

trackers: the caller's cost per step, interleaved rounds in one process, best round kept (as in
bench_hotpath.py), for
- 250 scalar keys: a plain dict, otel-rl log(), the raw OTel SDK (one sync gauge set() per key),
  W&B (offline run, run.log) and tensorboardX (add_scalar per key);
- a stage span: otel-rl stage() and a bare SDK span; trackers have no spans, so their equivalent
  is timing the block and logging the duration as a scalar;
- a 4096-value distribution: otel-rl record() (caller + the worker's numpy binning), the SDK's
  Histogram.record per value, wandb.Histogram + run.log, tensorboardX add_histogram.
W&B and tensorboardX also work after the call returns (W&B in its service process, tensorboardX in
its writer thread), as otel-rl does on its worker thread; the worker's cost is reported too.

demo: `otel_rl.demo.run_demo` (a real GRPO training on CPU) with telemetry on (the default run
folder exporters) and off (exporters=none, no trackers, no console line), in pairs whose order
alternates; the figure is the median over pairs of (on - off) / off of the training time.

ranks: 16 processes, each an otel-rl rank (RANK=i, WORLD_SIZE=16) logging 250 keys plus two stage
spans at one step per second over OTLP/gRPC into one OpenTelemetry Collector (the build of
collector-config/builder-config.yaml), which forwards to a counting receiver.
Checked: every rl.log event and span arrived (no drops); reported: each rank's CPU time per step,
against the same loop with exporters=none (the exporter's share is the difference), and the
collector's whole-process CPU and forwarded bytes per rank per step (a forwarding config, not
the gateway's pipelines: a partial figure for ranks per collector core).

rss: one process logs 100k steps of 250 keys as fast as the worker keeps up (flush every 1000
steps), exporting over OTLP/HTTP to a receiver in another process; RSS is sampled at 10k steps
(after warm-up) and at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_hotpath import best_of, interleaved, step_values  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

# -- side by side ------------------------------------------------------------------------------------


def bench_trackers(quick: bool = False) -> dict[str, Any]:
    import wandb
    from tensorboardX import SummaryWriter

    logging.getLogger("otel_rl").setLevel(logging.ERROR)
    os.environ.setdefault("WANDB_SILENT", "true")
    number = 50 if quick else 300
    tmp = Path(tempfile.mkdtemp(prefix="otel-rl-bench-trackers-"))
    values = step_values(250)
    # No bound on the queue: the worker is held while the rounds run (2,100 calls), and past the
    # bound (1,000 by default) log() would be timing the drop of a call instead of the call.
    tel = otel_rl.init(service_name="bench", run_dir=str(tmp / "otel"), exporters="none", console=False, framework="roll", max_queue=0)
    run = wandb.init(mode="offline", dir=str(tmp), project="bench", settings=wandb.Settings(silent=True, console="off"))
    writer = SummaryWriter(str(tmp / "tbx"))
    meter = tel._providers.meter_provider.get_meter("bench.sdk")
    gauges = {key: meter.create_gauge(f"bench.{i}") for i, key in enumerate(values)}
    tel.log(values, step=0)
    tel.flush()
    sink: dict[str, float] = {}
    counter = [0]

    def next_step() -> int:
        counter[0] += 1
        return counter[0]

    def dict_store() -> None:
        for key, value in values.items():
            sink[key] = value

    def otel_rl_log() -> None:
        tel.log(values, step=next_step())

    def sdk_gauges() -> None:
        for key, value in values.items():
            gauges[key].set(value)

    def wandb_log() -> None:
        run.log(values, step=next_step())

    def tbx_scalars() -> None:
        step = next_step()
        for key, value in values.items():
            writer.add_scalar(key, value, step)

    pipeline = tel._pipeline
    with pipeline._drain_lock:  # the worker's share is measured separately below
        scalars = interleaved(
            {"dict": dict_store, "otel_rl": otel_rl_log, "otel_sdk": sdk_gauges, "wandb": wandb_log, "tensorboardX": tbx_scalars}, number
        )
        queued = len(pipeline.queue)
    assert not tel.queue_dropped_calls, "the measured calls must be calls, not drops"
    t0 = time.perf_counter()
    pipeline.drain()
    worker = (time.perf_counter() - t0) / max(queued, 1)

    tracer = tel._providers.tracer_provider.get_tracer("bench.sdk")

    def stage_span() -> None:
        with tel.stage("generate", cluster="actor_infer"):
            pass

    def bare_span() -> None:
        with tracer.start_as_current_span("rl.generate"):
            pass

    def wandb_timer() -> None:
        t = time.perf_counter()
        run.log({"time/generate": time.perf_counter() - t}, step=next_step())

    def tbx_timer() -> None:
        t = time.perf_counter()
        writer.add_scalar("time/generate", time.perf_counter() - t, next_step())

    with pipeline._drain_lock:
        spans = interleaved({"otel_rl": stage_span, "otel_sdk": bare_span, "wandb": wandb_timer, "tensorboardX": tbx_timer}, number * 4)
    pipeline.drain()

    rewards = np.random.default_rng(1).normal(size=4096)
    hist = tel._histograms
    sdk_hist = meter.create_histogram("bench.sdk.hist")
    absolute = np.abs(rewards).tolist()

    def otel_rl_record() -> None:
        tel.record(M.RL_SAMPLE_REWARD, rewards)

    def otel_rl_binning() -> None:
        hist.record_many(M.RL_SAMPLE_REWARD, rewards)

    def sdk_per_value() -> None:
        for v in absolute:
            sdk_hist.record(v)

    def wandb_hist() -> None:
        run.log({"reward": wandb.Histogram(rewards)}, step=next_step())

    def tbx_hist() -> None:
        writer.add_histogram("reward", rewards, next_step())

    with pipeline._drain_lock:
        dist = interleaved(
            {"otel_rl_caller": otel_rl_record, "otel_rl_binning": otel_rl_binning, "wandb": wandb_hist, "tensorboardX": tbx_hist},
            max(number // 10, 5),
        )
    pipeline.drain()
    dist["otel_sdk"] = best_of(sdk_per_value, 3, 3)
    dist["otel_rl"] = dist.pop("otel_rl_caller") + dist.pop("otel_rl_binning")

    writer.close()
    run.finish()
    tel.shutdown()
    us = {name: round(v * 1e6, 2) for name, v in scalars.items()}
    return {
        "scalars_250_us": us,
        "scalars_ratio_vs_otel_rl": {k: round(v / scalars["otel_rl"], 2) for k, v in scalars.items()},
        "otel_rl_worker_us_per_step": round(worker * 1e6, 1),
        "span_us": {k: round(v * 1e6, 2) for k, v in spans.items()},
        "span_ratio_vs_otel_rl": {k: round(v / spans["otel_rl"], 2) for k, v in spans.items()},
        "distribution_4096_us": {k: round(v * 1e6, 1) for k, v in dist.items()},
        "distribution_ratio_vs_otel_rl": {k: round(v / dist["otel_rl"], 2) for k, v in dist.items()},
    }


# -- the demo with telemetry on vs off ------------------------------------------------------------------


DEMO_CHILD = """
import json, sys, time, logging
logging.disable(logging.WARNING)
import torch
torch.set_num_threads(1)
import otel_rl
from otel_rl.demo import run_demo
on = sys.argv[1] == "on"
out = sys.argv[2]
tel = otel_rl.init(service_name="bench-demo", run_dir=out, exporters="file" if on else "none", console=False,
                   framework="roll")
t0 = time.perf_counter()
run_demo(steps=int(sys.argv[3]), algo="grpo", telemetry=tel, out=out, progress=False, seed=0)
elapsed = time.perf_counter() - t0
tel.shutdown()
print(json.dumps({"seconds": elapsed}))
"""


def bench_demo(pairs: int = 5, steps: int = 12) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="otel-rl-bench-demo-"))
    diffs, on_s, off_s = [], [], []
    for i in range(pairs):
        order = ("on", "off") if i % 2 == 0 else ("off", "on")
        got = {}
        for mode in order:
            done = subprocess.run(
                [sys.executable, "-c", DEMO_CHILD, mode, str(tmp / f"{mode}{i}"), str(steps)],
                capture_output=True,
                text=True,
                timeout=900,
                cwd=ROOT,
            )
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            got[mode] = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
        on_s.append(got["on"])
        off_s.append(got["off"])
        diffs.append((got["on"] - got["off"]) / got["off"] * 100)
    return {
        "pairs": pairs,
        "steps": steps,
        "on_s": [round(x, 2) for x in on_s],
        "off_s": [round(x, 2) for x in off_s],
        "median_overhead_pct": round(statistics.median(diffs), 2),
        "per_pair_pct": [round(d, 2) for d in diffs],
    }


# -- 16 ranks through the collector ------------------------------------------------------------------------

RANK_CHILD = """
import json, os, sys, time, logging
logging.disable(logging.WARNING)
sys.path.insert(0, {bench!r})
import psutil
import otel_rl
from bench_hotpath import step_values
rank, steps, endpoint, exporters = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
tel = otel_rl.init(service_name="bench-ranks", endpoint=endpoint, protocol="grpc", exporters=exporters, rank=rank,
                   world_size=16, run_dir=sys.argv[5], console=False, framework="roll", metric_export_interval_s=10)
values = step_values(250)
proc = psutil.Process()
start_cpu = sum(proc.cpu_times()[:2])
next_at = time.monotonic()
for step in range(steps):
    with tel.step(step):
        with tel.stage("generate", cluster="actor_infer"):
            pass
        with tel.stage("train_step", cluster="actor_train"):
            pass
        tel.log(values)
    next_at += 1.0
    time.sleep(max(0.0, next_at - time.monotonic()))
cpu = sum(proc.cpu_times()[:2]) - start_cpu
tel.shutdown()
print(json.dumps({{"rank": rank, "cpu_s": cpu, "rss_mb": proc.memory_info().rss / 2**20}}))
"""


def bench_ranks(steps: int = 30, ranks: int = 16) -> dict[str, Any]:
    import psutil
    from go_builds import collector_binary
    from local_collector import Collector
    from otlp_sink import OtlpSink

    tmp = Path(tempfile.mkdtemp(prefix="otel-rl-bench-ranks-"))
    code = RANK_CHILD.format(bench=str(ROOT / "benchmarks"))
    results: dict[str, Any] = {"ranks": ranks, "steps": steps}
    with OtlpSink() as sink:
        collector = Collector(collector_binary(), sink.endpoint, tmp)
        collector.start()
        grpc_port = collector.grpc_port
        try:
            collector_proc = psutil.Process(collector.process.pid) if collector.process else None
            for mode in ("none", "otlp"):
                if mode == "otlp":  # the collector's share from here on: only the otlp ranks send
                    cpu0 = sum(collector_proc.cpu_times()[:2]) if collector_proc else 0.0
                    bytes0 = sum(len(body) for body in sink.received.bodies)
                procs = [
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            code,
                            str(r),
                            str(steps),
                            f"http://127.0.0.1:{grpc_port}",
                            mode,
                            str(tmp / f"{mode}-rank{r}"),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    for r in range(ranks)
                ]
                outs = [json.loads(p.communicate(timeout=steps + 120)[0].strip().splitlines()[-1]) for p in procs]
                results[f"cpu_ms_per_step_{mode}"] = round(statistics.median(o["cpu_s"] for o in outs) / steps * 1e3, 2)
                results[f"rss_mb_{mode}"] = round(statistics.median(o["rss_mb"] for o in outs), 1)
            deadline = time.monotonic() + 30
            while len(sink.received.events(N.RL_LOG_EVENT)) < ranks * steps and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)
            # The collector's whole process while it took the otlp ranks' data (a forwarding config,
            # not the gateway's pipelines: partial), and what it forwarded (gzip, after batching).
            if collector_proc:
                cpu_ms = (sum(collector_proc.cpu_times()[:2]) - cpu0) * 1e3
                results["collector_cpu_ms_per_rank_step"] = round(cpu_ms / (ranks * steps), 3)
                results["ranks_per_collector_core_at_1_step_per_s"] = int(1000 / max(cpu_ms / (ranks * steps), 1e-9))
            results["forwarded_bytes_per_rank_step"] = int((sum(len(b) for b in sink.received.bodies) - bytes0) / (ranks * steps))
        finally:
            collector.stop(timeout_s=15)
        events = sink.received.events(N.RL_LOG_EVENT)
        results["events_received"] = len(events)
        results["events_emitted"] = ranks * steps
        results["spans_received"] = len(sink.received.spans)
        results["spans_emitted"] = ranks * steps * 3
        results["no_drops"] = len(events) == ranks * steps and len(sink.received.spans) == ranks * steps * 3
        results["exporter_cpu_ms_per_step_per_rank"] = round(results["cpu_ms_per_step_otlp"] - results["cpu_ms_per_step_none"], 2)
        results["exporter_cpu_pct_of_a_core"] = round(results["exporter_cpu_ms_per_step_per_rank"] / 1000 * 100, 3)
    return results


# -- RSS over 100k steps -------------------------------------------------------------------------------------

NULL_RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def bench_rss(steps: int = 100_000, keys: int = 250) -> dict[str, Any]:
    import psutil

    logging.getLogger("otel_rl").setLevel(logging.ERROR)
    receiver = subprocess.Popen([sys.executable, "-c", NULL_RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(receiver.stdout.readline())
        tmp = Path(tempfile.mkdtemp(prefix="otel-rl-bench-rss-"))
        tel = otel_rl.init(
            service_name="bench-rss",
            endpoint=f"http://127.0.0.1:{port}",
            exporters="otlp",
            run_dir=str(tmp),
            console=False,
            framework="roll",
            metric_export_interval_s=5,
        )
        values = step_values(keys)
        proc = psutil.Process()
        samples: dict[int, float] = {}
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            with tel.step(step):
                with tel.stage("generate", cluster="actor_infer"):
                    pass
                tel.log(values)
            if step % 1000 == 0:
                tel.flush(timeout_s=30)
                if step in (10_000, steps) or step % 20_000 == 0:
                    samples[step] = proc.memory_info().rss / 2**20
        elapsed = time.perf_counter() - t0
        tel.shutdown()
    finally:
        receiver.terminate()
        receiver.wait(10)
    base = samples[10_000]
    return {
        "steps": steps,
        "keys": keys,
        "seconds": round(elapsed, 1),
        "rss_mb": {k: round(v, 1) for k, v in samples.items()},
        "growth_mb_10k_to_end": round(samples[steps] - base, 1),
        "growth_bytes_per_step": round((samples[steps] - base) * 2**20 / (steps - 10_000), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["trackers", "demo", "ranks", "rss", "all"])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer iterations, pairs, steps (a smoke run)")
    args = parser.parse_args(argv)
    runs: dict[str, Callable[[], Any]] = {
        "trackers": lambda: bench_trackers(args.quick),
        "demo": lambda: bench_demo(pairs=2 if args.quick else 5, steps=4 if args.quick else 12),
        "ranks": lambda: bench_ranks(steps=5 if args.quick else 30),
        "rss": lambda: bench_rss(steps=12_000 if args.quick else 100_000),
    }
    chosen = list(runs) if args.what == "all" else [args.what]
    results = {}
    for name in chosen:
        results[name] = runs[name]()
        if not args.json:
            print(f"{name}: {json.dumps(results[name], indent=2)}", flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
