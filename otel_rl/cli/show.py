"""``otel-rl show``: one step's trace from a run folder, printed as a waterfall."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by otel-rl (traces.jsonl inside)")
    parser.add_argument("--step", type=int, required=True, help="the training step to show")
    parser.add_argument("--width", type=int, default=50, help="bar width in columns (default 50)")


def run(args: argparse.Namespace) -> int:
    from otel_rl.runs.folder import find_step_trace, format_problems, read_spans, render_waterfall

    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        print(f"otel-rl show: {run_dir} does not exist", file=sys.stderr)
        return 2
    spans = read_spans(run_dir)
    if spans.problems:
        print(format_problems(spans.problems), file=sys.stderr)
    if not spans:
        print(f"otel-rl show: no spans in {run_dir} (is it a run folder with traces.jsonl?)", file=sys.stderr)
        return 1
    try:
        trace = find_step_trace(spans, args.step)
    except LookupError as exc:
        print(f"otel-rl show: {exc}", file=sys.stderr)
        return 1
    print(render_waterfall(trace, width=args.width))
    return 0


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl show`` on the ``otel-rl`` subparsers."""
    parser = subparsers.add_parser("show", help="print one step's trace from a run folder as a waterfall")
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser
