"""What a step's spans cost the whole process, side by side in one process.

    python benchmarks/bench_spans.py            # the tables
    python benchmarks/bench_spans.py --quick    # fewer rounds (a smoke run)
    python benchmarks/bench_spans.py --json

Every way runs in the same process, in interleaved rounds (the order alternates), and a round's
figure is the CPU of every thread (``time.process_time`` deltas) from its first call until the way
has written everything it owes to its file: otel-rl's worker has drained its queue, built the
spans and written the run folder; the SDK's batch processor has been flushed. The loop that waits
for otel-rl's worker is the benchmark's, not otel-rl's: its own thread CPU is left out.

1. A stage span: rounds of 200 ``tel.stage(...)`` blocks inside one step (the step's span is
   1/200 of the figure), the median over rounds of a round's CPU per span:
   - otel-rl: the span recorded on the caller's thread, built by the worker (``light_spans``) and
     written to the run folder, its ``rl.stage.duration`` point recorded (not exported: see below);
   - otel-rl, SDK spans: the same telemetry with the SDK's tracer for its scopes (as before
     ``light_spans``; what ``init(tracer_provider=...)`` still does);
   - OTel SDK: ``start_as_current_span`` with the same attributes, the SDK's batch span processor
     and the run folder's OTLP/JSON exporter writing to a file.
2. A whole 1 ms step: calibrated pure-Python work, a step span with 6 stage spans, each with its
   cluster as ROLL passes one, and ``log()``
   of 250 ROLL keys (``bench_hotpath.step_values``). A way's figure is the median, over the
   rounds, of its round minus the work alone in the same round (``bench_total``'s design), plus
   what its threads use while other ways run (their idle wake-ups, which every round pays):
   - off: the work alone; otel-rl; otel-rl, SDK spans (as above);
   - OTel SDK: the same spans as above and one synchronous gauge ``set()`` per key.
Metric exports (every 10 s by default; ``bench_total.py`` counts them) are left out of every way,
in both tables.

Targets (whole process): a stage span <= 20 us; a whole step's telemetry <= 250 us.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_hotpath import step_values  # noqa: E402
from bench_total import calibrate, median_interval, thread_cpu  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl._version import __version__  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

TARGET_STAGE_US = 20.0
TARGET_STEP_US = 250.0
SPANS_PER_ROUND = 200
STEPS_PER_ROUND = 50
STAGES = ("generate", "compute_rewards", "compute_log_probs", "compute_values", "train_step", "model_update")
# Each stage's cluster, as ROLL passes one (the issue's whole step: 6 stages, each with a cluster).
CLUSTERS = ("actor_infer", "reward", "actor_train", "critic", "actor_train", "actor_train")


class Way:
    """One way of recording: ``spans(n)`` runs n stage spans inside one step, ``step(s, work)`` one
    whole step; ``settle()`` waits for what its threads owe and returns the CPU seconds its own
    waiting loop used (left out of the figure). ``threads``: the native ids of the threads it started."""

    name = ""
    threads: frozenset[int] = frozenset()

    def own_cpu(self) -> float:
        return sum(thread_cpu(tid) for tid in self.threads)

    def spans(self, n: int) -> None:
        raise NotImplementedError

    def step(self, s: int, work: Callable[[], None]) -> None:
        raise NotImplementedError

    def settle(self) -> float:
        return 0.0

    def close(self) -> None:
        pass


class Off(Way):
    name = "off"

    def step(self, s: int, work: Callable[[], None]) -> None:
        work()


class OtelRl(Way):
    def __init__(self, folder: Path, values: dict[str, float], sdk_spans: bool) -> None:
        self.name = "otel-rl, SDK spans (before)" if sdk_spans else "otel-rl"
        # Built directly: the ways live side by side, and a second init() would shut the first down.
        config = {"service_name": "bench", "run_dir": str(folder), "console": False, "framework": "roll", "metric_export_interval_s": 3600}
        self.tel = otel_rl.Telemetry(otel_rl.resolve_config(config))
        if sdk_spans:  # the scopes take the SDK's tracer, as they did before light spans
            self.tel._tracer = self.tel._providers.tracer_provider.get_tracer("otel_rl", __version__)
        self.values = values
        self.round = 0

    def spans(self, n: int) -> None:
        tel = self.tel
        self.round += 1
        with tel.step(self.round):
            for _ in range(n):
                with tel.stage("generate", cluster="actor_infer"):
                    pass

    def step(self, s: int, work: Callable[[], None]) -> None:
        tel = self.tel
        with tel.step(s):
            with tel.stage(STAGES[0], cluster=CLUSTERS[0]):
                work()
            for name, cluster in zip(STAGES[1:], CLUSTERS[1:], strict=True):
                with tel.stage(name, cluster=cluster):
                    pass
            tel.log(self.values, step=s)

    def settle(self) -> float:
        pipeline = self.tel._pipeline  # the worker's queue and exports, read to wait for it (no public handle)
        t0 = time.thread_time()
        while pipeline.queue or pipeline._drain_lock.locked() or any(q.pending for q in pipeline.file_exports):
            time.sleep(0.002)
        return time.thread_time() - t0

    def close(self) -> None:
        self.tel.shutdown()


class Sdk(Way):
    name = "OTel SDK"

    def __init__(self, folder: Path, values: dict[str, float]) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from otel_rl.exporters.otlp_json import OtlpJsonSpanExporter

        resource = Resource.create({"service.name": "bench"})
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(OtlpJsonSpanExporter(folder / "sdk-traces.jsonl")))
        self.tracer = self.tracer_provider.get_tracer("otel_rl", __version__)
        self.out = open(folder / "sdk-metrics.jsonl", "w")  # noqa: SIM115 - closed in close()
        # exports only at close: metric exports are left out of every way
        reader = PeriodicExportingMetricReader(ConsoleMetricExporter(out=self.out), export_interval_millis=3_600_000)
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        meter = self.meter_provider.get_meter("bench")
        self.gauges = [(meter.create_gauge(key.replace("/", ".")), value) for key, value in values.items()]
        self.round = 0

    def spans(self, n: int) -> None:
        self.round += 1
        start = self.tracer.start_as_current_span
        with start(N.RL_STEP_SPAN, attributes={A.RL_STEP: self.round, A.RL_RANK: 0, A.RL_RUN_ID: "bench"}):
            for _ in range(n):
                with start(
                    "rl.generate", attributes={A.RL_STAGE: "generate", A.RL_RANK: 0, A.RL_STEP: self.round, A.RL_CLUSTER: "actor_infer"}
                ):
                    pass

    def step(self, s: int, work: Callable[[], None]) -> None:
        start = self.tracer.start_as_current_span
        with start(N.RL_STEP_SPAN, attributes={A.RL_STEP: s, A.RL_RANK: 0, A.RL_RUN_ID: "bench"}):
            with start(f"rl.{STAGES[0]}", attributes={A.RL_STAGE: STAGES[0], A.RL_RANK: 0, A.RL_STEP: s, A.RL_CLUSTER: CLUSTERS[0]}):
                work()
            for name, cluster in zip(STAGES[1:], CLUSTERS[1:], strict=True):
                with start(f"rl.{name}", attributes={A.RL_STAGE: name, A.RL_RANK: 0, A.RL_STEP: s, A.RL_CLUSTER: cluster}):
                    pass
            for gauge, value in self.gauges:
                gauge.set(value)

    def settle(self) -> float:
        self.tracer_provider.force_flush()  # exports on this thread: counted
        return 0.0

    def close(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        self.out.close()


def owned(make: Callable[[], Way]) -> Way:
    """Build a way, warm it, and note the threads it started."""
    before = {t.native_id for t in threading.enumerate()}
    way = make()
    for s in range(3):  # key plans, first exports, lazy imports
        way.step(-1 - s, lambda: None)
        if not isinstance(way, Off):
            way.spans(10)
    way.settle()
    way.threads = frozenset(t.native_id for t in threading.enumerate() if t.native_id not in before and t.native_id is not None)
    return way


def rounds(ways: list[Way], count: int, run: Callable[[Way], int]) -> dict[str, dict[str, Any]]:
    """Interleaved rounds: per way, each round's (CPU, caller CPU, wall) per unit (``run`` returns
    the units it ran), and its threads' CPU while other ways ran, per unit of theirs."""
    samples: dict[str, list[tuple[float, float, float]]] = {w.name: [] for w in ways}
    idle = {w.name: [0.0, 0] for w in ways}
    for r in range(count):
        for way in ways if r % 2 == 0 else ways[::-1]:
            others = [(w, w.own_cpu()) for w in ways if w is not way and w.threads]
            c0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
            units = run(way)
            wall = time.perf_counter() - w0
            caller = time.thread_time() - t0
            waited = way.settle()
            cpu = time.process_time() - c0 - waited
            samples[way.name].append((cpu / units, caller / units, wall / units))
            for other, before in others:
                idle[other.name][0] += other.own_cpu() - before
                idle[other.name][1] += units
    return {name: {"rounds": rows, "idle_s": idle[name][0] / idle[name][1] if idle[name][1] else 0.0} for name, rows in samples.items()}


def span_table(ways: list[Way], count: int) -> dict[str, dict[str, float]]:
    def run(way: Way) -> int:
        way.spans(SPANS_PER_ROUND)
        return SPANS_PER_ROUND

    out = {}
    for name, row in rounds(ways, count, run).items():
        cpu = [c for c, _, _ in row["rounds"]]
        low, high = median_interval(cpu)
        out[name] = {
            "cpu_us": float(np.median(cpu)) * 1e6,
            "ci95_us": [low * 1e6, high * 1e6],
            "caller_us": float(np.median([c for _, c, _ in row["rounds"]])) * 1e6,
        }
    return out


def step_table(ways: list[Way], work: Callable[[], None], count: int) -> dict[str, dict[str, Any]]:
    counter = {w.name: 0 for w in ways}

    def run(way: Way) -> int:
        for _ in range(STEPS_PER_ROUND):
            counter[way.name] += 1
            way.step(counter[way.name], work)
        return STEPS_PER_ROUND

    rows = rounds(ways, count, run)
    off = rows["off"]
    out: dict[str, dict[str, Any]] = {"off": {"cpu_us": float(np.median([c for c, _, _ in off["rounds"]])) * 1e6}}
    for name, row in rows.items():
        if name == "off":
            continue
        differences = [mine[0] - alone[0] for mine, alone in zip(row["rounds"], off["rounds"])]
        extra = row["idle_s"]  # its threads' wake-ups while the others ran: every round pays them, so the difference leaves them out
        low, high = median_interval(differences)
        out[name] = {
            "added_cpu_us": (float(np.median(differences)) + extra) * 1e6,
            "ci95_us": [(low + extra) * 1e6, (high + extra) * 1e6],
            "idle_us": extra * 1e6,
            "added_wall_us": float(np.median([mine[2] - alone[2] for mine, alone in zip(row["rounds"], off["rounds"])])) * 1e6,
        }
    return out


