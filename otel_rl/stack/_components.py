"""The stack's components: their ports, command lines, health checks and the URLs a person opens.

Data flow (every address is 127.0.0.1)::

    OTLP --> rotel 4317 (gRPC) / 4318 (HTTP) --traces--> Phoenix 6006 (/v1/traces)
                                              --metrics-> vmagent 8429 --remote write--> VictoriaMetrics 8428
                                                                                     \\-> Prometheus 9090
                                              --logs---> bridge 4319 (/v1/logs) --> experiment trackers
                                                         (blackhole when the bridge is not part of the stack)
    vmalert 8880 evaluates grafana/alerts/*.yml against VictoriaMetrics and writes back to it.

rotel 0.0.1a15 takes one exporter per signal, so vmagent does the metrics fan-out; without
vmagent in the stack, rotel sends metrics straight to VictoriaMetrics. The tracker bridge
(``otel-rl bridge``) is optional: it runs only with a config file (``--bridge-config``), from the
Python environment otel-rl is installed in, and nothing is installed for it.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from otel_rl.stack.process import LOOPBACK, http_ok, tcp_open

# Display order; the start order puts the stores before what writes into them. COMPONENT_NAMES are
# what `up` starts by default; OPTIONAL_COMPONENTS only when asked for (the bridge needs a config).
COMPONENT_NAMES = ("rotel", "victoria-metrics", "vmagent", "vmalert", "prometheus", "phoenix")
OPTIONAL_COMPONENTS = ("bridge",)
ALL_COMPONENT_NAMES = COMPONENT_NAMES + OPTIONAL_COMPONENTS
START_ORDER = ("victoria-metrics", "prometheus", "phoenix", "vmagent", "vmalert", "bridge", "rotel")
LOGS_BRIDGE_PORT = 4319  # the tracker bridge's OTLP/HTTP receiver; rotel.env names it ${LOGS_BRIDGE_PORT}
# VictoriaMetrics drops samples older than its retention (default 1 month) without failing the
# request: replayed logs carry their own, older times, so the stack keeps ten years.
VM_RETENTION = "10y"


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
            "rotel",
            "rotel",
            {"otlp_grpc": 4317, "otlp_http": 4318},
            30.0,
            "POST an empty OTLP request to /v1/metrics, connect to the gRPC port",
            description="OTel collector (OTLP in; traces to Phoenix, metrics to vmagent)",
        ),
        Component(
            "victoria-metrics",
            "victoria-metrics",
            {"http": 8428},
            30.0,
            "GET /health",
            description="metrics store (OTLP in, PromQL/MetricsQL out)",
        ),
        Component(
            "vmagent",
            "victoria-metrics",
            {"http": 8429},
            30.0,
            "GET /health",
            description="OTLP in, remote write to VictoriaMetrics and Prometheus",
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
            "prometheus", "prometheus", {"http": 9090}, 30.0, "GET /-/ready", description="Prometheus with the remote-write receiver"
        ),
        Component(
            "phoenix",
            "phoenix",
            {"http": 6006, "grpc": 4327},
            90.0,
            "GET /healthz",
            description="trace store with a web UI (Arize Phoenix)",
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
    rotel_config: Path | None = None
    rules_dir: Path | None = None
    bridge_config: Path | None = None


def find_in_repository(relative: str) -> Path | None:
    """``relative`` in the working directory or a parent, else beside the otel_rl package (a checkout)."""
    bases = [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[2]]
    for base in bases:
        if (base / relative).exists():
            return base / relative
    return None


def alert_rule_files(rules_dir: Path | None) -> list[Path]:
    folder = rules_dir if rules_dir is not None else find_in_repository("grafana/alerts")
    if folder is None or not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file())


# ---------------------------------------------------------------------------------------------
# rotel's configuration file

# A copy of collector-config/rotel/rotel.env, used when the stack runs outside a checkout (e.g.
# installed from a wheel); tests/stack checks that the two are identical.
BUILTIN_ROTEL_ENV = """\
# rotel-agent configuration of the local stack (`otel-rl stack up`). Read by otel_rl/stack.
#
# KEY=VALUE lines, passed to `rotel-agent start` as environment variables (every flag of
# `rotel-agent start --help` has a ROTEL_* variable; the per-exporter settings
# ROTEL_EXPORTER_<NAME>_* exist only as variables). ROTEL_* variables of the calling shell are
# not passed on: this file is the whole configuration. The stack fills in ${...} from its ports
# (defaults shown; --port-offset N adds N to each):
#   ${OTLP_GRPC_PORT}    4317  rotel's OTLP/gRPC receiver
#   ${OTLP_HTTP_PORT}    4318  rotel's OTLP/HTTP receiver (protobuf and JSON)
#   ${PHOENIX_PORT}      6006  Phoenix: OTLP/HTTP protobuf traces at /v1/traces
#   ${METRICS_PORT}      8429  vmagent (which remote-writes to VictoriaMetrics and Prometheus) when
#                              vmagent is part of the stack, else 8428, VictoriaMetrics itself
#   ${LOGS_BRIDGE_PORT}  4319  the tracker bridge's OTLP/HTTP receiver (`otel-rl bridge`)
#   ${LOGS_EXPORTER}     otlp when the tracker bridge is part of the stack (`otel-rl stack up
#                        --bridge-config FILE`), else blackhole
# also ${VICTORIA_METRICS_PORT} (8428), ${VMAGENT_PORT} (8429) and ${DATA_DIR}.
# See README.md beside this file for why it is routed this way.

ROTEL_OTLP_GRPC_ENDPOINT=127.0.0.1:${OTLP_GRPC_PORT}
ROTEL_OTLP_HTTP_ENDPOINT=127.0.0.1:${OTLP_HTTP_PORT}
ROTEL_BATCH_TIMEOUT=200ms

# One exporter per signal (rotel 0.0.1a15 refuses two: "Only one exporter supported for
# ROTEL_EXPORTERS_METRICS"). Logs (the rl.log step events) go to the tracker bridge on
# ${LOGS_BRIDGE_PORT} when it runs, else to blackhole (accepted and dropped): ${LOGS_EXPORTER}.
ROTEL_EXPORTERS=traces:otlp,metrics:otlp,logs:${LOGS_EXPORTER}
ROTEL_EXPORTERS_TRACES=traces
ROTEL_EXPORTERS_METRICS=metrics
ROTEL_EXPORTERS_LOGS=logs

# OTLP/HTTP protobuf; rotel appends /v1/traces, /v1/metrics, /v1/logs to each endpoint.
ROTEL_EXPORTER_TRACES_PROTOCOL=http
ROTEL_EXPORTER_TRACES_ENDPOINT=http://127.0.0.1:${PHOENIX_PORT}
ROTEL_EXPORTER_METRICS_PROTOCOL=http
ROTEL_EXPORTER_METRICS_ENDPOINT=http://127.0.0.1:${METRICS_PORT}/opentelemetry
ROTEL_EXPORTER_LOGS_PROTOCOL=http
ROTEL_EXPORTER_LOGS_ENDPOINT=http://127.0.0.1:${LOGS_BRIDGE_PORT}
"""

# Phoenix (arize-phoenix 20.x, src/phoenix/server/grpc_server.py) calls
# ``grpc.aio.server(...).add_insecure_port(f"[::]:{port}")`` (add_secure_port with TLS): its gRPC
# receiver listens on every interface whatever PHOENIX_HOST says, and no variable changes that.
# The stack sends Phoenix its traces over HTTP, so the receiver only has to stay off the network:
# this launcher keeps Phoenix's port and replaces the host with 127.0.0.1.
PHOENIX_LAUNCHER = f"""\
\"\"\"Written by otel-rl stack: `phoenix serve` with its OTLP/gRPC receiver on {LOOPBACK} only.\"\"\"

import sys

import grpc.aio

_make_server = grpc.aio.server


def _loopback(address):
    port = address.rpartition(":")[2]
    return "{LOOPBACK}:" + port


def _server_on_loopback(*args, **kwargs):
    server = _make_server(*args, **kwargs)
    insecure, secure = server.add_insecure_port, server.add_secure_port
    server.add_insecure_port = lambda address: insecure(_loopback(address))
    server.add_secure_port = lambda address, credentials: secure(_loopback(address), credentials)
    return server


