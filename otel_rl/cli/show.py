"""``otel-rl show``: one step's trace from a run folder, printed as a waterfall; ``--samples``: the
step's rollout samples (``rl.sample`` events: prompt, response, reward and its parts) instead."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by otel-rl (traces.jsonl inside)")
    parser.add_argument("--step", type=int, required=True, help="the training step to show")
    parser.add_argument("--width", type=int, default=50, help="bar width in columns (default 50)")
    parser.add_argument(
        "--samples", action="store_true", help="print the step's rollout samples (logged with init(log_samples=K)) instead of its trace"
    )


def run(args: argparse.Namespace) -> int:
    from otel_rl.runs.folder import find_step_trace, format_problems, read_spans, render_waterfall

    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        print(f"otel-rl show: {run_dir} does not exist", file=sys.stderr)
        return 2
    if args.samples:
        return _show_samples(run_dir, args.step)
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


def _show_samples(run_dir: Path, step: int) -> int:
    from otel_rl.runs.folder import format_problems
    from otel_rl.runs.samples import format_samples, read_samples, sample_steps

    rows = read_samples(run_dir, step)
    if rows.problems:
        print(format_problems(rows.problems), file=sys.stderr)
    if not rows:
        steps = sample_steps(run_dir)
        where = f"steps with samples: {_ranges(steps)}" if steps else "none at all: run with init(log_samples=K) / OTEL_RL_LOG_SAMPLES=K"
        print(f"otel-rl show: no rollout samples of step {step} in {run_dir} ({where})", file=sys.stderr)
        return 1
    print(f"step {step}: {len(rows)} rollout sample{'s' if len(rows) != 1 else ''}\n")
    print(format_samples(rows))
    return 0


def _ranges(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:10])) + (f", ... ({len(steps)} steps)" if len(steps) > 10 else "")


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl show`` on the ``otel-rl`` subparsers."""
    parser = subparsers.add_parser("show", help="print one step's trace from a run folder as a waterfall")
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser
