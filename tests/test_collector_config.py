"""The collector configurations in collector-config/otelcol/.

Every shipped file, alone and with its overlays, and as deploy/docker-compose.yml runs it, passes
`validate` of the collector built from collector-config/builder-config.yaml (the upstream
collector's own check: component types, pipelines, connectors, each component's settings, OTTL
statements). On top of that, what otel-rl relies on and no validator checks: current component
names rather than deprecated aliases, every component used, registry attribute names and bucket
boundaries, the agent reaching the gateway, processor order.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_rl.bridge.request_decode import MAX_BODY_BYTES
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv._tables import BUCKETS, METRICS

REPO_ROOT = Path(__file__).resolve().parents[1]
OTELCOL_DIR = REPO_ROOT / "collector-config" / "otelcol"
AGENT = OTELCOL_DIR / "agent.yaml"
GATEWAY = OTELCOL_DIR / "gateway.yaml"
BRIDGE_OVERLAY = OTELCOL_DIR / "gateway-bridge.yaml"
ENGINES_OVERLAY = OTELCOL_DIR / "agent-engines.yaml"
GATEWAYS_OVERLAY = OTELCOL_DIR / "agent-gateways.yaml"
BEHIND_AGENTS_OVERLAY = OTELCOL_DIR / "gateway-behind-agents.yaml"
SERIES_BUDGET_OVERLAY = OTELCOL_DIR / "gateway-series-budget.yaml"
README = REPO_ROOT / "collector-config" / "README.md"

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
SIGNALS = ("traces", "metrics", "logs")

# Deprecated aliases the collector still accepts (validate passes them silently; they log a
# warning at every start). The current names only.
DEPRECATED_TYPES = {
    "otlp": "otlp_grpc",  # as an exporter; `otlp` stays the receiver's name
    "otlphttp": "otlp_http",
    "spanmetrics": "span_metrics",
    "resourcedetection": "resource_detection",
    "prometheusremotewrite": "prometheus_remote_write",
    "healthcheck": "health_check",
    "loadbalancing": "load_balancing",
    "memorylimiter": "memory_limiter",
}

_PLACEHOLDER = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_DOLLAR = re.compile(r"\$\$|\$")


# --------------------------------------------------------------------------- helpers


def load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    assert isinstance(data, dict), f"{path} is not a YAML mapping"
    return data


def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """The collector's merge of several --config files: maps merge key by key, lists are replaced."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def configs() -> dict[str, dict[str, Any]]:
    gateway, agent = load(GATEWAY), load(AGENT)
    return {
        "agent": agent,
        "gateway": gateway,
        "gateway+bridge": merge(gateway, load(BRIDGE_OVERLAY)),
        "agent+engines": merge(agent, load(ENGINES_OVERLAY)),
        "agent+gateways": merge(agent, load(GATEWAYS_OVERLAY)),
        "gateway+behind-agents": merge(gateway, load(BEHIND_AGENTS_OVERLAY)),
        "gateway+series-budget": merge(gateway, load(SERIES_BUDGET_OVERLAY)),
    }


CONFIG_IDS = ["agent", "gateway", "gateway+bridge", "agent+engines", "agent+gateways", "gateway+behind-agents", "gateway+series-budget"]
# What an overlay takes out of its base's pipelines stays defined (the collector builds only what
# a pipeline uses): the single gateway's exporter, where the agent balances over several.
REPLACED = {"agent+gateways": {"otlp_grpc/gateway"}}


@pytest.fixture(params=CONFIG_IDS)
def config(request: pytest.FixtureRequest) -> dict[str, Any]:
    config = configs()[request.param]
    for component_id in REPLACED.get(request.param, ()):
        del config["exporters"][component_id]
    return config


def with_defaults(value: Any) -> Any:
    """What a placeholder-bearing string becomes when no variable is set (the default)."""
    if not isinstance(value, str):
        return value

    def default(match: re.Match[str]) -> str:
        assert match.group(2) is not None, f"{match.group(0)} has no default: the config needs it set to start"
        return match.group(2)

    expanded = _PLACEHOLDER.sub(default, value)
    if _PLACEHOLDER.fullmatch(value):  # the collector parses a whole-value placeholder as YAML
        return yaml.safe_load(expanded)
    return expanded


