"""The stack's components: their ports, command lines, health checks and the URLs a person opens.

Data flow (every address is 127.0.0.1)::

    OTLP --> otelcol-agent 4317 (gRPC) / 4318 (HTTP)  collector-config/otelcol/agent.yaml: host.name,
                 |                                      an on-disk sending queue, retries
                 v OTLP/gRPC
             otelcol-gateway 4417                       collector-config/otelcol/gateway.yaml
               traces --> Jaeger 4327 (OTLP/gRPC; query API 16686)
               traces --> span_metrics --> metrics
               metrics -> prometheus_remote_write --> VictoriaMetrics 8428 (/api/v1/write)
               metrics -> prometheus exporter 8889 <-- scraped by Prometheus 9090
               logs ----> rl-events.jsonl in <data>/data/otelcol-gateway/, and the tracker bridge
                          4319 (gateway-bridge.yaml) when it runs
    vmalert 8880 evaluates grafana/alerts/*.yml against VictoriaMetrics and writes back to it.

The two collectors are one binary (``otelcol-rl``, built from collector-config/builder-config.yaml)
run with the project's configs; Jaeger is built from its Go module (see _go_build.py). The tracker
bridge (``otel-rl bridge``) is optional: it runs only with a config file (``--bridge-config``),
from the Python environment otel-rl is installed in.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import otel_rl.environment_variables as ENV
import otel_rl.stack._collector as _collector
from otel_rl.stack.process import LOOPBACK, http_ok

# Display order; the start order puts the stores before what writes into them. COMPONENT_NAMES are
# what `up` starts by default; OPTIONAL_COMPONENTS only when asked for (the bridge needs a config).
COMPONENT_NAMES = ("otelcol-agent", "otelcol-gateway", "jaeger", "victoria-metrics", "vmalert", "prometheus")
OPTIONAL_COMPONENTS = ("bridge",)
ALL_COMPONENT_NAMES = COMPONENT_NAMES + OPTIONAL_COMPONENTS
START_ORDER = ("victoria-metrics", "jaeger", "vmalert", "bridge", "otelcol-gateway", "prometheus", "otelcol-agent")
LOGS_BRIDGE_PORT = 4319  # the tracker bridge's OTLP/HTTP receiver; gateway-bridge.yaml's default port
# VictoriaMetrics drops samples older than its retention (default 1 month) without failing the
# request: replayed logs carry their own, older times, so the stack keeps ten years.
VM_RETENTION = "10y"
# How often Prometheus scrapes the gateway's :8889: as often as a demo run exports (every second),
# so that the boards' rate windows (4 export intervals) hold points in Prometheus as in the stores
# fed by remote write. One small page on loopback; a cluster's Prometheus would scrape every 15 s+.
PROMETHEUS_SCRAPE_INTERVAL = "1s"


@dataclass(frozen=True)
class Component:
    name: str
    package: str  # what `install` provides it (see _install.PACKAGES); "" for otel-rl itself
    ports: Mapping[str, int]  # role -> default port
    deadline_s: float  # how long `up` waits for it to become healthy
    health: str  # what the health check does, for messages
    description: str = ""


COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component(
            "otelcol-agent",
            "otelcol",
            {"otlp_grpc": 4317, "otlp_http": 4318, "health": 13133, "telemetry": 8888},
            30.0,
            "GET the health_check extension",
            description="OTel collector, agent.yaml (OTLP in; to the gateway, queued on disk)",
        ),
        Component(
            "otelcol-gateway",
            "otelcol",
            {"otlp_grpc": 4417, "otlp_http": 4418, "health": 13233, "telemetry": 8988, "prometheus": 8889},
            30.0,
            "GET the health_check extension",
            description="OTel collector, gateway.yaml (to Jaeger, VictoriaMetrics, :8889, events file, bridge)",
        ),
        Component(
            "jaeger",
            "jaeger",
            {"http": 16686, "grpc": 16685, "otlp_grpc": 4327},
            30.0,
            "GET /api/services",
            description="Jaeger v2 trace store (OTLP in; query API)",
        ),
        Component(
            "victoria-metrics",
            "victoria-metrics",
            {"http": 8428},
            30.0,
            "GET /health",
            description="metrics store (remote write in, PromQL/MetricsQL out)",
        ),
        Component(
            "vmalert",
            "victoria-metrics",
            {"http": 8880},
            30.0,
            "GET /health",
            description="evaluates grafana/alerts rules against VictoriaMetrics",
        ),
        Component(
            "prometheus", "prometheus", {"http": 9090}, 30.0, "GET /-/ready", description="Prometheus 2, scraping the gateway's :8889"
        ),
        Component(
            "bridge",
            "",
            {"otlp_http": LOGS_BRIDGE_PORT},
            30.0,
            "GET /healthz",
            description="otel-rl tracker bridge (OTLP/HTTP logs in, experiment trackers out)",
        ),
    )
}


def component_ports(name: str, offset: int) -> dict[str, int]:
    return {role: port + offset for role, port in COMPONENTS[name].ports.items()}


@dataclass
class Launch:
    """How to start one component: its command, the environment it adds, its ports and folders."""

    name: str
    command: list[str]
    env: dict[str, str]  # added to the environment (and recorded in the PID file)
    ports: dict[str, int]
    folders: list[Path] = field(default_factory=list)  # created before the start
    drop_env_prefixes: tuple[str, ...] = ()  # inherited variables not passed on
    cwd: Path | None = None  # working directory (default: the data folder)


@dataclass
class Context:
    """What the command lines depend on."""

    data_dir: Path
    offset: int
    running: frozenset[str]  # components that will run once `up` is done (selected + already running)
    binary: Callable[[str, str], Path]  # (package, binary name) -> path
    collector_config: Path | None = None  # the folder of agent.yaml and gateway.yaml
    rules_dir: Path | None = None
    bridge_config: Path | None = None


def find_in_repository(relative: str) -> Path | None:
    """``relative`` in the working directory or a parent, else beside the otel_rl package (a checkout)."""
    bases = [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[2]]
    for base in bases:
        if (base / relative).exists():
            return base / relative
    return None


def collector_config_dir(explicit: Path | None) -> Path:
    """The folder of the collector configs: the given one, else collector-config/otelcol of the checkout."""
    folder = explicit if explicit is not None else find_in_repository("collector-config/otelcol")
    if folder is None or not (folder / "gateway.yaml").is_file():
        where = str(folder) if folder is not None else "collector-config/otelcol (not found from here or beside otel_rl)"
        raise ValueError(
            f"the collectors run the project's configs and {where} has no gateway.yaml: run from an otel-rl "
            "checkout, or give the folder with --collector-config DIR"
        )
    return folder


def alert_rule_files(rules_dir: Path | None) -> list[Path]:
    folder = rules_dir if rules_dir is not None else find_in_repository("grafana/alerts")
    if folder is None or not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file())


# ---------------------------------------------------------------------------------------------
# Command lines


def plan_launch(name: str, ctx: Context) -> Launch:
    """The command, environment and ports ``name`` starts with in this context."""
    ports = component_ports(name, ctx.offset)
    data, conf = ctx.data_dir / "data", ctx.data_dir / "config"
    vm_url = f"http://{LOOPBACK}:{component_ports('victoria-metrics', ctx.offset)['http']}"

    if name in ("otelcol-agent", "otelcol-gateway"):
        folder = data / name
        config_dir = collector_config_dir(ctx.collector_config)
        if name == "otelcol-agent":
            gateway_grpc = component_ports("otelcol-gateway", ctx.offset)["otlp_grpc"]
            files, overlay, env = _collector.agent_files(config_dir, ports, gateway_grpc, folder)
            folders = [folder, folder / "queue"]
        else:
            files, overlay, env = _collector.gateway_files(
                config_dir,
                ports,
                folder,
                jaeger_grpc_port=component_ports("jaeger", ctx.offset)["otlp_grpc"] if "jaeger" in ctx.running else None,
                remote_write_url=f"{vm_url}/api/v1/write" if "victoria-metrics" in ctx.running else None,
                bridge_url=f"http://{LOOPBACK}:{LOGS_BRIDGE_PORT + ctx.offset}" if "bridge" in ctx.running else None,
            )
            folders = [folder]
        overlay_path = conf / f"{name}.yaml"
        overlay_path.parent.mkdir(parents=True, exist_ok=True)
        overlay_path.write_text(overlay)
        # A change in any of the files restarts the process (the digest is part of its recorded launch).
        env[ENV.OTEL_RL_STACK_CONFIG_SHA256] = _collector.files_digest(files, overlay)
        command = [str(ctx.binary("otelcol", "otelcol-rl"))]
        for path in [*files, overlay_path]:
            command += ["--config", str(path)]
        # The collector expands ${env:OTEL_...} from its environment: the caller's OTEL_* settings
        # (an exporter endpoint meant for a training job) must not reach it.
        return Launch(name, command, env, ports, folders, drop_env_prefixes=("OTEL_",))

    if name == "jaeger":
        folder = data / "jaeger"
        config = conf / "jaeger.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(_collector.jaeger_config(ports, folder))
        command = [str(ctx.binary("jaeger", "jaeger")), "--config", str(config)]
        env = {ENV.OTEL_RL_STACK_CONFIG_SHA256: _collector.files_digest([config])}
        return Launch(name, command, env, ports, [folder / "keys", folder / "values"], drop_env_prefixes=("OTEL_",))

    if name == "victoria-metrics":
        folder = data / "victoria-metrics"
        command = [
            str(ctx.binary("victoria-metrics", "victoria-metrics")),
            f"-storageDataPath={folder}",
            f"-httpListenAddr={LOOPBACK}:{ports['http']}",
            "-search.latencyOffset=0s",
            "-opentelemetry.usePrometheusNaming",
            f"-retentionPeriod={VM_RETENTION}",
        ]
        return Launch(name, command, {}, ports, [folder])

    if name == "vmalert":
        rules = alert_rule_files(ctx.rules_dir)
        if not rules:
            empty = conf / "alerts-empty.yml"
            empty.parent.mkdir(parents=True, exist_ok=True)
            if not empty.exists():
                empty.write_text("# No rule files in grafana/alerts: vmalert runs with no rules.\ngroups: []\n")
            rules = [empty]
        command = [
            str(ctx.binary("victoria-metrics", "vmalert")),
            f"-datasource.url={vm_url}",
            f"-remoteWrite.url={vm_url}",
            f"-httpListenAddr={LOOPBACK}:{ports['http']}",
            "-notifier.blackhole",
            "-evaluationInterval=15s",
            *(f"-rule={r}" for r in rules),
        ]
        return Launch(name, command, {}, ports)

    if name == "prometheus":
        folder = data / "prometheus"
        config = conf / "prometheus.yml"
        config.parent.mkdir(parents=True, exist_ok=True)
        gateway = component_ports("otelcol-gateway", ctx.offset)["prometheus"]
        targets = [f"{LOOPBACK}:{gateway}"] if "otelcol-gateway" in ctx.running else []
        config.write_text(
            "# Written by otel-rl stack. Prometheus scrapes the gateway's prometheus exporter (the pull way of\n"
            "# collector-config/otelcol/gateway.yaml): honor_labels keeps the job and instance it sets per run.\n"
            f"global:\n  scrape_interval: {PROMETHEUS_SCRAPE_INTERVAL}\n  evaluation_interval: 15s\n"
            "scrape_configs:\n"
            "  - job_name: otel-gateway\n    honor_labels: true\n"
            f"    static_configs:\n      - targets: {targets}\n"
        )
        command = [
            str(ctx.binary("prometheus", "prometheus")),
            f"--config.file={config}",
            f"--storage.tsdb.path={folder}",
            f"--web.listen-address={LOOPBACK}:{ports['http']}",
        ]
        env = {ENV.OTEL_RL_STACK_CONFIG_SHA256: _collector.files_digest([config])}
        return Launch(name, command, env, ports, [folder])

    if name == "bridge":
        if ctx.bridge_config is None:
            raise ValueError("the tracker bridge needs its config file: otel-rl stack up --bridge-config FILE (see otel-rl bridge --help)")
        config = ctx.bridge_config
        from otel_rl.bridge import TrackerBridge, load_bridge_config

        try:
            settings = load_bridge_config(config)  # a bad file fails here, before anything starts
            if not settings.imports:  # (plugin modules may only import from the bridge's own folder)
                TrackerBridge(settings, out=None)  # an unknown tracker or missing library too
            digest = hashlib.sha256(config.read_bytes()).hexdigest()
        except (OSError, TypeError, ImportError) as exc:
            raise ValueError(str(exc)) from None
        # The interpreter otel-rl runs in has otel-rl and the tracker libraries; relative paths in
        # the file are relative to the file's folder. The digest restarts the bridge when the file
        # changes (it is recorded in the PID file; the file's secrets are not).
        command = [sys.executable, "-m", "otel_rl.cli", "bridge", "--config", str(config), "--listen", f"{LOOPBACK}:{ports['otlp_http']}"]
        env = {"PYTHONUNBUFFERED": "1", "OTEL_RL_BRIDGE_CONFIG_SHA256": digest}
        return Launch(name, command, env, ports, cwd=config.parent)

    raise KeyError(name)


def check_health(name: str, ports: Mapping[str, int], timeout_s: float = 2.0) -> bool:
    """Whether the component answers on its ports as a healthy one does."""
    base = f"http://{LOOPBACK}:{ports.get('http', 0)}"
    if name in ("otelcol-agent", "otelcol-gateway"):
        return http_ok(f"http://{LOOPBACK}:{ports['health']}/", timeout_s=timeout_s)
    if name == "bridge":
        return http_ok(f"http://{LOOPBACK}:{ports['otlp_http']}/healthz", timeout_s=timeout_s)
    path = {"prometheus": "/-/ready", "jaeger": "/api/services"}.get(name, "/health")
    return http_ok(base + path, timeout_s=timeout_s)


def user_urls(name: str, ports: Mapping[str, int]) -> dict[str, str]:
    """What a person opens or points a program at, per component."""
    base = f"http://{LOOPBACK}:{ports.get('http', 0)}"
    if name == "otelcol-agent":
        return {"otlp_grpc": f"http://{LOOPBACK}:{ports['otlp_grpc']}", "otlp_http": f"http://{LOOPBACK}:{ports['otlp_http']}"}
    if name == "otelcol-gateway":
        return {
            "otlp_grpc": f"http://{LOOPBACK}:{ports['otlp_grpc']}",
            "scrape": f"http://{LOOPBACK}:{ports['prometheus']}/metrics",
            "own metrics": f"http://{LOOPBACK}:{ports['telemetry']}/metrics",
        }
    if name == "jaeger":
        # A build from the Go module serves the query API; the UI's assets come with Jaeger's own images.
        return {"query API": f"{base}/api/traces", "services": f"{base}/api/services"}
    if name == "victoria-metrics":
        return {"query API": f"{base}/api/v1/query", "home": base}
    if name == "vmalert":
        return {"UI": f"{base}/vmalert/", "alerts API": f"{base}/api/v1/alerts"}
    if name == "prometheus":
        # Debian's build reads its web UI from /usr/share/prometheus/web, which the stack does not install.
        return {"query API": f"{base}/api/v1/query"}
    if name == "bridge":
        bridge = f"http://{LOOPBACK}:{ports['otlp_http']}"
        return {"OTLP logs": f"{bridge}/v1/logs", "stats": f"{bridge}/stats", "health": f"{bridge}/healthz"}
    return {}


def child_environment(launch: Launch) -> dict[str, str]:
    drop = launch.drop_env_prefixes
    env = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop))}
    env.update(launch.env)
    return env
