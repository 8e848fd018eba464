"""shutdown() without a spool, against a collector that accepts connections and never answers.

The peer is a real TCP server on 127.0.0.1 that accepts and reads nothing: the OTLP exporters
wait their own 10 s timeout on it. shutdown(timeout_s) must return within its bound anyway and
say which signals were not delivered, and where to.
"""

from __future__ import annotations

import logging
import time

import pytest

import otel_rl

SHUTDOWN_S = 1.5
MARGIN_S = 2.0  # interpreter and thread scheduling on a loaded 2-core machine


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_shutdown_without_spool_is_bounded_against_a_silent_peer(
    silent_peer: str, protocol: str, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")
    tel = otel_rl.Telemetry(
        otel_rl.resolve_config(
            dict(
                endpoint=silent_peer,
                protocol=protocol,
                exporters="otlp",
                spool_max_bytes=0,
                run_dir=str(tmp_path / "run"),
                console=False,
                service_name="silent-peer-test",
            )
        )
    )
    for step in range(3):
        with tel.step(step):
            tel.log({"actor/pg_loss": 0.1 * step})
    started = time.monotonic()
    tel.shutdown(SHUTDOWN_S)
    took = time.monotonic() - started
    assert took < SHUTDOWN_S + MARGIN_S, f"shutdown({SHUTDOWN_S}) took {took:.1f} s"
    warnings = [r.getMessage() for r in caplog.records if "were not delivered" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    # What was lost, where it was going, and how to keep it next time.
    assert "traces" in warnings[0] and "logs" in warnings[0]
    assert silent_peer in warnings[0]
    assert "spool" in warnings[0] and "otel-rl push" in warnings[0]
