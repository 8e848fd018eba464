"""What telemetry costs the whole process per training step, side by side in one process.

    python benchmarks/bench_total.py            # the table (1, 10 and 100 ms steps)
    python benchmarks/bench_total.py --quick    # fewer steps and rounds
    python benchmarks/bench_total.py --json
    python benchmarks/bench_total.py --keys-only   # only the target's table (250 keys, 1 ms steps, off / otel-rl / SDK)

A step is a fixed amount of pure-Python work (calibrated to 1, 10 or 100 ms alone), two stage
blocks, 250 scalar keys (ROLL's, from bench_hotpath.step_values) and one 4096-value distribution.
Each way of recording them runs the same steps, in interleaved rounds; every round ends with the
way's flush, so the figure holds all the work, not only the caller's share:

- off: the work alone;
- otel-rl: otel-rl's telemetry (what ``otel_rl.init()`` builds) with its default exporters (the run folder: OTLP-JSON files), a step
  span with two stage spans, ``log()`` and ``record()``;
- otel-rl pipeline: the same with ``exporters=none`` (resolving and storing the values; with
  nothing to take them, no event is built);
- OTel SDK: a step span with two child spans, one synchronous gauge ``set()`` per key and one
  ``Histogram.record()`` per value, exported by the SDK's batch span processor and periodic metric
  reader to its console exporters (JSON) writing to a file;
- W&B offline: ``run.log`` of the keys, the two stage times and a ``wandb.Histogram``; the CPU of
  W&B's service process counts;
- tensorboardX: ``add_scalar`` per key and stage time, ``add_histogram``.

CPU is the process's CPU time (every thread) plus that of its child processes (W&B's service);
wall is the step loop's elapsed time. A way's added cost is the median, over the interleaved
rounds, of its round minus the work alone in the same round (the two run back to back, so a
disturbance of the shared machine shifts one pair, not the whole figure), plus its idle cost:
what the threads (and child processes) it started use while other ways record, per step. All
ways live in one process, so the rounds of the work alone pay every way's idle wake-ups too, and
the difference alone would leave them out. An added cost whose median's 95% bootstrap interval
holds zero is shown as such. Reported: CPU and wall added per step
against ``off``, and the ratio of each way's added CPU to otel-rl's. The step rate at which
otel-rl's worker falls behind is measured separately: ``log()`` as fast as the caller can, the
worker's steps per second, and what the bounded queue dropped.

A last table times the 250 keys alone (1 ms steps): otel-rl's ``log()``, the SDK's gauges, W&B's
``run.log`` and tensorboardX's ``add_scalar``. Target: otel-rl adds <= 100 us of CPU per 250-key
step in total (caller + worker + export), at least 3x less than one SDK gauge per key.

The target's own table (first, with nothing else loaded: off against otel-rl, then off against the
SDK) pairs many short rounds (1,001 of 100 steps), each ending when the way's worker has drained
what it owes. On a shared machine the work alone drifts by ~10% between any two rounds whatever
their length, so the median of the paired differences tightens with the number of pairs; it is
given with a 95% bootstrap interval. Each way exports its metrics every
10,000 steps (what the default 10 s interval makes of 1 ms steps; both ways' own periodic readers
are set to an hour so that only these exports run); the exports' CPU is summed apart and added
per step in full, not left to a median that would drop them as outliers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_hotpath import step_values  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402

TARGET_ADDED_US = 100.0
# The target row is the figure that decides. On this kind of shared machine the work alone drifts
# by ~10% (~100 us a step) between any two rounds, short or long, so the median of the paired
# differences tightens with the number of pairs, not with their length: many short rounds.
TARGET_ROUNDS = 1001
TARGET_STEPS = 100
SDK_ROUNDS = 51  # the SDK's ~2 ms a step needs no such precision for its ratio
FLUSH_EVERY = 10_000  # steps between metric exports in the target's rounds: 10 s of 1 ms steps
STEP_MS = (1, 10, 100)


def calibrate(ms: float) -> Callable[[], None]:
    """A pure-Python function that takes about ``ms`` milliseconds alone (a fixed count of operations,
    so it does the same work whatever else the process does)."""

    def spin(n: int) -> int:
        total = 0
        for i in range(n):
            total += i * i % 7
        return total

    n = 20_000
    while True:
        t0 = time.process_time()
        spin(n)
        took = time.process_time() - t0
        if took > 0.02:
            break
        n *= 2
    count = max(1, int(n * (ms / 1000.0) / took))
    return lambda: spin(count)


class Way:
    """One way of recording a step: ``step(s, work)`` does the step's recording around the work,
    ``keys(s, work)`` only the 250 scalar keys, ``flush()`` finishes it. ``threads``: the native ids
    of the threads it started (see :func:`owned`)."""

    name = ""
    threads: frozenset[int] = frozenset()

    def own_cpu(self) -> float:
        """CPU seconds its threads (and child processes) have used so far."""
        return sum(thread_cpu(tid) for tid in self.threads)

    def step(self, s: int, work: Callable[[], None]) -> None:
        raise NotImplementedError

    def keys(self, s: int, work: Callable[[], None]) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        pass

    def settle(self) -> None:
        """Wait for the work its threads still owe for the steps recorded (a round ends with it)."""

    def close(self) -> None:
        pass


class Off(Way):
    name = "off"

    def step(self, s: int, work: Callable[[], None]) -> None:
        work()

    keys = step


class OtelRl(Way):
    def __init__(
        self, folder: Path, values: dict[str, Any], dist: np.ndarray | None, exporters: str | None, framework: str = "roll"
    ) -> None:
        # Metric exports happen at the benchmark's flushes only (each measure() says how often).
        kwargs: dict[str, Any] = {
            "service_name": "bench",
            "run_dir": str(folder),
            "console": False,
            "framework": framework,
            "metric_export_interval_s": 3600,
        }
        if exporters is not None:
            kwargs["exporters"] = exporters
        self.name = "otel-rl" if exporters is None else f"otel-rl pipeline (exporters={exporters})"
        # Built directly: the ways live side by side, and a second init() would shut the first down.
        self.tel = otel_rl.Telemetry(otel_rl.resolve_config(kwargs))
        self.values, self.dist = values, dist

    def step(self, s: int, work: Callable[[], None]) -> None:
        tel = self.tel
        with tel.step(s):
            with tel.stage("generate"):
                work()
            with tel.stage("train"):
                pass
            tel.log(self.values, step=s)
            tel.record(M.RL_SAMPLE_RESPONSE_LENGTH, self.dist)

    def keys(self, s: int, work: Callable[[], None]) -> None:
        work()
        self.tel.log(self.values, step=s)

    def flush(self) -> None:
        self.tel.flush()

    def settle(self) -> None:
        pipeline = self.tel._pipeline  # the worker's queue, read to wait for it (no public handle)
        while pipeline.queue or pipeline._drain_lock.locked():
            time.sleep(0.002)

    def close(self) -> None:
        self.tel.shutdown()


class Sdk(Way):
    name = "OTel SDK (sync gauges)"

    def __init__(self, folder: Path, values: dict[str, float], dist: np.ndarray) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        self.out = open(folder / "sdk.jsonl", "w")  # noqa: SIM115 - closed in close()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=self.out)))
        # exports at the benchmark's flushes only, as for otel-rl
        self.reader = PeriodicExportingMetricReader(ConsoleMetricExporter(out=self.out), export_interval_millis=3_600_000)
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        meter = self.meter_provider.get_meter("bench")
        self.tracer = self.tracer_provider.get_tracer("bench")
        self.gauges = [(meter.create_gauge(key.replace("/", ".")), value) for key, value in values.items()]
        self.histogram = meter.create_histogram("rl.response.length")
        self.dist = dist.tolist()

    def step(self, s: int, work: Callable[[], None]) -> None:
        with self.tracer.start_as_current_span("rl.step"):
            with self.tracer.start_as_current_span("rl.generate"):
                work()
            with self.tracer.start_as_current_span("rl.train"):
                pass
            for gauge, value in self.gauges:
                gauge.set(value)
            record = self.histogram.record
            for value in self.dist:
                record(value)

    def keys(self, s: int, work: Callable[[], None]) -> None:
        work()
        for gauge, value in self.gauges:
            gauge.set(value)

    def flush(self) -> None:
        self.tracer_provider.force_flush()
        self.meter_provider.force_flush()
        self.out.flush()

    def close(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        self.out.close()


class Wandb(Way):
    name = "W&B offline"

    def __init__(self, folder: Path, values: dict[str, float], dist: np.ndarray) -> None:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        self.run = wandb.init(mode="offline", dir=str(folder), project="bench", settings=wandb.Settings(silent=True, console="off"))
        self.values, self.dist = values, dist

    def step(self, s: int, work: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        work()
        t1 = time.perf_counter()
        row = dict(self.values)
        row.update({"time/generate": t1 - t0, "time/train": time.perf_counter() - t1, "response_length": self.wandb.Histogram(self.dist)})
        self.run.log(row, step=s)

    def keys(self, s: int, work: Callable[[], None]) -> None:
        work()
        self.run.log(self.values, step=s)

    def own_cpu(self) -> float:
        total = super().own_cpu()
        for child in psutil.Process().children(recursive=True):  # W's service process
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
        return total

    def close(self) -> None:
        self.run.finish()


class TensorboardX(Way):
    name = "tensorboardX"

    def __init__(self, folder: Path, values: dict[str, float], dist: np.ndarray) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(str(folder / "tbx"))
        self.values, self.dist = values, dist

    def step(self, s: int, work: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        work()
        t1 = time.perf_counter()
        add = self.writer.add_scalar
        add("time/generate", t1 - t0, s)
        add("time/train", time.perf_counter() - t1, s)
        for key, value in self.values.items():
            add(key, value, s)
        self.writer.add_histogram("response_length", self.dist, s)

    def keys(self, s: int, work: Callable[[], None]) -> None:
        work()
        add = self.writer.add_scalar
        for key, value in self.values.items():
            add(key, value, s)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def thread_cpu(tid: int) -> float:
    """CPU seconds of one thread of this process, to the nanosecond (0 once it has ended)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def owned(make: Callable[[], Way]) -> Way:
    """Build a way and note the threads it started: what they use while other ways run is its idle cost."""
    before = {t.native_id for t in threading.enumerate()}
    way = make()
    _warm([way])
    way.threads = frozenset(t.native_id for t in threading.enumerate() if t.native_id not in before and t.native_id is not None)
    return way