grpc.aio.server = _server_on_loopback

from phoenix.server.main import main  # noqa: E402 - after the patch, which Phoenix's import must see

sys.argv[0] = "phoenix"
sys.exit(main())
"""

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def parse_rotel_env(text: str, values: Mapping[str, str], source: str = "rotel.env") -> dict[str, str]:
    """KEY=VALUE lines with ``${NAME}`` filled from ``values``; a ValueError names the bad line."""
    env: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not re.fullmatch(r"ROTEL_[A-Z0-9_]+", key):
            raise ValueError(f"{source}:{lineno}: expected ROTEL_NAME=value, got {raw.strip()!r}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]

        def fill(match: re.Match) -> str:
            name = match.group(1)
            if name not in values:
                raise ValueError(
                    f"{source}:{lineno}: unknown placeholder ${{{name}}}; known: {', '.join('${' + k + '}' for k in sorted(values))}"
                )
            return str(values[name])

        env[key] = _PLACEHOLDER.sub(fill, value)
    return env


def rotel_config_text(explicit: Path | None) -> tuple[str, str]:
    """(text, where it came from): the given file, else collector-config/rotel/rotel.env, else the built-in copy."""
    path = explicit if explicit is not None else find_in_repository("collector-config/rotel/rotel.env")
    if path is None:
        return BUILTIN_ROTEL_ENV, "built-in copy of collector-config/rotel/rotel.env"
    try:
        return path.read_text(), str(path)
    except OSError as exc:
        raise ValueError(f"cannot read the rotel configuration {path}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Command lines


def plan_launch(name: str, ctx: Context) -> Launch:
    """The command, environment and ports ``name`` starts with in this context."""
    ports = component_ports(name, ctx.offset)
    data, conf = ctx.data_dir / "data", ctx.data_dir / "config"
    vm_url = f"http://{LOOPBACK}:{component_ports('victoria-metrics', ctx.offset)['http']}"
    prom_url = f"http://{LOOPBACK}:{component_ports('prometheus', ctx.offset)['http']}"

    if name == "rotel":
        uses_vmagent = "vmagent" in ctx.running
        values = {
            "OTLP_GRPC_PORT": ports["otlp_grpc"],
            "OTLP_HTTP_PORT": ports["otlp_http"],
            "PHOENIX_PORT": component_ports("phoenix", ctx.offset)["http"],
            "VICTORIA_METRICS_PORT": component_ports("victoria-metrics", ctx.offset)["http"],
            "VMAGENT_PORT": component_ports("vmagent", ctx.offset)["http"],
            "METRICS_PORT": component_ports("vmagent" if uses_vmagent else "victoria-metrics", ctx.offset)["http"],
            "LOGS_BRIDGE_PORT": LOGS_BRIDGE_PORT + ctx.offset,
            "DATA_DIR": str(ctx.data_dir),
            # rl.log events to the tracker bridge when it is part of the stack, else dropped.
            "LOGS_EXPORTER": "otlp" if "bridge" in ctx.running else "blackhole",
        }
        text, source = rotel_config_text(ctx.rotel_config)
        env = parse_rotel_env(text, {k: str(v) for k, v in values.items()}, source)
        env["NO_COLOR"] = "1"  # plain log lines in logs/rotel.log
        # --pid-file/--log-file only matter with --daemon; keep them out of /tmp all the same.
        command = [
            str(ctx.binary("rotel", "rotel-agent")),
            "start",
            "--pid-file",
            str(ctx.data_dir / "run" / "rotel-agent.pid"),
            "--log-file",
            str(ctx.data_dir / "logs" / "rotel-agent.log"),
        ]
        return Launch(name, command, env, ports, drop_env_prefixes=("ROTEL_",))

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

    if name == "vmagent":
        folder = data / "vmagent"
        # Remote-write only to the stores in this stack (to both when neither is: vmagent buffers on disk).
        targets = [url for store, url in (("victoria-metrics", vm_url), ("prometheus", prom_url)) if store in ctx.running]
        targets = targets or [vm_url, prom_url]
        writes = [f"-remoteWrite.url={url}/api/v1/write" for url in targets]
        command = [
            str(ctx.binary("victoria-metrics", "vmagent")),
            f"-httpListenAddr={LOOPBACK}:{ports['http']}",
            *writes,
            f"-remoteWrite.tmpDataPath={folder}",
            "-remoteWrite.maxDiskUsagePerURL=1GB",
            "-opentelemetry.usePrometheusNaming",
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
        config.write_text(
            "# Written by otel-rl stack. Prometheus here only receives remote writes (from vmagent);\n"
            "# it scrapes nothing.\nglobal:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nscrape_configs: []\n"
            "# vmagent sends blocks over parallel queues, so a series' samples can arrive out of order;\n"
            "# without this window Prometheus rejects such a block whole (every series in it).\n"
            "storage:\n  tsdb:\n    out_of_order_time_window: 30m\n"
        )
        command = [
            str(ctx.binary("prometheus", "prometheus")),
            f"--config.file={config}",
            f"--storage.tsdb.path={folder}",
            f"--web.listen-address={LOOPBACK}:{ports['http']}",
            "--web.enable-remote-write-receiver",
        ]
        return Launch(name, command, {}, ports, [folder])

    if name == "phoenix":
        folder = data / "phoenix"
        env = {
            "PHOENIX_HOST": LOOPBACK,
            "PHOENIX_PORT": str(ports["http"]),
            "PHOENIX_GRPC_PORT": str(ports["grpc"]),
            "PHOENIX_WORKING_DIR": str(folder),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        # Phoenix binds its OTLP/gRPC receiver to every interface and has no setting for that address,
        # so it runs through a launcher (in its own venv's Python) that puts the receiver on 127.0.0.1.
        launcher = conf / "phoenix_loopback.py"
        launcher.parent.mkdir(parents=True, exist_ok=True)
        launcher.write_text(PHOENIX_LAUNCHER)
        python = ctx.binary("phoenix", "phoenix").parent / "python"
        return Launch(name, [str(python), str(launcher), "serve"], env, ports, [folder], drop_env_prefixes=("PHOENIX_",))

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
    if name == "rotel":
        # rotel has no health endpoint: an empty OTLP export request is a valid no-op that it answers 200.
        return http_ok(
            f"http://{LOOPBACK}:{ports['otlp_http']}/v1/metrics",
            data=b"",
            timeout_s=timeout_s,
            headers={"Content-Type": "application/x-protobuf"},
        ) and tcp_open(ports["otlp_grpc"], timeout_s=timeout_s)
    if name == "bridge":
        return http_ok(f"http://{LOOPBACK}:{ports['otlp_http']}/healthz", timeout_s=timeout_s)
    path = {"prometheus": "/-/ready", "phoenix": "/healthz"}.get(name, "/health")
    return http_ok(base + path, timeout_s=timeout_s)


def user_urls(name: str, ports: Mapping[str, int]) -> dict[str, str]:
    """What a person opens or points a program at, per component."""
    base = f"http://{LOOPBACK}:{ports.get('http', 0)}"
    if name == "rotel":
        return {"otlp_grpc": f"http://{LOOPBACK}:{ports['otlp_grpc']}", "otlp_http": f"http://{LOOPBACK}:{ports['otlp_http']}"}
    if name == "victoria-metrics":
        return {"query API": f"{base}/api/v1/query", "home": base}
    if name == "vmagent":
        return {"OTLP metrics": f"{base}/opentelemetry/v1/metrics"}
    if name == "vmalert":
        return {"UI": f"{base}/vmalert/", "alerts API": f"{base}/api/v1/alerts"}
    if name == "prometheus":
        # Debian's build reads its web UI from /usr/share/prometheus/web, which the stack does not install.
        return {"query API": f"{base}/api/v1/query"}
    if name == "phoenix":
        return {"UI": base, "OTLP traces": f"{base}/v1/traces"}
    if name == "bridge":
        bridge = f"http://{LOOPBACK}:{ports['otlp_http']}"
        return {"OTLP logs": f"{bridge}/v1/logs", "stats": f"{bridge}/stats", "health": f"{bridge}/healthz"}
    return {}


def child_environment(launch: Launch) -> dict[str, str]:
    drop = launch.drop_env_prefixes
    env = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop))}
    env.update(launch.env)
    return env
