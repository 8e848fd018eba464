"""Helpers of the end-to-end tests: polling with deadlines, HTTP JSON, running the demo into the stack."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import otel_rl


def poll(fetch: Callable[[], Any], ok: Callable[[Any], bool], deadline_s: float, what: str, interval_s: float = 0.5) -> Any:
    """Call fetch() until ok(result) or the deadline; fail naming what never appeared."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while True:
        try:
            last = fetch()
            if ok(last):
                return last
        except Exception as exc:  # a backend still starting answers errors
            last = exc
        if time.monotonic() > end:
            pytest.fail(f"{what} did not appear within {deadline_s:.0f} s (last answer: {str(last)[:2000]})")
        time.sleep(interval_s)


def http_json(url: str, params: dict[str, Any] | list[tuple[str, str]] | None = None, timeout_s: float = 10.0) -> Any:
    if params:
        url = f"{url}?{urllib.parse.urlencode(params, doseq=True)}"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback test servers
        return json.loads(response.read().decode("utf-8"))


def raw_samples(stack: Any, selector: str, start: float, end: float) -> list[tuple[int, float]]:
    """VictoriaMetrics' raw samples (its export API): (timestamp ms, value), not a query's resampled grid."""
    query = urllib.parse.urlencode({"match[]": selector, "start": f"{start:.0f}", "end": f"{end:.0f}"})
    with urllib.request.urlopen(f"{stack.endpoints['victoria_metrics']}/api/v1/export?{query}", timeout=10) as response:  # noqa: S310
        lines = [json.loads(line) for line in response.read().decode("utf-8").splitlines() if line.strip()]
    return sorted((t, v) for line in lines for t, v in zip(line["timestamps"], line["values"]))


@dataclass
class DemoRun:
    protocol: str
    service: str
    run_id: str
    run_dir: Path
    steps: int


def run_demo_into(stack: Any, protocol: str, root: Path, steps: int = 4) -> DemoRun:
    """Run the CPU demo exporting over OTLP to the stack's agent (and to a run folder, to compare against)."""
    from otel_rl.demo import run_demo

    tag = "grpc" if protocol == "grpc" else "http"
    run_id = f"e2e-{tag}-{int(time.time())}"
    endpoint = stack.endpoints["otlp_grpc"] if protocol == "grpc" else stack.endpoints["otlp_http"]
    tel = otel_rl.init(
        service_name=f"otel-rl-e2e-{tag}",
        run_id=run_id,
        endpoint=endpoint,
        protocol=protocol,
        exporters="otlp,file",
        run_dir=str(root / tag),
        metric_export_interval_s=1.0,
        console=False,
    )
    try:
        run_demo(steps=steps, algo="ppo", telemetry=tel, out=root / tag, progress=False)
    finally:
        tel.shutdown()
    return DemoRun(protocol, f"otel-rl-e2e-{tag}", run_id, root / tag, steps)
