"""A 1,024-rank job through the collector tier, emulated: what each part costs per rank and step.

    python benchmarks/bench_tier_replay.py                    # 1,024 ranks x 20 steps (about 15 minutes)
    python benchmarks/bench_tier_replay.py --ranks 256 --steps 6 --json

1,024 training processes cannot run on two cores, so what real ranks send is recorded and sent
again as 1,024 ranks:

1. **Record.** ``otel-rl demo --ranks 2`` (two real processes, torch.distributed on CPU) exports
   over OTLP/HTTP to a recording receiver: every request as the ranks' spool sent it.
2. **Rewrite.** Virtual rank 0 is the recorded rank 0; virtual ranks 1..N-1 are copies of the
   recorded rank 1 (a rank other than the lead, with the series budget it keeps). Each copy gets
   its own ``rl.rank``, ``rl.local_rank``, ``service.instance.id`` and ``host.name`` (8 ranks a
   node), the world size and a new run id, span ids of its own; its stage spans keep their parent,
   the lead's step span, so one step is one trace of every rank, as in a real job. Timestamps move
   to the replay's clock; the recorded steps are cycled with new trace ids for more steps.
3. **Send.** Each virtual rank sends what its spool would: one request per signal per 5 steps
   (``SEND_EVERY_S`` at one step a second), its metric exports every 10 steps, gzip, OTLP/HTTP,
   step after step as fast as the tier takes it (a time-dilated job: the figures are per rank-step).
4. **Through the shipped tier.** One agent (``agent.yaml`` + ``agent-gateways.yaml``) -> two
   gateways (``gateway.yaml`` + ``gateway-behind-agents.yaml``, plus an overlay that sends their
   traces to the local Jaeger only and their metrics to remote write only) -> VictoriaMetrics and
   Jaeger (Badger on disk) from ``otel-rl stack``, all real processes on loopback.

Reported: each process's CPU (user + system, from /proc) per rank-step and the cores it would take
for N ranks at one step a second; bytes per rank-step; the series VictoriaMetrics holds for the
run; one step's trace as Jaeger returns it (spans, and the time of ``otel-rl trace --jaeger``);
spans and events lost. A real job spreads its ranks over one agent per node: the agent's figure is
per rank-step, whatever the number of agents.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest  # noqa: E402
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

RANKS_PER_NODE = 8
SEND_EVERY_STEPS = 5  # the spool's one request per signal per 5 s, at one step a second
METRIC_EVERY_STEPS = 10  # the default 10 s metric interval, at one step a second
TRACES, METRICS, LOGS = "/v1/traces", "/v1/metrics", "/v1/logs"
TYPES = {TRACES: ExportTraceServiceRequest, METRICS: ExportMetricsServiceRequest, LOGS: ExportLogsServiceRequest}
OTELCOL = ROOT / "collector-config" / "otelcol"


# ------------------------------------------------------------------------------------------ record


def record(folder: Path, steps: int) -> list[tuple[str, Any]]:
    """The requests ``otel-rl demo --ranks 2`` sent, decoded, in arrival order."""
    from otlp_sink import OtlpSink, Received

    requests: list[tuple[str, Any]] = []

    class Recording(Received):
        def add(self, path: str, request: Any) -> None:
            requests.append((path, request))

    with OtlpSink() as sink:
        sink.received = Recording()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
        env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_RL_RUN_ID": "recorded"}
        command = [
            sys.executable,
            "-m",
            "otel_rl.cli",
            "demo",
            "--ranks",
            "2",
            "--steps",
            str(steps),
            "--quiet",
            "--out",
            str(folder / "demo"),
        ]
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return requests


def _attr(resource: Any, key: str) -> Any:
    for kv in resource.attributes:
        if kv.key == key:
            value = kv.value
            return getattr(value, value.WhichOneof("value"))
    return None


def _set(resource: Any, key: str, value: int | str) -> None:
    for kv in resource.attributes:
        if kv.key == key:
            break
    else:
        kv = resource.attributes.add()
        kv.key = key
    if isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.string_value = value


class Recorded:
    """The recording sorted by source rank: per rank, its spans by step trace, its events, its metric exports."""

    def __init__(self, requests: list[tuple[str, Any]]) -> None:
        self.spans: dict[int, dict[bytes, list[tuple[Any, Any]]]] = {
            0: defaultdict(list),
            1: defaultdict(list),
        }  # rank -> trace -> (resource, span)
        self.events: dict[int, dict[bytes, list[tuple[Any, Any]]]] = {0: defaultdict(list), 1: defaultdict(list)}
        self.metric_exports: dict[int, list[Any]] = {0: [], 1: []}
        self.own_span_ids: dict[int, set[bytes]] = {0: set(), 1: set()}
        self.start_ns = min(
            s.start_time_unix_nano for p, r in requests if p == TRACES for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans
        )
        for path, request in requests:
            if path == TRACES:
                for rs in request.resource_spans:
                    rank = _attr(rs.resource, "rl.rank")
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            self.spans[rank][span.trace_id].append((rs.resource, span))
                            self.own_span_ids[rank].add(span.span_id)
            elif path == LOGS:
                for rl in request.resource_logs:
                    rank = _attr(rl.resource, "rl.rank")
                    for sl in rl.scope_logs:
                        for log in sl.log_records:
                            self.events[rank][log.trace_id].append((rl.resource, log))
            else:
                for rm in request.resource_metrics:
                    self.metric_exports[_attr(rm.resource, "rl.rank")].append(rm)
        # The steps: traces where both ranks have spans (a trace of rank 0 alone is not a step of the job).
        self.steps = [t for t in self.spans[0] if t in self.spans[1]]
        self.steps.sort(key=lambda t: min(s.start_time_unix_nano for _, s in self.spans[0][t]))
        if not self.steps:
            raise SystemExit("the recording holds no step with both ranks' spans")


# ----------------------------------------------------------------------------------------- rewrite


def _derived(value: bytes, salt: str) -> bytes:
    return hashlib.blake2b(value, digest_size=len(value), key=salt.encode()).digest()


class Rewriter:
    """Virtual rank ``rank``'s share of step ``k``, on a clock where step k starts ``begin_ns`` + k s."""

    def __init__(self, recorded: Recorded, world: int, run_id: str, begin_ns: int) -> None:
        self.recorded, self.world, self.run_id, self.begin_ns = recorded, world, run_id, begin_ns
        self.step_start = {t: min(s.start_time_unix_nano for _, s in recorded.spans[0][t]) for t in recorded.steps}

    def at(self, k: int, trace: bytes, recorded_ns: int) -> int:
        return self.begin_ns + k * 1_000_000_000 + max(0, recorded_ns - self.step_start[trace])

    def rank_attribute(self, attributes: Any, rank: int, step: int) -> None:
        """The span's or event's own rank and step (the recorded steps are cycled: step k is k + 1)."""
        for kv in attributes:
            if kv.key == "rl.rank":
                kv.value.int_value = rank
            elif kv.key == "rl.step":
                kv.value.int_value = step

    def resource(self, source: Any, rank: int, into: Any) -> None:
        into.CopyFrom(source)
        _set(into, "rl.rank", rank)
        _set(into, "rl.local_rank", rank % RANKS_PER_NODE)
        _set(into, "rl.world_size", self.world)
        _set(into, "rl.run.id", self.run_id)
        _set(into, "host.name", f"node-{rank // RANKS_PER_NODE:04d}")
        _set(into, "service.instance.id", f"{self.run_id}-rank-{rank}")

    def source(self, rank: int) -> int:
        return 0 if rank == 0 else 1

    def span_id(self, rank: int, span_id: bytes) -> bytes:
        # Rank 0 and the lead's spans keep their ids: the other ranks' stage spans point at its step span.
        if rank == 0 or not span_id or span_id not in self.recorded.own_span_ids[1]:
            return span_id
        return _derived(span_id, f"rank-{rank}")

    def trace_id(self, cycle: int, trace_id: bytes) -> bytes:
        return trace_id if cycle == 0 else _derived(trace_id, f"cycle-{cycle}")

    def _step(self, rank: int, k: int, table: dict[int, dict[bytes, list[tuple[Any, Any]]]]) -> tuple[int, bytes, list[tuple[Any, Any]]]:
        """(cycle, recorded trace, the source rank's rows of it) for step ``k``."""
        cycle, index = divmod(k, len(self.recorded.steps))
        trace = self.recorded.steps[index]
        return cycle, trace, table[self.source(rank)].get(trace, [])

    def _identify(self, out: Any, rank: int, cycle: int, k: int) -> None:
        """A span's or event's trace, span id, rank and step, as virtual rank ``rank`` of step ``k``."""
        out.trace_id = self.trace_id(cycle, out.trace_id)
        out.span_id = self.span_id(rank, out.span_id)
        self.rank_attribute(out.attributes, rank, k + 1)

    def step_spans(self, rank: int, k: int, into: ExportTraceServiceRequest) -> int:
        cycle, trace, rows = self._step(rank, k, self.recorded.spans)
        rs = into.resource_spans.add()
        self.resource(rows[0][0], rank, rs.resource)
        ss = rs.scope_spans.add()
        for _, span in rows:
            out = ss.spans.add()
            out.CopyFrom(span)
            self._identify(out, rank, cycle, k)
            out.parent_span_id = self.span_id(rank, span.parent_span_id)
            out.start_time_unix_nano = self.at(k, trace, span.start_time_unix_nano)
            out.end_time_unix_nano = self.at(k, trace, span.end_time_unix_nano)
        return len(rows)

    def step_events(self, rank: int, k: int, into: ExportLogsServiceRequest) -> int:
        cycle, trace, rows = self._step(rank, k, self.recorded.events)
        if not rows:
            return 0
        rl = into.resource_logs.add()
        self.resource(rows[0][0], rank, rl.resource)
        sl = rl.scope_logs.add()
        for _, log in rows:
            out = sl.log_records.add()
            out.CopyFrom(log)
            self._identify(out, rank, cycle, k)
            out.time_unix_nano = self.at(k, trace, log.time_unix_nano)
            out.observed_time_unix_nano = out.time_unix_nano
        return len(rows)

    def metric_export(self, rank: int, j: int, into: ExportMetricsServiceRequest, now_ns: int) -> int:
        exports = self.recorded.metric_exports[self.source(rank)]
        if not exports:
            return 0
        rm = into.resource_metrics.add()
        rm.CopyFrom(exports[min(j, len(exports) - 1)])
        self.resource(rm.resource, rank, rm.resource)
        points = 0
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                for p in getattr(metric, kind).data_points:
                    if p.start_time_unix_nano:
                        p.start_time_unix_nano = self.begin_ns
                    p.time_unix_nano = now_ns
                    points += 1
        return points


# -------------------------------------------------------------------------------------------- send


def post(url: str, path: str, request: Any) -> int:
    body = gzip.compress(request.SerializeToString(), compresslevel=6)
    reply = urllib.request.Request(
        url + path, data=body, headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}, method="POST"
    )
    for attempt in range(60):  # the agent refuses while its queue is full: back off, as a spool does
        try:
            with urllib.request.urlopen(reply, timeout=30) as answer:
                answer.read()
            return len(body)
        except urllib.error.HTTPError as error:
            if error.code not in (429, 503) or attempt == 59:
                raise
            time.sleep(0.5)
    return len(body)


def cpu_ms(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return 1000.0 * (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replay(rewriter: Rewriter, ranks: int, steps: range, agent_http: str) -> dict[str, float]:
    """Every virtual rank's requests for ``steps``, as its spool would send them."""
    sent = {"spans": 0, "events": 0, "points": 0, "bytes": 0, "requests": 0}
    for window in range(steps.start, steps.stop, SEND_EVERY_STEPS):
        window_steps = range(window, min(window + SEND_EVERY_STEPS, steps.stop))
        for rank in range(ranks):
            traces, logs = ExportTraceServiceRequest(), ExportLogsServiceRequest()
            for k in window_steps:
                sent["spans"] += rewriter.step_spans(rank, k, traces)
                sent["events"] += rewriter.step_events(rank, k, logs)
            for path, request in ((TRACES, traces), (LOGS, logs)):
                if len(request.ListFields()):
                    sent["bytes"] += post(agent_http, path, request)
                    sent["requests"] += 1
            if any(k % METRIC_EVERY_STEPS == METRIC_EVERY_STEPS - 1 for k in window_steps):
                metrics = ExportMetricsServiceRequest()
                now_ns = rewriter.begin_ns + window_steps[-1] * 1_000_000_000
                sent["points"] += rewriter.metric_export(rank, window // METRIC_EVERY_STEPS, metrics, now_ns)
                sent["bytes"] += post(agent_http, METRICS, metrics)
                sent["requests"] += 1
    return sent


# -------------------------------------------------------------------------------------------- tier


def start_tier(folder: Path, stack: Any) -> tuple[Any, list[Any]]:
    """The agent and two gateways, real collector processes running the shipped files."""
    import yaml
    from go_builds import collector_binary
    from local_collector import Collector

    binary = collector_binary()
    ports = stack.endpoints
    overlay = folder / "to-the-local-stores.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "service": {
                    "pipelines": {"traces": {"exporters": ["otlp_grpc/jaeger"]}, "metrics": {"exporters": ["prometheus_remote_write"]}}
                }
            }
        )
    )
    jaeger_otlp = stack.ports("jaeger")["otlp_grpc"]
    gateways = []
    for name in ("a", "b"):
        where = folder / f"gateway-{name}"
        where.mkdir()
        env = {
            "OTEL_GATEWAY_BIND": "127.0.0.1",
            "OTEL_GATEWAY_JAEGER_ENDPOINT": f"127.0.0.1:{jaeger_otlp}",
            "OTEL_GATEWAY_REMOTE_WRITE_URL": f"{ports['victoria_metrics']}/api/v1/write",
            "OTEL_GATEWAY_EVENTS_FILE": str(where / "rl-events.jsonl"),
        }
        files = [OTELCOL / "gateway.yaml", OTELCOL / "gateway-behind-agents.yaml", overlay]
        gateways.append(Collector(binary, None, where, files=files, env=env))
        gateways[-1].start(timeout_s=30)
    where = folder / "agent"
    where.mkdir()
    env = {
        "OTEL_AGENT_BIND": "127.0.0.1",
        "OTEL_AGENT_STORAGE_DIR": str(where / "queue"),
        "OTEL_GATEWAY_HOSTNAMES": "[" + ", ".join(f"127.0.0.1:{g.grpc_port}" for g in gateways) + "]",
    }
    agent = Collector(binary, None, where, files=[OTELCOL / "agent.yaml", OTELCOL / "agent-gateways.yaml"], env=env)
    agent.start(timeout_s=30)
    return agent, gateways