def run(quick: bool = False) -> dict[str, Any]:
    logging.getLogger("otel_rl").setLevel(logging.ERROR)
    folder = Path(tempfile.mkdtemp(prefix="otel-rl-bench-spans-"))
    values = step_values(250)
    ways = [
        owned(Off),
        owned(lambda: OtelRl(folder / "light", values, sdk_spans=False)),
        owned(lambda: OtelRl(folder / "before", values, sdk_spans=True)),
        owned(lambda: Sdk(folder, values)),
    ]
    spans = span_table(ways[1:], 7 if quick else 41)
    steps = step_table(ways, calibrate(1), 11 if quick else 101)
    for way in ways:
        way.close()
    sdk_span, light_span = spans["OTel SDK"]["cpu_us"], spans["otel-rl"]["cpu_us"]
    sdk_step, light_step = steps["OTel SDK"]["added_cpu_us"], steps["otel-rl"]["added_cpu_us"]
    return {
        "stage_span": spans,
        "step": steps,
        "targets": {
            "stage_span_us": {"max": TARGET_STAGE_US, "measured": light_span, "sdk": sdk_span, "met": light_span <= TARGET_STAGE_US},
            "step_us": {"max": TARGET_STEP_US, "measured": light_step, "sdk": sdk_step, "met": 0 < light_step <= TARGET_STEP_US},
        },
        "rounds": {"stage_span": 7 if quick else 41, "step": 11 if quick else 101},
    }


def print_table(results: dict[str, Any]) -> None:
    spans, steps = results["stage_span"], results["step"]
    sdk = spans["OTel SDK"]["cpu_us"]
    print(f"\na stage span ({results['rounds']['stage_span']} rounds of {SPANS_PER_ROUND} in one step; CPU of every thread per span)")
    print(f"{'way':30} {'CPU/span':>10} {'95% interval':>16} {'caller':>9} {'SDK / way':>10}")
    for name, row in spans.items():
        low, high = row["ci95_us"]
        print(f"{name:30} {row['cpu_us']:7.1f} us {low:7.1f}-{high:<6.1f}us {row['caller_us']:6.1f} us {sdk / row['cpu_us']:9.1f}x")
    off = steps["off"]["cpu_us"]
    print(
        f"\na whole step: {off / 1e3:.2f} ms of work, a step span, 6 stage spans, log() of 250 keys "
        f"({results['rounds']['step']} paired rounds of {STEPS_PER_ROUND} steps; the SDK: gauges for the keys)"
    )
    sdk = steps["OTel SDK"]["added_cpu_us"]
    print(f"{'way':30} {'added CPU/step':>15} {'95% interval':>16} {'of it idle':>11} {'added wall':>11} {'SDK / way':>10}")
    for name, row in steps.items():
        if name == "off":
            continue
        low, high = row["ci95_us"]
        print(
            f"{name:30} {row['added_cpu_us']:12.0f} us {low:7.0f}-{high:<6.0f}us {row['idle_us']:8.1f} us "
            f"{row['added_wall_us']:8.0f} us {sdk / row['added_cpu_us']:9.1f}x"
        )
    for label, target in (("a stage span", results["targets"]["stage_span_us"]), ("a whole step", results["targets"]["step_us"])):
        print(
            f"target: {label} <= {target['max']:.0f} us: {target['measured']:.1f} us (the SDK {target['sdk']:.1f} us, "
            f"{target['sdk'] / target['measured']:.1f}x): {'met' if target['met'] else 'MISSED'}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    results = run(quick=args.quick)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
