"""``otel-rl stack``: a local observability stack without Docker (install | up | down | status).

The arguments and commands live in ``otel_rl.stack.commands``; this module hooks them in.
"""

from __future__ import annotations

import argparse
from typing import Any


def run(args: argparse.Namespace) -> int:
    from otel_rl.stack.commands import run as run_stack

    return run_stack(args, args.stack_parser)


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl stack`` on the ``otel-rl`` subparsers."""
    from otel_rl.stack.commands import add_arguments

    parser = subparsers.add_parser("stack", help="a local observability stack without Docker: install | up | down | status")
    add_arguments(parser)
    parser.set_defaults(func=run, stack_parser=parser)
    return parser
