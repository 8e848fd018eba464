"""Consistency of deploy/ (docker compose), the Grafana provisioning and the collector configs.

There is no Docker engine on these machines, so the compose stack cannot be started here. What
is checked instead is that its parts agree with each other: the collector config it mounts is
the gateway, the ports it publishes are the ports the gateway and the local stack's agent listen
on, every exporter and data source points at a service that listens there, every mount source
and data-source uid exists, and every metric named is a registry metric in Prometheus form.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from promql_names import promql_metric_names

import otel_rl.stack._components as stack_components
from otel_rl.codegen.generate import prometheus_name
from otel_rl.semconv import attributes as A
from otel_rl.semconv._tables import METRICS

REPO_ROOT = Path(__file__).resolve().parents[1]
DEPLOY = REPO_ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
GATEWAY = REPO_ROOT / "collector-config" / "otelcol" / "gateway.yaml"
BRIDGE_OVERLAY = REPO_ROOT / "collector-config" / "otelcol" / "gateway-bridge.yaml"
PROVISIONING = REPO_ROOT / "grafana" / "provisioning"
DATASOURCES = PROVISIONING / "datasources" / "datasources.yaml"
DASHBOARD_PROVIDERS = PROVISIONING / "dashboards" / "dashboards.yaml"
DASHBOARDS = REPO_ROOT / "grafana" / "dashboards"

# Ports fixed by the servers' images rather than by a file here: Jaeger v2's built-in all-in-one
# configuration takes OTLP/gRPC on 4317 and serves its UI and query API on 16686.
JAEGER_OTLP_GRPC_PORT = 4317
JAEGER_QUERY_PORT = 16686
PROMETHEUS_DEFAULT_PORT = 9090  # `--web.listen-address` default
COLLECTOR_IMAGE_UID = 10001  # the otelcol-contrib image's user

_COMPOSE_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")
_OTELCOL_VAR = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


# --------------------------------------------------------------------------- helpers


def load(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def compose() -> dict[str, Any]:
    return load(COMPOSE)


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def compose_default(text: str) -> str:
    """A compose string with ${VAR:-default} replaced by its default (no variables set)."""
    return _COMPOSE_VAR.sub(lambda m: m.group(2) or "", text)


def service_by_image(prefix: str) -> tuple[str, dict[str, Any]]:
    found = [(name, body) for name, body in services().items() if body.get("image", "").startswith(prefix)]
    assert len(found) == 1, f"expected one service running {prefix}, found {[n for n, _ in found]}"
    return found[0]


def published(service: dict[str, Any]) -> dict[int, tuple[str, int]]:
    """container port -> (host address, host port) for the service's published ports."""
    out = {}
    for entry in service.get("ports") or []:
        parts = compose_default(str(entry)).split(":")
        if len(parts) == 3:
            address, host, container = parts
        elif len(parts) == 2:
            address, (host, container) = "0.0.0.0", parts
        else:
            address, host, container = "0.0.0.0", parts[0], parts[0]
        out[int(container.split("/")[0])] = (address, int(host))
    return out


def mounts(service: dict[str, Any], with_mode: bool = False) -> list[tuple[Any, ...]]:
    """(source, target, is_bind[, mode]) of each volume entry; a bind source is resolved on the host."""
    out = []
    for entry in service.get("volumes") or []:
        source, target, *mode = compose_default(str(entry)).split(":")
        is_bind = source.startswith((".", "/"))
        row = (str((DEPLOY / source).resolve()) if is_bind else source, target, is_bind)
        out.append(row + (mode[0] if mode else "rw",) if with_mode else row)
    return out


def host_path(service: dict[str, Any], container_path: str) -> Path:
    """Where a path inside the container comes from on the host, through its bind mounts."""
    wanted = PurePosixPath(container_path)
    best: tuple[int, Path] | None = None
    for source, target, is_bind in mounts(service):
        target_path = PurePosixPath(target)
        if is_bind and (wanted == target_path or target_path in wanted.parents):
            depth = len(target_path.parts)
            if best is None or depth > best[0]:
                best = (depth, Path(source) / wanted.relative_to(target_path))
    assert best is not None, f"{container_path} is not under a bind mount of the service"
    return best[1]


