"""What one training rank pays for its telemetry at the step rate real jobs run: the whole process.

    python benchmarks/bench_rank_cost.py                 # 40 steps at 1 step/s per way (about 7 minutes)
    python benchmarks/bench_rank_cost.py --steps 20 --json

Each way runs in a process of its own, one after the other, against the same real collector (the
build of collector-config/builder-config.yaml, forwarding to a counting receiver): a 1 ms step of
busy work, 250 ROLL keys logged, a step span and 6 stage spans each with a cluster, at one step a
second, 5 warm-up steps, the default 10 s metric interval. The figure is the process's CPU time
(every thread, ``time.process_time()``) per step, less the 1 ms of busy work; per thread from
/proc/self/task/*/schedstat (nanoseconds), so where it goes is named. Ways:

- ``bare``: the same loop with no telemetry at all: what the process costs anyway (a wake-up a
  second, the busy loop's overshoot); each way's ``added_ms_per_step`` is its figure less this one's;
- ``floor``: the least a telemetry thread can do at this rate, for scale: the caller copies the
  step's values and 7 stage timestamps onto a queue; a thread woken once a step writes them as one
  orjson line to a file. No keys resolved, no metrics, no OTLP: no telemetry does less per step;
- ``none``: otel-rl with exporters="none" (the values resolved and held, nothing exported);
- ``file``: the run folder (the default without a collector);
- ``otlp-grpc`` / ``otlp-http``: otel-rl's default exporters to the collector (with the disk spool);
- ``sdk-grpc`` / ``sdk-http``: the OpenTelemetry SDK as its documentation sets it up, doing the same:
  BatchSpanProcessor, PeriodicExportingMetricReader and BatchLogRecordProcessor with the OTLP
  exporters, 250 synchronous gauges set per step, 7 spans and one log record of 250 attributes.

What telemetry costs a user is a way's figure less the bare loop's (``added_ms_per_step``); the
ratios are otel-rl's added figure over the SDK's for the same transport. A shared 2-core machine
is noisy: compare ways within one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

WAYS = ("bare", "floor", "none", "file", "otlp-grpc", "otlp-http", "sdk-grpc", "sdk-http")
BUSY_MS = 1.0

RANK = r'''
import json, os, sys, threading, time
sys.path.insert(0, {bench!r})
from bench_hotpath import step_values

way, steps, warm, grpc_url, http_url, run_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
STAGES = [("generate", "actor_infer"), ("reward", "reward"), ("old_logprob", "actor_train"),
          ("ref_logprob", "reference"), ("train_step", "actor_train"), ("sync_weights", "actor_train")]
values = step_values(250)


def threads():
    """{{thread id: (CPU ms, name)}} from /proc's schedstat, in nanoseconds (native threads without a Python name: '?comm')."""
    names = {{t.native_id: t.name for t in threading.enumerate()}}
    out = {{}}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{{tid}}/schedstat") as f:
                on_cpu_ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{{tid}}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        out[int(tid)] = (on_cpu_ns / 1e6, names.get(int(tid), "?" + comm))
    return out


def busy():
    end = time.perf_counter() + {busy_ms} / 1000.0
    while time.perf_counter() < end:
        pass


if way == "bare":
    def one_step(step):
        busy()

    def finish():
        pass
elif way == "floor":
    import collections, orjson
    queue, woken = collections.deque(), threading.Event()
    os.makedirs(run_dir, exist_ok=True)
    out = open(os.path.join(run_dir, "floor.jsonl"), "ab")

    def write_steps():
        while True:
            woken.wait()
            woken.clear()
            time.sleep(0.02)  # otel-rl's default gather: a step's items arrive together
            lines = []
            while queue:
                lines.append(orjson.dumps(queue.popleft()) + b"\n")
            out.write(b"".join(lines))
            out.flush()

    threading.Thread(target=write_steps, name="floor-writer", daemon=True).start()

    def one_step(step):
        start, stages = time.time_ns(), []
        for name, cluster in STAGES:
            stages.append((name, cluster, time.time_ns(), time.time_ns()))
        busy()
        queue.append((step, start, time.time_ns(), stages, dict(values)))
        woken.set()

    def finish():
        pass
elif way.startswith("sdk-"):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    try:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    except ImportError:
        raise SystemExit("this SDK has no log pipeline")
    if way == "sdk-grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        kw = [dict(endpoint=grpc_url, insecure=True)] * 3
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        kw = [dict(endpoint=f"{{http_url}}/v1/{{s}}") for s in ("traces", "metrics", "logs")]
    from otel_rl.semconv import attributes as A, names as N  # the names otel-rl gives them
    resource = Resource.create({{"service.name": "bench-rank", A.RL_RANK: 0}})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(**kw[0])))
    meter_provider = MeterProvider(resource=resource, metric_readers=[
        PeriodicExportingMetricReader(OTLPMetricExporter(**kw[1]), export_interval_millis=10_000)])
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter(**kw[2])))
    tracer = tracer_provider.get_tracer("bench")
    meter = meter_provider.get_meter("bench")
    gauges = {{key: meter.create_gauge(key.replace("/", ".")) for key in values}}
    logger = logger_provider.get_logger("bench")
    from opentelemetry._logs import LogRecord  # the API's record: what a program hands the SDK

    def one_step(step):
        with tracer.start_as_current_span(N.RL_STEP_SPAN, attributes={{A.RL_STEP: step}}):
            for name, cluster in STAGES:
                with tracer.start_as_current_span(N.RL_STAGE_SPAN_TEMPLATE.replace("<stage>", name), attributes={{A.RL_CLUSTER: cluster}}):
                    pass
            busy()
            for key, value in values.items():
                gauges[key].set(value)
            logger.emit(LogRecord(timestamp=time.time_ns(), event_name=N.RL_LOG_EVENT, attributes={{**values, A.RL_STEP: step}}))

    def finish():
        for provider in (tracer_provider, meter_provider, logger_provider):
            provider.shutdown()
