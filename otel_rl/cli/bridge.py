"""``otel-rl bridge``: the tracker bridge, OTLP/HTTP from a collector -> TensorBoard, W&B, SwanLab, ..."""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="the bridge's YAML file (see above)")
    parser.add_argument("--listen", metavar="HOST:PORT", help="listen here instead of the file's listen")
    parser.add_argument("--base-dir", metavar="DIR", help="per-run folders here instead of the file's base_dir")
    parser.add_argument("-v", "--verbose", action="store_true", help="also log each rejected request and tracker notes")


def run(args: argparse.Namespace) -> int:
    from otel_rl.bridge import run_bridge

    return run_bridge(args.config, listen=args.listen, base_dir=args.base_dir, verbose=args.verbose)


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl bridge`` on the ``otel-rl`` subparsers (its help text is the bridge's own)."""
    from otel_rl.bridge import CLI_DESCRIPTION, CLI_EPILOG

    parser = subparsers.add_parser(
        "bridge",
        help="the tracker bridge: OTLP/HTTP from a collector -> TensorBoard, W&B, SwanLab, ...",
        description=CLI_DESCRIPTION,
        epilog=CLI_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser
