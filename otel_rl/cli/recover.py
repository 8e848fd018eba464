"""``otel-rl recover``: rebuild the metric points a killed run had not exported, from its step events.

The arguments and the command live with the run-folder reader, in ``otel_rl.runs.recover``.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl recover`` on the ``otel-rl`` subparsers."""
    from otel_rl.runs.recover import add_cli as add_recover_cli

    return add_recover_cli(subparsers)
