"""How the stack runs the project's own collector configs, and Jaeger's config.

The agent and the gateway run ``collector-config/otelcol/{agent,gateway}.yaml`` unchanged (plus
``gateway-bridge.yaml`` when the bridge runs), set through the variables those files document,
and one overlay per process written into ``<data>/config/``. The collector merges the files given
with several ``--config`` flags (maps key by key, lists replaced whole), so the overlay changes
only what the files have no variable for: the ports (moved by the stack's offset, all on
127.0.0.1) and the exporters of each pipeline, which name only the servers that run (the gateway
ships traces to Jaeger and Tempo; here there is no Tempo).
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from otel_rl.stack.process import LOOPBACK

_HEADER = "# Written by otel-rl stack: merged over {base} (the collector merges its --config files in order).\n"


def _dump(data: Mapping[str, Any], base: str) -> str:
    return _HEADER.format(base=base) + yaml.safe_dump(dict(data), sort_keys=False)


def _telemetry(port: int) -> dict[str, Any]:
    return {"metrics": {"readers": [{"pull": {"exporter": {"prometheus": {"host": LOOPBACK, "port": port}}}}]}}


def _receivers(ports: Mapping[str, int]) -> dict[str, Any]:
    return {
        "otlp": {
            "protocols": {
                "grpc": {"endpoint": f"{LOOPBACK}:{ports['otlp_grpc']}"},
                "http": {"endpoint": f"{LOOPBACK}:{ports['otlp_http']}"},
            }
        }
    }


def agent_files(
    config_dir: Path, ports: Mapping[str, int], gateway_grpc_port: int, data_dir: Path
) -> tuple[list[Path], str, dict[str, str]]:
    """(config files, overlay text, environment) of the agent."""
    overlay = {
        "extensions": {"health_check": {"endpoint": f"{LOOPBACK}:{ports['health']}"}},
        "receivers": _receivers(ports),
        "service": {"telemetry": _telemetry(ports["telemetry"])},
    }
    env = {
        "OTEL_AGENT_BIND": LOOPBACK,
        "OTEL_GATEWAY_ENDPOINT": f"{LOOPBACK}:{gateway_grpc_port}",
        "OTEL_AGENT_STORAGE_DIR": str(data_dir / "queue"),
        "OTEL_AGENT_HOST_NAME": socket.gethostname(),
    }
    return [config_dir / "agent.yaml"], _dump(overlay, "agent.yaml"), env


def gateway_files(
    config_dir: Path,
    ports: Mapping[str, int],
    data_dir: Path,
    *,
    jaeger_grpc_port: int | None,
    remote_write_url: str | None,
    bridge_url: str | None,
) -> tuple[list[Path], str, dict[str, str]]:
    """(config files, overlay text, environment) of the gateway; None for a server that does not run."""
    files = [config_dir / "gateway.yaml"] + ([config_dir / "gateway-bridge.yaml"] if bridge_url else [])
    metrics_exporters = (["prometheus_remote_write"] if remote_write_url else []) + ["prometheus"]
    overlay: dict[str, Any] = {
        "extensions": {"health_check": {"endpoint": f"{LOOPBACK}:{ports['health']}"}},
        "receivers": _receivers(ports),
        "exporters": {"prometheus": {"endpoint": f"{LOOPBACK}:{ports['prometheus']}"}},
        "service": {
            "pipelines": {
                "traces": {"exporters": ["otlp_grpc/jaeger"] if jaeger_grpc_port else ["nop"]},
                "metrics": {"exporters": metrics_exporters},
            },
            "telemetry": _telemetry(ports["telemetry"]),
        },
    }
    if not jaeger_grpc_port:  # a pipeline needs an exporter: traces go nowhere, not to a server that is not there
        overlay["exporters"]["nop"] = {}
    env = {"OTEL_GATEWAY_BIND": LOOPBACK, "OTEL_GATEWAY_EVENTS_FILE": str(data_dir / "rl-events.jsonl")}
    if jaeger_grpc_port:
        env["OTEL_GATEWAY_JAEGER_ENDPOINT"] = f"{LOOPBACK}:{jaeger_grpc_port}"
    if remote_write_url:
        env["OTEL_GATEWAY_REMOTE_WRITE_URL"] = remote_write_url
    if bridge_url:
        env["OTEL_RL_BRIDGE_ENDPOINT"] = bridge_url
    base = " + ".join(p.name for p in files)
    return files, _dump(overlay, base), env


def jaeger_config(ports: Mapping[str, int], data_dir: Path) -> str:
    """Jaeger v2's config: OTLP/gRPC in, Badger on disk (kept 30 days), the query API; all on 127.0.0.1.

    Jaeger's own tracing is off: it would send its query spans to OTLP's default port, the agent's.
    """
    config = {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query"],
            "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["jaeger_storage_exporter"]}},
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}},
        },
        "extensions": {
            "jaeger_query": {
                "storage": {"traces": "local"},
                "enable_tracing": False,
                "http": {"endpoint": f"{LOOPBACK}:{ports['http']}"},
                "grpc": {"endpoint": f"{LOOPBACK}:{ports['grpc']}"},
            },
            "jaeger_storage": {
                "backends": {
                    "local": {
                        "badger": {
                            "directories": {"keys": str(data_dir / "keys"), "values": str(data_dir / "values")},
                            "ephemeral": False,
                            "ttl": {"spans": "720h"},
                        }
                    }
                }
            },
        },
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"{LOOPBACK}:{ports['otlp_grpc']}"}}}},
        "processors": {"batch": {}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "local"}},
    }
    return "# Written by otel-rl stack: Jaeger v2 on 127.0.0.1 (see otel_rl/stack/_collector.py).\n" + yaml.safe_dump(
        config, sort_keys=False
    )


def files_digest(paths: list[Path], *texts: str) -> str:
    """One digest of the config files' contents and generated texts: a change restarts the process."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    for text in texts:
        digest.update(text.encode())
    return digest.hexdigest()
