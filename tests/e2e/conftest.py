"""The real local stack for end-to-end tests: the upstream OpenTelemetry Collector as agent and
gateway (built from collector-config/builder-config.yaml, run with collector-config/otelcol/),
Jaeger v2, VictoriaMetrics, vmalert and Prometheus.

One stack per test session, on a port offset at which every port is free (or
OTEL_RL_E2E_PORT_OFFSET), so it never collides with a stack a developer runs; every server is
stopped by its PID at the end, even when a test fails. Without Go (and no build cached) the
tests that need the collector or Jaeger skip, naming why; CI sets OTEL_RL_REQUIRE_GO=1, which
makes that a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from go_builds import require_go_built
from stack_support import DemoRun, run_demo_into


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from otel_rl.stack import Stack, free_port_offset

    data_dir = os.environ.get("OTEL_RL_E2E_STACK_DIR") or str(tmp_path_factory.mktemp("stack"))
    offset = os.environ.get("OTEL_RL_E2E_PORT_OFFSET")
    require_go_built()
    running = Stack(data_dir, port_offset=int(offset) if offset else free_port_offset())
    try:
        running.up()
        yield running
    finally:
        running.down()


@pytest.fixture(scope="session", params=["grpc", "http/protobuf"])
def demo_run(request: pytest.FixtureRequest, stack: Any, tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    pytest.importorskip("torch")
    return run_demo_into(stack, request.param, tmp_path_factory.mktemp("demo"))
