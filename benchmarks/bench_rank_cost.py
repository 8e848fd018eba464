"""What one training rank pays for its telemetry at the step rate real jobs run: the whole process.

    python benchmarks/bench_rank_cost.py                 # 3 rounds of 40 steps at 1 step/s (about 4 minutes)
    python benchmarks/bench_rank_cost.py --steps 20 --rounds 5 --json

Each way is a process of its own, and every way runs side by side in a round, against the same
real collector (the build of collector-config/builder-config.yaml, forwarding to a counting
receiver): a 1 ms step of busy work, 250 ROLL keys logged, a step span and 6 stage spans each with
a cluster, at one step a second, 5 warm-up steps, the default 10 s metric interval. The ways' steps
fall at staggered phases of each second, so their bursts do not overlap, and they share whatever
the machine does meanwhile: one way after another on a shared VM, the same way's figure moved by
up to 3x from one minute to the next. The figure is the process's CPU time (every thread,
``time.process_time()``) per step, less the 1 ms of busy work; per thread from
/proc/self/task/*/schedstat (nanoseconds), so where it goes is named. Each figure is the median
over the rounds. Ways:

- ``bare``: the same loop with no telemetry at all: what the process costs anyway (a wake-up a
  second, the busy loop's overshoot); each way's ``added_ms_per_step`` is its figure less the bare
  way's of the same round;
- ``floor``: the least a telemetry thread can do at this rate, for scale: the caller copies the
  step's values and 7 stage timestamps onto a queue; a thread woken once a step writes them as one
  orjson line to a file. No keys resolved, no metrics, no OTLP: no telemetry does less per step;
- ``none``: otel-rl with exporters="none" (the values resolved and held, nothing exported);
- ``file``: the run folder (the default without a collector);
- ``otlp-grpc`` / ``otlp-http``: otel-rl's default exporters to the collector (with the disk spool);
- ``sdk-grpc`` / ``sdk-http``: the OpenTelemetry SDK as its documentation sets it up, doing the same:
  BatchSpanProcessor, PeriodicExportingMetricReader and BatchLogRecordProcessor with the OTLP
  exporters, 250 synchronous gauges set per step, 7 spans and one log record of 251 attributes
  (its record limit raised from 128 to keep them all, as otel-rl keeps them; at 128 it drops the
  rest and logs a warning for each one dropped).

What telemetry costs a user is a way's figure less the bare loop's (``added_ms_per_step``); the
ratios are otel-rl's added figure over the SDK's for the same transport, and over the floor's.
The spans each exporting way delivered to the far side of the collector are counted, and anything a
way writes to stderr is reported: a way whose exporter stalled or dropped data would look cheap.
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
first_step_at = float(sys.argv[7])  # time.monotonic() (one clock for every process here) of the first step
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
    # The SDK keeps 128 attributes of a log record by default and logs a warning for each one it
    # drops: raised so that it keeps the step's 251 values, as otel-rl does.
    os.environ["OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT"] = "512"
    resource = Resource.create({{"service.name": "bench-rank-" + way, A.RL_RANK: 0}})
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
    options = dict(service_name="bench-rank-" + way, rank=0, world_size=1, run_dir=run_dir, console=False, framework="roll")
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

next_at = first_step_at
while next_at < time.monotonic():  # started late: the next second at this way's phase
    next_at += 1.0
time.sleep(max(0.0, next_at - time.monotonic()))
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


STARTUP_S = 20.0  # imports and init of every way, started together on 2 cores, before the first step


def run_ways_together(
    ways: list[str], steps: int, warm: int, grpc_url: str, http_url: str, folder: Path, flush_ms: int | None = None
) -> dict[str, Any]:
    """Every way at once, one process each, their steps at staggered phases of each second.

    Side by side in time, the ways share whatever the machine does meanwhile (other tenants, the
    host), which one way after another on a shared VM does not: their figures differ by up to 3x
    from one minute to the next. A way's steps fall 1/len(ways) s apart from the next way's, so their
    bursts do not overlap."""
    code = RANK.format(bench=str(ROOT / "benchmarks"), busy_ms=BUSY_MS)
    env = dict(os.environ)
    if flush_ms is not None:
        env["OTEL_RL_FILE_FLUSH_INTERVAL"] = str(flush_ms)
    first_step_at = time.monotonic() + STARTUP_S
    folder.mkdir(parents=True, exist_ok=True)
    procs = {}
    for index, way in enumerate(ways):
        phase = first_step_at + index / len(ways)
        argv = [sys.executable, "-c", code, way, str(steps), str(warm), grpc_url, http_url, str(folder / way), repr(phase)]
        # Output to files, not pipes: a pipe read only after another way ends fills up, and a thread
        # that logs to it then blocks (a way's figure would drop with its stalled exporter).
        with open(folder / f"{way}.out", "wb") as out, open(folder / f"{way}.err", "wb") as err:
            procs[way] = subprocess.Popen(argv, stdout=out, stderr=err, cwd=ROOT, env=env)
    results, deadline = {}, first_step_at + steps + warm + 120
    try:
        for way, proc in procs.items():
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            err = (folder / f"{way}.err").read_text(errors="replace").strip()
            if proc.returncode != 0:
                raise RuntimeError(f"{way}: exit {proc.returncode}: {err[-2000:]}")
            results[way] = json.loads((folder / f"{way}.out").read_text().strip().splitlines()[-1])
            if err:  # an exporter's complaint (a refused or failed export, dropped values) makes the figure suspect
                results[way]["stderr"] = err[-2000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def check_delivered(sink: Any, seen: int, round_: dict[str, Any], ways: list[str], spans: int, timeout_s: float = 30.0) -> None:
    """Each exporting way's spans of the round reached the collector's far side (a way whose
    exporter stalled or failed would otherwise show as cheap): the count is kept in the results."""
    exporting = [w for w in ways if w.startswith(("otlp-", "sdk-"))]
    deadline = time.monotonic() + timeout_s
    while True:
        with sink.received.lock:
            services = [r.get("service.name") for r in sink.received.span_resources[seen:]]
        got = {w: services.count("bench-rank-" + w) for w in exporting}
        if all(n >= spans for n in got.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for way, n in got.items():
        round_[way]["spans_delivered"] = n
        if n < spans:
            print(f"warning: {way} delivered {n} of its {spans} spans: its figure is suspect", file=sys.stderr)


def summarize(rounds: list[dict[str, Any]], ways: list[str]) -> dict[str, Any]:
    """Each way's median over the rounds; a way's added CPU is taken against the bare way of its own
    round (the same minute), and the ratios to the SDK per round too, then their medians."""
    summary: dict[str, Any] = {}
    has_bare = "bare" in ways
    for way in ways:
        whole = [r[way]["cpu_ms_per_step"] for r in rounds]
        entry: dict[str, Any] = {"cpu_ms_per_step": round(statistics.median(whole), 3), "rounds_cpu_ms_per_step": whole}
        figures = whole
        if has_bare and way != "bare":
            figures = [round(_way_figure(r, way, has_bare), 3) for r in rounds]
            entry["added_ms_per_step"] = round(statistics.median(figures), 3)
            entry["rounds_added_ms_per_step"] = figures
        middle = sorted(range(len(rounds)), key=lambda i: figures[i])[len(rounds) // 2]
        entry["threads"] = rounds[middle][way]["threads"]  # the median round's
        if way.startswith(("otlp-", "sdk-")):
            entry["rounds_spans_delivered"] = [r[way].get("spans_delivered") for r in rounds]
        complaints = [r[way]["stderr"] for r in rounds if "stderr" in r[way]]
        if complaints:
            entry["stderr"] = complaints
        summary[way] = entry
    for transport in ("grpc", "http"):
        ratio = _median_ratio(rounds, f"otlp-{transport}", f"sdk-{transport}", ways, has_bare)
        if ratio is not None:
            summary[f"ratio_{transport}_otel_rl_over_sdk"] = ratio
    for way in ways:
        ratio = _median_ratio(rounds, way, "floor", ways, has_bare) if way not in ("bare", "floor") else None
        if ratio is not None:
            summary[way]["over_floor"] = ratio
    summary["measure"] = "added_ms_per_step" if has_bare else "cpu_ms_per_step"
    return summary


def _median_ratio(rounds: list[dict[str, Any]], way: str, over: str, ways: list[str], has_bare: bool) -> float | None:
    """The median over the rounds of ``way``'s figure over ``over``'s in the same round."""
    if way not in ways or over not in ways:
        return None
    ratios = [_way_figure(r, way, has_bare) / _way_figure(r, over, has_bare) for r in rounds if _way_figure(r, over, has_bare) > 0]
    return round(statistics.median(ratios), 2) if ratios else None


def _way_figure(round_: dict[str, Any], way: str, has_bare: bool) -> float:
    figure = round_[way]["cpu_ms_per_step"]
    return figure - round_["bare"]["cpu_ms_per_step"] if has_bare else figure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="measured steps per way and round (after 5 warm-up steps)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every way side by side; each figure is the median")
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
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    ways = list(dict.fromkeys(args.ways))

    from go_builds import collector_binary
    from local_collector import Collector
    from otlp_sink import OtlpSink

    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-rank-") as tmp, OtlpSink() as sink:
        collector = Collector(collector_binary(), sink.endpoint, Path(tmp))
        collector.start()
        try:
            grpc_url, http_url = f"http://127.0.0.1:{collector.grpc_port}", f"http://127.0.0.1:{collector.http_port}"
            for index in range(args.rounds):
                print(
                    f"round {index + 1}/{args.rounds}: {len(ways)} ways side by side, {args.steps + 5} steps at 1 step/s "
                    f"(about {STARTUP_S + args.steps + 5:.0f} s) ...",
                    file=sys.stderr,
                    flush=True,
                )
                folder = Path(tmp) / f"round-{index}"
                seen = len(sink.received.spans)
                rounds.append(run_ways_together(ways, args.steps, 5, grpc_url, http_url, folder, args.file_flush_interval_ms))
                check_delivered(sink, seen, rounds[-1], ways, (args.steps + 5) * 7)
        finally:
            collector.stop(timeout_s=15)
    summary = summarize(rounds, ways)
    results: dict[str, Any] = {"steps": args.steps, "rounds": args.rounds, "step_rate_per_s": 1, "keys": 250, "spans_per_step": 7}
    if args.file_flush_interval_ms is not None:
        results["file_flush_interval_ms"] = args.file_flush_interval_ms
    results.update(summary)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        f"CPU per step at 1 step/s, whole process, less the {BUSY_MS:g} ms of busy work "
        f"(medians of {args.rounds} rounds of {args.steps} steps, every way side by side in each):"
    )
    for way in ways:
        r = results[way]
        top = ", ".join(f"{name} {ms:.2f}" for name, ms in list(r["threads"].items())[:5])
        added = ""
        if "added_ms_per_step" in r:
            spread = r["rounds_added_ms_per_step"]
            added = f"added {r['added_ms_per_step']:5.2f} ms ({min(spread):.2f}-{max(spread):.2f})"
        floor = f"  {r['over_floor']:.1f}x floor" if "over_floor" in r else ""
        print(f"  {way:<10} {r['cpu_ms_per_step']:6.2f} ms  {added}{floor}  ({top})")
    for way in ways:
        for complaint in results[way].get("stderr", [])[:1]:
            print(f"  warning: {way} wrote to stderr (its figure is suspect): {complaint.splitlines()[-1][:200]}")
        delivered = results[way].get("rounds_spans_delivered")
        if delivered:
            print(f"  {way}: spans delivered per round {delivered} (of {(args.steps + 5) * 7})")
    for transport in ("grpc", "http"):
        key = f"ratio_{transport}_otel_rl_over_sdk"
        if key in results:
            print(
                f"  otel-rl / SDK over {transport} ({'added' if 'bare' in ways else 'whole'} CPU, median of the rounds' ratios): {results[key]}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
