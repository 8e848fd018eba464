"""The collector built from collector-config/builder-config.yaml, run alone by a test or benchmark.

It takes OTLP on loopback ports of its own and forwards all three signals over OTLP/HTTP to
``target`` (a counting receiver, tests/otlp_sink.py), so that what arrived can be compared with
what was sent, or runs the project's own config files with those ports; started and stopped by
its PID, so it can be stopped and restarted on the same ports mid-run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from otel_rl.stack.process import free_port, http_ok, tcp_open


class Collector:
    """The collector on loopback ports of its own. Without ``files``, it forwards all three signals
    to ``target`` over OTLP/HTTP; with them, it runs those config files (merged in order, with
    ``env``), and an overlay of its own moves their ports onto free loopback ones."""

    def __init__(
        self, binary: Path, target: str | None, folder: Path, files: Sequence[Path] = (), env: Mapping[str, str] | None = None
    ) -> None:
        self.binary = binary
        self.folder = folder
        self.target = target
        self.files = list(files)
        self.env = dict(env or {})
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.config = folder / "otelcol.yaml"
        self._pick_ports()

    def _pick_ports(self) -> None:
        self.grpc_port, self.http_port, self.health_port, self.metrics_port = free_port(), free_port(), free_port(), free_port()
        config: dict = {
            "extensions": {"health_check": {"endpoint": f"127.0.0.1:{self.health_port}"}},
            "receivers": {
                "otlp": {
                    "protocols": {"grpc": {"endpoint": f"127.0.0.1:{self.grpc_port}"}, "http": {"endpoint": f"127.0.0.1:{self.http_port}"}}
                }
            },
            "service": {
                "telemetry": {
                    "metrics": {"readers": [{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": self.metrics_port}}}}]}
                }
            },
        }
        if not self.files:
            pipeline = {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["otlp_http/sink"]}
            config["processors"] = {"batch": {"timeout": "100ms"}}
            config["exporters"] = {"otlp_http/sink": {"endpoint": self.target, "encoding": "proto"}}
            config["service"]["extensions"] = ["health_check"]
            config["service"]["pipelines"] = {signal: dict(pipeline) for signal in ("traces", "metrics", "logs")}
        self.config.write_text(yaml.safe_dump(config))

    def endpoint(self, protocol: str) -> str:
        return f"http://127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def start(self, timeout_s: float = 15.0) -> None:
        """Start it and wait until it is healthy. On a first start, a port another process took
        since it was picked free is picked again (up to 3 times); a restart keeps its ports."""
        self.starts += 1
        attempts = 3 if self.starts == 1 else 1
        for attempt in range(attempts):
            if self._start_once(timeout_s):
                return
            if attempt + 1 < attempts:
                self._pick_ports()
        raise AssertionError(f"the collector did not start: {(self.folder / 'otelcol.log').read_text()[-2000:]}")

    def _start_once(self, timeout_s: float) -> bool:
        """True once healthy; False when a port was taken (the process exited saying so)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | self.env
        log_path = self.folder / "otelcol.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        command = [str(self.binary), *(f"--config={path}" for path in [*self.files, self.config])]
        self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        end = time.monotonic() + timeout_s
        while not (
            http_ok(f"http://127.0.0.1:{self.health_port}/", timeout_s=1.0) and tcp_open(self.grpc_port) and tcp_open(self.http_port)
        ):
            exited = self.process.poll() is not None
            if exited and "address already in use" in log_path.read_bytes()[offset:].decode(errors="replace"):
                return False
            if exited or time.monotonic() > end:
                self.stop()
                raise AssertionError(f"the collector did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        return True

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
