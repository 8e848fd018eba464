"""``otel-rl stack``: the argument parser and the commands (otel_rl/cli/stack.py only hooks them in)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

DESCRIPTION = """\
A local observability stack without Docker: real servers on 127.0.0.1, built from upstream Go
modules or taken from Debian's archive into the data folder (nothing is installed on the system),
data and logs there too.

  otelcol-agent    the OpenTelemetry Collector with collector-config/otelcol/agent.yaml:
                   OTLP gRPC 4317, OTLP HTTP 4318; forwards to the gateway (queued on disk)
  otelcol-gateway  the same collector with gateway.yaml: OTLP gRPC 4417, HTTP 4418; traces to
                   Jaeger, metrics to VictoriaMetrics (remote write) and :8889 (scrape), rl.* events
                   to <dir>/data/otelcol-gateway/rl-events.jsonl (and the bridge)
  jaeger           Jaeger v2: query API on 16686 (/api/traces), OTLP gRPC on 4327
  victoria-metrics metrics store, PromQL/MetricsQL API on 8428
  vmalert          evaluates grafana/alerts/*.yml against VictoriaMetrics, UI on 8880
  prometheus       Prometheus 2.42 on 9090, scraping the gateway's :8889
  bridge           the otel-rl tracker bridge on 4319 (OTLP/HTTP logs in, TensorBoard/W&B/... out);
                   only with `up --bridge-config FILE`, fed by gateway-bridge.yaml

The first `up` builds the collector (otelcol-rl, from collector-config/builder-config.yaml) and
Jaeger from their Go modules when they are not cached: minutes (about 11 with empty Go caches on 2
cores). The binaries are cached in OTEL_RL_STACK_CACHE (default ~/.cache/otel-rl/stack), so later
starts take seconds. Without Go, `up` says so and starts the rest.
"""

EPILOG = """\
examples:
  otel-rl stack up                                 build/install what is missing, start everything, wait until healthy
  otel-rl stack up --only otelcol-agent,otelcol-gateway,victoria-metrics   collectors and the metrics store
  otel-rl stack status                             component, PID, ports, health and the URLs to open
  otel-rl stack down                               stop everything by PID; ports are checked free
  otel-rl stack up --port-offset 20000             a second stack beside yours (4317 -> 24317, ...)
  otel-rl stack up --bridge-config bridge.yaml     also the tracker bridge; the gateway sends it the step events
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 otel-rl demo     send a demo run through it
  otel-rl trace --jaeger http://127.0.0.1:16686 --step 3             one step's trace, from Jaeger

Logs: <dir>/logs/<name>.log (builds: <dir>/logs/build-*.log); PID files: <dir>/run/<name>.json;
the configs each server runs with: <dir>/config/.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``stack`` subparser: install, up, down, status with their options."""
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dir",
        metavar="DIR",
        help="data folder (env OTEL_RL_STACK_DIR; default ~/.local/share/otel-rl/stack, the same from any working directory)",
    )
    common.add_argument("--port-offset", type=int, metavar="N", help="add N to every port (env OTEL_RL_STACK_PORT_OFFSET; default 0)")
    common.add_argument(
        "--only",
        metavar="NAME[,NAME]",
        help="only these components: otelcol-agent, otelcol-gateway, jaeger, victoria-metrics, vmalert, prometheus, "
        "bridge (which needs --bridge-config)",
    )
    common.add_argument(
        "--collector-config",
        metavar="DIR",
        help="the collector configs (agent.yaml, gateway.yaml; default collector-config/otelcol of the checkout); "
        "the collector is built from builder-config.yaml in the folder above it",
    )
    sub = parser.add_subparsers(dest="stack_command", metavar="SUBCOMMAND")
    install = sub.add_parser(
        "install",
        parents=[common],
        help="install the servers into the data folder (idempotent)",
        description="Install what is missing into the data folder: the collector and Jaeger built with Go, "
        "VictoriaMetrics and Prometheus from Debian's archive (a scratch apt set-up; dpkg-deb -x). A no-op when all is there.",
    )
    install.set_defaults(stack_func=_install)
    up = sub.add_parser(
        "up",
        parents=[common],
        help="install what is missing, start, and wait until healthy",
        description="Start the components (installing what is missing first) and wait until each "
        "answers its health check. Already running and healthy: left alone. On a failure "
        "what this call started is stopped and the failing server's log tail is shown.",
    )
    up.add_argument("--timeout", type=float, metavar="S", help="seconds to wait for each component to become healthy (default 30)")
    up.add_argument("--no-install", action="store_true", help="fail instead of installing what is missing")
    up.add_argument(
        "--bridge-config",
        metavar="FILE",
        help="also run the tracker bridge with this YAML file (otel-rl bridge --help) on 4319, in the "
        "file's folder, and have the gateway send it the rl.* events (collector-config/otelcol/gateway-bridge.yaml)",
    )
    up.set_defaults(stack_func=_up)
    down = sub.add_parser(
        "down",
        parents=[common],
        help="stop the servers by their PID files and check their ports are free",
        description="SIGTERM each server's process group (by the PID in <dir>/run/<name>.json), "
        "SIGKILL what is left after --timeout, check the ports are free, remove the PID files.",
    )
    down.add_argument("--timeout", type=float, default=15.0, metavar="S", help="seconds to wait after SIGTERM before SIGKILL (default 15)")
    down.set_defaults(stack_func=_down)
    status = sub.add_parser(
        "status",
        parents=[common],
        help="component, PID, ports, health and URLs (exit 1 unless all healthy)",
        description="A table of each component's state (healthy, unhealthy, stopped, stale pid file), "
        "PID, ports and the URLs to open. Exit status 0 when all listed are healthy, else 1.",
    )
    status.add_argument("--json", action="store_true", help="print the statuses as JSON")
    status.set_defaults(stack_func=_status)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    func = getattr(args, "stack_func", None)
    if func is None:
        if parser is not None:
            parser.print_help()
        return 2
    from otel_rl.stack import Stack, StackError

    command = f"otel-rl stack {args.stack_command}"
    try:
        stack = Stack(
            args.dir,
            port_offset=args.port_offset,
            only=args.only,
            bridge_config=getattr(args, "bridge_config", None),
            collector_config=args.collector_config,
        )
        return int(func(stack, args) or 0)
    except ValueError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    except StackError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130


def _install(stack, args: argparse.Namespace) -> int:
    from otel_rl.stack._install import PACKAGES

    before = {name for name in PACKAGES if stack._installer.is_installed(name)}
    versions = stack.install()
    for name, version in versions.items():
        if name in before:
            print(f"{name}: already installed ({version})")
    print(f"installed in {stack.data_dir}: " + ", ".join(f"{n} {v}" for n, v in versions.items()))
    return 0


def _up(stack, args: argparse.Namespace) -> int:
    statuses = stack.up(timeout_s=args.timeout, install=not args.no_install)
    print()
    _print_table(statuses)
    healthy = {s.name for s in statuses if s.healthy}
    if "otelcol-agent" in healthy:
        print(
            f"\nsend telemetry: OTEL_EXPORTER_OTLP_ENDPOINT={stack.endpoints['otlp_http']} (http/protobuf) "
            f"or {stack.endpoints['otlp_grpc']} with OTEL_EXPORTER_OTLP_PROTOCOL=grpc"
        )
    if "jaeger" in healthy:
        print(f"one step's trace: otel-rl trace --jaeger {stack.endpoints['jaeger']} --step N")
    if "otelcol-gateway" in healthy:
        print(f"step events as they arrived: {stack.events_file}")
    if "bridge" in healthy:
        print(f"step events: gateway -> tracker bridge {stack.bridge_endpoint} (its log: {stack.data_dir}/logs/bridge.log)")
    print(f"stop with: otel-rl stack down{_dir_flag(stack, args)}")
    return 0


def _down(stack, args: argparse.Namespace) -> int:
    stack.down(only=args.only, timeout_s=args.timeout)
    return 0


def _status(stack, args: argparse.Namespace) -> int:
    statuses = stack.status()
    if args.json:
        print(json.dumps([dict(asdict(s), healthy=s.healthy) for s in statuses], indent=2))
    else:
        print(f"stack in {stack.data_dir}")
        _print_table(statuses)
    return 0 if all(s.healthy for s in statuses) else 1


def _dir_flag(stack, args: argparse.Namespace) -> str:
    return f" --dir {args.dir}" if args.dir else ""


def _print_table(statuses) -> None:
    rows = [("COMPONENT", "STATE", "PID", "PORTS", "OPEN")]
    for s in statuses:
        ports = " ".join(str(p) for p in s.ports.values())
        first_url = next((f"{label} {url}" for label, url in s.urls.items()), "")
        rows.append((s.name, s.state, str(s.pid or "-"), ports, first_url))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    notes = [(s.name, s.note) for s in statuses if s.note]
    more = [(s.name, label, url) for s in statuses for label, url in list(s.urls.items())[1:]]
    if more:
        print()
        for name, label, url in more:
            print(f"  {name} {label}: {url}")
    for name, note in notes:
        print(f"  {name}: {note}")