def component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def pipelines(config: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    return config["service"]["pipelines"]


def strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string (keys included) in a parsed YAML tree, with where it is."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}/{key} (key)", str(key)
            yield from strings(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from strings(value, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


def host_port(endpoint: str) -> tuple[str, int]:
    endpoint = re.sub(r"^[a-z]+://", "", endpoint).split("/", 1)[0]
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def seconds(duration: str) -> float:
    """A Go duration string (5ms, 2500ms, 1m30s, 1h) in seconds."""
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a Go duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def registry_attributes() -> set[str]:
    return {value for name, value in vars(A).items() if name.isupper() and isinstance(value, str)}


def exporter(config: dict[str, Any], exporter_type: str) -> tuple[str, dict[str, Any]]:
    found = [(cid, body or {}) for cid, body in config["exporters"].items() if component_type(cid) == exporter_type]
    assert len(found) == 1, f"expected one {exporter_type} exporter, found {[cid for cid, _ in found]}"
    return found[0]


# --------------------------------------------------------------------------- parsing and structure


def test_every_collector_config_yaml_parses() -> None:
    files = sorted((REPO_ROOT / "collector-config").rglob("*.y*ml"))
    assert {AGENT, GATEWAY, BRIDGE_OVERLAY, ENGINES_OVERLAY, GATEWAYS_OVERLAY, BEHIND_AGENTS_OVERLAY} <= set(files)
    for path in files:
        with path.open(encoding="utf-8") as f:
            assert yaml.safe_load(f) is not None, f"{path} is empty"


# --------------------------------------------------------------------------- the real collector's validate


COMPOSE = REPO_ROOT / "deploy" / "docker-compose.yml"


@pytest.fixture(scope="module")
def otelcol() -> Path:
    from go_builds import collector_binary

    return collector_binary()


def validate(otelcol: Path, files: list[Path], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`otelcol-rl validate` of the files merged in order, with only ``env`` set (no OTEL_* of this process)."""
    args = [str(otelcol), "validate"] + [f"--config={path}" for path in files]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env={**clean, **(env or {})})


SHIPPED = {
    "agent": [AGENT],
    "gateway": [GATEWAY],
    "gateway+bridge": [GATEWAY, BRIDGE_OVERLAY],
    "agent+engines": [AGENT, ENGINES_OVERLAY],
    "agent+gateways": [AGENT, GATEWAYS_OVERLAY],
    "gateway+behind-agents": [GATEWAY, BEHIND_AGENTS_OVERLAY],
    "gateway+series-budget": [GATEWAY, SERIES_BUDGET_OVERLAY],
}


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(SHIPPED))
def test_every_shipped_config_passes_the_collectors_validate(otelcol: Path, name: str) -> None:
    done = validate(otelcol, SHIPPED[name])
    assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"


@pytest.mark.e2e
def test_the_compose_gateway_passes_validate_with_the_composes_command_and_environment(otelcol: Path) -> None:
    service = yaml.safe_load(COMPOSE.read_text())["services"]["otel-gateway"]
    mount = next(v for v in service["volumes"] if v.endswith(":/etc/otel-rl:ro"))
    host_dir = (COMPOSE.parent / mount.split(":", 1)[0]).resolve()
    assert host_dir == OTELCOL_DIR
    files = [host_dir / arg.removeprefix("--config=/etc/otel-rl/") for arg in service["command"]]
    done = validate(otelcol, files, {k: str(v) for k, v in service["environment"].items()})
    assert done.returncode == 0, done.stdout + done.stderr
    # The image compose pins is the release the project builds and validates with.
    release = yaml.safe_load((REPO_ROOT / "collector-config" / "builder-config.yaml").read_text())["dist"]["version"]
    assert service["image"] == f"otel/opentelemetry-collector-contrib:{release}"


@pytest.mark.e2e
def test_validate_fails_on_a_broken_config_naming_it(otelcol: Path, tmp_path: Path) -> None:
    """The check above can fail: a misspelt component type, a bad OTTL statement, a pipeline naming nothing defined."""
    text = GATEWAY.read_text()
    for broken, expected in (
        (text.replace("otlp_grpc/jaeger:", "otlp_grcp/jaeger:"), "otlp_grcp"),
        (text.replace('IsMatch(event_name, "^rl\\\\.")', 'IsMatch(event_name "^rl")'), "filter/rl_events"),
        (text.replace("exporters: [file/rl_events]", "exporters: [file/nowhere]"), "file/nowhere"),
    ):
        assert broken != text
        path = tmp_path / "broken.yaml"
        path.write_text(broken)
        done = validate(otelcol, [path])
        assert done.returncode != 0 and expected in done.stdout + done.stderr, (expected, done.stdout + done.stderr)


@pytest.mark.e2e
def test_component_types_are_in_the_build_under_their_current_names(otelcol: Path, config: dict[str, Any]) -> None:
    listed = yaml.safe_load(subprocess.run([str(otelcol), "components"], capture_output=True, text=True, timeout=60).stdout)
    built = {kind: {c["name"] for c in listed[kind]} for kind in KINDS}
    for kind in KINDS:
        for component_id in config.get(kind) or {}:
            ctype = component_type(component_id)
            assert ctype in built[kind], f"{kind[:-1]} type {ctype!r} ({component_id}) is not in the collector build"
            if ctype in DEPRECATED_TYPES and not (kind == "receivers" and ctype == "otlp"):
                pytest.fail(f"{component_id}: {ctype!r} is a deprecated alias of {DEPRECATED_TYPES[ctype]!r}")


def test_every_defined_component_is_used(config: dict[str, Any]) -> None:
    used = {kind: set() for kind in KINDS}
    for pipeline in pipelines(config).values():
        for kind in ("receivers", "processors", "exporters"):
            for component_id in pipeline.get(kind) or []:
                is_connector = component_id in (config.get("connectors") or {})
                used["connectors" if is_connector else kind].add(component_id)
    used["extensions"] = set(config["service"].get("extensions") or [])
    for kind in KINDS:
        unused = set(config.get(kind) or {}) - used[kind]
        assert not unused, f"{kind} defined but used by no pipeline: {sorted(unused)}"


def test_env_placeholders_use_the_env_provider_syntax(config: dict[str, Any]) -> None:
    for where, text in strings(config):
        rest = _PLACEHOLDER.sub("", text)
        stray = [m.group(0) for m in _DOLLAR.finditer(rest) if m.group(0) != "$$"]
        assert not stray, f"{where}: {text!r} has a `$` outside ${{env:NAME}} / ${{env:NAME:-default}} (write $$ for a literal $)"
        for match in _PLACEHOLDER.finditer(text):
            assert match.group(2) is not None, f"{where}: {match.group(0)} has no default; every setting here has one"


def test_memory_limiter_first_and_batch_last(config: dict[str, Any]) -> None:
    for pipeline_id, pipeline in pipelines(config).items():
        processors = [component_type(p) for p in pipeline.get("processors") or []]
        assert processors and processors[0] == "memory_limiter", f"{pipeline_id}: memory_limiter must come first, got {processors}"
        assert processors[-1] == "batch", f"{pipeline_id}: batch must come last, got {processors}"
        assert processors.count("memory_limiter") == 1 and processors.count("batch") == 1, pipeline_id


def test_every_signal_has_a_pipeline(config: dict[str, Any]) -> None:
    assert {component_type(p) for p in pipelines(config)} == set(SIGNALS)


# --------------------------------------------------------------------------- agent


def test_agent_receivers_bind_to_a_configurable_loopback_default() -> None:
    agent = load(AGENT)
    for protocol, body in agent["receivers"]["otlp"]["protocols"].items():
        endpoint = body["endpoint"]
        assert endpoint.startswith("${env:OTEL_AGENT_BIND:-127.0.0.1}:"), f"agent {protocol} receiver: {endpoint}"
        assert with_defaults(endpoint).startswith("127.0.0.1:"), endpoint


def test_agent_exporter_points_at_the_gateway_grpc_receiver() -> None:
    agent, gateway = load(AGENT), load(GATEWAY)
    exporter_id, body = exporter(agent, "otlp_grpc")
    _, port = host_port(with_defaults(body["endpoint"]))
    _, gateway_grpc_port = host_port(with_defaults(gateway["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]))
    assert port == gateway_grpc_port, f"agent {exporter_id} sends to :{port}, the gateway's gRPC receiver listens on :{gateway_grpc_port}"
    assert "${env:OTEL_GATEWAY_ENDPOINT:-" in body["endpoint"], "the gateway address must be settable per node"


def test_agent_queue_is_persistent_and_retried() -> None:
    agent = load(AGENT)
    _, body = exporter(agent, "otlp_grpc")
    assert body["retry_on_failure"]["enabled"] is True
    queue = body["sending_queue"]
    assert queue["enabled"] is True
    storage = queue["storage"]
    assert component_type(storage) == "file_storage" and storage in agent["service"]["extensions"]
    assert with_defaults(agent["extensions"][storage]["directory"]).startswith("/var/lib/otelcol/")


def test_agent_keeps_the_senders_host_name() -> None:
    statements = load(AGENT)["processors"]["transform/host_name"]
    for signal in ("trace", "metric", "log"):
        (group,) = statements[f"{signal}_statements"]
        (statement,) = group["statements"]
        assert group["context"] == "resource"
        # Only where the sender set none, and only when the node's name is given: never overwrite, never empty.
        assert statement.startswith(f'set(attributes["{A.HOST_NAME}"], "${{env:OTEL_AGENT_HOST_NAME:-}}")'), statement
        assert f'where attributes["{A.HOST_NAME}"] == nil and "${{env:OTEL_AGENT_HOST_NAME:-}}" != ""' in statement


def test_agent_memory_limit_is_absolute() -> None:
    limiter = load(AGENT)["processors"]["memory_limiter"]
    assert "limit_percentage" not in limiter, "a share of a training node's memory is far too much for the agent"
    assert int(with_defaults(limiter["limit_mib"])) > int(limiter["spike_limit_mib"]) > 0


def test_engines_overlay_scrapes_only_engine_families_and_labels_them_with_the_engine_address() -> None:
    merged = merge(load(AGENT), load(ENGINES_OVERLAY))
    assert merged["receivers"]["otlp"] == load(AGENT)["receivers"]["otlp"], "the overlay must change nothing of agent.yaml"
    (scrape,) = merged["receivers"]["prometheus/engines"]["config"]["scrape_configs"]
    assert with_defaults(scrape["static_configs"][0]["targets"]) == ["127.0.0.1:8000"]
    relabel = {r["target_label"]: r for r in scrape["relabel_configs"]}
    # What the collector hands Prometheus after $$ -> $, applied to a target the way Prometheus does.
    for label, expected in (("server_address", "10.0.0.5"), ("server_port", "30000")):
        rule = relabel[label]
        assert rule["source_labels"] == ["__address__"]
        match = re.fullmatch(rule["regex"], "10.0.0.5:30000")
        template = re.sub(r"\$\$\{(\d+)\}", r"\\g<\1>", rule["replacement"])  # $${1} -> Python's \g<1>
        assert match is not None and match.expand(template) == expected
    (keep,) = scrape["metric_relabel_configs"]
    assert keep["action"] == "keep" and re.fullmatch(keep["regex"], "vllm:num_requests_running")
    assert re.fullmatch(keep["regex"], "sglang:token_usage") and not re.fullmatch(keep["regex"], "process_cpu_seconds_total")
    statements = " ".join(merged["processors"]["transform/engine_address"]["metric_statements"][0]["statements"])
    assert f'attributes["{A.SERVER_ADDRESS}"]' in statements and f'attributes["{A.SERVER_PORT}"]' in statements
    pipeline = merged["service"]["pipelines"]["metrics/engines"]
    assert pipeline["receivers"] == ["prometheus/engines"] and pipeline["exporters"] == ["otlp_grpc/gateway"]


def test_gateways_overlay_routes_steps_by_trace_and_each_ranks_series_by_resource() -> None:
    agent = configs()["agent+gateways"]
    routing = {signal: agent["exporters"][pipelines(agent)[signal]["exporters"][0]]["routing_key"] for signal in SIGNALS}
    assert routing == {"traces": "traceID", "metrics": "resource", "logs": "resource"}
    hostnames = with_defaults(agent["exporters"]["load_balancing/traces"]["resolver"]["static"]["hostnames"])
    assert isinstance(hostnames, list) and len(hostnames) >= 2, hostnames


def test_gateways_overlay_keeps_a_down_gateways_batches_on_disk_and_never_acknowledges_them_early() -> None:
    agent = configs()["agent+gateways"]
    for exporter_id in (pipelines(agent)[signal]["exporters"][0] for signal in SIGNALS):
        body = agent["exporters"][exporter_id]
        per_gateway = body["protocol"]["otlp"]
        assert per_gateway["sending_queue"]["enabled"] is False, f"{exporter_id}: a per-gateway queue in memory acknowledges early"
        assert seconds(per_gateway["retry_on_failure"]["max_elapsed_time"]) == 0, exporter_id
        assert body["sending_queue"]["storage"] in agent["service"]["extensions"], exporter_id
        # without it the exporter's 5 s default cuts the per-gateway retries short and the batch is dropped
        assert seconds(body["timeout"]) >= 3600, exporter_id
        assert body["retry_on_failure"]["enabled"] is True and seconds(body["retry_on_failure"]["max_elapsed_time"]) == 0


def test_span_metrics_move_to_the_agents_with_the_gateways_settings_and_the_gateways_count_none() -> None:
    agent, gateway, behind = configs()["agent+gateways"], load(GATEWAY), configs()["gateway+behind-agents"]
    assert agent["connectors"]["span_metrics"] == gateway["connectors"]["span_metrics"]
    assert agent["processors"]["filter/rl_spans"] == gateway["processors"]["filter/rl_spans"]
    assert "span_metrics" in pipelines(agent)["metrics"]["receivers"]
    assert pipelines(agent)["traces/span_metrics"]["exporters"] == ["span_metrics"]
    filters = [behind["processors"][p] for p in pipelines(behind)["traces/span_metrics"]["processors"] if p.startswith("filter/")]
    assert any(f["traces"]["span"] == ["true"] for f in filters), "the gateway behind agents still counts spans"


# --------------------------------------------------------------------------- gateway


def span_metrics(gateway: dict[str, Any]) -> dict[str, Any]:
    (connector_id,) = [c for c in gateway["connectors"] if component_type(c) == "span_metrics"]
    return gateway["connectors"][connector_id]


def test_span_metrics_dimensions_are_the_stage_histograms_attributes() -> None:
    dimensions = [d["name"] for d in span_metrics(load(GATEWAY))["dimensions"]]
    assert len(dimensions) == len(set(dimensions))
    assert set(dimensions) <= registry_attributes(), f"not registry attributes: {set(dimensions) - registry_attributes()}"
    assert A.RL_STEP not in dimensions, "rl.step changes every step: one series per step"
    # Span-derived RED metrics split like the SDK's own stage histogram.
    assert set(dimensions) == set(METRICS[M.RL_STAGE_DURATION].attributes) == {A.RL_STAGE, A.RL_CLUSTER, A.RL_STAGE_PHASE}


def test_span_metrics_buckets_are_the_registry_duration_buckets() -> None:
    histogram = span_metrics(load(GATEWAY))["histogram"]
    assert histogram["unit"] == "s"
    buckets = [seconds(b) for b in histogram["explicit"]["buckets"]]
    assert buckets == pytest.approx(list(BUCKETS[METRICS[M.RL_STAGE_DURATION].buckets]))


def test_span_metrics_namespace_cannot_shadow_registry_metrics() -> None:
    namespace = span_metrics(load(GATEWAY))["namespace"]
    assert not namespace.startswith("rl.") and namespace not in METRICS
    assert not any(name.startswith(namespace + ".") for name in METRICS)


def test_span_metrics_see_only_rl_spans() -> None:
    gateway = load(GATEWAY)
    for pipeline_id, body in pipelines(gateway).items():
        if any(component_type(e) == "span_metrics" for e in body["exporters"]):
            assert "filter/rl_spans" in body["processors"], pipeline_id
    condition = gateway["processors"]["filter/rl_spans"]["traces"]["span"]
    assert condition == ['not IsMatch(name, "^rl\\\\.")']


def test_traces_go_to_jaeger_and_tempo_over_otlp_grpc() -> None:
    gateway = load(GATEWAY)
    targets = {
        host_port(with_defaults(gateway["exporters"][e]["endpoint"]))
        for e in pipelines(gateway)["traces"]["exporters"]
        if component_type(e) == "otlp_grpc"
    }
    assert targets == {("jaeger", 4317), ("tempo", 4317)}


def test_metrics_reach_remote_write_and_the_scrape_endpoint_with_run_labels() -> None:
    gateway = load(GATEWAY)
    metrics = pipelines(gateway)["metrics"]
    assert {component_type(e) for e in metrics["exporters"]} == {"prometheus_remote_write", "prometheus"}
    assert any(component_type(r) == "span_metrics" for r in metrics["receivers"])
    for exporter_type in ("prometheus_remote_write", "prometheus"):
        _, body = exporter(gateway, exporter_type)
        assert body["resource_to_telemetry_conversion"]["enabled"] is True, exporter_type
    _, scrape = exporter(gateway, "prometheus")
    assert host_port(with_defaults(scrape["endpoint"]))[1] == 8889
    _, remote_write = exporter(gateway, "prometheus_remote_write")
    assert with_defaults(remote_write["endpoint"]).endswith("/api/v1/write")


def test_prometheus_labels_are_registry_resource_attributes() -> None:
    gateway = load(GATEWAY)
    assert "transform/prometheus_labels" in pipelines(gateway)["metrics"]["processors"]
    (statement,) = gateway["processors"]["transform/prometheus_labels"]["metric_statements"][0]["statements"]
    match = re.fullmatch(r"keep_keys\(attributes, (\[.*\])\)", statement)
    assert match, statement
    kept = set(yaml.safe_load(match.group(1)))
    # service.namespace / service.instance.id become Prometheus' job and instance labels.
    assert kept - {"service.namespace", "service.instance.id"} <= registry_attributes()
    assert {A.SERVICE_NAME, A.RL_RUN_ID, A.RL_RANK, A.HOST_NAME} <= kept


def test_events_go_to_an_otlp_json_file_filtered_to_rl_events() -> None:
    gateway = load(GATEWAY)
    logs = pipelines(gateway)["logs"]
    assert "filter/rl_events" in logs["processors"]
    (file_id,) = [e for e in logs["exporters"] if component_type(e) == "file"]
    body = gateway["exporters"][file_id]
    assert body["format"] == "json"
    assert with_defaults(body["path"]).startswith("/var/lib/otelcol/")
    assert gateway["processors"]["filter/rl_events"]["logs"]["log_record"] == ['not IsMatch(event_name, "^rl\\\\.")']


def test_bridge_is_a_separate_optional_pipeline() -> None:
    gateway, overlay = load(GATEWAY), load(BRIDGE_OVERLAY)
    assert not any(component_type(e) == "otlp_http" for e in gateway["exporters"]), "the bridge must stay out of gateway.yaml"
    # The overlay only adds: nothing it sets replaces a key gateway.yaml already has.
    assert not set(overlay["exporters"]) & set(gateway["exporters"])
    assert not set(overlay["processors"]) & set(gateway["processors"])
    assert set(overlay["service"]) == {"pipelines"} and not set(overlay["service"]["pipelines"]) & set(pipelines(gateway))
    assert set(overlay) == {"processors", "exporters", "service"}
    merged = merge(gateway, overlay)
    (bridge_pipeline,) = set(pipelines(merged)) - set(pipelines(gateway))
    assert component_type(bridge_pipeline) == "logs"
    (exporter_id,) = pipelines(merged)[bridge_pipeline]["exporters"]
    assert exporter_id == "otlp_http/bridge"
    assert with_defaults(merged["exporters"][exporter_id]["endpoint"]) == "http://bridge:4319"
    # its batches stay under the bridge's 20 MiB body limit (413 is not retried): 512 events of up to 40 KB
    (batch,) = [p for p in pipelines(merged)[bridge_pipeline]["processors"] if component_type(p) == "batch"]
    assert merged["processors"][batch]["send_batch_max_size"] * 40_000 < MAX_BODY_BYTES


# --------------------------------------------------------------------------- documentation


def test_readme_documents_every_variable_and_component_file() -> None:
    text = README.read_text(encoding="utf-8")
    variables = set()
    for path in (AGENT, GATEWAY, BRIDGE_OVERLAY, ENGINES_OVERLAY):
        variables |= {name for name, _ in _PLACEHOLDER.findall(path.read_text(encoding="utf-8"))}
        assert path.name in text, f"README does not mention {path.name}"
    missing = sorted(v for v in variables if v not in text)
    assert not missing, f"README does not document {missing}"
    assert "builder-config.yaml" in text, "README must name the collector build's manifest"


def test_the_series_budget_overlay_is_the_one_the_registry_gives() -> None:
    """Which metrics are job-level copies and which histograms are folded come from the registry."""
    from otel_rl.ops.series_budget_overlay import render

    assert SERIES_BUDGET_OVERLAY.read_text() == render(), (
        "gateway-series-budget.yaml differs from the registry's rank scopes: run "
        "python -m otel_rl.ops.series_budget_overlay > collector-config/otelcol/gateway-series-budget.yaml"
    )
    config = load(SERIES_BUDGET_OVERLAY)
    assert config["service"]["pipelines"]["metrics"]["processors"][:3] == [
        "memory_limiter",
        "filter/series_budget",
        "transform/series_budget",
    ]
