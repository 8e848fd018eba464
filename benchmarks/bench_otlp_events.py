"""What a 250-key step costs the whole process over OTLP, side by side in one process.

    python benchmarks/bench_otlp_events.py            # 9 interleaved rounds of 1,500 steps
    python benchmarks/bench_otlp_events.py --quick

Ways, each in its own telemetry, in interleaved rounds of 1 ms steps that ``log()`` 250 ROLL keys:

- run folder: the default (no collector), the direct JSON writer;
- OTLP, direct: a collector endpoint with the disk spool on (the default); float-only steps are
  encoded by the telemetry worker into the protobuf request (``exporters/step_events_proto.py``);
- OTLP, SDK log pipeline: the same, with the direct writer off, as before it existed: an SDK
  ``LogRecord`` per step, the batch processor, the SDK's protobuf encoder.

The collector is down (a closed loopback port), so the spool keeps every request and nothing is
sent: the figure holds the encoding and the spool's disk writes, not a collector's network round
trips. Every round ends with the telemetry worker drained and the SDK's log pipeline flushed
into the spool. CPU is the process's (every thread); a way's added CPU per step is the median over
rounds of its round minus the work alone in the same round.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_hotpath import step_values  # noqa: E402
from bench_total import calibrate  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.stack.process import free_port  # noqa: E402

WAYS = ("run folder", "OTLP, direct", "OTLP, SDK log pipeline")


def start(way: str, folder: str, endpoint: str) -> otel_rl.Telemetry:
    options = {"service_name": "bench", "run_dir": folder, "console": False, "framework": "roll"}
    if way != "run folder":
        options.update(endpoint=endpoint, exporters="otlp")
    tel = otel_rl.Telemetry(otel_rl.resolve_config(options))
    if way == "OTLP, SDK log pipeline":
        tel._pipeline.step_events = None  # every step through the SDK's LogRecord, batch thread and encoder
    return tel


def settle(tel: otel_rl.Telemetry) -> None:
    """Everything logged so far encoded and in the files or the spool (no waiting for delivery)."""
    tel._pipeline.drain()
    tel._providers.logger_provider.force_flush(timeout_millis=200)  # the batch thread's queue into the spool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 300 steps (a smoke run)")
    args = parser.parse_args()
    rounds, steps = (3, 300) if args.quick else (9, 1_500)
    logging.getLogger("otel_rl").setLevel(logging.ERROR)  # the closed port is reported once per telemetry
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
    work, values, process = calibrate(1), step_values(), psutil.Process()
    endpoint = f"http://127.0.0.1:{free_port()}"

    def cpu() -> float:
        times = process.cpu_times()
        return times.user + times.system

    with tempfile.TemporaryDirectory() as tmp:
        tels = {way: start(way, f"{tmp}/{i}", endpoint) for i, way in enumerate(WAYS)}
        for tel in tels.values():  # plans built, files and spool open
            for s in range(50):
                tel.log(values, step=s)
            settle(tel)
        added: dict[str, list[float]] = {way: [] for way in WAYS}
        for r in range(rounds):
            t0 = cpu()
            for _ in range(steps):
                work()
            alone = cpu() - t0
            for way, tel in tels.items():
                t0 = cpu()
                for s in range(steps):
                    work()
                    tel.log(values, step=r * steps + s)
                settle(tel)
                added[way].append((cpu() - t0 - alone) / steps * 1e6)
            print(f"round {r + 1}/{rounds}", file=sys.stderr)
        stored = {way: tel._providers.spool.stats()["logs"].appended for way, tel in tels.items() if tel._providers.spool is not None}
        for tel in tels.values():
            tel.shutdown(0.2)
    base = statistics.median(added["OTLP, direct"])
    print(f"1 ms steps, 250 keys ({rounds} rounds of {steps:,} steps; collector down, the spool keeps every request)")
    print(f"{'way':28s} {'added CPU/step':>15s} {'vs OTLP direct':>15s}")
    for way in WAYS:
        median = statistics.median(added[way])
        print(f"{way:28s} {median:>12,.0f} us {median / base if base > 0 else float('nan'):>14.2f}x")
    print("log records in the spool: " + ", ".join(f"{way}: {count:,}" for way, count in stored.items()))


if __name__ == "__main__":
    main()
