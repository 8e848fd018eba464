"""The local stack as a replay's target: its VictoriaMetrics' retention, and what it stored.

``otel-rl replay`` sends to an OTLP endpoint; when that endpoint is the running stack's collector
(its agent or gateway, found by the PID files in the stack's data folder), the replay knows where the metric points end
up: the stack's VictoriaMetrics, with the retention its command line gives. The replay checks
its points' times against it before sending and reads the samples back afterwards.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import otel_rl.stack.process as _process
from otel_rl.ops.promql import label
from otel_rl.semconv import attributes as A
from otel_rl.stack.data_dir import stack_data_dir

__all__ = ["StackTarget", "retention_of", "retention_seconds", "target_for_endpoint"]

_DEFAULT_RETENTION = "1"  # VictoriaMetrics without -retentionPeriod: one month
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # our own loopback servers: never via a proxy
_UNITS = {"s": 1, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def retention_seconds(text: str) -> float:
    """VictoriaMetrics' ``-retentionPeriod`` in seconds: ``10y``, ``90d``, ``24h``; a bare number counts months."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([shdwy]?)\s*", text)
    if m is None:
        raise ValueError(f"not a retention period: {text!r}")
    value, unit = float(m.group(1)), m.group(2)
    return value * (_UNITS[unit] if unit else 31 * 86400)


def retention_of(command: Sequence[str]) -> str:
    """The ``-retentionPeriod`` a VictoriaMetrics command line sets (its default when none)."""
    for arg in command:
        if arg.startswith(("-retentionPeriod=", "--retentionPeriod=")):
            return arg.partition("=")[2]
    return _DEFAULT_RETENTION


@dataclass
class StackTarget:
    """The stack's VictoriaMetrics, behind its collector's endpoint."""

    url: str  # VictoriaMetrics' base URL
    retention: str
    retention_s: float
    description: str

    def count_stored(self, run_id: str, times_ms: Sequence[int], expected: int, deadline_s: float) -> int:
        """Samples of ``run_id`` stored at ``times_ms``, polled until ``expected`` are there or the deadline.

        the collectors forward in batches and VictoriaMetrics makes new series searchable seconds after
        they arrive; ``/internal/force_flush`` shortens the wait, the deadline bounds it."""
        if not times_ms or expected <= 0:
            return 0
        wanted = set(times_ms)
        selector = f'{{{label(A.RL_RUN_ID)}="{_escape(run_id)}"}}'
        query = urllib.parse.urlencode(
            {"match[]": selector, "start": f"{min(wanted) / 1000 - 1:.3f}", "end": f"{max(wanted) / 1000 + 1:.3f}"}
        )
        end = time.monotonic() + deadline_s
        stored = 0
        while True:
            try:
                with _OPENER.open(f"{self.url}/internal/force_flush", timeout=5):
                    pass
                with _OPENER.open(f"{self.url}/api/v1/export?{query}", timeout=10) as response:
                    stored = 0
                    for line in response.read().decode("utf-8").splitlines():
                        if line.strip():
                            stored += sum(1 for t in json.loads(line).get("timestamps", ()) if t in wanted)
            except (OSError, ValueError, urllib.error.URLError):
                pass  # a store that answers errors counts as holding nothing yet; the deadline bounds it
            if stored >= expected or time.monotonic() > end:
                return stored
            time.sleep(0.5)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def target_for_endpoint(endpoint: str | None, data_dir: str | Path | None = None) -> StackTarget | None:
    """The stack's VictoriaMetrics when ``endpoint`` is the running stack's agent or gateway (in ``data_dir``,
    default: see otel_rl.stack.data_dir); None for any other endpoint, or when no
    VictoriaMetrics of that stack runs."""
    if not endpoint:
        return None
    try:
        parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if host not in _LOCAL_HOSTS or port is None:
        return None
    folder = Path(str(data_dir)).expanduser().resolve() if data_dir is not None else stack_data_dir()
    run = folder / "run"
    collectors = [_process.read_pid_file(run / f"{name}.json") for name in ("otelcol-agent", "otelcol-gateway")]
    if not any(
        rec is not None and port in (rec.ports.get("otlp_grpc"), rec.ports.get("otlp_http")) and _process.is_alive(rec)
        for rec in collectors
    ):
        return None
    vm = _process.read_pid_file(run / "victoria-metrics.json")
    if vm is None or "http" not in vm.ports or not _process.is_alive(vm):
        return None
    retention = retention_of(vm.command)
    try:
        seconds = retention_seconds(retention)
    except ValueError:
        return None
    url = f"http://{_process.LOOPBACK}:{vm.ports['http']}"
    return StackTarget(url, retention, seconds, f"the local stack's VictoriaMetrics ({url}; the stack in {folder})")
