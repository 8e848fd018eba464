"""Nothing lost silently on disk, and a bounded flush: torn files, torn spool segments, a file that
cannot grow (its lost records counted), two writers on one run folder, flush against a silent peer."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from otel_rl._sdk.spool.files import frame
from otel_rl._sdk.spool.store import LOGS, SEGMENT_SUFFIX, Spool
from otel_rl.runs.folder import LOGS_FILE, read_log_records
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N


def test_resumed_run_folder_with_torn_logs_line_keeps_every_new_record(tmp_path, make_telemetry):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    whole = json.dumps({"resourceLogs": []})
    # A crashed writer left one whole line and a torn one (no newline at the end).
    (run_dir / LOGS_FILE).write_text(whole + "\n" + '{"resourceLogs": [{"resource": {"attr', encoding="utf-8")

    tel = make_telemetry(run_dir=str(run_dir))
    for step in range(3):
        tel.log({"actor/pg_loss": 0.5 + step}, step=step)
    tel.shutdown()

    records = read_log_records(run_dir)
    steps = sorted(r["attributes"].get("rl.step") for r in records if r["event_name"] == "rl.log")
    assert steps == [0, 1, 2]
    assert len(records.problems) == 1
    assert records.problems[0].line == 2


# ----------------------------------------------------------------------------- bounded flush


@pytest.mark.parametrize("spool_max_bytes", [0, 256 * 2**20], ids=["no-spool", "spool"])
def test_flush_timeout_bounds_the_whole_call(tmp_path, make_telemetry, silent_peer, spool_max_bytes):
    tel = make_telemetry(exporters="otlp", endpoint=silent_peer, spool_max_bytes=spool_max_bytes, metric_export_interval_s=3600)
    for step in range(3):
        with tel.step(step):
            tel.log({"actor/pg_loss": 0.5}, step=step)
    started = time.monotonic()
    ok = tel.flush(2)
    elapsed = time.monotonic() - started
    assert elapsed < 4.0, f"flush(2) took {elapsed:.1f} s"
    assert ok is False
    tel.shutdown(0.5)


# ----------------------------------------------------------------------------- torn spool segments


def _log_request(start: int, n: int) -> bytes:
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.logs.v1 import logs_pb2

    records = [
        logs_pb2.LogRecord(
            time_unix_nano=1, event_name="t", attributes=[common_pb2.KeyValue(key="i", value=common_pb2.AnyValue(int_value=i))]
        )
        for i in range(start, start + n)
    ]
    request = logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[logs_pb2.ResourceLogs(scope_logs=[logs_pb2.ScopeLogs(log_records=records)])]
    )
    return request.SerializeToString()


def _spool_with_torn_first_segment(folder: Path) -> Path:
    """A crashed writer's spool: one whole record, then a torn one (a crash mid-write), then another whole one."""
    spool = Spool(folder, 2**20)
    assert spool.append(LOGS, _log_request(0, 5), 5)
    [segment] = sorted(folder.rglob("*" + SEGMENT_SUFFIX))
    whole = frame(_log_request(5, 7), 7)
    with open(segment, "ab") as f:
        f.write(frame(_log_request(100, 3), 3)[:-4])  # torn: the last 4 bytes never reached the disk
        f.write(whole)
    os.close(spool._lock_fd)  # what the crashed process's exit did (the records stay on disk)
    return segment


def test_a_torn_spool_record_is_cut_out_counted_and_warned_once(tmp_path, caplog):
    folder = tmp_path / "spool" / "rank0"
    _spool_with_torn_first_segment(folder)
    caplog.set_level(logging.WARNING, logger="otel_rl")
    spool = Spool(folder, 2**20)
    assert spool.pending_items()[LOGS] == 12  # 5 before the tear, 7 after it
    assert spool.stats()[LOGS].damaged == 1
    warnings = [r.getMessage() for r in caplog.records if "torn record" in r.getMessage()]
    assert len(warnings) == 1 and "discarded 1 torn record" in warnings[0] and str(folder) in warnings[0]
    spool.close()
    # the segment was rewritten without the torn bytes: the next opening finds nothing to report
    caplog.clear()
    again = Spool(folder, 2**20)
    assert again.pending_items()[LOGS] == 12 and again.stats()[LOGS].damaged == 0
    assert not [r for r in caplog.records if "torn record" in r.getMessage()]
    again.close()


def test_push_says_what_it_discarded_and_delivers_the_rest(tmp_path):
    from otlp_sink import OtlpSink

    from otel_rl.runs.push import push

    folder = tmp_path / "run" / "spool" / "rank0"
    _spool_with_torn_first_segment(folder)
    said: list[str] = []
    with OtlpSink() as sink:
        [report] = push(tmp_path / "run", endpoint=sink.endpoint, protocol="http/protobuf", timeout_s=20, say=said.append)
        assert sorted(r[1]["i"] for r in sink.received.logs) == [*range(5), *range(5, 12)]
    assert report.damaged[LOGS] == 1
    assert any("discarded 1 torn record" in line for line in said), said


_FULL_DISK_RUN = """
import resource, signal, sys
import otel_rl
# The files cannot grow past 60 kB: every later write fails in the kernel (EFBIG), as on a full disk (ENOSPC).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))
tel = otel_rl.init(run_dir=sys.argv[1], console=False, service_name="full-disk", exporters="file")
for step in range(300):
    tel.log({f"actor/k{i}": 0.1 * i + step for i in range(20)}, step=step)
    tel.flush()
tel.shutdown()
"""


@pytest.mark.skipif(not hasattr(os, "fork") or os.name != "posix", reason="RLIMIT_FSIZE is POSIX")
def test_steps_a_full_disk_loses_are_counted_and_said_at_shutdown(tmp_path: Path) -> None:
    import subprocess
    import sys

    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _FULL_DISK_RUN, str(run)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lost = [line for line in proc.stderr.splitlines() if "record(s) of logs were lost" in line]
    assert len(lost) == 1 and A.RlTelemetryDropReasonValues.WRITE_FAILED.value in lost[0], proc.stderr
    lost_count = int(lost[0].split("otel-rl: ")[1].split()[0].replace(",", ""))
    written = {r["attributes"].get(A.RL_STEP) for r in read_log_records(run) if r.get("event_name") == N.RL_LOG_EVENT}
    assert 0 < len(written) < 300 and len(written) + lost_count == 300  # every step either in the file or counted
