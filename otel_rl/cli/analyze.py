"""``otel-rl analyze``: find spikes, collapses, chains and their causes in a training log; write a report.

The arguments and the command live with the analysis, in ``otel_rl.analyze``.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl analyze`` on the ``otel-rl`` subparsers."""
    from otel_rl.analyze import add_cli as add_analyze_cli

    return add_analyze_cli(subparsers)
