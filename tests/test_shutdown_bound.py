"""shutdown() within its timeout: without a spool, against a collector that accepts connections and
never answers, and after a backlog the telemetry worker cannot process in time.

The peer is a real TCP server on 127.0.0.1 that accepts and reads nothing: the OTLP exporters
wait their own 10 s timeout on it. shutdown(timeout_s) must return within its bound anyway and
say which signals were not delivered, and where to; with a backlog, it says how many log() calls
it did not write, and counts them.
"""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

import otel_rl
from otel_rl._sdk.export.file_exports import QueuedLogExport
from otel_rl._sdk.export.shutdown import shutdown_within
from otel_rl._sdk.spool.store import LOGS
from otel_rl.runs.folder import read_log_records, read_metrics
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

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


BACKLOG_STEPS, BACKLOG_KEYS = 100, 3_000  # a new key set every step: the worker's slowest path
_UNWRITTEN = re.compile(r"([\d,]+) log\(\) calls? \(([\d,]+) values")
_HELD_LOGS = re.compile(r"logs \(([\d,]+) records? still queued or being written\)")


def _held_logs(caplog: pytest.LogCaptureFixture) -> int:
    """The events the logs' unfinished final export held, as the not-delivered warning says (0: none)."""
    said = [r.getMessage() for r in caplog.records if "were not delivered" in r.getMessage()]
    found = [_HELD_LOGS.search(message) for message in said]
    return sum(int(f.group(1).replace(",", "")) for f in found if f)


@pytest.mark.parametrize("timeout_s", [0.2, 2.0])
@pytest.mark.parametrize("destination", ["file", "silent-otlp"])
def test_shutdown_after_a_large_backlog_returns_within_its_timeout_saying_what_it_did_not_write(
    silent_peer: str, destination: str, timeout_s: float, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")
    options = dict(run_dir=str(tmp_path / "run"), console=False, service_name="backlog-test")
    if destination == "silent-otlp":
        options.update(endpoint=silent_peer, exporters="otlp", spool_max_bytes=0)
    tel = otel_rl.Telemetry(otel_rl.resolve_config(options))
    for step in range(BACKLOG_STEPS):
        tel.log({f"sample/{step}/{i}": float(i) for i in range(BACKLOG_KEYS)}, step=step)
    started = time.monotonic()
    tel.shutdown(timeout_s)
    took = time.monotonic() - started
    assert took < timeout_s + MARGIN_S, f"shutdown({timeout_s}) took {took:.1f} s"
    said = [r.getMessage() for r in caplog.records if "ran out of time" in r.getMessage()]
    assert len(said) <= 1, said
    if timeout_s < 1:  # 300,000 new keys cannot be processed in 0.14 s: some were not written
        assert said, [r.getMessage() for r in caplog.records]
    unwritten = 0
    if said:
        found = _UNWRITTEN.search(said[0])
        assert found, said[0]
        unwritten = int(found.group(1).replace(",", ""))
        assert 0 < unwritten <= BACKLOG_STEPS and int(found.group(2).replace(",", "")) == unwritten * BACKLOG_KEYS
        assert f"shutdown(timeout_s={timeout_s:g})" in said[0] and "shutdown_timeout" in said[0]
    if destination == "file":  # what was not written is what the messages count
        run = tmp_path / "run"
        written = [r["attributes"][A.RL_STEP] for r in read_log_records(run) if r["event_name"] == N.RL_LOG_EVENT]
        assert written == sorted(written)
        # The worker's events of a new key set go through the SDK's log pipeline: the logs' final
        # export may itself run past the deadline on a loaded machine, and then the other warning
        # counts what that export still held (written, in part, by the export still running).
        held = _held_logs(caplog)
        assert len(written) + unwritten <= BACKLOG_STEPS <= len(written) + unwritten + held, (len(written), unwritten, held)
        points = read_metrics(run)
        if unwritten and (points or timeout_s >= 1):
            # The count rides in the final metrics export; with 0.2 s on a loaded machine that export
            # itself may not fit (thousands of new series to collect), and then no metric is written at
            # all and the line above is what says it. Where any metric was written, the count is there.
            dropped = [
                p.value
                for p in points
                if p.name == M.RL_TELEMETRY_DROPPED and p.attributes.get(A.RL_TELEMETRY_DROP_REASON) == "shutdown_timeout"
            ]
            assert dropped and dropped[-1] == unwritten


class _StuckDestination:
    """A destination whose write never returns until released (a hung network file system):
    a stand-in for the run folder's file exporter, whose interface it has."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exported: list[object] = []

    def export(self, batch):
        self.release.wait(10)
        self.exported.extend(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        pass


def test_a_final_export_cut_off_at_the_deadline_says_how_many_records_it_held(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_rl")
    stuck = _StuckDestination()
    queued = QueuedLogExport(stuck)
    queued.export(["event"] * 7)
    try:
        unfinished = shutdown_within({LOGS: [queued]}, 0.2, ["files in run"], held=lambda signal: queued.held)
    finally:
        stuck.release.set()
    assert unfinished == [LOGS]
    said = [r.getMessage() for r in caplog.records if "were not delivered" in r.getMessage()]
    assert len(said) == 1 and "files in run" in said[0]
    found = _HELD_LOGS.search(said[0])
    assert found and int(found.group(1)) == 7, said[0]  # all 7 were in the export still running
    deadline = time.monotonic() + 5
    while queued.held and time.monotonic() < deadline:
        time.sleep(0.01)
    assert queued.held == 0 and len(stuck.exported) == 7  # released, the export ends and holds nothing