else:
    import otel_rl
    options = dict(service_name="bench-rank", rank=0, world_size=1, run_dir=run_dir, console=False, framework="roll")
    if way == "none":
        options["exporters"] = "none"
    elif way.startswith("otlp-"):
        grpc = way == "otlp-grpc"
        options.update(endpoint=grpc_url if grpc else http_url, protocol="grpc" if grpc else "http/protobuf",
                       spool_dir=os.path.join(run_dir, "spool"))
    tel = otel_rl.init(**options)

    def one_step(step):
        with tel.step(step):
            for name, cluster in STAGES:
                with tel.stage(name, cluster=cluster):
                    pass
            busy()
            tel.log(values)

    def finish():
        tel.shutdown()

next_at = time.monotonic()
for step in range(warm + steps):
    if step == warm:
        cpu0, threads0 = time.process_time(), threads()
    one_step(step)
    next_at += 1.0
    time.sleep(max(0.0, next_at - time.monotonic()))
cpu = time.process_time() - cpu0
threads1 = threads()
per_thread = {{}}
for tid, (ms, name) in threads1.items():
    name = name if not name.startswith("Thread-") else "Thread-*"
    per_thread[name] = per_thread.get(name, 0.0) + (ms - threads0.get(tid, (0.0, ""))[0]) / steps
finish()
print(json.dumps({{"cpu_ms_per_step": 1000.0 * cpu / steps - {busy_ms},
                  "threads": {{k: round(v, 2) for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1]) if v > 0}}}}))
'''


def run_way(way: str, steps: int, warm: int, grpc_url: str, http_url: str, folder: Path, flush_ms: int | None = None) -> dict[str, Any]:
    code = RANK.format(bench=str(ROOT / "benchmarks"), busy_ms=BUSY_MS)
    env = dict(os.environ)
    if flush_ms is not None:
        env["OTEL_RL_FILE_FLUSH_INTERVAL"] = str(flush_ms)
    done = subprocess.run(
        [sys.executable, "-c", code, way, str(steps), str(warm), grpc_url, http_url, str(folder / way)],
        capture_output=True,
        text=True,
        timeout=steps + warm + 120,
        cwd=ROOT,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{way}: exit {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="measured steps per way (after 5 warm-up steps)")
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    parser.add_argument(
        "--file-flush-interval-ms",
        type=int,
        default=None,
        help="OTEL_RL_FILE_FLUSH_INTERVAL for otel-rl's ways (default: otel-rl's, 20 ms): how long the worker gathers "
        "items before a drain, and what a SIGKILL can lose of the spans and events",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from go_builds import collector_binary
    from local_collector import Collector
    from otlp_sink import OtlpSink

    results: dict[str, Any] = {"steps": args.steps, "step_rate_per_s": 1, "keys": 250, "spans_per_step": 7}
    if args.file_flush_interval_ms is not None:
        results["file_flush_interval_ms"] = args.file_flush_interval_ms
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-rank-") as tmp, OtlpSink() as sink:
        collector = Collector(collector_binary(), sink.endpoint, Path(tmp))
        collector.start()
        try:
            grpc_url, http_url = f"http://127.0.0.1:{collector.grpc_port}", f"http://127.0.0.1:{collector.http_port}"
            for way in args.ways:
                print(f"{way}: {args.steps + 5} steps at 1 step/s ...", file=sys.stderr, flush=True)
                results[way] = run_way(way, args.steps, 5, grpc_url, http_url, Path(tmp), args.file_flush_interval_ms)
        finally:
            collector.stop(timeout_s=15)
    bare = results.get("bare", {}).get("cpu_ms_per_step")
    for way in args.ways:
        if bare is not None and way != "bare":
            results[way]["added_ms_per_step"] = round(results[way]["cpu_ms_per_step"] - bare, 3)
    measure = "added_ms_per_step" if bare is not None else "cpu_ms_per_step"
    for transport in ("grpc", "http"):
        ours, sdk = results.get(f"otlp-{transport}"), results.get(f"sdk-{transport}")
        if ours and sdk and sdk[measure] > 0:
            results[f"ratio_{transport}_otel_rl_over_sdk"] = round(ours[measure] / sdk[measure], 2)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"CPU per step at 1 step/s, whole process, less the {BUSY_MS:g} ms of busy work ({args.steps} steps each):")
    for way in args.ways:
        r = results[way]
        top = ", ".join(f"{name} {ms:.2f}" for name, ms in list(r["threads"].items())[:5])
        added = f"added {r['added_ms_per_step']:5.2f} ms" if "added_ms_per_step" in r else ""
        print(f"  {way:<10} {r['cpu_ms_per_step']:6.2f} ms  {added}  ({top})")
    for transport in ("grpc", "http"):
        key = f"ratio_{transport}_otel_rl_over_sdk"
        if key in results:
            print(f"  otel-rl / SDK over {transport} ({'added' if bare is not None else 'whole'} CPU): {results[key]}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
