"""``otel-rl replay``: send a training log (ms-swift, TRL/HF, verl, ROLL) through otel-rl telemetry.

The arguments and the command live with the replayer, in ``otel_rl.replay``; this module adds
what only the command knows: the local stack behind an OTLP endpoint (its retention, and the
samples it stored, read back after the replay).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl replay`` on the ``otel-rl`` subparsers."""
    from otel_rl.replay import add_cli as add_replay_cli

    parser = add_replay_cli(subparsers)
    parser.set_defaults(target_for=stack_target)
    return parser


def stack_target(endpoint: str | None) -> Any:
    """The running local stack's VictoriaMetrics when ``endpoint`` is that stack's agent or gateway, else None."""
    from otel_rl.stack.replay_target import target_for_endpoint

    return target_for_endpoint(endpoint)