def jaeger_spans(jaeger: str, trace_id: bytes) -> int:
    try:
        with urllib.request.urlopen(f"{jaeger}/api/traces/{trace_id.hex()}", timeout=60) as reply:
            data = json.load(reply)["data"]
    except urllib.error.HTTPError:
        return 0
    return sum(len(t["spans"]) for t in data)


def series_count(vm: str, run_id: str) -> int:
    urllib.request.urlopen(f"{vm}/internal/force_flush", timeout=30).read()
    # A count query, not /api/v1/series: that one refuses past 30,000 series.
    query = urllib.parse.urlencode({"query": f'count(last_over_time({{rl_run_id="{run_id}"}}[1d]))'})
    with urllib.request.urlopen(f"{vm}/api/v1/query?{query}", timeout=300) as reply:
        result = json.load(reply)["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def event_records(path: Path) -> int:
    """Log records in a file exporter's OTLP-JSON lines (one line per batch)."""
    if not path.exists():
        return 0
    total = 0
    for line in path.read_text().splitlines():
        for rl in json.loads(line).get("resourceLogs", []):
            for sl in rl.get("scopeLogs", []):
                total += len(sl.get("logRecords", []))
    return total


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU per second while nothing is sent (timers, compaction, self-scrapes)."""
    before = {name: cpu_ms(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: (cpu_ms(pid) - before[name]) / seconds for name, pid in pids.items()}


def wait_quiet(pids: dict[str, int], idle: dict[str, float], timeout_s: float = 300.0, window_s: float = 3.0) -> float:
    """Wait until the tier's processes together burn at most their idle CPU plus 5% of a core over
    ``window_s`` (compaction and merges done); the seconds waited."""
    began = time.monotonic()
    allowance = sum(idle.values()) + 50.0  # ms of CPU per second
    while time.monotonic() - began < timeout_s:
        before = sum(cpu_ms(pid) for pid in pids.values())
        time.sleep(window_s)
        if (sum(cpu_ms(pid) for pid in pids.values()) - before) / window_s <= allowance:
            break
    return time.monotonic() - began


def timed_trace(jaeger: str, run_id: str, step: int) -> tuple[float, subprocess.CompletedProcess[str]]:
    """``otel-rl trace --jaeger`` for one step, as a user runs it: its seconds, end to end, and what it printed."""
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "otel_rl.cli", "trace", "--jaeger", jaeger, "--run-id", run_id, "--step", str(step)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return time.monotonic() - began, done


def settle(read: Any, what: str, timeout_s: float, every_s: float = 5.0) -> Any:
    """``read()`` once three reads ``every_s`` apart agree."""
    end, seen = time.monotonic() + timeout_s, []
    while True:
        seen.append(read())
        if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]:
            return seen[-1]
        if time.monotonic() > end:
            raise SystemExit(f"{what} did not settle in {timeout_s:.0f} s: {seen[-5:]}")
        time.sleep(every_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024, help="virtual ranks (default 1024)")
    parser.add_argument("--steps", type=int, default=20, help="steps each virtual rank sends, measured per 10 (default 20)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    from otel_rl.stack import Stack, free_port_offset

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        recorded = Recorded(record(folder, steps=6))
        stack = Stack(folder / "stack", port_offset=free_port_offset(), only="victoria-metrics,jaeger", out=None)
        stack.up()
        agent = gateways = None
        try:
            agent, gateways = start_tier(folder, stack)
            pids = {"agent": agent.process.pid, "gateway a": gateways[0].process.pid, "gateway b": gateways[1].process.pid}
            pids |= {s.name: s.pid for s in stack.status() if s.pid}
            run_id = f"tier-{int(time.time())}"
            idle = idle_cpu(pids, 20.0)
            rewriter = Rewriter(recorded, args.ranks, run_id, time.time_ns())
            jaeger, vm = stack.endpoints["jaeger"], stack.endpoints["victoria_metrics"]
            windows = []
            for first in range(0, args.steps, METRIC_EVERY_STEPS):
                window = measure_window(
                    rewriter, recorded, pids, idle, args.ranks, range(first, min(first + METRIC_EVERY_STEPS, args.steps)), agent, jaeger, vm
                )
                windows.append(window)
            events = sum(event_records(g.folder / "rl-events.jsonl") for g in gateways)
            # Read once as the last step lands (the tier still compacting), then three times once it is quiet.
            trace_s, done = timed_trace(jaeger, run_id, args.steps)
            quiet_after_s = wait_quiet(pids, idle)
            quiet_trace_s = sorted(timed_trace(jaeger, run_id, args.steps)[0] for _ in range(3))
        finally:
            for collector in ([agent] if agent else []) + (gateways or []):
                collector.stop(timeout_s=30)
            stack.down()
    result = {
        "ranks": args.ranks,
        "steps": args.steps,
        "idle_cpu_ms_per_s": {name: round(v, 2) for name, v in idle.items()},
        "windows": windows,
        "events_sent": sum(w["sent"]["events"] for w in windows),
        "events_in_gateway_files": events,
        "trace_cli_s": round(trace_s, 2),
        "tier_quiet_after_s": round(quiet_after_s, 1),
        "trace_cli_s_quiet": [round(t, 2) for t in quiet_trace_s],
        "trace_cli_rc": done.returncode,
        "trace_cli_head": done.stdout.splitlines()[:3],
        "trace_cli_error": done.stderr[-800:],
    }
    if args.json:
        print(json.dumps(result))
        return
    print(json.dumps(result, indent=1))


def measure_window(
    rewriter: Rewriter,
    recorded: Recorded,
    pids: dict[str, int],
    idle: dict[str, float],
    ranks: int,
    steps: range,
    agent: Any,
    jaeger: str,
    vm: str,
) -> dict[str, Any]:
    """Send one metric interval's steps of every rank, wait until the stores hold them, and say what it cost.

    The first window creates every series in the store; the later ones only add samples to them."""
    before = {name: cpu_ms(pid) for name, pid in pids.items()}
    began = time.monotonic()
    sent = replay(rewriter, ranks, steps, agent.endpoint("http"))
    sent_s = time.monotonic() - began
    cycle_of = [divmod(k, len(recorded.steps)) for k in steps]
    traces = [rewriter.trace_id(cycle, recorded.steps[index]) for cycle, index in cycle_of]
    expected = [len(recorded.spans[0][recorded.steps[i]]) + (ranks - 1) * len(recorded.spans[1][recorded.steps[i]]) for _, i in cycle_of]
    found = settle(lambda: [jaeger_spans(jaeger, t) for t in traces], "the steps' traces in Jaeger", 900, 10)
    drained_s = time.monotonic() - began
    series = settle(lambda: series_count(vm, rewriter.run_id), "the run's series", 300, 10)
    after = {name: cpu_ms(pid) for name, pid in pids.items()}
    measured_s = time.monotonic() - began
    rank_steps = ranks * len(steps)
    # Less what each process burns idle over the same time: the part that grows with the ranks.
    net = {name: round(max(0.0, after[name] - before[name] - idle[name] * measured_s) / rank_steps, 3) for name in pids}
    return {
        "steps": f"{steps.start + 1}-{steps.stop}",
        "sent": sent,
        "send_s": round(sent_s, 1),
        "drained_s": round(drained_s, 1),
        "cpu_ms_per_rank_step": {name: round((after[name] - before[name]) / rank_steps, 3) for name in pids},
        "net_cpu_ms_per_rank_step": net,
        "cores_for_1024_ranks_at_1_step_per_s": {name: round(ms * 1024 / 1000, 2) for name, ms in net.items()},
        "bytes_per_rank_step": round(sent["bytes"] / rank_steps),
        "spans_expected": sum(expected),
        "spans_in_jaeger": sum(found),
        "steps_whole_in_jaeger": sum(1 for e, f in zip(expected, found) if e == f),
        "series_in_victoria_metrics": series,
    }


if __name__ == "__main__":
    main()
