"""``otel-rl push``: deliver what a run left in its disk spool to a collector.

The arguments and the command live with the spool reader, in ``otel_rl.runs.push``.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl push`` on the ``otel-rl`` subparsers."""
    from otel_rl.runs.push import add_cli as add_push_cli

    return add_push_cli(subparsers)
