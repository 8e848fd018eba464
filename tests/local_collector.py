"""The collector built from collector-config/builder-config.yaml, run alone by a test or benchmark.

It takes OTLP on loopback ports of its own and forwards all three signals over OTLP/HTTP to
``target`` (a counting receiver, tests/otlp_sink.py), so that what arrived can be compared with
what was sent; started and stopped by its PID, so it can be stopped and restarted on the same
ports mid-run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import yaml

from otel_rl.stack.process import free_port, http_ok, tcp_open


class Collector:
    """The collector on fixed loopback ports, forwarding all three signals to ``target`` over OTLP/HTTP."""

    def __init__(self, binary: Path, target: str, folder: Path) -> None:
        self.binary = binary
        self.folder = folder
        self.grpc_port, self.http_port, self.health_port, self.metrics_port = free_port(), free_port(), free_port(), free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0
        pipeline = {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["otlp_http/sink"]}
        self.config = folder / "otelcol.yaml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "extensions": {"health_check": {"endpoint": f"127.0.0.1:{self.health_port}"}},
                    "receivers": {
                        "otlp": {
                            "protocols": {
                                "grpc": {"endpoint": f"127.0.0.1:{self.grpc_port}"},
                                "http": {"endpoint": f"127.0.0.1:{self.http_port}"},
                            }
                        }
                    },
                    "processors": {"batch": {"timeout": "100ms"}},
                    "exporters": {"otlp_http/sink": {"endpoint": target, "encoding": "proto"}},
                    "service": {
                        "extensions": ["health_check"],
                        "pipelines": {signal: dict(pipeline) for signal in ("traces", "metrics", "logs")},
                        "telemetry": {
                            "metrics": {
                                "readers": [{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": self.metrics_port}}}}]
                            }
                        },
                    },
                }
            )
        )

    def endpoint(self, protocol: str) -> str:
        return f"http://127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def start(self, timeout_s: float = 15.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        self.starts += 1
        log = open(self.folder / "otelcol.log", "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            [str(self.binary), "--config", str(self.config)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        end = time.monotonic() + timeout_s
        while not (
            http_ok(f"http://127.0.0.1:{self.health_port}/", timeout_s=1.0) and tcp_open(self.grpc_port) and tcp_open(self.http_port)
        ):
            if self.process.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"the collector did not start: {(self.folder / 'otelcol.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