def process_cpu(proc: psutil.Process) -> float:
    """CPU seconds of this process (all threads: time.process_time, to the microsecond) and of its
    live child processes (psutil, to the clock tick)."""
    total = time.process_time()
    for child in proc.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def measure(
    ways: list[Way], work: Callable[[], None], steps: int, rounds: int, only_keys: bool = False, flush_every: int | None = None
) -> dict[str, dict[str, float]]:
    """Per way: CPU and wall seconds per step, the median over rounds; the spread of its rounds'
    CPU; and the per-round samples (for the paired differences against ``off``).

    ``flush_every`` None: each round ends with the way's flush, inside the round. A number of
    steps: a way flushes (one metric export) after that many of its steps, as a periodic export
    would; the flush's CPU is summed apart (``flush_s``, per step) so a rare export is charged in
    full instead of falling outside a median. Every round ends with ``settle()``: the worker's
    backlog is paid in its own round."""
    proc = psutil.Process()
    samples: dict[str, list[tuple[float, float]]] = {w.name: [] for w in ways}
    counter = {w.name: 0 for w in ways}
    idle = {w.name: [0.0, 0] for w in ways}  # CPU its threads used while other ways ran, and those steps
    busy = {w.name: 0.0 for w in ways}  # CPU its threads used in its own rounds
    flushes = {w.name: [0.0, 0] for w in ways}  # CPU of its flushes, steps since its last one
    for r in range(rounds):
        order = ways if r % 2 == 0 else ways[::-1]  # alternate the order: no way always runs first
        for way in order:
            others = [(w, w.own_cpu()) for w in ways if w is not way and w.threads]
            mine = way.own_cpu()
            c0, t0 = process_cpu(proc), time.perf_counter()
            record = way.keys if only_keys else way.step
            for _ in range(steps):
                counter[way.name] += 1
                record(counter[way.name], work)
            wall = time.perf_counter() - t0  # the loop's own time: not the wait for the worker below
            way.settle()
            flushed_cpu = 0.0
            flushes[way.name][1] += steps
            if flush_every is None:
                way.flush()
            elif flushes[way.name][1] >= flush_every:
                f0 = process_cpu(proc)
                way.flush()
                flushed_cpu = process_cpu(proc) - f0
                flushes[way.name][0] += flushed_cpu
                flushes[way.name][1] = 0
            cpu = process_cpu(proc) - c0 - flushed_cpu
            samples[way.name].append((cpu / steps, wall / steps))
            busy[way.name] += way.own_cpu() - mine
            for other, before in others:
                idle[other.name][0] += other.own_cpu() - before
                idle[other.name][1] += steps
    out = {}
    for name, rows in samples.items():
        cpus = [c for c, _ in rows]
        out[name] = {
            "cpu_s": float(np.median(cpus)),
            "wall_s": float(np.median([w for _, w in rows])),
            "spread_s": max(cpus) - min(cpus),
            "rounds": rows,
            "idle_s": idle[name][0] / idle[name][1] if idle[name][1] else 0.0,
            "threads_s": busy[name] / (steps * rounds),
            "flush_s": flushes[name][0] / (steps * rounds),
        }
    return out