def flags(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def flag_value(service: dict[str, Any], *names: str) -> list[str]:
    values = []
    for flag in flags(service):
        for name in names:
            if flag.startswith(name + "="):
                values.append(flag.split("=", 1)[1])
    return values


def gateway_service() -> tuple[str, dict[str, Any]]:
    return service_by_image("otel/opentelemetry-collector-contrib:")


def effective(value: Any, env: dict[str, str]) -> Any:
    """A collector config value as the gateway container sees it: compose's environment, else defaults."""
    if not isinstance(value, str):
        return value
    return _OTELCOL_VAR.sub(lambda m: str(env.get(m.group(1), m.group(2) or "")), value)


def gateway_env() -> dict[str, str]:
    environment = gateway_service()[1].get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {str(k): compose_default(str(v)) for k, v in environment.items()}


def host_port(url: str) -> tuple[str, int, str]:
    match = re.fullmatch(r"(?:[a-z]+://)?([^:/]+):(\d+)(/.*)?", url)
    assert match, f"not host:port[/path]: {url!r}"
    return match.group(1), int(match.group(2)), match.group(3) or ""


def listen_ports(name: str) -> set[int]:
    """Ports a compose service listens on: what it publishes plus what its own config sets."""
    service = services()[name]
    ports = set(published(service))
    image = service.get("image", "")
    if image.startswith("grafana/tempo:"):
        tempo = tempo_config()
        ports.add(int(tempo["server"]["http_listen_port"]))
        ports.add(host_port(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1])
    elif image.startswith("jaegertracing/jaeger:"):
        ports |= {JAEGER_OTLP_GRPC_PORT, JAEGER_QUERY_PORT}
    elif image.startswith("prom/prometheus:"):
        addresses = flag_value(service, "--web.listen-address")
        ports.add(host_port(addresses[0])[1] if addresses else PROMETHEUS_DEFAULT_PORT)
    elif image.startswith("otel/opentelemetry-collector-contrib:"):
        ports.add(int(load(GATEWAY)["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["port"]))
    return ports


def tempo_config() -> dict[str, Any]:
    _, tempo = service_by_image("grafana/tempo:")
    (config_path,) = flag_value(tempo, "-config.file", "--config.file")
    return load(host_path(tempo, config_path))


def datasources() -> list[dict[str, Any]]:
    return load(DATASOURCES)["datasources"]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, key, value) of every mapping entry in a YAML tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}/{key}", key, value
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


def prometheus_label(attribute: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


def registry_prometheus_names() -> set[str]:
    names = set()
    for metric in METRICS.values():
        base = prometheus_name(metric.name, metric.unit, metric.instrument)
        names.add(base)
        if metric.instrument == "histogram":
            names |= {base + suffix for suffix in _HISTOGRAM_SUFFIXES}
    return names


def span_metrics_prometheus_names() -> set[str]:
    (connector,) = [c for c in load(GATEWAY)["connectors"].values()]
    namespace = prometheus_label(connector["namespace"])
    duration = f"{namespace}_duration_seconds"
    return {f"{namespace}_calls_total", duration} | {duration + s for s in _HISTOGRAM_SUFFIXES}


def promql_expressions() -> list[tuple[str, str]]:
    """Every PromQL expression in the provisioning and in Prometheus' rule files, with where it is."""
    found = [(f"{DATASOURCES.name}{path}", value) for path, key, value in walk(load(DATASOURCES)) if key in ("query", "expr")]
    _, prometheus = service_by_image("prom/prometheus:")
    (config_path,) = flag_value(prometheus, "--config.file")
    for pattern in load(host_path(prometheus, config_path)).get("rule_files") or []:
        rule_host_path = host_path(prometheus, str(PurePosixPath(config_path).parent / pattern))
        for rule_file in sorted(rule_host_path.parent.glob(rule_host_path.name)):
            found += [(f"{rule_file.name}{path}", value) for path, key, value in walk(load(rule_file)) if key == "expr"]
    return found


# --------------------------------------------------------------------------- compose


def test_every_deploy_and_provisioning_yaml_parses() -> None:
    files = sorted(DEPLOY.glob("*.y*ml")) + sorted(PROVISIONING.rglob("*.y*ml"))
    assert {COMPOSE, DATASOURCES, DASHBOARD_PROVIDERS} <= set(files)
    for path in files:
        assert isinstance(load(path), dict), path


def test_stack_has_the_documented_services() -> None:
    images = {body["image"].split(":")[0] for body in services().values()}
    assert {"otel/opentelemetry-collector-contrib", "jaegertracing/jaeger", "grafana/tempo", "prom/prometheus", "grafana/grafana"} <= images


def test_images_are_pinned() -> None:
    for name, body in services().items():
        image = body["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: {image} is not pinned to a version"


def test_collector_mounts_the_gateway_config() -> None:
    _, gateway = gateway_service()
    config_paths = flag_value(gateway, "--config")
    assert config_paths, "the collector service must name its --config"
    assert host_path(gateway, config_paths[0]).resolve() == GATEWAY.resolve()
    for path in config_paths:
        assert host_path(gateway, path).is_file(), path
    # The bridge overlay is reachable in the same mount, for the day the bridge runs.
    assert host_path(gateway, str(PurePosixPath(config_paths[0]).parent / BRIDGE_OVERLAY.name)).resolve() == BRIDGE_OVERLAY.resolve()


def test_bind_mount_sources_exist() -> None:
    missing = []
    for name, body in services().items():
        for source, target, is_bind in mounts(body):
            if is_bind and not Path(source).exists():
                missing.append(Path(source))
    assert not missing, f"compose mounts paths that do not exist: {missing}"


def test_named_volumes_are_declared() -> None:
    declared = set(compose().get("volumes") or {})
    for name, body in services().items():
        for source, _, is_bind in mounts(body):
            if not is_bind:
                assert source in declared, f"{name}: volume {source} is not declared"


def otlp_receiver_ports() -> dict[str, int]:
    protocols = load(GATEWAY)["receivers"]["otlp"]["protocols"]
    return {protocol: host_port(effective(protocols[protocol]["endpoint"], gateway_env()))[1] for protocol in ("grpc", "http")}


def local_stack_otlp_ports() -> dict[str, int]:
    """The OTLP ports `otel-rl stack up` gives the agent (no port offset): where a training job sends."""
    ports = stack_components.component_ports("otelcol-agent", 0)
    return {"grpc": ports["otlp_grpc"], "http": ports["otlp_http"]}


def test_published_otlp_ports_are_the_gateway_and_local_stack_ports() -> None:
    _, gateway = gateway_service()
    receivers = otlp_receiver_ports()
    ports = published(gateway)
    for protocol, port in receivers.items():
        assert port in ports, f"compose does not publish the gateway's OTLP/{protocol} port {port}"
        assert ports[port][1] == port, f"OTLP/{protocol}: host port {ports[port][1]} != container port {port}"
    # A training job's OTEL_EXPORTER_OTLP_ENDPOINT is the same with Docker and with `otel-rl stack`.
    assert receivers == local_stack_otlp_ports()
    assert receivers == {"grpc": 4317, "http": 4318}  # the OTLP defaults every SDK assumes


def test_published_ports_bind_loopback_by_default() -> None:
    for name, body in services().items():
        for container, (address, _) in published(body).items():
            assert address == "127.0.0.1", f"{name}:{container} is published on {address}"


def test_gateway_receivers_listen_on_all_interfaces_in_the_container() -> None:
    env = gateway_env()
    for protocol, body in load(GATEWAY)["receivers"]["otlp"]["protocols"].items():
        assert host_port(effective(body["endpoint"], env))[0] == "0.0.0.0", f"{protocol}: a published port needs 0.0.0.0"


def test_gateway_exporters_reach_compose_services() -> None:
    gateway, env = load(GATEWAY), gateway_env()
    names = set(services())
    for exporter_id, body in gateway["exporters"].items():
        if "endpoint" not in body or exporter_id.startswith("prometheus/") or exporter_id == "prometheus":
            continue
        host, port, _ = host_port(effective(body["endpoint"], env))
        assert host in names, f"{exporter_id} sends to {host}, which is no compose service"
        assert port in listen_ports(host), f"{exporter_id} sends to {host}:{port}; {host} listens on {sorted(listen_ports(host))}"


def test_tempo_takes_otlp_grpc_where_the_gateway_sends_it() -> None:
    gateway = load(GATEWAY)
    _, port, _ = host_port(effective(gateway["exporters"]["otlp_grpc/tempo"]["endpoint"], gateway_env()))
    grpc = tempo_config()["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert host_port(grpc) == ("0.0.0.0", port, ""), f"Tempo's OTLP/gRPC receiver is {grpc}"


def test_prometheus_receives_the_gateways_remote_write() -> None:
    name, prometheus = service_by_image("prom/prometheus:")
    assert "--web.enable-remote-write-receiver" in flags(prometheus)
    assert "--enable-feature=exemplar-storage" in flags(prometheus), "span_metrics' exemplars need exemplar storage"
    gateway = load(GATEWAY)
    (remote_write,) = [b for e, b in gateway["exporters"].items() if e.split("/")[0] == "prometheus_remote_write"]
    host, port, path = host_port(effective(remote_write["endpoint"], gateway_env()))
    assert (host, path) == (name, "/api/v1/write")
    assert port in listen_ports(name)


def test_prometheus_scrapes_compose_services_only() -> None:
    _, prometheus = service_by_image("prom/prometheus:")
    (config_path,) = flag_value(prometheus, "--config.file")
    config = load(host_path(prometheus, config_path))
    gateway_name, _ = gateway_service()
    scrape_endpoint = host_port(effective(load(GATEWAY)["exporters"]["prometheus"]["endpoint"], gateway_env()))[1]
    for job in config["scrape_configs"]:
        for static in job.get("static_configs") or []:
            for target in static["targets"]:
                host, port, _ = host_port(target)
                if host != "localhost":
                    assert host in services() and port in listen_ports(host), f"{job['job_name']}: {target}"
                # Remote write already stores every metric; scraping :8889 too would store them twice.
                assert not (host == gateway_name and port == scrape_endpoint), f"{job['job_name']} scrapes {target}"


def test_events_file_lies_on_a_volume_the_collector_may_write() -> None:
    gateway_name, gateway = gateway_service()
    (file_exporter,) = [b for e, b in load(GATEWAY)["exporters"].items() if e.split("/")[0] == "file"]
    path = PurePosixPath(effective(file_exporter["path"], gateway_env()))
    volumes = [(source, target) for source, target, is_bind in mounts(gateway) if not is_bind and PurePosixPath(target) in path.parents]
    assert volumes, f"{path} is on no volume of {gateway_name}"
    ((volume, target),) = volumes
    # The image runs as uid 10001 and a fresh named volume belongs to root: something must chown it.
    owners = [
        name
        for name, body in services().items()
        if (volume, target, False) in mounts(body)
        and flags(body)[:2] == ["chown", "-R"]
        and flags(body)[2] == f"{COLLECTOR_IMAGE_UID}:{COLLECTOR_IMAGE_UID}"
    ]
    assert owners, f"no service chowns volume {volume} for the collector"
    condition = gateway.get("depends_on", {}).get(owners[0], {}).get("condition")
    assert condition == "service_completed_successfully"


def test_bridge_port_is_the_local_stacks_bridge_port() -> None:
    endpoint = load(BRIDGE_OVERLAY)["exporters"]["otlp_http/bridge"]["endpoint"]
    assert host_port(effective(endpoint, {}))[1] == stack_components.LOGS_BRIDGE_PORT


# --------------------------------------------------------------------------- grafana


def grafana_service() -> dict[str, Any]:
    return service_by_image("grafana/grafana:")[1]


def test_grafana_mounts_the_provisioning_read_only() -> None:
    grafana = grafana_service()
    for path in (DATASOURCES, DASHBOARD_PROVIDERS):
        container = "/etc/grafana/provisioning/" + path.relative_to(PROVISIONING).as_posix()
        assert host_path(grafana, container).resolve() == path.resolve()
    for source, target, is_bind, mode in mounts(grafana, with_mode=True):
        if is_bind:
            assert mode == "ro", f"grafana mounts {target} writable"


def test_dashboard_provider_paths_are_the_mounted_dashboards_folder() -> None:
    grafana = grafana_service()
    providers = load(DASHBOARD_PROVIDERS)["providers"]
    assert providers
    for provider in providers:
        assert provider["type"] == "file"
        assert host_path(grafana, provider["options"]["path"]).resolve() == DASHBOARDS.resolve()


def test_datasources_have_the_uids_dashboards_use() -> None:
    uids = [ds["uid"] for ds in datasources()]
    assert len(uids) == len(set(uids))
    assert {"prometheus", "jaeger", "tempo"} <= set(uids)
    assert [ds["uid"] for ds in datasources() if ds.get("isDefault")] == ["prometheus"]


def test_every_referenced_datasource_uid_exists() -> None:
    uids = {ds["uid"] for ds in datasources()}
    referenced = [(path, value) for path, key, value in walk(load(DATASOURCES)) if key == "datasourceUid"]
    assert referenced, "the trace <-> metrics links name data sources by uid"
    for path, value in referenced:
        assert value in uids, f"{path}: no data source has uid {value!r}"
    providers = load(DASHBOARD_PROVIDERS)["providers"]
    for path, key, value in walk(providers):
        if key == "datasourceUid":
            assert value in uids, path


def test_datasource_urls_point_at_compose_services() -> None:
    expected_type = {"prometheus": "prom/prometheus:", "jaeger": "jaegertracing/jaeger:", "tempo": "grafana/tempo:"}
    for ds in datasources():
        host, port, _ = host_port(ds["url"])
        name, _ = service_by_image(expected_type[ds["type"]])
        assert host == name, f"data source {ds['uid']} points at {host}, the {ds['type']} service is {name}"
        assert port in listen_ports(name), f"data source {ds['uid']}: {name} does not listen on {port}"


def test_exemplar_links_use_the_exported_trace_id_label() -> None:
    (prometheus,) = [ds for ds in datasources() if ds["type"] == "prometheus"]
    destinations = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert {d["name"] for d in destinations} == {"trace_id"}  # what the collector's Prometheus exporters call it
    assert {d["datasourceUid"] for d in destinations} == {"jaeger", "tempo"}


def test_trace_to_metrics_tags_are_registry_attributes_and_their_labels() -> None:
    attributes = {value for name, value in vars(A).items() if name.isupper() and isinstance(value, str)}
    for ds in datasources():
        tags = (ds.get("jsonData") or {}).get("tracesToMetrics", {}).get("tags", [])
        for tag in tags:
            assert tag["key"] in attributes, f"{ds['uid']}: {tag['key']} is not a registry attribute"
            assert tag["value"] == prometheus_label(tag["key"]), f"{ds['uid']}: {tag['key']} is labelled {prometheus_label(tag['key'])}"


def test_metric_names_are_registry_names_in_prometheus_form() -> None:
    allowed = registry_prometheus_names() | span_metrics_prometheus_names()
    expressions = promql_expressions()
    assert expressions, "the data sources' trace-to-metrics queries are PromQL"
    for where, expr in expressions:
        names = promql_metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - allowed
        assert not unknown, f"{where}: {sorted(unknown)} are not registry metrics in Prometheus form"
    # Any other rl_* token in these files is a label of a registry attribute or a registry metric.
    labels = {prometheus_label(v) for n, v in vars(A).items() if n.isupper() and isinstance(v, str)}
    for path in (DATASOURCES, DASHBOARD_PROVIDERS, COMPOSE, DEPLOY / "prometheus.yml", GATEWAY):
        for token in set(re.findall(r"(?<![\w./])rl_[a-z0-9_]+", path.read_text(encoding="utf-8"))):
            assert token in allowed | labels, f"{path.name}: {token} is neither a registry metric nor a registry label"


def test_promql_metric_extraction() -> None:
    expr = 'histogram_quantile(0.95, sum by (le, rl_stage) (rate(rl_stage_duration_seconds_bucket{rl_run_id="x", $$__tags}[5m]))) / on(job) group_left rl_step_duration_seconds_count offset 5m'
    assert promql_metric_names(expr) == {"rl_stage_duration_seconds_bucket", "rl_step_duration_seconds_count"}


# --------------------------------------------------------------------------- documentation


def test_deploy_readme_says_what_runs_where() -> None:
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert "no Docker" in text and "otel-rl stack up" in text
    for service in services():
        assert f"`{service}`" in text, f"deploy/README.md does not mention the service {service}"
    for needle in ("OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317", "otel-rl demo --steps 40", "rl_stage_duration_seconds_bucket"):
        assert needle in text, needle


def test_the_compose_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    """The compose file is not run here; the Prometheus config it mounts is checked by Prometheus' own promtool
    (Debian's, the one the alert tests use), as the gateway config is by the collector's validate."""
    from alerts.alert_tools import install_rule_tools

    tools = install_rule_tools()
    done = tools.run([tools.promtool, "check", "config", DEPLOY / "prometheus.yml"])
    assert done.returncode == 0 and "SUCCESS" in done.stdout + done.stderr, done.stdout + done.stderr
    broken = tmp_path / "prometheus.yml"
    broken.write_text((DEPLOY / "prometheus.yml").read_text().replace("scrape_configs:", "scrape_configz:"))
    assert tools.run([tools.promtool, "check", "config", broken]).returncode != 0
