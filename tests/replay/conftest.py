"""Replay tests run in their own folder, untouched by the caller's OTLP or otel-rl settings."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_RL_EXPORTERS",
        "OTEL_SERVICE_NAME",
        "OTEL_RL_RUN_ID",
        "OTEL_RL_RUN_DIR",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_RL_CONFIG",
        "OTEL_RL_STACK_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