def falls_behind(folder: Path, values: dict[str, float], seconds: float = 2.0) -> dict[str, float]:
    """log() with no work between steps: the caller's rate, the worker's, and what was dropped."""
    tel = otel_rl.init(service_name="bench", run_dir=str(folder), console=False, framework="roll")
    tel.log(values, step=0)
    tel.flush()
    pipeline = tel._pipeline
    done0 = pipeline.processed
    t0 = time.perf_counter()
    s = 0
    while time.perf_counter() - t0 < seconds:
        s += 1
        tel.log(values, step=s)
    caller = time.perf_counter() - t0
    processed = pipeline.processed - done0
    worker_s = time.perf_counter() - t0
    dropped = tel.queue_dropped_calls
    tel.flush()
    tel.shutdown()
    return {"caller_steps_per_s": s / caller, "worker_steps_per_s": processed / worker_s, "logged": s, "dropped": dropped}


def median_interval(samples: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``samples`` (fixed seed: the same samples give the same interval)."""
    data = np.asarray(samples)
    medians = np.median(np.random.default_rng(0).choice(data, (resamples, len(data))), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def _added(rows: dict[str, Any]) -> None:
    """Each way's added CPU and wall per step: the median of its paired differences with ``off``,
    plus what its threads use while it is not the one recording (their idle wake-ups, which the
    rounds of ``off`` pay too, so the difference alone would leave them out)."""
    off = rows["off"]

    def differences(row: dict[str, Any], index: int) -> list[float]:
        return [mine[index] - alone[index] for mine, alone in zip(row["rounds"], off["rounds"])]

    def paired(row: dict[str, Any], index: int) -> float:
        return float(np.median(differences(row, index)))

    def extra(row: dict[str, Any]) -> float:  # what no round holds: idle threads, flushes summed apart
        return row["idle_s"] + row["flush_s"] - off["flush_s"]

    base = paired(rows["otel-rl"], 0) + extra(rows["otel-rl"]) if "otel-rl" in rows else float("nan")
    for row in rows.values():
        added = paired(row, 0) + extra(row)
        row["idle_cpu_us"] = row["idle_s"] * 1e6
        row["added_cpu_us"] = added * 1e6
        # the middle half of the rounds' differences: how far one round's figure moves on this machine
        row["added_cpu_quartiles_us"] = [float(q + extra(row)) * 1e6 for q in np.percentile(differences(row, 0), [25, 75])]
        # how far the median itself could be off: a 95% bootstrap interval
        row["added_cpu_ci95_us"] = [float(q + extra(row)) * 1e6 for q in median_interval(differences(row, 0))]
        row["added_wall_us"] = paired(row, 1) * 1e6
        row["added_cpu_pct"] = 100.0 * added / off["cpu_s"]
        row["vs_otel_rl"] = added / base if base > 0 else float("nan")


def _warm(ways: list[Way]) -> None:
    for way in ways:  # key caches, first exports, lazy imports
        for s in range(3):
            way.step(-1 - s, lambda: None)
        way.flush()


def run(quick: bool = False, keys_only: bool = False) -> dict[str, Any]:
    logging.getLogger("otel_rl").setLevel(logging.ERROR)
    folder = Path(tempfile.mkdtemp(prefix="otel-rl-bench-total-"))
    values = step_values(250)
    dist = np.random.default_rng(0).random(4096) * 512
    ways: list[Way] = [Off(), owned(lambda: OtelRl(folder / "otel", values, dist, None))]
    # The target's figure first, while nothing else is loaded (W&B's service process and the
    # trackers' threads would charge their idle work to every way): 250 scalar keys, 1 ms steps.
    # Many short rounds, paired, for a tight median; a flush (one metric collection, ~15 ms of CPU)
    # every 10,000 steps, as the default 10 s export interval makes at 1 ms steps, summed apart.
    work = calibrate(1)
    target_rows = measure(ways, work, TARGET_STEPS, 21 if quick else TARGET_ROUNDS, only_keys=True, flush_every=FLUSH_EVERY)
    _added(target_rows)
    # Then the SDK against the work alone, for the ratio: built only now, so its threads were not there before.
    sdk_way = owned(lambda: Sdk(folder, values, dist))
    ways.append(sdk_way)
    sdk_rows = measure([ways[0], sdk_way], work, TARGET_STEPS, 5 if quick else SDK_ROUNDS, only_keys=True, flush_every=FLUSH_EVERY)
    _added(sdk_rows)
    sdk_row = target_rows[sdk_way.name] = sdk_rows[sdk_way.name]
    otel_added = target_rows["otel-rl"]["added_cpu_us"]
    sdk_row["vs_otel_rl"] = sdk_row["added_cpu_us"] / otel_added if otel_added > 0 else float("nan")
    results: dict[str, Any] = {"target_rows": target_rows, "steps": {}}
    more: list[Way] = [owned(lambda: OtelRl(folder / "pipeline", values, dist, "none"))]
    for extra in () if keys_only else (Wandb, TensorboardX):
        try:
            more.append(owned(lambda extra=extra: extra(folder, values, dist)))
        except ImportError as exc:
            print(f"(skipping {extra.name}: {exc})", file=sys.stderr)
    ways[2:2] = more[:1]
    ways += more[1:]
    for ms in () if keys_only else STEP_MS:
        work = calibrate(ms)
        # Each round ends with one flush (a metric export, ~20 ms): 0.5-3 s of steps per round
        # charges it about as a 10 s export interval would, a few times over.
        steps = {1: 100, 10: 30, 100: 6}[ms] if quick else {1: 300, 10: 60, 100: 15}[ms]
        rows = measure(ways, work, steps, rounds=3 if quick else 5)
        _added(rows)
        results["steps"][f"{ms}ms"] = rows
    # The same 250 keys beside every other way.
    rows = (
        target_rows
        if keys_only
        else measure([w for w in ways if "pipeline" not in w.name], calibrate(1), 100 if quick else 300, 3 if quick else 5, only_keys=True)
    )
    _added(rows)
    results["keys_only"] = rows
    results["falls_behind"] = falls_behind(folder / "behind", values)
    for way in ways:
        way.close()
    added = target_rows["otel-rl"]["added_cpu_us"]
    sdk = target_rows["OTel SDK (sync gauges)"]["added_cpu_us"]
    results["target"] = {
        "added_cpu_us_max": TARGET_ADDED_US,
        "added_cpu_us": added,
        "quartiles_us": target_rows["otel-rl"]["added_cpu_quartiles_us"],
        "ci95_us": target_rows["otel-rl"]["added_cpu_ci95_us"],
        "pairs": len(target_rows["otel-rl"]["rounds"]),
        "sdk_added_cpu_us": sdk,
        "work_spread_us": target_rows["off"]["spread_s"] * 1e6,
        "sdk_over_otel_rl": sdk / added if added > 0 else float("nan"),
        # partial: otel-rl's own threads in its rounds plus their idle cost, without the caller's share
        "own_threads_us": (target_rows["otel-rl"]["threads_s"] + target_rows["otel-rl"]["idle_s"]) * 1e6,
        "exports_us": target_rows["otel-rl"]["flush_s"] * 1e6,  # its metric exports, summed apart, per step
        "met": 0 < added <= TARGET_ADDED_US and sdk / added >= 3.0,
    }
    return results


def print_table(results: dict[str, Any]) -> None:
    tables = [(f"{label} steps: 250 keys, 2 stage spans, a 4096-value distribution", rows) for label, rows in results["steps"].items()]
    if results["keys_only"] is not results["target_rows"]:
        tables.append(("1ms steps: 250 keys only, beside every way", results["keys_only"]))
    tables.insert(
        0,
        (
            f"the target: 1 ms steps, 250 keys only, nothing else loaded ({results['target']['pairs']} paired rounds of "
            f"{TARGET_STEPS:,} steps; the SDK: {len(results['target_rows']['OTel SDK (sync gauges)']['rounds'])})",
            results["target_rows"],
        ),
    )
    for label, rows in tables:
        off = rows["off"]
        print(f"\n{label} (work alone: {off['cpu_s'] * 1e3:.2f} ms CPU, {off['wall_s'] * 1e3:.2f} ms wall per step)")
        print(f"{'way':34} {'added CPU/step':>15} {'added %':>8} {'added wall/step':>16} {'CPU vs otel-rl':>15} {'of it idle':>11}")
        for name, row in rows.items():
            if name == "off":
                continue
            low, high = row["added_cpu_ci95_us"]
            if low <= 0:  # the median's interval holds zero: not told apart from the work alone
                print(f"{name:34} {'< ' + format(high, ',.0f'):>12} us  (95% interval of the median: {low:,.0f}-{high:,.0f} us)")
                continue
            print(
                f"{name:34} {row['added_cpu_us']:>12,.0f} us {row['added_cpu_pct']:>7.1f}% "
                f"{row['added_wall_us']:>13,.0f} us {row['vs_otel_rl']:>14.2f}x {row['idle_cpu_us']:>8,.1f} us"
            )
    fb = results["falls_behind"]
    print(
        f"\nfalls behind: the caller logs {fb['caller_steps_per_s']:,.0f} steps/s with no work between them; the worker "
        f"keeps up with {fb['worker_steps_per_s']:,.0f} steps/s (250 keys, run folder); {fb['dropped']} of "
        f"{fb['logged']:,} steps dropped by the bounded queue and counted in rl.telemetry.dropped"
    )
    t = results["target"]
    print(
        f"target: log() of 250 keys adds <= {t['added_cpu_us_max']:.0f} us CPU in total and >= 3x less than SDK gauges: "
        f"{t['added_cpu_us']:.0f} us (95% interval of that median: {t['ci95_us'][0]:.0f}-{t['ci95_us'][1]:.0f} us; the middle half "
        f"of the rounds: {t['quartiles_us'][0]:.0f}-{t['quartiles_us'][1]:.0f} us), the SDK {t['sdk_over_otel_rl']:.1f}x that; "
        f"{'met' if t['met'] else 'MISSED'}{'' if t['ci95_us'][1] <= t['added_cpu_us_max'] else ' (its interval reaches past the target)'}"
    )
    print(
        f"otel-rl's own threads (its worker, the metric reader), counted apart to the nanosecond: {t['own_threads_us']:.0f} us per "
        "step (partial: the caller's share, log() on the training thread, is not in it; bench_hotpath.py times it); "
        f"its metric exports (every {FLUSH_EVERY:,} steps): {t['exports_us']:.1f} us per step, in the total above"
    )
    print("(CPU: the process's every thread plus its child processes, flush included; the median of the rounds' paired differences)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--keys-only",
        action="store_true",
        help=f"only the target's table: 250 keys, 1 ms steps, otel-rl and the SDK ({TARGET_ROUNDS} paired rounds of {TARGET_STEPS:,} steps)",
    )
    args = parser.parse_args(argv)
    results = run(quick=args.quick, keys_only=args.keys_only)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
