"""``otel-rl replay``: send a training log (ms-swift, TRL/HF, verl, ROLL) through otel-rl telemetry.

The arguments and the command live with the replayer, in ``otel_rl.replay``.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl replay`` on the ``otel-rl`` subparsers."""
    from otel_rl.replay import add_cli as add_replay_cli

    return add_replay_cli(subparsers)
