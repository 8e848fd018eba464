"""``otel-rl alerts generate [--check]``: write the Prometheus / vmalert and Grafana alert rules.

The rules are built and rendered in ``otel_rl.ops.alerts``; this module holds only the arguments
and the command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def run_generate(args: argparse.Namespace) -> int:
    """``otel-rl alerts generate``: the committed rule files, or one scaled variant (``--rules-out``)."""
    from otel_rl.codegen.generate import check_or_write, find_repo_root
    from otel_rl.ops.alerts import render, write_rules_file

    if args.time_scale < 1:
        print("otel-rl alerts generate: --time-scale must be >= 1", file=sys.stderr)
        return 2
    try:
        if args.rules_out:
            path = write_rules_file(Path(args.rules_out), args.time_scale)
            print(f"otel-rl alerts generate: wrote {path}")
            return 0
        if args.time_scale != 1:
            print(
                "otel-rl alerts generate: --time-scale needs --rules-out FILE (the committed files are the standard rules)", file=sys.stderr
            )
            return 2
        root = find_repo_root(args.root)
        files = render(root)
    except ValueError as exc:
        print(f"otel-rl alerts generate: {exc}", file=sys.stderr)
        return 2
    return check_or_write("otel-rl alerts generate", root, files, check=args.check, source="otel_rl/ops/alert_rules.py")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``generate`` subcommand."""
    from otel_rl.ops.alerts import GRAFANA_PATH, RULES_PATH

    sub = parser.add_subparsers(dest="alerts_command", metavar="SUBCOMMAND")
    gen = sub.add_parser(
        "generate",
        help=f"write {RULES_PATH} and {GRAFANA_PATH} from otel_rl/ops/alert_rules.py",
        description="Write the alert rules (Prometheus / vmalert rule file and Grafana provisioning) from the rule "
        "definitions in otel_rl/ops/alert_rules.py and the metric registry.",
    )
    gen.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the committed files differ from what would be generated"
    )
    gen.add_argument("--root", metavar="DIR", help="the checkout to write into (default: found from here)")
    gen.add_argument(
        "--time-scale",
        type=int,
        default=1,
        metavar="N",
        help="divide every window, `for` and interval by N (with --rules-out; e.g. 60 for a demo run)",
    )
    gen.add_argument("--rules-out", metavar="FILE", help="write only the Prometheus rule file, to FILE")
    gen.set_defaults(func=run_generate)


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl alerts generate [--check]`` on the ``otel-rl`` subparsers."""
    parser = subparsers.add_parser("alerts", help="generate the Prometheus / vmalert and Grafana alert rules")
    add_arguments(parser)
    parser.set_defaults(func=lambda a: (parser.print_help(), 2)[1])  # no subcommand: show them
    return parser
