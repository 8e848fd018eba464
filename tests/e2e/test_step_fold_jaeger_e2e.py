"""A many-rank step read back from the real Jaeger folds as the same step read from a run folder.

64 ranks' spans of two steps (every rank's stages in rank 0's step trace, rank 21's update twice as
long) are written twice with the same seed: into a run folder, and over OTLP/gRPC into the local
stack's Jaeger (v2, Badger). ``otel-rl trace --step 2`` on each must print the same folded stage
lines, the straggler named; ``--rank 21`` from Jaeger expands that rank alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from multi_rank_trace import SERVICE, TRAIN_STEP_SPAN, write_multi_rank_steps

pytestmark = pytest.mark.e2e

RANKS = 64
STRAGGLER = 21
# (SERVICE: the service write_multi_rank_steps names; only this test writes it into the stack's Jaeger)


def trace_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_rl.cli", "trace", *args], capture_output=True, text=True, timeout=60)


def folded_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if f"x{RANKS} ranks" in line or "(folded)" in line]


def test_a_64_rank_step_from_jaeger_folds_as_from_its_run_folder_and_names_the_straggler(stack: Any, tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    start_s = int(time.time()) - 300  # within Jaeger's retention and the command's lookback
    straggler = (STRAGGLER, TRAIN_STEP_SPAN)
    run_dir = tmp_path / "run"
    write_multi_rank_steps(run_dir, RANKS, steps=(1, 2), straggler=straggler, start_s=start_s)
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{stack.ports('jaeger')['otlp_grpc']}", insecure=True)
    write_multi_rank_steps(tmp_path / "unused", RANKS, steps=(1, 2), straggler=straggler, start_s=start_s, exporter=exporter)

    from_folder = trace_command(str(run_dir), "--step", "2")
    assert from_folder.returncode == 0, from_folder.stderr
    jaeger = ["--jaeger", stack.endpoints["jaeger"], "--service", SERVICE, "--step", "2"]
    end = time.monotonic() + 60
    while (from_jaeger := trace_command(*jaeger)).returncode != 0:  # until Jaeger has written it
        assert time.monotonic() < end, from_jaeger.stdout + from_jaeger.stderr
        time.sleep(1.0)

    expected = folded_lines(from_folder.stdout)
    assert len(expected) >= 6 and any("straggler (> " in line and f"rank {STRAGGLER}" in line for line in expected), from_folder.stdout
    assert folded_lines(from_jaeger.stdout) == expected, from_jaeger.stdout
    assert "(the ranks of a stage folded)" in from_jaeger.stdout

    one_rank = trace_command(*jaeger, "--rank", str(STRAGGLER))
    assert one_rank.returncode == 0, one_rank.stderr
    assert not folded_lines(one_rank.stdout), one_rank.stdout
    assert TRAIN_STEP_SPAN in one_rank.stdout
